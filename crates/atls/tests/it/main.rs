//! The integration tests of `atls`, as modules of one test program (docs/testing.md).

#![cfg(test)] // all of it test code: clippy.toml's test allowances cover its helpers too

mod atls;
mod common;
mod session_key;

//! The integration tests of `cli`, as modules of one test program (docs/testing.md).

#![cfg(test)] // all of it test code: clippy.toml's test allowances cover its helpers too

mod bring_up;
mod recover_shares;

//! The integration tests of `key-service`, as modules of one test program (docs/testing.md).

#![cfg(test)] // all of it test code: clippy.toml's test allowances cover its helpers too

mod atls;
#[path = "../common/mod.rs"]
mod common;
mod grpc;
mod process;
mod tpm_atls;

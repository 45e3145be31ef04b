//! The integration tests of `testkit`: one test program of modules, one link for all (docs/testing.md).

#![cfg(test)] // all of it test code: clippy.toml's test allowances cover its helpers too

mod swtpm;
mod swtpm_process;

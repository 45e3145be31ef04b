//! The integration tests of `disk`: one test program of modules, one link for all (docs/testing.md).

#![cfg(test)] // all of it test code: clippy.toml's test allowances cover its helpers too

mod state_disk;
mod timings;

//! The integration tests of `disk`, as modules of one test program (docs/testing.md).

#![cfg(test)] // all of it test code: clippy.toml's test allowances cover its helpers too

mod state_disk;
mod timings;

//! The integration tests of `kube-api`: one test program of modules, one link for all (docs/testing.md).

#![cfg(test)] // all of it test code: clippy.toml's test allowances cover its helpers too

mod api;
mod deploy;

//! The integration tests of `bootstrapper`: one test program of modules, one link for all (docs/testing.md).

#![cfg(test)] // all of it test code: clippy.toml's test allowances cover its helpers too

#[path = "../common/mod.rs"]
mod common;
mod init;
mod init_limits;
mod join;
mod kubeadm_driver;
mod platform;
mod process;
mod recover;

//! The integration tests of `bootstrapper`, as modules of one test program (docs/testing.md).

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

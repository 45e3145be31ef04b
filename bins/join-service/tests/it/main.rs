//! The integration tests of `join-service`, as modules of one test program (docs/testing.md).

#![cfg(test)] // all of it test code: clippy.toml's test allowances cover its helpers too

mod admin;
mod binding;
#[path = "../common/mod.rs"]
mod common;
mod host_cert;
mod join;
mod kube_binding;
mod kubernetes;
mod process;
mod session_key;

//! The integration tests of `kubeadm`, as modules of one test program (docs/testing.md).

#![cfg(test)] // all of it test code: clippy.toml's test allowances cover its helpers too

mod driver;
mod kubeadm;
#[path = "../kubeadm_support/mod.rs"]
mod kubeadm_support;
mod supervisor;

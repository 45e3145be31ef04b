//! The integration tests of `mini`, as modules of one test program (docs/testing.md).

#![cfg(test)] // all of it test code: clippy.toml's test allowances cover its helpers too

mod cluster;
#[path = "../common/mod.rs"]
mod common;
mod deployed;
mod disk_binding;
mod enrolment;
mod idle_flood;
mod recovery;
mod rogue_join_service;
mod vm_mode;

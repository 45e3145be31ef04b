//! The integration tests of `kubeadm`, in one test program: each module was a program
//! of its own, and linking one program instead of one each saves most of the suite's
//! link time (docs/testing.md). Modules keep their own set-up; tests run in parallel
//! threads, as they did within each program.

// Tests may panic: a failed assertion is how they fail.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod driver;
mod kubeadm;
#[path = "../kubeadm_support/mod.rs"]
mod kubeadm_support;
mod supervisor;

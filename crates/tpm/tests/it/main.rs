//! The integration tests of `tpm`, in one test program: each module was a program
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

mod attestation_key;
mod children;
#[path = "../common/mod.rs"]
mod common;
mod ek_certificate;
mod gce_ak;
mod hcl_report;
mod issuer;
mod marker;
mod object_memory;
mod open;
mod pcrs;
mod quote;
mod unclean_reset;

//! The integration tests of `attestation`, in one test program: each module was a program
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

mod ak_spki;
mod boundaries;
#[cfg(feature = "insecure-test-attestation")]
mod cloud_ak;
#[path = "../common/mod.rs"]
mod common;
#[cfg(feature = "insecure-test-attestation")]
mod cvm_ak_trust;
mod ek;
#[cfg(feature = "insecure-test-attestation")]
mod eventlog;
#[cfg(feature = "insecure-test-attestation")]
mod evidence_decoder;
mod hcl;
mod measurements;
mod snp;
mod tdx;
#[cfg(feature = "insecure-test-attestation")]
mod tpm_quote;

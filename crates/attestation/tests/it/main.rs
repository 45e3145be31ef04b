//! The integration tests of `attestation`, as modules of one test program (docs/testing.md).

#![cfg(test)] // all of it test code: clippy.toml's test allowances cover its helpers too

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

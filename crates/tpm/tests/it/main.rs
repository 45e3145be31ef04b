//! The integration tests of `tpm`, as modules of one test program (docs/testing.md).

#![cfg(test)] // all of it test code: clippy.toml's test allowances cover its helpers too

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

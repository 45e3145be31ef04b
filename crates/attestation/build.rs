//! Refuses to build the insecure test attestation into optimised code.
//!
//! The `insecure-test-attestation` feature compiles the Ed25519 test variant, the software
//! TPM quote builder and `AkTrust::insecure_any_ak`: any of them lets a software key pass as
//! a TPM. They are for tests and development builds only. `debug_assertions` is not the
//! gate, because a profile can turn debug assertions on in an optimised build (the bench
//! profile once did); the optimisation level of this crate is. A build with the feature and
//! `opt-level` other than 0 fails here, so `cargo build --release --features
//! insecure-test-attestation` can never produce a binary. The bench profile builds this one
//! crate at `opt-level = 0` (see the root `Cargo.toml`) so that benchmarks may use it.

#![allow(clippy::print_stdout)] // a build script speaks to cargo on stdout

fn main() {
    println!("cargo::rerun-if-env-changed=OPT_LEVEL");
    println!("cargo::rerun-if-env-changed=CARGO_FEATURE_INSECURE_TEST_ATTESTATION");
    let feature = std::env::var_os("CARGO_FEATURE_INSECURE_TEST_ATTESTATION").is_some();
    let opt_level = std::env::var("OPT_LEVEL").unwrap_or_default();
    if feature && opt_level != "0" {
        println!(
            "cargo::error=the `insecure-test-attestation` feature is for tests and development \
             only: it refuses to build with optimisations (opt-level {opt_level}); build \
             without the feature, or in the dev profile"
        );
    }
}

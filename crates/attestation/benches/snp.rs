//! SEV-SNP verification rate on one thread, with the certificate chain cached, beside the
//! bare ECDSA P-384 verification of the same report signature measured in the same run.
//!
//! `cargo bench -p asterism-attestation --bench snp`. The target is a full verification at
//! 80 % or more of the bare signature rate: everything but the signature (parsing, the cache
//! lookup, validity, the certificate-against-report and field checks) must stay small.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    missing_docs
)]

use std::hint::black_box;
use std::time::{Duration, Instant, UNIX_EPOCH};

use asterism_attestation::explain::Reference;
use asterism_attestation::snp::{SnpCerts, SnpPolicy, SnpReport, SnpVerifier};
use base64::Engine;
use ring::signature::{ECDSA_P384_SHA384_FIXED, UnparsedPublicKey};
use x509_parser::prelude::{FromDer, X509Certificate};

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/cvm/snp-aws");

/// Runs `f` repeatedly for about `budget` and returns operations per second.
fn rate(budget: Duration, mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < budget {
        for _ in 0..16 {
            f();
        }
        n += 16;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let b64 = std::fs::read_to_string(format!("{DATA}/report.txt")).unwrap();
    let report = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .unwrap();
    let vlek_pem = std::fs::read(format!("{DATA}/vlek.pem")).unwrap();
    let chain_pem = std::fs::read(format!("{DATA}/certchain.pem")).unwrap();
    let certs = SnpCerts::from_pem(&vlek_pem, Some(&chain_pem)).unwrap();
    let parsed = SnpReport::parse(&report).unwrap();
    let expected = parsed.report_data;
    // Inside the VLEK's validity (2024-12-10 to 2025-12-10).
    let now = UNIX_EPOCH + Duration::from_secs(1_748_736_000);

    // Pinned to the report's own launch, as every verifier must be.
    let verifier = SnpVerifier::new(SnpPolicy {
        measurement: Some(Reference::enforce(parsed.measurement)),
        ..SnpPolicy::default()
    });
    verifier.verify(&report, &certs, &expected, now).unwrap(); // fills the cache

    let (_, leaf) = X509Certificate::from_der(certs.leaf_der()).unwrap();
    let key = leaf.public_key().subject_public_key.data.to_vec();
    let signed = parsed.signed_bytes().to_vec();
    let signature = parsed.signature_fixed();
    UnparsedPublicKey::new(&ECDSA_P384_SHA384_FIXED, &key)
        .verify(&signed, &signature)
        .unwrap();

    let budget = Duration::from_secs(3);
    let mut bare = Vec::new();
    let mut full = Vec::new();
    // Alternate, so that frequency changes and neighbours on a shared machine hit both.
    for _ in 0..2 {
        bare.push(rate(budget, || {
            UnparsedPublicKey::new(&ECDSA_P384_SHA384_FIXED, black_box(&key))
                .verify(black_box(&signed), black_box(&signature))
                .unwrap();
        }));
        full.push(rate(budget, || {
            verifier
                .verify(
                    black_box(&report),
                    black_box(&certs),
                    black_box(&expected),
                    black_box(now),
                )
                .unwrap();
        }));
    }
    let best = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    let (bare, full) = (best(&bare), best(&full));

    println!("SEV-SNP (AWS VLEK report, chain cached), one thread:");
    println!("  bare ECDSA P-384 verify:  {bare:8.0} /s");
    println!("  full report verification: {full:8.0} /s");
    println!("  ratio: {:.1} % (target >= 80 %)", 100.0 * full / bare);
}

//! Benchmark: `tpm-quote` verifications per second on one thread.
//!
//! Evidence is in the real TPM wire format, signed in software by a test AK. Each
//! verification runs the whole `Validator::validate` path: size check, protobuf decode,
//! TPM structure parsing, AK policy and trust, signature, PCR selection and digest,
//! binding, and the comparison with expected measurements.
//!
//! Run: `cargo bench -p asterism-attestation --profile release --bench verify` (the verifier
//! as programs build it; the evidence comes from `asterism-soft-tpm`).
#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing
)] // a benchmark binary

use asterism_attestation::{
    AkTrust, ExpectedPcr, Issuer, Measurements, PcrIndex, PlatformCa, ReportData, Role,
    TpmQuoteValidator, Validator,
};
use asterism_soft_tpm::{SoftAk, SoftTpm};
use std::hint::black_box;
use std::time::{Duration, Instant};

const RSA_AK_PEM: &[u8] = include_bytes!("../tests/data/test-ak-rsa2048.pk8.pem");
/// Distinct pieces of evidence, each bound to its own session.
const SESSIONS: usize = 256;
const RUN: Duration = Duration::from_secs(3);

fn idx(i: u8) -> PcrIndex {
    PcrIndex::new(i).unwrap()
}

/// A node-like software TPM and measurements enforcing its PCRs 4, 8, 9, 11, 12, 13, 15.
fn tpm(ak: SoftAk) -> (SoftTpm, Measurements) {
    let mut tpm = SoftTpm::new(ak);
    for i in [4u8, 8, 9, 11, 12, 13] {
        tpm.extend_pcr(idx(i), &[i; 32]);
    }
    let mut entries: Vec<_> = [4u8, 8, 9, 11, 12, 13, 15]
        .into_iter()
        .map(|i| (idx(i), ExpectedPcr::enforce(tpm.pcr(idx(i)))))
        .collect();
    entries.push((idx(14), ExpectedPcr::warn_only(tpm.pcr(idx(14)))));
    (tpm, Measurements::new(entries).unwrap())
}

fn run(name: &str, tpm: &SoftTpm, validator: &TpmQuoteValidator) -> f64 {
    let sessions: Vec<(ReportData, Vec<u8>)> = (0..SESSIONS)
        .map(|i| {
            let mut exporter = [0u8; 32];
            exporter[..8].copy_from_slice(&(i as u64).to_be_bytes());
            let rd = ReportData::atls(Role::Client, &exporter);
            let ev = tpm.issue(&rd).unwrap();
            (rd, ev)
        })
        .collect();
    // Warm up, and make sure every piece of evidence is accepted.
    for (rd, ev) in &sessions {
        validator.validate(ev, rd).expect("evidence must verify");
    }
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < RUN {
        for (rd, ev) in &sessions {
            black_box(validator.validate(black_box(ev), black_box(rd)).unwrap());
        }
        n += SESSIONS as u64;
    }
    let secs = start.elapsed().as_secs_f64();
    let rate = n as f64 / secs;
    println!(
        "{name:<44} {rate:>10.0} verifications/s  ({:.1} µs each, evidence {} bytes)",
        1e6 / rate,
        sessions[0].1.len()
    );
    rate
}

/// The floor: ring's bare ECDSA P-256 verification of one message, nothing else.
fn raw_ecdsa_p256() -> f64 {
    use ring::signature::{self, EcdsaKeyPair, KeyPair, UnparsedPublicKey};
    let rng = ring::rand::SystemRandom::new();
    let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
    let key = EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap();
    let msg = [7u8; 145]; // about the size of a TPMS_ATTEST
    let sig = key.sign(&rng, &msg).unwrap();
    let public = UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, key.public_key());
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < RUN {
        for _ in 0..256 {
            public
                .verify(black_box(&msg), black_box(sig.as_ref()))
                .unwrap();
        }
        n += 256;
    }
    let rate = n as f64 / start.elapsed().as_secs_f64();
    println!(
        "{:<44} {rate:>10.0} verifications/s  ({:.1} µs each)",
        "reference: bare ring ECDSA P-256 verify",
        1e6 / rate
    );
    rate
}

fn main() {
    println!("tpm-quote verification, one thread, {SESSIONS} distinct sessions, 24 PCRs quoted");
    let floor = raw_ecdsa_p256();

    let (ecdsa, m) = tpm(SoftAk::generate_ecdsa_p256().unwrap());
    let pinned = TpmQuoteValidator::new(
        AkTrust::pinned([ecdsa.ak().fingerprint()]),
        m.clone().into_provider(),
    );
    let rate = run("ECDSA P-256 AK, pinned", &ecdsa, &pinned);

    // Same AK, trusted through a certificate from a software platform CA: one more
    // signature verification (the CA's over the AK certificate) per validation.
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let ca = rcgen::Issuer::new(ca_params, ca_key);
    struct AkPub(Vec<u8>);
    impl rcgen::PublicKeyData for AkPub {
        fn der_bytes(&self) -> &[u8] {
            &self.0
        }
        fn algorithm(&self) -> &'static rcgen::SignatureAlgorithm {
            &rcgen::PKCS_ECDSA_P256_SHA256
        }
    }
    let leaf = rcgen::CertificateParams::new(Vec::<String>::new())
        .unwrap()
        .signed_by(&AkPub(ecdsa.ak().subject_public_key()), &ca)
        .unwrap();
    let mut ecdsa_ca = ecdsa;
    ecdsa_ca.set_ak_cert_chain(vec![leaf.der().to_vec()]);
    let via_ca = TpmQuoteValidator::new(
        AkTrust::platform_ca(PlatformCa::from_der([ca_cert.der()]).unwrap()),
        m.into_provider(),
    );
    run(
        "ECDSA P-256 AK, platform CA (ECDSA) chain",
        &ecdsa_ca,
        &via_ca,
    );

    use rustls_pki_types::PrivatePkcs8KeyDer;
    use rustls_pki_types::pem::PemObject;
    let der = PrivatePkcs8KeyDer::from_pem_slice(RSA_AK_PEM).unwrap();
    let (rsa, m) = tpm(SoftAk::from_rsa_pkcs8(der.secret_pkcs8_der()).unwrap());
    let pinned =
        TpmQuoteValidator::new(AkTrust::pinned([rsa.ak().fingerprint()]), m.into_provider());
    run("RSA-2048 AK, pinned", &rsa, &pinned);

    println!(
        "full ECDSA validation runs at {:.0}% of the bare signature verification rate",
        100.0 * rate / floor
    );
    let target = 15_000.0;
    println!(
        "target for ECDSA P-256, pinned: {target:.0}/s -> {}",
        if rate >= target { "met" } else { "NOT met" }
    );
}

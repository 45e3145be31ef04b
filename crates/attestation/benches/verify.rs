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
use std::time::Duration;

#[path = "support/mod.rs"]
mod support;

const RSA_AK_PEM: &[u8] = include_bytes!("../tests/data/test-ak-rsa2048.pk8.pem");
/// Distinct pieces of evidence, each bound to its own session.
const SESSIONS: usize = 256;
/// Wall time of one measurement; each figure is the best of `ROUNDS`, interleaved.
const RUN: Duration = Duration::from_millis(500);
const ROUNDS: usize = 5;

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

/// Distinct pieces of evidence from `tpm`, each bound to its own session, all accepted by
/// `validator`.
fn sessions(tpm: &SoftTpm, validator: &TpmQuoteValidator) -> Vec<(ReportData, Vec<u8>)> {
    let sessions: Vec<(ReportData, Vec<u8>)> = (0..SESSIONS)
        .map(|i| {
            let mut exporter = [0u8; 32];
            exporter[..8].copy_from_slice(&(i as u64).to_be_bytes());
            let rd = ReportData::atls(Role::Client, &exporter);
            let ev = tpm.issue(&rd).unwrap();
            (rd, ev)
        })
        .collect();
    for (rd, ev) in &sessions {
        validator.validate(ev, rd).expect("evidence must verify");
    }
    sessions
}

/// A closure that verifies the next session's evidence on each call.
fn verifying<'a>(
    validator: &'a TpmQuoteValidator,
    sessions: &'a [(ReportData, Vec<u8>)],
) -> impl FnMut() + 'a {
    let mut i = 0;
    move || {
        let (rd, ev) = &sessions[i % sessions.len()];
        i += 1;
        black_box(validator.validate(black_box(ev), black_box(rd)).unwrap());
    }
}

/// ring's bare ECDSA P-256 verification of one message of about a `TPMS_ATTEST`'s size.
fn bare_ecdsa_p256() -> impl FnMut() {
    use ring::signature::{self, EcdsaKeyPair, KeyPair, UnparsedPublicKey};
    let rng = ring::rand::SystemRandom::new();
    let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
    let key = EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap();
    let msg = [7u8; 145];
    let sig = key.sign(&rng, &msg).unwrap();
    let public = key.public_key().as_ref().to_vec();
    move || {
        UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, black_box(&public))
            .verify(black_box(&msg), black_box(sig.as_ref()))
            .unwrap();
    }
}

fn main() {
    let (ecdsa, m) = tpm(SoftAk::generate_ecdsa_p256().unwrap());
    let pinned = TpmQuoteValidator::new(
        AkTrust::pinned([ecdsa.ak().fingerprint()]),
        m.clone().into_provider(),
    );
    let pinned_sessions = sessions(&ecdsa, &pinned);

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
    let ca_sessions = sessions(&ecdsa_ca, &via_ca);

    use rustls_pki_types::PrivatePkcs8KeyDer;
    use rustls_pki_types::pem::PemObject;
    let der = PrivatePkcs8KeyDer::from_pem_slice(RSA_AK_PEM).unwrap();
    let (rsa, m) = tpm(SoftAk::from_rsa_pkcs8(der.secret_pkcs8_der()).unwrap());
    let rsa_pinned =
        TpmQuoteValidator::new(AkTrust::pinned([rsa.ak().fingerprint()]), m.into_provider());
    let rsa_sessions = sessions(&rsa, &rsa_pinned);

    if std::env::var_os("VERIFY_BENCH_PROFILE").is_some() {
        // For a profiler (`perf record -g`): the pinned ECDSA path alone for ten seconds.
        let mut f = verifying(&pinned, &pinned_sessions);
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            f();
        }
        return;
    }
    let mut bare = bare_ecdsa_p256();
    let mut a = verifying(&pinned, &pinned_sessions);
    let mut b = verifying(&via_ca, &ca_sessions);
    let mut c = verifying(&rsa_pinned, &rsa_sessions);
    let r = support::best(&mut [&mut bare, &mut a, &mut b, &mut c], ROUNDS, RUN);
    let (floor, pinned, chain, rsa) = (r[0], r[1], r[2], r[3]);
    println!(
        "tpm-quote verification, one thread, {SESSIONS} distinct sessions, 24 PCRs quoted; per \
         CPU-second, best of {ROUNDS} x {RUN:?}"
    );
    let line = |name: &str, rate: f64, bytes: Option<usize>| {
        println!(
            "{name:<44} {rate:>10.0} verifications/s  ({:.1} µs each{})",
            1e6 / rate,
            bytes.map_or(String::new(), |b| format!(", evidence {b} bytes"))
        );
    };
    line("reference: bare ring ECDSA P-256 verify", floor, None);
    line(
        "ECDSA P-256 AK, pinned",
        pinned,
        Some(pinned_sessions[0].1.len()),
    );
    line(
        "ECDSA P-256 AK, platform CA (ECDSA) chain",
        chain,
        Some(ca_sessions[0].1.len()),
    );
    line("RSA-2048 AK, pinned", rsa, Some(rsa_sessions[0].1.len()));
    println!(
        "pinned ECDSA P-256 / bare verify: {:.2} (target >= 0.90)",
        pinned / floor
    );
    println!(
        "platform-CA chain / (bare / 2): {:.2} (target >= 0.90)",
        chain / (floor / 2.0)
    );
}

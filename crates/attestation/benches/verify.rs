//! Benchmark: `tpm-quote` verifications per second on one thread.
//!
//! Evidence is in the real TPM wire format, signed in software by a test AK. Each
//! verification runs the whole `Validator::validate` path: size check, protobuf decode,
//! TPM structure parsing, AK policy and trust, signature, PCR selection and digest,
//! binding, and the comparison with expected measurements.
//!
//! Trust policies side by side: a pinned AK; a platform CA's certificate; a cloud vTPM CA's
//! chain (root and intermediate, as GCE's); and, on the real GCE AK certificate, the cloud
//! chain check alone (RSA-2048 leaf, RSA-4096 intermediate) beside the two bare RSA
//! signature verifications it consists of.
//!
//! Run: `cargo bench -p asterism-attestation --profile release --bench verify` (the verifier
//! as programs build it; the evidence comes from `asterism-soft-tpm`).
#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing
)] // a benchmark binary

use asterism_attestation::tpm::CloudAkCa;
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
/// `VERIFY_BENCH_QUICK=1` (scripts/bench) measures 200 ms, best of 3.
const RUN: Duration = Duration::from_millis(500);
const ROUNDS: usize = 5;

fn run_and_rounds() -> (Duration, usize) {
    if std::env::var_os("VERIFY_BENCH_QUICK").is_some() {
        (Duration::from_millis(200), 3)
    } else {
        (RUN, ROUNDS)
    }
}

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

/// A bare ring RSA PKCS#1 SHA-256 verification of `signed` by the issuer's key.
fn bare_rsa(signed: Vec<u8>, sig: Vec<u8>, issuer_key: Vec<u8>) -> impl FnMut() {
    use ring::signature::{self, UnparsedPublicKey};
    UnparsedPublicKey::new(&signature::RSA_PKCS1_2048_8192_SHA256, &issuer_key)
        .verify(&signed, &sig)
        .unwrap();
    move || {
        UnparsedPublicKey::new(
            &signature::RSA_PKCS1_2048_8192_SHA256,
            black_box(&issuer_key),
        )
        .verify(black_box(&signed), black_box(&sig))
        .unwrap();
    }
}

/// The real GCE attestation, and the CA certificates its AK certificate chains to.
const GCE_ATTESTATION: &[u8] = include_bytes!("../tests/data/gce-vtpm/gce-cos-85-nonce9009.pb");
const GCP_ROOT: &[u8] = include_bytes!("../tests/data/tpm-ek-ca/gcp/tpm_ek_root_1.cer");
const GCP_INTERMEDIATE: &[u8] =
    include_bytes!("../tests/data/tpm-ek-ca/gcp/tpm_ek_intermediate_2.crt");

/// `ak_pub` (1) and `ak_cert` (6) of go-tpm-tools' `attest.Attestation`.
#[derive(Clone, PartialEq, prost::Message)]
struct GceAttestation {
    #[prost(bytes = "vec", tag = "1")]
    ak_pub: Vec<u8>,
    #[prost(bytes = "vec", tag = "6")]
    ak_cert: Vec<u8>,
}

/// The cloud chain check of the real GCE AK certificate, and its two RSA signatures bare
/// (the leaf's by the intermediate, RSA-2048; the intermediate's by the root, RSA-4096).
fn gce_chain() -> (impl FnMut(), impl FnMut(), impl FnMut()) {
    use prost::Message;
    use x509_parser::prelude::{FromDer, X509Certificate};
    let a = GceAttestation::decode(GCE_ATTESTATION).unwrap();
    let ca = CloudAkCa::from_der([GCP_ROOT], [GCP_INTERMEDIATE]).unwrap();
    let chain = vec![a.ak_cert.clone()];
    // 2026-01-01, inside every validity period of the chain.
    let at = std::time::UNIX_EPOCH + Duration::from_secs(1_767_225_600);
    ca.check_ak_certificate(&chain, &a.ak_pub, at).unwrap();
    let (_, leaf) = X509Certificate::from_der(&a.ak_cert).unwrap();
    let (_, inter) = X509Certificate::from_der(GCP_INTERMEDIATE).unwrap();
    let (_, root) = X509Certificate::from_der(GCP_ROOT).unwrap();
    let leaf_sig = bare_rsa(
        leaf.tbs_certificate.as_ref().to_vec(),
        leaf.signature_value.data.to_vec(),
        inter.public_key().subject_public_key.data.to_vec(),
    );
    let inter_sig = bare_rsa(
        inter.tbs_certificate.as_ref().to_vec(),
        inter.signature_value.data.to_vec(),
        root.public_key().subject_public_key.data.to_vec(),
    );
    let ak_pub = a.ak_pub;
    let check = move || {
        black_box(
            ca.check_ak_certificate(black_box(&chain), black_box(&ak_pub), at)
                .unwrap(),
        );
    };
    (check, leaf_sig, inter_sig)
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
    ca_params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign];
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let ca = rcgen::Issuer::new(ca_params.clone(), ca_key);
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
        m.clone().into_provider(),
    );
    let ca_sessions = sessions(&ecdsa_ca, &via_ca);

    // Same AK, trusted through a cloud vTPM CA: the AK certificate (keyUsage
    // digitalSignature) from an intermediate the verifier holds, under the cloud's root,
    // as GCE's: two signatures over certificates per validation.
    let cloud_key = rcgen::KeyPair::generate().unwrap();
    let mut root_params = ca_params.clone();
    root_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "cloud vTPM root");
    let cloud_cert = root_params.self_signed(&cloud_key).unwrap();
    let cloud = rcgen::Issuer::new(root_params, cloud_key);
    let inter_key = rcgen::KeyPair::generate().unwrap();
    let mut inter_params = ca_params;
    inter_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "cloud vTPM intermediate");
    let inter_cert = inter_params.signed_by(&inter_key, &cloud).unwrap();
    let inter = rcgen::Issuer::new(inter_params, inter_key);
    let mut leaf_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    leaf_params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    let leaf = leaf_params
        .signed_by(&AkPub(ecdsa_ca.ak().subject_public_key()), &inter)
        .unwrap();
    let mut ecdsa_cloud = ecdsa_ca;
    ecdsa_cloud.set_ak_cert_chain(vec![leaf.der().to_vec()]);
    let via_cloud = TpmQuoteValidator::new(
        AkTrust::cloud_ak(CloudAkCa::from_der([cloud_cert.der()], [inter_cert.der()]).unwrap()),
        m.into_provider(),
    );
    let cloud_sessions = sessions(&ecdsa_cloud, &via_cloud);

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
    let mut d = verifying(&via_cloud, &cloud_sessions);
    let (mut gce, mut gce_leaf, mut gce_inter) = gce_chain();
    let (run, rounds) = run_and_rounds();
    let r = support::best(
        &mut [
            &mut bare,
            &mut a,
            &mut b,
            &mut c,
            &mut d,
            &mut gce,
            &mut gce_leaf,
            &mut gce_inter,
        ],
        rounds,
        run,
    );
    let (floor, pinned, chain, rsa, cloud) = (r[0], r[1], r[2], r[3], r[4]);
    let (gce, gce_leaf, gce_inter) = (r[5], r[6], r[7]);
    println!(
        "tpm-quote verification, one thread, {SESSIONS} distinct sessions, 24 PCRs quoted; per \
         CPU-second, best of {rounds} x {run:?}"
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
    line(
        "ECDSA P-256 AK, cloud vTPM CA (ECDSA) chain",
        cloud,
        Some(cloud_sessions[0].1.len()),
    );
    line("RSA-2048 AK, pinned", rsa, Some(rsa_sessions[0].1.len()));
    line("real GCE AK certificate: cloud chain check", gce, None);
    line(
        "  bare RSA-2048 verify (leaf by intermediate)",
        gce_leaf,
        None,
    );
    line(
        "  bare RSA-4096 verify (intermediate by root)",
        gce_inter,
        None,
    );
    println!(
        "pinned ECDSA P-256 / bare verify: {:.2} (target >= 0.90)",
        pinned / floor
    );
    println!(
        "platform-CA chain / (bare / 2): {:.2} (target >= 0.90)",
        chain / (floor / 2.0)
    );
    println!(
        "cloud chain (root + intermediate) / (bare / 3): {:.2}",
        cloud / (floor / 3.0)
    );
    println!(
        "real GCE chain check / (1 / (1/RSA-2048 + 1/RSA-4096)): {:.2}",
        gce * (1.0 / gce_leaf + 1.0 / gce_inter)
    );
}

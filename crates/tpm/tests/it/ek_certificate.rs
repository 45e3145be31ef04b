//! EK certificates: read from NV when swtpm_setup wrote them, `None` otherwise.

use crate::common::swtpm_and_tpm;
use asterism_tpm::EkCertSlot;

/// The length a DER SEQUENCE claims for itself, header included.
fn der_sequence_length(der: &[u8]) -> usize {
    assert_eq!(der[0], 0x30, "not a DER SEQUENCE");
    match der[1] {
        n if n < 0x80 => 2 + n as usize,
        0x81 => 3 + der[2] as usize,
        0x82 => 4 + u16::from_be_bytes([der[2], der[3]]) as usize,
        other => panic!("unexpected DER length form {other:#x}"),
    }
}

#[test]
fn reads_the_der_ek_certificates_swtpm_setup_wrote() {
    let (_swtpm, mut tpm) = swtpm_and_tpm(true);
    let rsa = tpm
        .read_ek_certificate(EkCertSlot::Rsa2048)
        .unwrap()
        .expect("swtpm_setup writes an RSA EK certificate");
    // The whole NV index is the certificate: exactly one DER SEQUENCE, nothing after it.
    assert_eq!(der_sequence_length(&rsa), rsa.len());

    let ecc = tpm
        .read_ek_certificate(EkCertSlot::EccP384)
        .unwrap()
        .expect("swtpm_setup 0.7 writes a P-384 ECC EK certificate");
    assert_eq!(der_sequence_length(&ecc), ecc.len());
    assert_ne!(rsa, ecc);

    // No P-256 EK certificate was made.
    assert_eq!(tpm.read_ek_certificate(EkCertSlot::EccP256).unwrap(), None);
}

#[test]
fn a_tpm_without_ek_certificates_returns_none() {
    let (_swtpm, mut tpm) = swtpm_and_tpm(false);
    for slot in EkCertSlot::ALL {
        assert_eq!(tpm.read_ek_certificate(slot).unwrap(), None, "{slot:?}");
    }
}

// ---- verifying swtpm's EK certificates; swtpm's local CA plays the manufacturer ----

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use asterism_attestation::tpm::ek::{EkCaBundle, EkError, certificates_from_nv};
use asterism_testkit::Swtpm;
use asterism_tpm::Tpm;

/// swtpm_localca's root and the CA under it that signs EK certificates.
const LOCALCA_ROOT: &str = "swtpm-localca-rootca-cert.pem";
const LOCALCA_ISSUER: &str = "swtpm-localca-cert.pem";

/// A bundle directory holding the chosen certificates of the swtpm's local CA (its CA
/// directory also holds keys and configuration, which a bundle refuses).
fn localca_bundle(swtpm: &Swtpm, root: bool, issuer: bool) -> (tempfile::TempDir, EkCaBundle) {
    let ca = swtpm.ek_ca_dir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    if root {
        std::fs::copy(ca.join(LOCALCA_ROOT), dir.path().join(LOCALCA_ROOT)).unwrap();
    }
    if issuer {
        std::fs::copy(ca.join("issuercert.pem"), dir.path().join(LOCALCA_ISSUER)).unwrap();
    }
    let bundle = EkCaBundle::load_dir(dir.path(), SystemTime::now()).unwrap();
    (dir, bundle)
}

/// The RSA EK's certificate (swtpm_setup writes one) and its public area.
fn rsa_ek(tpm: &mut Tpm) -> (Vec<u8>, Vec<u8>) {
    let cert = tpm
        .read_ek_certificate(EkCertSlot::Rsa2048)
        .unwrap()
        .expect("swtpm_setup writes an RSA EK certificate");
    (cert, tpm.read_ek_public(EkCertSlot::Rsa2048).unwrap())
}

fn pem_to_der(path: &Path) -> Vec<u8> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject as _;
    CertificateDer::from_pem_file(path).unwrap().to_vec()
}

#[test]
fn swtpms_ek_certificates_verify_against_its_local_ca() {
    let (swtpm, mut tpm) = swtpm_and_tpm(true);
    let (_dir, bundle) = localca_bundle(&swtpm, true, true);
    for slot in [EkCertSlot::Rsa2048, EkCertSlot::EccP384] {
        let cert = tpm.read_ek_certificate(slot).unwrap().unwrap();
        let ek = tpm.read_ek_public(slot).unwrap();
        let verified = bundle
            .verify(&cert, &[], &ek, SystemTime::now())
            .unwrap_or_else(|e| panic!("{slot:?}: {e}"));
        let tpm_info = verified.tpm();
        assert_eq!(tpm_info.manufacturer, "id:00001014", "{slot:?}");
        assert_eq!(tpm_info.manufacturer_id(), Some(0x1014));
        assert_eq!(tpm_info.model, "swtpm");
        assert_eq!(tpm_info.version, "id:20191023");
        assert_eq!(tpm_info.specification.family, "2.0");
        assert_eq!(tpm_info.specification.level, 0);
        assert_eq!(tpm_info.specification.revision, 164);
        assert_eq!(verified.anchor_file(), LOCALCA_ISSUER);
        assert_eq!(verified.anchor_subject(), "CN=swtpm-localca");
        assert_eq!(verified.ek_public_bytes(), ek.as_slice());
    }
}

#[test]
fn the_ek_public_area_is_the_same_key_every_time() {
    let (_swtpm, mut tpm) = swtpm_and_tpm(true);
    for slot in [EkCertSlot::Rsa2048, EkCertSlot::EccP384] {
        assert_eq!(
            tpm.read_ek_public(slot).unwrap(),
            tpm.read_ek_public(slot).unwrap()
        );
    }
}

#[test]
fn the_intermediate_can_come_from_the_ek_chain_nv_indices() {
    let (swtpm, mut tpm) = swtpm_and_tpm(true);
    let (_dir, root_only) = localca_bundle(&swtpm, true, false);
    let (cert, ek) = rsa_ek(&mut tpm);
    assert_eq!(tpm.read_ek_certificate_chain().unwrap(), vec![]);

    // Without its chain, the refusal names the CA the bundle lacks.
    let err = root_only
        .verify(&cert, &[], &ek, SystemTime::now())
        .unwrap_err();
    assert_eq!(
        err,
        EkError::UntrustedIssuer {
            issuer: "CN=swtpm-localca".into()
        }
    );

    // The manufacturer stores its CA in the first chain index, padded.
    let mut index = pem_to_der(&swtpm.ek_ca_dir().unwrap().join("issuercert.pem"));
    index.resize(index.len() + 32, 0xFF);
    drop(tpm);
    crate::hcl_report::paravisor_writes(&swtpm, 0x01C0_0100, &index);
    let mut tpm = Tpm::open(&swtpm.config()).unwrap();
    let stored = tpm.read_ek_certificate_chain().unwrap();
    assert_eq!(stored, vec![(0x01C0_0100, index)]);
    let chain: Vec<Vec<u8>> = stored
        .iter()
        .flat_map(|(_, contents)| certificates_from_nv(contents).unwrap())
        .collect();
    let verified = root_only
        .verify(&cert, &chain, &ek, SystemTime::now())
        .unwrap();
    assert_eq!(verified.anchor_file(), LOCALCA_ROOT);
}

#[test]
fn an_ek_certificate_is_refused_for_another_ek() {
    let (swtpm, mut tpm) = swtpm_and_tpm(true);
    let (_dir, bundle) = localca_bundle(&swtpm, true, true);
    let rsa_cert = tpm
        .read_ek_certificate(EkCertSlot::Rsa2048)
        .unwrap()
        .unwrap();
    let ecc_ek = tpm.read_ek_public(EkCertSlot::EccP384).unwrap();
    let err = bundle
        .verify(&rsa_cert, &[], &ecc_ek, SystemTime::now())
        .unwrap_err();
    assert!(matches!(err, EkError::KeyMismatch(_)), "{err}");

    // Another TPM's EK of the same kind, certified by the same CA: not this certificate's.
    let (_other_swtpm, mut other) = swtpm_and_tpm(true);
    let other_ek = other.read_ek_public(EkCertSlot::Rsa2048).unwrap();
    let err = bundle
        .verify(&rsa_cert, &[], &other_ek, SystemTime::now())
        .unwrap_err();
    assert!(matches!(err, EkError::KeyMismatch(_)), "{err}");
}

#[test]
fn swtpms_ek_certificate_is_untrusted_by_the_tpm_vendors_bundle() {
    let (_swtpm, mut tpm) = swtpm_and_tpm(true);
    let vendors = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../attestation/tests/data/tpm-ek-ca/vendors");
    // 2025-06-01, inside every vendor file's validity.
    let bundle =
        EkCaBundle::load_dir(&vendors, UNIX_EPOCH + Duration::from_secs(1_748_736_000)).unwrap();
    let (cert, ek) = rsa_ek(&mut tpm);
    let err = bundle
        .verify(&cert, &[], &ek, SystemTime::now())
        .unwrap_err();
    assert_eq!(
        err,
        EkError::UntrustedIssuer {
            issuer: "CN=swtpm-localca".into()
        }
    );
}

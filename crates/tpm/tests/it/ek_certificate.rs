//! EK certificates: read from NV when swtpm_setup wrote them, `None` otherwise.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

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

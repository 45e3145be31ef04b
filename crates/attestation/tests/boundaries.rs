//! Checks at their exact boundaries, and checks no other test pinned: each test here kills
//! mutants that survived `scripts/mutants attestation` (docs/testing.md), and fails when the
//! check it names is removed or moved by one.
//!
//! * the evidence size limit (`>` against `>=`): exactly [`MAX_EVIDENCE_SIZE`] bytes pass;
//! * the AK certificate chain limit: exactly four certificates pass, five do not;
//! * the RSA AK modulus: it must be exactly keyBits long and have its top bit set, and
//!   keyBits must be a multiple of 8 within 2048..=8192;
//! * the measurements file: its size limit, duplicate fields, the entry limit, the
//!   messages that say what was expected.
#![cfg(feature = "insecure-test-attestation")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)] // test code

mod common;

use asterism_attestation::tpm::soft::SoftAk;
use asterism_attestation::tpm::structures::PublicParams;
use asterism_attestation::tpm::{
    AkTrust, EvidenceError, MAX_EVIDENCE_SIZE, QuoteEvidence, TpmQuoteValidator,
};
use asterism_attestation::{
    ExpectedPcr, Issuer, Measurements, MeasurementsError, PcrIndex, ReportData, Role,
    ValidationError, Validator,
};
use common::*;

fn rd() -> ReportData {
    ReportData::atls(Role::Client, &[0x22; 32])
}

// ---------------------------------------------------------------- evidence limits

/// Evidence from a booted software TPM whose event log is `log_len` bytes.
fn evidence_with_log(log_len: usize) -> Vec<u8> {
    let mut tpm = booted_tpm(ecdsa_ak());
    tpm.set_event_log(Some(vec![0x5a; log_len]));
    tpm.quote(&rd()).evidence(tpm.ak()).unwrap()
}

#[test]
fn evidence_of_exactly_the_size_limit_is_accepted_and_one_byte_more_is_not() {
    // Grow the event log until the encoding is exactly the limit (the length prefix of
    // the log grows with it, so search rather than compute).
    let base = evidence_with_log(0).len();
    let mut log_len = MAX_EVIDENCE_SIZE - base - 4;
    let exact = loop {
        let ev = evidence_with_log(log_len);
        match ev.len().cmp(&MAX_EVIDENCE_SIZE) {
            std::cmp::Ordering::Equal => break ev,
            std::cmp::Ordering::Less => log_len += 1,
            std::cmp::Ordering::Greater => panic!("cannot hit the limit exactly"),
        }
    };
    assert_eq!(exact.len(), MAX_EVIDENCE_SIZE);
    let decoded = QuoteEvidence::decode(&exact).unwrap();
    assert_eq!(decoded.event_log.map(|l| l.len()), Some(log_len));

    let over = evidence_with_log(log_len + 1);
    assert_eq!(over.len(), MAX_EVIDENCE_SIZE + 1);
    assert!(matches!(
        QuoteEvidence::decode(&over),
        Err(EvidenceError::TooLarge(n)) if n == MAX_EVIDENCE_SIZE + 1
    ));
}

#[test]
fn a_certificate_chain_of_four_is_decoded_and_of_five_is_refused() {
    let mut tpm = booted_tpm(ecdsa_ak());
    tpm.set_ak_cert_chain(vec![vec![0x30, 0x00]; 4]);
    let ev = tpm.quote(&rd()).evidence(tpm.ak()).unwrap();
    assert_eq!(QuoteEvidence::decode(&ev).unwrap().ak_cert_chain.len(), 4);

    tpm.set_ak_cert_chain(vec![vec![0x30, 0x00]; 5]);
    let ev = tpm.quote(&rd()).evidence(tpm.ak()).unwrap();
    assert!(matches!(
        QuoteEvidence::decode(&ev),
        Err(EvidenceError::CertChainTooLong(5))
    ));
}

// ---------------------------------------------------------------- RSA AK policy

/// Validates evidence from the test RSA AK with its public area changed by `edit`, the
/// (changed) AK pinned, so that only the AK policy or the signature can refuse it.
fn rsa_with(edit: impl FnOnce(&mut Vec<u8>, &mut u16)) -> Result<(), ValidationError> {
    let ak: SoftAk = rsa_ak()
        .with_public(|p| {
            if let PublicParams::Rsa {
                modulus, key_bits, ..
            } = &mut p.params
            {
                edit(modulus, key_bits);
            }
        })
        .unwrap();
    let tpm = booted_tpm(ak);
    let v = TpmQuoteValidator::new(
        AkTrust::pinned([tpm.ak().fingerprint()]),
        measurements_of(&tpm).into_provider(),
    );
    v.validate(&tpm.issue(&rd()).unwrap(), &rd()).map(|_| ())
}

fn policy(r: Result<(), ValidationError>, needle: &str) {
    match r {
        Err(ValidationError::Policy(m)) => assert!(m.contains(needle), "{m}"),
        other => panic!("want a policy error containing {needle:?}, got {other:?}"),
    }
}

#[test]
fn the_unchanged_rsa_ak_is_accepted() {
    rsa_with(|_, _| {}).unwrap();
}

#[test]
fn an_rsa_modulus_without_its_top_bit_is_refused_by_the_ak_policy() {
    // Same length as keyBits says, top bit cleared: a shorter key than announced.
    policy(
        rsa_with(|n, _| n[0] &= 0x7f),
        "RSA AK modulus is 256 bytes or lacks its top bit",
    );
    policy(
        rsa_with(|n, _| n[0] = 0x01),
        "RSA AK modulus is 256 bytes or lacks its top bit",
    );
}

#[test]
fn an_rsa_modulus_longer_or_shorter_than_key_bits_is_refused_even_with_its_top_bit() {
    // keyBits 2048 with a 255-byte modulus whose top bit is set.
    policy(
        rsa_with(|n, _| {
            n.pop();
        }),
        "RSA AK modulus is 255 bytes",
    );
    // keyBits 2048 with a 257-byte modulus.
    policy(rsa_with(|n, _| n.push(0x01)), "RSA AK modulus is 257 bytes");
    // keyBits 2056 with the 256-byte modulus.
    policy(
        rsa_with(|_, bits| *bits = 2056),
        "RSA AK modulus is 256 bytes",
    );
}

#[test]
fn rsa_key_bits_must_be_a_multiple_of_8_between_2048_and_8192() {
    for bits in [2044, 2052, 2047, 2040, 8200, 16384, 0] {
        policy(rsa_with(|_, b| *b = bits), &format!("keyBits {bits} "));
    }
}

// ---------------------------------------------------------------- measurements file

const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

fn json_error(doc: &str) -> String {
    match Measurements::from_json(doc.as_bytes()) {
        Err(MeasurementsError::Json(e)) => e.to_string(),
        other => panic!("want a JSON error for {doc}, got {other:?}"),
    }
}

#[test]
fn a_measurements_file_of_exactly_1_mib_loads_and_one_byte_more_does_not() {
    const MIB: usize = 1024 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let doc = format!(r#"{{"measurements": {{"4": "{A}"}}}}"#);
    let padded = |len: usize| {
        let mut bytes = doc.clone().into_bytes();
        bytes.resize(len, b' ');
        bytes
    };
    let path = dir.path().join("m.json");
    std::fs::write(&path, padded(MIB)).unwrap();
    let m = Measurements::load(&path).unwrap();
    assert_eq!(m.len(), 1);
    assert!(!m.is_empty());

    std::fs::write(&path, padded(MIB + 1)).unwrap();
    assert!(matches!(
        Measurements::load(&path),
        Err(MeasurementsError::TooLarge { size, .. }) if size == (MIB + 1) as u64
    ));
}

#[test]
fn all_24_pcrs_load_and_a_25th_entry_is_refused_while_parsing() {
    let entries = |n: u8| {
        (0..n)
            .map(|i| {
                if i == 16 || i == 23 {
                    format!(r#""{i}": {{"expected": "{A}", "warnOnly": true}}"#)
                } else {
                    format!(r#""{i}": "{A}""#)
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let all = format!(r#"{{"measurements": {{{}}}}}"#, entries(24));
    let m = Measurements::from_json(all.as_bytes()).unwrap();
    assert_eq!(m.len(), 24);
    assert_eq!(
        m.iter().map(|(i, _)| i.get()).collect::<Vec<_>>(),
        (0..24).collect::<Vec<u8>>()
    );
    // A 25th entry (here a repeated index) is refused by the entry limit itself, before
    // the index is even looked at.
    let over = format!(r#"{{"measurements": {{{}, "4": "{A}"}}}}"#, entries(24));
    assert!(json_error(&over).contains("more than 24 PCR entries"));
}

#[test]
fn a_repeated_field_inside_an_entry_is_refused() {
    let e = json_error(&format!(
        r#"{{"measurements": {{"4": {{"expected": "{A}", "warnOnly": false, "warnOnly": true}}}}}}"#
    ));
    assert!(e.contains("duplicate field `warnOnly`"), "{e}");
    let e = json_error(&format!(
        r#"{{"measurements": {{"4": {{"expected": "{A}", "expected": "{A}"}}}}}}"#
    ));
    assert!(e.contains("duplicate field `expected`"), "{e}");
}

#[test]
fn a_repeated_pcr_index_is_refused_even_with_the_same_value_in_another_form() {
    let doc = format!(r#"{{"measurements": {{"4": "{A}", "4": {{"expected": "{A}"}}}}}}"#);
    assert!(matches!(
        Measurements::from_json(doc.as_bytes()),
        Err(MeasurementsError::DuplicateIndex(i)) if i.get() == 4
    ));
    let four = PcrIndex::new(4).unwrap();
    assert!(matches!(
        Measurements::new([
            (four, ExpectedPcr::enforce([1; 32])),
            (four, ExpectedPcr::enforce([1; 32])),
        ]),
        Err(MeasurementsError::DuplicateIndex(i)) if i == four
    ));
}

#[test]
fn shape_errors_say_what_was_expected() {
    let e = json_error(r#"{"measurements": [1, 2]}"#);
    assert!(e.contains("a map from PCR index to expected value"), "{e}");
    let e = json_error(r#"{"measurements": {"4": 5}}"#);
    assert!(
        e.contains(r#"a hex string or {"expected": "<hex>", "warnOnly": <bool>}"#),
        "{e}"
    );
}

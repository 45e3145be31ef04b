//! Checks at their exact boundaries, and checks no other test pinned: each test here kills
//! mutants that survived `scripts/mutants attestation` (docs/testing.md), and fails when the
//! check it names is removed or moved by one.
//!
//! * the evidence size limit (`>` against `>=`): exactly [`MAX_EVIDENCE_SIZE`] bytes pass;
//! * the AK certificate chain limit: exactly four certificates pass, five do not;
//! * the RSA AK modulus: it must be exactly keyBits long and have its top bit set, and
//!   keyBits must be a multiple of 8 within 2048..=8192;
//! * the measurements file: its size limit, duplicate fields, the entry limit, the
//!   messages that say what was expected;
//! * the TPM structures: TPM2B and bank-count limits, `clockInfo.safe`, the KDF schemes, the
//!   TPMA_OBJECT bits, the accessors and error messages the validator relies on;
//! * the `Debug` forms of report data, measurements and verified evidence.
#![cfg(feature = "insecure-test-attestation")]

use crate::common::*;
use asterism_attestation::tpm::structures::{KdfScheme, ObjectAttributes, PublicParams, alg};
use asterism_attestation::tpm::{
    AkTrust, EvidenceError, MAX_EVIDENCE_SIZE, ParseError, QuoteEvidence, TpmQuoteValidator,
    TpmsAttest, TpmtPublic, TpmtSignature,
};
use asterism_attestation::{
    ExpectedPcr, Issuer, Measurement, Measurements, MeasurementsError, PcrIndex, ReportData, Role,
    ValidationError, Validator,
};
use asterism_soft_tpm::SoftAk;

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

// ---------------------------------------------------------------- TPM structures

/// The TPMS_ATTEST of a fresh quote, marshalled.
fn attest_bytes(edit: impl FnOnce(&mut TpmsAttest)) -> Result<Vec<u8>, ParseError> {
    let tpm = booted_tpm(ecdsa_ak());
    let mut attest = tpm.quote(&rd()).attest;
    edit(&mut attest);
    attest.to_bytes()
}

#[test]
fn a_qualified_signer_of_66_bytes_parses_and_of_67_does_not() {
    let bytes = attest_bytes(|a| a.qualified_signer = vec![0x0b; 66]).unwrap();
    assert_eq!(
        TpmsAttest::parse(&bytes).unwrap().qualified_signer.len(),
        66
    );
    // One byte more, spliced in by hand (the marshaller refuses it too).
    assert!(attest_bytes(|a| a.qualified_signer = vec![0x0b; 67]).is_err());
    let mut longer = bytes[..8 + 66].to_vec();
    longer[6..8].copy_from_slice(&67u16.to_be_bytes());
    longer.push(0x0b);
    longer.extend_from_slice(&bytes[8 + 66..]);
    let e = TpmsAttest::parse(&longer).unwrap_err().to_string();
    assert!(e.contains("qualifiedSigner is 67, at most 66"), "{e}");
}

#[test]
fn clock_safe_false_and_true_both_parse() {
    for safe in [false, true] {
        let bytes = attest_bytes(|a| a.clock_info.safe = safe).unwrap();
        assert_eq!(TpmsAttest::parse(&bytes).unwrap().clock_info.safe, safe);
    }
}

#[test]
fn sixteen_pcr_banks_marshal_and_parse_and_seventeen_do_neither() {
    let banks = |n: usize| {
        move |a: &mut TpmsAttest| {
            let first = a.quote.pcr_select[0].clone();
            a.quote.pcr_select = vec![first; n];
        }
    };
    let bytes = attest_bytes(banks(16)).unwrap();
    assert_eq!(
        TpmsAttest::parse(&bytes).unwrap().quote.pcr_select.len(),
        16
    );
    let e = attest_bytes(banks(17)).unwrap_err().to_string();
    assert!(e.contains("pcrSelect.count is 17"), "{e}");
}

#[test]
fn a_signature_reports_its_scheme_and_hash() {
    for (ak, scheme) in [(ecdsa_ak(), alg::ECDSA), (rsa_ak(), alg::RSASSA)] {
        let tpm = booted_tpm(ak);
        let wire = tpm.quote(&rd()).sign(tpm.ak()).unwrap();
        let sig = TpmtSignature::parse(&wire.signature).unwrap();
        assert_eq!(sig.scheme(), scheme);
        assert_eq!(sig.hash(), alg::SHA256);
    }
}

#[test]
fn object_attribute_bits_are_those_of_the_tpm_specification() {
    // TPM 2.0 Part 2, TPMA_OBJECT.
    assert_eq!(ObjectAttributes::FIXED_TPM, 0x0000_0002);
    assert_eq!(ObjectAttributes::ST_CLEAR, 0x0000_0004);
    assert_eq!(ObjectAttributes::FIXED_PARENT, 0x0000_0010);
    assert_eq!(ObjectAttributes::SENSITIVE_DATA_ORIGIN, 0x0000_0020);
    assert_eq!(ObjectAttributes::USER_WITH_AUTH, 0x0000_0040);
    assert_eq!(ObjectAttributes::ADMIN_WITH_POLICY, 0x0000_0080);
    assert_eq!(ObjectAttributes::NO_DA, 0x0000_0400);
    assert_eq!(ObjectAttributes::RESTRICTED, 0x0001_0000);
    assert_eq!(ObjectAttributes::DECRYPT, 0x0002_0000);
    assert_eq!(ObjectAttributes::SIGN, 0x0004_0000);
}

#[test]
fn an_ecc_public_area_with_a_known_kdf_marshals_and_an_unknown_one_does_not() {
    let with_kdf = |kdf: KdfScheme| {
        let mut public = ecdsa_ak().public_area().clone();
        if let PublicParams::Ecc { kdf: k, .. } = &mut public.params {
            *k = kdf;
        }
        public.to_bytes()
    };
    for scheme in [
        alg::MGF1,
        alg::KDF1_SP800_56A,
        alg::KDF2,
        alg::KDF1_SP800_108,
    ] {
        let bytes = with_kdf(KdfScheme::Hashed {
            scheme,
            hash: alg::SHA256,
        })
        .unwrap();
        assert_eq!(
            TpmtPublic::parse(&bytes).unwrap().to_bytes().unwrap(),
            bytes
        );
    }
    assert!(
        with_kdf(KdfScheme::Hashed {
            scheme: 0x1234,
            hash: alg::SHA256,
        })
        .is_err()
    );
}

#[test]
fn a_selection_mismatch_names_both_pcr_lists() {
    let mut tpm = booted_tpm(ecdsa_ak());
    tpm.set_selection([4u8, 8].map(idx));
    let v = TpmQuoteValidator::new(
        AkTrust::pinned([tpm.ak().fingerprint()]),
        Measurements::new([(idx(4), ExpectedPcr::enforce(tpm.pcr(idx(4))))])
            .unwrap()
            .into_provider(),
    );
    let mut q = tpm.quote(&rd());
    q.pcrs.insert(idx(5), [0u8; 32]);
    policy(
        v.validate(&q.evidence(tpm.ak()).unwrap(), &rd())
            .map(|_| ()),
        "supplied PCRs [4,5,8] do not match the signed selection [4,8]",
    );
}

// ---------------------------------------------------------------- Debug forms

#[test]
fn debug_forms_show_what_they_describe() {
    let rd = ReportData::verify(b"nonce");
    assert_eq!(
        format!("{rd:?}"),
        format!("ReportData({})", hex::encode(rd.as_bytes()))
    );
    let m = Measurement {
        index: 4,
        value: vec![0xab, 0x01],
    };
    assert_eq!(format!("{m:?}"), "4=ab01");

    let tpm = booted_tpm(ecdsa_ak());
    let v = TpmQuoteValidator::new(
        AkTrust::pinned([tpm.ak().fingerprint()]),
        measurements_of(&tpm).into_provider(),
    );
    let ok = v.validate(&tpm.issue(&rd).unwrap(), &rd).unwrap();
    let shown = format!("{ok:?}");
    assert!(shown.starts_with("VerifiedEvidence {"), "{shown}");
    assert!(shown.contains("tpm-quote"), "{shown}");
    assert!(shown.contains(ok.identity()), "{shown}");
    assert!(
        shown.contains(&format!("4={}", hex::encode(tpm.pcr(idx(4))))),
        "{shown}"
    );
}

#[test]
fn an_unknown_kdf_is_refused_by_the_parser_naming_the_structure() {
    let mut public = ecdsa_ak().public_area().clone();
    if let PublicParams::Ecc { kdf, .. } = &mut public.params {
        *kdf = KdfScheme::Hashed {
            scheme: alg::MGF1,
            hash: alg::SHA256,
        };
    }
    let mut bytes = public.to_bytes().unwrap();
    // MGF1 with SHA-256, as marshalled: replace the KDF by an unknown algorithm.
    let at = bytes
        .windows(4)
        .position(|w| w == [0x00, 0x07, 0x00, 0x0b])
        .unwrap();
    bytes[at..at + 2].copy_from_slice(&0x1234u16.to_be_bytes());
    let e = TpmtPublic::parse(&bytes).unwrap_err().to_string();
    assert!(
        e.contains("TPMT_PUBLIC: parameters.kdf.scheme has unsupported value 0x1234"),
        "{e}"
    );
}

//! The one-pass evidence decoder against the definition it replaces: decode with prost,
//! re-encode, accept only when the bytes are the same, then build the evidence. For every
//! input below, both accept or both refuse, and what they accept is the same evidence.
//!
//! The inputs are real encodings (a software TPM's quote, with and without a certificate
//! chain and an event log, and each confidential-VM platform kind) and every mutation of
//! them a decoder could get wrong: each byte changed, each byte removed, each truncation, a
//! zero byte inserted before each byte, each field appended again, and hand-made encodings
//! that are valid protobuf but not canonical.

use crate::common::*;
use asterism_attestation::ReportData;
use asterism_attestation::tpm::{
    AwsSnp, AzureSnp, AzureTdx, EvidenceError, PlatformKind, QuoteEvidence, TpmQuoteEvidence,
};
use prost::Message;

/// Decode-then-re-encode: the definition of a canonical encoding.
fn oracle(bytes: &[u8]) -> Option<Result<QuoteEvidence, EvidenceError>> {
    let wire = TpmQuoteEvidence::decode(bytes).ok()?;
    if wire.encode_to_vec() != bytes {
        return None;
    }
    Some(QuoteEvidence::try_from(wire))
}

/// Checks the decoder against the oracle on one input; returns whether it was accepted.
fn agree(bytes: &[u8], what: &str) -> bool {
    let ours = QuoteEvidence::decode(bytes);
    match (oracle(bytes), &ours) {
        (Some(Ok(want)), Ok(got)) => {
            assert_eq!(got, &want, "{what}: both accept, different evidence");
            true
        }
        (Some(Ok(_)), Err(e)) => panic!("{what}: the oracle accepts, the decoder refuses: {e}"),
        (None | Some(Err(_)), Ok(_)) => {
            panic!("{what}: the decoder accepts what the oracle refuses")
        }
        (Some(Err(want)), Err(got)) => {
            // Canonical bytes whose content is wrong: the same check must refuse them.
            assert_eq!(
                got, &want,
                "{what}: a different refusal for canonical bytes"
            );
            false
        }
        (None, Err(_)) => false,
    }
}

fn samples() -> Vec<(&'static str, Vec<u8>)> {
    let tpm = booted_tpm(ecdsa_ak());
    let rd = ReportData::verify(b"decoder");
    let plain = tpm.quote(&rd).sign(tpm.ak()).unwrap();
    let mut full = plain.clone();
    full.ak_cert_chain = vec![vec![0x30, 0x00], Vec::new(), vec![0x30; 130]];
    full.event_log = Some(vec![7; 40]);
    let mut empty_log = plain.clone();
    empty_log.event_log = Some(Vec::new());
    let mut pcr0 = plain.clone();
    pcr0.pcrs.truncate(3);
    let kinds = [
        PlatformKind::AzureSevSnp(AzureSnp {
            hcl_report: vec![1; 200],
            certs: vec![vec![2; 3], Vec::new()],
        }),
        PlatformKind::AzureTdx(AzureTdx {
            quote: vec![3; 150],
            runtime_data: b"{\"keys\":[]}".to_vec(),
        }),
        PlatformKind::AwsSevSnp(AwsSnp {
            report: Vec::new(),
            certs: vec![vec![4; 5]],
        }),
        PlatformKind::AzureTdx(AzureTdx::default()),
    ];
    let mut out = vec![
        ("plain", plain.encode_to_vec()),
        ("chain and event log", full.encode_to_vec()),
        ("empty event log", empty_log.encode_to_vec()),
        ("PCRs 0..3", pcr0.encode_to_vec()),
    ];
    for kind in kinds {
        out.push((
            "platform",
            plain.clone().with_platform(kind).encode_to_vec(),
        ));
    }
    out
}

#[test]
fn the_samples_decode_to_what_prost_decodes() {
    for (what, bytes) in samples() {
        assert!(agree(&bytes, what), "{what}: refused");
    }
}

#[test]
fn every_byte_changed_removed_or_cut_is_judged_as_decode_then_re_encode_judges_it() {
    let mut accepted = 0usize;
    let mut cases = 0usize;
    for (what, bytes) in samples() {
        for i in 0..bytes.len() {
            for v in [0x00, 0x80, bytes[i] ^ 0x80, bytes[i].wrapping_add(1)] {
                let mut m = bytes.clone();
                m[i] = v;
                accepted += usize::from(agree(&m, &format!("{what}: byte {i} = {v:#04x}")));
                cases += 1;
            }
            let mut m = bytes.clone();
            m.remove(i);
            accepted += usize::from(agree(&m, &format!("{what}: byte {i} removed")));
            let mut m = bytes.clone();
            m.insert(i, 0x00);
            accepted += usize::from(agree(&m, &format!("{what}: zero inserted at {i}")));
            accepted += usize::from(agree(&bytes[..i], &format!("{what}: cut at {i}")));
            cases += 3;
        }
    }
    // Most mutations are refused, but some are accepted (a changed PCR value or signature
    // byte is still canonical): the comparison ran on both sides of the line.
    assert!(
        accepted > 1000 && cases - accepted > 1000,
        "{accepted} of {cases}"
    );
}

/// A key byte for a field and wire type (fields below 16).
fn key(field: u8, wire_type: u8) -> u8 {
    (field << 3) | wire_type
}

#[test]
fn each_field_appended_again_or_padded_is_refused_as_the_oracle_refuses_it() {
    let (_, plain) = &samples()[0];
    // The sample ends with field 5: fields 1 to 5 again, and 9, are refused; 6 to 8 come
    // after it in order, and are judged as the oracle judges them.
    for field in 1..=9u8 {
        for (wire_type, payload) in [(0u8, vec![1u8]), (2, vec![1, 0x41]), (2, vec![0])] {
            let mut m = plain.clone();
            m.push(key(field, wire_type));
            m.extend_from_slice(&payload);
            let accepted = agree(&m, &format!("field {field} type {wire_type} appended"));
            if !(6..=8).contains(&field) {
                assert!(!accepted, "field {field} appended: accepted");
            }
        }
    }
    // A fixed-width or group wire type where a field is expected.
    for wire_type in [1u8, 3, 4, 5, 6, 7] {
        let mut m = vec![key(1, wire_type)];
        m.extend_from_slice(&plain[1..]);
        assert!(!agree(&m, &format!("version as wire type {wire_type}")));
    }
}

#[test]
fn valid_protobuf_that_no_encoder_writes_is_refused_as_non_canonical() {
    let (_, plain) = &samples()[0];
    assert_eq!(&plain[..2], &[0x08, 0x01], "version 1 first");
    let rest = &plain[2..];
    let with = |prefix: &[u8]| [prefix, rest].concat();
    let cases: [(&str, Vec<u8>); 8] = [
        // Alone, so no other rule (field order) refuses it first.
        ("only a zero version, written out", vec![0x08, 0x00]),
        ("version as a padded varint", with(&[0x08, 0x81, 0x00])),
        ("version 1 as a 64-bit varint", {
            with(&[
                0x08, 0x81, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00,
            ])
        }),
        // 2^32 + 1 truncates to 1 as a uint32: prost reads it, but writes 1.
        (
            "version above 32 bits",
            with(&[0x08, 0x81, 0x80, 0x80, 0x80, 0x10]),
        ),
        (
            "a zero version written out",
            [&[0x08, 0x00][..], plain].concat(),
        ),
        ("an empty attest written out", {
            let mut m = plain[..2].to_vec();
            m.extend_from_slice(&[0x12, 0x00]);
            m.extend_from_slice(rest);
            m
        }),
        (
            "the key as a padded varint",
            [&[0x88, 0x00, 0x01][..], rest].concat(),
        ),
        ("version last", [rest, &plain[..2]].concat()),
    ];
    for (what, bytes) in cases {
        assert!(!agree(&bytes, what), "{what}: accepted");
        assert_eq!(
            QuoteEvidence::decode(&bytes).unwrap_err(),
            EvidenceError::NonCanonical,
            "{what}"
        );
    }
    // A varint of eleven bytes, or one that overflows 64 bits, is not protobuf at all.
    for bad in [
        vec![
            0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02,
        ],
        vec![
            0x08, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01,
        ],
        vec![0x08, 0x80],
    ] {
        assert!(!agree(&bad, "bad varint"));
        assert!(matches!(
            QuoteEvidence::decode(&bad),
            Err(EvidenceError::Protobuf(_))
        ));
    }
}

#[test]
fn a_platform_report_holds_exactly_one_kind() {
    let (_, plain) = &samples()[0];
    let one = |field: u8| [key(field, 2), 2, 0x0a, 0x00];
    // Two kinds, the same kind twice, an unknown kind, a kind of the wrong wire type.
    for (what, body) in [
        ("two kinds", [one(1), one(3)].concat()),
        ("one kind twice", [one(2), one(2)].concat()),
        ("kind 4", one(4).to_vec()),
        ("kind as a varint", vec![key(1, 0), 1]),
    ] {
        let mut m = plain.clone();
        m.push(key(8, 2));
        m.push(u8::try_from(body.len()).unwrap());
        m.extend_from_slice(&body);
        assert!(!agree(&m, what), "{what}: accepted");
    }
    // A kind whose non-optional field is written out empty: prost reads it, but an encoder
    // leaves an empty `bytes` field out. Nothing after the wire form would refuse it (the
    // TDX quote is checked later, by the trust policy), so the decoder must.
    let tdx = [key(2, 2), 5, key(1, 2), 0, key(2, 2), 1, 0x41];
    let mut m = plain.clone();
    m.extend_from_slice(&[key(8, 2), u8::try_from(tdx.len()).unwrap()]);
    m.extend_from_slice(&tdx);
    assert!(!agree(&m, "empty quote written out"));
    assert_eq!(
        QuoteEvidence::decode(&m).unwrap_err(),
        EvidenceError::NonCanonical
    );
    // An empty report (no kind) is canonical protobuf, refused for what it says.
    let mut m = plain.clone();
    m.extend_from_slice(&[key(8, 2), 0]);
    assert!(!agree(&m, "empty platform"));
    assert_eq!(
        QuoteEvidence::decode(&m).unwrap_err(),
        EvidenceError::EmptyPlatform
    );
}

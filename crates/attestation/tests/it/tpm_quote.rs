//! `tpm-quote` validation: evidence in the real TPM wire format, signed in software, then
//! tampered with. Every security check has a test here that fails when the check is removed.

use crate::common::*;
use asterism_attestation::tpm::structures::{
    AsymScheme, ObjectAttributes, PcrSelection, PublicParams, alg,
};
use asterism_attestation::tpm::{
    AkFingerprint, AkTrust, MAX_EVIDENCE_SIZE, PlatformCa, TpmQuoteEvidence, TpmQuoteValidator,
    TpmtSignature,
};
use asterism_attestation::{
    ExpectedPcr, Issuer, Measurements, ReportData, Role, ValidationError, Validator,
};
use asterism_soft_tpm::{SoftAk, SoftQuote, SoftTpm};
use prost::Message;
use sha2::{Digest, Sha256};
use std::time::{Duration, SystemTime};
use tracing::Level;

fn rd() -> ReportData {
    ReportData::atls(Role::Server, &[0x11; 32])
}

/// A booted software TPM with an ECDSA AK, and a validator pinning that AK and enforcing
/// the TPM's current values.
fn setup() -> (SoftTpm, TpmQuoteValidator) {
    setup_with(ecdsa_ak())
}

fn setup_with(ak: SoftAk) -> (SoftTpm, TpmQuoteValidator) {
    let tpm = booted_tpm(ak);
    let v = TpmQuoteValidator::new(
        AkTrust::pinned([tpm.ak().fingerprint()]),
        measurements_of(&tpm).into_provider(),
    );
    (tpm, v)
}

fn policy_err(r: Result<impl std::fmt::Debug, ValidationError>, needle: &str) {
    match r {
        Err(ValidationError::Policy(m)) => assert!(m.contains(needle), "{m}"),
        other => panic!("want policy error containing {needle:?}, got {other:?}"),
    }
}

fn malformed_err(r: Result<impl std::fmt::Debug, ValidationError>, needle: &str) {
    match r {
        Err(ValidationError::Malformed(m)) => assert!(m.contains(needle), "{m}"),
        other => panic!("want malformed error containing {needle:?}, got {other:?}"),
    }
}

// ---------------------------------------------------------------- accepted evidence

#[test]
fn accepts_an_ecdsa_quote_from_a_pinned_ak() {
    let (tpm, v) = setup();
    let ev = tpm.issue(&rd()).unwrap();
    let ok = v.validate(&ev, &rd()).unwrap();
    assert_eq!(ok.variant(), "tpm-quote");
    assert_eq!(v.variant(), "tpm-quote");
    assert_eq!(
        ok.identity(),
        hex::encode(Sha256::digest(tpm.ak().public_area_bytes()))
    );
    assert_eq!(ok.identity(), tpm.ak().fingerprint().to_string());
    assert_eq!(ok.measurements().len(), 24);
    assert_eq!(ok.measurements()[4].index, 4);
    assert_eq!(ok.measurements()[4].value, tpm.pcr(idx(4)).to_vec());
    assert!(ok.warnings().is_empty());
}

#[test]
fn accepts_an_rsa_quote_from_a_pinned_ak() {
    let (tpm, v) = setup_with(rsa_ak());
    let ev = tpm.issue(&rd()).unwrap();
    let ok = v.validate(&ev, &rd()).unwrap();
    assert_eq!(ok.identity(), tpm.ak().fingerprint().to_string());
}

#[test]
fn accepts_a_quote_over_a_subset_of_pcrs() {
    let (mut tpm, v) = setup();
    tpm.set_selection([4u8, 8, 9, 11, 12, 13, 14, 15].map(idx));
    let ok = v.validate(&tpm.issue(&rd()).unwrap(), &rd()).unwrap();
    assert_eq!(ok.measurements().len(), 8);
}

#[test]
fn accepts_ecdsa_r_and_s_shorter_than_32_bytes() {
    // A TPM2B_ECC_PARAMETER may drop leading zero bytes; find a signature whose r starts
    // with a zero byte (1 in 256) and strip it.
    let (tpm, v) = setup();
    let q = tpm.quote(&rd());
    for _ in 0..5000 {
        let mut wire = q.sign(tpm.ak()).unwrap();
        let sig = TpmtSignature::parse(&wire.signature).unwrap();
        let TpmtSignature::Ecdsa { hash, r, s } = sig else {
            unreachable!()
        };
        if r[0] != 0 {
            continue;
        }
        wire.signature = TpmtSignature::Ecdsa {
            hash,
            r: r[1..].to_vec(),
            s,
        }
        .to_bytes()
        .unwrap();
        v.validate(&wire.encode_to_vec(), &rd()).unwrap();
        return;
    }
    panic!("no signature with a leading zero byte in r");
}

#[test]
fn accepts_an_ak_certified_by_the_platform_ca() {
    let ca = TestCa::new("platform root");
    let mut tpm = booted_tpm(ecdsa_ak());
    tpm.set_ak_cert_chain(vec![ca.certify(tpm.ak())]);
    let v = TpmQuoteValidator::new(
        AkTrust::platform_ca(PlatformCa::from_der([&ca.cert_der]).unwrap()),
        measurements_of(&tpm).into_provider(),
    );
    v.validate(&tpm.issue(&rd()).unwrap(), &rd()).unwrap();
}

#[test]
fn accepts_an_rsa_ak_certified_through_an_intermediate_with_the_aik_eku() {
    let root = TestCa::new("platform root");
    let inter = root.intermediate("platform intermediate");
    let mut tpm = booted_tpm(rsa_ak());
    let leaf = inter.certify_with(tpm.ak(), |p| p.extended_key_usages = vec![aik_eku()]);
    tpm.set_ak_cert_chain(vec![leaf, inter.cert_der.clone()]);
    let pem = format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
        base64_lines(&root.cert_der)
    );
    let v = TpmQuoteValidator::new(
        AkTrust::platform_ca(PlatformCa::from_pem(pem.as_bytes()).unwrap()),
        measurements_of(&tpm).into_provider(),
    );
    v.validate(&tpm.issue(&rd()).unwrap(), &rd()).unwrap();
}

fn base64_lines(der: &[u8]) -> String {
    // Minimal standard base64 so the test needs no extra crate.
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in der.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out.as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn insecure_any_ak_accepts_and_warns_on_every_validation() {
    let tpm = booted_tpm(ecdsa_ak());
    let ((), logs) = capture_logs(|| {
        let v = TpmQuoteValidator::new(
            AkTrust::insecure_any_ak(),
            measurements_of(&tpm).into_provider(),
        );
        for _ in 0..3 {
            let ok = v.validate(&tpm.issue(&rd()).unwrap(), &rd()).unwrap();
            assert!(ok.warnings().iter().any(|w| w.contains("insecure_any_ak")));
        }
    });
    assert_eq!(
        logs.count(
            Level::WARN,
            "accepting an attestation key nobody vouched for"
        ),
        3,
        "{:?}",
        logs.all()
    );
}

// ---------------------------------------------------------------- tampering

#[test]
fn rejects_tampered_quote_bytes() {
    let (tpm, v) = setup();
    let mut wire = tpm.quote(&rd()).sign(tpm.ak()).unwrap();
    // clockInfo.clock, last byte: 4 + 2 + (2 + 34) + (2 + 32) + 7
    let i = 4 + 2 + 2 + 34 + 2 + 32 + 7;
    wire.attest[i] ^= 1;
    assert!(matches!(
        v.validate(&wire.encode_to_vec(), &rd()),
        Err(ValidationError::BadSignature(_))
    ));
}

#[test]
fn rejects_a_tampered_signature() {
    for ak in [ecdsa_ak(), rsa_ak()] {
        let (tpm, v) = setup_with(ak);
        let mut wire = tpm.quote(&rd()).sign(tpm.ak()).unwrap();
        let last = wire.signature.len() - 1;
        wire.signature[last] ^= 1;
        assert!(matches!(
            v.validate(&wire.encode_to_vec(), &rd()),
            Err(ValidationError::BadSignature(_))
        ));
    }
}

#[test]
fn rejects_a_signature_with_another_hash_or_scheme() {
    let (tpm, v) = setup();
    let mut wire = tpm.quote(&rd()).sign(tpm.ak()).unwrap();
    let TpmtSignature::Ecdsa { r, s, .. } = TpmtSignature::parse(&wire.signature).unwrap() else {
        unreachable!()
    };
    wire.signature = TpmtSignature::Ecdsa {
        hash: alg::SHA384,
        r,
        s,
    }
    .to_bytes()
    .unwrap();
    assert!(matches!(
        v.validate(&wire.encode_to_vec(), &rd()),
        Err(ValidationError::BadSignature(m)) if m.contains("not SHA-256")
    ));
    wire.signature = TpmtSignature::RsaSsa {
        hash: alg::SHA256,
        sig: vec![1; 256],
    }
    .to_bytes()
    .unwrap();
    assert!(matches!(
        v.validate(&wire.encode_to_vec(), &rd()),
        Err(ValidationError::BadSignature(m)) if m.contains("does not match the AK")
    ));
}

#[test]
fn rejects_a_pcr_value_that_does_not_match_the_signed_digest() {
    let (mut tpm, v) = setup();
    let mut q = tpm.quote(&rd());
    let signed = q.sign(tpm.ak()).unwrap();
    // The genuine values first, so the validator's digest memo holds them.
    v.validate(&signed.encode_to_vec(), &rd()).unwrap();
    // The values about to be passed off, genuinely quoted once, so the memo holds their
    // digest as well: a memo keyed by anything less than the exact values would now pass
    // them under the first quote's signature.
    tpm.set_pcr(idx(5), [0x55; 32]);
    v.validate(&tpm.quote(&rd()).evidence(tpm.ak()).unwrap(), &rd())
        .unwrap();
    // Same signed quote, but PCR 5 (not in the expected measurements) reported differently.
    q.pcrs.insert(idx(5), [0x55; 32]);
    let mut wire = q.sign(tpm.ak()).unwrap();
    wire.attest = signed.attest;
    wire.signature = signed.signature;
    policy_err(
        v.validate(&wire.encode_to_vec(), &rd()),
        "do not hash to the signed pcrDigest",
    );
}

#[test]
fn rejects_supplied_pcrs_beyond_the_signed_selection() {
    let (mut tpm, v) = setup();
    tpm.set_selection([4u8, 8, 9, 11, 12, 13, 15].map(idx));
    let mut q = tpm.quote(&rd());
    q.pcrs.insert(idx(5), [0u8; 32]); // not signed, digest still matches the signed ones
    policy_err(
        v.validate(&q.evidence(tpm.ak()).unwrap(), &rd()),
        "do not match the signed selection",
    );
}

#[test]
fn rejects_supplied_pcrs_missing_from_the_signed_selection() {
    let (tpm, v) = setup();
    let mut q = tpm.quote(&rd());
    q.pcrs.remove(&idx(0));
    policy_err(
        v.validate(&q.evidence(tpm.ak()).unwrap(), &rd()),
        "do not match the signed selection",
    );
}

#[test]
fn rejects_a_sha1_only_bank() {
    let (tpm, v) = setup();
    let mut q = tpm.quote(&rd());
    q.attest.quote.pcr_select = vec![PcrSelection::new(alg::SHA1, q.pcrs.keys().copied())];
    policy_err(
        v.validate(&q.evidence(tpm.ak()).unwrap(), &rd()),
        "exactly the SHA-256 bank",
    );
}

#[test]
fn rejects_a_selection_with_a_sha1_bank_beside_sha256() {
    let (tpm, v) = setup();
    let mut q = tpm.quote(&rd());
    let sel = q.attest.quote.pcr_select[0].clone();
    q.attest.quote.pcr_select = vec![PcrSelection::new(alg::SHA1, [idx(0)]), sel];
    policy_err(
        v.validate(&q.evidence(tpm.ak()).unwrap(), &rd()),
        "exactly the SHA-256 bank",
    );
}

#[test]
fn rejects_an_empty_selection() {
    let (mut tpm, v) = setup();
    tpm.set_selection([]);
    policy_err(
        v.validate(&tpm.issue(&rd()).unwrap(), &rd()),
        "selects no PCRs",
    );
}

#[test]
fn rejects_evidence_bound_to_another_session() {
    let (tpm, v) = setup();
    let ev = tpm
        .issue(&ReportData::atls(Role::Server, &[0x22; 32]))
        .unwrap();
    assert_eq!(
        v.validate(&ev, &rd()).unwrap_err(),
        ValidationError::BindingMismatch
    );
    // Same exporter, other role or other purpose: also another binding.
    let ev = tpm
        .issue(&ReportData::atls(Role::Client, &[0x11; 32]))
        .unwrap();
    assert_eq!(
        v.validate(&ev, &rd()).unwrap_err(),
        ValidationError::BindingMismatch
    );
    let ev = tpm.issue(&ReportData::verify(&[0x11; 32])).unwrap();
    assert_eq!(
        v.validate(&ev, &rd()).unwrap_err(),
        ValidationError::BindingMismatch
    );
}

#[test]
fn rejects_qualifying_data_that_only_starts_with_the_report_data() {
    let (tpm, v) = setup();
    let mut q = tpm.quote(&rd());
    q.attest.extra_data.push(0);
    assert_eq!(
        v.validate(&q.evidence(tpm.ak()).unwrap(), &rd())
            .unwrap_err(),
        ValidationError::BindingMismatch
    );
}

// ---------------------------------------------------------------- measurements

#[test]
fn rejects_an_enforced_pcr_mismatch_naming_index_expected_and_observed() {
    let (mut tpm, v) = setup();
    let expected = tpm.pcr(idx(9));
    tpm.extend_pcr(idx(9), &[0xee; 32]);
    let observed = tpm.pcr(idx(9));
    let err = v.validate(&tpm.issue(&rd()).unwrap(), &rd()).unwrap_err();
    assert_eq!(
        err,
        ValidationError::Measurement {
            index: 9,
            expected: hex::encode(expected),
            observed: hex::encode(observed),
        }
    );
    let msg = err.to_string();
    assert!(
        msg.contains("index 9") && msg.contains(&hex::encode(observed)),
        "{msg}"
    );
}

#[test]
fn a_measurement_refusal_still_returns_the_proven_pcr_values() {
    let (mut tpm, v) = setup();
    tpm.extend_pcr(idx(9), &[0xee; 32]);
    let explained = v.validate_with_pcrs(&tpm.issue(&rd()).unwrap(), &rd());
    assert!(matches!(
        explained.result,
        Err(ValidationError::Measurement { index: 9, .. })
    ));
    let pcrs = explained
        .pcrs
        .expect("the quote was verified up to the measurements");
    let nine = pcrs.iter().find(|m| m.index == 9).unwrap();
    assert_eq!(nine.value, tpm.pcr(idx(9)).to_vec());
    assert_eq!(pcrs.len(), 24, "every PCR of the quote");
}

#[test]
fn no_pcr_values_are_returned_from_a_quote_that_is_not_proven() {
    let (tpm, v) = setup();
    // Bound to another nonce: signed by the trusted AK, but not for this call.
    let other = tpm.issue(&ReportData::verify(&[0x22; 32])).unwrap();
    let explained = v.validate_with_pcrs(&other, &rd());
    assert_eq!(
        explained.result.unwrap_err(),
        ValidationError::BindingMismatch
    );
    assert!(explained.pcrs.is_none());
    // Signature broken.
    let mut wire = tpm.quote(&rd()).sign(tpm.ak()).unwrap();
    let last = wire.signature.len() - 1;
    wire.signature[last] ^= 1;
    let explained = v.validate_with_pcrs(&wire.encode_to_vec(), &rd());
    assert!(matches!(
        explained.result,
        Err(ValidationError::BadSignature(_))
    ));
    assert!(explained.pcrs.is_none());
}

#[test]
fn rejects_an_enforced_pcr_the_quote_does_not_cover() {
    let (mut tpm, v) = setup();
    tpm.set_selection([4u8, 8, 9, 11, 12, 13].map(idx)); // 15 missing
    assert_eq!(
        v.validate(&tpm.issue(&rd()).unwrap(), &rd()).unwrap_err(),
        ValidationError::Measurement {
            index: 15,
            expected: hex::encode([0u8; 32]),
            observed: "missing".into(),
        }
    );
}

#[test]
fn accepts_a_warn_only_mismatch_and_returns_a_warning() {
    let (mut tpm, v) = setup();
    tpm.extend_pcr(idx(14), &[0x14; 32]);
    let (ok, logs) = capture_logs(|| v.validate(&tpm.issue(&rd()).unwrap(), &rd()).unwrap());
    assert_eq!(ok.warnings().len(), 1);
    assert!(ok.warnings()[0].contains("index 14"), "{:?}", ok.warnings());
    assert!(ok.warnings()[0].contains(&hex::encode(tpm.pcr(idx(14)))));
    assert_eq!(logs.count(Level::WARN, "warn-only measurement mismatch"), 1);
}

#[test]
fn measurements_are_read_from_the_provider_on_every_validation() {
    struct Flip(std::sync::Mutex<Vec<std::sync::Arc<Measurements>>>);
    impl asterism_attestation::MeasurementsProvider for Flip {
        fn current(&self) -> std::sync::Arc<Measurements> {
            self.0.lock().unwrap().remove(0)
        }
    }
    let tpm = booted_tpm(ecdsa_ak());
    let good = measurements_of(&tpm);
    let bad = Measurements::new([(idx(4), ExpectedPcr::enforce([0xbb; 32]))]).unwrap();
    let v = TpmQuoteValidator::new(
        AkTrust::pinned([tpm.ak().fingerprint()]),
        std::sync::Arc::new(Flip(std::sync::Mutex::new(vec![good.into(), bad.into()]))),
    );
    let ev = tpm.issue(&rd()).unwrap();
    v.validate(&ev, &rd()).unwrap();
    assert!(matches!(
        v.validate(&ev, &rd()),
        Err(ValidationError::Measurement { index: 4, .. })
    ));
}

// ---------------------------------------------------------------- AK trust

#[test]
fn rejects_an_ak_that_is_not_pinned() {
    let (_, v) = setup();
    let stranger = booted_tpm(ecdsa_ak());
    assert!(matches!(
        v.validate(&stranger.issue(&rd()).unwrap(), &rd()),
        Err(ValidationError::UntrustedKey(m)) if m.contains("not pinned")
    ));
}

#[test]
fn the_same_key_in_another_public_area_is_refused_not_given_a_new_identity() {
    // A platform CA certifies the key alone; whoever presents the evidence can change the
    // rest of the public area. Each variant is refused by the AK policy, so one key never
    // gets a second identity (a fresh rate-limit bucket, a second member record).
    let ca = TestCa::new("platform root");
    let ak = ecdsa_ak();
    let identity = ak.fingerprint().to_string();
    let mut tpm = booted_tpm(ak);
    tpm.set_ak_cert_chain(vec![ca.certify(tpm.ak())]);
    let v = ca_validator(&ca, &tpm);
    let ok = v.validate(&tpm.issue(&rd()).unwrap(), &rd()).unwrap();
    assert_eq!(ok.identity(), identity);

    type Edit = fn(&mut asterism_attestation::tpm::TpmtPublic);
    let variants: [(&str, Edit); 4] = [
        ("authPolicy", |p| p.auth_policy = vec![0xab; 32]),
        ("not the AK template's", |p| {
            p.attributes.0 &= !ObjectAttributes::USER_WITH_AUTH
        }),
        ("not the AK template's", |p| {
            p.attributes.0 &= !ObjectAttributes::NO_DA
        }),
        ("not the AK template's", |p| {
            p.attributes.0 |= ObjectAttributes::ST_CLEAR
        }),
    ];
    for (needle, edit) in variants {
        let ak = ecdsa_ak();
        let mut tpm = booted_tpm(ak.with_public(edit).unwrap());
        tpm.set_ak_cert_chain(vec![ca.certify(tpm.ak())]);
        let v = ca_validator(&ca, &tpm);
        policy_err(v.validate(&tpm.issue(&rd()).unwrap(), &rd()), needle);
    }
}

#[test]
fn a_shorter_encoding_of_the_same_ecc_point_is_refused() {
    // A P-256 key whose x coordinate starts with a zero byte, presented without it.
    let ak = std::iter::repeat_with(ecdsa_ak)
        .take(5000)
        .find(|ak| matches!(&ak.public_area().params, PublicParams::Ecc { x, .. } if x[0] == 0))
        .unwrap();
    let short = ak
        .with_public(|p| {
            if let PublicParams::Ecc { x, .. } = &mut p.params {
                x.remove(0);
            }
        })
        .unwrap();
    let (tpm, v) = setup_with(short);
    policy_err(
        v.validate(&tpm.issue(&rd()).unwrap(), &rd()),
        "32 each expected",
    );
}

#[test]
fn an_rsa_ak_with_the_default_exponent_spelt_out_is_refused() {
    let ak = rsa_ak()
        .with_public(|p| {
            if let PublicParams::Rsa { exponent, .. } = &mut p.params {
                *exponent = 65537;
            }
        })
        .unwrap();
    let (tpm, v) = setup_with(ak);
    policy_err(
        v.validate(&tpm.issue(&rd()).unwrap(), &rd()),
        "not the default",
    );
}

#[test]
fn the_identity_is_the_hash_of_the_one_accepted_public_area() {
    // What provisioning prints and operators pin: SHA-256 of ak_public as the TPM sends it.
    for ak in [ecdsa_ak(), rsa_ak()] {
        let expected = AkFingerprint::of_public_area(ak.public_area_bytes()).to_string();
        let (tpm, v) = setup_with(ak);
        let ok = v.validate(&tpm.issue(&rd()).unwrap(), &rd()).unwrap();
        assert_eq!(ok.identity(), expected);
    }
}

fn ca_validator(ca: &TestCa, tpm: &SoftTpm) -> TpmQuoteValidator {
    TpmQuoteValidator::new(
        AkTrust::platform_ca(PlatformCa::from_der([&ca.cert_der]).unwrap()),
        measurements_of(tpm).into_provider(),
    )
}

#[test]
fn rejects_an_ak_not_chained_to_the_platform_ca() {
    let ca = TestCa::new("platform root");
    let rogue = TestCa::new("platform root"); // same name, other key
    let mut tpm = booted_tpm(ecdsa_ak());
    tpm.set_ak_cert_chain(vec![rogue.certify(tpm.ak())]);
    let v = ca_validator(&ca, &tpm);
    assert!(matches!(
        v.validate(&tpm.issue(&rd()).unwrap(), &rd()),
        Err(ValidationError::UntrustedKey(m)) if m.contains("not trusted")
    ));
    // A rogue intermediate does not help either.
    let inter = rogue.intermediate("intermediate");
    tpm.set_ak_cert_chain(vec![inter.certify(tpm.ak()), inter.cert_der.clone()]);
    assert!(matches!(
        v.validate(&tpm.issue(&rd()).unwrap(), &rd()),
        Err(ValidationError::UntrustedKey(_))
    ));
}

#[test]
fn rejects_a_certificate_for_another_key() {
    let ca = TestCa::new("platform root");
    let mut tpm = booted_tpm(ecdsa_ak());
    let other = ecdsa_ak();
    tpm.set_ak_cert_chain(vec![ca.certify(&other)]);
    let v = ca_validator(&ca, &tpm);
    assert!(matches!(
        v.validate(&tpm.issue(&rd()).unwrap(), &rd()),
        Err(ValidationError::UntrustedKey(m)) if m.contains("not the key in ak_public")
    ));
}

#[test]
fn rejects_platform_ca_trust_without_a_chain() {
    let ca = TestCa::new("platform root");
    let tpm = booted_tpm(ecdsa_ak());
    let v = ca_validator(&ca, &tpm);
    assert!(matches!(
        v.validate(&tpm.issue(&rd()).unwrap(), &rd()),
        Err(ValidationError::UntrustedKey(m)) if m.contains("no AK certificate chain")
    ));
}

#[test]
fn rejects_an_expired_ak_certificate() {
    let ca = TestCa::new("platform root");
    let mut tpm = booted_tpm(ecdsa_ak());
    tpm.set_ak_cert_chain(vec![ca.certify(tpm.ak())]);
    let v = ca_validator(&ca, &tpm)
        .with_clock(|| SystemTime::UNIX_EPOCH + Duration::from_secs(5000 * 365 * 86400));
    assert!(matches!(
        v.validate(&tpm.issue(&rd()).unwrap(), &rd()),
        Err(ValidationError::UntrustedKey(m)) if m.contains("not trusted")
    ));
}

#[test]
fn rejects_an_ak_certificate_for_another_purpose() {
    let ca = TestCa::new("platform root");
    let mut tpm = booted_tpm(ecdsa_ak());
    let leaf = ca.certify_with(tpm.ak(), |p| {
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth]
    });
    tpm.set_ak_cert_chain(vec![leaf]);
    let v = ca_validator(&ca, &tpm);
    assert!(matches!(
        v.validate(&tpm.issue(&rd()).unwrap(), &rd()),
        Err(ValidationError::UntrustedKey(_))
    ));
}

#[test]
fn rejects_a_ca_certificate_as_the_ak_certificate() {
    let ca = TestCa::new("platform root");
    let mut tpm = booted_tpm(ecdsa_ak());
    let leaf = ca.certify_with(tpm.ak(), |p| {
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained)
    });
    tpm.set_ak_cert_chain(vec![leaf]);
    let v = ca_validator(&ca, &tpm);
    assert!(matches!(
        v.validate(&tpm.issue(&rd()).unwrap(), &rd()),
        Err(ValidationError::UntrustedKey(_))
    ));
}

// ---------------------------------------------------------------- AK policy

/// Evidence from an AK whose public area `edit` changed, trusted by pinning (so only the
/// AK policy can reject it).
fn with_ak(
    edit: impl FnOnce(&mut asterism_attestation::tpm::TpmtPublic),
) -> Result<(), ValidationError> {
    let ak = ecdsa_ak().with_public(edit).unwrap();
    let (tpm, v) = setup_with(ak);
    v.validate(&tpm.issue(&rd()).unwrap(), &rd()).map(|_| ())
}

#[test]
fn rejects_an_ak_without_the_restricted_attribute() {
    policy_err(
        with_ak(|p| p.attributes.0 &= !ObjectAttributes::RESTRICTED),
        "lack restricted",
    );
}

#[test]
fn rejects_an_ak_without_sign_fixed_tpm_or_fixed_parent() {
    policy_err(
        with_ak(|p| p.attributes.0 &= !ObjectAttributes::SIGN),
        "lack sign",
    );
    policy_err(
        with_ak(|p| p.attributes.0 &= !ObjectAttributes::FIXED_TPM),
        "lack fixedTPM",
    );
    policy_err(
        with_ak(|p| p.attributes.0 &= !ObjectAttributes::FIXED_PARENT),
        "lack fixedParent",
    );
}

#[test]
fn rejects_an_ak_that_can_decrypt() {
    policy_err(
        with_ak(|p| p.attributes.0 |= ObjectAttributes::DECRYPT),
        "decrypt set",
    );
}

#[test]
fn rejects_an_ak_with_another_name_alg_scheme_or_curve() {
    policy_err(with_ak(|p| p.name_alg = alg::SHA1), "nameAlg");
    policy_err(
        with_ak(|p| {
            if let PublicParams::Ecc { scheme, .. } = &mut p.params {
                *scheme = AsymScheme::Hashed {
                    scheme: alg::ECDSA,
                    hash: alg::SHA1,
                };
            }
        }),
        "not ECDSA-SHA256",
    );
    policy_err(
        with_ak(|p| {
            if let PublicParams::Ecc { scheme, .. } = &mut p.params {
                *scheme = AsymScheme::Null;
            }
        }),
        "not ECDSA-SHA256",
    );
    policy_err(
        with_ak(|p| {
            if let PublicParams::Ecc { curve, .. } = &mut p.params {
                *curve = 0x0004; // P-384
            }
        }),
        "not P-256",
    );
}

#[test]
fn rejects_an_rsa_ak_shorter_than_2048_bits_or_with_another_scheme() {
    let ak = rsa_ak()
        .with_public(|p| {
            if let PublicParams::Rsa { key_bits, .. } = &mut p.params {
                *key_bits = 1024;
            }
        })
        .unwrap();
    let (tpm, v) = setup_with(ak);
    policy_err(
        v.validate(&tpm.issue(&rd()).unwrap(), &rd()),
        "keyBits 1024",
    );
    let ak = rsa_ak()
        .with_public(|p| {
            if let PublicParams::Rsa { scheme, .. } = &mut p.params {
                *scheme = AsymScheme::Hashed {
                    scheme: alg::RSAPSS,
                    hash: alg::SHA256,
                };
            }
        })
        .unwrap();
    let (tpm, v) = setup_with(ak);
    policy_err(
        v.validate(&tpm.issue(&rd()).unwrap(), &rd()),
        "not RSASSA-SHA256",
    );
}

// ---------------------------------------------------------------- evidence decoding

#[test]
fn rejects_an_unknown_evidence_version() {
    let (tpm, v) = setup();
    let mut wire = tpm.quote(&rd()).sign(tpm.ak()).unwrap();
    wire.version = 2;
    malformed_err(v.validate(&wire.encode_to_vec(), &rd()), "version 2");
    wire.version = 0;
    malformed_err(v.validate(&wire.encode_to_vec(), &rd()), "version 0");
}

#[test]
fn rejects_oversized_evidence_before_decoding() {
    let (tpm, v) = setup();
    let mut q = tpm.quote(&rd());
    q.event_log = Some(vec![0; MAX_EVIDENCE_SIZE]);
    malformed_err(
        v.validate(&q.evidence(tpm.ak()).unwrap(), &rd()),
        "at most 65536",
    );
    // Garbage of that size is refused by size too, not by the protobuf decoder.
    malformed_err(
        v.validate(&vec![0xff; MAX_EVIDENCE_SIZE + 1], &rd()),
        "at most 65536",
    );
}

#[test]
fn rejects_trailing_garbage_and_unknown_fields_in_evidence() {
    let (tpm, v) = setup();
    let ev = tpm.issue(&rd()).unwrap();
    let mut bad = ev.clone();
    bad.push(0xff);
    malformed_err(v.validate(&bad, &rd()), "");
    // A well-formed unknown field (tag 15, varint 1) is still refused.
    let mut bad = ev.clone();
    bad.extend_from_slice(&[15 << 3, 1]);
    malformed_err(v.validate(&bad, &rd()), "not canonically encoded");
    // A repeated scalar field (version again) is refused.
    let mut bad = ev.clone();
    bad.extend_from_slice(&[1 << 3, 1]);
    malformed_err(v.validate(&bad, &rd()), "not canonically encoded");
    malformed_err(v.validate(&ev[..ev.len() - 1], &rd()), "");
    malformed_err(v.validate(&[], &rd()), "version 0");
}

#[test]
fn rejects_evidence_with_fields_out_of_order() {
    // The same fields, version last instead of first: valid protobuf, same length, but
    // not the one canonical encoding.
    let (tpm, v) = setup();
    let ev = tpm.issue(&rd()).unwrap();
    assert_eq!(&ev[..2], &[1 << 3, 1]);
    let mut reordered = ev[2..].to_vec();
    reordered.extend_from_slice(&ev[..2]);
    assert_eq!(
        TpmQuoteEvidence::decode(reordered.as_slice()).unwrap(),
        TpmQuoteEvidence::decode(ev.as_slice()).unwrap()
    );
    malformed_err(v.validate(&reordered, &rd()), "not canonically encoded");
}

#[test]
fn rejects_trailing_garbage_in_each_tpm_structure() {
    let (tpm, v) = setup();
    let wire = tpm.quote(&rd()).sign(tpm.ak()).unwrap();
    let mut w = wire.clone();
    w.attest.push(0);
    malformed_err(
        v.validate(&w.encode_to_vec(), &rd()),
        "TPMS_ATTEST: 1 trailing bytes",
    );
    let mut w = wire.clone();
    w.signature.push(0);
    malformed_err(
        v.validate(&w.encode_to_vec(), &rd()),
        "TPMT_SIGNATURE: 1 trailing bytes",
    );
    let mut w = wire.clone();
    w.ak_public.push(0);
    malformed_err(
        v.validate(&w.encode_to_vec(), &rd()),
        "TPMT_PUBLIC: 1 trailing bytes",
    );
}

#[test]
fn rejects_truncation_of_each_tpm_structure_at_every_length() {
    let (tpm, v) = setup();
    let wire = tpm.quote(&rd()).sign(tpm.ak()).unwrap();
    for n in 0..wire.attest.len() {
        let mut w = wire.clone();
        w.attest.truncate(n);
        malformed_err(v.validate(&w.encode_to_vec(), &rd()), "TPMS_ATTEST");
    }
    for n in 0..wire.signature.len() {
        let mut w = wire.clone();
        w.signature.truncate(n);
        malformed_err(v.validate(&w.encode_to_vec(), &rd()), "TPMT_SIGNATURE");
    }
    for n in 0..wire.ak_public.len() {
        let mut w = wire.clone();
        w.ak_public.truncate(n);
        malformed_err(v.validate(&w.encode_to_vec(), &rd()), "TPMT_PUBLIC");
    }
}

#[test]
fn rejects_oversized_fields_in_each_tpm_structure() {
    let (tpm, v) = setup();
    let q = tpm.quote(&rd());
    let wire = q.sign(tpm.ak()).unwrap();

    // TPMS_ATTEST.extraData: size 67 > sizeof(TPMT_HA) = 66.
    let mut w = wire.clone();
    let at = 4 + 2 + 2 + 34; // size field of extraData
    w.attest[at..at + 2].copy_from_slice(&67u16.to_be_bytes());
    malformed_err(
        v.validate(&w.encode_to_vec(), &rd()),
        "extraData is 67, at most 66",
    );
    // TPMS_ATTEST.pcrSelect.count: 17 banks > 16.
    let mut w = wire.clone();
    let at = 4 + 2 + 2 + 34 + 2 + 32 + 17 + 8;
    w.attest[at..at + 4].copy_from_slice(&17u32.to_be_bytes());
    malformed_err(
        v.validate(&w.encode_to_vec(), &rd()),
        "pcrSelect.count is 17",
    );
    // TPMT_SIGNATURE.signatureR: 67 > 66.
    let mut w = wire.clone();
    w.signature[4..6].copy_from_slice(&67u16.to_be_bytes());
    malformed_err(
        v.validate(&w.encode_to_vec(), &rd()),
        "signatureR is 67, at most 66",
    );
    // TPMT_PUBLIC.authPolicy: 65 > 64.
    let mut w = wire.clone();
    w.ak_public[8..10].copy_from_slice(&65u16.to_be_bytes());
    malformed_err(
        v.validate(&w.encode_to_vec(), &rd()),
        "authPolicy is 65, at most 64",
    );
    // RSA modulus: 1025 > 1024.
    let (tpm, v) = setup_with(rsa_ak());
    let mut w = tpm.quote(&rd()).sign(tpm.ak()).unwrap();
    let at = w.ak_public.len() - 256 - 2;
    w.ak_public[at..at + 2].copy_from_slice(&1025u16.to_be_bytes());
    malformed_err(
        v.validate(&w.encode_to_vec(), &rd()),
        "unique.rsa is 1025, at most 1024",
    );
}

#[test]
fn rejects_an_attest_that_is_not_a_quote() {
    let (tpm, v) = setup();
    let wire = tpm.quote(&rd()).sign(tpm.ak()).unwrap();
    let mut w = wire.clone();
    w.attest[0] ^= 1;
    malformed_err(v.validate(&w.encode_to_vec(), &rd()), "magic");
    let mut w = wire.clone();
    w.attest[5] = 0x17; // TPM_ST_ATTEST_CERTIFY
    malformed_err(v.validate(&w.encode_to_vec(), &rd()), "TPM_ST_ATTEST_QUOTE");
}

#[test]
fn rejects_malformed_pcr_values() {
    let (tpm, v) = setup();
    let wire = tpm.quote(&rd()).sign(tpm.ak()).unwrap();
    let mut w = wire.clone();
    w.pcrs.swap(3, 4);
    malformed_err(
        v.validate(&w.encode_to_vec(), &rd()),
        "out of order or repeated",
    );
    let mut w = wire.clone();
    w.pcrs[4].index = 3;
    malformed_err(
        v.validate(&w.encode_to_vec(), &rd()),
        "out of order or repeated",
    );
    let mut w = wire.clone();
    w.pcrs[23].index = 24;
    malformed_err(v.validate(&w.encode_to_vec(), &rd()), "PCR index 24");
    let mut w = wire.clone();
    w.pcrs[4].value.push(0);
    malformed_err(v.validate(&w.encode_to_vec(), &rd()), "33 bytes, want 32");
    let mut w = wire.clone();
    w.pcrs[4].value.pop();
    malformed_err(v.validate(&w.encode_to_vec(), &rd()), "31 bytes, want 32");
}

#[test]
fn rejects_a_long_certificate_chain() {
    let (tpm, v) = setup();
    let mut w = tpm.quote(&rd()).sign(tpm.ak()).unwrap();
    w.ak_cert_chain = vec![vec![0x30]; 5];
    malformed_err(v.validate(&w.encode_to_vec(), &rd()), "5 certificates");
}

#[test]
fn fingerprints_parse_from_hex() {
    let ak = ecdsa_ak();
    let fp = ak.fingerprint();
    assert_eq!(AkFingerprint::from_hex(&fp.to_string()).unwrap(), fp);
    assert!(AkFingerprint::from_hex("00").is_err());
    assert!(AkFingerprint::from_hex(&"zz".repeat(32)).is_err());
}

#[test]
fn soft_quote_builder_round_trips_through_the_decoder() {
    let tpm = booted_tpm(ecdsa_ak());
    let q: SoftQuote = tpm.quote(&rd());
    let wire = q.sign(tpm.ak()).unwrap();
    let bytes = wire.encode_to_vec();
    assert_eq!(TpmQuoteEvidence::decode(bytes.as_slice()).unwrap(), wire);
    let decoded = asterism_attestation::tpm::QuoteEvidence::decode(&bytes).unwrap();
    assert_eq!(decoded.attest, q.attest);
    assert_eq!(decoded.pcrs, q.pcrs);
}

//! Intel TDX DCAP quote verification on real quotes (v4, and v5 with a TDX 1.5 report) and
//! their real PCS collateral, each tampering refused with its own reason.

use std::time::{Duration, SystemTime};

use asterism_attestation::explain::{Explanation, Outcome, Reference};
use asterism_attestation::tdx::{
    MAX_COLLATERAL_LEN, MAX_QUOTE_LEN, PckCa, TcbStatus, TdQuote, TdReportKind, TdxCollateral,
    TdxPolicy, TdxVerifier, check_fields, pck_collateral_urls,
};
use asterism_attestation::{InsecureNoLaunchMeasurement, ValidationError};

/// The quote the collateral was fetched for (dcap-qvl's `sample/tdx_quote`).
const QUOTE: &[u8] = include_bytes!("../data/cvm/tdx-dcap/tdx_quote");
/// Another platform's quote (dcap-qvl's `sample/tdx-quote.hex`): its TCB is not in this
/// collateral.
const OTHER_QUOTE_HEX: &str = include_str!("../data/cvm/tdx-dcap/tdx-quote.hex");
const COLLATERAL: &[u8] = include_bytes!("../data/cvm/tdx-dcap/tdx_quote_collateral.json");

/// 2025-07-01T00:00:00Z: inside the TCB info (2025-06-19 to 2025-07-19), the QE identity
/// (2025-06-19 to 2025-07-19), both CRLs and every certificate.
const NOW: u64 = 1_751_328_000;

// Offsets in a v4 quote.
const BODY: usize = 48;
const MR_TD: usize = BODY + 136;
const TD_ATTRIBUTES: usize = BODY + 120;
const SIG_DATA: usize = BODY + 584 + 4;
const QE_REPORT: usize = SIG_DATA + 64 + 64 + 2 + 4;
const QE_AUTH: usize = QE_REPORT + 384 + 64 + 2;

fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

/// The sample as published: the quote followed by 70 zero bytes of buffer padding.
fn published() -> Vec<u8> {
    QUOTE.to_vec()
}

/// The quote itself: the published bytes up to the end its signature data size declares.
fn quote() -> Vec<u8> {
    unpadded(published())
}

fn unpadded(mut q: Vec<u8>) -> Vec<u8> {
    let sig_len = u32::from_le_bytes(q[SIG_DATA - 4..SIG_DATA].try_into().unwrap()) as usize;
    assert!(q[SIG_DATA + sig_len..].iter().all(|&b| b == 0));
    q.truncate(SIG_DATA + sig_len);
    q
}

fn collateral() -> TdxCollateral {
    TdxCollateral::from_json(COLLATERAL).unwrap()
}

fn report_data(q: &[u8]) -> [u8; 64] {
    TdQuote::parse(q).unwrap().report().report_data
}

/// A policy pinning the sample's own MRTD and RTMRs, accepting its TCB status.
fn pinned_policy() -> TdxPolicy {
    let q = quote();
    let parsed = TdQuote::parse(&q).unwrap();
    let r = parsed.report();
    TdxPolicy {
        mrtd: Some(Reference::enforce(r.mr_td)),
        rtmrs: r.rtmr.map(|v| Some(Reference::enforce(v))),
        ..TdxPolicy::default()
    }
}

/// The default policy, told to accept any MRTD and RTMR: for the tests of the other checks,
/// on quotes of several launches.
fn any_launch() -> TdxPolicy {
    TdxPolicy {
        insecure_no_launch_measurement: Some(InsecureNoLaunchMeasurement::insecure_new()),
        ..TdxPolicy::default()
    }
}

fn verify(policy: TdxPolicy, q: &[u8], c: &TdxCollateral, now: u64) -> Result<(), ValidationError> {
    let rd = TdQuote::parse(q)
        .map(|p| p.report().report_data)
        .unwrap_or([0; 64]);
    TdxVerifier::new(policy)
        .verify(q, c, &rd, at(now))
        .map(|_| ())
}

fn flip(q: &[u8], offset: usize) -> Vec<u8> {
    let mut q = q.to_vec();
    q[offset] ^= 0x01;
    q
}

fn field_of(e: &ValidationError) -> &str {
    match e {
        ValidationError::Field { field, .. } => field,
        other => panic!("expected a field error, got {other:?}"),
    }
}

fn certificate_of(e: ValidationError) -> (String, String) {
    match e {
        ValidationError::Certificate { which, reason } => (which, reason),
        other => panic!("expected a certificate error, got {other:?}"),
    }
}

#[test]
fn accepts_the_real_quote_and_explains_every_check() {
    let q = quote();
    let (ex, result) = TdxVerifier::new(pinned_policy()).verify_explained(
        &q,
        &collateral(),
        &report_data(&q),
        at(NOW),
    );
    let v = result.unwrap();
    assert_eq!(v.version(), 4);
    assert_eq!(v.report().kind, TdReportKind::Td10);
    assert_eq!(v.tcb_status(), TcbStatus::UpToDate);
    assert!(v.advisory_ids().is_empty());
    assert_eq!(hex::encode_upper(v.fmspc()), "B0C06F000000");
    // The accessors give the quote's own measurements, each from its place in the report.
    let parsed = TdQuote::parse(&q).unwrap().report().clone();
    assert_eq!(v.mr_td(), &parsed.mr_td);
    for i in 0..4 {
        assert_eq!(v.rtmr(i), Some(&parsed.rtmr[i]), "rtmr{i}");
    }
    assert_eq!(v.rtmr(4), None);
    assert_eq!(v.report_data(), &report_data(&q));
    assert_ne!(report_data(&q), [0; 64]);
    // The verifier's own Debug names it and its policy (no cache contents, no CRLs).
    let debug = format!("{:?}", TdxVerifier::new(pinned_policy()));
    assert!(
        debug.starts_with("TdxVerifier") && debug.contains("policy"),
        "{debug}"
    );
    assert_ne!(parsed.mr_td, [0; 48]);
    assert_ne!(parsed.rtmr[0], parsed.rtmr[1]);
    let fields: Vec<&str> = ex.checks.iter().map(|c| &*c.field).collect();
    assert_eq!(
        fields,
        [
            "qe_report.report_data",
            "qe_report.signature",
            "quote.signature",
            "pck_chain",
            "crls",
            "tcb_info",
            "qe_identity",
            "tcb_status",
            "td_attributes.debug",
            "td_attributes.tud_profiling",
            "td_attributes.sept_ve_disable",
            "td_attributes.migratable",
            "td_attributes.servtd_ext",
            "td_attributes.reserved",
            "mr_td",
            "rtmr0",
            "rtmr1",
            "rtmr2",
            "rtmr3",
            "report_data",
        ]
    );
    assert!(ex.checks.iter().all(|c| c.outcome == Outcome::Pass), "{ex}");
    assert_eq!(v.explanation(), &ex);
}

#[test]
fn refuses_a_quote_whose_tcb_level_the_collateral_does_not_list() {
    let hex = OTHER_QUOTE_HEX.trim();
    let other = unpadded(hex::decode(hex.strip_prefix("0x").unwrap_or(hex)).unwrap());
    let (which, reason) =
        certificate_of(verify(any_launch(), &other, &collateral(), NOW).unwrap_err());
    assert_eq!(which, "TCB info (platform match)");
    assert!(reason.contains("TCB level"), "{reason}");
}

#[test]
fn a_repeat_quote_uses_the_cache_and_still_passes_every_field_check() {
    let q = quote();
    let c = collateral();
    let verifier = TdxVerifier::new(pinned_policy());
    verifier.verify(&q, &c, &report_data(&q), at(NOW)).unwrap();
    let (ex, again) = verifier.verify_explained(&q, &c, &report_data(&q), at(NOW + 60));
    again.unwrap();
    let pck = ex.checks.iter().find(|c| c.field == "pck_chain").unwrap();
    assert!(pck.observed.contains("verified before"), "{pck}");
    // Field checks still run on a cache hit.
    let bad = verifier.verify(&q, &c, &[0; 64], at(NOW + 60)).unwrap_err();
    assert_eq!(bad, ValidationError::BindingMismatch);
}

#[test]
fn a_warm_cache_vouches_only_for_the_exact_bytes_it_verified() {
    // The cache holds the real quote's outcome; a QE report, its signature or a PCK
    // certificate changed by one bit must each be verified afresh, and refused, by the
    // same verifier, with the same collateral.
    let q = quote();
    let c = collateral();
    let verifier = TdxVerifier::new(any_launch());
    verifier.verify(&q, &c, &report_data(&q), at(NOW)).unwrap();
    let pck_start = find(&q, b"-----BEGIN CERTIFICATE-----").unwrap();
    for (what, offset) in [
        ("QE report", QE_REPORT + 100),
        ("QE report signature", QE_REPORT + 384 + 3),
        ("PCK certificate", pck_start + 200),
    ] {
        let tampered = flip(&q, offset);
        let err = verifier
            .verify(&tampered, &c, &report_data(&tampered), at(NOW))
            .unwrap_err();
        assert!(
            matches!(
                err,
                ValidationError::BadSignature(_) | ValidationError::Certificate { .. }
            ),
            "{what}: {err:?}"
        );
    }
    // And the real quote still hits.
    verifier.verify(&q, &c, &report_data(&q), at(NOW)).unwrap();
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[test]
fn rejects_a_flipped_bit_in_the_td_report() {
    let err = verify(any_launch(), &flip(&quote(), MR_TD + 5), &collateral(), NOW).unwrap_err();
    assert!(
        matches!(&err, ValidationError::BadSignature(m) if m.contains("attestation key")),
        "{err:?}"
    );
}

#[test]
fn rejects_a_flipped_bit_in_the_header() {
    // The last byte of the header's user data: signed, not otherwise checked.
    let err = verify(any_launch(), &flip(&quote(), 47), &collateral(), NOW).unwrap_err();
    assert!(matches!(&err, ValidationError::BadSignature(m) if m.contains("attestation key")));
}

#[test]
fn rejects_a_flipped_bit_in_the_quote_signature() {
    let err = verify(
        any_launch(),
        &flip(&quote(), SIG_DATA + 10),
        &collateral(),
        NOW,
    )
    .unwrap_err();
    assert!(matches!(&err, ValidationError::BadSignature(m) if m.contains("attestation key")));
}

#[test]
fn rejects_a_flipped_bit_in_the_attestation_key() {
    let err = verify(
        any_launch(),
        &flip(&quote(), SIG_DATA + 64 + 7),
        &collateral(),
        NOW,
    )
    .unwrap_err();
    assert!(matches!(err, ValidationError::BadSignature(_)), "{err:?}");
}

#[test]
fn rejects_a_flipped_bit_in_the_qe_report() {
    let err = verify(
        any_launch(),
        &flip(&quote(), QE_REPORT + 100),
        &collateral(),
        NOW,
    )
    .unwrap_err();
    assert!(
        matches!(&err, ValidationError::BadSignature(m) if m.contains("QE report: the PCK")),
        "{err:?}"
    );
}

#[test]
fn rejects_a_flipped_bit_in_the_qe_report_signature() {
    let err = verify(
        any_launch(),
        &flip(&quote(), QE_REPORT + 384 + 3),
        &collateral(),
        NOW,
    )
    .unwrap_err();
    assert!(matches!(&err, ValidationError::BadSignature(m) if m.contains("QE report: the PCK")));
}

#[test]
fn rejects_qe_auth_data_the_qe_report_does_not_bind() {
    let err = verify(
        any_launch(),
        &flip(&quote(), QE_AUTH + 1),
        &collateral(),
        NOW,
    )
    .unwrap_err();
    assert!(
        matches!(&err, ValidationError::BadSignature(m) if m.contains("does not bind")),
        "{err:?}"
    );
}

/// Rebuilds a v4 quote with another PCK chain and QE report signature.
fn with_pck(q: &[u8], pem: &[u8], qe_sig: &[u8]) -> Vec<u8> {
    let qe_report = &q[QE_REPORT..QE_REPORT + 384];
    let auth_len = u16::from_le_bytes([q[QE_AUTH - 2], q[QE_AUTH - 1]]) as usize;
    let auth = &q[QE_AUTH - 2..QE_AUTH + auth_len];
    let mut cert = Vec::new();
    cert.extend_from_slice(qe_report);
    cert.extend_from_slice(qe_sig);
    cert.extend_from_slice(auth);
    cert.extend_from_slice(&5u16.to_le_bytes());
    cert.extend_from_slice(&(pem.len() as u32).to_le_bytes());
    cert.extend_from_slice(pem);
    let mut sig = q[SIG_DATA..SIG_DATA + 128].to_vec();
    sig.extend_from_slice(&6u16.to_le_bytes());
    sig.extend_from_slice(&(cert.len() as u32).to_le_bytes());
    sig.extend_from_slice(&cert);
    let mut out = q[..SIG_DATA - 4].to_vec();
    out.extend_from_slice(&(sig.len() as u32).to_le_bytes());
    out.extend_from_slice(&sig);
    out
}

#[test]
fn rejects_a_pck_chain_that_ends_at_another_root() {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, PKCS_ECDSA_P256_SHA256};
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair};

    // A root and a PCK leaf of our own; the leaf signs the real QE report, so the quote
    // signature, the QE report signature and its binding all verify: only the chain is wrong.
    let root_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let mut root_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    root_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    root_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "Intel SGX Root CA");
    let root_cert = root_params.self_signed(&root_key).unwrap();
    let root = rcgen::Issuer::new(root_params, root_key);
    let leaf_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let mut leaf_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    leaf_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "Intel SGX PCK Certificate");
    let leaf_cert = leaf_params.signed_by(&leaf_key, &root).unwrap();
    let pem = format!("{}{}", leaf_cert.pem(), root_cert.pem());

    let q = quote();
    let rng = ring::rand::SystemRandom::new();
    let signer = EcdsaKeyPair::from_pkcs8(
        &ECDSA_P256_SHA256_FIXED_SIGNING,
        &leaf_key.serialize_der(),
        &rng,
    )
    .unwrap();
    let qe_sig = signer.sign(&rng, &q[QE_REPORT..QE_REPORT + 384]).unwrap();
    let forged = with_pck(&q, pem.as_bytes(), qe_sig.as_ref());

    let (ex, result) = TdxVerifier::new(any_launch()).verify_explained(
        &forged,
        &collateral(),
        &report_data(&q),
        at(NOW),
    );
    let (which, reason) = certificate_of(result.unwrap_err());
    assert_eq!(which, "PCK");
    assert!(reason.contains("Intel SGX Root CA"), "{reason}");
    // The signatures before the chain passed: the chain is what refused it.
    assert_eq!(ex.checks[1].field, "qe_report.signature");
    assert_eq!(ex.checks[1].outcome, Outcome::Pass);
    assert_eq!(ex.first_failure().unwrap().field, "PCK");

    // The rebuilt quote with the real chain and signature still verifies: the forgery
    // differs only in its chain.
    let real_pem = TdQuote::parse(&q).unwrap().pck_chain_pem().to_vec();
    let rebuilt = with_pck(&q, &real_pem, &q[QE_REPORT + 384..QE_REPORT + 448]);
    assert_eq!(rebuilt, q);
}

#[test]
fn refuses_a_tcb_status_the_policy_does_not_accept_and_names_it() {
    let policy = TdxPolicy {
        accepted_tcb_statuses: vec![TcbStatus::SWHardeningNeeded],
        ..any_launch()
    };
    let err = verify(policy, &quote(), &collateral(), NOW).unwrap_err();
    assert_eq!(
        err,
        ValidationError::Field {
            field: "tcb_status".into(),
            expected: "one of SWHardeningNeeded".into(),
            observed: "UpToDate".into(),
        }
    );
}

#[test]
fn refuses_collateral_past_its_next_update() {
    // 2025-07-20: a day after the TCB info's and QE identity's nextUpdate.
    let err = verify(any_launch(), &quote(), &collateral(), 1_752_969_600).unwrap_err();
    let (which, reason) = certificate_of(err);
    assert_eq!(which, "TCB info");
    assert!(reason.contains("expired"), "{reason}");
}

#[test]
fn refuses_collateral_before_it_was_issued() {
    // 2025-06-01: before the TCB info, the QE identity and the PCK CRL were issued.
    let err = verify(any_launch(), &quote(), &collateral(), 1_748_736_000).unwrap_err();
    let (which, reason) = certificate_of(err);
    assert_eq!(which, "TCB info");
    assert!(reason.contains("in the future"), "{reason}");
}

#[test]
fn a_cached_outcome_is_not_used_outside_its_validity() {
    let q = quote();
    let c = collateral();
    let verifier = TdxVerifier::new(any_launch());
    verifier.verify(&q, &c, &report_data(&q), at(NOW)).unwrap();
    let err = verifier
        .verify(&q, &c, &report_data(&q), at(1_752_969_600))
        .unwrap_err();
    assert!(
        matches!(err, ValidationError::Certificate { .. }),
        "{err:?}"
    );
}

#[test]
fn refuses_tampered_tcb_info() {
    let mut json: serde_json::Value = serde_json::from_slice(COLLATERAL).unwrap();
    let tcb = json["tcb_info"].as_str().unwrap().replace(
        "\"tcbEvaluationDataNumber\":17",
        "\"tcbEvaluationDataNumber\":18",
    );
    assert_ne!(tcb, json["tcb_info"].as_str().unwrap());
    json["tcb_info"] = tcb.into();
    let c = TdxCollateral::from_json(&serde_json::to_vec(&json).unwrap()).unwrap();
    let (which, reason) = certificate_of(verify(any_launch(), &quote(), &c, NOW).unwrap_err());
    assert_eq!(which, "TCB info");
    assert!(reason.to_lowercase().contains("signature"), "{reason}");
}

#[test]
fn refuses_tampered_qe_identity() {
    let mut json: serde_json::Value = serde_json::from_slice(COLLATERAL).unwrap();
    let qe = json["qe_identity"]
        .as_str()
        .unwrap()
        .replace("\"version\":2", "\"version\":3");
    json["qe_identity"] = qe.into();
    let c = TdxCollateral::from_json(&serde_json::to_vec(&json).unwrap()).unwrap();
    let (which, reason) = certificate_of(verify(any_launch(), &quote(), &c, NOW).unwrap_err());
    assert_eq!(which, "QE identity");
    assert!(reason.to_lowercase().contains("signature"), "{reason}");
}

#[test]
fn refuses_an_mrtd_mismatch() {
    let mut policy = pinned_policy();
    let mut other = policy.mrtd.unwrap().value;
    other[0] ^= 1;
    policy.mrtd = Some(Reference::enforce(other));
    let err = verify(policy, &quote(), &collateral(), NOW).unwrap_err();
    assert_eq!(field_of(&err), "mr_td");
}

#[test]
fn refuses_an_rtmr_mismatch_and_only_warns_when_told_to() {
    let mut policy = pinned_policy();
    let mut other = policy.rtmrs[2].unwrap().value;
    other[47] ^= 1;
    policy.rtmrs[2] = Some(Reference::enforce(other));
    let err = verify(policy.clone(), &quote(), &collateral(), NOW).unwrap_err();
    assert_eq!(field_of(&err), "rtmr2");

    policy.rtmrs[2] = Some(Reference::warn_only(other));
    let q = quote();
    let v = TdxVerifier::new(policy)
        .verify(&q, &collateral(), &report_data(&q), at(NOW))
        .unwrap();
    assert_eq!(v.explanation().warnings().next().unwrap().field, "rtmr2");
}

#[test]
fn refuses_a_report_data_mismatch() {
    let q = quote();
    let mut rd = report_data(&q);
    rd[63] ^= 1;
    let err = TdxVerifier::new(any_launch())
        .verify(&q, &collateral(), &rd, at(NOW))
        .unwrap_err();
    assert_eq!(err, ValidationError::BindingMismatch);
}

#[test]
fn refuses_truncated_and_trailing_bytes() {
    let q = quote();
    for len in [0, 47, 48, 631, 632, 636, q.len() - 1] {
        let err = verify(any_launch(), &q[..len], &collateral(), NOW).unwrap_err();
        assert!(
            matches!(err, ValidationError::Malformed(_)),
            "{len}: {err:?}"
        );
    }
    let mut longer = q.clone();
    longer.push(0);
    let err = verify(any_launch(), &longer, &collateral(), NOW).unwrap_err();
    assert!(
        matches!(&err, ValidationError::Malformed(m) if m.contains("trailing")),
        "{err:?}"
    );
    let (ex, _) =
        TdxVerifier::new(any_launch()).verify_explained(&longer, &collateral(), &[0; 64], at(NOW));
    assert_eq!(ex.first_failure().unwrap().field, "quote");
    let huge = vec![0u8; MAX_QUOTE_LEN + 1];
    assert!(matches!(
        TdQuote::parse(&huge),
        Err(ValidationError::Malformed(_))
    ));
}

#[test]
fn refuses_the_published_sample_with_its_zero_padding() {
    // Padding is trailing bytes like any other: the issuer must send the quote alone.
    let err = TdQuote::parse(&published()).unwrap_err();
    assert!(
        matches!(&err, ValidationError::Malformed(m) if m.contains("70 trailing")),
        "{err:?}"
    );
}

#[test]
fn refuses_a_length_field_that_does_not_match() {
    let q = quote();
    // The signature data size, one more than what follows.
    let mut bad = q.clone();
    bad[SIG_DATA - 4] = bad[SIG_DATA - 4].wrapping_add(1);
    assert!(matches!(
        TdQuote::parse(&bad),
        Err(ValidationError::Malformed(_))
    ));
    // The QE auth data size, one less.
    let mut bad = q.clone();
    bad[QE_AUTH - 2] = bad[QE_AUTH - 2].wrapping_sub(1);
    assert!(matches!(
        TdQuote::parse(&bad),
        Err(ValidationError::Malformed(_))
    ));
}

/// Field checks on the real report with one attribute changed. The verifier runs the same
/// function after the signatures; a real debug quote cannot be re-signed here.
fn check_attributes(bits_to_flip: u64) -> (Explanation, Result<(), ValidationError>) {
    let q = quote();
    let mut report = TdQuote::parse(&q).unwrap().report().clone();
    let bits = report.td_attributes_bits() ^ bits_to_flip;
    report.td_attributes = bits.to_le_bytes();
    let mut ex = Explanation::default();
    let r = check_fields(
        &pinned_policy(),
        &report,
        TcbStatus::UpToDate,
        &[],
        &report.report_data.clone(),
        &mut ex,
    );
    (ex, r)
}

#[test]
fn mrtd_and_rtmr_0_to_2_are_required_unless_told_insecure() {
    let q = quote();
    let report = TdQuote::parse(&q).unwrap().report().clone();
    let run = |policy: &TdxPolicy| {
        let mut ex = Explanation::default();
        let r = check_fields(
            policy,
            &report,
            TcbStatus::UpToDate,
            &[],
            &report.report_data.clone(),
            &mut ex,
        );
        (ex, r)
    };
    for (i, field) in ["mr_td", "rtmr0", "rtmr1", "rtmr2"].into_iter().enumerate() {
        let mut policy = pinned_policy();
        match i.checked_sub(1) {
            None => policy.mrtd = None,
            Some(rtmr) => policy.rtmrs[rtmr] = None,
        }
        let err = run(&policy).1.unwrap_err();
        assert_eq!(field_of(&err), field);
        policy.insecure_no_launch_measurement = Some(InsecureNoLaunchMeasurement::insecure_new());
        let (ex, r) = run(&policy);
        r.unwrap();
        let warned: Vec<&str> = ex.warnings().map(|c| &*c.field).collect();
        assert_eq!(warned, [field]);
    }
    // RTMR 3 is the platform's to require (Azure does, CvmAkTrust::azure_tdx).
    let mut policy = pinned_policy();
    policy.rtmrs[3] = None;
    run(&policy).1.unwrap();
}

#[test]
fn sw_hardening_needed_passes_only_for_listed_advisories() {
    let q = quote();
    let report = TdQuote::parse(&q).unwrap().report().clone();
    let advisories = ["INTEL-SA-00615".to_owned(), "INTEL-SA-00837".to_owned()];
    let run = |policy: &TdxPolicy, status: TcbStatus| {
        check_fields(
            policy,
            &report,
            status,
            &advisories,
            &report.report_data.clone(),
            &mut Explanation::default(),
        )
    };
    let default = pinned_policy();
    let err = run(&default, TcbStatus::SWHardeningNeeded).unwrap_err();
    assert_eq!(field_of(&err), "advisory_ids");
    let one = TdxPolicy {
        accepted_advisory_ids: vec!["INTEL-SA-00615".into()],
        ..pinned_policy()
    };
    let err = run(&one, TcbStatus::SWHardeningNeeded).unwrap_err();
    assert!(
        matches!(&err, ValidationError::Field { field, observed, .. }
            if field == "advisory_ids" && observed.contains("INTEL-SA-00837")),
        "{err:?}"
    );
    let both = TdxPolicy {
        accepted_advisory_ids: advisories.to_vec(),
        ..pinned_policy()
    };
    run(&both, TcbStatus::SWHardeningNeeded).unwrap();
    // UpToDate needs no listing.
    run(&default, TcbStatus::UpToDate).unwrap();
}

#[test]
fn the_real_report_passes_the_field_checks() {
    let (ex, r) = check_attributes(0);
    r.unwrap();
    assert!(ex.first_failure().is_none());
    assert_eq!(
        u64::from_le_bytes(
            quote()[TD_ATTRIBUTES..TD_ATTRIBUTES + 8]
                .try_into()
                .unwrap()
        ) & 1,
        0
    );
}

#[test]
fn refuses_a_debug_td() {
    let (_, r) = check_attributes(1);
    assert_eq!(field_of(&r.unwrap_err()), "td_attributes.debug");
}

#[test]
fn refuses_other_attributes_that_weaken_the_td() {
    for (bit, field) in [
        (1u64 << 4, "td_attributes.tud_profiling"),
        (1 << 28, "td_attributes.sept_ve_disable"),
        (1 << 29, "td_attributes.migratable"),
        (1 << 17, "td_attributes.servtd_ext"),
        (1 << 40, "td_attributes.reserved"),
    ] {
        let (_, r) = check_attributes(bit);
        assert_eq!(field_of(&r.unwrap_err()), field);
    }
    // PKS is a feature, not a weakness.
    check_attributes(1 << 30).1.unwrap();
}

#[test]
fn every_reserved_range_of_the_td_attributes_is_refused_and_no_bit_beside_it() {
    // TDX 1.5 reserves bits 1-3, 7-15, 23-26 and 32-61: each end of each range is refused.
    for bit in [1u32, 3, 7, 15, 23, 26, 32, 61] {
        let (_, r) = check_attributes(1 << bit);
        assert_eq!(
            field_of(&r.unwrap_err()),
            "td_attributes.reserved",
            "bit {bit}"
        );
    }
    // The features just outside them are accepted: ICSSD (16), LASS (27), PKS (30),
    // KL (31), PERFMON (63).
    for bit in [16u32, 27, 30, 31, 63] {
        check_attributes(1 << bit)
            .1
            .unwrap_or_else(|e| panic!("bit {bit}: {e:?}"));
    }
}

#[test]
fn field_checks_all_run_and_the_first_failure_is_returned() {
    let (ex, r) = check_attributes(1 | (1 << 29));
    assert_eq!(field_of(&r.unwrap_err()), "td_attributes.debug");
    let failed: Vec<&str> = ex
        .checks
        .iter()
        .filter(|c| c.outcome == Outcome::Fail)
        .map(|c| &*c.field)
        .collect();
    assert_eq!(failed, ["td_attributes.debug", "td_attributes.migratable"]);
    assert_eq!(ex.checks.last().unwrap().field, "report_data");
}

#[test]
fn revoked_is_refused_even_when_the_policy_lists_it() {
    let q = quote();
    let report = TdQuote::parse(&q).unwrap().report().clone();
    let policy = TdxPolicy {
        accepted_tcb_statuses: vec![TcbStatus::Revoked],
        ..any_launch()
    };
    let mut ex = Explanation::default();
    let err = check_fields(
        &policy,
        &report,
        TcbStatus::Revoked,
        &[],
        &report.report_data,
        &mut ex,
    )
    .unwrap_err();
    assert_eq!(field_of(&err), "tcb_status");
}

/// A v5 quote made from the v4 sample: version 5, a body type and size before the body.
fn v5(q: &[u8], body_type: u16, extra: &[u8]) -> Vec<u8> {
    let mut out = q[..BODY].to_vec();
    out[0] = 5;
    out.extend_from_slice(&body_type.to_le_bytes());
    out.extend_from_slice(&((584 + extra.len()) as u32).to_le_bytes());
    out.extend_from_slice(&q[BODY..BODY + 584]);
    out.extend_from_slice(extra);
    out.extend_from_slice(&q[SIG_DATA - 4..]);
    out
}

#[test]
fn parses_v5_td_report_layouts() {
    let q = quote();
    let v4 = TdQuote::parse(&q).unwrap().report().clone();

    let td10 = v5(&q, 2, &[]);
    let parsed = TdQuote::parse(&td10).unwrap();
    assert_eq!(parsed.version(), 5);
    assert_eq!(parsed.report(), &v4);

    let mut extra = [0u8; 64];
    extra[..16].copy_from_slice(&[7; 16]);
    let td15 = v5(&q, 3, &extra);
    let r = TdQuote::parse(&td15).unwrap().report().clone();
    assert_eq!(r.kind, TdReportKind::Td15);
    assert_eq!(r.tee_tcb_svn2, Some([7; 16]));
    assert_eq!(r.mr_service_td, Some([0; 48]));
    assert_eq!(r.rtmr, v4.rtmr);
    assert_eq!(r.report_data, v4.report_data);

    let td15ex = v5(&q, 4, &[0u8; 885 - 584]);
    assert_eq!(
        TdQuote::parse(&td15ex).unwrap().report().kind,
        TdReportKind::Td15Ex
    );

    // A size that does not match the body type, and an unknown body type.
    assert!(matches!(
        TdQuote::parse(&v5(&q, 3, &[])),
        Err(ValidationError::Malformed(_))
    ));
    assert!(matches!(
        TdQuote::parse(&v5(&q, 1, &[])),
        Err(ValidationError::Malformed(_))
    ));
    assert!(matches!(
        TdQuote::parse(&v5(&q, 2, &[0])),
        Err(ValidationError::Malformed(_))
    ));
}

#[test]
fn the_signature_covers_the_v5_body_header() {
    // The v4 signature does not verify over a v5 header and body type: refused as a
    // signature failure, not accepted as the same report.
    let q = quote();
    let err = verify(any_launch(), &v5(&q, 2, &[]), &collateral(), NOW).unwrap_err();
    assert!(matches!(err, ValidationError::BadSignature(_)), "{err:?}");
}

#[test]
fn refuses_other_versions_tee_types_and_key_types() {
    let q = quote();
    for (offset, value) in [(0, 3u8), (2, 3), (4, 0), (12, 0)] {
        let mut bad = q.clone();
        bad[offset] = value;
        assert!(
            matches!(TdQuote::parse(&bad), Err(ValidationError::Malformed(_))),
            "offset {offset}"
        );
    }
}

#[test]
fn collateral_json_is_size_capped_and_checked() {
    let huge = vec![b' '; MAX_COLLATERAL_LEN + 1];
    assert!(matches!(
        TdxCollateral::from_json(&huge),
        Err(ValidationError::Malformed(_))
    ));
    assert!(matches!(
        TdxCollateral::from_json(b"{}"),
        Err(ValidationError::Malformed(_))
    ));
    assert_eq!(collateral().fmspc().as_deref(), Some("B0C06F000000"));
}

#[test]
fn tcb_status_names_round_trip() {
    for name in [
        "UpToDate",
        "SWHardeningNeeded",
        "ConfigurationNeeded",
        "ConfigurationAndSWHardeningNeeded",
        "OutOfDate",
        "OutOfDateConfigurationNeeded",
        "TDRelaunchAdvised",
        "TDRelaunchAdvisedConfigurationNeeded",
        "Revoked",
    ] {
        let status: TcbStatus = name.parse().unwrap();
        assert_eq!(status.to_string(), name);
    }
    assert!("uptodate".parse::<TcbStatus>().is_err());
    assert_eq!(
        TdxPolicy::default().accepted_tcb_statuses,
        [TcbStatus::UpToDate, TcbStatus::SWHardeningNeeded]
    );
}

#[test]
fn collateral_urls_are_intel_pcs_v4() {
    let urls = pck_collateral_urls(&[0xb0, 0xc0, 0x6f, 0, 0, 0], PckCa::Platform);
    assert_eq!(
        urls.tcb_info,
        "https://api.trustedservices.intel.com/tdx/certification/v4/tcb?fmspc=B0C06F000000"
    );
    assert_eq!(
        urls.qe_identity,
        "https://api.trustedservices.intel.com/tdx/certification/v4/qe/identity"
    );
    assert_eq!(
        urls.pck_crl,
        "https://api.trustedservices.intel.com/sgx/certification/v4/pckcrl?ca=platform&encoding=der"
    );
    assert!(
        pck_collateral_urls(&[0; 6], PckCa::Processor)
            .pck_crl
            .contains("ca=processor")
    );
}

#[test]
fn refuses_a_tampered_crl() {
    // The root CA CRL vouches for the first certificate below the root on every path; the
    // TCB signing chain is checked first.
    for (key, named) in [
        ("pck_crl", "CRL (PCK path)"),
        ("root_ca_crl", "CRL (TCB signing chain path)"),
    ] {
        let mut json: serde_json::Value = serde_json::from_slice(COLLATERAL).unwrap();
        let mut crl = hex::decode(json[key].as_str().unwrap()).unwrap();
        // The last byte of the signature.
        *crl.last_mut().unwrap() ^= 1;
        json[key] = hex::encode(crl).into();
        let c = TdxCollateral::from_json(&serde_json::to_vec(&json).unwrap()).unwrap();
        let (which, reason) = certificate_of(verify(any_launch(), &quote(), &c, NOW).unwrap_err());
        assert_eq!(which, named);
        assert!(reason.contains("signature does not verify"), "{reason}");
    }
}

/// A real v5 quote with a TDX 1.5 report and the service-TD extension (body type 4), and
/// its collateral (dcap-qvl's `sample/tdx_quote_td15ex`).
const V5_QUOTE: &[u8] = include_bytes!("../data/cvm/tdx-dcap/tdx_quote_td15ex");
const V5_COLLATERAL: &[u8] =
    include_bytes!("../data/cvm/tdx-dcap/tdx_quote_td15ex_collateral.json");
/// 2026-10-11: inside that collateral's validity (issued 2026-10-08, next update 2026-11-07).
const V5_NOW: u64 = 1_791_700_000;
/// Where the v5 body starts: after the header and the body type and size.
const V5_BODY: usize = 48 + 6;

#[test]
fn accepts_a_real_v5_quote() {
    let c = TdxCollateral::from_json(V5_COLLATERAL).unwrap();
    let parsed = TdQuote::parse(V5_QUOTE).unwrap();
    assert_eq!(parsed.version(), 5);
    let r = parsed.report();
    assert_eq!(r.kind, TdReportKind::Td15Ex);
    assert_eq!(r.mr_service_td, Some([0; 48]));
    assert!(r.tee_tcb_svn2.is_some());
    let (ex, v) =
        TdxVerifier::new(any_launch()).verify_explained(V5_QUOTE, &c, &r.report_data, at(V5_NOW));
    let v = v.unwrap();
    assert_eq!(v.version(), 5);
    assert_eq!(v.tcb_status(), TcbStatus::UpToDate);
    assert!(ex.checks.iter().any(|c| c.field == "mr_service_td"));
}

#[test]
fn rejects_a_flipped_bit_anywhere_in_a_v5_body() {
    let c = TdxCollateral::from_json(V5_COLLATERAL).unwrap();
    let rd = TdQuote::parse(V5_QUOTE).unwrap().report().report_data;
    // RTMR0, TEE_TCB_SVN2 (TDX 1.5) and the last byte of the 1.5 extension.
    for offset in [V5_BODY + 328, V5_BODY + 584, V5_BODY + 884] {
        let q = flip(V5_QUOTE, offset);
        let err = TdxVerifier::new(any_launch())
            .verify(&q, &c, &rd, at(V5_NOW))
            .unwrap_err();
        assert!(
            matches!(&err, ValidationError::BadSignature(m) if m.contains("attestation key")),
            "{offset}: {err:?}"
        );
    }
}

/// The root CA and PCK CRLs the real collateral carries (DER, hex in the JSON): real CRLs
/// signed by Intel, current at `NOW`.
fn intel_crls() -> Vec<(String, Vec<u8>)> {
    let json: serde_json::Value = serde_json::from_slice(COLLATERAL).unwrap();
    ["root_ca_crl", "pck_crl"]
        .into_iter()
        .map(|k| {
            (
                k.to_owned(),
                hex::decode(json[k].as_str().unwrap()).unwrap(),
            )
        })
        .collect()
}

fn verify_with_crls(crls: Vec<(String, Vec<u8>)>) -> Result<(), ValidationError> {
    let bundle = asterism_attestation::revocation::CrlBundle::from_files(crls).unwrap();
    let count = bundle.len();
    let q = quote();
    let verifier = TdxVerifier::new(pinned_policy()).with_crls(std::sync::Arc::new(bundle));
    assert_eq!(verifier.crls().map(|c| c.len()), Some(count));
    assert!(TdxVerifier::new(pinned_policy()).crls().is_none());
    verifier
        .verify(&q, &collateral(), &report_data(&q), at(NOW))
        .map(|_| ())
}

#[test]
fn an_offline_crl_bundle_checks_the_pck_and_its_ca_against_intels_signed_crls() {
    // Intel's own CRLs, given as the bundle: the PCK and the PCK CA are listed by neither.
    verify_with_crls(intel_crls()).unwrap();

    // Without the PCK CA's CRL the PCK cannot be checked: refused, naming the issuer.
    let root_only: Vec<_> = intel_crls().into_iter().take(1).collect();
    let (which, reason) = certificate_of(verify_with_crls(root_only).unwrap_err());
    assert!(
        which.contains("PCK Platform CA") || which.contains("PCK Processor CA"),
        "{which}"
    );
    assert!(reason.contains("none in the CRL bundle"), "{reason}");

    // The PCK CRL with one bit of its signature flipped: refused as not Intel's.
    let mut tampered = intel_crls();
    let crl = &mut tampered[1].1;
    let at = crl.len() - 5;
    crl[at] ^= 1;
    let (which, reason) = certificate_of(verify_with_crls(tampered).unwrap_err());
    assert!(which.starts_with("CRL pck_crl"), "{which}");
    assert!(reason.contains("not signed by its issuer"), "{reason}");
}

/// A quote re-signed with a key of the forger's own holds its signature; it is refused at
/// the QE report's binding of the key (one SHA-256), before any signature is verified, so
/// it costs less than a valid quote. The cache of an earlier valid quote does not change
/// that.
#[test]
fn a_quote_signed_by_a_key_of_the_forgers_own_is_refused_before_any_signature() {
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _};
    let q = quote();
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let own =
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
    let mut forged = q.clone();
    forged[700..764].copy_from_slice(&own.public_key().as_ref()[1..]);
    let sig = own.sign(&rng, &forged[..632]).unwrap();
    forged[636..700].copy_from_slice(sig.as_ref());

    let verifier = TdxVerifier::new(any_launch());
    for warm in [false, true] {
        if warm {
            verifier
                .verify(&q, &collateral(), &report_data(&q), at(NOW))
                .unwrap();
        }
        let (ex, result) =
            verifier.verify_explained(&forged, &collateral(), &report_data(&q), at(NOW));
        assert!(
            matches!(result, Err(ValidationError::BadSignature(_))),
            "{result:?}"
        );
        assert_eq!(
            ex.first_failure().unwrap().field,
            "qe_report.report_data",
            "{ex:?}"
        );
        for field in ["qe_report.signature", "quote.signature"] {
            assert!(
                ex.checks.iter().all(|c| c.field != field),
                "{field} was verified for a forged quote (warm cache: {warm}): {ex:?}"
            );
        }
    }
}

/// A quote whose PCK chain holds no certificate (nothing, or bytes without a PEM section)
/// is refused at the chain, saying so, before any signature is checked against it.
#[test]
fn a_pck_chain_without_a_certificate_is_refused_as_such() {
    let q = quote();
    let qe_sig = q[QE_REPORT + 384..QE_REPORT + 448].to_vec();
    for pem in [&b""[..], b"no PEM section here\0"] {
        let forged = with_pck(&q, pem, &qe_sig);
        let (ex, result) = TdxVerifier::new(any_launch()).verify_explained(
            &forged,
            &collateral(),
            &report_data(&q),
            at(NOW),
        );
        let (which, reason) = certificate_of(result.unwrap_err());
        assert_eq!(
            (which.as_str(), reason.as_str()),
            ("PCK", "no certificate in the PEM chain"),
            "{pem:?}"
        );
        let failed = ex.first_failure().unwrap();
        assert_eq!(failed.field, "pck_chain", "{pem:?}");
        assert!(
            ex.checks.iter().all(|c| c.field != "qe_report.signature"),
            "{ex:?}"
        );
    }
}

/// The collateral's size cap at its exact bound: the real collateral padded with JSON
/// whitespace to exactly MAX_COLLATERAL_LEN bytes parses (and still verifies the real
/// quote); one byte more is refused by its size, before it is parsed.
#[test]
fn collateral_of_exactly_the_cap_is_read_and_one_byte_more_is_refused() {
    let mut at_cap = COLLATERAL.to_vec();
    at_cap.resize(MAX_COLLATERAL_LEN, b' ');
    let c = TdxCollateral::from_json(&at_cap).unwrap();
    assert_eq!(c.fmspc().as_deref(), Some("B0C06F000000"));
    let q = quote();
    verify(pinned_policy(), &q, &c, NOW).unwrap();

    at_cap.push(b' ');
    let err = TdxCollateral::from_json(&at_cap).unwrap_err();
    assert!(
        matches!(&err, ValidationError::Malformed(m)
            if m.contains(&format!("{} bytes, more than {MAX_COLLATERAL_LEN}", MAX_COLLATERAL_LEN + 1))),
        "{err:?}"
    );
}

/// A collateral's Debug form names it by the SHA-256 of its JSON (what the verifier's
/// cache knows it by), and prints none of its contents.
#[test]
fn collateral_debug_names_its_digest_only() {
    use sha2::Digest;
    let debug = format!("{:?}", collateral());
    assert_eq!(
        debug,
        format!(
            "TdxCollateral {{ digest: \"{}\", .. }}",
            hex::encode(sha2::Sha256::digest(COLLATERAL))
        )
    );
}

/// The quote's size cap at its exact bound: the real quote with its PCK chain padded by
/// blank lines (bytes outside PEM sections, which the chain's reader skips) to exactly
/// MAX_QUOTE_LEN bytes verifies; one byte more is refused by its size before anything is
/// parsed.
#[test]
fn a_quote_of_exactly_the_cap_verifies_and_one_byte_more_is_refused() {
    let q = quote();
    let mut pem = TdQuote::parse(&q).unwrap().pck_chain_pem().to_vec();
    let qe_sig = q[QE_REPORT + 384..QE_REPORT + 448].to_vec();
    pem.resize(pem.len() + MAX_QUOTE_LEN - q.len(), b'\n');
    let at_cap = with_pck(&q, &pem, &qe_sig);
    assert_eq!(at_cap.len(), MAX_QUOTE_LEN);
    verify(pinned_policy(), &at_cap, &collateral(), NOW).unwrap();

    pem.push(b'\n');
    let over = with_pck(&q, &pem, &qe_sig);
    let err = verify(pinned_policy(), &over, &collateral(), NOW).unwrap_err();
    assert!(
        matches!(&err, ValidationError::Malformed(m)
            if m.contains(&format!("{} bytes, more than the {MAX_QUOTE_LEN}", MAX_QUOTE_LEN + 1))),
        "{err:?}"
    );
}

/// Where the policy leaves SEPT_VE_DISABLE to the platform (a paravisor handles #VE), the
/// check passes either way and records which way it was, as `asterism verify` shows it.
#[test]
fn sept_ve_disable_left_to_the_platform_passes_and_records_what_the_td_has() {
    let q = quote();
    let real = TdQuote::parse(&q).unwrap().report().clone();
    let policy = TdxPolicy {
        require_sept_ve_disable: false,
        ..pinned_policy()
    };
    let real_set = real.td_attributes_bits() & (1 << 28) != 0;
    for flip_bit in [false, true] {
        let mut report = real.clone();
        if flip_bit {
            report.td_attributes = (real.td_attributes_bits() ^ (1 << 28)).to_le_bytes();
        }
        let mut ex = Explanation::default();
        check_fields(
            &policy,
            &report,
            TcbStatus::UpToDate,
            &[],
            &report.report_data,
            &mut ex,
        )
        .unwrap();
        let check = ex
            .checks
            .iter()
            .find(|c| c.field == "td_attributes.sept_ve_disable")
            .unwrap();
        assert_eq!(check.outcome, Outcome::Pass);
        assert!(check.expected.contains("paravisor"), "{}", check.expected);
        let set = real_set != flip_bit;
        assert_eq!(check.observed, if set { "set" } else { "clear" });
    }
}

//! The SEV-SNP verifier on real reports from real AMD hardware (Azure and AWS on Milan, a
//! Milan sample from the `sev` project) and their real certificates, at a fixed time inside
//! their validity. Every tampered copy is refused with its own reason: the test asserts the
//! error variant and the field or certificate, so removing a check makes its test fail.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use asterism_attestation::explain::{Explanation, Outcome, Reference};
use asterism_attestation::snp::{
    GENOA_SNP_FLOOR, MILAN_SNP_FLOOR, MinimumTcb, PerProduct, Product, REPORT_SIZE, SignerKind,
    SnpCerts, SnpPolicy, SnpReport, SnpVerifier, check_fields, kds,
};
use asterism_attestation::{InsecureNoLaunchMeasurement, ValidationError};
use asterism_testkit::cvm::snp_policy_at_the_azure_tcb;
use base64::Engine;
use sha2::Digest;

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/cvm");

/// 2025-06-01T00:00:00Z: inside every certificate's validity (the AWS VLEK's ends in
/// December 2025).
fn now() -> SystemTime {
    at(1_748_736_000)
}

fn at(unix: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(unix)
}

fn read(path: &str) -> Vec<u8> {
    std::fs::read(format!("{DATA}/{path}")).unwrap()
}

/// The AWS report's REPORT_DATA: the SHA-512 of the instance's vTPM attestation key.
const AWS_REPORT_DATA: &str = "87ab7caf510e1b3520dc3cceb64ee44128e10976fb0d3fc5e274699d8aaf506154af4c1de0a026b49fdf861e9ac75551551b3534d1c61369a3b08f5baed0db2f";

struct Case {
    report: Vec<u8>,
    certs: SnpCerts,
    report_data: [u8; 64],
}

fn milan() -> Case {
    let hex_text = String::from_utf8(read("snp-milan/report_milan.hex")).unwrap();
    let report = hex::decode(hex_text.trim()).unwrap();
    let report_data = SnpReport::parse(&report).unwrap().report_data;
    // No intermediate given: the embedded Milan ASK is used.
    let certs = SnpCerts::from_der(&read("snp-milan/vcek_milan.der"), None, None).unwrap();
    Case {
        report,
        certs,
        report_data,
    }
}

/// The Azure report is the first 1184 bytes of what the vTPM's HCL report carries; the
/// runtime data header follows it.
fn azure() -> Case {
    let report = read("snp-azure/attestation.bin")[..REPORT_SIZE].to_vec();
    let certs = SnpCerts::from_pem(
        &read("snp-azure/vcek.pem"),
        Some(&read("snp-azure/certchain.pem")),
    )
    .unwrap();
    // Azure: REPORT_DATA = SHA-256(runtime data) ‖ 32 zero bytes.
    let mut report_data = [0u8; 64];
    report_data[..32].copy_from_slice(&sha2::Sha256::digest(read("snp-azure/runtimedata.bin")));
    Case {
        report,
        certs,
        report_data,
    }
}

fn aws() -> Case {
    let b64 = String::from_utf8(read("snp-aws/report.txt")).unwrap();
    let report = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .unwrap();
    let certs = SnpCerts::from_pem(
        &read("snp-aws/vlek.pem"),
        Some(&read("snp-aws/certchain.pem")),
    )
    .unwrap();
    Case {
        report,
        certs,
        report_data: hex::decode(AWS_REPORT_DATA).unwrap().try_into().unwrap(),
    }
}

/// The default policy, told to accept any launch measurement: the tests of the other
/// checks verify reports of three different launches with one policy.
fn any_launch() -> SnpPolicy {
    SnpPolicy {
        insecure_no_launch_measurement: Some(InsecureNoLaunchMeasurement::insecure_new()),
        ..SnpPolicy::default()
    }
}

/// The Milan sample's own TCB (boot loader 3, TEE 0, SNP 8, microcode 115): under the default
/// Milan floor's SNP firmware, so tests that need the sample to pass set it as the floor.
const MILAN_SAMPLE_TCB: MinimumTcb = MinimumTcb {
    bootloader: 3,
    tee: 0,
    snp: 8,
    microcode: 115,
    fmc: 0,
};

/// Any launch, and the Milan floor at the Azure report's own TCB (older than the default
/// Milan floor, and the lowest of the three real reports); no floor for Genoa and Turin, as
/// by default.
fn no_floor() -> SnpPolicy {
    SnpPolicy {
        minimum_tcb: snp_policy_at_the_azure_tcb().minimum_tcb,
        ..any_launch()
    }
}

fn verify(case: &Case, policy: SnpPolicy) -> Result<(), ValidationError> {
    SnpVerifier::new(policy)
        .verify(&case.report, &case.certs, &case.report_data, now())
        .map(|_| ())
}

fn field_error(err: ValidationError) -> (String, String, String) {
    match err {
        ValidationError::Field {
            field,
            expected,
            observed,
        } => (field, expected, observed),
        other => panic!("expected a field error, got {other:?}"),
    }
}

fn cert_error(err: ValidationError) -> (String, String) {
    match err {
        ValidationError::Certificate { which, reason } => (which, reason),
        other => panic!("expected a certificate error, got {other:?}"),
    }
}

fn flip(bytes: &[u8], offset: usize) -> Vec<u8> {
    let mut copy = bytes.to_vec();
    copy[offset] ^= 0x01;
    copy
}

#[test]
fn the_three_real_reports_verify_and_their_product_is_detected() {
    let v = SnpVerifier::new(no_floor());
    for (name, case, signer) in [
        ("milan", milan(), SignerKind::Vcek),
        ("azure", azure(), SignerKind::Vcek),
        ("aws", aws(), SignerKind::Vlek),
    ] {
        let ok = v
            .verify(&case.report, &case.certs, &case.report_data, now())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(ok.product(), Product::Milan, "{name}");
        assert_eq!(ok.signer(), signer, "{name}");
        assert_eq!(ok.report_data(), &case.report_data, "{name}");
        let report = SnpReport::parse(&case.report).unwrap();
        assert_eq!(ok.chip_id(), &report.chip_id, "{name}");
        assert_eq!(ok.measurement(), &report.measurement, "{name}");
        assert_eq!(
            ok.tcb(),
            report.reported_tcb.parts(Product::Milan),
            "{name}"
        );
        assert_eq!(ok.report(), &report, "{name}");
        assert!(ok.explanation().first_failure().is_none(), "{name}");
    }
}

#[test]
fn the_default_milan_floor_accepts_the_aws_report_and_refuses_the_older_milan_and_azure_tcbs() {
    verify(&aws(), any_launch()).unwrap();
    // The Milan sample's SNP firmware (SVN 8) predates the fix AMD-SB-3019 attests.
    let (field, expected, observed) = field_error(verify(&milan(), any_launch()).unwrap_err());
    assert_eq!(
        (field.as_str(), expected.as_str(), observed.as_str()),
        ("reported_tcb.snp", ">= 24", "8")
    );
    assert_eq!(
        SnpPolicy::default().minimum_tcb.milan.map(|t| t.snp),
        Some(MILAN_SNP_FLOOR)
    );
    let (field, expected, observed) = field_error(verify(&azure(), any_launch()).unwrap_err());
    assert_eq!(
        (field.as_str(), expected.as_str(), observed.as_str()),
        ("reported_tcb.bootloader", ">= 3", "2")
    );
}

#[test]
fn the_parsed_fields_are_those_of_the_real_reports() {
    let m = SnpReport::parse(&milan().report).unwrap();
    assert_eq!(m.version, 2);
    assert_eq!(m.cpuid, None);
    let tcb = m.reported_tcb.parts(Product::Milan);
    assert_eq!(
        (tcb.bootloader, tcb.tee, tcb.snp, tcb.microcode, tcb.fmc),
        (3, 0, 8, 115, None)
    );
    assert_eq!(m.key_info.signer(), Some(SignerKind::Vcek));
    assert!(m.policy.smt_allowed() && !m.policy.debug_allowed());
    assert_eq!(m.current_version.to_string(), "1.52.4");

    let a = SnpReport::parse(&aws().report).unwrap();
    assert_eq!(a.version, 3);
    let cpuid = a.cpuid.unwrap();
    assert_eq!((cpuid.family, cpuid.model, cpuid.stepping), (0x19, 1, 1));
    assert_eq!(cpuid.product(), Some(Product::Milan));
    assert_eq!(a.key_info.signer(), Some(SignerKind::Vlek));
    assert_eq!(a.chip_id, [0; 64], "AWS masks the chip ID");
}

#[test]
fn azure_report_data_is_the_sha256_of_the_runtime_data_then_zeros() {
    let case = azure();
    let report = SnpReport::parse(&case.report).unwrap();
    assert_eq!(report.report_data, case.report_data);
}

#[test]
fn the_explanation_lists_every_checked_field_in_order() {
    let case = milan();
    let (explanation, result) = SnpVerifier::new(no_floor()).verify_explained(
        &case.report,
        &case.certs,
        &case.report_data,
        now(),
    );
    result.unwrap();
    let fields: Vec<&str> = explanation.checks.iter().map(|c| &*c.field).collect();
    for want in [
        "version",
        "key_info.signing_key",
        "ARK",
        "ARK.validity",
        "ASK",
        "ASK.validity",
        "VCEK",
        "VCEK.validity",
        "VCEK.productName",
        "chip_id",
        "reported_tcb.bootloader",
        "signature",
        "report_data",
        "reported_tcb.snp",
        "policy.debug",
        "policy.migrate_ma",
        "policy.smt",
        "vmpl",
        "measurement",
        "host_data",
        "id_key_digest",
        "author_key_digest",
    ] {
        assert!(fields.contains(&want), "{want} missing from {fields:?}");
    }
    let pos = |f: &str| fields.iter().position(|x| *x == f).unwrap();
    assert!(pos("ARK") < pos("ASK") && pos("ASK") < pos("VCEK"));
    assert!(pos("chip_id") < pos("signature") && pos("signature") < pos("report_data"));
    // No launch measurement configured: compared with nothing, shown as a warning.
    let warned: Vec<_> = explanation.warnings().map(|c| &*c.field).collect();
    assert_eq!(warned, ["measurement"]);
}

#[test]
fn one_flipped_bit_anywhere_in_the_signed_fields_breaks_the_signature() {
    // guest_svn, policy, family_id, image_id, vmpl, current_tcb, platform_info,
    // report_data, measurement, host_data, id_key_digest, author_key_digest, report_id,
    // report_id_ma, committed_tcb, current version, launch_tcb.
    let offsets = [
        0x04, 0x08, 0x10, 0x20, 0x30, 0x38, 0x40, 0x50, 0x8F, 0x90, 0xBF, 0xC0, 0xE0, 0x110, 0x140,
        0x160, 0x1E0, 0x1E8, 0x1F0,
    ];
    for (name, case) in [("milan", milan()), ("azure", azure()), ("aws", aws())] {
        let v = SnpVerifier::new(no_floor());
        for offset in offsets {
            let tampered = Case {
                report: flip(&case.report, offset),
                certs: case.certs.clone(),
                report_data: case.report_data,
            };
            match v.verify(&tampered.report, &tampered.certs, &case.report_data, now()) {
                Err(ValidationError::BadSignature(_)) => {}
                other => panic!("{name} offset {offset:#x}: {other:?}"),
            }
        }
    }
}

#[test]
fn one_flipped_bit_in_the_signature_breaks_it() {
    for (name, case) in [("milan", milan()), ("azure", azure()), ("aws", aws())] {
        for offset in [0x2A0, 0x2A0 + 47, 0x2E8, 0x2E8 + 47] {
            let tampered = flip(&case.report, offset);
            match SnpVerifier::new(no_floor()).verify(
                &tampered,
                &case.certs,
                &case.report_data,
                now(),
            ) {
                Err(ValidationError::BadSignature(_)) => {}
                other => panic!("{name} offset {offset:#x}: {other:?}"),
            }
        }
    }
}

#[test]
fn a_report_whose_tcb_differs_from_the_vcek_is_refused_naming_the_component() {
    let case = milan();
    // Byte 6 of reported_tcb is the SNP version on Milan, byte 7 the microcode.
    for (offset, field, ext) in [
        (0x180, "reported_tcb.bootloader", "blSPL"),
        (0x181, "reported_tcb.tee", "teeSPL"),
        (0x186, "reported_tcb.snp", "snpSPL"),
        (0x187, "reported_tcb.microcode", "ucodeSPL"),
    ] {
        let tampered = flip(&case.report, offset);
        let err = SnpVerifier::new(no_floor())
            .verify(&tampered, &case.certs, &case.report_data, now())
            .unwrap_err();
        let (f, expected, _) = field_error(err);
        assert_eq!(f, field);
        assert!(expected.contains(&format!("VCEK {ext}")), "{expected}");
    }
}

#[test]
fn a_vcek_of_another_chip_is_refused_for_its_chip_id() {
    let milan_case = milan();
    let azure_case = azure();
    // The Milan sample's report with the Azure machine's VCEK, and the other way round.
    let azure_vcek = SnpCerts::from_der(&read("snp-azure/vcek.cert"), None, None).unwrap();
    let err = SnpVerifier::new(no_floor())
        .verify(
            &milan_case.report,
            &azure_vcek,
            &milan_case.report_data,
            now(),
        )
        .unwrap_err();
    assert_eq!(field_error(err).0, "chip_id");
    let err = SnpVerifier::new(no_floor())
        .verify(
            &azure_case.report,
            &milan_case.certs,
            &azure_case.report_data,
            now(),
        )
        .unwrap_err();
    assert_eq!(field_error(err).0, "chip_id");
    // One flipped bit of the report's chip ID.
    let tampered = flip(&milan_case.report, 0x1A0);
    let err = SnpVerifier::new(no_floor())
        .verify(&tampered, &milan_case.certs, &milan_case.report_data, now())
        .unwrap_err();
    assert_eq!(field_error(err).0, "chip_id");
}

#[test]
fn a_turin_vcek_and_chain_are_recognised_as_turin_and_refused_for_a_milan_report() {
    let case = milan();
    let certs = SnpCerts::from_pem(
        pem("CERTIFICATE", &read("snp-milan/vcek_turin.der")).as_bytes(),
        Some(&read("snp-milan/cert_chain_turin")),
    )
    .unwrap();
    let (explanation, result) = SnpVerifier::new(no_floor()).verify_explained(
        &case.report,
        &certs,
        &case.report_data,
        now(),
    );
    // Recognised as Turin by the VCEK's productName, and refused for the report's chip
    // before its chain is verified: no RSA work for a report its leaf does not match.
    let product = explanation
        .checks
        .iter()
        .find(|c| c.field == "VCEK.productName")
        .unwrap();
    assert_eq!(product.expected, "Turin");
    assert!(
        explanation.checks.iter().all(|c| c.field != "ARK"),
        "{explanation:?}"
    );
    let (field, expected, _) = field_error(result.unwrap_err());
    assert_eq!(field, "chip_id");
    assert!(
        expected.starts_with("VCEK hwID 1e550a8ee5cf9f4d"),
        "{expected}"
    );
}

#[test]
fn a_milan_vcek_under_the_turin_chain_is_refused() {
    let case = milan();
    let certs = SnpCerts::from_pem(
        pem("CERTIFICATE", &read("snp-milan/vcek_milan.der")).as_bytes(),
        Some(&read("snp-milan/cert_chain_turin")),
    )
    .unwrap();
    let (which, reason) = cert_error(
        SnpVerifier::new(no_floor())
            .verify(&case.report, &certs, &case.report_data, now())
            .unwrap_err(),
    );
    assert_eq!(which, "VCEK");
    assert!(reason.contains("SEV-Turin"), "{reason}");
}

fn pem(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}

/// The DER certificates of a PEM file.
fn ders(path: &str) -> Vec<Vec<u8>> {
    let text = String::from_utf8(read(path)).unwrap();
    text.split("-----BEGIN CERTIFICATE-----")
        .skip(1)
        .map(|block| {
            let body: String = block
                .split("-----END CERTIFICATE-----")
                .next()
                .unwrap()
                .split_whitespace()
                .collect();
            base64::engine::general_purpose::STANDARD
                .decode(body)
                .unwrap()
        })
        .collect()
}

/// A self-made root and intermediate named like AMD's (rcgen, P-384).
fn fake_amd_chain() -> (Vec<u8>, Vec<u8>) {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    };
    let ca = |cn: &str| {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(DnType::CommonName, cn);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        p
    };
    let root_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
    let root_params = ca("ARK-Milan");
    let root = root_params.self_signed(&root_key).unwrap();
    let issuer = Issuer::new(root_params, root_key);
    let ask_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
    let ask = ca("SEV-Milan").signed_by(&ask_key, &issuer).unwrap();
    (root.der().to_vec(), ask.der().to_vec())
}

#[test]
fn a_chain_ending_at_a_self_made_root_is_refused() {
    let case = milan();
    let vcek = read("snp-milan/vcek_milan.der");
    let (fake_root, fake_ask) = fake_amd_chain();
    let certs = SnpCerts::from_der(&vcek, Some(&fake_ask), Some(&fake_root)).unwrap();
    let (which, reason) = cert_error(
        SnpVerifier::new(no_floor())
            .verify(&case.report, &certs, &case.report_data, now())
            .unwrap_err(),
    );
    assert_eq!(which, "ASK");
    assert!(
        reason.contains("none of the embedded AMD roots"),
        "{reason}"
    );
}

#[test]
fn a_root_other_than_the_embedded_one_is_refused() {
    let case = azure();
    let chain = ders("snp-azure/certchain.pem");
    let vcek = read("snp-azure/vcek.cert");
    let (fake_root, _) = fake_amd_chain();
    let turin_ark = ders("snp-milan/cert_chain_turin").pop().unwrap();
    for root in [fake_root, turin_ark] {
        let certs = SnpCerts::from_der(&vcek, Some(&chain[0]), Some(&root)).unwrap();
        let (explanation, result) = SnpVerifier::new(no_floor()).verify_explained(
            &case.report,
            &certs,
            &case.report_data,
            now(),
        );
        // A chain failure ends the explanation: nothing after it was checked.
        let last = explanation.checks.last().unwrap();
        assert_eq!((&*last.field, last.outcome), ("ARK", Outcome::Fail));
        assert!(!explanation.checks.iter().any(|c| c.field == "signature"));
        let (which, reason) = cert_error(result.unwrap_err());
        assert_eq!(which, "ARK");
        assert!(
            reason.contains("not the embedded AMD ARK-Milan"),
            "{reason}"
        );
    }
    // The real ARK given explicitly is accepted.
    let certs = SnpCerts::from_der(&vcek, Some(&chain[0]), Some(&chain[1])).unwrap();
    verify(&Case { certs, ..azure() }, no_floor()).unwrap();
}

/// Flips a bit near the end of a certificate: inside its signature value.
fn tamper_signature(der: &[u8]) -> Vec<u8> {
    flip(der, der.len() - 10)
}

#[test]
fn a_certificate_whose_signature_was_tampered_with_is_refused_by_name() {
    let case = azure();
    let chain = ders("snp-azure/certchain.pem");
    let vcek = read("snp-azure/vcek.cert");
    for (which, certs) in [
        (
            "ASK",
            SnpCerts::from_der(&vcek, Some(&tamper_signature(&chain[0])), None).unwrap(),
        ),
        (
            "VCEK",
            SnpCerts::from_der(&tamper_signature(&vcek), Some(&chain[0]), None).unwrap(),
        ),
    ] {
        let (w, reason) = cert_error(
            SnpVerifier::new(no_floor())
                .verify(&case.report, &certs, &case.report_data, now())
                .unwrap_err(),
        );
        assert_eq!(w, which);
        assert!(reason.contains("signature does not verify"), "{reason}");
    }
}

#[test]
fn an_asvk_in_place_of_the_ask_and_a_vlek_in_place_of_the_vcek_are_refused() {
    let case = azure();
    let vcek = read("snp-azure/vcek.cert");
    let asvk = &ders("snp-aws/certchain.pem")[0];
    let certs = SnpCerts::from_der(&vcek, Some(asvk), None).unwrap();
    let (which, reason) = cert_error(
        SnpVerifier::new(no_floor())
            .verify(&case.report, &certs, &case.report_data, now())
            .unwrap_err(),
    );
    assert_eq!(which, "ASK");
    assert!(reason.contains("SEV-VLEK-Milan"), "{reason}");

    let vlek = SnpCerts::from_pem(
        &read("snp-aws/vlek.pem"),
        Some(&read("snp-azure/certchain.pem")),
    )
    .unwrap();
    let (which, reason) = cert_error(
        SnpVerifier::new(no_floor())
            .verify(&case.report, &vlek, &case.report_data, now())
            .unwrap_err(),
    );
    assert_eq!(which, "VCEK");
    assert!(reason.contains("SEV-VLEK"), "{reason}");
}

#[test]
fn a_certificate_outside_its_validity_is_refused_by_name() {
    // The Milan VCEK: 2023-04-03 to 2030-04-03; the AWS VLEK: 2024-12-10 to 2025-12-10.
    for (case, time, which) in [
        (milan(), at(1_672_531_200), "VCEK"), // 2023-01-01
        (milan(), at(1_924_992_000), "VCEK"), // 2031-01-01
        (aws(), at(1_767_225_600), "VLEK"),   // 2026-01-01
    ] {
        let (w, reason) = cert_error(
            SnpVerifier::new(no_floor())
                .verify(&case.report, &case.certs, &case.report_data, time)
                .unwrap_err(),
        );
        assert_eq!(w, which);
        assert!(reason.contains("valid from"), "{reason}");
    }
}

#[test]
fn a_cached_chain_is_reused_but_still_checked_at_now_and_against_the_report() {
    let case = milan();
    let v = SnpVerifier::new(no_floor());
    v.verify(&case.report, &case.certs, &case.report_data, now())
        .unwrap();
    let (explanation, result) =
        v.verify_explained(&case.report, &case.certs, &case.report_data, now());
    result.unwrap();
    let chain = explanation
        .checks
        .iter()
        .find(|c| c.field == "chain")
        .unwrap();
    assert_eq!(chain.expected, "verified earlier");
    assert!(!explanation.checks.iter().any(|c| c.field == "ASK"));

    let expired = v
        .verify(
            &case.report,
            &case.certs,
            &case.report_data,
            at(1_924_992_000),
        )
        .unwrap_err();
    assert_eq!(cert_error(expired).0, "VCEK");

    // Same certificates, other report content: the leaf checks run again.
    let tampered = flip(&case.report, 0x187);
    let err = v
        .verify(&tampered, &case.certs, &case.report_data, now())
        .unwrap_err();
    assert_eq!(field_error(err).0, "reported_tcb.microcode");

    // Another chip ID (unauthenticated until the signature is checked) is no way around
    // the cache: the chain is not verified again, and the leaf refuses the report.
    let other_chip = flip(&case.report, 0x1a0);
    let (explanation, result) =
        v.verify_explained(&other_chip, &case.certs, &case.report_data, now());
    assert!(result.is_err());
    let chain = explanation
        .checks
        .iter()
        .find(|c| c.field == "chain")
        .unwrap();
    assert_eq!(chain.expected, "verified earlier");
    assert!(!explanation.checks.iter().any(|c| c.field == "ASK"));
}

#[test]
fn azure_thim_json_is_read_and_its_tcbm_must_match_the_report() {
    let case = azure();
    let thim = |tcbm: &str| {
        serde_json::json!({
            "vcekCert": String::from_utf8(read("snp-azure/vcek.pem")).unwrap(),
            "certificateChain": String::from_utf8(read("snp-azure/certchain.pem")).unwrap(),
            "tcbm": tcbm,
            "cacheControl": "86400",
        })
        .to_string()
    };
    let certs = SnpCerts::from_thim_json(thim("5D06000000000002").as_bytes()).unwrap();
    assert_eq!(certs.tcbm(), Some(0x5D06_0000_0000_0002));
    verify(&Case { certs, ..azure() }, no_floor()).unwrap();

    let certs = SnpCerts::from_thim_json(thim("5D07000000000002").as_bytes()).unwrap();
    let err = SnpVerifier::new(no_floor())
        .verify(&case.report, &certs, &case.report_data, now())
        .unwrap_err();
    let (field, expected, _) = field_error(err);
    assert_eq!(field, "reported_tcb");
    assert!(expected.starts_with("THIM tcbm"), "{expected}");

    for bad in [
        &b"{}"[..],
        b"not json",
        br#"{"vcekCert":"x","certificateChain":"y"}"#,
    ] {
        assert!(matches!(
            SnpCerts::from_thim_json(bad),
            Err(ValidationError::Malformed(_))
        ));
    }
}

#[test]
fn a_report_data_mismatch_is_a_binding_mismatch() {
    for case in [milan(), azure(), aws()] {
        let mut other = case.report_data;
        other[63] ^= 1;
        let err = SnpVerifier::new(no_floor())
            .verify(&case.report, &case.certs, &other, now())
            .unwrap_err();
        assert_eq!(err, ValidationError::BindingMismatch);
    }
}

#[test]
fn each_tcb_part_below_its_minimum_is_refused_naming_it() {
    // The Milan report's TCB: boot loader 3, TEE 0, SNP 8, microcode 115.
    let case = milan();
    let base = MinimumTcb {
        bootloader: 3,
        tee: 0,
        snp: 8,
        microcode: 115,
        fmc: 0,
    };
    for (min, field, expected) in [
        (
            MinimumTcb {
                bootloader: 4,
                ..base
            },
            "reported_tcb.bootloader",
            ">= 4",
        ),
        (MinimumTcb { tee: 1, ..base }, "reported_tcb.tee", ">= 1"),
        (MinimumTcb { snp: 9, ..base }, "reported_tcb.snp", ">= 9"),
        (
            MinimumTcb {
                microcode: 116,
                ..base
            },
            "reported_tcb.microcode",
            ">= 116",
        ),
    ] {
        let policy = SnpPolicy {
            minimum_tcb: PerProduct {
                milan: Some(min),
                ..PerProduct::default()
            },
            ..no_floor()
        };
        let (f, e, _) = field_error(verify(&case, policy).unwrap_err());
        assert_eq!((f.as_str(), e.as_str()), (field, expected));
    }
    // Exactly at the minimum passes.
    let policy = SnpPolicy {
        minimum_tcb: PerProduct {
            milan: Some(base),
            ..PerProduct::default()
        },
        ..no_floor()
    };
    verify(&case, policy).unwrap();
}

#[test]
fn the_fmc_minimum_applies_to_turin_layouts() {
    // No Turin report is public: the Milan report's TCB read with Turin's layout
    // (byte 0 FMC = 3), through the same field checks the verifier runs.
    let case = milan();
    let report = SnpReport::parse(&case.report).unwrap();
    let policy = SnpPolicy {
        minimum_tcb: PerProduct {
            turin: Some(MinimumTcb {
                fmc: 4,
                ..MinimumTcb::default()
            }),
            ..PerProduct::default()
        },
        ..no_floor()
    };
    let err = check_fields(
        &report,
        Product::Turin,
        &policy,
        &case.report_data,
        &mut Explanation::default(),
    )
    .unwrap_err();
    let (field, expected, observed) = field_error(err);
    assert_eq!(
        (field.as_str(), expected.as_str(), observed.as_str()),
        ("reported_tcb.fmc", ">= 4", "3")
    );
}

#[test]
fn the_default_genoa_floor_is_amd_sb_3019s_and_turin_without_a_floor_is_refused_naming_the_knob() {
    // No Genoa or Turin report is public: the Milan report's fields read as each of them
    // (Genoa lays out its TCB as Milan does), through the same field checks the verifier
    // runs, under the default policy.
    let case = milan();
    let report = SnpReport::parse(&case.report).unwrap();
    let run = |report: &SnpReport, product| {
        check_fields(
            report,
            product,
            &SnpPolicy {
                minimum_tcb: SnpPolicy::default().minimum_tcb,
                ..any_launch()
            },
            &case.report_data,
            &mut Explanation::default(),
        )
    };
    // The sample's SNP firmware (SVN 8) is under the Genoa floor.
    let (field, expected, observed) = field_error(run(&report, Product::Genoa).unwrap_err());
    assert_eq!(
        (field.as_str(), expected.as_str(), observed.as_str()),
        ("reported_tcb.snp", ">= 23", "8")
    );
    assert_eq!(GENOA_SNP_FLOOR, 0x17);
    // At the floor in all three TCBs it passes; one under it in any of them does not.
    let mut at_floor = report.clone();
    for tcb in [
        &mut at_floor.reported_tcb,
        &mut at_floor.launch_tcb,
        &mut at_floor.committed_tcb,
    ] {
        tcb.0[6] = GENOA_SNP_FLOOR; // the SNP firmware SPL on Genoa, as on Milan
    }
    run(&at_floor, Product::Genoa).unwrap();
    let mut launched_under = at_floor.clone();
    launched_under.launch_tcb.0[6] = GENOA_SNP_FLOOR - 1;
    let (field, _, _) = field_error(run(&launched_under, Product::Genoa).unwrap_err());
    assert_eq!(field, "launch_tcb.snp");

    // Turin has no default floor: every report is refused, naming the setting.
    let (field, expected, _) = field_error(run(&at_floor, Product::Turin).unwrap_err());
    assert_eq!(field, "reported_tcb");
    assert!(expected.contains("snp.minimumTcb.turin"), "{expected}");
}

fn with_policy_bit(report: &[u8], bit: u32) -> Vec<u8> {
    let mut copy = report.to_vec();
    let mut policy = u64::from_le_bytes(copy[8..16].try_into().unwrap());
    policy |= 1 << bit;
    copy[8..16].copy_from_slice(&policy.to_le_bytes());
    copy
}

#[test]
fn the_launch_and_committed_tcbs_must_meet_the_floor_too() {
    // The Milan sample's TCBs are exactly the floor set here.
    let case = milan();
    let real = SnpReport::parse(&case.report).unwrap();
    let policy = SnpPolicy {
        minimum_tcb: PerProduct {
            milan: Some(MILAN_SAMPLE_TCB),
            ..PerProduct::default()
        },
        ..any_launch()
    };
    let run = |report: &SnpReport| {
        check_fields(
            report,
            Product::Milan,
            &policy,
            &case.report_data,
            &mut Explanation::default(),
        )
    };
    run(&real).unwrap();
    for (which, expected) in [
        ("launch_tcb", "launch_tcb.snp"),
        ("committed_tcb", "committed_tcb.snp"),
    ] {
        let mut report = real.clone();
        let raw = if which == "launch_tcb" {
            &mut report.launch_tcb
        } else {
            &mut report.committed_tcb
        };
        raw.0[6] -= 1; // the SNP firmware SPL on Milan
        let (field, want, observed) = field_error(run(&report).unwrap_err());
        assert_eq!(
            (field.as_str(), want.as_str(), observed.as_str()),
            (expected, ">= 8", "7")
        );
    }
}

#[test]
fn a_debug_policy_is_always_refused() {
    let case = milan();
    let debug = with_policy_bit(&case.report, 19);
    let report = SnpReport::parse(&debug).unwrap();
    assert!(report.policy.debug_allowed());
    let policy = SnpPolicy {
        allow_migration_agent: true,
        allow_smt: true,
        ..no_floor()
    };
    let err = check_fields(
        &report,
        Product::Milan,
        &policy,
        &case.report_data,
        &mut Explanation::default(),
    )
    .unwrap_err();
    let (field, expected, observed) = field_error(err);
    assert_eq!(
        (field.as_str(), expected.as_str(), observed.as_str()),
        ("policy.debug", "0", "1")
    );
    // Through the verifier, the tampered copy fails its signature first.
    assert!(matches!(
        SnpVerifier::new(policy).verify(&debug, &case.certs, &case.report_data, now()),
        Err(ValidationError::BadSignature(_))
    ));
}

#[test]
fn a_migration_agent_is_refused_unless_allowed() {
    let case = milan();
    let ma = with_policy_bit(&case.report, 18);
    let report = SnpReport::parse(&ma).unwrap();
    let err = check_fields(
        &report,
        Product::Milan,
        &no_floor(),
        &case.report_data,
        &mut Explanation::default(),
    )
    .unwrap_err();
    assert_eq!(field_error(err).0, "policy.migrate_ma");
    let allowed = SnpPolicy {
        allow_migration_agent: true,
        ..no_floor()
    };
    check_fields(
        &report,
        Product::Milan,
        &allowed,
        &case.report_data,
        &mut Explanation::default(),
    )
    .unwrap();
}

#[test]
fn smt_and_vmpl_are_as_configured() {
    // The real reports allow SMT and were requested at VMPL 0.
    for case in [milan(), azure(), aws()] {
        let no_smt = SnpPolicy {
            allow_smt: false,
            ..no_floor()
        };
        let (field, expected, observed) = field_error(verify(&case, no_smt).unwrap_err());
        assert_eq!(
            (field.as_str(), expected.as_str(), observed.as_str()),
            ("policy.smt", "0", "1")
        );
        let vmpl1 = SnpPolicy {
            vmpl: Some(1),
            ..no_floor()
        };
        let (field, expected, observed) = field_error(verify(&case, vmpl1).unwrap_err());
        assert_eq!(
            (field.as_str(), expected.as_str(), observed.as_str()),
            ("vmpl", "1", "0")
        );
        let any_vmpl = SnpPolicy {
            vmpl: None,
            ..no_floor()
        };
        verify(&case, any_vmpl).unwrap();
    }
}

#[test]
fn a_measurement_or_host_data_mismatch_is_refused_and_warn_only_passes() {
    let case = azure();
    let real = SnpReport::parse(&case.report).unwrap();
    let mut other = real.measurement;
    other[0] ^= 1;
    let enforce = SnpPolicy {
        measurement: Some(Reference::enforce(other)),
        ..no_floor()
    };
    let (field, expected, observed) = field_error(verify(&case, enforce).unwrap_err());
    assert_eq!(field, "measurement");
    assert_eq!(expected, hex::encode(other));
    assert_eq!(observed, hex::encode(real.measurement));

    let warn = SnpPolicy {
        measurement: Some(Reference::warn_only(other)),
        ..no_floor()
    };
    verify(&case, warn).unwrap();
    let exact = SnpPolicy {
        measurement: Some(Reference::enforce(real.measurement)),
        ..no_floor()
    };
    verify(&case, exact).unwrap();

    let host = SnpPolicy {
        host_data: Some(Reference::enforce([1; 32])),
        ..no_floor()
    };
    assert_eq!(field_error(verify(&case, host).unwrap_err()).0, "host_data");
}

#[test]
fn a_report_is_refused_without_a_reference_launch_measurement_unless_told_insecure() {
    let case = azure();
    let real = SnpReport::parse(&case.report).unwrap();
    let strict = SnpPolicy {
        minimum_tcb: no_floor().minimum_tcb,
        ..SnpPolicy::default()
    };
    let (field, expected, observed) = field_error(verify(&case, strict.clone()).unwrap_err());
    assert_eq!(field, "measurement");
    assert!(expected.contains("none is configured"), "{expected}");
    assert_eq!(observed, hex::encode(real.measurement));

    let insecure = SnpPolicy {
        insecure_no_launch_measurement: Some(InsecureNoLaunchMeasurement::insecure_new()),
        ..strict
    };
    let ok = SnpVerifier::new(insecure)
        .verify(&case.report, &case.certs, &case.report_data, now())
        .unwrap();
    let warned: Vec<_> = ok
        .explanation()
        .warnings()
        .map(|c| c.field.clone())
        .collect();
    assert_eq!(warned, ["measurement"]);
}

#[test]
fn id_and_author_key_digests_outside_the_allowed_sets_are_refused() {
    let case = milan();
    let real = SnpReport::parse(&case.report).unwrap();
    let id = SnpPolicy {
        id_key_digests: Some(vec![[7; 48]]),
        ..no_floor()
    };
    assert_eq!(
        field_error(verify(&case, id).unwrap_err()).0,
        "id_key_digest"
    );
    let author = SnpPolicy {
        author_key_digests: Some(vec![[7; 48]]),
        ..no_floor()
    };
    assert_eq!(
        field_error(verify(&case, author).unwrap_err()).0,
        "author_key_digest"
    );
    let both = SnpPolicy {
        id_key_digests: Some(vec![[7; 48], real.id_key_digest]),
        author_key_digests: Some(vec![real.author_key_digest]),
        ..no_floor()
    };
    verify(&case, both).unwrap();
}

#[test]
fn one_rejection_lists_every_failed_field() {
    let case = azure();
    let policy = SnpPolicy {
        allow_smt: false,
        vmpl: Some(2),
        host_data: Some(Reference::enforce([1; 32])),
        ..any_launch()
    };
    let mut wrong = case.report_data;
    wrong[0] ^= 1;
    let (explanation, result) =
        SnpVerifier::new(policy).verify_explained(&case.report, &case.certs, &wrong, now());
    assert_eq!(result.unwrap_err(), ValidationError::BindingMismatch);
    let failed: Vec<_> = explanation
        .checks
        .iter()
        .filter(|c| c.outcome == Outcome::Fail)
        .map(|c| &*c.field)
        .collect();
    assert_eq!(
        failed,
        [
            "report_data",
            "reported_tcb.bootloader",
            "reported_tcb.snp",
            "reported_tcb.microcode",
            "launch_tcb.bootloader",
            "launch_tcb.snp",
            "launch_tcb.microcode",
            "committed_tcb.bootloader",
            "committed_tcb.snp",
            "committed_tcb.microcode",
            "policy.smt",
            "vmpl",
            "host_data"
        ]
    );
}

#[test]
fn signers_are_accepted_only_as_the_policy_allows() {
    let no_vlek = SnpPolicy {
        allow_vlek: false,
        ..no_floor()
    };
    let (field, expected, observed) = field_error(verify(&aws(), no_vlek.clone()).unwrap_err());
    assert_eq!(
        (field.as_str(), expected.as_str(), observed.as_str()),
        ("key_info.signing_key", "VCEK", "VLEK")
    );
    verify(&milan(), no_vlek).unwrap();
    let no_vcek = SnpPolicy {
        allow_vcek: false,
        ..no_floor()
    };
    let (field, _, observed) = field_error(verify(&milan(), no_vcek.clone()).unwrap_err());
    assert_eq!(
        (field.as_str(), observed.as_str()),
        ("key_info.signing_key", "VCEK")
    );
    verify(&aws(), no_vcek).unwrap();
}

#[test]
fn malformed_reports_are_refused_before_anything_else() {
    let case = milan();
    let mut long = case.report.clone();
    long.push(0);
    let mut wrong_version = case.report.clone();
    wrong_version[0] = 1;
    let mut future_version = case.report.clone();
    future_version[0] = 6;
    let mut sig_algo = case.report.clone();
    sig_algo[0x34] = 2;
    let mut key_info = case.report.clone();
    key_info[0x48] |= 0x20;
    for (name, bytes) in [
        ("trailing byte", long),
        ("short", case.report[..REPORT_SIZE - 1].to_vec()),
        ("empty", Vec::new()),
        ("the Azure HCL framing", read("snp-azure/attestation.bin")),
        ("version 1", wrong_version),
        ("version 6", future_version),
        ("signature algorithm 2", sig_algo),
        ("reserved key information bit", key_info),
        ("reserved after key information", flip(&case.report, 0x4C)),
        ("reserved after the CPUID fields", flip(&case.report, 0x19F)),
        (
            "reserved after the current version",
            flip(&case.report, 0x1EB),
        ),
        ("reserved after the launch TCB", flip(&case.report, 0x1F8)),
        ("reserved before the signature", flip(&case.report, 0x29F)),
        ("R wider than 48 bytes", flip(&case.report, 0x2A0 + 48)),
        ("S wider than 48 bytes", flip(&case.report, 0x2E8 + 71)),
        (
            "reserved after the signature",
            flip(&case.report, REPORT_SIZE - 1),
        ),
    ] {
        let (explanation, result) = SnpVerifier::new(no_floor()).verify_explained(
            &bytes,
            &case.certs,
            &case.report_data,
            now(),
        );
        match result {
            Err(ValidationError::Malformed(_)) => {}
            other => panic!("{name}: {other:?}"),
        }
        assert_eq!(
            explanation.first_failure().unwrap().field,
            "report",
            "{name}"
        );
    }
}

#[test]
fn malformed_certificates_are_refused() {
    let vcek = read("snp-milan/vcek_milan.der");
    assert!(matches!(
        SnpCerts::from_der(&[], None, None),
        Err(ValidationError::Malformed(_))
    ));
    assert!(matches!(
        SnpCerts::from_der(&vec![0; 16 * 1024 + 1], None, None),
        Err(ValidationError::Malformed(_))
    ));
    assert!(matches!(
        SnpCerts::from_pem(&read("snp-azure/certchain.pem"), None),
        Err(ValidationError::Malformed(_))
    ));
    // Trailing bytes after a DER certificate.
    let mut long = vcek.clone();
    long.push(0);
    let certs = SnpCerts::from_der(&long, None, None).unwrap();
    let case = milan();
    let (which, _) = cert_error(
        SnpVerifier::new(no_floor())
            .verify(&case.report, &certs, &case.report_data, now())
            .unwrap_err(),
    );
    assert_eq!(which, "VCEK");
}

#[test]
fn the_kds_url_of_a_report_names_its_chip_and_tcb() {
    let report = SnpReport::parse(&milan().report).unwrap();
    assert_eq!(
        kds::vcek_url(Product::Milan, &report.chip_id, report.reported_tcb),
        format!(
            "https://kdsintf.amd.com/vcek/v1/Milan/{}?blSPL=3&teeSPL=0&snpSPL=8&ucodeSPL=115",
            hex::encode(report.chip_id)
        )
    );
    assert_eq!(
        kds::vcek_chain_url(Product::Turin),
        "https://kdsintf.amd.com/vcek/v1/Turin/cert_chain"
    );
    assert_eq!(
        kds::vlek_chain_url(Product::Milan),
        "https://kdsintf.amd.com/vlek/v1/Milan/cert_chain"
    );
}

/// A CRL naming ARK-Milan exactly as AMD's certificate does (same attributes, order and
/// string types), signed by a key of our own: what anyone could put in a bundle.
fn crl_in_the_name_of_ark_milan() -> Vec<u8> {
    use rcgen::{
        CertificateParams, CertificateRevocationListParams, DnType, DnValue, Issuer, KeyIdMethod,
        KeyPair, SerialNumber, date_time_ymd,
    };
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    // rcgen starts with a common name of its own, which would come first.
    p.distinguished_name = rcgen::DistinguishedName::new();
    let utf8 = |s: &str| DnValue::Utf8String(s.into());
    p.distinguished_name
        .push(DnType::OrganizationalUnitName, utf8("Engineering"));
    p.distinguished_name.push(
        DnType::CountryName,
        DnValue::PrintableString("US".try_into().unwrap()),
    );
    p.distinguished_name
        .push(DnType::LocalityName, utf8("Santa Clara"));
    p.distinguished_name
        .push(DnType::StateOrProvinceName, utf8("CA"));
    p.distinguished_name
        .push(DnType::OrganizationName, utf8("Advanced Micro Devices"));
    p.distinguished_name
        .push(DnType::CommonName, utf8("ARK-Milan"));
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
    CertificateRevocationListParams {
        this_update: date_time_ymd(2025, 1, 1),
        next_update: date_time_ymd(2026, 1, 1),
        crl_number: SerialNumber::from(vec![1]),
        issuing_distribution_point: None,
        revoked_certs: Vec::new(),
        key_identifier_method: KeyIdMethod::Sha256,
    }
    .signed_by(&Issuer::new(p, key))
    .unwrap()
    .der()
    .to_vec()
}

#[test]
fn with_a_crl_bundle_the_ask_needs_a_crl_its_ark_signed() {
    use asterism_attestation::revocation::CrlBundle;
    use std::sync::Arc;
    let case = azure();
    let with = |files: Vec<(&str, Vec<u8>)>| {
        SnpVerifier::new(no_floor())
            .with_crls(Arc::new(CrlBundle::from_files(files).unwrap()))
            .verify(&case.report, &case.certs, &case.report_data, now())
            .map(|_| ())
    };
    // Without a bundle nothing is checked (every other test).
    verify(&case, no_floor()).unwrap();

    // A bundle without ARK-Milan's CRL cannot vouch for the ASK.
    let (which, reason) = cert_error(with(Vec::new()).unwrap_err());
    assert!(which.contains("ARK-Milan"), "{which}");
    assert!(reason.contains("none in the CRL bundle"), "{reason}");

    // A CRL in ARK-Milan's name that ARK-Milan did not sign is refused, not trusted.
    let forged = crl_in_the_name_of_ark_milan();
    let (which, reason) = cert_error(with(vec![("ark-milan.crl", forged)]).unwrap_err());
    assert!(
        which.contains("ark-milan.crl") && which.contains("ARK-Milan"),
        "{which}"
    );
    assert!(reason.contains("not signed by its issuer"), "{reason}");
}

/// A forged report with genuine certificates that the verifier has not seen costs one P-384
/// verification: its signature is checked under the key its leaf names before any RSA-4096
/// link of the chain, and nothing is cached for it.
#[test]
fn a_forged_report_with_uncached_genuine_certificates_is_refused_before_the_chain() {
    for (name, case) in [("milan", milan()), ("azure", azure()), ("aws", aws())] {
        let v = SnpVerifier::new(no_floor());
        let forged = flip(&case.report, 0x2A0);
        let (explanation, result) =
            v.verify_explained(&forged, &case.certs, &case.report_data, now());
        assert!(
            matches!(result, Err(ValidationError::BadSignature(_))),
            "{name}: {result:?}"
        );
        for link in ["ARK", "ASK", "ASVK", "chain"] {
            assert!(
                explanation.checks.iter().all(|c| c.field != link),
                "{name}: {link} was checked for a forged report: {explanation:?}"
            );
        }
        // Nothing was cached: the genuine report then verifies its whole chain.
        let (explanation, result) =
            v.verify_explained(&case.report, &case.certs, &case.report_data, now());
        result.unwrap();
        assert!(
            explanation.checks.iter().any(|c| c.field == "ARK"),
            "{name}: {explanation:?}"
        );
    }
}

/// With the chain cached, the report's signature is still checked every time.
#[test]
fn with_the_chain_cached_a_flipped_signature_is_still_refused() {
    for (name, case) in [("milan", milan()), ("azure", azure()), ("aws", aws())] {
        let v = SnpVerifier::new(no_floor());
        v.verify(&case.report, &case.certs, &case.report_data, now())
            .unwrap();
        let (explanation, result) = v.verify_explained(
            &flip(&case.report, 0x2E8),
            &case.certs,
            &case.report_data,
            now(),
        );
        assert!(
            explanation.checks.iter().any(|c| c.field == "chain"),
            "{name}: the chain was not taken from the cache: {explanation:?}"
        );
        assert!(
            matches!(result, Err(ValidationError::BadSignature(_))),
            "{name}: {result:?}"
        );
    }
}

/// A time before 1970 is as far before the certificates' validity as it is: its seconds
/// count back from the epoch, and are not read as the same count after it (which would put
/// 1914-07-04 at 2025-06-01, inside every certificate's validity).
#[test]
fn a_time_before_the_epoch_is_before_every_certificate_not_its_mirror_after_it() {
    for (name, case, leaf) in [("milan", milan(), "VCEK"), ("aws", aws(), "VLEK")] {
        let before_epoch = UNIX_EPOCH - Duration::from_secs(1_748_736_000);
        let (which, reason) = cert_error(
            SnpVerifier::new(no_floor())
                .verify(&case.report, &case.certs, &case.report_data, before_epoch)
                .unwrap_err(),
        );
        assert!(
            ["ARK", "ASK", "ASVK", leaf].contains(&which.as_str()),
            "{name}: {which}"
        );
        assert!(reason.contains("valid from"), "{name}: {reason}");
    }
}

/// The Milan sample's report made to claim the Turin VCEK's chip and TCB: its chip ID the
/// VCEK's 8-byte hwID padded with zeros, its reported TCB the VCEK's SPLs in Turin's
/// layout (FMC 0, boot loader 0, TEE 0, SNP 0, microcode 9), then `edit` applied.
fn as_turin_vceks_report(edit: impl Fn(&mut [u8])) -> Vec<u8> {
    let mut report = milan().report;
    report[0x180..0x188].copy_from_slice(&[0, 0, 0, 0, 0, 0, 0, 9]);
    report[0x1A0..0x1E0].fill(0);
    report[0x1A0..0x1A8].copy_from_slice(&[0x1e, 0x55, 0x0a, 0x8e, 0xe5, 0xcf, 0x9f, 0x4d]);
    edit(&mut report);
    report
}

/// A Turin VCEK names an 8-byte chip ID, which the report pads with zeros; its FMC SPL is
/// compared too. The report claiming exactly the leaf's chip and TCB gets past the leaf
/// checks to its signature (which the edit broke); a non-zero byte in the padding, or
/// another FMC, is refused by the leaf check naming the field.
#[test]
fn a_turin_vceks_short_chip_id_needs_zero_padding_and_its_fmc_must_match() {
    let case = milan();
    let certs = SnpCerts::from_pem(
        pem("CERTIFICATE", &read("snp-milan/vcek_turin.der")).as_bytes(),
        Some(&read("snp-milan/cert_chain_turin")),
    )
    .unwrap();
    let verify = |report: &[u8]| {
        SnpVerifier::new(no_floor()).verify(report, &certs, &case.report_data, now())
    };

    let matching = as_turin_vceks_report(|_| {});
    assert!(
        matches!(verify(&matching), Err(ValidationError::BadSignature(_))),
        "{:?}",
        verify(&matching)
    );

    for padding in [0x1A8, 0x1DF] {
        let report = as_turin_vceks_report(|r| r[padding] = 1);
        let (field, expected, observed) = field_error(verify(&report).unwrap_err());
        assert_eq!(field, "chip_id", "padding byte {padding:#x}");
        assert_eq!(expected, "VCEK hwID 1e550a8ee5cf9f4d");
        assert!(observed.starts_with("1e550a8ee5cf9f4d"), "{observed}");
    }

    let other_fmc = as_turin_vceks_report(|r| r[0x180] = 1);
    let (field, expected, observed) = field_error(verify(&other_fmc).unwrap_err());
    assert_eq!(
        (field.as_str(), expected.as_str(), observed.as_str()),
        ("reported_tcb.fmc", "VCEK fmcSPL 0", "1")
    );
}

/// The verifier reports the CRL bundle it checks intermediates against: the very one it
/// was given, and none when it was given none.
#[test]
fn the_verifier_names_the_crl_bundle_it_checks_against() {
    use asterism_attestation::revocation::CrlBundle;
    use std::sync::Arc;
    let bundle = Arc::new(
        CrlBundle::from_files(vec![("ark-milan.crl", crl_in_the_name_of_ark_milan())]).unwrap(),
    );
    let v = SnpVerifier::new(no_floor()).with_crls(Arc::clone(&bundle));
    assert!(v.crls().is_some_and(|c| Arc::ptr_eq(c, &bundle)));
    assert!(SnpVerifier::new(no_floor()).crls().is_none());
}

/// The cache keeps each chain it verified while it has room: verifying the other chips'
/// reports in between does not evict the first chain, whose next report costs no chain
/// verification.
#[test]
fn the_chain_cache_keeps_every_chain_while_it_has_room() {
    let v = SnpVerifier::new(no_floor());
    let cases = [("milan", milan()), ("azure", azure()), ("aws", aws())];
    for (name, case) in &cases {
        let (explanation, result) =
            v.verify_explained(&case.report, &case.certs, &case.report_data, now());
        result.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            explanation.checks.iter().any(|c| c.field == "ARK"),
            "{name}: first verification took no chain: {explanation:?}"
        );
    }
    for (name, case) in &cases {
        let (explanation, result) =
            v.verify_explained(&case.report, &case.certs, &case.report_data, now());
        result.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            explanation
                .checks
                .iter()
                .any(|c| c.field == "chain" && c.expected == "verified earlier"),
            "{name}: chain verified again: {explanation:?}"
        );
        assert!(
            explanation.checks.iter().all(|c| c.field != "ARK"),
            "{name}: {explanation:?}"
        );
    }
}

/// The reported TCB's reserved bytes must be zero, in each product's layout: the Milan
/// sample's (bytes 2 to 5 on Milan) and its TCB laid out as Turin's (bytes 4 to 6) pass
/// with them zero and are refused, naming them, with one of them set.
#[test]
fn reserved_bytes_of_the_reported_tcb_are_refused_in_each_layout() {
    let case = milan();
    let real = SnpReport::parse(&case.report).unwrap();
    let zero_floor = SnpPolicy {
        minimum_tcb: PerProduct::same(Some(MinimumTcb::default())),
        ..any_launch()
    };
    let run = |report: &SnpReport, product| {
        check_fields(
            report,
            product,
            &zero_floor,
            &case.report_data,
            &mut Explanation::default(),
        )
    };
    // Turin's layout: FMC, boot loader, TEE, SNP, three reserved bytes, microcode.
    let mut turin = real.clone();
    turin.reported_tcb.0 = [0, 3, 0, 8, 0, 0, 0, 115];
    for (product, base, reserved) in [
        (Product::Milan, &real, [2usize, 3, 4, 5].as_slice()),
        (Product::Turin, &turin, [4usize, 5, 6].as_slice()),
    ] {
        run(base, product).unwrap_or_else(|e| panic!("{product}: {e}"));
        for &byte in reserved {
            let mut report = base.clone();
            report.reported_tcb.0[byte] = 1;
            let (field, expected, _) = field_error(run(&report, product).unwrap_err());
            assert_eq!(
                (field.as_str(), expected.as_str()),
                ("reported_tcb.reserved", "zero"),
                "{product} byte {byte}"
            );
        }
    }
}

/// A guest whose policy forbids SMT (bit 16 clear) meets a policy that refuses SMT, and
/// the check records the bit as 0.
#[test]
fn a_guest_policy_without_smt_passes_a_policy_that_refuses_smt() {
    let case = milan();
    let mut report = SnpReport::parse(&case.report).unwrap();
    assert!(report.policy.smt_allowed());
    report.policy.0 &= !(1 << 16);
    let no_smt = SnpPolicy {
        allow_smt: false,
        minimum_tcb: PerProduct {
            milan: Some(MILAN_SAMPLE_TCB),
            ..PerProduct::default()
        },
        ..any_launch()
    };
    let mut explanation = Explanation::default();
    check_fields(
        &report,
        Product::Milan,
        &no_smt,
        &case.report_data,
        &mut explanation,
    )
    .unwrap();
    let smt = explanation
        .checks
        .iter()
        .find(|c| c.field == "policy.smt")
        .unwrap();
    assert_eq!((&*smt.expected, &*smt.observed), ("0", "0"));
}

/// Each guest-policy and platform-info flag reads its own bit (the SEV-SNP ABI's
/// ATTESTATION_REPORT layout): set alone it reads true, cleared with every other bit set it
/// reads false; the ABI version reads bits 15:8 as major and 7:0 as minor.
#[test]
fn each_policy_and_platform_flag_reads_its_own_bit() {
    use asterism_attestation::snp::{GuestPolicy, PlatformInfo};
    type Flag<T> = fn(&T) -> bool;
    let policy_flags: [(u32, Flag<GuestPolicy>); 4] = [
        (16, GuestPolicy::smt_allowed),
        (18, GuestPolicy::migrate_ma_allowed),
        (19, GuestPolicy::debug_allowed),
        (20, GuestPolicy::single_socket_required),
    ];
    each_flag_reads_its_own_bit("policy", GuestPolicy, &policy_flags);
    assert_eq!(GuestPolicy(0x0003_0a05).abi(), (0x0a, 0x05));
    assert_eq!(GuestPolicy(0xffff_ffff_ffff_00ff).abi(), (0x00, 0xff));
    let platform_flags: [(u32, Flag<PlatformInfo>); 2] = [
        (0, PlatformInfo::smt_enabled),
        (1, PlatformInfo::tsme_enabled),
    ];
    each_flag_reads_its_own_bit("platform info", PlatformInfo, &platform_flags);
}

/// A decoder of one flag of a bit field.
type BitFlag<T> = fn(&T) -> bool;

/// Asserts that each of `flags` reads its own bit of the `what` field `make` builds from
/// 64 bits: set alone it reads true, cleared with every other bit set it reads false.
fn each_flag_reads_its_own_bit<T>(
    what: &str,
    make: impl Fn(u64) -> T,
    flags: &[(u32, BitFlag<T>)],
) {
    for &(bit, flag) in flags {
        assert!(flag(&make(1 << bit)), "{what} bit {bit} alone");
        assert!(!flag(&make(!(1 << bit))), "{what} without bit {bit}");
    }
}

/// The key information field's two flags read bits 0 (AUTHOR_KEY_EN) and 1 (MASK_CHIP_KEY):
/// set alone they read true, cleared with every other bit set they read false.
#[test]
fn each_key_information_flag_reads_its_own_bit() {
    use asterism_attestation::snp::KeyInfo;
    type Flag = fn(&KeyInfo) -> bool;
    let flags: [(u32, Flag); 2] = [(0, KeyInfo::author_key_en), (1, KeyInfo::mask_chip_key)];
    // The field is 32 bits: the low half of each pattern.
    let key_info = |bits: u64| KeyInfo(u32::try_from(bits & 0xffff_ffff).unwrap());
    each_flag_reads_its_own_bit("key information", key_info, &flags);
}

/// The CPUID family and model name the product at each end of its model range, and no
/// product just outside them.
#[test]
fn cpuid_family_and_model_name_each_product_over_its_whole_model_range() {
    use asterism_attestation::snp::Cpuid;
    let product = |family, model| {
        Cpuid {
            family,
            model,
            stepping: 1,
        }
        .product()
    };
    for (family, model, want) in [
        (0x19, 0x00, Some(Product::Milan)),
        (0x19, 0x0F, Some(Product::Milan)),
        (0x19, 0x10, Some(Product::Genoa)),
        (0x19, 0x1F, Some(Product::Genoa)),
        (0x19, 0xA0, Some(Product::Genoa)),
        (0x19, 0xAF, Some(Product::Genoa)),
        (0x1A, 0x00, Some(Product::Turin)),
        (0x1A, 0x11, Some(Product::Turin)),
        (0x19, 0x20, None),
        (0x19, 0x9F, None),
        (0x19, 0xB0, None),
        (0x1A, 0x12, None),
        (0x18, 0x01, None),
    ] {
        assert_eq!(product(family, model), want, "{family:#x} {model:#x}");
    }
}

/// A parsed report keeps the very bytes it was parsed from.
#[test]
fn a_parsed_report_gives_back_the_bytes_it_was_read_from() {
    for (name, case) in [("milan", milan()), ("azure", azure()), ("aws", aws())] {
        let report = SnpReport::parse(&case.report).unwrap();
        assert_eq!(report.as_bytes().as_slice(), case.report, "{name}");
    }
}

/// A signer kind displays as its certificate's name in AMD's documents.
#[test]
fn a_signer_kind_displays_as_its_certificates_name() {
    assert_eq!(SignerKind::Vcek.to_string(), "VCEK");
    assert_eq!(SignerKind::Vlek.to_string(), "VLEK");
}

/// A validity refusal names the certificate's window and the time it was checked at, as
/// dates: the Milan VCEK (April 2023 to April 2030) used in 2031.
#[test]
fn a_validity_refusal_names_the_window_and_the_time_it_was_checked_at() {
    let case = milan();
    let (explanation, result) = SnpVerifier::new(no_floor()).verify_explained(
        &case.report,
        &case.certs,
        &case.report_data,
        at(1_924_992_000),
    );
    let window = "valid from Apr  3 19:23:43 2023 +00:00 to Apr  3 19:23:43 2030 +00:00";
    let checked = "Jan  1 00:00:00 2031 +00:00";
    assert_eq!(
        cert_error(result.unwrap_err()),
        ("VCEK".into(), format!("used at {checked}, but {window}"))
    );
    let check = explanation.first_failure().unwrap();
    assert_eq!(
        (&*check.field, &*check.expected, &*check.observed),
        (
            "VCEK.validity",
            window,
            format!("checked at {checked}").as_str()
        )
    );
}

/// The PEM and THIM JSON size cap at its exact bound (64 KiB): the Azure VCEK, its chain
/// and Azure's THIM JSON, each padded with whitespace to exactly the cap, are read and
/// verify; one byte more is refused by its size.
#[test]
fn pem_and_thim_json_of_exactly_64_kib_are_read_and_one_byte_more_is_refused() {
    const CAP: usize = 64 * 1024;
    let case = azure();
    let (leaf, chain) = (read("snp-azure/vcek.pem"), read("snp-azure/certchain.pem"));
    let padded = |text: &[u8], len: usize| {
        let mut text = text.to_vec();
        text.resize(len, b'\n');
        text
    };
    let from_pem = |(leaf_len, chain_len)| {
        SnpCerts::from_pem(&padded(&leaf, leaf_len), Some(&padded(&chain, chain_len)))
    };
    for (name, at_cap, over) in [
        ("leaf", (CAP, chain.len()), (CAP + 1, chain.len())),
        ("chain", (leaf.len(), CAP), (leaf.len(), CAP + 1)),
    ] {
        let certs = from_pem(at_cap).unwrap_or_else(|e| panic!("{name}: {e}"));
        verify(&Case { certs, ..azure() }, no_floor()).unwrap();
        assert_eq!(
            from_pem(over),
            Err(ValidationError::Malformed(format!(
                "SEV-SNP certificates: {name} PEM: {} bytes, at most {CAP}",
                CAP + 1
            )))
        );
    }

    let mut json = serde_json::json!({
        "vcekCert": String::from_utf8(leaf).unwrap(),
        "certificateChain": String::from_utf8(chain).unwrap(),
        "tcbm": "5D06000000000002",
    })
    .to_string()
    .into_bytes();
    json.resize(CAP, b' ');
    let certs = SnpCerts::from_thim_json(&json).unwrap();
    assert_eq!(certs.tcbm(), Some(0x5D06_0000_0000_0002));
    SnpVerifier::new(no_floor())
        .verify(&case.report, &certs, &case.report_data, now())
        .unwrap();
    json.push(b' ');
    assert_eq!(
        SnpCerts::from_thim_json(&json),
        Err(ValidationError::Malformed(format!(
            "SEV-SNP certificates: THIM JSON: {} bytes, at most {CAP}",
            CAP + 1
        )))
    );
}

/// Each certificate given as DER may be up to 16 KiB: that many bytes are taken (they are
/// parsed only at verification), one byte more is refused naming the certificate.
#[test]
fn a_certificate_of_exactly_16_kib_is_taken_and_one_byte_more_is_refused() {
    const CAP: usize = 16 * 1024;
    let vcek = read("snp-milan/vcek_milan.der");
    for name in ["leaf", "intermediate", "root"] {
        let given = |len: usize| {
            let der = vec![0x30; len];
            match name {
                "leaf" => SnpCerts::from_der(&der, None, None),
                "intermediate" => SnpCerts::from_der(&vcek, Some(&der), None),
                _ => SnpCerts::from_der(&vcek, None, Some(&der)),
            }
        };
        given(CAP).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            given(CAP + 1),
            Err(ValidationError::Malformed(format!(
                "SEV-SNP certificates: {name}: {} bytes, expected 1 to {CAP}",
                CAP + 1
            )))
        );
    }
}

/// The signing key's certificate is given back as the DER it was read from, whether it
/// came as DER, as PEM or in THIM JSON.
#[test]
fn the_signing_keys_certificate_is_given_back_as_its_der() {
    let milan_vcek = read("snp-milan/vcek_milan.der");
    assert_eq!(
        SnpCerts::from_der(&milan_vcek, None, None)
            .unwrap()
            .leaf_der(),
        milan_vcek
    );
    let azure_vcek = read("snp-azure/vcek.cert");
    assert_eq!(azure().certs.leaf_der(), azure_vcek);
    let json = serde_json::json!({
        "vcekCert": String::from_utf8(read("snp-azure/vcek.pem")).unwrap(),
        "certificateChain": String::from_utf8(read("snp-azure/certchain.pem")).unwrap(),
    })
    .to_string();
    assert_eq!(
        SnpCerts::from_thim_json(json.as_bytes())
            .unwrap()
            .leaf_der(),
        azure_vcek
    );
}

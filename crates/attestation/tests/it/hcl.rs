//! Azure HCL reports and the AWS SEV-SNP AK binding, on real evidence from real hardware
//! (`tests/data/cvm/`), and every tampering refused with its own reason.

use asterism_attestation::ValidationError;
use asterism_attestation::explain::Outcome;
use asterism_attestation::hcl::{
    HardwareKind, HardwareReport, HclReport, MAX_HCL_REPORT_SIZE, MAX_RUNTIME_DATA_SIZE,
    RuntimeData, SNP_REPORT_SIZE, TD_REPORT_SIZE, aws_snp_ak_matches, aws_snp_report_data,
    hcl_ak_matches, runtime_data_report_data,
};
use asterism_attestation::tpm::structures::{PublicParams, TpmtPublic};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/cvm");

fn read(path: &str) -> Vec<u8> {
    std::fs::read(format!("{DATA}/{path}")).unwrap()
}

/// The whole HCL report from Azure TDX, as read from the NV index (zero-padded).
fn tdx_hcl() -> Vec<u8> {
    read("tdx-azure-hcl/hclreport.bin")
}

/// The declared length of the TDX HCL report (its header's report size).
const TDX_DECLARED: usize = 2436;
/// Where the runtime data starts in every HCL report.
const RUNTIME_AT: usize = 32 + 1184 + 20;

/// The Azure SNP files hold the HCL report without its 32-byte header (the SNP report and
/// the 20-byte runtime-data header) and the runtime data apart: put the header back.
fn snp_hcl_from(runtime: &[u8]) -> Vec<u8> {
    let body = read("snp-azure/attestation.bin");
    assert_eq!(body.len(), SNP_REPORT_SIZE + 20);
    let mut out = b"HCLA".to_vec();
    out.extend_from_slice(&2u32.to_le_bytes());
    let size = 32 + body.len() + runtime.len();
    out.extend_from_slice(&u32::try_from(size).unwrap().to_le_bytes());
    out.extend_from_slice(&2u32.to_le_bytes()); // AK certificate request
    out.extend_from_slice(&[0u8; 16]); // status, reserved
    out.extend_from_slice(&body);
    out.extend_from_slice(runtime);
    out
}

fn snp_hcl() -> Vec<u8> {
    snp_hcl_from(&read("snp-azure/runtimedata.bin"))
}

fn malformed(r: Result<HclReport, ValidationError>) -> String {
    match r {
        Err(ValidationError::Malformed(m)) => m,
        other => panic!("expected Malformed, got {other:?}"),
    }
}

fn field(r: Result<(), ValidationError>) -> (String, String, String) {
    match r {
        Err(ValidationError::Field {
            field,
            expected,
            observed,
        }) => (field, expected, observed),
        other => panic!("expected a Field error, got {other:?}"),
    }
}

/// Replaces the first character of the AK's `n` in the runtime data JSON, in place (same
/// length, so the report's sizes stay right): the runtime data now names another key.
fn swap_ak_in(json: &mut [u8]) {
    let text = std::str::from_utf8(json).unwrap();
    let kid = text.find("\"HCLAkPub\"").unwrap();
    let n = kid + text[kid..].find("\"n\":\"").unwrap() + 5;
    json[n] = if json[n] == b'A' { b'B' } else { b'A' };
}

/// An RSA AK public area with modulus `n` and exponent `exponent` (0: the default).
fn rsa_public(n: &[u8], exponent: u32) -> Vec<u8> {
    TpmtPublic::ak(PublicParams::rsassa_sha256(n.to_vec(), exponent))
        .to_bytes()
        .unwrap()
}

fn ecc_public() -> Vec<u8> {
    TpmtPublic::ak(PublicParams::ecdsa_p256(vec![1; 32], vec![2; 32]))
        .to_bytes()
        .unwrap()
}

/// The AK modulus of the real Azure SNP runtime data, decoded independently of the parser.
fn azure_snp_ak_modulus() -> Vec<u8> {
    let json: serde_json::Value =
        serde_json::from_slice(&read("snp-azure/runtimedata.bin")).unwrap();
    let n = json["keys"][0]["n"].as_str().unwrap();
    assert_eq!(json["keys"][0]["kid"], "HCLAkPub");
    URL_SAFE_NO_PAD.decode(n).unwrap()
}

#[test]
fn parses_the_azure_tdx_hcl_report() {
    let report = HclReport::parse(&tdx_hcl()).unwrap();
    assert_eq!(report.kind(), HardwareKind::Tdx);
    let HardwareReport::Tdx(td) = report.hardware_report() else {
        panic!("not TDX");
    };
    assert_eq!(td.len(), TD_REPORT_SIZE);
    assert_eq!(td[0], 0x81, "TDREPORT type TDX");
    assert_eq!(report.runtime_data().len(), 1200);
    assert_eq!(report.runtime_data(), &tdx_hcl()[RUNTIME_AT..TDX_DECLARED]);

    let runtime = RuntimeData::parse(report.runtime_data()).unwrap();
    assert_eq!(runtime.ak.n.len(), 256);
    assert_eq!(runtime.ak.e, vec![1, 0, 1]);
    let vm = runtime.vm_configuration.unwrap();
    assert_eq!(vm.secure_boot, Some(true));
    assert_eq!(vm.tpm_persisted, Some(true));
    assert_eq!(
        vm.vm_unique_id.as_deref(),
        Some("8C85CE00-A0EB-497B-87EF-CA9609E6C757")
    );
    assert_eq!(runtime.user_data, Some(vec![0; 64]));
}

#[test]
fn the_tdx_report_data_is_the_sha256_of_the_runtime_data() {
    let report = HclReport::parse(&tdx_hcl()).unwrap();
    let report_data = report.hardware_report().unverified_report_data();
    // SHA-256 of the runtime data, then 32 zero bytes.
    assert_eq!(report_data[32..], [0; 32]);
    assert_eq!(report_data, report.expected_report_data());
    report.check_report_data(&report_data).unwrap();
    assert_eq!(
        report.report_data_check(&report_data).outcome,
        Outcome::Pass
    );
}

#[test]
fn parses_the_azure_snp_hcl_report_and_its_binding_holds() {
    let runtime = read("snp-azure/runtimedata.bin");
    let report = HclReport::parse(&snp_hcl()).unwrap();
    assert_eq!(report.kind(), HardwareKind::Snp);
    let HardwareReport::Snp(snp) = report.hardware_report() else {
        panic!("not SNP");
    };
    assert_eq!(snp, &read("snp-azure/attestation.bin")[..SNP_REPORT_SIZE]);
    assert_eq!(report.runtime_data(), runtime.as_slice());

    // REPORT_DATA at 0x50 of the real SNP report is SHA-256(runtime data) || zeros.
    let mut in_report = [0u8; 64];
    in_report.copy_from_slice(&snp[0x50..0x90]);
    assert_eq!(in_report, runtime_data_report_data(&runtime));
    report.check_report_data(&in_report).unwrap();

    let parsed = RuntimeData::parse(&runtime).unwrap();
    assert_eq!(parsed.ak.n, azure_snp_ak_modulus());
    assert_eq!(
        parsed.vm_configuration.unwrap().current_time,
        Some(1_661_455_391)
    );
    assert_eq!(parsed.user_data, None);
}

#[test]
fn rejects_runtime_data_whose_ak_was_swapped() {
    // TDX: the report as read, with the runtime data's AK changed in memory.
    let original = HclReport::parse(&tdx_hcl()).unwrap();
    let report_data = original.hardware_report().unverified_report_data();
    let mut tampered = tdx_hcl();
    swap_ak_in(&mut tampered[RUNTIME_AT..TDX_DECLARED]);
    let report = HclReport::parse(&tampered).unwrap();
    let swapped = RuntimeData::parse(report.runtime_data()).unwrap();
    assert_ne!(
        swapped.ak.n,
        RuntimeData::parse(original.runtime_data()).unwrap().ak.n
    );
    let (f, expected, observed) = field(report.check_report_data(&report_data));
    assert_eq!(f, "report_data");
    assert!(expected.starts_with(&hex::encode(report.expected_report_data())));
    assert_eq!(observed, hex::encode(report_data));
    assert_eq!(
        report.report_data_check(&report_data).outcome,
        Outcome::Fail
    );

    // SNP: the same, on the runtime data file.
    let mut runtime = read("snp-azure/runtimedata.bin");
    swap_ak_in(&mut runtime);
    let report = HclReport::parse(&snp_hcl_from(&runtime)).unwrap();
    let real = report.hardware_report().unverified_report_data();
    let (f, _, _) = field(report.check_report_data(&real));
    assert_eq!(f, "report_data");
}

#[test]
fn the_ak_public_area_must_be_the_runtime_datas_ak() {
    let runtime = RuntimeData::parse(&read("snp-azure/runtimedata.bin")).unwrap();
    let n = azure_snp_ak_modulus();
    hcl_ak_matches(&runtime, &rsa_public(&n, 0)).unwrap();
    // 65537 spelled out is the same key.
    hcl_ak_matches(&runtime, &rsa_public(&n, 65537)).unwrap();

    let mut other = n.clone();
    other[100] ^= 1;
    let (f, expected, observed) = field(hcl_ak_matches(&runtime, &rsa_public(&other, 0)));
    assert_eq!(f, "runtime_data.keys[HCLAkPub].n");
    // Each modulus is named by its length and digest, so that the two can be told apart.
    let summary = |n: &[u8]| {
        use sha2::Digest as _;
        format!(
            "{} bytes, SHA-256 {}",
            n.len(),
            hex::encode(sha2::Sha256::digest(n))
        )
    };
    assert_eq!(expected, summary(&n));
    assert_eq!(observed, format!("AK modulus of {}", summary(&other)));

    let (f, expected, _) = field(hcl_ak_matches(&runtime, &rsa_public(&n, 3)));
    assert_eq!(f, "runtime_data.keys[HCLAkPub].e");
    assert_eq!(expected, "010001");

    let (f, _, _) = field(hcl_ak_matches(&runtime, &ecc_public()));
    assert_eq!(f, "runtime_data.keys[HCLAkPub].kty");

    let mut trailing = rsa_public(&n, 0);
    trailing.push(0);
    assert!(matches!(
        hcl_ak_matches(&runtime, &trailing),
        Err(ValidationError::Malformed(_))
    ));
}

#[test]
fn tolerates_zero_padding_after_the_declared_size_and_nothing_else() {
    let bytes = tdx_hcl();
    assert!(bytes[TDX_DECLARED..].iter().all(|b| *b == 0));
    // Exactly the declared bytes, and more padding, both parse.
    HclReport::parse(&bytes[..TDX_DECLARED]).unwrap();
    let mut longer = bytes.clone();
    longer.resize(MAX_HCL_REPORT_SIZE, 0);
    HclReport::parse(&longer).unwrap();

    let mut tampered = bytes.clone();
    *tampered.last_mut().unwrap() = 1;
    let m = malformed(HclReport::parse(&tampered));
    assert!(m.contains("non-zero byte at offset 2599"), "{m}");

    longer.push(0);
    let m = malformed(HclReport::parse(&longer));
    assert!(m.contains("at most"), "{m}");
}

#[test]
fn rejects_every_truncation() {
    let bytes = tdx_hcl();
    for len in 0..TDX_DECLARED {
        malformed(HclReport::parse(&bytes[..len]));
    }
    let snp = snp_hcl();
    for len in 0..snp.len() {
        malformed(HclReport::parse(&snp[..len]));
    }
}

/// The TDX report with the little-endian u32 at `offset` set to `value`.
fn with_u32(offset: usize, value: u32) -> Vec<u8> {
    let mut b = tdx_hcl();
    b[offset..offset + 4].copy_from_slice(&value.to_le_bytes());
    b
}

#[test]
fn rejects_a_bad_header_or_data_header() {
    let mut bad_magic = tdx_hcl();
    bad_magic[3] = b'B';
    assert!(malformed(HclReport::parse(&bad_magic)).contains("signature"));

    let cases: [(usize, u32, &str); 9] = [
        (4, 1, "version"),
        (8, 2435, "report size"),
        (8, 2437, "report size"),
        (12, 1, "request type"),
        (16, 5, "status"),
        (24, 1, "reserved"),
        (1216, 1221, "data size"),
        (1220, 2, "data version"),
        (1224, 3, "report type"),
    ];
    for (offset, value, what) in cases {
        let m = malformed(HclReport::parse(&with_u32(offset, value)));
        assert!(m.contains(what), "{what}: {m}");
    }
    // A larger runtime data than the cap.
    let m = malformed(HclReport::parse(&with_u32(1232, 9000)));
    assert!(m.contains("runtime data is 9000 bytes"), "{m}");

    // Anything but SHA-256 names the field.
    match HclReport::parse(&with_u32(1228, 2)) {
        Err(ValidationError::Field {
            field, observed, ..
        }) => {
            assert_eq!(field, "hcl.report_data_hash_type");
            assert_eq!(observed, "2");
        }
        other => panic!("{other:?}"),
    }

    // The TDX report type over an area whose bytes after the TDREPORT are not zero.
    let mut b = tdx_hcl();
    b[32 + TD_REPORT_SIZE] = 1;
    assert!(malformed(HclReport::parse(&b)).contains("after the 1024-byte TDREPORT"));
}

#[test]
fn runtime_data_is_strict_on_the_ak() {
    let bad = |json: &str| match RuntimeData::parse(json.as_bytes()) {
        Err(ValidationError::Malformed(m)) => m,
        other => panic!("{json}: {other:?}"),
    };
    let key = r#"{"kid":"HCLAkPub","kty":"RSA","e":"AQAB","n":"tw"}"#;
    assert!(bad(r#"{"keys":[]}"#).contains("exactly one"));
    assert!(bad(&format!(r#"{{"keys":[{key},{key}]}}"#)).contains("exactly one"));
    assert!(bad(r#"{"keys":[{"kid":"HCLAkPub","kty":"EC","e":"AQAB","n":"tw"}]}"#).contains("RSA"));
    assert!(bad(r#"{"keys":[{"kid":"HCLAkPub","kty":"RSA","e":"AQAB"}]}"#).contains("no n"));
    assert!(
        bad(r#"{"keys":[{"kid":"HCLAkPub","kty":"RSA","e":"AQAB","n":"t+w"}]}"#)
            .contains("base64url")
    );
    assert!(
        bad(r#"{"keys":[{"kid":"HCLAkPub","kty":"RSA","e":"AQAB","n":"AA"}]}"#).contains("zero")
    );
    assert!(bad(&format!(r#"{{"keys":[{key}],"user-data":"zz"}}"#)).contains("user-data"));
    assert!(bad("[]").contains("JSON"));
    let huge = format!(r#"{{"keys":[{key}],"pad":"{}"}}"#, "a".repeat(9000));
    assert!(bad(&huge).contains("at most"));

    // Unknown members and other keys are ignored.
    let ok = format!(
        r#"{{"keys":[{{"kid":"HCLEkPub","kty":"RSA"}},{key}],"vm-configuration":{{"x":1}},"other":2}}"#
    );
    let parsed = RuntimeData::parse(ok.as_bytes()).unwrap();
    assert_eq!(parsed.ak.n, vec![0xb7]);
}

/// SHA-512 over the DER SubjectPublicKeyInfo of the real Azure SNP AK (n from its JWK,
/// e = 65537), computed outside this code base with Python's `cryptography`:
/// `hashlib.sha512(RSAPublicNumbers(65537, n).public_key().public_bytes(Encoding.DER,
/// PublicFormat.SubjectPublicKeyInfo)).hexdigest()`.
const AZURE_SNP_AK_SPKI_SHA512: &str = "8804a6baf5fab2772f9d499a05c92440ae2ce16d51839f8a9eca5c80e3db0703cb69f3aef1e76ef5c5285cca89f3ac36a9580fdd6c8622b5c1bd7bf5a63fd4ed";

/// REPORT_DATA of the real AWS report, as its source documents it.
const AWS_REPORT_DATA: &str = "87ab7caf510e1b3520dc3cceb64ee44128e10976fb0d3fc5e274699d8aaf506154af4c1de0a026b49fdf861e9ac75551551b3534d1c61369a3b08f5baed0db2f";

#[test]
fn aws_report_data_is_the_sha512_of_the_aks_der_public_key() {
    let public = rsa_public(&azure_snp_ak_modulus(), 0);
    let digest = aws_snp_report_data(&public).unwrap();
    assert_eq!(hex::encode(digest), AZURE_SNP_AK_SPKI_SHA512);
    aws_snp_ak_matches(&digest, &public).unwrap();
    // An ECC P-256 AK hashes too (a different key, a different digest); a P-256 point
    // with short coordinates is not the key a certificate would carry, and is refused.
    assert_ne!(aws_snp_report_data(&ecc_public()).unwrap(), digest);
    let mut short = TpmtPublic::parse(&ecc_public()).unwrap();
    if let PublicParams::Ecc { x, .. } = &mut short.params {
        x.pop();
    }
    assert!(matches!(
        aws_snp_report_data(&short.to_bytes().unwrap()),
        Err(ValidationError::Malformed(m)) if m.contains("P-256")
    ));
}

#[test]
fn the_real_aws_report_carries_the_documented_report_data_and_refuses_another_ak() {
    let text: String = std::fs::read_to_string(format!("{DATA}/snp-aws/report.txt"))
        .unwrap()
        .split_whitespace()
        .collect();
    let report = STANDARD.decode(text).unwrap();
    assert_eq!(report.len(), SNP_REPORT_SIZE);
    let mut report_data = [0u8; 64];
    report_data.copy_from_slice(&report[0x50..0x90]);
    assert_eq!(hex::encode(report_data), AWS_REPORT_DATA);

    // We do not hold that AK: any other key is refused, naming report_data.
    let (f, expected, observed) = field(aws_snp_ak_matches(
        &report_data,
        &rsa_public(&azure_snp_ak_modulus(), 0),
    ));
    assert_eq!(f, "report_data");
    assert!(expected.starts_with(AZURE_SNP_AK_SPKI_SHA512));
    assert_eq!(observed, AWS_REPORT_DATA);
}

#[test]
fn a_report_shorter_than_its_fixed_parts_is_refused_by_its_length_at_the_exact_bound() {
    let full = tdx_hcl();
    // One byte short of header, hardware report and data header: refused for its length.
    let short = malformed(HclReport::parse(&full[..RUNTIME_AT - 1]));
    assert!(short.contains("shorter than header"), "{short}");
    // Exactly those parts: past the length check, refused because the declared runtime
    // data is missing.
    let fixed_only = malformed(HclReport::parse(&full[..RUNTIME_AT]));
    assert!(!fixed_only.contains("shorter than header"), "{fixed_only}");
    assert!(fixed_only.contains("truncated"), "{fixed_only}");
}

#[test]
fn runtime_data_of_exactly_the_cap_is_read_and_one_byte_more_is_refused() {
    let with_runtime = |len: usize| {
        let mut report = snp_hcl_from(&vec![b' '; len]);
        // The runtime-data header: data size (fixed part + variable part), variable size.
        let data_at = RUNTIME_AT - 20;
        let data_size = u32::try_from(20 + len).unwrap().to_le_bytes();
        report[data_at..data_at + 4].copy_from_slice(&data_size);
        let variable = u32::try_from(len).unwrap().to_le_bytes();
        report[RUNTIME_AT - 4..RUNTIME_AT].copy_from_slice(&variable);
        HclReport::parse(&report)
    };
    let at_cap = with_runtime(MAX_RUNTIME_DATA_SIZE).unwrap();
    assert_eq!(at_cap.runtime_data().len(), MAX_RUNTIME_DATA_SIZE);
    let over = malformed(with_runtime(MAX_RUNTIME_DATA_SIZE + 1));
    assert!(over.contains("runtime data is"), "{over}");
}

#[test]
fn runtime_data_json_of_exactly_the_cap_is_parsed_and_one_byte_more_is_refused() {
    let json = read("snp-azure/runtimedata.bin");
    let padded = |len: usize| {
        let mut j = json.clone();
        j.resize(len, b' ');
        RuntimeData::parse(&j)
    };
    assert!(padded(MAX_RUNTIME_DATA_SIZE).is_ok());
    match padded(MAX_RUNTIME_DATA_SIZE + 1) {
        Err(ValidationError::Malformed(m)) => assert!(m.contains("at most"), "{m}"),
        other => panic!("expected Malformed, got {other:?}"),
    }
}

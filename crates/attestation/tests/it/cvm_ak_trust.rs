//! AK trust rooted in a confidential VM's hardware report, on real evidence from real
//! hardware (`tests/data/cvm/`): the quote validator with [`CvmAkTrust`].
//!
//! We hold no private key of a real cloud vTPM, so no test can make a quote that a real
//! AK signed. What the tests show instead: with the real Azure AK's public area the
//! hardware → AK part passes and the evidence is refused only at the quote's signature
//! (the next step), and every break of the hardware → AK chain is refused with its own
//! reason before that.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use crate::common::*;
use asterism_attestation::explain::Outcome;
use asterism_attestation::snp::{PerProduct, SnpPolicy};
use asterism_attestation::tdx::TdxPolicy;
use asterism_attestation::tpm::structures::{
    AsymScheme, ObjectAttributes, PublicParams, SymDefObject, TpmtPublic, alg,
};
use asterism_attestation::tpm::{
    AkTrust, AwsSnp, AzureSnp, AzureTdx, CvmAkTrust, CvmPlatform, PlatformKind, TdxCollateralSet,
    TpmQuoteEvidence, TpmQuoteValidator,
};
use asterism_attestation::{
    CvmReferences, Measurements, ReportData, Role, ValidationError, explain::Reference,
};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use prost::Message;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/cvm");

fn read(path: &str) -> Vec<u8> {
    std::fs::read(format!("{DATA}/{path}")).unwrap()
}

/// 2025-06-01: inside the validity of every SNP certificate in the test data.
fn snp_now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_748_736_000)
}

fn rd() -> ReportData {
    ReportData::atls(Role::Server, &[0x11; 32])
}

/// The Azure SNP files hold the HCL report without its 32-byte header: put it back.
fn azure_snp_hcl(runtime: &[u8]) -> Vec<u8> {
    let body = read("snp-azure/attestation.bin");
    let mut out = b"HCLA".to_vec();
    out.extend_from_slice(&2u32.to_le_bytes());
    let size = 32 + body.len() + runtime.len();
    out.extend_from_slice(&u32::try_from(size).unwrap().to_le_bytes());
    out.extend_from_slice(&2u32.to_le_bytes());
    out.extend_from_slice(&[0u8; 16]);
    out.extend_from_slice(&body);
    out.extend_from_slice(runtime);
    out
}

fn pem_der(pem: &[u8]) -> Vec<Vec<u8>> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(pem)
        .map(|c| c.unwrap().to_vec())
        .collect()
}

fn azure_snp_kind(runtime: &[u8]) -> PlatformKind {
    let mut certs = pem_der(&read("snp-azure/vcek.pem"));
    certs.push(pem_der(&read("snp-azure/certchain.pem")).remove(0)); // the ASK
    PlatformKind::AzureSevSnp(AzureSnp {
        hcl_report: azure_snp_hcl(runtime),
        certs,
    })
}

/// The real Azure vTPM AK as a public area (as Azure's vTPM makes it: without noDA).
fn azure_ak_public() -> Vec<u8> {
    let json: serde_json::Value =
        serde_json::from_slice(&read("snp-azure/runtimedata.bin")).unwrap();
    let n = URL_SAFE_NO_PAD
        .decode(json["keys"][0]["n"].as_str().unwrap())
        .unwrap();
    TpmtPublic {
        name_alg: alg::SHA256,
        attributes: ObjectAttributes(
            ObjectAttributes::FIXED_TPM
                | ObjectAttributes::FIXED_PARENT
                | ObjectAttributes::SENSITIVE_DATA_ORIGIN
                | ObjectAttributes::USER_WITH_AUTH
                | ObjectAttributes::RESTRICTED
                | ObjectAttributes::SIGN,
        ),
        auth_policy: Vec::new(),
        params: PublicParams::Rsa {
            symmetric: SymDefObject::Null,
            scheme: AsymScheme::Hashed {
                scheme: alg::RSASSA,
                hash: alg::SHA256,
            },
            key_bits: u16::try_from(n.len() * 8).unwrap(),
            exponent: 0,
            modulus: n,
        },
    }
    .to_bytes()
    .unwrap()
}

/// Evidence: a software quote over `rd()`, with the platform report `kind` and, when
/// given, another AK public area in place of the signer's.
fn evidence(kind: Option<PlatformKind>, ak_public: Option<Vec<u8>>) -> (Vec<u8>, Measurements) {
    let tpm = booted_tpm(rsa_ak());
    let mut wire: TpmQuoteEvidence = tpm.quote(&rd()).sign(tpm.ak()).unwrap();
    if let Some(kind) = kind {
        wire = wire.with_platform(kind);
    }
    if let Some(public) = ak_public {
        wire.ak_public = public;
    }
    (wire.encode_to_vec(), measurements_of(&tpm))
}

fn validator(trust: CvmAkTrust, m: Measurements) -> TpmQuoteValidator {
    TpmQuoteValidator::new(AkTrust::confidential_vm(trust), m.into_provider()).with_clock(snp_now)
}

/// The default policy without TCB floors: the test reports are older than the default
/// Milan floor (the TCB minimums have tests of their own, in tests/snp.rs).
fn policy() -> SnpPolicy {
    SnpPolicy {
        minimum_tcb: PerProduct::default(),
        ..SnpPolicy::default()
    }
}

fn azure_snp() -> CvmAkTrust {
    CvmAkTrust::sev_snp(CvmPlatform::AzureSevSnp, policy()).unwrap()
}

#[test]
fn the_real_azure_snp_report_vouches_for_its_ak_and_only_the_quote_signature_is_left() {
    let runtime = read("snp-azure/runtimedata.bin");
    let (ev, m) = evidence(Some(azure_snp_kind(&runtime)), Some(azure_ak_public()));
    let (checks, result) = validator(azure_snp(), m).validate_explained(&ev, &rd());
    // Hardware → AK passed (every check recorded, none failed); the quote was signed by our
    // software key, not by that AK, so the signature check that follows refuses it.
    assert!(
        matches!(result, Err(ValidationError::BadSignature(_))),
        "{result:?}"
    );
    assert!(
        checks
            .iter()
            .any(|c| c.field == "report_data" && c.outcome == Outcome::Pass)
    );
    assert!(
        checks
            .iter()
            .any(|c| c.field.starts_with("runtime_data.keys") && c.outcome == Outcome::Pass)
    );
    assert!(
        checks.iter().all(|c| c.outcome != Outcome::Fail),
        "{checks:#?}"
    );
}

#[test]
fn an_ak_the_runtime_data_does_not_name_is_refused() {
    let runtime = read("snp-azure/runtimedata.bin");
    // The software AK signs and presents itself: a valid quote, but not the vTPM's AK.
    let (ev, m) = evidence(Some(azure_snp_kind(&runtime)), None);
    let err = validator(azure_snp(), m)
        .validate_explained(&ev, &rd())
        .1
        .unwrap_err();
    match err {
        ValidationError::Field { field, .. } => {
            assert!(field.starts_with("runtime_data.keys"), "{field}")
        }
        other => panic!("want the AK field refused, got {other:?}"),
    }
}

#[test]
fn runtime_data_whose_ak_was_swapped_is_refused_by_the_report_data() {
    let mut runtime = read("snp-azure/runtimedata.bin");
    let text = String::from_utf8(runtime.clone()).unwrap();
    let n = text.find("\"n\":\"").unwrap() + 5;
    runtime[n] = if runtime[n] == b'A' { b'B' } else { b'A' };
    let (ev, m) = evidence(Some(azure_snp_kind(&runtime)), Some(azure_ak_public()));
    let (checks, result) = validator(azure_snp(), m).validate_explained(&ev, &rd());
    assert!(
        matches!(result, Err(ValidationError::BindingMismatch)),
        "{result:?}"
    );
    assert!(
        checks
            .iter()
            .any(|c| c.field == "report_data" && c.outcome == Outcome::Fail)
    );
}

#[test]
fn a_launch_measurement_from_the_measurements_file_is_enforced() {
    let runtime = read("snp-azure/runtimedata.bin");
    let (ev, m) = evidence(Some(azure_snp_kind(&runtime)), Some(azure_ak_public()));
    let m = m.with_cvm(CvmReferences {
        snp_launch_measurement: Some(Reference::enforce([0x5a; 48])),
        ..CvmReferences::default()
    });
    let (checks, result) = validator(azure_snp(), m).validate_explained(&ev, &rd());
    assert!(
        matches!(&result, Err(ValidationError::Field { field, .. }) if field == "measurement"),
        "{result:?}"
    );
    assert!(
        checks
            .iter()
            .any(|c| c.field == "measurement" && c.outcome == Outcome::Fail)
    );
}

#[test]
fn evidence_without_the_platform_report_or_with_another_platforms_is_refused() {
    let (ev, m) = evidence(None, Some(azure_ak_public()));
    let err = validator(azure_snp(), m.clone())
        .validate_explained(&ev, &rd())
        .1
        .unwrap_err();
    assert!(
        matches!(&err, ValidationError::UntrustedKey(r) if r.contains("no azure-sev-snp")),
        "{err:?}"
    );

    let aws = PlatformKind::AwsSevSnp(AwsSnp {
        report: STANDARD
            .decode(
                String::from_utf8(read("snp-aws/report.txt"))
                    .unwrap()
                    .trim(),
            )
            .unwrap(),
        certs: pem_der(&read("snp-aws/vlek.pem")),
    });
    let (ev, m) = evidence(Some(aws), Some(azure_ak_public()));
    let err = validator(azure_snp(), m)
        .validate_explained(&ev, &rd())
        .1
        .unwrap_err();
    assert!(
        matches!(&err, ValidationError::UntrustedKey(r) if r.contains("aws-sev-snp")),
        "{err:?}"
    );
}

#[test]
fn the_real_aws_report_is_verified_and_refuses_an_ak_it_was_not_made_for() {
    let report = STANDARD
        .decode(
            String::from_utf8(read("snp-aws/report.txt"))
                .unwrap()
                .trim(),
        )
        .unwrap();
    let mut certs = pem_der(&read("snp-aws/vlek.pem"));
    certs.push(pem_der(&read("snp-aws/certchain.pem")).remove(0)); // the ASVK
    let kind = PlatformKind::AwsSevSnp(AwsSnp { report, certs });
    let (ev, m) = evidence(Some(kind), None);
    let trust = CvmAkTrust::sev_snp(CvmPlatform::AwsSevSnp, policy()).unwrap();
    let (checks, result) = validator(trust, m).validate_explained(&ev, &rd());
    // The report verified to AMD's root (its signature checks passed); its REPORT_DATA
    // names the instance's own AK, not ours.
    assert!(
        matches!(result, Err(ValidationError::BindingMismatch)),
        "{result:?}"
    );
    assert!(
        checks
            .iter()
            .any(|c| c.field == "signature" && c.outcome == Outcome::Pass),
        "{checks:#?}"
    );
    assert!(
        checks
            .iter()
            .any(|c| c.field == "report_data" && c.outcome == Outcome::Fail)
    );
}

#[test]
fn azure_tdx_without_collateral_is_refused_and_the_platform_names_parse() {
    let kind = PlatformKind::AzureTdx(AzureTdx {
        quote: vec![0; 16],
        runtime_data: b"{}".to_vec(),
    });
    let (ev, m) = evidence(Some(kind), Some(azure_ak_public()));
    let trust = CvmAkTrust::azure_tdx(TdxPolicy::default(), TdxCollateralSet::default());
    assert!(
        validator(trust, m)
            .validate_explained(&ev, &rd())
            .1
            .is_err()
    );
    for p in CvmPlatform::ALL {
        assert_eq!(p.name().parse::<CvmPlatform>().unwrap(), p);
    }
    assert!("gcp-sev-snp".parse::<CvmPlatform>().is_err());
    assert!(CvmAkTrust::sev_snp(CvmPlatform::AzureTdx, SnpPolicy::default()).is_err());
}

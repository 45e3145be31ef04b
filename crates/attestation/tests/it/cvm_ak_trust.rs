//! AK trust rooted in a confidential VM's hardware report, on real evidence from real
//! hardware (`tests/data/cvm/`): the quote validator with [`CvmAkTrust`].
//!
//! We hold no private key of a real cloud vTPM, so no test can make a quote that a real
//! AK signed. What the tests show instead: with the real Azure AK's public area the
//! hardware → AK part passes and the evidence is refused only at the quote's signature
//! (the next step), and every break of the hardware → AK chain is refused with its own
//! reason before that.

use crate::common::*;
use asterism_attestation::explain::Outcome;
use asterism_attestation::hcl::{self, HardwareReport, HclReport, RuntimeData};
use asterism_attestation::snp::{SignerKind, SnpPolicy, SnpReport};
use asterism_attestation::tdx::{
    TcbStatus, TdQuote, TdReport, TdReportKind, TdxCollateral, TdxPolicy, check_fields,
};
use asterism_attestation::tpm::{
    AkTrust, AwsSnp, AzureSnp, AzureTdx, CvmAkTrust, CvmPlatform, CvmTrustError, MissingReferences,
    PlatformKind, TdxCollateralSet, TpmQuoteEvidence, TpmQuoteValidator,
};
use asterism_attestation::{
    CvmReferences, InsecureNoLaunchMeasurement, Measurements, ReportData, Role, ValidationError,
    explain::Reference,
};
use asterism_testkit::cvm::{aws_snp_report, read_cvm, snp_policy_at_the_azure_tcb};
use prost::Message;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// 2025-06-01: inside the validity of every SNP certificate in the test data.
fn snp_now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_748_736_000)
}

fn rd() -> ReportData {
    ReportData::atls(Role::Server, &[0x11; 32])
}

/// The real Azure SEV-SNP report with `runtime` as its runtime data.
fn azure_snp_hcl(runtime: &[u8]) -> Vec<u8> {
    asterism_testkit::cvm::azure_snp_hcl_of(&read_cvm("snp-azure/attestation.bin"), runtime)
}

fn pem_der(pem: &[u8]) -> Vec<Vec<u8>> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(pem)
        .map(|c| c.unwrap().to_vec())
        .collect()
}

fn azure_snp_kind(runtime: &[u8]) -> PlatformKind {
    let mut certs = pem_der(&read_cvm("snp-azure/vcek.pem"));
    certs.push(pem_der(&read_cvm("snp-azure/certchain.pem")).remove(0)); // the ASK
    PlatformKind::AzureSevSnp(AzureSnp {
        hcl_report: azure_snp_hcl(runtime),
        certs,
    })
}

/// The real Azure vTPM AK as a public area (as Azure's vTPM makes it: without noDA).
fn azure_ak_public() -> Vec<u8> {
    asterism_testkit::cvm::azure_ak_public(&read_cvm("snp-azure/runtimedata.bin"))
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

/// The validator, with the launch pinned to the real report's for the trust's platform
/// when the measurements pin nothing yet.
fn validator(trust: CvmAkTrust, m: Measurements) -> TpmQuoteValidator {
    let m = if m.cvm().is_empty() {
        let references = references_for(trust.platform());
        m.with_cvm(references)
    } else {
        m
    };
    TpmQuoteValidator::new(AkTrust::confidential_vm(trust), m.into_provider()).with_clock(snp_now)
}

fn snp_launch(report: &[u8]) -> CvmReferences {
    let measurement = SnpReport::parse(&report[..hcl::SNP_REPORT_SIZE])
        .unwrap()
        .measurement;
    CvmReferences {
        snp_launch_measurement: Some(Reference::enforce(measurement)),
        ..CvmReferences::default()
    }
}

/// The TDREPORT of the real Azure TDX HCL report, as a [`TdReport`]. Offsets of the
/// TDREPORT: REPORTMACSTRUCT (REPORT_DATA at 128), TEE_TCB_INFO at 256 (TEE_TCB_SVN at
/// 264, MRSEAM at 280, MRSIGNERSEAM at 328, ATTRIBUTES at 376), TDINFO at 512
/// (ATTRIBUTES, XFAM, MRTD, MRCONFIGID, MROWNER, MROWNERCONFIG, RTMR 0 to 3).
fn azure_td_report() -> (TdReport, Vec<u8>) {
    let hcl_bytes = read_cvm("tdx-azure-hcl/hclreport.bin");
    let report = HclReport::parse(&hcl_bytes).unwrap();
    let HardwareReport::Tdx(td) = report.hardware_report() else {
        panic!("not TDX");
    };
    let at = |offset: usize, len: usize| td[offset..offset + len].to_vec();
    let a48 = |offset: usize| <[u8; 48]>::try_from(at(offset, 48)).unwrap();
    let info = 512;
    let parsed = TdReport {
        kind: TdReportKind::Td10,
        tee_tcb_svn: at(264, 16).try_into().unwrap(),
        mr_seam: a48(280),
        mr_signer_seam: a48(328),
        seam_attributes: at(376, 8).try_into().unwrap(),
        td_attributes: at(info, 8).try_into().unwrap(),
        xfam: at(info + 8, 8).try_into().unwrap(),
        mr_td: a48(info + 16),
        mr_config_id: a48(info + 64),
        mr_owner: a48(info + 112),
        mr_owner_config: a48(info + 160),
        rtmr: [0, 1, 2, 3].map(|i| a48(info + 208 + 48 * i)),
        report_data: at(128, 64).try_into().unwrap(),
        tee_tcb_svn2: None,
        mr_service_td: None,
    };
    (parsed, report.runtime_data().to_vec())
}

fn tdx_launch(report: &TdReport) -> CvmReferences {
    CvmReferences {
        tdx_mrtd: Some(Reference::enforce(report.mr_td)),
        tdx_rtmrs: report.rtmr.map(|v| Some(Reference::enforce(v))),
        ..CvmReferences::default()
    }
}

/// The reference values of the real reports, for each platform.
fn references_for(platform: CvmPlatform) -> CvmReferences {
    match platform {
        CvmPlatform::AzureSevSnp => snp_launch(&read_cvm("snp-azure/attestation.bin")),
        CvmPlatform::AwsSevSnp => snp_launch(&aws_snp_report()),
        CvmPlatform::AzureTdx => tdx_launch(&azure_td_report().0),
    }
}

fn azure_snp() -> CvmAkTrust {
    CvmAkTrust::sev_snp(CvmPlatform::AzureSevSnp, snp_policy_at_the_azure_tcb()).unwrap()
}

#[test]
fn the_real_azure_snp_report_vouches_for_its_ak_and_only_the_quote_signature_is_left() {
    let runtime = read_cvm("snp-azure/runtimedata.bin");
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
    let runtime = read_cvm("snp-azure/runtimedata.bin");
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

/// Asserts that evidence was refused at its binding: `BindingMismatch`, with the
/// `report_data` check recorded as failed. `what` names the case in a failure.
fn assert_refused_at_the_binding(
    what: &str,
    checks: &[asterism_attestation::explain::Check],
    result: &Result<asterism_attestation::VerifiedEvidence, ValidationError>,
) {
    assert!(
        matches!(result, Err(ValidationError::BindingMismatch)),
        "{what}: {result:?}"
    );
    assert!(
        checks
            .iter()
            .any(|c| c.field == "report_data" && c.outcome == Outcome::Fail),
        "{what}: {checks:#?}"
    );
}

#[test]
fn runtime_data_whose_ak_was_swapped_is_refused_by_the_report_data() {
    let mut runtime = read_cvm("snp-azure/runtimedata.bin");
    let text = String::from_utf8(runtime.clone()).unwrap();
    let n = text.find("\"n\":\"").unwrap() + 5;
    runtime[n] = if runtime[n] == b'A' { b'B' } else { b'A' };
    let (ev, m) = evidence(Some(azure_snp_kind(&runtime)), Some(azure_ak_public()));
    let (checks, result) = validator(azure_snp(), m).validate_explained(&ev, &rd());
    assert_refused_at_the_binding("Azure SEV-SNP", &checks, &result);
}

#[test]
fn a_launch_measurement_from_the_measurements_file_is_enforced() {
    let runtime = read_cvm("snp-azure/runtimedata.bin");
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
        report: aws_snp_report(),
        certs: pem_der(&read_cvm("snp-aws/vlek.pem")),
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
    let report = aws_snp_report();
    let mut certs = pem_der(&read_cvm("snp-aws/vlek.pem"));
    certs.push(pem_der(&read_cvm("snp-aws/certchain.pem")).remove(0)); // the ASVK
    let kind = PlatformKind::AwsSevSnp(AwsSnp { report, certs });
    let (ev, m) = evidence(Some(kind), None);
    let trust = CvmAkTrust::sev_snp(CvmPlatform::AwsSevSnp, snp_policy_at_the_azure_tcb()).unwrap();
    let (checks, result) = validator(trust, m).validate_explained(&ev, &rd());
    // The report verified to AMD's root (its signature checks passed); its REPORT_DATA
    // names the instance's own AK, not ours.
    assert_refused_at_the_binding("AWS SEV-SNP", &checks, &result);
    assert!(
        checks
            .iter()
            .any(|c| c.field == "signature" && c.outcome == Outcome::Pass),
        "{checks:#?}"
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

/// The real AWS (VLEK-signed) report in an HCL report as Azure's paravisor writes one, with
/// the real Azure runtime data: what an attacker with a report from another cloud, or from
/// an EPYC host of their own, could present as an Azure vTPM (the HCL header is unsigned).
fn aws_report_as_azure_evidence() -> PlatformKind {
    let azure = read_cvm("snp-azure/attestation.bin");
    let mut body = aws_snp_report();
    body.extend_from_slice(&azure[hcl::SNP_REPORT_SIZE..]); // the runtime data header
    let runtime = read_cvm("snp-azure/runtimedata.bin");
    let mut hcl_report = azure_snp_hcl(&runtime);
    hcl_report[32..32 + body.len()].copy_from_slice(&body);
    let mut certs = pem_der(&read_cvm("snp-aws/vlek.pem"));
    certs.push(pem_der(&read_cvm("snp-aws/certchain.pem")).remove(0)); // the ASVK
    PlatformKind::AzureSevSnp(AzureSnp { hcl_report, certs })
}

#[test]
fn a_vlek_signed_report_wrapped_as_azure_evidence_is_refused_at_the_signer() {
    let (ev, m) = evidence(
        Some(aws_report_as_azure_evidence()),
        Some(azure_ak_public()),
    );
    // Even with the AWS launch pinned, so that nothing but the signer can refuse it.
    let m = m.with_cvm(snp_launch(&aws_snp_report()));
    let (checks, result) = validator(azure_snp(), m).validate_explained(&ev, &rd());
    match &result {
        Err(ValidationError::Field {
            field,
            expected,
            observed,
        }) => {
            assert_eq!(field, "key_info.signing_key");
            assert_eq!(expected, "VCEK");
            assert_eq!(observed, "VLEK");
        }
        other => panic!("want the signer refused, got {other:?}"),
    }
    // Refused there, not later: neither the chain, the signature nor the binding ran.
    let last = checks.last().unwrap();
    assert_eq!(
        (&*last.field, last.outcome),
        ("key_info.signing_key", Outcome::Fail)
    );
    assert!(
        !checks
            .iter()
            .any(|c| c.field == "signature" || c.field == "report_data"),
        "{checks:#?}"
    );
}

#[test]
fn a_vcek_signed_report_is_refused_as_aws_evidence() {
    let azure = read_cvm("snp-azure/attestation.bin");
    let mut certs = pem_der(&read_cvm("snp-azure/vcek.pem"));
    certs.push(pem_der(&read_cvm("snp-azure/certchain.pem")).remove(0));
    let kind = PlatformKind::AwsSevSnp(AwsSnp {
        report: azure[..hcl::SNP_REPORT_SIZE].to_vec(),
        certs,
    });
    let (ev, m) = evidence(Some(kind), None);
    let m = m.with_cvm(snp_launch(&azure));
    let trust = CvmAkTrust::sev_snp(CvmPlatform::AwsSevSnp, snp_policy_at_the_azure_tcb()).unwrap();
    let err = validator(trust, m)
        .validate_explained(&ev, &rd())
        .1
        .unwrap_err();
    assert!(
        matches!(&err, ValidationError::Field { field, observed, .. }
            if field == "key_info.signing_key" && observed == "VCEK"),
        "{err:?}"
    );
}

#[test]
fn the_platform_fixes_the_signer_whatever_the_policy_allows() {
    assert_eq!(
        CvmPlatform::AzureSevSnp.snp_signer(),
        Some(SignerKind::Vcek)
    );
    assert_eq!(CvmPlatform::AwsSevSnp.snp_signer(), Some(SignerKind::Vlek));
    assert_eq!(CvmPlatform::AzureTdx.snp_signer(), None);
    let vlek_only = SnpPolicy {
        allow_vcek: false,
        ..snp_policy_at_the_azure_tcb()
    };
    assert_eq!(
        CvmAkTrust::sev_snp(CvmPlatform::AzureSevSnp, vlek_only.clone()).unwrap_err(),
        CvmTrustError::SignerRefused {
            platform: CvmPlatform::AzureSevSnp,
            signer: SignerKind::Vcek
        }
    );
    CvmAkTrust::sev_snp(CvmPlatform::AwsSevSnp, vlek_only).unwrap();
    assert_eq!(
        CvmAkTrust::sev_snp(CvmPlatform::AzureTdx, snp_policy_at_the_azure_tcb()).unwrap_err(),
        CvmTrustError::NotSevSnp(CvmPlatform::AzureTdx)
    );
    let azure = azure_snp();
    assert!(azure.snp_policy().allow_vcek && !azure.snp_policy().allow_vlek);
    let aws = CvmAkTrust::sev_snp(CvmPlatform::AwsSevSnp, snp_policy_at_the_azure_tcb()).unwrap();
    assert!(!aws.snp_policy().allow_vcek && aws.snp_policy().allow_vlek);
}

#[test]
fn azure_tdx_does_not_require_sept_ve_disable_and_keeps_the_other_rules() {
    assert!(TdxPolicy::default().require_sept_ve_disable);
    let trust = CvmAkTrust::azure_tdx(TdxPolicy::default(), TdxCollateralSet::default());
    assert!(!trust.tdx_policy().require_sept_ve_disable);
    assert_eq!(
        trust.tdx_policy().accepted_tcb_statuses,
        TdxPolicy::default().accepted_tcb_statuses
    );
    // The insecure permission reaches both verifiers' policies.
    let insecure =
        trust.insecure_no_launch_measurement(InsecureNoLaunchMeasurement::insecure_new());
    assert!(
        insecure
            .tdx_policy()
            .insecure_no_launch_measurement
            .is_some()
    );
    assert!(
        insecure
            .snp_policy()
            .insecure_no_launch_measurement
            .is_some()
    );
}

#[test]
fn every_snp_mode_refuses_to_start_and_to_verify_without_a_launch_measurement() {
    for (platform, kind) in [
        (
            CvmPlatform::AzureSevSnp,
            azure_snp_kind(&read_cvm("snp-azure/runtimedata.bin")),
        ),
        (
            CvmPlatform::AwsSevSnp,
            PlatformKind::AwsSevSnp(AwsSnp {
                report: aws_snp_report(),
                certs: pem_der(&read_cvm("snp-aws/vlek.pem")),
            }),
        ),
    ] {
        let trust = CvmAkTrust::sev_snp(platform, snp_policy_at_the_azure_tcb()).unwrap();
        let none = CvmReferences::default();
        // Start: the binaries ask the trust before they serve.
        assert_eq!(
            trust.missing_references(&none),
            ["snp.launchMeasurement"],
            "{platform}"
        );
        let ak_trust = AkTrust::confidential_vm(trust);
        assert_eq!(
            ak_trust.require_references(&none).unwrap_err(),
            MissingReferences {
                platform,
                missing: vec!["snp.launchMeasurement"]
            }
        );
        // A warn-only value gates nothing, so it counts as missing.
        let warn_only = CvmReferences {
            snp_launch_measurement: Some(Reference::warn_only([0; 48])),
            ..CvmReferences::default()
        };
        assert!(ak_trust.require_references(&warn_only).is_err());
        ak_trust
            .require_references(&references_for(platform))
            .unwrap();

        // Every verification: the measurements file may have changed since the start.
        let (ev, m) = evidence(Some(kind), Some(azure_ak_public()));
        let m = m.with_cvm(warn_only);
        let trust = CvmAkTrust::sev_snp(platform, snp_policy_at_the_azure_tcb()).unwrap();
        let (checks, result) = validator(trust, m).validate_explained(&ev, &rd());
        assert!(
            matches!(&result, Err(ValidationError::Field { field, .. })
                if field == "snp.launchMeasurement"),
            "{platform}: {result:?}"
        );
        assert_eq!(checks.len(), 1, "refused before the report is read");
    }
}

#[test]
fn the_insecure_option_accepts_a_missing_launch_measurement_with_a_warning() {
    let runtime = read_cvm("snp-azure/runtimedata.bin");
    let (ev, m) = evidence(Some(azure_snp_kind(&runtime)), Some(azure_ak_public()));
    let m = m.with_cvm(CvmReferences {
        snp_host_data: Some(Reference::warn_only([0; 32])),
        ..CvmReferences::default()
    });
    let trust =
        azure_snp().insecure_no_launch_measurement(InsecureNoLaunchMeasurement::insecure_new());
    trust.require_references(&CvmReferences::default()).unwrap();
    let (checks, result) = validator(trust, m).validate_explained(&ev, &rd());
    // Hardware → AK passed; only the software quote signature is left to refuse.
    assert!(
        matches!(result, Err(ValidationError::BadSignature(_))),
        "{result:?}"
    );
    let measurement = checks.iter().find(|c| c.field == "measurement").unwrap();
    assert_eq!(measurement.outcome, Outcome::Warn);
    assert!(
        measurement
            .expected
            .contains("insecure_no_launch_measurement")
    );
}

#[test]
fn azure_tdx_requires_mrtd_and_all_four_rtmrs() {
    let trust = CvmAkTrust::azure_tdx(TdxPolicy::default(), TdxCollateralSet::default());
    assert_eq!(
        trust.missing_references(&CvmReferences::default()),
        [
            "tdx.mrtd",
            "tdx.rtmr0",
            "tdx.rtmr1",
            "tdx.rtmr2",
            "tdx.rtmr3"
        ]
    );
    let mut references = references_for(CvmPlatform::AzureTdx);
    assert!(trust.missing_references(&references).is_empty());
    references.tdx_rtmrs[3] = None;
    assert_eq!(trust.missing_references(&references), ["tdx.rtmr3"]);
    let err = trust.require_references(&references).unwrap_err();
    assert!(
        err.to_string().contains("--insecure-no-launch-measurement"),
        "{err}"
    );
    let insecure =
        trust.insecure_no_launch_measurement(InsecureNoLaunchMeasurement::insecure_new());
    insecure.require_references(&references).unwrap();
}

/// A v4 DCAP quote as the evidence's Azure TDX quote, with its collateral.
fn dcap_quote() -> (Vec<u8>, TdxCollateralSet) {
    let mut quote = read_cvm("tdx-dcap/tdx_quote");
    let sig_at = 48 + 584 + 4;
    let sig_len = u32::from_le_bytes(quote[sig_at - 4..sig_at].try_into().unwrap()) as usize;
    quote.truncate(sig_at + sig_len);
    let collateral =
        TdxCollateral::from_json(&read_cvm("tdx-dcap/tdx_quote_collateral.json")).unwrap();
    (quote, TdxCollateralSet::new(vec![collateral]).unwrap())
}

/// Inside the sample collateral's validity (2025-07-01).
fn tdx_now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_751_328_000)
}

/// Azure TDX evidence of the sample DCAP quote (genuine, verified to Intel's root with its
/// collateral) beside `runtime_data`, which its REPORT_DATA does not bind, and what it gets.
fn sample_quote_beside(
    runtime_data: Vec<u8>,
) -> (
    Vec<asterism_attestation::explain::Check>,
    Result<asterism_attestation::VerifiedEvidence, ValidationError>,
) {
    let (quote, collateral) = dcap_quote();
    let td = TdQuote::parse(&quote).unwrap().report().clone();
    let kind = PlatformKind::AzureTdx(AzureTdx {
        quote,
        runtime_data,
    });
    let (ev, m) = evidence(Some(kind), Some(azure_ak_public()));
    let m = m.with_cvm(tdx_launch(&td));
    let trust = CvmAkTrust::azure_tdx(TdxPolicy::default(), collateral);
    let validator = TpmQuoteValidator::new(AkTrust::confidential_vm(trust), m.into_provider())
        .with_clock(tdx_now);
    validator.validate_explained(&ev, &rd())
}

#[test]
fn an_azure_tdx_quote_that_does_not_bind_the_runtime_data_is_refused() {
    // A genuine quote, but its REPORT_DATA is not SHA-256 of this runtime data: the quote
    // vouches for nothing in it.
    let (_, runtime) = azure_td_report();
    let (checks, result) = sample_quote_beside(runtime);
    assert_refused_at_the_binding("Azure TDX", &checks, &result);
}

#[test]
fn runtime_data_no_hardware_report_binds_is_refused_at_the_binding_and_never_parsed() {
    // The real runtime data's length (the HCL report's sizes must add up), but not JSON
    // from its first byte. Parsed first, it would fail with a parse error; it must instead
    // only be hashed, and be refused when the genuine report's REPORT_DATA does not match
    // that hash.
    let mut garbage = read_cvm("snp-azure/runtimedata.bin");
    garbage[0] = b'x';
    let (ev, m) = evidence(Some(azure_snp_kind(&garbage)), Some(azure_ak_public()));
    let (checks, result) = validator(azure_snp(), m).validate_explained(&ev, &rd());
    assert_refused_at_the_binding("Azure SEV-SNP", &checks, &result);

    let (_, mut garbage) = azure_td_report();
    garbage[0] = b'x';
    let (checks, result) = sample_quote_beside(garbage);
    assert_refused_at_the_binding("Azure TDX", &checks, &result);
}

#[test]
fn the_real_azure_td_report_passes_the_field_checks_and_binds_its_ak() {
    // Azure's TD is its paravisor: TD attributes 0 (SEPT_VE_DISABLE clear), every RTMR 0.
    let (report, runtime) = azure_td_report();
    assert_eq!(report.td_attributes, [0; 8]);
    assert_eq!(report.rtmr, [[0; 48]; 4]);
    // The platform's policy, pinned to this launch: every field check passes.
    let references = tdx_launch(&report);
    let policy = TdxPolicy {
        mrtd: references.tdx_mrtd,
        rtmrs: references.tdx_rtmrs,
        require_sept_ve_disable: false,
        ..TdxPolicy::default()
    };
    let expected = hcl::runtime_data_report_data(&runtime);
    let mut ex = asterism_attestation::explain::Explanation::default();
    check_fields(
        &policy,
        &report,
        TcbStatus::UpToDate,
        &[],
        &expected,
        &mut ex,
    )
    .unwrap();
    assert!(ex.first_failure().is_none(), "{ex:?}");
    // Runtime data → AK: the real AK is the runtime data's HCLAkPub.
    hcl::hcl_ak_matches(
        &RuntimeData::parse(&runtime).unwrap(),
        &asterism_testkit::cvm::azure_ak_public(&runtime),
    )
    .unwrap();
    // The default (a TD whose own kernel takes #VE) would refuse it.
    let strict = TdxPolicy {
        require_sept_ve_disable: true,
        ..policy
    };
    let mut ex = asterism_attestation::explain::Explanation::default();
    let err = check_fields(
        &strict,
        &report,
        TcbStatus::UpToDate,
        &[],
        &expected,
        &mut ex,
    )
    .unwrap_err();
    assert!(
        matches!(&err, ValidationError::Field { field, .. } if field == "td_attributes.sept_ve_disable"),
        "{err:?}"
    );
}

#[test]
fn a_leaf_alone_is_chained_through_the_embedded_intermediate() {
    // Azure serves the VCEK without its ASK; the verifier has AMD's ASKs built in.
    let runtime = read_cvm("snp-azure/runtimedata.bin");
    let PlatformKind::AzureSevSnp(mut azure) = azure_snp_kind(&runtime) else {
        unreachable!()
    };
    azure.certs.truncate(1);
    let (ev, m) = evidence(
        Some(PlatformKind::AzureSevSnp(azure)),
        Some(azure_ak_public()),
    );
    let (checks, result) = validator(azure_snp(), m).validate_explained(&ev, &rd());
    assert!(
        matches!(result, Err(ValidationError::BadSignature(_))),
        "{result:?}"
    );
    assert!(
        checks.iter().all(|c| c.outcome != Outcome::Fail),
        "{checks:#?}"
    );
    // Three certificates are not a shape the evidence has.
    let PlatformKind::AzureSevSnp(mut three) = azure_snp_kind(&runtime) else {
        unreachable!()
    };
    three.certs.push(three.certs[0].clone());
    let (ev, m) = evidence(
        Some(PlatformKind::AzureSevSnp(three)),
        Some(azure_ak_public()),
    );
    let err = validator(azure_snp(), m)
        .validate_explained(&ev, &rd())
        .1
        .unwrap_err();
    assert!(matches!(err, ValidationError::Malformed(_)), "{err:?}");
}

/// The sample collateral with its TCB info naming another FMSPC (its signature no longer
/// holds; enough to count sets).
fn collateral_for_another_platform() -> TdxCollateral {
    let json = String::from_utf8(read_cvm("tdx-dcap/tdx_quote_collateral.json")).unwrap();
    let other = json.replace("B0C06F000000", "00906ED50000");
    assert_ne!(json, other);
    TdxCollateral::from_json(other.as_bytes()).unwrap()
}

#[test]
fn collateral_sets_count_what_they_hold() {
    let empty = TdxCollateralSet::default();
    assert_eq!((empty.len(), empty.is_empty()), (0, true));
    let (_, one) = dcap_quote();
    assert_eq!((one.len(), one.is_empty()), (1, false));
    let c = TdxCollateral::from_json(&read_cvm("tdx-dcap/tdx_quote_collateral.json")).unwrap();
    let two = TdxCollateralSet::new(vec![c.clone(), collateral_for_another_platform()]).unwrap();
    assert_eq!((two.len(), two.is_empty()), (2, false));
    let trust = CvmAkTrust::azure_tdx(TdxPolicy::default(), two);
    assert!(format!("{trust:?}").contains("tdx_collateral_sets: 2"));
    // The same platform twice is one set.
    let same = TdxCollateralSet::new(vec![c.clone(), c]).unwrap();
    assert_eq!(same.len(), 1);
}

#[test]
fn the_quote_is_verified_only_against_its_own_platforms_collateral() {
    let (quote, _) = dcap_quote();
    let c = TdxCollateral::from_json(&read_cvm("tdx-dcap/tdx_quote_collateral.json")).unwrap();
    let (_, runtime) = azure_td_report();
    let td = TdQuote::parse(&quote).unwrap().report().clone();
    let verify = |set: TdxCollateralSet| {
        let kind = PlatformKind::AzureTdx(AzureTdx {
            quote: quote.clone(),
            runtime_data: runtime.clone(),
        });
        let (ev, m) = evidence(Some(kind), Some(azure_ak_public()));
        let trust = CvmAkTrust::azure_tdx(TdxPolicy::default(), set);
        TpmQuoteValidator::new(
            AkTrust::confidential_vm(trust),
            m.with_cvm(tdx_launch(&td)).into_provider(),
        )
        .with_clock(tdx_now)
        .validate_explained(&ev, &rd())
    };
    // Another platform's set only: refused by name, before any signature is checked.
    let (checks, result) =
        verify(TdxCollateralSet::new(vec![collateral_for_another_platform()]).unwrap());
    assert!(
        matches!(&result, Err(ValidationError::Certificate { reason, .. })
            if reason.contains("FMSPC B0C06F000000")),
        "{result:?}"
    );
    assert_eq!(checks.last().unwrap().field, "tdx_collateral");
    // Beside its own, in either order, its own is the one used.
    for set in [
        vec![collateral_for_another_platform(), c.clone()],
        vec![c.clone(), collateral_for_another_platform()],
    ] {
        let result = verify(TdxCollateralSet::new(set).unwrap()).1;
        assert!(
            matches!(result, Err(ValidationError::BindingMismatch)),
            "{result:?}"
        );
    }
}

#[test]
fn the_newest_tcb_info_of_a_platform_decides_whatever_the_order() {
    // Two real collateral sets of the same FMSPC: TCB evaluation 17 (valid on 2025-07-01,
    // under which the v4 sample quote's platform is UpToDate) and 20 (issued 2026-10-08).
    let (quote, _) = dcap_quote();
    let c17 = TdxCollateral::from_json(&read_cvm("tdx-dcap/tdx_quote_collateral.json")).unwrap();
    let c20 =
        TdxCollateral::from_json(&read_cvm("tdx-dcap/tdx_quote_td15ex_collateral.json")).unwrap();
    assert_eq!(c17.fmspc(), c20.fmspc());
    assert_eq!(c17.freshness().unwrap().0, 17);
    assert_eq!(c20.freshness().unwrap().0, 20);
    let (_, runtime) = azure_td_report();
    let td = TdQuote::parse(&quote).unwrap().report().clone();
    let verify = |set: TdxCollateralSet| {
        let kind = PlatformKind::AzureTdx(AzureTdx {
            quote: quote.clone(),
            runtime_data: runtime.clone(),
        });
        let (ev, m) = evidence(Some(kind), Some(azure_ak_public()));
        let trust = CvmAkTrust::azure_tdx(TdxPolicy::default(), set);
        TpmQuoteValidator::new(
            AkTrust::confidential_vm(trust),
            m.with_cvm(tdx_launch(&td)).into_provider(),
        )
        .with_clock(tdx_now)
        .validate_explained(&ev, &rd())
        .1
        .unwrap_err()
    };
    // Evaluation 17 alone: the quote and its collateral verify; only the binding to this
    // runtime data fails.
    let alone = verify(TdxCollateralSet::new(vec![c17.clone()]).unwrap());
    assert!(
        matches!(alone, ValidationError::BindingMismatch),
        "{alone:?}"
    );
    // Beside evaluation 20, in either order, 20 decides: on 2025-07-01 it is not yet valid,
    // and the older set is not tried instead.
    for set in [
        vec![c17.clone(), c20.clone()],
        vec![c20.clone(), c17.clone()],
    ] {
        let set = TdxCollateralSet::new(set).unwrap();
        assert_eq!(set.len(), 1);
        let err = verify(set);
        assert!(
            matches!(&err, ValidationError::Certificate { .. }),
            "{err:?}"
        );
    }
}

#[test]
fn cvm_references_are_empty_only_without_any_value() {
    assert!(CvmReferences::default().is_empty());
    for one in [
        CvmReferences {
            snp_host_data: Some(Reference::enforce([0; 32])),
            ..CvmReferences::default()
        },
        CvmReferences {
            tdx_rtmrs: [None, None, None, Some(Reference::enforce([0; 48]))],
            ..CvmReferences::default()
        },
    ] {
        assert!(!one.is_empty());
    }
}

#[test]
fn the_real_azure_snp_report_verifies_end_to_end_with_a_floor_at_its_own_tcb() {
    let azure = read_cvm("snp-azure/attestation.bin");
    let report = SnpReport::parse(&azure[..hcl::SNP_REPORT_SIZE]).unwrap();
    let tcb = report
        .reported_tcb
        .parts(asterism_attestation::snp::Product::Milan);
    let runtime = read_cvm("snp-azure/runtimedata.bin");

    // The default Milan floor refuses it: its boot loader SPL predates the floor.
    let default = CvmAkTrust::sev_snp(CvmPlatform::AzureSevSnp, SnpPolicy::default()).unwrap();
    let (ev, m) = evidence(Some(azure_snp_kind(&runtime)), Some(azure_ak_public()));
    let err = validator(default, m)
        .validate_explained(&ev, &rd())
        .1
        .unwrap_err();
    assert!(
        matches!(&err, ValidationError::Field { field, observed, .. }
            if field == "reported_tcb.bootloader" && *observed == tcb.bootloader.to_string()),
        "{err:?}"
    );

    // An operator who lowers the Milan floor to this report's TCB, in the policy file.
    let json = format!(
        r#"{{"snp": {{"minimumTcb": {{"milan": {{"bootloader": {}, "tee": {}, "snp": {}, "microcode": {}}}}}}}}}"#,
        tcb.bootloader, tcb.tee, tcb.snp, tcb.microcode
    );
    let file = asterism_attestation::cvm_policy::CvmPolicy::from_json(json.as_bytes()).unwrap();
    let trust = CvmAkTrust::sev_snp(CvmPlatform::AzureSevSnp, file.snp).unwrap();
    let (ev, m) = evidence(Some(azure_snp_kind(&runtime)), Some(azure_ak_public()));
    let (checks, result) = validator(trust, m).validate_explained(&ev, &rd());
    // Hardware report → VCEK → AMD root, launch measurement, REPORT_DATA → runtime data →
    // AK: every check passes. The quote was signed by our software key, not by that AK,
    // so only its signature, the next step, refuses it: a quote by the real vTPM's AK
    // needs an Azure instance.
    assert!(
        matches!(result, Err(ValidationError::BadSignature(_))),
        "{result:?}"
    );
    for field in [
        "key_info.signing_key",
        "signature",
        "reported_tcb.bootloader",
        "measurement",
        "report_data",
    ] {
        assert!(
            checks
                .iter()
                .any(|c| c.field == field && c.outcome == Outcome::Pass),
            "{field}: {checks:#?}"
        );
    }
    assert!(
        checks.iter().all(|c| c.outcome == Outcome::Pass),
        "{checks:#?}"
    );
}

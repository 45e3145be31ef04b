//! The hardware report a confidential VM attaches to its evidence (`platform.rs`), gathered
//! from real parts where they run here: swtpm stands in for the vTPM (the test writes the
//! real Azure SEV-SNP HCL report into its NV index, as Azure's paravisor does), a loopback
//! HTTP server stands in for the cloud's instance metadata service and serves the real
//! certificates, and the real verifier checks the result.
//!
//! This is as far as a machine without Azure or AWS hardware can go: the real SNP report
//! verifies, and the evidence is refused only because swtpm's AK is not the AK the Azure
//! runtime data names (its private key lives in an Azure vTPM). The SNP report over an AK
//! from configfs-tsm (AWS) and Azure's quote of a TD report need the real machines.

use std::collections::VecDeque;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use asterism_attestation::explain::Outcome;
use asterism_attestation::explain::Reference;
use asterism_attestation::hcl::{HCL_REPORT_NV_INDEX, HardwareKind, HardwareReport, HclReport};
use asterism_attestation::snp::SnpReport;
use asterism_attestation::tpm::{
    AkTrust, AzureSnp, AzureTdx, CvmAkTrust, CvmPlatform, PlatformKind, TpmQuoteValidator,
};
use asterism_attestation::{
    CvmReferences, ExpectedPcr, Issuer as _, Measurements, PcrIndex, ReportData, Role,
    ValidationError,
};
use asterism_bootstrapper::platform::{self, PlatformError};
use asterism_metadata::imds::{DEFAULT_IMDS_URL, Imds, ImdsError, MAX_IMDS_BODY};
use asterism_testkit::Swtpm;
use asterism_testkit::cvm::{read_cvm, snp_policy_at_the_azure_tcb};
use asterism_tpm::{AkAlgorithm, AkConfig, PcrSelection, Tpm, TpmIssuer};
use asterism_tsm::{CertKind, ConfigfsTsm, TsmError};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

fn pem_der(pem: &[u8]) -> Vec<Vec<u8>> {
    x509_parser::pem::Pem::iter_from_buffer(pem)
        .map(|p| p.unwrap().contents)
        .collect()
}

// ---- the stand-in for the instance metadata service ----

/// What the stand-in answers, one per request in order; the last is repeated.
#[derive(Clone)]
enum Reply {
    Ok(String),
    Status(u16),
    Oversized,
    /// Answers only after this long.
    Slow(Duration),
}

/// A request as the stand-in received it.
#[derive(Debug, Clone)]
struct Received {
    method: String,
    path: String,
    metadata_header: Option<String>,
    body: Vec<u8>,
}

struct StandIn {
    url: String,
    received: Arc<Mutex<Vec<Received>>>,
}

impl StandIn {
    async fn start(replies: Vec<Reply>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let received = Arc::new(Mutex::new(Vec::new()));
        let replies = Arc::new(Mutex::new(VecDeque::from(replies)));
        let log = received.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let (log, replies) = (log.clone(), replies.clone());
                let service =
                    hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                        let (log, replies) = (log.clone(), replies.clone());
                        async move {
                            let (parts, body) = request.into_parts();
                            let body = body.collect().await?.to_bytes().to_vec();
                            log.lock().unwrap().push(Received {
                                method: parts.method.to_string(),
                                path: parts.uri.path().to_owned(),
                                metadata_header: parts
                                    .headers
                                    .get("metadata")
                                    .map(|v| v.to_str().unwrap().to_owned()),
                                body,
                            });
                            let reply = {
                                let mut replies = replies.lock().unwrap();
                                if replies.len() > 1 {
                                    replies.pop_front().unwrap()
                                } else {
                                    replies.front().unwrap().clone()
                                }
                            };
                            let (status, body) = match reply {
                                Reply::Ok(json) => (200, json.into_bytes()),
                                Reply::Status(status) => (status, b"{}".to_vec()),
                                Reply::Oversized => (200, vec![b' '; MAX_IMDS_BODY + 1]),
                                Reply::Slow(after) => {
                                    tokio::time::sleep(after).await;
                                    (200, b"{}".to_vec())
                                }
                            };
                            Ok::<_, hyper::Error>(
                                Response::builder()
                                    .status(status)
                                    .body(Full::new(Bytes::from(body)))
                                    .unwrap(),
                            )
                        }
                    });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service),
                );
            }
        });
        Self { url, received }
    }

    fn imds(&self) -> Imds {
        Imds::new(&self.url)
            .unwrap()
            .with_retries(3, Duration::from_millis(10))
    }

    fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

/// THIM's answer built from the real certificates of the Azure SNP test data.
fn thim_json() -> String {
    serde_json::json!({
        "vcekCert": String::from_utf8(read_cvm("snp-azure/vcek.pem")).unwrap(),
        "certificateChain": String::from_utf8(read_cvm("snp-azure/certchain.pem")).unwrap(),
        "tcbm": "DB18000000000004",
    })
    .to_string()
}

/// [VCEK, ASK], DER, of the Azure SNP test data.
fn azure_vcek_and_ask() -> Vec<Vec<u8>> {
    vec![
        pem_der(&read_cvm("snp-azure/vcek.pem")).remove(0),
        pem_der(&read_cvm("snp-azure/certchain.pem")).remove(0),
    ]
}

// ---- Azure SEV-SNP, end to end over swtpm ----

fn azure_snp_hcl_report() -> Vec<u8> {
    asterism_testkit::cvm::azure_snp_hcl_report().unwrap()
}

/// Plays Azure's paravisor: defines the HCL report's NV index and writes `data` into it,
/// with tpm2-tools (only asterism-tpm talks to the TSS directly). `false` when tpm2-tools
/// is not installed.
fn paravisor_writes(swtpm: &Swtpm, data: &[u8]) -> bool {
    nv_writes(swtpm, HCL_REPORT_NV_INDEX, data)
}

/// Defines NV index `index` of `data`'s size in `swtpm` and writes `data` to it, with
/// tpm2-tools; false when they are not installed.
fn nv_writes(swtpm: &Swtpm, index: u32, data: &[u8]) -> bool {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nv.bin");
    std::fs::write(&file, data).unwrap();
    let index = format!("{index:#x}");
    let size = data.len().to_string();
    let steps: [&[&str]; 2] = [
        &[
            "tpm2_nvdefine",
            &index,
            "-C",
            "o",
            "-s",
            &size,
            "-a",
            "ownerread|ownerwrite",
        ],
        &[
            "tpm2_nvwrite",
            &index,
            "-C",
            "o",
            "-i",
            file.to_str().unwrap(),
        ],
    ];
    for args in steps {
        let output = match asterism_children::output(
            Command::new(args[0])
                .args(&args[1..])
                .args(["-T", &swtpm.tcti()]),
        ) {
            Ok(output) => output,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return false,
            Err(e) => panic!("running {}: {e}", args[0]),
        };
        assert!(
            output.status.success(),
            "{}: {}",
            args[0],
            String::from_utf8_lossy(&output.stderr)
        );
    }
    true
}

/// 2025-06-01: inside the validity of the Azure SNP test certificates.
fn snp_now() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_748_736_000)
}

#[tokio::test(flavor = "multi_thread")]
async fn azure_snp_report_and_thim_certs_verify_and_only_the_foreign_ak_is_refused() {
    let swtpm = Swtpm::start().unwrap();
    // swtpm caps an NV index at 2048 bytes; Azure pads its (larger) index the same way.
    let mut index = azure_snp_hcl_report();
    index.resize(2048, 0);
    if !paravisor_writes(&swtpm, &index) {
        eprintln!("tpm2-tools not installed; skipping the Azure SEV-SNP issuing test");
        return;
    }
    let imds = StandIn::start(vec![Reply::Ok(thim_json())]).await;

    // As the bootstrapper starts: the HCL report is read before the TPM moves into the issuer.
    let mut tpm = Tpm::open(&swtpm.config()).unwrap();
    let pcr0 = tpm.read_pcrs(&PcrSelection::new([0]).unwrap()).unwrap()[0].1;
    let hcl = platform::read_from_tpm(CvmPlatform::AzureSevSnp, &mut tpm).unwrap();
    // RSA-2048, as Azure's vTPM AK; but not that AK, whose private key is in Azure.
    let ak = AkConfig::new(AkAlgorithm::Rsa2048);
    let issuer = TpmIssuer::new(tpm, &ak, PcrSelection::all(), Vec::new()).unwrap();
    let kind = platform::gather(
        CvmPlatform::AzureSevSnp,
        hcl,
        issuer.ak_public(),
        &imds.imds(),
        ConfigfsTsm::new("/nonexistent"),
    )
    .await
    .unwrap();

    let PlatformKind::AzureSevSnp(AzureSnp { hcl_report, certs }) = &kind else {
        panic!("want an Azure SEV-SNP report, got {kind:?}");
    };
    assert_eq!(hcl_report, &index, "the vTPM's HCL report, as read");
    assert_eq!(certs, &azure_vcek_and_ask(), "DER [VCEK, ASK] from THIM");
    let received = imds.received();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].method, "GET");
    assert_eq!(received[0].path, "/metadata/THIM/amd/certification");
    assert_eq!(received[0].metadata_header.as_deref(), Some("true"));

    // The bootstrapper's own check refuses to start with it, naming the AK field ...
    match platform::check_ak(&kind, issuer.ak_public()) {
        Err(PlatformError::ForeignAk {
            platform: CvmPlatform::AzureSevSnp,
            source: ValidationError::Field { field, .. },
        }) => assert_eq!(field, "runtime_data.keys[HCLAkPub].n"),
        other => panic!("want the foreign AK refused, got {other:?}"),
    }

    // ... and so does a verifier: the evidence carrying it, checked as on Azure SEV-SNP.
    // The launch pinned to the report's own measurement (every SEV-SNP mode requires one).
    let PlatformKind::AzureSevSnp(AzureSnp { hcl_report, .. }) = &kind else {
        unreachable!()
    };
    let parsed = HclReport::parse(hcl_report).unwrap();
    let HardwareReport::Snp(snp) = parsed.hardware_report() else {
        panic!("not SEV-SNP")
    };
    let launch = SnpReport::parse(snp).unwrap().measurement;
    let issuer = issuer.with_platform_report(kind);
    let rd = ReportData::atls(Role::Client, &[7; 32]);
    let evidence = issuer.issue(&rd).unwrap();
    // The Milan floor at the test report's own TCB, which the default floor refuses (the
    // floors are tested on their own in asterism-attestation).
    let policy = snp_policy_at_the_azure_tcb();
    let trust = CvmAkTrust::sev_snp(CvmPlatform::AzureSevSnp, policy).unwrap();
    let m = Measurements::new([(PcrIndex::new(0).unwrap(), ExpectedPcr::enforce(pcr0))])
        .unwrap()
        .with_cvm(CvmReferences {
            snp_launch_measurement: Some(Reference::enforce(launch)),
            ..CvmReferences::default()
        });
    let validator = TpmQuoteValidator::new(AkTrust::confidential_vm(trust), m.into_provider())
        .with_clock(snp_now);
    let (checks, result) = validator.validate_explained(&evidence, &rd);

    let passed = |field: &str| {
        checks
            .iter()
            .any(|c| c.field == field && c.outcome == Outcome::Pass)
    };
    assert!(passed("signature"), "the SNP report verifies: {checks:#?}");
    assert!(
        passed("report_data"),
        "it binds the runtime data: {checks:#?}"
    );
    match result {
        Err(ValidationError::Field { field, .. }) => {
            assert_eq!(field, "runtime_data.keys[HCLAkPub].n")
        }
        other => panic!("want only the AK refused, got {other:?}"),
    }
    let failed: Vec<_> = checks
        .iter()
        .filter(|c| c.outcome == Outcome::Fail)
        .map(|c| &*c.field)
        .collect();
    assert_eq!(failed, ["runtime_data.keys[HCLAkPub].n"], "{checks:#?}");
}

#[tokio::test]
async fn azure_snp_refuses_an_hcl_report_that_does_not_parse_before_asking_thim() {
    let imds = StandIn::start(vec![Reply::Ok(thim_json())]).await;
    let mut hcl = azure_snp_hcl_report();
    hcl[0] = b'X';
    let err = platform::azure_sev_snp(hcl, &imds.imds())
        .await
        .unwrap_err();
    assert!(matches!(err, PlatformError::HclReport(_)), "{err:?}");
    assert!(imds.received().is_empty());
}

#[tokio::test]
async fn azure_snp_refuses_a_tdx_hcl_report_before_asking_thim() {
    let imds = StandIn::start(vec![Reply::Ok(thim_json())]).await;
    let err = platform::azure_sev_snp(read_cvm("tdx-azure-hcl/hclreport.bin"), &imds.imds())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            PlatformError::WrongHardware {
                platform: CvmPlatform::AzureSevSnp,
                found: HardwareKind::Tdx
            }
        ),
        "{err:?}"
    );
    assert!(imds.received().is_empty());
}

#[tokio::test]
async fn an_azure_platform_without_the_hcl_report_is_refused() {
    let imds = StandIn::start(vec![Reply::Ok(thim_json())]).await;
    let err = platform::gather(
        CvmPlatform::AzureSevSnp,
        None,
        &[],
        &imds.imds(),
        ConfigfsTsm::new("/nonexistent"),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, PlatformError::NoHclReport(CvmPlatform::AzureSevSnp)),
        "{err:?}"
    );
}

// ---- the instance metadata client: deadlines, caps, retries ----

#[tokio::test]
async fn a_failing_service_is_retried_and_its_answer_then_taken() {
    let imds = StandIn::start(vec![
        Reply::Status(500),
        Reply::Status(503),
        Reply::Ok(thim_json()),
    ])
    .await;
    let certs = platform::azure_vcek(&imds.imds()).await.unwrap();
    assert_eq!(certs, azure_vcek_and_ask());
    assert_eq!(imds.received().len(), 3);
}

#[tokio::test]
async fn a_service_that_keeps_failing_is_named_with_its_status_after_every_attempt() {
    let imds = StandIn::start(vec![Reply::Status(500)]).await;
    let err = platform::azure_vcek(&imds.imds()).await.unwrap_err();
    let url = format!("{}/metadata/THIM/amd/certification", imds.url);
    match &err {
        PlatformError::Imds(ImdsError::Status { url: u, status }) => {
            assert_eq!((u.as_str(), *status), (url.as_str(), 500))
        }
        other => panic!("want the status, got {other:?}"),
    }
    assert!(err.to_string().contains(&url), "{err}");
    assert_eq!(imds.received().len(), 3, "three attempts");
}

#[tokio::test]
async fn a_client_error_status_is_not_retried() {
    let imds = StandIn::start(vec![Reply::Status(404)]).await;
    let err = platform::azure_vcek(&imds.imds()).await.unwrap_err();
    assert!(
        matches!(
            err,
            PlatformError::Imds(ImdsError::Status { status: 404, .. })
        ),
        "{err:?}"
    );
    assert_eq!(imds.received().len(), 1);
}

#[tokio::test]
async fn an_answer_over_the_cap_is_refused_naming_the_url() {
    let imds = StandIn::start(vec![Reply::Oversized]).await;
    let err = platform::azure_vcek(&imds.imds()).await.unwrap_err();
    match &err {
        PlatformError::Imds(ImdsError::TooLarge { url, cap }) => {
            assert!(url.starts_with(&imds.url), "{url}");
            assert_eq!(*cap, MAX_IMDS_BODY);
        }
        other => panic!("want the cap, got {other:?}"),
    }
    assert_eq!(imds.received().len(), 1, "not retried");
}

#[tokio::test]
async fn a_slow_service_times_out_on_each_attempt() {
    let imds = StandIn::start(vec![Reply::Slow(Duration::from_secs(5))]).await;
    let client = imds
        .imds()
        .with_timeout(Duration::from_millis(200))
        .with_retries(2, Duration::from_millis(10));
    let err = client.azure_thim().await.unwrap_err();
    match &err {
        ImdsError::Timeout { url, after } => {
            assert!(url.starts_with(&imds.url), "{url}");
            assert_eq!(*after, Duration::from_millis(200));
        }
        other => panic!("want a timeout, got {other:?}"),
    }
    assert_eq!(imds.received().len(), 2, "two attempts");
}

#[tokio::test]
async fn an_answer_that_is_not_thim_json_is_refused_naming_the_url() {
    for body in [
        "{not json",
        r#"{"vcekCert": "", "certificateChain": ""}"#,
        r#"{"vcekCert": "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"}"#,
    ] {
        let imds = StandIn::start(vec![Reply::Ok(body.into())]).await;
        let err = platform::azure_vcek(&imds.imds()).await.unwrap_err();
        assert!(
            matches!(
                err,
                PlatformError::Imds(ImdsError::Decode { .. }) | PlatformError::ThimCerts { .. }
            ),
            "{body}: {err:?}"
        );
        assert!(err.to_string().contains(&imds.url), "{err}");
        assert_eq!(imds.received().len(), 1, "not retried");
    }
}

#[tokio::test]
async fn a_closed_port_is_retried_and_named() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let err = Imds::new(&url)
        .unwrap()
        .with_retries(2, Duration::from_millis(10))
        .azure_thim()
        .await
        .unwrap_err();
    assert!(matches!(err, ImdsError::Request { .. }), "{err:?}");
    assert!(err.to_string().contains(&url), "{err}");
}

#[test]
fn the_imds_url_must_be_plain_http_with_a_host() {
    assert!(Imds::new(DEFAULT_IMDS_URL).is_ok());
    for bad in [
        "https://169.254.169.254",
        "169.254.169.254",
        "http://169.254.169.254/?x=1",
        "not a url",
    ] {
        assert!(
            matches!(Imds::new(bad), Err(ImdsError::InvalidUrl { .. })),
            "{bad}"
        );
    }
}

// ---- Azure TDX ----

#[tokio::test]
async fn azure_tdx_asks_for_a_quote_of_the_td_report_in_base64url() {
    let hcl = read_cvm("tdx-azure-hcl/hclreport.bin");
    let parsed = HclReport::parse(&hcl).unwrap();
    let HardwareReport::Tdx(td_report) = parsed.hardware_report() else {
        panic!("the test data holds a TD report");
    };
    let quote = read_cvm("tdx-dcap/tdx_quote");
    let answer = serde_json::json!({ "quote": URL_SAFE_NO_PAD.encode(&quote) }).to_string();
    let imds = StandIn::start(vec![Reply::Status(503), Reply::Ok(answer)]).await;

    let kind = platform::azure_tdx(&hcl, &imds.imds()).await.unwrap();
    let PlatformKind::AzureTdx(AzureTdx {
        quote: got,
        runtime_data,
    }) = kind
    else {
        panic!("want an Azure TDX report");
    };
    assert_eq!(got, quote);
    assert_eq!(runtime_data, parsed.runtime_data());

    let received = imds.received();
    assert_eq!(received.len(), 2, "the 503 was retried");
    let request = &received[1];
    assert_eq!(
        (request.method.as_str(), request.path.as_str()),
        ("POST", "/acc/tdquote")
    );
    let json: serde_json::Value = serde_json::from_slice(&request.body).unwrap();
    let report = json["report"].as_str().unwrap();
    assert!(!report.contains('='), "no padding");
    assert_eq!(URL_SAFE_NO_PAD.decode(report).unwrap(), td_report);
}

#[tokio::test]
async fn azure_tdx_refuses_a_quote_that_is_not_base64url() {
    let hcl = read_cvm("tdx-azure-hcl/hclreport.bin");
    let imds = StandIn::start(vec![Reply::Ok(r#"{"quote": "+/+/"}"#.into())]).await;
    let err = platform::azure_tdx(&hcl, &imds.imds()).await.unwrap_err();
    assert!(
        matches!(err, PlatformError::Imds(ImdsError::Decode { .. })),
        "{err:?}"
    );
    assert!(err.to_string().contains("/acc/tdquote"), "{err}");
}

#[tokio::test]
async fn azure_tdx_refuses_an_snp_hcl_report() {
    let imds = StandIn::start(vec![Reply::Status(500)]).await;
    let err = platform::azure_tdx(&azure_snp_hcl_report(), &imds.imds())
        .await
        .unwrap_err();
    assert!(
        matches!(err, PlatformError::WrongHardware { .. }),
        "{err:?}"
    );
    assert!(imds.received().is_empty());
}

// ---- AWS SEV-SNP ----

/// A certificate table as the host attaches it to an extended report: 24-byte entries
/// (GUID, offset, length), an all-zero terminator, then the certificates.
fn cert_table(certs: &[(CertKind, &[u8])]) -> Vec<u8> {
    let table_len = (certs.len() + 1) * 24;
    let mut table = Vec::new();
    let mut blobs = Vec::new();
    for (kind, der) in certs {
        table.extend_from_slice(&kind.guid());
        let offset = u32::try_from(table_len + blobs.len()).unwrap();
        table.extend_from_slice(&offset.to_le_bytes());
        table.extend_from_slice(&u32::try_from(der.len()).unwrap().to_le_bytes());
        blobs.extend_from_slice(der);
    }
    table.extend_from_slice(&[0; 24]);
    table.extend_from_slice(&blobs);
    table
}

#[test]
fn the_vlek_and_its_asvk_are_taken_from_the_certificate_table() {
    let vlek = pem_der(&read_cvm("snp-aws/vlek.pem")).remove(0);
    let chain = pem_der(&read_cvm("snp-aws/certchain.pem"));
    let (asvk, ark) = (&chain[0], &chain[1]);
    // The host's order need not be the evidence's; the ARK is left out.
    let blob = cert_table(&[
        (CertKind::Ark, ark),
        (CertKind::Ask, asvk),
        (CertKind::Vlek, &vlek),
    ]);
    assert_eq!(
        platform::vlek_certs(&blob).unwrap(),
        [vlek.clone(), asvk.clone()]
    );
    // Without the intermediate, the VLEK alone (verifiers hold the ASVK).
    let blob = cert_table(&[(CertKind::Vlek, &vlek)]);
    assert_eq!(platform::vlek_certs(&blob).unwrap(), [vlek]);
}

#[test]
fn a_certificate_table_without_a_vlek_is_refused() {
    let vcek = pem_der(&read_cvm("snp-azure/vcek.pem")).remove(0);
    let ask = pem_der(&read_cvm("snp-azure/certchain.pem")).remove(0);
    let blob = cert_table(&[(CertKind::Vcek, &vcek), (CertKind::Ask, &ask)]);
    match platform::vlek_certs(&blob) {
        Err(PlatformError::NoVlek { found }) => {
            assert_eq!(found, [CertKind::Vcek, CertKind::Ask])
        }
        other => panic!("want no VLEK, got {other:?}"),
    }
    assert!(matches!(
        platform::vlek_certs(&[]),
        Err(PlatformError::NoVlek { found }) if found.is_empty()
    ));
    // A table without its terminator is the table's error, not a missing VLEK.
    assert!(matches!(
        platform::vlek_certs(&blob[..24]),
        Err(PlatformError::CertTable(_))
    ));
}

#[test]
fn aws_without_configfs_tsm_says_this_is_not_a_confidential_vm() {
    let dir = tempfile::tempdir().unwrap();
    let tsm = ConfigfsTsm::new(dir.path().join("tsm/report"));
    let err = platform::aws_sev_snp(&[0; 64], &tsm).unwrap_err();
    match &err {
        PlatformError::Tsm(TsmError::NotAvailable { .. }) => {}
        other => panic!("want configfs-tsm missing, got {other:?}"),
    }
    let chain = asterism_binkit::error_chain(&err);
    assert!(chain.contains("not a confidential VM"), "{chain}");
}

/// An RSA public key as rcgen certifies it.
struct RsaKey(Vec<u8>);

impl rcgen::PublicKeyData for RsaKey {
    fn der_bytes(&self) -> &[u8] {
        &self.0
    }
    fn algorithm(&self) -> &'static rcgen::SignatureAlgorithm {
        &rcgen::PKCS_RSA_SHA256
    }
}

/// A DER `RSAPublicKey` of an RSA `TPMT_PUBLIC` (default exponent).
fn rsa_public_key(tpmt_public: &[u8]) -> Vec<u8> {
    use asterism_attestation::tpm::TpmtPublic;
    use asterism_attestation::tpm::structures::PublicParams;
    let PublicParams::Rsa { modulus, .. } = TpmtPublic::parse(tpmt_public).unwrap().params else {
        panic!("not an RSA key")
    };
    let der = |tag: u8, content: &[u8]| {
        let mut out = vec![tag];
        match content.len() {
            n if n < 0x80 => out.push(n as u8),
            n if n < 0x100 => out.extend([0x81, n as u8]),
            n => out.extend([0x82, (n >> 8) as u8, n as u8]),
        }
        out.extend_from_slice(content);
        out
    };
    let mut n = vec![0];
    n.extend_from_slice(&modulus);
    let mut ints = der(0x02, &n);
    ints.extend(der(0x02, &[0x01, 0x00, 0x01]));
    der(0x30, &ints)
}

#[test]
fn on_azure_trusted_launch_the_vtpms_ak_and_its_certificate_verify_to_the_cloud_root() {
    use asterism_attestation::tpm::CloudAkCa;
    use asterism_bootstrapper::platform::{AZURE_AK_CERT_NV_INDEX, AZURE_AK_HANDLE, CloudVtpm};
    use asterism_tpm::PersistentHandle;
    let swtpm = Swtpm::start().unwrap();
    // Azure's part, which swtpm stands in for: an RSA-2048 AK persisted at 0x81000003 and
    // the cloud CA's certificate for it in NV.
    let mut tpm = Tpm::open(&swtpm.config()).unwrap();
    let handle = PersistentHandle::try_from(AZURE_AK_HANDLE).unwrap();
    let ak = tpm
        .load_attestation_key(&AkConfig::new(AkAlgorithm::Rsa2048).with_handle(handle))
        .unwrap();
    let pcr0 = tpm.read_pcrs(&PcrSelection::new([0]).unwrap()).unwrap()[0].1;
    drop(tpm);
    let root_key = rcgen::KeyPair::generate().unwrap();
    let mut root_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    root_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "cloud vTPM root");
    root_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    root_params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign];
    let root = root_params.self_signed(&root_key).unwrap();
    let root_issuer = rcgen::Issuer::new(root_params, root_key);
    let mut leaf = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    leaf.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    let cert = leaf
        .signed_by(&RsaKey(rsa_public_key(ak.public_area())), &root_issuer)
        .unwrap()
        .der()
        .to_vec();
    // Padded, as NV indices often are.
    let mut nv = cert.clone();
    nv.resize(cert.len() + 16, 0);
    if !nv_writes(&swtpm, AZURE_AK_CERT_NV_INDEX, &nv) {
        eprintln!("tpm2-tools not installed; skipping the Azure Trusted Launch issuing test");
        return;
    }

    // As the bootstrapper starts with --cloud-vtpm azure-trusted-launch.
    let cloud = CloudVtpm::AzureTrustedLaunch;
    let mut tpm = Tpm::open(&swtpm.config()).unwrap();
    let read = cloud
        .read_ak_certificate(&mut tpm, AZURE_AK_CERT_NV_INDEX)
        .unwrap();
    assert_eq!(read, cert, "the certificate without its padding");
    let issuer = cloud.issuer(tpm, Vec::new()).unwrap();
    assert_eq!(
        issuer.ak_public(),
        ak.public_area(),
        "the cloud's AK, as it is"
    );
    let rd = ReportData::atls(Role::Client, &[9; 32]);
    let evidence = issuer.issue(&rd).unwrap();

    let measurements =
        Measurements::new([(PcrIndex::new(0).unwrap(), ExpectedPcr::enforce(pcr0))]).unwrap();
    let verifier = |ca: CloudAkCa| {
        TpmQuoteValidator::new(AkTrust::cloud_ak(ca), measurements.clone().into_provider())
    };
    let trusted = CloudAkCa::from_der([root.der()], [] as [&[u8]; 0]).unwrap();
    use asterism_attestation::Validator as _;
    verifier(trusted).validate(&evidence, &rd).unwrap();
    // Another cloud's root does not vouch for it.
    let other_key = rcgen::KeyPair::generate().unwrap();
    let mut other_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    other_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "cloud vTPM root");
    other_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    other_params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign];
    let other = other_params.self_signed(&other_key).unwrap();
    let other = CloudAkCa::from_der([other.der()], [] as [&[u8]; 0]).unwrap();
    assert!(matches!(
        verifier(other).validate(&evidence, &rd),
        Err(ValidationError::UntrustedKey(_))
    ));
}

/// Undefines NV index `index` of `swtpm` with tpm2-tools (installed: the caller wrote it).
fn nv_undefines(swtpm: &Swtpm, index: u32) {
    let output = asterism_children::output(
        Command::new("tpm2_nvundefine")
            .arg(format!("{index:#x}"))
            .args(["-C", "o", "-T", &swtpm.tcti()]),
    )
    .unwrap();
    assert!(
        output.status.success(),
        "tpm2_nvundefine: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// An ECC P-256 public key (the uncompressed point) as rcgen certifies it.
struct EcKey(Vec<u8>);

impl rcgen::PublicKeyData for EcKey {
    fn der_bytes(&self) -> &[u8] {
        &self.0
    }
    fn algorithm(&self) -> &'static rcgen::SignatureAlgorithm {
        &rcgen::PKCS_ECDSA_P256_SHA256
    }
}

/// An ECC AK template as Google's (restricted ECDSA-SHA256 signing key on P-256, named with
/// SHA-256, fixedTPM | fixedParent | sensitiveDataOrigin | userWithAuth | restricted | sign,
/// no noDA), with `unique` filled with `fill`: another fill is another template, so another
/// key.
fn gce_ecc_ak_template(fill: u8) -> Vec<u8> {
    use asterism_attestation::tpm::structures::PublicParams;
    asterism_testkit::cvm::cloud_ak_public(PublicParams::ecdsa_p256(vec![fill; 32], vec![fill; 32]))
}

/// The uncompressed point of an ECC `TPMT_PUBLIC`.
fn ecc_point(tpmt_public: &[u8]) -> Vec<u8> {
    use asterism_attestation::tpm::TpmtPublic;
    use asterism_attestation::tpm::structures::PublicParams;
    let PublicParams::Ecc { x, y, .. } = TpmtPublic::parse(tpmt_public).unwrap().params else {
        panic!("not an ECC key")
    };
    [&[0x04][..], &x, &y].concat()
}

#[test]
fn on_gce_the_ak_made_from_googles_template_and_its_certificate_verify_to_the_cloud_root() {
    use asterism_attestation::tpm::CloudAkCa;
    use asterism_bootstrapper::platform::CloudVtpm;
    use asterism_tpm::NvTemplateAk;
    let swtpm = Swtpm::start().unwrap();
    let cloud = CloudVtpm::Gce;

    // A vTPM without Google's templates: refused, naming where the templates would be.
    let err = cloud
        .issuer(Tpm::open(&swtpm.config()).unwrap(), Vec::new())
        .unwrap_err();
    let chain = asterism_binkit::error_chain(&err);
    assert!(
        chain.contains("0x01c10003") && chain.contains("0x01c10001"),
        "{chain}"
    );

    // Google's part, which the test plays: the ECC AK template in NV 0x01c10003 and the
    // cloud CA's certificate for the key it makes in 0x01c10002.
    let template = gce_ecc_ak_template(0);
    if !nv_writes(&swtpm, NvTemplateAk::GCE_ECC.template_index, &template) {
        eprintln!("tpm2-tools not installed; skipping the GCE issuing test");
        return;
    }
    // The template without its certificate: refused, naming the certificate's index.
    let err = cloud
        .issuer(Tpm::open(&swtpm.config()).unwrap(), Vec::new())
        .unwrap_err();
    let chain = asterism_binkit::error_chain(&err);
    assert!(chain.contains("0x01c10002"), "{chain}");
    // The key the template makes (a primary: the same key every time).
    let ak_public = {
        let mut tpm = Tpm::open(&swtpm.config()).unwrap();
        let ak = tpm.load_nv_template_ak(&NvTemplateAk::GCE_ECC).unwrap();
        ak.public_area().to_vec()
    };
    let root_key = rcgen::KeyPair::generate().unwrap();
    let mut root_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    root_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "cloud vTPM root");
    root_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    root_params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign];
    let root = root_params.self_signed(&root_key).unwrap();
    let root_issuer = rcgen::Issuer::new(root_params, root_key);
    let mut leaf = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    leaf.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    let cert = leaf
        .signed_by(&EcKey(ecc_point(&ak_public)), &root_issuer)
        .unwrap()
        .der()
        .to_vec();
    let mut nv = cert.clone();
    nv.resize(cert.len() + 16, 0xff);
    assert!(nv_writes(
        &swtpm,
        NvTemplateAk::GCE_ECC.certificate_index,
        &nv
    ));

    // As the bootstrapper starts with --cloud-vtpm gce.
    let mut tpm = Tpm::open(&swtpm.config()).unwrap();
    let pcr0 = tpm.read_pcrs(&PcrSelection::new([0]).unwrap()).unwrap()[0].1;
    let issuer = cloud.issuer(tpm, Vec::new()).unwrap();
    assert_eq!(
        issuer.ak_public(),
        ak_public,
        "the key Google's template makes"
    );
    let rd = ReportData::atls(Role::Client, &[9; 32]);
    let evidence = issuer.issue(&rd).unwrap();
    assert_eq!(
        asterism_attestation::tpm::QuoteEvidence::decode(&evidence)
            .unwrap()
            .ak_cert_chain,
        [cert],
        "the certificate from NV, without its padding"
    );

    let measurements =
        Measurements::new([(PcrIndex::new(0).unwrap(), ExpectedPcr::enforce(pcr0))]).unwrap();
    let trusted = || CloudAkCa::from_der([root.der()], [] as [&[u8]; 0]).unwrap();
    let verifier = TpmQuoteValidator::new(
        AkTrust::cloud_ak(trusted()),
        measurements.clone().into_provider(),
    );
    use asterism_attestation::Validator as _;
    verifier.validate(&evidence, &rd).unwrap();
    drop(issuer);

    // Another template makes another AK, which the certificate does not name: the node
    // quotes with it, and the verifier refuses the evidence.
    nv_undefines(&swtpm, NvTemplateAk::GCE_ECC.template_index);
    assert!(nv_writes(
        &swtpm,
        NvTemplateAk::GCE_ECC.template_index,
        &gce_ecc_ak_template(1)
    ));
    let issuer = cloud
        .issuer(Tpm::open(&swtpm.config()).unwrap(), Vec::new())
        .unwrap();
    assert_ne!(issuer.ak_public(), ak_public);
    let evidence = issuer.issue(&rd).unwrap();
    assert!(matches!(
        verifier.validate(&evidence, &rd),
        Err(ValidationError::UntrustedKey(_))
    ));
}

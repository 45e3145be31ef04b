//! The hardware report a confidential VM attaches to its TPM-quote evidence, so that
//! verifiers trusting confidential-VM AKs (`AkTrust::ConfidentialVm`) accept the node's AK.
//!
//! The report vouches for the AK, not for a session, and does not change while the VM runs:
//! it is gathered once at start, before the node issues any evidence.
//!
//! * **Azure SEV-SNP**: the HCL report from the vTPM's NV index (SNP report + runtime data
//!   naming the AK), and the VCEK with its ASK from Azure's THIM
//!   (`GET {imds}/metadata/THIM/amd/certification`).
//! * **Azure TDX**: the HCL report's TD report turned into a DCAP quote by Azure's instance
//!   metadata service (`POST {imds}/acc/tdquote`), and the runtime data.
//! * **AWS SEV-SNP**: an SNP report whose REPORT_DATA is the SHA-512 of the AK, from the
//!   kernel's configfs-tsm, and the VLEK (with the ASVK when the host attaches it) from its
//!   certificate table.
//!
//! The instance metadata service is plain HTTP on a link-local address: nothing it returns
//! is secret, and everything is checked by the verifier against AMD's or Intel's roots.
//! Every call has a deadline and a body cap and is retried a few times, since the service
//! may not answer yet at boot.

use std::time::Duration;

use asterism_attestation::hcl::{self, HardwareKind, HardwareReport, HclReport};
use asterism_attestation::tpm::{AwsSnp, AzureSnp, AzureTdx, CvmPlatform, PlatformKind};
use asterism_tpm::{Tpm, TpmError};
use asterism_tsm::{CertKind, CertTableError, ConfigfsTsm, TsmError};
use base64::Engine as _;
use base64::alphabet::URL_SAFE;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use bytes::Bytes;
use http::{Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;

/// The clouds' instance metadata service (link-local, plain HTTP).
pub const DEFAULT_IMDS_URL: &str = "http://169.254.169.254";
/// Deadline of one call: connect, request, response headers and body.
pub const IMDS_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest response body accepted (a TDX quote in base64 is under 16 KiB).
pub const MAX_IMDS_BODY: usize = 64 * 1024;
/// Calls made before giving up on a service that does not answer (yet).
pub const IMDS_ATTEMPTS: u32 = 5;
/// Pause after the first failed call; doubled after each further one.
pub const IMDS_BACKOFF: Duration = Duration::from_secs(1);

/// Azure THIM's answer with the VCEK of this VM's chip and TCB.
const THIM_PATH: &str = "/metadata/THIM/amd/certification";
/// Azure's quote service for a TD report.
const TDQUOTE_PATH: &str = "/acc/tdquote";

/// base64url as Azure writes it: no padding, but padding tolerated on input.
const BASE64URL: GeneralPurpose = GeneralPurpose::new(
    &URL_SAFE,
    GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Why the hardware report could not be gathered. Each error of a call names its URL.
#[derive(Debug, thiserror::Error)]
pub enum PlatformError {
    /// `--imds-url` is not a plain `http://` URL with a host.
    #[error("instance metadata URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The call failed before an answer (connection refused, reset, …).
    #[error("{url}: request failed")]
    Request {
        /// The URL called.
        url: String,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The service answered with another status than 200.
    #[error("{url}: HTTP status {status}")]
    Status {
        /// The URL called.
        url: String,
        /// The status.
        status: u16,
    },
    /// The answer is larger than [`MAX_IMDS_BODY`].
    #[error("{url}: the answer is larger than {cap} bytes")]
    TooLarge {
        /// The URL called.
        url: String,
        /// The cap.
        cap: usize,
    },
    /// No complete answer within the deadline.
    #[error("{url}: no answer within {after:?}")]
    Timeout {
        /// The URL called.
        url: String,
        /// The deadline.
        after: Duration,
    },
    /// The answer is not what the service documents.
    #[error("{url}: unexpected answer: {reason}")]
    Decode {
        /// The URL called.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The vTPM's HCL report could not be read.
    #[error("cannot read the HCL report from the vTPM")]
    Tpm(#[source] TpmError),
    /// An Azure platform, but no HCL report was read from the vTPM.
    #[error("--confidential-vm {0} needs the HCL report from the vTPM; none was read")]
    NoHclReport(CvmPlatform),
    /// The HCL report does not parse.
    #[error("the vTPM's HCL report does not parse")]
    HclReport(#[source] asterism_attestation::ValidationError),
    /// The HCL report holds another hardware's report than the platform's.
    #[error("--confidential-vm {platform}, but the vTPM's HCL report holds a {found:?} report")]
    WrongHardware {
        /// The platform configured.
        platform: CvmPlatform,
        /// What the HCL report holds.
        found: HardwareKind,
    },
    /// The AK's public area cannot be bound into an SNP report.
    #[error("cannot compute the AK's REPORT_DATA")]
    AkReportData(#[source] asterism_attestation::ValidationError),
    /// configfs-tsm gave no report.
    #[error("cannot get an SEV-SNP report from configfs-tsm")]
    Tsm(#[source] TsmError),
    /// The SNP certificate table is malformed.
    #[error("the SEV-SNP certificate table from configfs-tsm")]
    CertTable(#[source] CertTableError),
    /// The host attached no VLEK, which AWS signs its reports with.
    #[error(
        "the SEV-SNP certificate table holds no VLEK (found: {found:?}); AWS signs reports \
         with a VLEK, which the host must attach"
    )]
    NoVlek {
        /// The kinds the table holds.
        found: Vec<CertKind>,
    },
    /// The hardware report vouches for another AK than the one this node quotes with, so
    /// every verifier would refuse the evidence.
    #[error(
        "the {platform} hardware report vouches for another AK than the one this node quotes \
         with (on Azure the AK is the vTPM's own, made by the paravisor)"
    )]
    ForeignAk {
        /// The platform.
        platform: CvmPlatform,
        /// The field that differs, with the expected and observed values.
        #[source]
        source: asterism_attestation::ValidationError,
    },
    /// A blocking task did not finish.
    #[error("the {0} task failed")]
    Task(&'static str),
}

/// A client for the cloud's instance metadata service: plain HTTP, every call with a
/// deadline, a body cap and retries with backoff.
#[derive(Clone)]
pub struct Imds {
    base: String,
    timeout: Duration,
    attempts: u32,
    backoff: Duration,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl std::fmt::Debug for Imds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Imds")
            .field("base", &self.base)
            .field("timeout", &self.timeout)
            .field("attempts", &self.attempts)
            .finish_non_exhaustive()
    }
}

impl Imds {
    /// A client for the service at `base_url` (`http://host[:port]`); only `http` is
    /// accepted: the service is plain HTTP on a link-local address.
    pub fn new(base_url: &str) -> Result<Self, PlatformError> {
        let invalid = |reason| PlatformError::InvalidUrl {
            url: base_url.to_owned(),
            reason,
        };
        let uri: Uri = base_url.parse().map_err(|_| invalid("not a URL"))?;
        if uri.scheme_str() != Some("http") {
            return Err(invalid("the scheme must be http"));
        }
        if uri.authority().is_none() {
            return Err(invalid("the URL has no host"));
        }
        if uri.query().is_some() {
            return Err(invalid("the URL must not have a query"));
        }
        Ok(Self {
            base: base_url.trim_end_matches('/').to_owned(),
            timeout: IMDS_TIMEOUT,
            attempts: IMDS_ATTEMPTS,
            backoff: IMDS_BACKOFF,
            client: build_client(IMDS_TIMEOUT),
        })
    }

    /// Replaces the per-call deadline.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self.client = build_client(timeout);
        self
    }

    /// Replaces how many calls are made (at least one) and the first pause between them.
    #[must_use]
    pub fn with_retries(mut self, attempts: u32, backoff: Duration) -> Self {
        self.attempts = attempts.max(1);
        self.backoff = backoff;
        self
    }

    /// The service's base URL.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// The VCEK of this VM's chip and TCB and its ASK, DER, from Azure's THIM.
    pub async fn azure_vcek(&self) -> Result<Vec<Vec<u8>>, PlatformError> {
        let url = format!("{}{THIM_PATH}", self.base);
        let body = self.call(Method::GET, &url, None).await?;
        thim_certs(&url, &body)
    }

    /// A DCAP quote over `td_report` from Azure's quote service.
    pub async fn azure_td_quote(&self, td_report: &[u8]) -> Result<Vec<u8>, PlatformError> {
        let url = format!("{}{TDQUOTE_PATH}", self.base);
        let request = serde_json::json!({ "report": BASE64URL.encode(td_report) });
        let body = self
            .call(Method::POST, &url, Some(request.to_string().into()))
            .await?;
        #[derive(Deserialize)]
        struct Answer {
            quote: String,
        }
        let answer: Answer = serde_json::from_slice(&body).map_err(|e| PlatformError::Decode {
            url: url.clone(),
            reason: e.to_string(),
        })?;
        let quote =
            BASE64URL
                .decode(answer.quote.as_bytes())
                .map_err(|e| PlatformError::Decode {
                    url: url.clone(),
                    reason: format!("quote is not base64url: {e}"),
                })?;
        if quote.is_empty() {
            return Err(PlatformError::Decode {
                url,
                reason: "empty quote".into(),
            });
        }
        Ok(quote)
    }

    /// One call, retried with backoff while it fails in a way that may pass (no answer,
    /// a timeout, a 5xx or 429 status).
    async fn call(
        &self,
        method: Method,
        url: &str,
        body: Option<Bytes>,
    ) -> Result<Bytes, PlatformError> {
        let mut pause = self.backoff;
        let mut attempt = 1;
        loop {
            match self.call_once(method.clone(), url, body.clone()).await {
                Err(e) if attempt < self.attempts && transient(&e) => {
                    tracing::warn!(error = %asterism_binkit::error_chain(&e), attempt, "instance metadata call failed; retrying");
                    tokio::time::sleep(pause).await;
                    pause = pause.saturating_mul(2);
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    async fn call_once(
        &self,
        method: Method,
        url: &str,
        body: Option<Bytes>,
    ) -> Result<Bytes, PlatformError> {
        let mut request = Request::builder()
            .method(method)
            .uri(url)
            .header("Metadata", "true");
        if body.is_some() {
            request = request.header(http::header::CONTENT_TYPE, "application/json");
        }
        let request = request
            .body(Full::new(body.unwrap_or_default()))
            .map_err(|_| PlatformError::InvalidUrl {
                url: url.to_owned(),
                reason: "not a valid request URL",
            })?;
        let call = async {
            let response =
                self.client
                    .request(request)
                    .await
                    .map_err(|e| PlatformError::Request {
                        url: url.to_owned(),
                        source: Box::new(e),
                    })?;
            let status = response.status();
            if status != StatusCode::OK {
                return Err(PlatformError::Status {
                    url: url.to_owned(),
                    status: status.as_u16(),
                });
            }
            let too_large = || PlatformError::TooLarge {
                url: url.to_owned(),
                cap: MAX_IMDS_BODY,
            };
            let declared = response
                .headers()
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            if declared.is_some_and(|n| n > MAX_IMDS_BODY as u64) {
                return Err(too_large());
            }
            let body = Limited::new(response.into_body(), MAX_IMDS_BODY)
                .collect()
                .await
                .map_err(|e| {
                    if e.is::<http_body_util::LengthLimitError>() {
                        too_large()
                    } else {
                        PlatformError::Request {
                            url: url.to_owned(),
                            source: e,
                        }
                    }
                })?;
            Ok(body.to_bytes())
        };
        tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| PlatformError::Timeout {
                url: url.to_owned(),
                after: self.timeout,
            })?
    }
}

fn build_client(timeout: Duration) -> Client<HttpConnector, Full<Bytes>> {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(timeout));
    connector.enforce_http(true);
    Client::builder(TokioExecutor::new()).build(connector)
}

/// Whether a failed call may succeed when made again.
fn transient(error: &PlatformError) -> bool {
    match error {
        PlatformError::Request { .. } | PlatformError::Timeout { .. } => true,
        PlatformError::Status { status, .. } => *status >= 500 || *status == 429,
        _ => false,
    }
}

/// THIM's JSON: `vcekCert` (PEM) and `certificateChain` (PEM, ASK then ARK); returns DER
/// [VCEK, ASK]. The ARK is left out: verifiers trust their embedded AMD roots.
fn thim_certs(url: &str, body: &[u8]) -> Result<Vec<Vec<u8>>, PlatformError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Thim {
        vcek_cert: String,
        certificate_chain: String,
    }
    let decode = |reason: String| PlatformError::Decode {
        url: url.to_owned(),
        reason,
    };
    let thim: Thim = serde_json::from_slice(body).map_err(|e| decode(e.to_string()))?;
    let vcek = pem_certs(&thim.vcek_cert)
        .map_err(|e| decode(format!("vcekCert: {e}")))?
        .into_iter()
        .next()
        .ok_or_else(|| decode("vcekCert holds no certificate".into()))?;
    let ask = pem_certs(&thim.certificate_chain)
        .map_err(|e| decode(format!("certificateChain: {e}")))?
        .into_iter()
        .next()
        .ok_or_else(|| decode("certificateChain holds no certificate".into()))?;
    Ok(vec![vcek, ask])
}

/// The DER certificates of a PEM text, in order.
fn pem_certs(text: &str) -> Result<Vec<Vec<u8>>, String> {
    x509_parser::pem::Pem::iter_from_buffer(text.as_bytes())
        .map(|pem| match pem {
            Ok(pem) if pem.label == "CERTIFICATE" => Ok(pem.contents),
            Ok(pem) => Err(format!("unexpected PEM block {:?}", pem.label)),
            Err(e) => Err(format!("not PEM: {e}")),
        })
        .collect()
}

/// What the platform needs from the vTPM, read before the TPM moves into the issuer: the
/// HCL report on Azure, nothing elsewhere. Blocking.
pub fn read_from_tpm(
    platform: CvmPlatform,
    tpm: &mut Tpm,
) -> Result<Option<Vec<u8>>, PlatformError> {
    match platform {
        CvmPlatform::AzureSevSnp | CvmPlatform::AzureTdx => {
            tpm.read_hcl_report().map(Some).map_err(PlatformError::Tpm)
        }
        CvmPlatform::AwsSevSnp => Ok(None),
    }
}

/// Gathers the hardware report for the AK `ak_public` (`TPMT_PUBLIC`). `hcl_report` is what
/// [`read_from_tpm`] returned; `tsm` is the kernel's configfs-tsm (AWS).
pub async fn gather(
    platform: CvmPlatform,
    hcl_report: Option<Vec<u8>>,
    ak_public: &[u8],
    imds: &Imds,
    tsm: ConfigfsTsm,
) -> Result<PlatformKind, PlatformError> {
    let kind = match (platform, hcl_report) {
        (CvmPlatform::AzureSevSnp, Some(hcl_report)) => azure_sev_snp(hcl_report, imds).await?,
        (CvmPlatform::AzureTdx, Some(hcl_report)) => azure_tdx(&hcl_report, imds).await?,
        (CvmPlatform::AzureSevSnp | CvmPlatform::AzureTdx, None) => {
            return Err(PlatformError::NoHclReport(platform));
        }
        (CvmPlatform::AwsSevSnp, _) => {
            let report_data =
                hcl::aws_snp_report_data(ak_public).map_err(PlatformError::AkReportData)?;
            tokio::task::spawn_blocking(move || aws_sev_snp(&report_data, &tsm))
                .await
                .map_err(|_| PlatformError::Task("configfs-tsm"))??
        }
    };
    log_gathered(&kind);
    Ok(kind)
}

fn log_gathered(kind: &PlatformKind) {
    match kind {
        PlatformKind::AzureSevSnp(azure) => tracing::info!(
            platform = %CvmPlatform::AzureSevSnp,
            hcl_report_bytes = azure.hcl_report.len(),
            certs = azure.certs.len(),
            "gathered the hardware report that vouches for the AK"
        ),
        PlatformKind::AzureTdx(azure) => tracing::info!(
            platform = %CvmPlatform::AzureTdx,
            quote_bytes = azure.quote.len(),
            runtime_data_bytes = azure.runtime_data.len(),
            "gathered the hardware report that vouches for the AK"
        ),
        PlatformKind::AwsSevSnp(aws) => tracing::info!(
            platform = %CvmPlatform::AwsSevSnp,
            report_bytes = aws.report.len(),
            certs = aws.certs.len(),
            "gathered the hardware report that vouches for the AK"
        ),
    }
}

/// Checks, before the node issues anything, that `kind` vouches for the AK `ak_public`
/// (`TPMT_PUBLIC`): on Azure the runtime data must name it. An AWS report is made over
/// the AK by [`gather`], so it does.
pub fn check_ak(kind: &PlatformKind, ak_public: &[u8]) -> Result<(), PlatformError> {
    let (platform, runtime_data) = match kind {
        PlatformKind::AzureSevSnp(azure) => {
            let parsed = parsed_hcl(CvmPlatform::AzureSevSnp, &azure.hcl_report)?;
            (CvmPlatform::AzureSevSnp, parsed.runtime_data().to_vec())
        }
        PlatformKind::AzureTdx(azure) => (CvmPlatform::AzureTdx, azure.runtime_data.clone()),
        PlatformKind::AwsSevSnp(_) => return Ok(()),
    };
    hcl::RuntimeData::parse(&runtime_data)
        .and_then(|runtime| hcl::hcl_ak_matches(&runtime, ak_public))
        .map_err(|source| PlatformError::ForeignAk { platform, source })
}

/// The HCL report, parsed, holding the hardware report `platform` needs.
fn parsed_hcl(platform: CvmPlatform, hcl_report: &[u8]) -> Result<HclReport, PlatformError> {
    let parsed = HclReport::parse(hcl_report).map_err(PlatformError::HclReport)?;
    let want = match platform {
        CvmPlatform::AzureTdx => HardwareKind::Tdx,
        CvmPlatform::AzureSevSnp | CvmPlatform::AwsSevSnp => HardwareKind::Snp,
    };
    if parsed.kind() != want {
        return Err(PlatformError::WrongHardware {
            platform,
            found: parsed.kind(),
        });
    }
    Ok(parsed)
}

/// Azure SEV-SNP: the HCL report as read from the vTPM, and the VCEK with its ASK from THIM.
pub async fn azure_sev_snp(
    hcl_report: Vec<u8>,
    imds: &Imds,
) -> Result<PlatformKind, PlatformError> {
    parsed_hcl(CvmPlatform::AzureSevSnp, &hcl_report)?;
    let certs = imds.azure_vcek().await?;
    Ok(PlatformKind::AzureSevSnp(AzureSnp { hcl_report, certs }))
}

/// Azure TDX: a quote over the HCL report's TD report from Azure's quote service, and the
/// runtime data the TD report's REPORT_DATA is the SHA-256 of.
pub async fn azure_tdx(hcl_report: &[u8], imds: &Imds) -> Result<PlatformKind, PlatformError> {
    let parsed = parsed_hcl(CvmPlatform::AzureTdx, hcl_report)?;
    let HardwareReport::Tdx(td_report) = parsed.hardware_report() else {
        return Err(PlatformError::WrongHardware {
            platform: CvmPlatform::AzureTdx,
            found: parsed.kind(),
        });
    };
    let quote = imds.azure_td_quote(td_report).await?;
    Ok(PlatformKind::AzureTdx(AzureTdx {
        quote,
        runtime_data: parsed.runtime_data().to_vec(),
    }))
}

/// AWS SEV-SNP: an SNP report over `report_data` (the AK's, [`hcl::aws_snp_report_data`])
/// from configfs-tsm, with the VLEK (and ASVK) from its certificate table. Blocking.
pub fn aws_sev_snp(
    report_data: &[u8; 64],
    tsm: &ConfigfsTsm,
) -> Result<PlatformKind, PlatformError> {
    let report = tsm.report(report_data).map_err(PlatformError::Tsm)?;
    let certs = vlek_certs(report.auxblob.as_deref().unwrap_or_default())?;
    Ok(PlatformKind::AwsSevSnp(AwsSnp {
        report: report.outblob,
        certs,
    }))
}

/// The VLEK and, when present, its intermediate (ASVK) from an SNP certificate table, in
/// the order the evidence carries them. Refuses a table without a VLEK: AWS signs with one.
pub fn vlek_certs(auxblob: &[u8]) -> Result<Vec<Vec<u8>>, PlatformError> {
    let table = if auxblob.is_empty() {
        Vec::new()
    } else {
        asterism_tsm::parse_snp_cert_table(auxblob).map_err(PlatformError::CertTable)?
    };
    let take = |kind: CertKind| {
        table
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, der)| der.clone())
    };
    let Some(vlek) = take(CertKind::Vlek) else {
        return Err(PlatformError::NoVlek {
            found: table.iter().map(|(k, _)| *k).collect(),
        });
    };
    Ok(std::iter::once(vlek).chain(take(CertKind::Ask)).collect())
}

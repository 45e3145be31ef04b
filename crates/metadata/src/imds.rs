//! [`Imds`]: a client for a cloud's instance metadata service (link-local, plain HTTP), for
//! what a confidential VM needs to prove it is one: Azure THIM's VCEK and Azure's quote of a
//! TDX TD report.
//!
//! Nothing it returns is secret, and the caller's verifiers check everything against AMD's
//! or Intel's roots. Every call has a deadline ([`IMDS_TIMEOUT`]), a body cap
//! ([`MAX_IMDS_BODY`]), and is retried with backoff while it fails in a way that may pass
//! (the service may not answer yet at boot). Errors name the URL.

use crate::call::{self, CallError};
use base64::Engine as _;
use base64::alphabet::URL_SAFE;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use bytes::Bytes;
use http::{Method, Request};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use serde::Deserialize;
use std::time::Duration;

/// The clouds' instance metadata service.
pub const DEFAULT_IMDS_URL: &str = "http://169.254.169.254";
/// Deadline of one call: connect, request, response headers and body.
pub const IMDS_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest answer accepted (a TDX quote in base64 is under 16 KiB).
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

/// Why an instance metadata call failed. Each names the URL called.
#[derive(Debug, thiserror::Error)]
pub enum ImdsError {
    /// The service URL is not a plain `http://` URL with a host.
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
}

impl ImdsError {
    /// Whether the same call may succeed later: no answer, a timeout, a 5xx or 429 status.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Request { .. } | Self::Timeout { .. } => true,
            Self::Status { status, .. } => *status >= 500 || *status == 429,
            Self::InvalidUrl { .. } | Self::TooLarge { .. } | Self::Decode { .. } => false,
        }
    }
}

/// Azure THIM's answer for this VM: the VCEK and its chain, PEM, as served.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ThimCertification {
    /// The VCEK of this VM's chip and TCB.
    pub vcek_cert: String,
    /// The ASK, then the ARK.
    pub certificate_chain: String,
}

/// A client for the cloud's instance metadata service.
#[derive(Debug, Clone)]
pub struct Imds {
    base: String,
    timeout: Duration,
    attempts: u32,
    backoff: Duration,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Imds {
    /// A client for the service at `base_url` (`http://host[:port]`, [`DEFAULT_IMDS_URL`]
    /// on the clouds); only `http` is accepted: the service is plain HTTP on a link-local
    /// address.
    pub fn new(base_url: &str) -> Result<Self, ImdsError> {
        let base = call::base_url(base_url).map_err(|reason| ImdsError::InvalidUrl {
            url: base_url.to_owned(),
            reason,
        })?;
        Ok(Self {
            base,
            timeout: IMDS_TIMEOUT,
            attempts: IMDS_ATTEMPTS,
            backoff: IMDS_BACKOFF,
            client: call::client(None, IMDS_TIMEOUT),
        })
    }

    /// Replaces the per-call deadline.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self.client = call::client(None, timeout);
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

    /// The URL of Azure THIM's VCEK certification.
    pub fn azure_thim_url(&self) -> String {
        format!("{}{THIM_PATH}", self.base)
    }

    /// Azure THIM: `GET /metadata/THIM/amd/certification`.
    pub async fn azure_thim(&self) -> Result<ThimCertification, ImdsError> {
        let url = self.azure_thim_url();
        let body = self.call(Method::GET, &url, None).await?;
        serde_json::from_slice(&body).map_err(|e| ImdsError::Decode {
            url,
            reason: e.to_string(),
        })
    }

    /// A DCAP quote over `td_report` from Azure's quote service: `POST /acc/tdquote` with
    /// `{"report": base64url}`, answer `{"quote": base64url}`.
    pub async fn azure_td_quote(&self, td_report: &[u8]) -> Result<Vec<u8>, ImdsError> {
        #[derive(Deserialize)]
        struct Answer {
            quote: String,
        }
        let url = format!("{}{TDQUOTE_PATH}", self.base);
        let request = serde_json::json!({ "report": BASE64URL.encode(td_report) });
        let body = self
            .call(Method::POST, &url, Some(request.to_string().into()))
            .await?;
        let decode = |reason: String| ImdsError::Decode {
            url: url.clone(),
            reason,
        };
        let answer: Answer = serde_json::from_slice(&body).map_err(|e| decode(e.to_string()))?;
        let quote = BASE64URL
            .decode(answer.quote.as_bytes())
            .map_err(|e| decode(format!("quote is not base64url: {e}")))?;
        if quote.is_empty() {
            return Err(decode("empty quote".into()));
        }
        Ok(quote)
    }

    /// One call, retried with backoff while it fails in a way that may pass.
    async fn call(
        &self,
        method: Method,
        url: &str,
        body: Option<Bytes>,
    ) -> Result<Bytes, ImdsError> {
        let mut pause = self.backoff;
        let mut attempt = 1;
        loop {
            match self.call_once(method.clone(), url, body.clone()).await {
                Err(e) if attempt < self.attempts && e.is_transient() => {
                    tracing::warn!(error = %e, attempt, "instance metadata call failed; retrying");
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
    ) -> Result<Bytes, ImdsError> {
        // Azure refuses calls without `Metadata: true` (its guard against forwarded
        // requests).
        let mut request = Request::builder()
            .method(method)
            .uri(url)
            .header("Metadata", "true");
        if body.is_some() {
            request = request.header(http::header::CONTENT_TYPE, "application/json");
        }
        let request = request
            .body(Full::new(body.unwrap_or_default()))
            .map_err(|_| ImdsError::InvalidUrl {
                url: url.to_owned(),
                reason: "not a valid request URL",
            })?;
        let url = url.to_owned();
        call::call(&self.client, request, MAX_IMDS_BODY, self.timeout)
            .await
            .map_err(|e| match e {
                CallError::Request(source) => ImdsError::Request { url, source },
                CallError::Status(status) => ImdsError::Status { url, status },
                CallError::TooLarge { cap } => ImdsError::TooLarge { url, cap },
                CallError::Timeout { after } => ImdsError::Timeout { url, after },
            })
    }
}

//! Downloading over HTTP(S): the installer's retries with backoff, one attempt with its
//! redirects, size cap and hash, and rate-limited progress lines.

use std::io;
use std::time::{Duration, Instant};

use asterism_basics::error_chain;
use bytes::Bytes;
use http::{StatusCode, Uri};
use http_body_util::{BodyExt as _, Empty};
use sha2::{Digest as _, Sha256};
use tracing::{debug, info, warn};

use crate::check::redacted_uri;
use crate::{ComponentError, Installer, Sha256Hash, io_err, is_retriable_status};

/// Why one download attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    /// Connecting or reading failed (retried).
    #[error("transport error: {0}")]
    Transport(String),
    /// The attempt took longer than the policy allows (retried).
    #[error("the attempt timed out after {0:?}")]
    Timeout(Duration),
    /// The server answered with a status (retried for 408, 425, 429, 502, 503, 504).
    #[error("the server answered {0}")]
    Status(StatusCode),
    /// The resource is larger than the policy allows (not retried).
    #[error("the resource is larger than {0} bytes")]
    TooLarge(u64),
    /// Too many redirects, or a redirect without a usable location (not retried).
    #[error("redirect: {0}")]
    Redirect(String),
    /// Writing the temporary file failed (not retried).
    #[error("writing the download to disk")]
    Write(#[source] io::Error),
}

impl DownloadError {
    /// Whether another attempt may succeed.
    #[must_use]
    pub fn is_retriable(&self) -> bool {
        match self {
            Self::Transport(_) | Self::Timeout(_) => true,
            Self::Status(s) => is_retriable_status(*s),
            Self::TooLarge(_) | Self::Redirect(_) | Self::Write(_) => false,
        }
    }
}

impl Installer {
    pub(crate) async fn download_with_retries(
        &self,
        uri: &Uri,
        tmp: tempfile::NamedTempFile,
    ) -> Result<(tempfile::NamedTempFile, Sha256Hash), ComponentError> {
        let label = redacted_uri(uri);
        let max_attempts = self.policy.max_attempts.max(1);
        let mut attempt = 0;
        let std_file = tmp.reopen().map_err(io_err("cannot open", tmp.path()))?;
        let mut file = tokio::fs::File::from_std(std_file);
        loop {
            attempt += 1;
            let result = tokio::time::timeout(
                self.policy.attempt_timeout,
                self.download_once(uri, &mut file),
            )
            .await
            .unwrap_or(Err(DownloadError::Timeout(self.policy.attempt_timeout)));
            match result {
                Ok(hash) => {
                    file.sync_all()
                        .await
                        .map_err(io_err("cannot sync", tmp.path()))?;
                    return Ok((tmp, hash));
                }
                Err(e) if e.is_retriable() && attempt < max_attempts => {
                    let pause = self.policy.backoff(attempt);
                    warn!(url = %label, attempt, error = %e, retry_in = ?pause, "download attempt failed; retrying");
                    tokio::time::sleep(pause).await;
                }
                Err(source) => {
                    return Err(ComponentError::Download {
                        url: label,
                        attempts: attempt,
                        source,
                    });
                }
            }
        }
    }

    /// One attempt: follows redirects, streams the body into `file` (from its start),
    /// hashing as it goes.
    pub(crate) async fn download_once(
        &self,
        uri: &Uri,
        file: &mut tokio::fs::File,
    ) -> Result<Sha256Hash, DownloadError> {
        use tokio::io::AsyncWriteExt as _;
        let mut current = uri.clone();
        let mut redirects = 0;
        let response = loop {
            let request = http::Request::get(current.clone())
                .header(http::header::USER_AGENT, "asterism-component-installer")
                .body(Empty::<Bytes>::new())
                .map_err(|e| DownloadError::Transport(e.to_string()))?;
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| DownloadError::Transport(error_chain(&e)))?;
            let status = response.status();
            if status.is_redirection() && status != StatusCode::NOT_MODIFIED {
                redirects += 1;
                if redirects > self.policy.max_redirects {
                    return Err(DownloadError::Redirect(format!(
                        "more than {} redirects",
                        self.policy.max_redirects
                    )));
                }
                let next = response
                    .headers()
                    .get(http::header::LOCATION)
                    .and_then(|l| l.to_str().ok())
                    .and_then(|l| resolve_location(&current, l))
                    .ok_or_else(|| DownloadError::Redirect("no usable Location".into()))?;
                if current.scheme_str() == Some("https") && next.scheme_str() != Some("https") {
                    return Err(DownloadError::Redirect(
                        "refusing a redirect from https to http".into(),
                    ));
                }
                debug!(from = %redacted_uri(&current), to = %redacted_uri(&next), "following a redirect");
                current = next;
                continue;
            }
            if !status.is_success() {
                return Err(DownloadError::Status(status));
            }
            break response;
        };
        let expected_len = response
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if let Some(len) = expected_len
            && len > self.policy.max_size
        {
            return Err(DownloadError::TooLarge(self.policy.max_size));
        }
        file.set_len(0).await.map_err(DownloadError::Write)?;
        tokio::io::AsyncSeekExt::rewind(file)
            .await
            .map_err(DownloadError::Write)?;
        let mut hasher = Sha256::new();
        let mut received: u64 = 0;
        let mut progress = Progress::new(
            redacted_uri(&current),
            expected_len,
            self.policy.progress_interval,
        );
        let mut body = response.into_body();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| DownloadError::Transport(error_chain(&e)))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            received = received.saturating_add(data.len() as u64);
            if received > self.policy.max_size {
                return Err(DownloadError::TooLarge(self.policy.max_size));
            }
            hasher.update(&data);
            file.write_all(&data).await.map_err(DownloadError::Write)?;
            progress.update(received, Instant::now());
        }
        if let Some(len) = expected_len
            && received != len
        {
            return Err(DownloadError::Transport(format!(
                "the body ended after {received} of {len} bytes"
            )));
        }
        file.flush().await.map_err(DownloadError::Write)?;
        progress.done(received);
        Ok(Sha256Hash::from_bytes(hasher.finalize().into()))
    }
}

/// Resolves a `Location` header against the request URI (absolute, or an absolute path).
pub(crate) fn resolve_location(base: &Uri, location: &str) -> Option<Uri> {
    let loc: Uri = location.parse().ok()?;
    if loc.scheme().is_some() {
        return matches!(loc.scheme_str(), Some("http" | "https")).then_some(loc);
    }
    if !location.starts_with('/') || location.starts_with("//") {
        return None;
    }
    let mut parts = http::uri::Parts::default();
    parts.scheme = base.scheme().cloned();
    parts.authority = base.authority().cloned();
    parts.path_and_query = loc.path_and_query().cloned();
    Uri::from_parts(parts).ok()
}

/// Rate-limited progress lines for large downloads.
pub(crate) struct Progress {
    url: String,
    total: Option<u64>,
    interval: Duration,
    started: Instant,
    last: Instant,
    logged: bool,
}

/// Downloads smaller than this get no progress lines.
pub(crate) const PROGRESS_MIN_BYTES: u64 = 8 << 20;

impl Progress {
    fn new(url: String, total: Option<u64>, interval: Duration) -> Self {
        let now = Instant::now();
        Self {
            url,
            total,
            interval,
            started: now,
            last: now,
            logged: false,
        }
    }

    fn update(&mut self, received: u64, now: Instant) {
        if received < PROGRESS_MIN_BYTES || now.duration_since(self.last) < self.interval {
            return;
        }
        self.last = now;
        self.logged = true;
        match self.total {
            Some(total) if total > 0 => {
                info!(url = %self.url, received_mib = received >> 20, total_mib = total >> 20, percent = received.saturating_mul(100) / total, "downloading")
            }
            _ => info!(url = %self.url, received_mib = received >> 20, "downloading"),
        }
    }

    fn done(&self, received: u64) {
        if self.logged || received >= PROGRESS_MIN_BYTES {
            info!(url = %self.url, bytes = received, seconds = self.started.elapsed().as_secs_f32(), "download complete");
        }
    }
}

//! [`HttpMetadata`]: the metadata client over plain HTTP.

use crate::call::{self, CallError};
use crate::{InstanceMetadata, Metadata, MetadataError};
use bytes::Bytes;
use http::Request;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use serde::de::DeserializeOwned;
use std::net::IpAddr;
use std::time::Duration;

/// Deadline of one call: connect, request, response headers and body.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest response body accepted.
pub const MAX_RESPONSE_LEN: usize = 1024 * 1024;

/// Reads instance metadata from a metadata service over plain HTTP
/// (`GET /self`, `/peers`, `/endpoint`, `/initsecrethash`).
///
/// It checks the HTTP status (anything but 200 is an error, so a proxy's error page is never
/// read as metadata), caps the response body at [`MAX_RESPONSE_LEN`] and gives every call a
/// deadline ([`DEFAULT_TIMEOUT`]). With [`HttpMetadata::with_local_address`] its connections
/// come from the node's own address, which is how the service tells nodes apart.
#[derive(Clone)]
pub struct HttpMetadata {
    base: String,
    local: Option<IpAddr>,
    timeout: Duration,
    client: Client<HttpConnector, Empty<Bytes>>,
}

impl std::fmt::Debug for HttpMetadata {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpMetadata")
            .field("base", &self.base)
            .field("local", &self.local)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl HttpMetadata {
    /// A client for the service at `base_url` (`http://host:port`, optionally with a path
    /// prefix). Only `http` is accepted: the service is plain HTTP by design, its answers
    /// are not secret, and whatever is security-relevant is checked elsewhere.
    pub fn new(base_url: &str) -> Result<Self, MetadataError> {
        let base = call::base_url(base_url).map_err(|reason| MetadataError::InvalidUrl {
            url: base_url.to_owned(),
            reason: reason.to_owned(),
        })?;
        Ok(Self {
            client: call::client(None, DEFAULT_TIMEOUT),
            base,
            local: None,
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// Binds outgoing connections to `ip`, so the service sees requests coming from it.
    #[must_use]
    pub fn with_local_address(mut self, ip: IpAddr) -> Self {
        self.local = Some(ip);
        self.client = call::client(self.local, self.timeout);
        self
    }

    /// Replaces the per-call deadline.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self.client = call::client(self.local, self.timeout);
        self
    }

    /// The service's base URL.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// `GET path`: checks the status, caps the body, all within the deadline.
    async fn get_bytes(&self, path: &'static str) -> Result<Bytes, MetadataError> {
        let url = format!("{}{path}", self.base);
        let request = Request::get(url.as_str())
            .header(http::header::ACCEPT, "application/json, text/plain")
            .body(Empty::<Bytes>::new())
            .map_err(|e| MetadataError::InvalidUrl {
                url: url.clone(),
                reason: e.to_string(),
            })?;
        call::call(&self.client, request, MAX_RESPONSE_LEN, self.timeout)
            .await
            .map_err(|e| match e {
                CallError::Request(source) => MetadataError::Request { path, source },
                CallError::Status(status) => MetadataError::Status { path, status },
                CallError::TooLarge { cap } => MetadataError::BodyTooLarge { path, cap },
                CallError::Timeout { after } => MetadataError::Timeout { path, after },
            })
    }

    async fn get_json<T: DeserializeOwned>(&self, path: &'static str) -> Result<T, MetadataError> {
        let body = self.get_bytes(path).await?;
        serde_json::from_slice(&body).map_err(|source| MetadataError::Decode { path, source })
    }
}

impl Metadata for HttpMetadata {
    async fn self_instance(&self) -> Result<InstanceMetadata, MetadataError> {
        self.get_json("/self").await
    }

    async fn list(&self) -> Result<Vec<InstanceMetadata>, MetadataError> {
        self.get_json("/peers").await
    }

    async fn control_plane_endpoint(&self) -> Result<String, MetadataError> {
        self.get_json("/endpoint").await
    }

    async fn init_secret_hash(&self) -> Result<String, MetadataError> {
        let body = self.get_bytes("/initsecrethash").await?;
        String::from_utf8(body.to_vec()).map_err(|_| MetadataError::NotUtf8 {
            path: "/initsecrethash",
        })
    }
}

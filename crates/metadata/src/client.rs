//! [`HttpMetadata`]: the metadata client over plain HTTP.

use crate::{InstanceMetadata, Metadata, MetadataError};
use bytes::Bytes;
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
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
/// Unlike the original client, it checks the HTTP status (anything but 200 is an error),
/// caps the response body at [`MAX_RESPONSE_LEN`] and gives every call a deadline
/// ([`DEFAULT_TIMEOUT`]). With [`HttpMetadata::with_local_address`] its connections come
/// from the node's own address, which is how the service tells nodes apart.
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
        let invalid = |reason: &str| MetadataError::InvalidUrl {
            url: base_url.to_owned(),
            reason: reason.to_owned(),
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
        let base = base_url.trim_end_matches('/').to_owned();
        Ok(Self {
            client: build_client(None, DEFAULT_TIMEOUT),
            base,
            local: None,
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// Binds outgoing connections to `ip`, so the service sees requests coming from it.
    #[must_use]
    pub fn with_local_address(mut self, ip: IpAddr) -> Self {
        self.local = Some(ip);
        self.client = build_client(self.local, self.timeout);
        self
    }

    /// Replaces the per-call deadline.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self.client = build_client(self.local, self.timeout);
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
        let call = async {
            let response =
                self.client
                    .request(request)
                    .await
                    .map_err(|e| MetadataError::Request {
                        path,
                        source: Box::new(e),
                    })?;
            let status = response.status();
            if status != StatusCode::OK {
                return Err(MetadataError::Status {
                    path,
                    status: status.as_u16(),
                });
            }
            let declared = response
                .headers()
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            if declared.is_some_and(|n| n > MAX_RESPONSE_LEN as u64) {
                return Err(MetadataError::BodyTooLarge {
                    path,
                    cap: MAX_RESPONSE_LEN,
                });
            }
            let body = Limited::new(response.into_body(), MAX_RESPONSE_LEN)
                .collect()
                .await
                .map_err(|e| {
                    if e.is::<http_body_util::LengthLimitError>() {
                        MetadataError::BodyTooLarge {
                            path,
                            cap: MAX_RESPONSE_LEN,
                        }
                    } else {
                        MetadataError::Request { path, source: e }
                    }
                })?;
            Ok(body.to_bytes())
        };
        tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| MetadataError::Timeout {
                path,
                after: self.timeout,
            })?
    }

    async fn get_json<T: DeserializeOwned>(&self, path: &'static str) -> Result<T, MetadataError> {
        let body = self.get_bytes(path).await?;
        serde_json::from_slice(&body).map_err(|source| MetadataError::Decode { path, source })
    }
}

fn build_client(local: Option<IpAddr>, timeout: Duration) -> Client<HttpConnector, Empty<Bytes>> {
    let mut connector = HttpConnector::new();
    connector.set_local_address(local);
    connector.set_connect_timeout(Some(timeout));
    connector.set_nodelay(true);
    connector.enforce_http(true);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(4)
        .build(connector)
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

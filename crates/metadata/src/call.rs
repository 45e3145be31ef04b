//! One bounded HTTP call, shared by the clients of this crate: the status must be 200, the
//! body is capped, and the whole call (connect, request, headers, body) has a deadline.

use bytes::Bytes;
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt as _, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connect, HttpConnector};
use hyper_util::rt::TokioExecutor;
use std::net::IpAddr;
use std::time::Duration;

/// Why one call failed; each client adds what it called.
#[derive(Debug)]
pub(crate) enum CallError {
    /// Connect, I/O or HTTP framing.
    Request(Box<dyn std::error::Error + Send + Sync>),
    /// Another status than 200.
    Status(u16),
    /// The body exceeded the cap.
    TooLarge {
        /// The cap, in bytes.
        cap: usize,
    },
    /// The deadline passed.
    Timeout {
        /// The deadline.
        after: Duration,
    },
}

/// Checks a base URL (`http://host[:port][/prefix]`) and returns it without a trailing
/// slash, or why it is unusable.
pub(crate) fn base_url(url: &str) -> Result<String, &'static str> {
    let uri: Uri = url.parse().map_err(|_| "not a URL")?;
    if uri.scheme_str() != Some("http") {
        return Err("the scheme must be http");
    }
    if uri.authority().is_none() {
        return Err("the URL has no host");
    }
    if uri.query().is_some() {
        return Err("the URL must not have a query");
    }
    Ok(url.trim_end_matches('/').to_owned())
}

/// A plain-HTTP client whose connections come from `local` when given.
pub(crate) fn client<B>(local: Option<IpAddr>, timeout: Duration) -> Client<HttpConnector, B>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
{
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

/// Sends `request`; the body of a 200 answer, at most `cap` bytes, within `timeout`.
pub(crate) async fn call<C, B>(
    client: &Client<C, B>,
    request: Request<B>,
    cap: usize,
    timeout: Duration,
) -> Result<Bytes, CallError>
where
    C: Connect + Clone + Send + Sync + 'static,
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    call_with_headers(client, request, cap, timeout)
        .await
        .map(|(_, body)| body)
}

/// [`call`], with the answer's headers.
pub(crate) async fn call_with_headers<C, B>(
    client: &Client<C, B>,
    request: Request<B>,
    cap: usize,
    timeout: Duration,
) -> Result<(http::HeaderMap, Bytes), CallError>
where
    C: Connect + Clone + Send + Sync + 'static,
    B: hyper::body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let call = async {
        let response = client
            .request(request)
            .await
            .map_err(|e| CallError::Request(Box::new(e)))?;
        let status = response.status();
        if status != StatusCode::OK {
            return Err(CallError::Status(status.as_u16()));
        }
        let declared = response
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > cap as u64) {
            return Err(CallError::TooLarge { cap });
        }
        let (parts, body) = response.into_parts();
        let body = Limited::new(body, cap).collect().await.map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                CallError::TooLarge { cap }
            } else {
                CallError::Request(e)
            }
        })?;
        Ok((parts.headers, body.to_bytes()))
    };
    tokio::time::timeout(timeout, call)
        .await
        .map_err(|_| CallError::Timeout { after: timeout })?
}

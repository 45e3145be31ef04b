//! Loopback stand-ins for a cloud's instance metadata service: an HTTP/1.1 server on
//! 127.0.0.1 that answers each request with a handler, and GCE's metadata server as its
//! documentation describes it. The node-settings tests hold Azure's and AWS's beside it.

// Test helpers fail the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use http::{Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// What a stand-in answers to a request (its head).
pub type Handler = Arc<dyn Fn(&Parts) -> Response<Full<Bytes>> + Send + Sync>;

/// Serves `handler` on 127.0.0.1, on the current tokio runtime, until the runtime ends.
pub async fn serve(handler: Handler) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let handler = handler.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request: http::Request<Incoming>| {
                    let handler = handler.clone();
                    async move { Ok::<_, Infallible>(handler(&request.into_parts().0)) }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// An answer with `status`, `headers` and `body`.
pub fn answer(
    status: StatusCode,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut response = Response::builder().status(status);
    for (k, v) in headers {
        response = response.header(*k, *v);
    }
    response.body(Full::new(body.into())).unwrap()
}

/// The request's header `name`, if it is text.
pub fn header<'a>(parts: &'a Parts, name: &str) -> Option<&'a str> {
    parts.headers.get(name).and_then(|v| v.to_str().ok())
}

/// One GCE instance as its metadata server describes it.
#[derive(Debug, Clone)]
pub struct GceInstance {
    /// The instance's attributes (`instance/attributes/`), a JSON object of strings.
    pub attributes: serde_json::Value,
    /// `instance/hostname`.
    pub hostname: String,
    /// `instance/network-interfaces/0/ip`.
    pub ip: String,
}

/// GCE's metadata server, as documented
/// (<https://cloud.google.com/compute/docs/metadata/querying-metadata>): requests without
/// `Metadata-Flavor: Google` get 403; answers carry `Metadata-Flavor: Google` (unless
/// `flavor_in_answer` is false, as no real server does); `?recursive=true` on a directory
/// answers JSON; a missing key answers 404. Keys:
/// <https://cloud.google.com/compute/docs/metadata/predefined-metadata-keys>.
pub fn gce(instance: GceInstance, flavor_in_answer: bool) -> Handler {
    Arc::new(move |parts| {
        if header(parts, "metadata-flavor") != Some("Google") {
            return answer(
                StatusCode::FORBIDDEN,
                &[],
                "Missing Metadata-Flavor:Google header.",
            );
        }
        let flavor: &[(&str, &str)] = if flavor_in_answer {
            &[("metadata-flavor", "Google")]
        } else {
            &[]
        };
        let path = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("");
        match path {
            "/computeMetadata/v1/instance/attributes/?recursive=true" => answer(
                StatusCode::OK,
                &[flavor, &[("content-type", "application/json")][..]].concat(),
                instance.attributes.to_string(),
            ),
            "/computeMetadata/v1/instance/hostname" => {
                answer(StatusCode::OK, flavor, instance.hostname.clone())
            }
            "/computeMetadata/v1/instance/network-interfaces/0/ip" => {
                answer(StatusCode::OK, flavor, instance.ip.clone())
            }
            _ => answer(StatusCode::NOT_FOUND, flavor, "not found"),
        }
    })
}

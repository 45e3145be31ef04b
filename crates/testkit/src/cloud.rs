//! Loopback stand-ins for a cloud's instance metadata service: an HTTP/1.1 server on
//! 127.0.0.1 that answers each request with a handler, and GCE's metadata server, Azure's
//! IMDS and AWS's IMDSv2 as their documentation describes them.

// Test helpers fail the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

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

/// Azure's IMDS, as documented
/// (<https://learn.microsoft.com/en-us/azure/virtual-machines/instance-metadata-service>):
/// requests without `Metadata: true` or without `api-version` get 400; `userData`
/// (<https://learn.microsoft.com/en-us/azure/virtual-machines/user-data>) answers the user
/// data in base64 with `format=text` (`user_data`, already in base64); `/metadata/instance`
/// answers the instance document (`instance`; [`azure_instance`] makes one).
pub fn azure(user_data: String, instance: serde_json::Value) -> Handler {
    Arc::new(move |parts| {
        if header(parts, "metadata") != Some("true") {
            return answer(
                StatusCode::BAD_REQUEST,
                &[],
                r#"{"error":"Bad request. Required metadata header not specified"}"#,
            );
        }
        let query = parts.uri.query().unwrap_or("");
        if !query.split('&').any(|kv| kv.starts_with("api-version=")) {
            return answer(
                StatusCode::BAD_REQUEST,
                &[],
                r#"{"error":"Bad request. api-version was not specified in the request"}"#,
            );
        }
        match (parts.uri.path(), query) {
            ("/metadata/instance/compute/userData", "api-version=2021-01-01&format=text") => {
                answer(
                    StatusCode::OK,
                    &[("content-type", "text/plain")],
                    user_data.clone(),
                )
            }
            ("/metadata/instance", "api-version=2021-02-01") => answer(
                StatusCode::OK,
                &[("content-type", "application/json")],
                instance.to_string(),
            ),
            _ => answer(StatusCode::NOT_FOUND, &[], "not found"),
        }
    })
}

/// Azure's instance document (`/metadata/instance`) of a VM `name` at `ip`/`prefix` on its
/// first interface.
pub fn azure_instance(name: &str, ip: &str, prefix: u8) -> serde_json::Value {
    let subnet = ip.rsplit_once('.').map_or("10.1.0", |(net, _)| net);
    serde_json::json!({
        "compute": {"name": name, "location": "westeurope", "vmSize": "Standard_DC2as_v5"},
        "network": {"interface": [{
            "ipv4": {
                "ipAddress": [{"privateIpAddress": ip, "publicIpAddress": ""}],
                "subnet": [{"address": format!("{subnet}.0"), "prefix": prefix.to_string()}]
            },
            "ipv6": {"ipAddress": []},
            "macAddress": "000D3A000000"
        }]}
    })
}

/// AWS IMDSv2, as documented
/// (<https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-retrieval.html>):
/// `PUT /latest/api/token` with `X-aws-ec2-metadata-token-ttl-seconds` (1 to 21600) answers
/// a token, a PUT without it 400; a GET without a valid `X-aws-ec2-metadata-token` 401
/// (IMDSv2 required); `user-data` 404 when the instance has none.
#[derive(Debug)]
pub struct Aws {
    /// The session token the PUT answers.
    pub token: &'static str,
    /// `user-data`, if the instance has any.
    pub user_data: Option<Vec<u8>>,
    /// `meta-data/hostname`.
    pub hostname: String,
    /// `meta-data/local-ipv4`.
    pub local_ipv4: String,
    /// How many tokens were asked for.
    pub puts: Mutex<u32>,
}

impl Aws {
    /// An instance with `user_data`, named `hostname` at `local_ipv4`.
    pub fn new(user_data: Option<Vec<u8>>, hostname: &str, local_ipv4: &str) -> Self {
        Self {
            token: "AQAEAGh0dHA6Ly9leGFtcGxlLmNvbS90b2tlbg==",
            user_data,
            hostname: hostname.to_owned(),
            local_ipv4: local_ipv4.to_owned(),
            puts: Mutex::new(0),
        }
    }
}

/// The IMDSv2 stand-in of `state`.
pub fn aws(state: Arc<Aws>) -> Handler {
    Arc::new(move |parts| {
        let path = parts.uri.path();
        if parts.method == http::Method::PUT {
            if path != "/latest/api/token" {
                return answer(StatusCode::FORBIDDEN, &[], "");
            }
            let ttl = header(parts, "x-aws-ec2-metadata-token-ttl-seconds")
                .and_then(|t| t.parse::<u32>().ok());
            if !ttl.is_some_and(|t| (1..=21600).contains(&t)) {
                return answer(StatusCode::BAD_REQUEST, &[], "");
            }
            *state.puts.lock().unwrap() += 1;
            return answer(
                StatusCode::OK,
                &[("content-type", "text/plain")],
                state.token,
            );
        }
        if header(parts, "x-aws-ec2-metadata-token") != Some(state.token) {
            return answer(StatusCode::UNAUTHORIZED, &[], "");
        }
        match path {
            "/latest/user-data" => match &state.user_data {
                Some(data) => answer(StatusCode::OK, &[], data.clone()),
                None => answer(StatusCode::NOT_FOUND, &[], ""),
            },
            "/latest/meta-data/local-ipv4" => answer(StatusCode::OK, &[], state.local_ipv4.clone()),
            "/latest/meta-data/hostname" => answer(StatusCode::OK, &[], state.hostname.clone()),
            _ => answer(StatusCode::NOT_FOUND, &[], ""),
        }
    })
}

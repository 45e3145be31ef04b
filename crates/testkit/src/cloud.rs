//! Loopback stand-ins for a cloud's instance metadata service: an HTTP/1.1 server on
//! 127.0.0.1 that answers each request with a handler, and GCE's metadata server, Azure's
//! IMDS and AWS's IMDSv2 as their documentation describes them; and GCE's Compute Engine
//! API over HTTPS with what its metadata server gives a program to call it.

// Test helpers fail the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

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
    accept_loop(handler, None).await
}

/// Serves `handler` over HTTPS on 127.0.0.1 with a fresh test CA, until the runtime ends:
/// the address, and the CA's certificate (PEM), the one root the server's chains to.
pub async fn serve_https(handler: Handler) -> (SocketAddr, String) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "test cloud API CA");
    let ca_pem = ca_params.self_signed(&ca_key).unwrap().pem();
    let ca = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.subject_alt_names = vec![rcgen::SanType::IpAddress(std::net::IpAddr::V4(
        std::net::Ipv4Addr::LOCALHOST,
    ))];
    let cert = params.signed_by(&key, &ca).unwrap();
    let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![cert.der().clone()],
        rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
    )
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    (accept_loop(handler, Some(acceptor)).await, ca_pem)
}

async fn accept_loop(handler: Handler, tls: Option<tokio_rustls::TlsAcceptor>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let handler = handler.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request: http::Request<Incoming>| {
                    let handler = handler.clone();
                    async move { Ok::<_, Infallible>(handler(&request.into_parts().0)) }
                });
                let http = http1::Builder::new();
                let _ = match tls {
                    None => http.serve_connection(TokioIo::new(stream), service).await,
                    Some(tls) => match tls.accept(stream).await {
                        Ok(stream) => http.serve_connection(TokioIo::new(stream), service).await,
                        Err(_) => return,
                    },
                };
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
        if let Some(refused) = without_gce_flavor(parts) {
            return refused;
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

/// GCE's metadata server's answer to a request without `Metadata-Flavor: Google`.
fn without_gce_flavor(parts: &Parts) -> Option<Response<Full<Bytes>>> {
    (header(parts, "metadata-flavor") != Some("Google")).then(|| {
        answer(
            StatusCode::FORBIDDEN,
            &[],
            "Missing Metadata-Flavor:Google header.",
        )
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

/// A GCE project as its Compute Engine API lists it, for [`gce_compute`] and
/// [`gce_identity`].
#[derive(Debug)]
pub struct GceProject {
    /// The project ID.
    pub project: String,
    /// The access token the metadata server hands out and the API requires.
    pub token: String,
    /// Its instances, as the API's `Instance` resources ([`gce_api_instance`]).
    pub instances: Mutex<Vec<serde_json::Value>>,
    /// Instances per page, at most.
    pub page_size: usize,
    /// Whether the API applies the `filter` parameter (the real one does).
    pub filter: bool,
    /// Zones the listing reports unreachable.
    pub unreachables: Vec<String>,
    /// The path and query of every API call that carried the token.
    pub calls: Mutex<Vec<String>>,
    /// How many tokens the metadata server handed out.
    pub tokens: Mutex<u32>,
    /// The access scopes of the instances' service account.
    pub scopes: Vec<String>,
}

impl GceProject {
    /// Project `project` with `instances`, all on one page.
    pub fn new(project: &str, instances: Vec<serde_json::Value>) -> Self {
        Self {
            project: project.to_owned(),
            token: "ya29.c.test-access-token".to_owned(),
            instances: Mutex::new(instances),
            page_size: 500,
            filter: true,
            unreachables: Vec::new(),
            calls: Mutex::new(Vec::new()),
            tokens: Mutex::new(0),
            scopes: vec!["https://www.googleapis.com/auth/compute.readonly".to_owned()],
        }
    }
}

/// One `Instance` resource as the Compute Engine API gives it
/// (<https://cloud.google.com/compute/docs/reference/rest/v1/instances>), with `labels`.
pub fn gce_api_instance(
    name: &str,
    zone: &str,
    ip: &str,
    labels: &[(&str, &str)],
) -> serde_json::Value {
    let labels: serde_json::Map<String, serde_json::Value> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(*v)))
        .collect();
    serde_json::json!({
        "kind": "compute#instance",
        "name": name,
        "zone": format!("https://www.googleapis.com/compute/v1/projects/p/zones/{zone}"),
        "status": "RUNNING",
        "labels": labels,
        "networkInterfaces": [{
            "name": "nic0",
            "networkIP": ip,
            "aliasIpRanges": [{"ipCidrRange": "10.64.0.0/24", "subnetworkRangeName": "pods"}]
        }]
    })
}

/// GCE's metadata server as a program on instance `name` reads it to call the API:
/// `instance/name`, the default service account's token
/// (<https://cloud.google.com/compute/docs/access/authenticate-workloads#applications>: a
/// JSON document with `access_token`, `expires_in`, `token_type`), its scopes (one per
/// line), and the instance
/// attribute `asterism-init-secret-hash` when given. Like [`gce`], it refuses requests
/// without `Metadata-Flavor: Google` and answers with it.
pub fn gce_identity(
    project: Arc<GceProject>,
    name: &str,
    init_secret_hash: Option<&str>,
) -> Handler {
    let name = name.to_owned();
    let hash = init_secret_hash.map(str::to_owned);
    Arc::new(move |parts| {
        if let Some(refused) = without_gce_flavor(parts) {
            return refused;
        }
        let flavor = [("metadata-flavor", "Google")];
        match parts.uri.path() {
            "/computeMetadata/v1/instance/name" => answer(StatusCode::OK, &flavor, name.clone()),
            "/computeMetadata/v1/instance/service-accounts/default/token" => {
                *project.tokens.lock().unwrap() += 1;
                let body = serde_json::json!({
                    "access_token": project.token, "expires_in": 3599, "token_type": "Bearer"
                });
                answer(StatusCode::OK, &flavor, body.to_string())
            }
            "/computeMetadata/v1/instance/service-accounts/default/scopes" => {
                answer(StatusCode::OK, &flavor, project.scopes.join("\n") + "\n")
            }
            "/computeMetadata/v1/instance/attributes/asterism-init-secret-hash" => match &hash {
                Some(hash) => answer(StatusCode::OK, &flavor, hash.clone()),
                None => answer(StatusCode::NOT_FOUND, &flavor, "not found"),
            },
            _ => answer(StatusCode::NOT_FOUND, &flavor, "not found"),
        }
    })
}

/// The Compute Engine API's `instances.aggregatedList`
/// (<https://cloud.google.com/compute/docs/reference/rest/v1/instances/aggregatedList>), as
/// documented: a call without `Authorization: Bearer <token>` gets 401; another project
/// 403; `filter=labels.KEY = "VALUE"` keeps the instances so labelled (when
/// [`GceProject::filter`]); `maxResults` and `pageToken` page the list; instances are
/// grouped by `zones/<zone>`.
pub fn gce_compute(project: Arc<GceProject>) -> Handler {
    Arc::new(move |parts| {
        let json = [("content-type", "application/json")];
        let bearer = format!("Bearer {}", project.token);
        if header(parts, "authorization") != Some(bearer.as_str()) {
            return answer(
                StatusCode::UNAUTHORIZED,
                &json,
                r#"{"error":{"code":401,"message":"Request is missing required authentication credential.","status":"UNAUTHENTICATED"}}"#,
            );
        }
        let path = parts.uri.path();
        project
            .calls
            .lock()
            .unwrap()
            .push(parts.uri.path_and_query().unwrap().to_string());
        if path
            != format!(
                "/compute/v1/projects/{}/aggregated/instances",
                project.project
            )
        {
            return answer(
                StatusCode::FORBIDDEN,
                &json,
                r#"{"error":{"code":403,"message":"Required 'compute.instances.list' permission","status":"PERMISSION_DENIED"}}"#,
            );
        }
        let query: Vec<(String, String)> = parts
            .uri
            .query()
            .unwrap_or("")
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_owned(), crate::percent_decode(v)))
            .collect();
        let param = |key: &str| query.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
        let label = param("filter").and_then(|f| {
            let (key, value) = f.strip_prefix("labels.")?.split_once(" = ")?;
            Some((key.to_owned(), value.trim_matches('"').to_owned()))
        });
        let page_size = param("maxResults")
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(500)
            .min(project.page_size);
        let start = param("pageToken")
            .and_then(|t| t.strip_prefix("page-")?.parse::<usize>().ok())
            .unwrap_or(0);
        let instances: Vec<serde_json::Value> = project
            .instances
            .lock()
            .unwrap()
            .iter()
            .filter(|i| match (&label, project.filter) {
                (Some((key, value)), true) => i["labels"][key.as_str()] == value.as_str(),
                _ => true,
            })
            .cloned()
            .collect();
        let end = (start + page_size).min(instances.len());
        let mut items = serde_json::Map::new();
        for i in &instances[start.min(end)..end] {
            let zone = i["zone"].as_str().unwrap().rsplit('/').next().unwrap();
            let scope = items
                .entry(format!("zones/{zone}"))
                .or_insert_with(|| serde_json::json!({"instances": []}));
            scope["instances"].as_array_mut().unwrap().push(i.clone());
        }
        let mut body = serde_json::json!({
            "kind": "compute#instanceAggregatedList",
            "items": items,
        });
        if end < instances.len() {
            body["nextPageToken"] = format!("page-{end}").into();
        }
        if !project.unreachables.is_empty() {
            body["unreachables"] = project.unreachables.clone().into();
        }
        answer(StatusCode::OK, &json, body.to_string())
    })
}

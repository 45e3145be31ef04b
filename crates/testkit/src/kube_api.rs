//! A recording Kubernetes API server for tests: no API server can run where the tests run,
//! so this one answers with **recorded responses** (JSON files in the real API format under
//! `crates/testkit/recorded/`) and **records every request**
//! (method, path, query, body), so that a test asserts both what the client sent and how it
//! handled the answers.
//!
//! It speaks HTTPS on `127.0.0.1` with a fresh test CA and requires a client certificate
//! from that CA, as an API server does for the admin kubeconfig; [`RecordingServer::kubeconfig`]
//! is a kubeconfig with that CA and client certificate.
//!
//! Test support only: a failure here is a broken test, so it panics.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use asterism_kube_api::{ApiOptions, ClusterApi};
use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The API paths the recorded responses answer, as the clients under test request them.
pub mod paths {
    /// Namespaces (the API's reachability check lists them).
    pub const NAMESPACES: &str = "/api/v1/namespaces";
    /// ConfigMaps in `kube-system`.
    pub const CONFIG_MAPS: &str = "/api/v1/namespaces/kube-system/configmaps";
    /// Secrets in `kube-system` (bootstrap tokens).
    pub const SECRETS: &str = "/api/v1/namespaces/kube-system/secrets";
    /// DaemonSets in `kube-system`.
    pub const DAEMON_SETS: &str = "/apis/apps/v1/namespaces/kube-system/daemonsets";
    /// The JoiningNode objects.
    pub const JOINING_NODES: &str = "/apis/update.edgeless.systems/v1alpha1/joiningnodes";
    /// The cluster's NodeVersion object.
    pub const NODE_VERSION: &str =
        "/apis/update.edgeless.systems/v1alpha1/nodeversions/constellation-version";
}

/// The directory of the recorded responses.
pub fn recorded_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("recorded")
}

/// The recorded response `file` (e.g. `secret-list-empty.json`).
pub fn recorded(file: &str) -> String {
    let path = recorded_dir().join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// One answer: an HTTP status and a JSON body.
#[derive(Debug, Clone)]
pub struct Reply {
    /// HTTP status code.
    pub status: u16,
    /// JSON body.
    pub body: String,
}

impl Reply {
    /// `body` with `status`.
    pub fn json(status: u16, body: impl Into<String>) -> Self {
        Self {
            status,
            body: body.into(),
        }
    }

    /// The recorded response `file` with `status`.
    pub fn recorded(status: u16, file: &str) -> Self {
        Self::json(status, recorded(file))
    }
}

/// A request the server received.
#[derive(Debug, Clone)]
pub struct Request {
    /// `GET`, `POST`, `PUT`, `PATCH`, `DELETE`.
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The query string (may be empty).
    pub query: String,
    /// The `Content-Type` header (may be empty).
    pub content_type: String,
    /// The body as JSON (`Null` if empty; a JSON string if it was no JSON).
    pub body: serde_json::Value,
}

impl Request {
    /// Whether the request changes anything (anything but `GET`).
    pub fn is_write(&self) -> bool {
        self.method != "GET"
    }

    /// The (percent-decoded) value of query parameter `key`.
    pub fn query_param(&self, key: &str) -> Option<String> {
        self.query.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            (k == key).then(|| crate::percent_decode(v))
        })
    }

    /// The Secret `data` value `key`, base64-decoded, as text.
    pub fn secret_data(&self, key: &str) -> Option<String> {
        let b64 = self.body.pointer(&format!("/data/{key}"))?.as_str()?;
        let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
        String::from_utf8(bytes).ok()
    }
}

struct Route {
    method: String,
    path: String,
    replies: VecDeque<Reply>,
    last: Reply,
    /// Answer with the request's body instead (as an API server answers an apply).
    echo: bool,
}

#[derive(Default)]
struct State {
    routes: Vec<Route>,
    requests: Vec<Request>,
}

/// The recording API server. Stops when dropped.
pub struct RecordingServer {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    ca_pem: String,
    client_cert_pem: String,
    client_key_pem: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RecordingServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

const NOT_FOUND: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server could not find the requested resource","reason":"NotFound","details":{},"code":404}"#;

impl RecordingServer {
    /// Starts a server on `127.0.0.1` (a free port) with a fresh CA, server and client
    /// certificate. Unrouted requests get the API server's generic 404 `Status`.
    pub async fn start() -> Self {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "kubernetes");
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let ca_pem = ca_cert.pem();
        let ca = rcgen::Issuer::new(ca_params, ca_key);

        let server_key = rcgen::KeyPair::generate().unwrap();
        let mut server_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        server_params.subject_alt_names =
            vec![rcgen::SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST))];
        server_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "kube-apiserver");
        let server_cert = server_params.signed_by(&server_key, &ca).unwrap();

        let client_key = rcgen::KeyPair::generate().unwrap();
        let mut client_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        client_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "kubernetes-admin");
        client_params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:masters");
        client_params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let client_cert = client_params.signed_by(&client_key, &ca).unwrap();

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca_cert.der().clone()).unwrap();
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .unwrap();
        let key_der =
            rustls::pki_types::PrivateKeyDer::try_from(server_key.serialize_der()).unwrap();
        let tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(vec![server_cert.der().clone()], key_der)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));

        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                let state = shared.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |req| {
                        let state = state.clone();
                        async move { Ok::<_, Infallible>(answer(&state, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            state,
            ca_pem,
            client_cert_pem: client_cert.pem(),
            client_key_pem: client_key.serialize_pem(),
            task,
        }
    }

    /// Answers `method path` with `replies` in turn, the last one from then on (replaces an
    /// earlier route of the same method and path).
    pub fn on(&self, method: &str, path: &str, replies: impl IntoIterator<Item = Reply>) -> &Self {
        let mut replies: VecDeque<Reply> = replies.into_iter().collect();
        let last = replies.pop_back().expect("a route needs a reply");
        let mut state = self.state.lock().unwrap();
        state
            .routes
            .retain(|r| !(r.method == method && r.path == path));
        state.routes.push(Route {
            method: method.to_owned(),
            path: path.to_owned(),
            replies,
            last,
            echo: false,
        });
        self
    }

    /// Answers `method path` with status 200 and the request's own body, as the API server
    /// answers a server-side apply of a new object (replaces an earlier route).
    pub fn echo(&self, method: &str, path: &str) -> &Self {
        self.on(method, path, [Reply::json(200, "")]);
        let mut state = self.state.lock().unwrap();
        if let Some(route) = state
            .routes
            .iter_mut()
            .find(|r| r.method == method && r.path == path)
        {
            route.echo = true;
        }
        drop(state);
        self
    }

    /// Routes the creation of `kube-system/join-config` by `apply_join_config`: it does not
    /// exist yet, and the create succeeds (recorded answers).
    pub fn route_new_join_config(&self) -> &Self {
        use paths::CONFIG_MAPS;
        self.on(
            "GET",
            &format!("{CONFIG_MAPS}/join-config"),
            [Reply::recorded(
                404,
                "status-404-configmap-join-config.json",
            )],
        );
        self.on(
            "POST",
            CONFIG_MAPS,
            [Reply::recorded(201, "configmap-join-config-created.json")],
        )
    }

    /// Routes the join service's lookups of a node it has never seen: no member `node`, no
    /// binding of the disk `disk_uuid` (recorded answers).
    pub fn route_unknown_node(&self, node: &str, disk_uuid: &str) -> &Self {
        use paths::CONFIG_MAPS;
        self.on(
            "GET",
            &format!("{CONFIG_MAPS}/asterism-disk-{disk_uuid}"),
            [Reply::recorded(404, "status-404-configmap-disk.json")],
        )
        .on(
            "GET",
            &format!("{CONFIG_MAPS}/asterism-member-{node}"),
            [Reply::recorded(404, "status-404-configmap-member.json")],
        )
    }

    /// Routes a first admission of `node` with the disk `disk_uuid`, as the join service's
    /// cluster state makes it: [`RecordingServer::route_unknown_node`], then the three
    /// creates succeed in their order (the AK's claim, the disk's binding, the member:
    /// recorded answers).
    pub fn route_first_admission(&self, node: &str, disk_uuid: &str) -> &Self {
        use paths::CONFIG_MAPS;
        self.route_unknown_node(node, disk_uuid).on(
            "POST",
            CONFIG_MAPS,
            [
                Reply::recorded(201, "configmap-ak-claim-created.json"),
                Reply::recorded(201, "configmap-disk-binding-created.json"),
                Reply::recorded(201, "configmap-member-created.json"),
            ],
        )
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<Request> {
        self.state.lock().unwrap().requests.clone()
    }

    /// Every request so far that is not a `GET`.
    pub fn writes(&self) -> Vec<Request> {
        self.requests()
            .into_iter()
            .filter(Request::is_write)
            .collect()
    }

    /// Forgets the requests recorded so far.
    pub fn clear_requests(&self) {
        self.state.lock().unwrap().requests.clear();
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// An admin kubeconfig for this server (CA and client certificate inline).
    pub fn kubeconfig(&self) -> String {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        format!(
            "apiVersion: v1
kind: Config
clusters:
- name: asterism
  cluster:
    server: {url}
    certificate-authority-data: {ca}
contexts:
- name: kubernetes-admin@asterism
  context:
    cluster: asterism
    user: kubernetes-admin
current-context: kubernetes-admin@asterism
users:
- name: kubernetes-admin
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
",
            url = self.url(),
            ca = b64(&self.ca_pem),
            cert = b64(&self.client_cert_pem),
            key = b64(&self.client_key_pem),
        )
    }

    /// Writes [`RecordingServer::kubeconfig`] to `path`.
    pub fn write_kubeconfig(&self, path: &Path) {
        std::fs::write(path, self.kubeconfig()).unwrap();
    }

    /// A client of this server through a kubeconfig file in `dir`.
    pub async fn api(&self, dir: &Path) -> ClusterApi {
        let path = dir.join("admin.conf");
        self.write_kubeconfig(&path);
        ClusterApi::from_kubeconfig(&path, ApiOptions::default())
            .await
            .unwrap()
    }
}

async fn answer(
    state: &Mutex<State>,
    req: hyper::Request<hyper::body::Incoming>,
) -> hyper::Response<Full<Bytes>> {
    let method = req.method().to_string();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or_default().to_owned();
    let content_type = req
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let raw = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let body = if raw.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::from_slice(&raw)
            .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&raw).into()))
    };
    let reply = {
        let mut state = state.lock().unwrap();
        state.requests.push(Request {
            method: method.clone(),
            path: path.clone(),
            query,
            content_type,
            body,
        });
        match state
            .routes
            .iter_mut()
            .find(|r| r.method == method && r.path == path)
        {
            Some(route) if route.echo => {
                Reply::json(200, String::from_utf8_lossy(&raw).into_owned())
            }
            Some(route) => route
                .replies
                .pop_front()
                .unwrap_or_else(|| route.last.clone()),
            None => Reply::json(404, NOT_FOUND),
        }
    };
    hyper::Response::builder()
        .status(reply.status)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(reply.body)))
        .unwrap()
}

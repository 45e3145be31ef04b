//! Putting the service on sockets: `join.API` over attested TLS, the plain HTTP listener
//! for metrics, health and the member list (loopback, or behind a bearer token), and the
//! operator's admin socket (a Unix socket, mode 0600).

use crate::keys::KeySource;
use crate::service::JoinService;
use crate::state::{ClusterState, StateError};
use asterism_atls::AtlsServer;
use asterism_basics::shares::{Share, Shares};
use asterism_binkit::grpc;
pub use asterism_binkit::grpc::Limits;
use asterism_binkit::socket::{PrivateSocket, SocketError};
use asterism_metadata::Metadata;
use asterism_proto::join::api_server::ApiServer;
use bytes::Bytes;
use futures::{Stream, StreamExt as _};
use http::{Method, Response, StatusCode, header};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use tokio::net::{TcpListener, TcpSocket};
use tonic::service::Routes;

/// Listen backlog of [`bind_listener`]. A burst of nodes connecting at once waits in it;
/// with tokio's default of 128, the 129th simultaneous SYN is dropped and retransmitted a
/// second later. The kernel caps it at `net.core.somaxconn`.
pub const LISTEN_BACKLOG: u32 = 1024;

/// A TCP listener on `addr` with a backlog of [`LISTEN_BACKLOG`].
pub fn bind_listener(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// The join service's caps: [`Limits::SERVICE`] with requests of at most 64 KiB (a CSR,
/// a host key and principals fit easily) and 30 s to answer one, as a join may wait on
/// the Kubernetes API. Its connections are not counted here: aTLS caps the handshakes in
/// flight, each attestation key holds at most [`MAX_CONNECTIONS_PER_KEY`] verified
/// connections, and each ends with its lifetime.
pub const LIMITS: Limits = Limits {
    max_request_size: 64 * 1024,
    request_timeout: Some(Duration::from_secs(30)),
    ..Limits::SERVICE
};

/// Serves `join.API` on `listener` over aTLS until `shutdown` completes. Connections whose
/// evidence does not verify are closed before HTTP/2 starts, so no handler runs for them.
pub async fn serve<M, K, S>(
    listener: TcpListener,
    atls: AtlsServer,
    service: JoinService<M, K, S>,
    limits: &Limits,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error>
where
    M: Metadata + 'static,
    K: KeySource,
    S: ClusterState,
{
    let api = ApiServer::new(service)
        .max_decoding_message_size(limits.max_request_size)
        .max_encoding_message_size(4 * 1024 * 1024);
    let limits = Limits {
        // GOAWAY a little before aTLS cuts the verified connection at its lifetime, so
        // requests in flight can finish; the node reconnects and attests again, which is
        // how a revoked measurement reaches it.
        max_connection_age: Some(graceful_age(atls.max_connection_lifetime())),
        ..limits.clone()
    };
    let incoming = per_key_limit(atls.incoming(listener), MAX_CONNECTIONS_PER_KEY);
    grpc::serve(incoming, Routes::new(api), &limits, shutdown).await
}

/// Verified connections one attestation key may hold at once. A node needs one; a joined
/// worker (the insider: genuine TPM, measurements and marker) attests as often as it likes,
/// and every verified connection holds memory and a file descriptor until its lifetime
/// ends, so without this one key could hold thousands. A connection beyond it is closed
/// right after its handshake.
pub const MAX_CONNECTIONS_PER_KEY: usize = 8;

/// Passes each verified connection on holding one of `max` shares of its peer's key (its
/// evidence's identity), and closes one whose key holds them all.
fn per_key_limit<S, IO>(
    incoming: S,
    max: usize,
) -> impl futures::Stream<Item = Result<grpc::Limited<IO, Share<String>>, std::io::Error>>
where
    S: futures::Stream<Item = Result<IO, std::io::Error>>,
    IO: tonic::transport::server::Connected<ConnectInfo = asterism_atls::AtlsConnectInfo>,
{
    use futures::StreamExt as _;
    let keys = std::sync::Arc::new(Shares::new(max));
    incoming.filter_map(move |accepted| {
        let keys = keys.clone();
        async move {
            let io = match accepted {
                Ok(io) => io,
                Err(e) => return Some(Err(e)),
            };
            let info = io.connect_info();
            // Only verified connections come from aTLS; one without a peer would be
            // refused by the handlers, and holds no key's share.
            let Some(peer) = info.peer else {
                return Some(Ok(grpc::Limited::holding(io, None)));
            };
            let key = peer.evidence().identity();
            match keys.take(key.to_owned()) {
                Some(share) => Some(Ok(grpc::Limited::holding(io, Some(share)))),
                None => {
                    tracing::debug!(ak = %key, max, peer = ?info.remote_addr, "closing a verified connection: its attestation key holds the most it may");
                    None
                }
            }
        }
    })
}

/// When HTTP/2 should start closing a connection that aTLS cuts at `lifetime`: 10 s
/// before it, or at half of it for short lifetimes.
fn graceful_age(lifetime: Duration) -> Duration {
    lifetime.saturating_sub((lifetime / 2).min(Duration::from_secs(10)))
}

/// Who may read `/metrics` on the HTTP listener, and whether it serves `/v1/members` and
/// `/v1/control-plane` at all (only with a token; the admin socket always does).
#[derive(Clone, Default)]
pub struct HttpAccess {
    /// SHA-256 of the bearer token they require, if any; `/healthz` never does.
    token_digest: Option<[u8; 32]>,
}

impl std::fmt::Debug for HttpAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpAccess")
            .field("token", &self.token_digest.map(|_| "<redacted>"))
            .finish()
    }
}

impl HttpAccess {
    /// No token: for a listener on a loopback address, which only this machine reaches.
    /// It serves `/metrics` and `/healthz`, not the member lists.
    pub fn open() -> Self {
        Self::default()
    }

    /// `/metrics` and `/v1/members` need `Authorization: Bearer <token>`.
    pub fn bearer(token: &str) -> Self {
        Self {
            token_digest: Some(sha256(token.as_bytes())),
        }
    }

    /// Whether a bearer token guards this listener.
    fn requires_token(&self) -> bool {
        self.token_digest.is_some()
    }

    fn allows(&self, authorization: Option<&header::HeaderValue>) -> bool {
        let Some(want) = &self.token_digest else {
            return true;
        };
        let Some(got) = authorization
            .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
            .map(sha256)
        else {
            return false;
        };
        // Digests of equal length: comparing them tells a timing observer nothing useful
        // about the token.
        got == *want
    }
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref());
    out
}

/// Whether `addr` can be reached from this machine only.
pub fn is_loopback(addr: SocketAddr) -> bool {
    addr.ip().to_canonical().is_loopback()
}

/// A listener the HTTP servers accept connections from.
trait Accept: Send + 'static {
    type Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static;
    /// The next connection to serve, or `None` for one refused here.
    fn accept_io(&self) -> impl Future<Output = std::io::Result<Option<Self::Io>>> + Send;
    /// The address a connection counts against (see [`HTTP_CONNECTIONS`]); `None` counts
    /// as one address for all.
    fn source(io: &Self::Io) -> Option<IpAddr>;
}

impl Accept for TcpListener {
    type Io = tokio::net::TcpStream;
    async fn accept_io(&self) -> std::io::Result<Option<Self::Io>> {
        Ok(Some(self.accept().await?.0))
    }
    fn source(io: &Self::Io) -> Option<IpAddr> {
        io.peer_addr().ok().map(|peer| peer.ip())
    }
}

/// The admin socket: only connections of this process's user (or root) are served; the
/// socket's mode already keeps others out, and the peer's credentials are checked too.
/// One user's connections count against one address.
impl Accept for PrivateSocket {
    type Io = tokio::net::UnixStream;
    async fn accept_io(&self) -> std::io::Result<Option<Self::Io>> {
        let (stream, _) = self.listener.accept().await?;
        let uid = stream.peer_cred()?.uid();
        // std does not expose geteuid; the socket file is ours, so its owner is our
        // effective user. Nobody's but root's when another file stands at the path.
        let own = self.file.owner();
        if uid == 0 || Some(uid) == own {
            Ok(Some(stream))
        } else {
            tracing::warn!(uid, "admin socket: refused a connection of another user");
            Ok(None)
        }
    }
    fn source(_: &Self::Io) -> Option<IpAddr> {
        None
    }
}

/// The connections `listener` accepts, those refused by its own check left out.
fn accepted<L: Accept>(listener: L) -> impl Stream<Item = std::io::Result<L::Io>> {
    futures::stream::unfold(listener, |listener| async move {
        loop {
            match listener.accept_io().await {
                Ok(None) => {}
                Ok(Some(io)) => return Some((Ok(io), listener)),
                Err(e) => return Some((Err(e), listener)),
            }
        }
    })
}

/// Which endpoints a listener serves.
#[derive(Clone, Debug)]
enum Endpoints {
    /// `/metrics`, `/healthz`; `/v1/members` and `/v1/control-plane` with a token (GET).
    Public(HttpAccess),
    /// The operator's: `GET /v1/members`, `POST /v1/members/<name>/readmit`.
    Admin,
}

/// Serves `GET /metrics` (Prometheus text) and `/healthz` over plain HTTP until `shutdown`
/// completes, without a token: for a loopback listener. The member lists are left to the
/// admin socket. Nothing here is secret: token values never appear.
pub async fn serve_http<M, K, S>(
    listener: TcpListener,
    service: JoinService<M, K, S>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()>
where
    M: Metadata + 'static,
    K: KeySource,
    S: ClusterState,
{
    serve_http_with(listener, service, HttpAccess::open(), shutdown).await
}

/// [`serve_http`] with `access` deciding who may read `/metrics`, and with a token also
/// `/v1/members` and `/v1/control-plane`.
pub async fn serve_http_with<M, K, S>(
    listener: TcpListener,
    service: JoinService<M, K, S>,
    access: HttpAccess,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()>
where
    M: Metadata + 'static,
    K: KeySource,
    S: ClusterState,
{
    http_loop(listener, service, Endpoints::Public(access), shutdown).await
}

/// Binds the admin socket at `path` with mode 0600 from its first moment
/// ([`asterism_binkit::socket`]): a stale socket there is replaced, a socket another join
/// service still answers on, or any other file, is refused.
pub fn bind_admin_socket(path: &std::path::Path) -> Result<PrivateSocket, SocketError> {
    asterism_binkit::socket::bind_private(path)
}

/// Serves the operator's endpoints on the admin socket until `shutdown` completes:
/// `GET /v1/members`, and `POST /v1/members/<name>/readmit` (`asterism readmit`), which
/// lets a member that comes back with another attestation key receive a ticket once. The
/// socket file is removed afterwards.
pub async fn serve_admin<M, K, S>(
    socket: PrivateSocket,
    service: JoinService<M, K, S>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()>
where
    M: Metadata + 'static,
    K: KeySource,
    S: ClusterState,
{
    http_loop(socket, service, Endpoints::Admin, shutdown).await
}

/// Connections an HTTP listener (metrics and health, or the admin socket) serves at once.
/// When all are taken, a new connection takes the slot of the oldest connection of the
/// busiest address, which is closed (`asterism_binkit::grpc::fair_share`): connections
/// held open by one local process cannot keep a health probe, a metrics scrape or the
/// operator out.
const HTTP_CONNECTIONS: usize = 64;

async fn http_loop<L, M, K, S>(
    listener: L,
    service: JoinService<M, K, S>,
    endpoints: Endpoints,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()>
where
    L: Accept,
    M: Metadata + 'static,
    K: KeySource,
    S: ClusterState,
{
    // One more per source than in all: a source holding every slot gives up its own
    // oldest to its next connection instead of being refused.
    let share = grpc::FairShare {
        max: HTTP_CONNECTIONS,
        per_source: HTTP_CONNECTIONS + 1,
    };
    let incoming = grpc::fair_share(accepted(listener), share, L::source);
    let mut incoming = std::pin::pin!(incoming);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => return Ok(()),
            next = incoming.next() => match next {
                None => return Ok(()),
                Some(Ok(stream)) => stream,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "HTTP listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let service = service.clone();
        let endpoints = endpoints.clone();
        tokio::spawn(async move {
            let handler = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                let service = service.clone();
                let endpoints = endpoints.clone();
                async move {
                    let response = match &endpoints {
                        Endpoints::Public(access) => respond(&service, access, &req).await,
                        Endpoints::Admin => respond_admin(&service, &req).await,
                    };
                    Ok::<_, Infallible>(response)
                }
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .keep_alive(false);
            // A connection whose slot is taken fails its reads and writes, which ends it.
            let conn = builder.serve_connection(TokioIo::new(stream), handler);
            let _ = tokio::time::timeout(Duration::from_secs(30), conn).await;
        });
    }
}

async fn members_json<M, K, S>(service: &JoinService<M, K, S>) -> Response<Full<Bytes>>
where
    M: Metadata + 'static,
    K: KeySource,
    S: ClusterState,
{
    match service.state().members().await {
        Ok(members) => match serde_json::to_string(&members) {
            Ok(json) => reply(StatusCode::OK, "application/json", json),
            Err(_) => reply(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain",
                "error\n".into(),
            ),
        },
        Err(e) => {
            tracing::error!(error = %e, "listing members failed");
            reply(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                "state unavailable\n".into(),
            )
        }
    }
}

async fn control_plane_json<M, K, S>(service: &JoinService<M, K, S>) -> Response<Full<Bytes>>
where
    M: Metadata + 'static,
    K: KeySource,
    S: ClusterState,
{
    match service.signed_control_plane().await {
        Ok(json) => reply(StatusCode::OK, "application/json", json),
        Err(e) => {
            tracing::error!(error = %crate::error::chain(&e), "signing the control-plane list failed");
            reply(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                "unavailable\n".into(),
            )
        }
    }
}

async fn respond<M, K, S, B>(
    service: &JoinService<M, K, S>,
    access: &HttpAccess,
    req: &http::Request<B>,
) -> Response<Full<Bytes>>
where
    M: Metadata + 'static,
    K: KeySource,
    S: ClusterState,
{
    if req.method() != Method::GET {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "only GET\n".into(),
        );
    }
    let path = req.uri().path();
    if path != "/healthz" && !access.allows(req.headers().get(header::AUTHORIZATION)) {
        return reply(
            StatusCode::UNAUTHORIZED,
            "text/plain",
            "a bearer token is required\n".into(),
        );
    }
    match path {
        "/metrics" => reply(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            service.metrics().encode(),
        ),
        "/healthz" => reply(StatusCode::OK, "text/plain", "ok\n".into()),
        // The inventories (every member's AK, the control plane's disks) are not for
        // anyone who reaches a loopback: on a shared machine, or where nodes share one
        // loopback (mini), that is every local user and every node. Without a token they
        // are served on the admin socket only.
        "/v1/members" | "/v1/control-plane" if !access.requires_token() => reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            "the member lists are served on the admin socket (--admin-socket), or here with \
             --metrics-token-file\n"
                .into(),
        ),
        "/v1/members" => members_json(service).await,
        "/v1/control-plane" => control_plane_json(service).await,
        _ => reply(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}

async fn respond_admin<M, K, S, B>(
    service: &JoinService<M, K, S>,
    req: &http::Request<B>,
) -> Response<Full<Bytes>>
where
    M: Metadata + 'static,
    K: KeySource,
    S: ClusterState,
{
    let path = req.uri().path();
    if req.method() == Method::GET && path == "/v1/members" {
        return members_json(service).await;
    }
    if req.method() == Method::GET && path == "/v1/control-plane" {
        return control_plane_json(service).await;
    }
    let name = path
        .strip_prefix("/v1/members/")
        .and_then(|p| p.strip_suffix("/readmit"));
    let Some(name) = name else {
        return reply(StatusCode::NOT_FOUND, "text/plain", "not found\n".into());
    };
    if req.method() != Method::POST {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "only POST\n".into(),
        );
    }
    if name.is_empty()
        || name.len() > 253
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    {
        return reply(
            StatusCode::BAD_REQUEST,
            "text/plain",
            "the node name is no DNS-1123 subdomain\n".into(),
        );
    }
    match service.readmit(name).await {
        Ok(member) => match serde_json::to_string(&member) {
            Ok(json) => reply(StatusCode::OK, "application/json", json),
            Err(_) => reply(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain",
                "error\n".into(),
            ),
        },
        Err(StateError::NoSuchMember { name }) => reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            format!("node {name} is no member\n"),
        ),
        Err(e) => {
            tracing::error!(node = name, error = %e, "re-admitting a member failed");
            reply(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                "state unavailable\n".into(),
            )
        }
    }
}

fn reply(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    r
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_burst_of_connections_waits_in_the_backlog_instead_of_being_dropped() {
        // Nothing accepts: with tokio's default backlog of 128 the later SYNs are dropped
        // and these connects would take a second (the SYN retransmission) or more.
        let listener = bind_listener("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let connects: Vec<_> = (0..300)
            .map(|_| {
                tokio::spawn(tokio::time::timeout(
                    Duration::from_millis(800),
                    tokio::net::TcpStream::connect(addr),
                ))
            })
            .collect();
        let mut streams = Vec::new();
        for c in connects {
            streams.push(c.await.unwrap().expect("connect timed out").unwrap());
        }
        assert_eq!(streams.len(), 300);
    }
}

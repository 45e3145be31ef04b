//! Putting the service on sockets: `join.API` over attested TLS, and the plain HTTP
//! listener for metrics, health and the member list.

use crate::keys::KeySource;
use crate::service::JoinService;
use crate::state::ClusterState;
use asterism_atls::AtlsServer;
use asterism_metadata::Metadata;
use asterism_proto::join::api_server::ApiServer;
use bytes::Bytes;
use http::{Method, Response, StatusCode, header};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::{TcpListener, TcpSocket};

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

/// Limits of the gRPC server.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest request message (a CSR, a host key and principals fit easily).
    pub max_request_size: usize,
    /// Deadline of one request.
    pub request_timeout: Duration,
    /// Concurrent requests per connection.
    pub max_streams_per_connection: u32,
    /// How long open connections may finish after shutdown began.
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_request_size: 64 * 1024,
            request_timeout: Duration::from_secs(30),
            max_streams_per_connection: 16,
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

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
    let streams = usize::try_from(limits.max_streams_per_connection).unwrap_or(16);
    let (drain_tx, drain_rx) = tokio::sync::oneshot::channel::<()>();
    let signal = async move {
        shutdown.await;
        tracing::info!("shutting down: accepting no new connections, draining open ones");
        let _ = drain_tx.send(());
    };
    let server = tonic::transport::Server::builder()
        .timeout(limits.request_timeout)
        .concurrency_limit_per_connection(streams)
        .max_concurrent_streams(limits.max_streams_per_connection)
        .http2_max_header_list_size(16 * 1024)
        .http2_max_pending_accept_reset_streams(Some(streams))
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        // GOAWAY a little before aTLS cuts the verified connection at its lifetime, so
        // requests in flight can finish; the node reconnects and attests again, which is
        // how a revoked measurement reaches it.
        .max_connection_age(graceful_age(atls.max_connection_lifetime()))
        .add_service(api)
        .serve_with_incoming_shutdown(atls.incoming(listener), signal);
    tokio::pin!(server);
    let grace = limits.shutdown_grace;
    let grace_expired = async move {
        match drain_rx.await {
            Ok(()) => tokio::time::sleep(grace).await,
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        r = &mut server => r,
        () = grace_expired => {
            tracing::warn!("connections still open after the shutdown grace period; dropping them");
            Ok(())
        }
    }
}

/// When HTTP/2 should start closing a connection that aTLS cuts at `lifetime`: 10 s
/// before it, or at half of it for short lifetimes.
fn graceful_age(lifetime: Duration) -> Duration {
    lifetime.saturating_sub((lifetime / 2).min(Duration::from_secs(10)))
}

/// Serves `GET /metrics` (Prometheus text), `/healthz` and `/v1/members` (JSON) over plain
/// HTTP until `shutdown` completes. Nothing here is secret: token values never appear.
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
    let permits = std::sync::Arc::new(tokio::sync::Semaphore::new(64));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            () = &mut shutdown => return Ok(()),
            p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return Ok(()) },
        };
        let (stream, _) = tokio::select! {
            () = &mut shutdown => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let service = service.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let handler = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                let service = service.clone();
                async move {
                    Ok::<_, Infallible>(respond(&service, req.method(), req.uri().path()).await)
                }
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .keep_alive(false);
            let conn = builder.serve_connection(TokioIo::new(stream), handler);
            let _ = tokio::time::timeout(Duration::from_secs(30), conn).await;
        });
    }
}

async fn respond<M, K, S>(
    service: &JoinService<M, K, S>,
    method: &Method,
    path: &str,
) -> Response<Full<Bytes>>
where
    M: Metadata + 'static,
    K: KeySource,
    S: ClusterState,
{
    if method != Method::GET {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "only GET\n".into(),
        );
    }
    match path {
        "/metrics" => reply(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            service.metrics().encode(),
        ),
        "/healthz" => reply(StatusCode::OK, "text/plain", "ok\n".into()),
        "/v1/members" => match service.state().members().await {
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
        },
        _ => reply(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
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

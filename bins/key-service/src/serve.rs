//! Serving `kms.API` and the gRPC health service on any stream of connections, with a cap
//! and a deadline on everything a peer can send.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use asterism_proto::kms::api_server::ApiServer;
use futures::{Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tonic::transport::Server;
use tonic::transport::server::Connected;

use crate::service::{KeyService, MAX_KEY_LEN};
use asterism_binkit::error_chain;

/// The error type a connection stream may yield.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long to pause after a failed `accept` (for instance when out of file descriptors),
/// so that a persistent failure does not become a busy loop.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// Caps and deadlines for everything a peer can send or hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest decoded request message, in bytes. A `GetDataKeyRequest` with a
    /// maximal key ID is a few hundred bytes.
    pub max_request_size: usize,
    /// Deadline for handling one request.
    pub request_timeout: Duration,
    /// Connections served at once; further ones wait in the listen backlog.
    pub max_connections: usize,
    /// Concurrent requests (HTTP/2 streams) per connection.
    pub max_streams_per_connection: u32,
    /// Largest HTTP/2 header list, in bytes.
    pub max_header_list_size: u32,
    /// Interval of HTTP/2 keepalive pings to the peer.
    pub keepalive_interval: Duration,
    /// How long a keepalive ping may go unanswered before the connection is closed.
    pub keepalive_timeout: Duration,
    /// Connections are closed (gracefully) after this long, so none is held forever.
    /// Plus the request timeout as grace, it stays within aTLS's verified-connection
    /// lifetime (60 s), after which a verified connection is cut anyway.
    pub max_connection_age: Duration,
    /// On shutdown, how long open connections get to finish before they are dropped.
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_request_size: 4 * 1024,
            request_timeout: Duration::from_secs(10),
            max_connections: 256,
            max_streams_per_connection: 16,
            max_header_list_size: 16 * 1024,
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            max_connection_age: Duration::from_secs(50),
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// The largest response: a maximal key plus protobuf framing.
const MAX_RESPONSE_SIZE: usize = MAX_KEY_LEN + 64;

/// Why serving stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The gRPC server failed.
    #[error("the gRPC server failed")]
    Transport(#[source] tonic::transport::Error),
}

/// Serves `kms.API` and `grpc.health.v1.Health` on every connection `incoming` yields,
/// with [`Limits::default`], until `shutdown` completes; then drains open connections
/// for at most the grace period.
///
/// `incoming` may be any stream of connections: a TCP or Unix listener stream, or one
/// that wraps each accepted connection in (attested) TLS first. Its connection info is
/// handed to the handlers as a request extension.
pub async fn serve<I, IO, E>(
    incoming: I,
    service: KeyService,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError>
where
    I: Stream<Item = Result<IO, E>>,
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    E: Into<BoxError>,
{
    serve_with_limits(incoming, service, &Limits::default(), shutdown).await
}

/// [`serve`] with explicit limits.
pub async fn serve_with_limits<I, IO, E>(
    incoming: I,
    service: KeyService,
    limits: &Limits,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError>
where
    I: Stream<Item = Result<IO, E>>,
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    E: Into<BoxError>,
{
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_serving::<ApiServer<KeyService>>().await;
    let health = health.max_decoding_message_size(limits.max_request_size);
    let api = ApiServer::new(service)
        .max_decoding_message_size(limits.max_request_size)
        .max_encoding_message_size(MAX_RESPONSE_SIZE);

    let (draining, drain_started) = oneshot::channel::<()>();
    let signal = async move {
        shutdown.await;
        tracing::info!("shutting down: accepting no new connections, draining open ones");
        reporter.set_not_serving::<ApiServer<KeyService>>().await;
        let _ = draining.send(());
    };

    let streams = usize::try_from(limits.max_streams_per_connection).unwrap_or(usize::MAX);
    let server = Server::builder()
        .timeout(limits.request_timeout)
        .concurrency_limit_per_connection(streams)
        .max_concurrent_streams(limits.max_streams_per_connection)
        .http2_max_header_list_size(limits.max_header_list_size)
        .http2_max_pending_accept_reset_streams(Some(streams))
        .http2_keepalive_interval(Some(limits.keepalive_interval))
        .http2_keepalive_timeout(Some(limits.keepalive_timeout))
        .max_connection_age(limits.max_connection_age)
        .max_connection_age_grace(limits.request_timeout)
        .add_service(health)
        .add_service(api)
        .serve_with_incoming_shutdown(limit_connections(incoming, limits.max_connections), signal);
    tokio::pin!(server);

    let grace = limits.shutdown_grace;
    let grace_expired = async move {
        match drain_started.await {
            Ok(()) => tokio::time::sleep(grace).await,
            // The server ended before any shutdown; its result decides.
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        result = &mut server => result.map_err(|err| {
            tracing::error!(error = %error_chain(&err), "gRPC server failed");
            ServeError::Transport(err)
        }),
        () = grace_expired => {
            tracing::warn!(
                grace_secs = grace.as_secs(),
                "connections still open after the shutdown grace period; dropping them"
            );
            Ok(())
        }
    }
}

/// Holds one of `max` connection slots until the connection is dropped. While all slots
/// are taken, no further connection is accepted.
fn limit_connections<I, IO, E>(
    incoming: I,
    max: usize,
) -> impl Stream<Item = Result<Limited<IO>, BoxError>>
where
    I: Stream<Item = Result<IO, E>>,
    E: Into<BoxError>,
{
    let slots = Arc::new(Semaphore::new(max));
    incoming.then(move |accepted| {
        let slots = Arc::clone(&slots);
        async move {
            match accepted {
                Ok(io) => {
                    if slots.available_permits() == 0 {
                        tracing::warn!(max, "connection limit reached; waiting for a free slot");
                    }
                    let permit = slots.acquire_owned().await.map_err(BoxError::from)?;
                    Ok(Limited {
                        io,
                        _permit: permit,
                    })
                }
                Err(err) => {
                    let err: BoxError = err.into();
                    tracing::warn!(error = %err, "accepting a connection failed");
                    tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                    Err(err)
                }
            }
        }
    })
}

/// A connection that holds a slot of the connection limit.
struct Limited<IO> {
    io: IO,
    _permit: OwnedSemaphorePermit,
}

impl<IO: Connected> Connected for Limited<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Limited<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Limited<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

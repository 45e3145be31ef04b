//! Serving `kms.API` and the gRPC health service on any stream of connections, with a cap
//! and a deadline on everything a peer can send.

use std::future::Future;
use std::time::Duration;

use asterism_binkit::grpc;
pub use asterism_binkit::grpc::{BoxError, Limits};
use asterism_proto::kms::api_server::ApiServer;
use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite};
use tonic::service::Routes;
use tonic::transport::server::Connected;

use crate::service::{KeyService, MAX_KEY_LEN};
use asterism_binkit::error_chain;

/// The key service's caps: [`Limits::SERVICE`] with a request of at most 4 KiB (a
/// `GetDataKeyRequest` with a maximal key ID is a few hundred bytes), answered within 10 s;
/// at most 256 connections; each closed after 50 s, which with the request timeout as
/// grace stays within aTLS's verified-connection lifetime (60 s), after which a verified
/// connection is cut anyway.
pub const LIMITS: Limits = Limits {
    max_request_size: 4 * 1024,
    request_timeout: Some(Duration::from_secs(10)),
    max_connections: Some(256),
    max_connection_age: Some(Duration::from_secs(50)),
    max_connection_age_grace: Some(Duration::from_secs(10)),
    ..Limits::SERVICE
};

/// The key service's caps on attested TLS (`--atls-listen`), which any machine can reach:
/// [`LIMITS`], with its connections shared fairly between sources instead of a plain cap
/// ([`ATLS_CONNECTIONS`]).
pub const ATLS_LIMITS: Limits = Limits {
    max_connections: None,
    ..LIMITS
};

/// Verified connections open at once on attested TLS: 256 in all, as on the Unix socket,
/// and 8 from one source (an IPv4 address, or an IPv6 /64; a node's bootstrapper holds
/// one). Every joined node attests as well as any other, so a plain cap would let one
/// joined node hold every connection and keep the others out; shared fairly, a node from
/// a source holding fewer takes the busiest source's oldest.
pub const ATLS_CONNECTIONS: grpc::FairShare = grpc::FairShare {
    max: 256,
    per_source: 8,
};

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
/// with [`LIMITS`], until `shutdown` completes; then drains open connections for at most
/// the grace period.
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
    serve_with_limits(incoming, service, &LIMITS, shutdown).await
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
    let shutdown = async move {
        shutdown.await;
        reporter.set_not_serving::<ApiServer<KeyService>>().await;
    };
    grpc::serve(
        incoming,
        Routes::new(health).add_service(api),
        limits,
        shutdown,
    )
    .await
    .map_err(|err| {
        tracing::error!(error = %error_chain(&err), "gRPC server failed");
        ServeError::Transport(err)
    })
}

//! The one way the services serve gRPC: [`serve`] puts a set of routes on a stream of
//! connections with the caps of a [`Limits`], and drains open connections on shutdown for
//! at most a grace period.
//!
//! Every field is a cap a peer could otherwise push against (requests in flight, header
//! sizes, idle or everlasting connections). A site leaves a field at `None` only where
//! its protocol needs tonic's default (say so at the site).
//!
//! Where anyone on the network can connect, a plain cap on open connections lets a set
//! of sources hold them all; such a site wraps its connections in [`fair_share`] first:
//! at most so many in all and per source, and when all are taken, a connection from a
//! source holding fewer than the busiest takes the busiest's oldest, which is closed
//! (`asterism_basics::slots`).

use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use asterism_basics::shares::Share;
use asterism_basics::slots::{PendingSlot, PendingSlots};
use futures::{Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tonic::service::Routes;
use tonic::transport::Server;
use tonic::transport::server::Connected;

/// The error type a connection stream may yield.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long to pause after a failed `accept` when connections are counted (for instance
/// when out of file descriptors), so that a persistent failure does not become a busy loop.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// Caps and deadlines for everything a peer can send or hold. `None` leaves tonic's
/// default (no cap, or hyper's own).
///
/// The services differ where their protocols do: the join service's requests carry a CSR
/// and host keys (64 KiB) and may wait on the Kubernetes API (30 s); the key service's are
/// a key ID (4 KiB) answered from memory (10 s), and it alone counts connections, since
/// it is reached by every node's bootstrapper and nothing in front of it caps them; the
/// verify service answers one quote at a time per caller (4 streams); the bootstrapper's
/// InitServer holds one `Init` call open for as long as `kubeadm init` takes, so it has no
/// request deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest decoded request message, in bytes. Applied by the site to each generated
    /// service (`max_decoding_message_size`): [`serve`] cannot reach into them.
    pub max_request_size: usize,
    /// Deadline for handling one request.
    pub request_timeout: Option<Duration>,
    /// Connections served at once; further ones wait in the listen backlog.
    pub max_connections: Option<usize>,
    /// Concurrent requests (HTTP/2 streams) per connection; also the pending resets a peer
    /// may leave unanswered.
    pub max_streams_per_connection: Option<u32>,
    /// Largest HTTP/2 header list, in bytes.
    pub max_header_list_size: Option<u32>,
    /// Interval of HTTP/2 keepalive pings to the peer.
    pub keepalive_interval: Option<Duration>,
    /// How long a keepalive ping may go unanswered before the connection is closed.
    pub keepalive_timeout: Option<Duration>,
    /// Connections are closed (gracefully, with GOAWAY) after this long, so none is held
    /// forever.
    pub max_connection_age: Option<Duration>,
    /// How long requests in flight may finish after `max_connection_age`.
    pub max_connection_age_grace: Option<Duration>,
    /// On shutdown, how long open connections get to finish before they are dropped;
    /// `None` waits for them.
    pub shutdown_grace: Option<Duration>,
}

impl Limits {
    /// Nothing capped here: tonic's defaults (4 MiB requests). For a server whose caps
    /// sit elsewhere, in front of it.
    pub const TONIC_DEFAULTS: Self = Self {
        max_request_size: 4 * 1024 * 1024,
        request_timeout: None,
        max_connections: None,
        max_streams_per_connection: None,
        max_header_list_size: None,
        keepalive_interval: None,
        keepalive_timeout: None,
        max_connection_age: None,
        max_connection_age_grace: None,
        shutdown_grace: None,
    };

    /// What the services on the network share: 16 streams per connection, 16 KiB of
    /// headers, a ping every 30 s answered within 10 s, 10 s to drain on shutdown. A
    /// service sets its own request size and deadline on top.
    pub const SERVICE: Self = Self {
        max_request_size: 4 * 1024,
        request_timeout: Some(Duration::from_secs(10)),
        max_streams_per_connection: Some(16),
        max_header_list_size: Some(16 * 1024),
        keepalive_interval: Some(Duration::from_secs(30)),
        keepalive_timeout: Some(Duration::from_secs(10)),
        shutdown_grace: Some(Duration::from_secs(10)),
        ..Self::TONIC_DEFAULTS
    };
}

/// Serves `routes` on every connection `incoming` yields, with the caps of `limits`, until
/// `shutdown` completes; then accepts no new connection and drains open ones for at most
/// `limits.shutdown_grace`.
///
/// `incoming` may be any stream of connections: a TCP or Unix listener stream, or one
/// that wraps each accepted connection in (attested) TLS first. Its connection info is
/// handed to the handlers as a request extension.
pub async fn serve<I, IO, E>(
    incoming: I,
    routes: Routes,
    limits: &Limits,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error>
where
    I: Stream<Item = Result<IO, E>>,
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    E: Into<BoxError>,
{
    let (draining, drain_started) = oneshot::channel::<()>();
    let signal = async move {
        shutdown.await;
        tracing::info!("shutting down: accepting no new connections, draining open ones");
        let _ = draining.send(());
    };
    let server = builder(limits)
        .add_routes(routes)
        .serve_with_incoming_shutdown(limit_connections(incoming, limits.max_connections), signal);
    tokio::pin!(server);

    let Some(grace) = limits.shutdown_grace else {
        return server.await;
    };
    let grace_expired = async move {
        match drain_started.await {
            Ok(()) => tokio::time::sleep(grace).await,
            // The server ended before any shutdown; its result decides.
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        result = &mut server => result,
        () = grace_expired => {
            tracing::warn!(
                grace_secs = grace.as_secs(),
                "connections still open after the shutdown grace period; dropping them"
            );
            Ok(())
        }
    }
}

/// A server builder with the transport caps of `limits`.
fn builder(limits: &Limits) -> Server {
    let mut server = Server::builder();
    if let Some(timeout) = limits.request_timeout {
        server = server.timeout(timeout);
    }
    if let Some(streams) = limits.max_streams_per_connection {
        let n = usize::try_from(streams).unwrap_or(usize::MAX);
        server = server
            .concurrency_limit_per_connection(n)
            .max_concurrent_streams(streams)
            .http2_max_pending_accept_reset_streams(Some(n));
    }
    if let Some(size) = limits.max_header_list_size {
        server = server.http2_max_header_list_size(size);
    }
    if limits.keepalive_interval.is_some() {
        server = server.http2_keepalive_interval(limits.keepalive_interval);
    }
    if limits.keepalive_timeout.is_some() {
        server = server.http2_keepalive_timeout(limits.keepalive_timeout);
    }
    if let Some(age) = limits.max_connection_age {
        server = server.max_connection_age(age);
    }
    if let Some(grace) = limits.max_connection_age_grace {
        server = server.max_connection_age_grace(grace);
    }
    server
}

/// With a maximum, each connection holds one of `max` slots until it is dropped, and while
/// all slots are taken no further connection is accepted. Without, connections pass as
/// they come.
fn limit_connections<I, IO, E>(
    incoming: I,
    max: Option<usize>,
) -> impl Stream<Item = Result<Limited<IO>, BoxError>>
where
    I: Stream<Item = Result<IO, E>>,
    E: Into<BoxError>,
{
    let slots = max.map(|max| (max, Arc::new(Semaphore::new(max))));
    incoming.then(move |accepted| {
        let slots = slots.clone();
        async move {
            let Some((max, slots)) = slots else {
                return accepted
                    .map(|io| Limited { io, held: None })
                    .map_err(Into::into);
            };
            match accepted {
                Ok(io) => {
                    if slots.available_permits() == 0 {
                        tracing::warn!(max, "connection limit reached; waiting for a free slot");
                    }
                    let permit = slots.acquire_owned().await.map_err(BoxError::from)?;
                    Ok(Limited {
                        io,
                        held: Some(permit),
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

/// How many connections [`fair_share`] lets in: `max` in all, `per_source` from one
/// source (an IPv4 address or an IPv6 /64).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FairShare {
    /// Connections open at once, all sources together.
    pub max: usize,
    /// Connections open at once from one source.
    pub per_source: usize,
}

/// The connections of `incoming` that get a slot of `share`, each holding it until it is
/// dropped, and closed (reads fail, writes fail) when a connection of a less busy source
/// takes it; a connection over its source's share is closed at once. `source` tells a
/// connection's peer address; connections without one count as one source.
pub fn fair_share<I, IO, E>(
    incoming: I,
    share: FairShare,
    source: impl Fn(&IO) -> Option<IpAddr>,
) -> impl Stream<Item = Result<Limited<IO, PendingSlot>, BoxError>>
where
    I: Stream<Item = Result<IO, E>>,
    E: Into<BoxError>,
{
    let slots = PendingSlots::new(share.max, share.per_source);
    incoming.filter_map(move |accepted| {
        let admitted = match accepted {
            Ok(io) => {
                let peer = source(&io).unwrap_or(IpAddr::from([0, 0, 0, 0]));
                match slots.admit(peer) {
                    Ok(slot) => {
                        if let Some(from) = slot.took_from() {
                            // At debug: a flood must not flood the log too.
                            tracing::debug!(%peer, evicted = %from, "all connection slots in use; closed the busiest source's oldest");
                        }
                        Some(Ok(Limited::holding(io, Some(slot))))
                    }
                    Err(refused) => {
                        tracing::debug!(%peer, %refused, "closed a connection");
                        None
                    }
                }
            }
            Err(err) => Some(Err(err.into())),
        };
        std::future::ready(admitted)
    })
}

/// What a connection holds of a connection limit; given back when the connection is
/// dropped. A slot of a [`fair_share`] can also be taken away, and the connection is then
/// closed.
pub trait Slot: Unpin {
    /// Whether the slot was taken from this connection; registers `cx` to be woken when
    /// it is, otherwise. Never, by default.
    fn lost(&mut self, _cx: &mut Context<'_>) -> bool {
        false
    }
}

impl Slot for OwnedSemaphorePermit {}

impl<K: Eq + std::hash::Hash + Unpin> Slot for Share<K> {}

impl Slot for PendingSlot {
    fn lost(&mut self, cx: &mut Context<'_>) -> bool {
        self.poll_evicted(cx).is_ready()
    }
}

/// A connection, holding a slot of a connection limit if there is one (a semaphore's
/// permit, a share of one key's, a fairly shared slot); the slot is free again when the
/// connection is dropped, and the connection fails once its slot is taken.
pub struct Limited<IO, G = OwnedSemaphorePermit> {
    io: IO,
    held: Option<G>,
}

impl<IO, G: Slot> Limited<IO, G> {
    /// `io`, holding `slot` for as long as it lives, or no slot.
    pub fn holding(io: IO, slot: Option<G>) -> Self {
        Self { io, held: slot }
    }

    /// Whether the connection lost its slot (see [`Slot::lost`]).
    fn lost(&mut self, cx: &mut Context<'_>) -> bool {
        self.held.as_mut().is_some_and(|slot| slot.lost(cx))
    }
}

impl<IO: Connected, G> Connected for Limited<IO, G> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

impl<IO: AsyncRead + Unpin, G: Slot> AsyncRead for Limited<IO, G> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.lost(cx) {
            return Poll::Ready(Err(io::ErrorKind::ConnectionAborted.into()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin, G: Slot> AsyncWrite for Limited<IO, G> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.lost(cx) {
            return Poll::Ready(Err(io::ErrorKind::ConnectionAborted.into()));
        }
        Pin::new(&mut this.io).poll_write(cx, buf)
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
        let this = self.get_mut();
        if this.lost(cx) {
            return Poll::Ready(Err(io::ErrorKind::ConnectionAborted.into()));
        }
        Pin::new(&mut this.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, DuplexStream};

    fn ip(n: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, n])
    }

    /// Server ends of in-memory connections from `sources` (in order) after
    /// [`fair_share`] with `share`, and the client ends of all of them.
    async fn admitted(
        share: FairShare,
        sources: &[u8],
    ) -> (
        Vec<(u8, Limited<DuplexStream, PendingSlot>)>,
        Vec<DuplexStream>,
    ) {
        let mut clients = Vec::new();
        let mut servers = Vec::new();
        for &s in sources {
            let (client, server) = tokio::io::duplex(1024);
            clients.push(client);
            servers.push(Ok::<_, io::Error>((s, server)));
        }
        let tagged = futures::stream::iter(servers);
        let source = |conn: &(u8, DuplexStream)| Some(ip(conn.0));
        let admitted: Vec<_> = fair_share(tagged, share, source)
            .map(|c| {
                let Limited { io: (s, io), held } = c.unwrap();
                (s, Limited { io, held })
            })
            .collect()
            .await;
        (admitted, clients)
    }

    async fn echo_works<G: Slot>(
        server: &mut Limited<DuplexStream, G>,
        client: &mut DuplexStream,
    ) -> bool {
        if server.write_all(b"ping").await.is_err() {
            return false;
        }
        let mut got = [0u8; 4];
        if client.read_exact(&mut got).await.is_err() || &got != b"ping" {
            return false;
        }
        client.write_all(b"pong").await.unwrap();
        let mut back = [0u8; 4];
        server.read_exact(&mut back).await.is_ok() && &back == b"pong"
    }

    #[tokio::test]
    async fn a_source_over_its_share_is_closed_and_the_others_pass_through() {
        let share = FairShare {
            max: 8,
            per_source: 2,
        };
        let (mut admitted, mut clients) = admitted(share, &[1, 1, 1, 2]).await;
        let sources: Vec<u8> = admitted.iter().map(|(s, _)| *s).collect();
        assert_eq!(sources, vec![1, 1, 2], "the third from source 1 is closed");
        // The refused connection's server end is gone: its client reads end of stream.
        let mut buf = [0u8; 1];
        assert_eq!(clients[2].read(&mut buf).await.unwrap(), 0);
        let (_, server) = &mut admitted[2];
        assert!(echo_works(server, &mut clients[3]).await);
    }

    #[tokio::test]
    async fn a_connection_whose_slot_was_taken_fails_its_reads_and_writes() {
        let share = FairShare {
            max: 2,
            per_source: 2,
        };
        // Full with source 1's two; source 2 takes the oldest.
        let (mut admitted, mut clients) = admitted(share, &[1, 1, 2]).await;
        let (_, evicted) = &mut admitted[0];
        let mut buf = [0u8; 4];
        let read = tokio::time::timeout(Duration::from_secs(5), evicted.read(&mut buf)).await;
        assert_eq!(
            read.expect("the read fails at once").unwrap_err().kind(),
            io::ErrorKind::ConnectionAborted
        );
        assert_eq!(
            evicted.write(b"x").await.unwrap_err().kind(),
            io::ErrorKind::ConnectionAborted
        );
        let slices = [io::IoSlice::new(b"x")];
        assert_eq!(
            evicted.write_vectored(&slices).await.unwrap_err().kind(),
            io::ErrorKind::ConnectionAborted
        );
        let (_, kept) = &mut admitted[1];
        assert!(echo_works(kept, &mut clients[1]).await);
        let (_, newcomer) = &mut admitted[2];
        assert!(echo_works(newcomer, &mut clients[2]).await);
        let (_, newcomer) = &mut admitted[2];
        assert_eq!(newcomer.write_vectored(&slices).await.unwrap(), 1);
        let mut x = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), clients[2].read_exact(&mut x));
        read.await.expect("the byte arrives").unwrap();
        assert_eq!(&x, b"x");
    }

    #[tokio::test]
    async fn a_connection_holding_a_permit_passes_through() {
        let (mut client, server) = tokio::io::duplex(1024);
        let permit = Arc::new(Semaphore::new(1)).acquire_owned().await.unwrap();
        let mut limited = Limited::holding(server, Some(permit));
        assert!(echo_works(&mut limited, &mut client).await);
    }

    /// The connections a listener accepts, as the stream [`serve`] takes.
    fn accepted(
        listener: tokio::net::TcpListener,
    ) -> impl Stream<Item = io::Result<tokio::net::TcpStream>> {
        futures::stream::unfold(listener, |listener| async move {
            let accepted = listener.accept().await.map(|(tcp, _)| tcp);
            Some((accepted, listener))
        })
    }

    /// Whether the server closed `tcp` within `wait`, after an HTTP/2 client preface.
    async fn closed_after_preface(tcp: &mut tokio::net::TcpStream, wait: Duration) -> bool {
        tcp.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
            .await
            .unwrap();
        asterism_testkit::net::closed_within(tcp, wait).await
    }

    #[tokio::test]
    async fn a_connection_is_closed_at_its_maximum_age_and_not_before() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = Limits {
            max_connection_age: Some(Duration::from_secs(1)),
            max_connection_age_grace: Some(Duration::from_millis(500)),
            ..Limits::SERVICE
        };
        tokio::spawn(async move {
            serve(
                accepted(listener),
                Routes::default(),
                &limits,
                std::future::pending(),
            )
            .await
        });
        let mut young = tokio::net::TcpStream::connect(addr).await.unwrap();
        assert!(
            !closed_after_preface(&mut young, Duration::from_millis(500)).await,
            "open before its age"
        );
        let mut old = tokio::net::TcpStream::connect(addr).await.unwrap();
        assert!(
            closed_after_preface(&mut old, Duration::from_secs(10)).await,
            "closed once its age and grace are over"
        );
    }
}

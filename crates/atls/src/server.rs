//! The accepting side of aTLS and its tonic glue.

use crate::pending::PendingSlots;
use crate::stream::{AtlsConnectInfo, AtlsStream};
use crate::{AtlsConfig, AtlsError, exchange, tls};
use asterism_attestation::Role;
use futures::Stream;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;

/// Accepts aTLS connections.
#[derive(Clone)]
pub struct AtlsServer {
    tls: TlsAcceptor,
    cfg: Arc<AtlsConfig>,
}

impl std::fmt::Debug for AtlsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AtlsServer")
            .field("cfg", &self.cfg)
            .finish()
    }
}

impl AtlsServer {
    /// A server with a fresh ephemeral TLS identity.
    pub fn new(cfg: AtlsConfig) -> Result<Self, AtlsError> {
        cfg.check()?;
        Ok(Self {
            tls: TlsAcceptor::from(Arc::new(tls::server_config()?)),
            cfg: Arc::new(cfg),
        })
    }

    /// Tells the refusal observer, if any, that a connection was refused for `reason`.
    fn refused(&self, reason: &'static str) {
        if let Some(observe) = &self.cfg.on_refusal {
            observe(reason);
        }
    }

    /// How long a verified connection lives ([`AtlsConfig::with_max_connection_lifetime`]).
    /// A tonic server should set `max_connection_age` somewhat below it, so that HTTP/2
    /// closes connections gracefully (GOAWAY) before the hard cut.
    pub fn max_connection_lifetime(&self) -> Duration {
        self.cfg.max_connection_lifetime
    }

    /// Runs the TLS handshake and the evidence exchange on `io`, each under its deadline.
    pub async fn accept<IO>(
        &self,
        io: IO,
        remote_addr: Option<SocketAddr>,
    ) -> Result<AtlsStream<IO>, AtlsError>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        let handshake = self.tls.accept(io);
        let mut tls = within(self.cfg.handshake_timeout, "TLS handshake", handshake)
            .await?
            .map_err(tls_io_error)?;
        let (exporter, channel_binding) = bindings(tls.get_ref().1)?;
        let exchange = exchange::run(&mut tls, Role::Server, &exporter, &self.cfg, remote_addr);
        let (peer, last_frames) =
            within(self.cfg.exchange_timeout, "attestation exchange", exchange).await??;
        AtlsStream::new(
            tokio_rustls::TlsStream::Server(tls),
            AtlsConnectInfo {
                remote_addr,
                peer,
                channel_binding,
            },
            self.cfg.max_connection_lifetime,
            &last_frames,
        )
    }

    /// Accepts connections from `listener` and yields those whose exchange succeeded, for
    /// `tonic::transport::Server::serve_with_incoming*`. Failed connections are logged and
    /// closed; they never reach the server, so no handler runs for them.
    ///
    /// The accept loop stops when the returned stream is dropped.
    pub fn incoming(
        &self,
        listener: TcpListener,
    ) -> impl Stream<Item = Result<AtlsStream<TcpStream>, std::io::Error>> + use<> {
        self.incoming_admitting(listener, |_| Some(()))
    }

    /// [`AtlsServer::incoming`] with a check of the caller's before each handshake:
    /// `admit` sees the peer's address and returns a permit, held until the handshake
    /// ends, or `None` to close the connection at once (a rate limit, say). The check runs
    /// before the connection takes a handshake slot.
    pub fn incoming_admitting<F, P>(
        &self,
        listener: TcpListener,
        admit: F,
    ) -> impl Stream<Item = Result<AtlsStream<TcpStream>, std::io::Error>> + use<F, P>
    where
        F: Fn(SocketAddr) -> Option<P> + Send + 'static,
        P: Send + 'static,
    {
        let (tx, rx) = mpsc::channel(64);
        let server = self.clone();
        tokio::spawn(async move {
            // The global cap keeps a flood of slow peers from exhausting memory; the
            // per-source cap keeps one source from taking many of the global slots, the
            // fair sharing keeps any set of sources from taking all of them, and the idle
            // and HELLO deadlines free a slot held by a peer that never speaks.
            let slots = PendingSlots::new(
                server.cfg.max_pending_handshakes,
                server.cfg.max_pending_per_source,
            );
            loop {
                let accepted = tokio::select! {
                    () = tx.closed() => return,
                    accepted = listener.accept() => accepted,
                };
                let (tcp, addr) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of file descriptors and similar: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Some(permit) = admit(addr) else {
                    server.refused("admission");
                    continue;
                };
                let mut slot = match slots.admit(addr.ip()) {
                    Ok(slot) => {
                        if let Some(from) = slot.took_from() {
                            tracing::debug!(peer = %addr, evicted = %from, "all handshake slots in use; the busiest source lost its oldest");
                        }
                        slot
                    }
                    Err(refused) => {
                        tracing::debug!(peer = %addr, reason = %refused, "closing the connection before its handshake");
                        server.refused("source_limit");
                        continue;
                    }
                };
                let _ = tcp.set_nodelay(true);
                let server = server.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    let _permit = permit;
                    let handshake = async {
                        first_byte(&tcp, server.cfg.idle_timeout)
                            .await
                            .map_err(|e| match e {
                                AtlsError::Timeout { .. } => (e, "silent_peer"),
                                other => {
                                    let kind = other.kind();
                                    (other, kind)
                                }
                            })?;
                        server.accept(tcp, Some(addr)).await.map_err(|e| {
                            let kind = match &e {
                                AtlsError::Timeout { stage, .. }
                                    if *stage == crate::exchange::HELLO_STAGE =>
                                {
                                    "silent_peer"
                                }
                                other => other.kind(),
                            };
                            (e, kind)
                        })
                    };
                    let outcome = tokio::select! {
                        outcome = handshake => outcome,
                        () = slot.evicted() => {
                            tracing::debug!(peer = %addr, "aTLS handshake dropped: its slot went to a connection of a less busy source");
                            server.refused("evicted");
                            return;
                        }
                    };
                    drop(slot);
                    match outcome {
                        Ok(stream) => {
                            let _ = tx.send(Ok(stream)).await;
                        }
                        Err((e, "silent_peer")) => {
                            tracing::debug!(peer = %addr, error = %e, "aTLS connection dropped: the peer stayed silent");
                            server.refused("silent_peer");
                        }
                        Err((e, kind)) => {
                            tracing::warn!(peer = %addr, error = %e, "aTLS connection refused");
                            server.refused(kind);
                        }
                    }
                });
            }
        });
        ReceiverStream::new(rx)
    }
}

/// Waits until `tcp` has something to read (the ClientHello, or end of stream) for at most
/// `idle`.
async fn first_byte(tcp: &TcpStream, idle: Duration) -> Result<(), AtlsError> {
    let mut probe = [0u8; 1];
    match tokio::time::timeout(idle, tcp.peek(&mut probe)).await {
        Err(_) => Err(AtlsError::Timeout {
            stage: "first byte",
            after: idle,
        }),
        Ok(Ok(0)) => Err(AtlsError::Closed),
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(AtlsError::Io(e)),
    }
}

/// Refuses a connection that did not negotiate ALPN `h2`. rustls already refuses a
/// ClientHello whose ALPN list lacks `h2` (`no_application_protocol`); this also refuses
/// one that offered no ALPN at all, which rustls would accept.
/// `future`'s output, or [`AtlsError::Timeout`] naming `stage` once `after` has passed.
pub(crate) async fn within<T>(
    after: Duration,
    stage: &'static str,
    future: impl Future<Output = T>,
) -> Result<T, AtlsError> {
    tokio::time::timeout(after, future)
        .await
        .map_err(|_| AtlsError::Timeout { stage, after })
}

/// What both sides take from a finished TLS handshake before the exchange: it must have
/// negotiated h2; then the exporter value the evidence binds to, and the channel binding.
pub(crate) fn bindings<D>(
    conn: &rustls::ConnectionCommon<D>,
) -> Result<([u8; 32], [u8; 32]), AtlsError> {
    require_h2(conn)?;
    Ok((
        export(conn)?,
        export_with(conn, tls::CHANNEL_BINDING_LABEL)?,
    ))
}

fn require_h2<D>(conn: &rustls::ConnectionCommon<D>) -> Result<(), AtlsError> {
    if conn.alpn_protocol() == Some(tls::ALPN_H2) {
        Ok(())
    } else {
        Err(AtlsError::Protocol(
            "the TLS handshake did not negotiate ALPN h2".into(),
        ))
    }
}

/// The 32-byte exporter value of a finished TLS 1.3 connection.
pub(crate) fn export<D>(conn: &rustls::ConnectionCommon<D>) -> Result<[u8; 32], AtlsError> {
    export_with(conn, tls::EXPORTER_LABEL)
}

/// The 32-byte exporter value under `label` (empty context).
pub(crate) fn export_with<D>(
    conn: &rustls::ConnectionCommon<D>,
    label: &[u8],
) -> Result<[u8; 32], AtlsError> {
    let mut out = [0u8; 32];
    conn.export_keying_material(&mut out, label, Some(&[]))
        .map_err(AtlsError::Tls)?;
    Ok(out)
}

/// tokio-rustls reports TLS failures as `io::Error`s wrapping a `rustls::Error`.
pub(crate) fn tls_io_error(e: std::io::Error) -> AtlsError {
    if e.get_ref().is_some_and(|inner| inner.is::<rustls::Error>()) {
        match e
            .into_inner()
            .map(|inner| inner.downcast::<rustls::Error>())
        {
            Some(Ok(tls)) => AtlsError::Tls(*tls),
            Some(Err(other)) => AtlsError::Io(std::io::Error::other(other)),
            None => AtlsError::Closed,
        }
    } else {
        AtlsError::read(e)
    }
}

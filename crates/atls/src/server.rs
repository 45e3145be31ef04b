//! The accepting side of aTLS and its tonic glue.

use crate::stream::{AtlsConnectInfo, AtlsStream};
use crate::{AtlsConfig, AtlsError, exchange, tls};
use asterism_attestation::Role;
use futures::Stream;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
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
        let mut tls = tokio::time::timeout(self.cfg.handshake_timeout, self.tls.accept(io))
            .await
            .map_err(|_| AtlsError::Timeout {
                stage: "TLS handshake",
                after: self.cfg.handshake_timeout,
            })?
            .map_err(tls_io_error)?;
        require_h2(tls.get_ref().1)?;
        let exporter = export(tls.get_ref().1)?;
        let channel_binding = export_with(tls.get_ref().1, tls::CHANNEL_BINDING_LABEL)?;
        let peer = tokio::time::timeout(
            self.cfg.exchange_timeout,
            exchange::run(&mut tls, Role::Server, &exporter, &self.cfg, remote_addr),
        )
        .await
        .map_err(|_| AtlsError::Timeout {
            stage: "attestation exchange",
            after: self.cfg.exchange_timeout,
        })??;
        Ok(AtlsStream::new(
            tokio_rustls::TlsStream::Server(tls),
            AtlsConnectInfo {
                remote_addr,
                peer,
                channel_binding,
            },
            self.cfg.max_connection_lifetime,
        ))
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
        let (tx, rx) = mpsc::channel(64);
        let server = self.clone();
        tokio::spawn(async move {
            // The global cap keeps a flood of slow peers from exhausting memory; the
            // per-source cap keeps one source from taking all of the global slots, and the
            // idle deadline frees a slot held by a peer that never speaks.
            let pending = Arc::new(Semaphore::new(server.cfg.max_pending_handshakes));
            let per_source = Arc::new(PerSource::default());
            loop {
                let Ok(permit) = pending.clone().acquire_owned().await else {
                    return;
                };
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
                let Some(source_slot) =
                    per_source.try_take(addr.ip(), server.cfg.max_pending_per_source)
                else {
                    tracing::debug!(peer = %addr, "too many pending handshakes from this source; closing");
                    server.refused("source_limit");
                    continue;
                };
                let _ = tcp.set_nodelay(true);
                let server = server.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    let _permit = permit;
                    let _source_slot = source_slot;
                    if let Err(e) = first_byte(&tcp, server.cfg.idle_timeout).await {
                        tracing::debug!(peer = %addr, error = %e, "aTLS connection dropped before its first byte");
                        server.refused(match e {
                            AtlsError::Timeout { .. } => "silent_peer",
                            other => other.kind(),
                        });
                        return;
                    }
                    match server.accept(tcp, Some(addr)).await {
                        Ok(stream) => {
                            let _ = tx.send(Ok(stream)).await;
                        }
                        Err(e) => {
                            tracing::warn!(peer = %addr, error = %e, "aTLS connection refused");
                            server.refused(e.kind());
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

/// Pending handshakes per source. IPv4 addresses count one by one; IPv6 addresses by
/// their /64 prefix, because one host commonly holds a whole /64.
#[derive(Default)]
struct PerSource {
    counts: Mutex<HashMap<IpAddr, usize>>,
}

impl PerSource {
    fn key(ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V4(_) => ip,
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
            },
        }
    }

    /// Takes one of `max` slots of `ip`'s source, or `None` when all are taken.
    fn try_take(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<SourceSlot> {
        let key = Self::key(ip);
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let n = counts.entry(key).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(SourceSlot {
            owner: self.clone(),
            key,
        })
    }
}

/// One pending handshake of a source; gives its slot back when dropped.
struct SourceSlot {
    owner: Arc<PerSource>,
    key: IpAddr,
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut counts = self.owner.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = counts.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.remove(&self.key);
            }
        }
    }
}

/// Refuses a connection that did not negotiate ALPN `h2`. rustls already refuses a
/// ClientHello whose ALPN list lacks `h2` (`no_application_protocol`); this also refuses
/// one that offered no ALPN at all, which rustls would accept.
pub(crate) fn require_h2<D>(conn: &rustls::ConnectionCommon<D>) -> Result<(), AtlsError> {
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

//! The accepting side of aTLS and its tonic glue.

use crate::stream::{AtlsConnectInfo, AtlsStream};
use crate::{AtlsConfig, AtlsError, exchange, tls};
use asterism_attestation::Role;
use futures::Stream;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;

/// Handshakes in progress at once per [`AtlsServer::incoming`]; further connections wait
/// in the listen backlog, so a flood of slow peers cannot exhaust memory.
const MAX_PENDING_HANDSHAKES: usize = 512;

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
        let exporter = export(tls.get_ref().1)?;
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
            AtlsConnectInfo { remote_addr, peer },
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
            let pending = Arc::new(Semaphore::new(MAX_PENDING_HANDSHAKES));
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
                let _ = tcp.set_nodelay(true);
                let server = server.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    let _permit = permit;
                    match server.accept(tcp, Some(addr)).await {
                        Ok(stream) => {
                            let _ = tx.send(Ok(stream)).await;
                        }
                        Err(e) => {
                            tracing::warn!(peer = %addr, error = %e, "aTLS connection refused");
                        }
                    }
                });
            }
        });
        ReceiverStream::new(rx)
    }
}

/// The 32-byte exporter value of a finished TLS 1.3 connection.
pub(crate) fn export<D>(conn: &rustls::ConnectionCommon<D>) -> Result<[u8; 32], AtlsError> {
    let mut out = [0u8; 32];
    conn.export_keying_material(&mut out, tls::EXPORTER_LABEL, Some(&[]))
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

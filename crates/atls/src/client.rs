//! The dialling side of aTLS and its tonic glue.

use crate::server::within;
use crate::stream::{AtlsConnectInfo, AtlsStream};
use crate::{AtlsConfig, AtlsError, VerifiedPeer, exchange, server, tls};
use asterism_attestation::Role;
use futures::future::BoxFuture;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// Dials aTLS connections. Cheap to clone; clones share one ephemeral TLS identity.
#[derive(Clone)]
pub struct AtlsConnector {
    tls: TlsConnector,
    cfg: Arc<AtlsConfig>,
    last_peer: Arc<Mutex<Option<VerifiedPeer>>>,
}

impl std::fmt::Debug for AtlsConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AtlsConnector")
            .field("cfg", &self.cfg)
            .finish()
    }
}

impl AtlsConnector {
    /// A connector with its own TLS client configuration.
    pub fn new(cfg: AtlsConfig) -> Result<Self, AtlsError> {
        cfg.check()?;
        Ok(Self {
            tls: TlsConnector::from(Arc::new(tls::client_config()?)),
            cfg: Arc::new(cfg),
            last_peer: Arc::new(Mutex::new(None)),
        })
    }

    /// Runs the TLS handshake and the evidence exchange on an established transport.
    pub async fn connect<IO>(
        &self,
        io: IO,
        remote_addr: Option<SocketAddr>,
    ) -> Result<AtlsStream<IO>, AtlsError>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        let handshake = self.tls.connect(tls::server_name(), io);
        let mut tls = within(self.cfg.handshake_timeout, "TLS handshake", handshake)
            .await?
            .map_err(server::tls_io_error)?;
        let (exporter, channel_binding) = server::bindings(tls.get_ref().1)?;
        let exchange = exchange::run(&mut tls, Role::Client, &exporter, &self.cfg, remote_addr);
        let peer = within(self.cfg.exchange_timeout, "attestation exchange", exchange).await??;
        if let (Some(p), Ok(mut last)) = (&peer, self.last_peer.lock()) {
            *last = Some(p.clone());
        }
        Ok(AtlsStream::new(
            tokio_rustls::TlsStream::Client(tls),
            AtlsConnectInfo {
                remote_addr,
                peer,
                channel_binding,
            },
            self.cfg.max_connection_lifetime,
        ))
    }

    /// Connects to `addr` over TCP and runs aTLS on it.
    pub async fn connect_tcp(&self, addr: &str) -> Result<AtlsStream<TcpStream>, AtlsError> {
        let tcp = within(
            self.cfg.handshake_timeout,
            "TCP connect",
            TcpStream::connect(addr),
        )
        .await?
        .map_err(AtlsError::Io)?;
        let _ = tcp.set_nodelay(true);
        let remote = tcp.peer_addr().ok();
        self.connect(tcp, remote).await
    }

    /// The peer verified by the most recent connection of this connector (or a clone),
    /// for callers that dial through tonic and want to report what they verified.
    pub fn last_verified_peer(&self) -> Option<VerifiedPeer> {
        self.last_peer.lock().ok().and_then(|p| p.clone())
    }
}

impl tower::Service<http::Uri> for AtlsConnector {
    type Response = TokioIo<AtlsStream<TcpStream>>;
    type Error = AtlsError;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let authority = uri
                .authority()
                .filter(|a| a.port_u16().is_some())
                .ok_or_else(|| AtlsError::Config(format!("URI {uri} lacks host:port")))?;
            let stream = this.connect_tcp(authority.as_str()).await?;
            Ok(TokioIo::new(stream))
        })
    }
}

//! The dialling side of aTLS and its tonic glue.

use crate::server::within;
use crate::stream::{AtlsConnectInfo, AtlsStream};
use crate::{AtlsConfig, AtlsError, VerifiedPeer, exchange, server, tls};
use asterism_attestation::Role;
use futures::future::BoxFuture;
use hyper_util::rt::TokioIo;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpSocket, TcpStream};
use tokio_rustls::TlsConnector;

/// Dials aTLS connections. Cheap to clone; clones share one ephemeral TLS identity.
#[derive(Clone)]
pub struct AtlsConnector {
    tls: TlsConnector,
    cfg: Arc<AtlsConfig>,
    last_peer: Arc<Mutex<Option<VerifiedPeer>>>,
    /// The address of this host that connections leave from; `None`: the kernel's choice.
    local: Option<IpAddr>,
}

impl std::fmt::Debug for AtlsConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AtlsConnector")
            .field("cfg", &self.cfg)
            .field("local", &self.local)
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
            local: None,
        })
    }

    /// The same connector (its TLS identity and the peer it last verified shared), whose
    /// TCP connections ([`Self::connect_tcp`], and tonic's through `tower::Service`) leave
    /// from `local`, an address of this host; the port is the kernel's choice. A node with
    /// several addresses dials from the one its peers know it by; a server that counts its
    /// peers by address (aTLS's per-source limit) sees that one.
    #[must_use]
    pub fn from_address(mut self, local: IpAddr) -> Self {
        self.local = Some(local);
        self
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
        let (peer, last_frames) =
            within(self.cfg.exchange_timeout, "attestation exchange", exchange).await??;
        if let (Some(p), Ok(mut last)) = (&peer, self.last_peer.lock()) {
            *last = Some(p.clone());
        }
        AtlsStream::new(
            tokio_rustls::TlsStream::Client(tls),
            AtlsConnectInfo {
                remote_addr,
                peer,
                channel_binding,
            },
            self.cfg.max_connection_lifetime,
            &last_frames,
        )
    }

    /// Connects to `addr` over TCP and runs aTLS on it.
    pub async fn connect_tcp(&self, addr: &str) -> Result<AtlsStream<TcpStream>, AtlsError> {
        let tcp = within(self.cfg.handshake_timeout, "TCP connect", self.tcp(addr))
            .await?
            .map_err(AtlsError::Io)?;
        let _ = tcp.set_nodelay(true);
        let remote = tcp.peer_addr().ok();
        self.connect(tcp, remote).await
    }

    /// A TCP connection to `addr` (an address, or a name and port), from the connector's
    /// local address when it has one: to the first of `addr`'s addresses of that family
    /// that answers.
    async fn tcp(&self, addr: &str) -> io::Result<TcpStream> {
        let Some(local) = self.local else {
            return TcpStream::connect(addr).await;
        };
        let mut last = None;
        for remote in tokio::net::lookup_host(addr).await? {
            if remote.is_ipv4() != local.is_ipv4() {
                continue;
            }
            let socket = if local.is_ipv4() {
                TcpSocket::new_v4()?
            } else {
                TcpSocket::new_v6()?
            };
            socket.bind(SocketAddr::new(local, 0))?;
            match socket.connect(remote).await {
                Ok(tcp) => return Ok(tcp),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{addr} has no address of the family of {local}"),
            )
        }))
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

//! A TLS stream whose evidence exchange has completed.

use crate::VerifiedPeer;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Connection information handed to tonic handlers (as a request extension) and to
/// callers of [`crate::AtlsConnector::connect`].
#[derive(Clone, Debug)]
pub struct AtlsConnectInfo {
    /// The peer's address, when the transport has one.
    pub remote_addr: Option<SocketAddr>,
    /// The verified peer; `None` when this side does not verify the peer.
    pub peer: Option<VerifiedPeer>,
    /// A value only the two ends of this TLS connection know: the TLS exporter under
    /// [`crate::CHANNEL_BINDING_LABEL`] (not the evidence's exporter), for application
    /// messages that must be bound to this connection (a signature over it cannot be
    /// replayed on another).
    pub channel_binding: [u8; 32],
}

/// A TLS 1.3 stream on which the aTLS exchange succeeded; application data (HTTP/2)
/// flows from here on.
///
/// When this side verified the peer, the stream ends at the verified-connection lifetime
/// ([`crate::AtlsConfig::with_max_connection_lifetime`]): reads then see end of stream and
/// writes fail, so the peer has to attest again on a new connection.
pub struct AtlsStream<IO> {
    inner: tokio_rustls::TlsStream<IO>,
    info: AtlsConnectInfo,
    expires: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<IO> AtlsStream<IO> {
    pub(crate) fn new(
        inner: tokio_rustls::TlsStream<IO>,
        info: AtlsConnectInfo,
        lifetime: std::time::Duration,
    ) -> Self {
        let expires = info
            .peer
            .is_some()
            .then(|| Box::pin(tokio::time::sleep(lifetime)));
        Self {
            inner,
            info,
            expires,
        }
    }

    /// Whether the verified-connection lifetime is over; registers the waker otherwise.
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        self.expires
            .as_mut()
            .is_some_and(|d| d.as_mut().poll(cx).is_ready())
    }

    /// The verified peer, if this side verified it.
    pub fn peer(&self) -> Option<&VerifiedPeer> {
        self.info.peer.as_ref()
    }

    /// The connection information.
    pub fn info(&self) -> &AtlsConnectInfo {
        &self.info
    }
}

impl<IO> std::fmt::Debug for AtlsStream<IO> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AtlsStream")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for AtlsStream<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.expired(cx) {
            // End of stream: HTTP/2 closes the connection as if the peer had.
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for AtlsStream<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.expired(cx) {
            return Poll::Ready(Err(lifetime_over()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.expired(cx) {
            return Poll::Ready(Err(lifetime_over()));
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

fn lifetime_over() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "the verified-connection lifetime is over; the peer must attest again",
    )
}

impl<IO> tonic::transport::server::Connected for AtlsStream<IO> {
    type ConnectInfo = AtlsConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.info.clone()
    }
}

//! A TLS stream whose evidence exchange has completed.

use crate::VerifiedPeer;
use std::future::Future;
use std::io::{self, Write as _};
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
///
/// The exchange's last frames (a VERDICT, and a server's HELLO that waited for it) are
/// queued in the TLS session unwritten, and leave with the application's first write: an
/// HTTP/2 server's SETTINGS, a client's preface. An application that reads first sends
/// them with its first read.
pub struct AtlsStream<IO> {
    inner: tokio_rustls::TlsStream<IO>,
    info: AtlsConnectInfo,
    expires: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Until a flush went through: the exchange's last frames may still be queued.
    queued: bool,
}

impl<IO> AtlsStream<IO> {
    /// The stream after a successful exchange, with `last_frames` queued in the session.
    pub(crate) fn new(
        mut inner: tokio_rustls::TlsStream<IO>,
        info: AtlsConnectInfo,
        lifetime: std::time::Duration,
        last_frames: &[u8],
    ) -> Result<Self, crate::AtlsError> {
        let queued = !last_frames.is_empty();
        if queued {
            // Buffered as TLS records in the session, not written: the session's send
            // buffer is empty here and holds far more than a HELLO and a VERDICT.
            let n = match &mut inner {
                tokio_rustls::TlsStream::Server(s) => s.get_mut().1.writer().write(last_frames),
                tokio_rustls::TlsStream::Client(c) => c.get_mut().1.writer().write(last_frames),
            }
            .map_err(crate::AtlsError::Io)?;
            if n != last_frames.len() {
                return Err(crate::AtlsError::Protocol(format!(
                    "the TLS session took {n} of the exchange's last {} bytes",
                    last_frames.len()
                )));
            }
        }
        let expires = info
            .peer
            .is_some()
            .then(|| Box::pin(tokio::time::sleep(lifetime)));
        Ok(Self {
            inner,
            info,
            expires,
            queued,
        })
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
        if self.queued {
            // The peer may be waiting for the exchange's last frames before it sends
            // anything: send them before reading. A flush that cannot finish yet does not
            // hold the read back; it is tried again on the next one.
            match Pin::new(&mut self.inner).poll_flush(cx) {
                Poll::Ready(Ok(())) => self.queued = false,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {}
            }
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
        let flushed = Pin::new(&mut self.inner).poll_flush(cx);
        if matches!(flushed, Poll::Ready(Ok(()))) {
            self.queued = false;
        }
        flushed
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

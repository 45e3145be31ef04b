//! The async adapter that drives the sans-I/O [`Exchange`] over a TLS stream.

use crate::machine::{Exchange, IssueRequest, Step};
use crate::{AtlsConfig, AtlsError, VerifiedPeer, issue, session};
use asterism_attestation::{ReportData, Role};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Runs the exchange for `role` on `stream`, whose TLS exporter value is `exporter`.
///
/// Returns the verified peer when this side verifies (`None` when it does not), and this
/// side's last frames, not yet written: the caller queues them ahead of the application's
/// first bytes ([`crate::stream::AtlsStream`]), so that a VERDICT and HTTP/2's first frames
/// leave in one write. On error the caller drops (closes) the connection.
pub(crate) async fn run<S>(
    stream: &mut S,
    role: Role,
    exporter: &[u8; 32],
    cfg: &Arc<AtlsConfig>,
    remote_addr: Option<SocketAddr>,
) -> Result<(Option<VerifiedPeer>, Vec<u8>), AtlsError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut x = Exchange::new(role, cfg.clone(), *exporter, remote_addr, now);
    let mut out = Vec::new();
    let mut written = 0;
    // A server gives the client's HELLO a short deadline of its own: an honest client sends
    // it right behind its handshake, and a silent peer must not hold its handshake slot for
    // the whole exchange deadline.
    let hello = (role == Role::Server).then(|| HelloDeadline {
        at: tokio::time::Instant::now() + cfg.hello_timeout,
        after: cfg.hello_timeout,
    });
    match drive(stream, &mut x, cfg, hello, &mut out, &mut written).await {
        Ok(()) => {
            let last = out.split_off(written.min(out.len()));
            Ok((x.into_verified(), last))
        }
        Err(e) => {
            // What was not yet sent, then the failure VERDICT when the protocol calls for
            // one; best effort.
            let mut rest = out.split_off(written.min(out.len()));
            rest.extend(x.take_output());
            if !rest.is_empty() {
                let _ = stream.write_all(&rest).await;
                let _ = stream.flush().await;
            }
            Err(e)
        }
    }
}

/// The time by which a server must have read the client's HELLO.
#[derive(Clone, Copy)]
struct HelloDeadline {
    at: tokio::time::Instant,
    after: Duration,
}

/// The timeout stage named when the client's HELLO is late.
pub(crate) const HELLO_STAGE: &str = "the client's HELLO";

/// Runs `f`, bounded by the HELLO deadline if there is one (while the machine still waits
/// for the HELLO).
async fn until_hello<T>(
    hello: Option<HelloDeadline>,
    f: impl Future<Output = T>,
) -> Result<T, AtlsError> {
    match hello {
        Some(d) => tokio::time::timeout_at(d.at, f)
            .await
            .map_err(|_| AtlsError::Timeout {
                stage: HELLO_STAGE,
                after: d.after,
            }),
        None => Ok(f.await),
    }
}

async fn drive<S>(
    stream: &mut S,
    x: &mut Exchange,
    cfg: &AtlsConfig,
    hello: Option<HelloDeadline>,
    out: &mut Vec<u8>,
    written: &mut usize,
) -> Result<(), AtlsError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    // Grown to the largest read the machine asks for, up to READ_CHUNK: most frames are a
    // few hundred bytes to a few KiB, and every connection in its exchange holds this.
    let mut buf = Vec::new();
    loop {
        out.extend(x.take_output());
        let step = x.step()?;
        // What is left at the end goes out with the application's first bytes; a server's
        // HELLO that can wait goes out with its VERDICT.
        let holds = match step {
            Step::Done => true,
            Step::Read(_) => x.output_can_wait(),
            Step::Issue(_) => false,
        };
        if *written < out.len() && !holds {
            // Write while also reading what the machine asks for, so that two sides
            // sending large frames at once never wait on each other's socket buffers.
            {
                let (mut rd, mut wr) = tokio::io::split(&mut *stream);
                match step {
                    Step::Read(n) => {
                        let n = room(&mut buf, n);
                        let hello = hello.filter(|_| x.awaits_peer_hello());
                        tokio::select! {
                            w = wr.write(out.get(*written..).unwrap_or_default()) => {
                                *written += wrote(w)?;
                            }
                            r = until_hello(hello, rd.read(buf.get_mut(..n).unwrap_or_default())) => {
                                let got = got(r?)?;
                                x.feed(buf.get(..got).unwrap_or_default())?;
                            }
                        }
                    }
                    _ => {
                        wr.write_all(out.get(*written..).unwrap_or_default())
                            .await
                            .map_err(AtlsError::Io)?;
                        *written = out.len();
                    }
                }
            }
            if *written == out.len() {
                stream.flush().await.map_err(AtlsError::Io)?;
                out.clear();
                *written = 0;
            }
            continue;
        }
        match step {
            Step::Done => return Ok(()),
            Step::Read(n) => {
                let n = room(&mut buf, n);
                let hello = hello.filter(|_| x.awaits_peer_hello());
                let r =
                    until_hello(hello, stream.read(buf.get_mut(..n).unwrap_or_default())).await?;
                let got = got(r)?;
                x.feed(buf.get(..got).unwrap_or_default())?;
            }
            Step::Issue(req) => match produce(cfg, &req).await {
                Ok((variant, evidence)) => x.provide_evidence(variant, &evidence)?,
                Err(e) => return Err(x.abort(e)),
            },
        }
    }
}

/// The most one read takes from the TLS stream (a TLS record's plaintext); a larger frame
/// is read in several.
const READ_CHUNK: usize = 16 * 1024;

/// Makes `buf` hold at least `min(n, READ_CHUNK)` bytes and returns that length.
fn room(buf: &mut Vec<u8>, n: usize) -> usize {
    let n = n.min(READ_CHUNK);
    if buf.len() < n {
        buf.resize(n, 0);
    }
    n
}

fn wrote(w: std::io::Result<usize>) -> Result<usize, AtlsError> {
    match w {
        Ok(0) => Err(AtlsError::Closed),
        Ok(n) => Ok(n),
        Err(e) => Err(AtlsError::Io(e)),
    }
}

fn got(r: std::io::Result<usize>) -> Result<usize, AtlsError> {
    match r {
        Ok(0) => Err(AtlsError::Closed),
        Ok(n) => Ok(n),
        Err(e) => Err(AtlsError::read(e)),
    }
}

/// This side's evidence for `req`: per connection from the issuer, or from the session key.
async fn produce(
    cfg: &AtlsConfig,
    req: &IssueRequest,
) -> Result<(&'static str, Vec<u8>), AtlsError> {
    if let (true, Some(key)) = (req.session_key, &cfg.session_key) {
        return Ok((
            session::VARIANT,
            key.evidence(req.role, &req.exporter).await?,
        ));
    }
    let issuer = cfg.issuer.clone().ok_or(AtlsError::NoIssuer)?;
    let variant = issuer.variant();
    let evidence = issue::issue(issuer, ReportData::atls(req.role, &req.exporter)).await?;
    Ok((variant, evidence))
}

#[cfg(test)]
mod tests {
    use super::*;
    use asterism_attestation::test_ed25519::{InsecureTestIssuer, InsecureTestValidator};
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// A stream that counts the bytes written to it.
    struct Counting<S> {
        inner: S,
        wrote: usize,
    }

    impl<S: AsyncRead + Unpin> AsyncRead for Counting<S> {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.inner).poll_read(cx, buf)
        }
    }

    impl<S: AsyncWrite + Unpin> AsyncWrite for Counting<S> {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            let r = Pin::new(&mut self.inner).poll_write(cx, buf);
            if let Poll::Ready(Ok(n)) = r {
                self.wrote += n;
            }
            r
        }
        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.inner).poll_flush(cx)
        }
        fn poll_shutdown(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }

    /// An issuer that takes its time, so that the client's evidence arrives after the
    /// server could have written its HELLO.
    struct Slow(InsecureTestIssuer);

    impl asterism_attestation::Issuer for Slow {
        fn variant(&self) -> &'static str {
            self.0.variant()
        }
        fn issue(&self, rd: &ReportData) -> Result<Vec<u8>, asterism_attestation::IssueError> {
            std::thread::sleep(Duration::from_millis(100));
            self.0.issue(rd)
        }
    }

    /// A server that verifies and sends no evidence writes nothing during the exchange: its
    /// HELLO and its VERDICT come back as the last frames, for the application's first write.
    /// The client's evidence comes late, so a server that wrote its HELLO at once would have
    /// written it before the evidence arrived.
    #[tokio::test]
    async fn a_verifying_server_holds_its_hello_and_verdict_for_one_write() {
        let seed = [7u8; 32];
        let issuer = InsecureTestIssuer::from_seed(&seed).unwrap();
        let validator = Arc::new(InsecureTestValidator::new([issuer.public_key()]));
        let server_cfg = Arc::new(AtlsConfig::verifying(validator));
        let client_cfg = Arc::new(AtlsConfig::attesting(Arc::new(Slow(issuer))));
        let exporter = [9u8; 32];
        let (a, mut client_io) = tokio::io::duplex(64 * 1024);
        let mut server_io = Counting { inner: a, wrote: 0 };

        let server = async {
            let (peer, last) = run(&mut server_io, Role::Server, &exporter, &server_cfg, None)
                .await
                .unwrap();
            let wrote_during = server_io.wrote;
            // What the application's first write would carry.
            server_io.write_all(&last).await.unwrap();
            (peer, last, wrote_during)
        };
        let client = run(&mut client_io, Role::Client, &exporter, &client_cfg, None);
        let ((peer, last, wrote_during), client) = tokio::join!(server, client);
        client.unwrap();
        assert!(peer.is_some());
        assert_eq!(wrote_during, 0, "the server wrote during the exchange");
        assert_eq!(last.first(), Some(&crate::wire::FRAME_HELLO));
        // HELLO: type, 4-byte length, version, flags.
        assert_eq!(last.get(7), Some(&crate::wire::FRAME_VERDICT));
    }
}

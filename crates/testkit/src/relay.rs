//! A TLS-terminating relay: the man in the middle of a relayed attested session.
//!
//! It accepts TLS from the victim with its own self-signed certificate, opens its own TLS
//! connection to the target (accepting any certificate, as an aTLS client does), and
//! copies the plaintext both ways. Every byte the target sends (its evidence included)
//! reaches the victim unchanged, but inside another TLS session with another exporter, so
//! evidence bound to the target's session must not verify on the victim's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use rustls::pki_types::{PrivateKeyDer, ServerName};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A running relay; stops when dropped.
pub struct TlsRelay {
    addr: SocketAddr,
    relayed: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TlsRelay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TlsRelay {
    /// Listens on `127.0.0.1` (a free port) and relays every connection to `target`.
    pub async fn start(target: SocketAddr) -> Self {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let cert = rcgen::CertificateParams::new(vec!["relay".into()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let mut server = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
            )
            .unwrap();
        server.alpn_protocols = vec![b"h2".to_vec()];
        let client = crate::tls::client_config(&[&rustls::version::TLS13], vec![b"h2".to_vec()]);
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client));

        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let relayed = Arc::new(AtomicUsize::new(0));
        let count = relayed.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((victim, _)) = listener.accept().await else {
                    continue;
                };
                let (acceptor, connector, count) =
                    (acceptor.clone(), connector.clone(), count.clone());
                tokio::spawn(async move {
                    let Ok(mut victim) = acceptor.accept(victim).await else {
                        return;
                    };
                    let Ok(upstream) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    let name = ServerName::IpAddress(target.ip().into());
                    let Ok(mut upstream) = connector.connect(name, upstream).await else {
                        return;
                    };
                    count.fetch_add(1, Ordering::SeqCst);
                    let _ = tokio::io::copy_bidirectional(&mut victim, &mut upstream).await;
                });
            }
        });
        Self {
            addr,
            relayed,
            task,
        }
    }

    /// Where victims connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// How many connections got as far as a TLS session with the target on one side and the
    /// victim on the other (so a refusal afterwards is the evidence binding's doing).
    pub fn relayed(&self) -> usize {
        self.relayed.load(Ordering::SeqCst)
    }
}

/// A connection from `from` to `to` that completes a TLS 1.3 handshake (ALPN `h2`, any
/// server certificate) and then sends nothing: the flood of an outsider who holds aTLS
/// handshake slots past the TLS layer's deadlines.
pub async fn silent_tls(
    from: std::net::IpAddr,
    to: SocketAddr,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let client = crate::tls::client_config(&[&rustls::version::TLS13], vec![b"h2".to_vec()]);
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    let tcp = socket.connect(to).await?;
    tokio_rustls::TlsConnector::from(Arc::new(client))
        .connect(ServerName::IpAddress(to.ip().into()), tcp)
        .await
}

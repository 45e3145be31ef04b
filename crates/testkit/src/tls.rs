//! A TLS 1.3 client that trusts any server certificate, for tests and benchmarks that play
//! a peer without evidence (a plain TLS baseline, a client that skips aTLS, a probe of what
//! a server accepts).
//!
//! It still checks that the handshake is signed by the key of the certificate presented,
//! so both sides do the signature work a real handshake does; it checks nothing else of
//! the server. Each connection makes a full handshake (no resumption).

// A set-up that cannot work fails the test at once.
#![allow(clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme, SupportedProtocolVersion};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// The `ring` provider, which the workspace's TLS uses.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The server name every connection asks for.
fn localhost() -> ServerName<'static> {
    ServerName::try_from("localhost").expect("a DNS name")
}

/// Accepts any server certificate; checks the handshake signature against it.
#[derive(Debug)]
pub struct AcceptAnyServerCert(WebPkiSupportedAlgorithms);

impl AcceptAnyServerCert {
    /// With the signature algorithms of `provider`.
    pub fn new(provider: &CryptoProvider) -> Self {
        Self(provider.signature_verification_algorithms)
    }
}

impl ServerCertVerifier for AcceptAnyServerCert {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

/// A client configuration for `versions` offering `alpn`, trusting any server certificate.
pub fn client_config(
    versions: &[&'static SupportedProtocolVersion],
    alpn: Vec<Vec<u8>>,
) -> rustls::ClientConfig {
    let provider = provider();
    let verifier = Arc::new(AcceptAnyServerCert::new(&provider));
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .unwrap_or_else(|e| panic!("protocol versions {versions:?}: {e}"))
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    cfg.alpn_protocols = alpn;
    cfg.resumption = rustls::client::Resumption::disabled();
    cfg
}

/// A TLS client handshake on `tcp` with [`client_config`] (server name `localhost`).
pub async fn connect_over(
    tcp: TcpStream,
    versions: &[&'static SupportedProtocolVersion],
    alpn: Vec<Vec<u8>>,
) -> std::io::Result<TlsStream<TcpStream>> {
    tokio_rustls::TlsConnector::from(Arc::new(client_config(versions, alpn)))
        .connect(localhost(), tcp)
        .await
}

/// A TLS 1.3 connection to `addr` offering ALPN `h2`, trusting any server certificate.
pub async fn connect_h2(
    addr: impl tokio::net::ToSocketAddrs,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    connect_over(tcp, &[&rustls::version::TLS13], vec![b"h2".to_vec()]).await
}

/// A connector for a tonic `Endpoint` (`connect_with_connector`): TLS 1.3 with ALPN `h2`
/// to the URI's authority, trusting any server certificate, `TCP_NODELAY` set.
pub fn h2_connector() -> impl tower::Service<
    http::Uri,
    Response = hyper_util::rt::TokioIo<TlsStream<TcpStream>>,
    Error = std::io::Error,
    Future = impl Send,
> + Clone
+ Send
+ 'static {
    let cfg = client_config(&[&rustls::version::TLS13], vec![b"h2".to_vec()]);
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    tower::service_fn(move |uri: http::Uri| {
        let connector = connector.clone();
        async move {
            let authority = uri
                .authority()
                .ok_or_else(|| std::io::Error::other(format!("{uri} names no host")))?
                .as_str()
                .to_owned();
            let tcp = TcpStream::connect(authority).await?;
            tcp.set_nodelay(true)?;
            let tls = connector.connect(localhost(), tcp).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
        }
    })
}

//! A plain TLS 1.3 server that tonic serves: a self-signed certificate, ALPN `h2`, no
//! session tickets, each handshake in a task of its own as the aTLS acceptor does. The
//! baseline the benchmarks hold attested TLS against; and [`FixedKeys`], the `kms.API`
//! with fixed answers that they serve over it.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;

use asterism_proto::kms::api_server::{Api, ApiServer};
use asterism_proto::kms::{
    GetControlPlaneIdentityRequest, GetControlPlaneIdentityResponse, GetDataKeyRequest,
    GetDataKeyResponse,
};

use crate::tls::provider;

/// One accepted plain TLS connection, as tonic's `serve_with_incoming` takes it.
pub struct PlainTlsStream(tokio_rustls::server::TlsStream<TcpStream>);

impl Connected for PlainTlsStream {
    type ConnectInfo = ();
    fn connect_info(&self) {}
}

impl AsyncRead for PlainTlsStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for PlainTlsStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Why the plain TLS server cannot start.
#[derive(Debug, thiserror::Error)]
pub enum PlainTlsError {
    /// The self-signed certificate cannot be made.
    #[error("making the self-signed certificate")]
    Certificate(#[from] rcgen::Error),
    /// rustls refuses the configuration.
    #[error("the TLS configuration")]
    Tls(#[from] rustls::Error),
}

/// A TLS 1.3 server configuration with a fresh self-signed ECDSA P-256 certificate for
/// `name`, offering ALPN `h2`; otherwise rustls's defaults.
pub fn self_signed_h2_config(name: &str) -> Result<rustls::ServerConfig, PlainTlsError> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let cert = rcgen::CertificateParams::new(vec![name.into()])?.self_signed(&key)?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )?;
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(cfg)
}

/// Accepts plain TLS on `listener` from a spawned task (on the current tokio runtime):
/// the accepted connections, for tonic's `serve_with_incoming`. A failed accept or
/// handshake is skipped.
pub fn plain_tls_incoming(
    listener: TcpListener,
) -> Result<ReceiverStream<Result<PlainTlsStream, io::Error>>, PlainTlsError> {
    let mut cfg = self_signed_h2_config("localhost")?;
    cfg.send_tls13_tickets = 0;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(tcp).await {
                    let _ = tx.send(Ok(PlainTlsStream(tls))).await;
                }
            });
        }
    });
    Ok(ReceiverStream::new(rx))
}

/// The benchmarks' baseline server: [`FixedKeys`] over plain TLS on `listener`, served from
/// a spawned task (on the current tokio runtime) until the runtime ends.
pub fn spawn_fixed_keys_server(listener: TcpListener) -> Result<(), PlainTlsError> {
    let incoming = plain_tls_incoming(listener)?;
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ApiServer::new(FixedKeys))
            .serve_with_incoming(incoming),
    );
    Ok(())
}

/// A `kms.API` that answers every `GetDataKey` with 32 zero bytes, and nothing else: the
/// call the handshake and load benchmarks carry, whose own work is next to none.
#[derive(Debug, Clone, Copy)]
pub struct FixedKeys;

#[tonic::async_trait]
impl Api for FixedKeys {
    async fn get_data_key(
        &self,
        _request: tonic::Request<GetDataKeyRequest>,
    ) -> Result<tonic::Response<GetDataKeyResponse>, tonic::Status> {
        Ok(tonic::Response::new(GetDataKeyResponse {
            data_key: vec![0u8; 32],
        }))
    }

    async fn get_control_plane_identity(
        &self,
        _request: tonic::Request<GetControlPlaneIdentityRequest>,
    ) -> Result<tonic::Response<GetControlPlaneIdentityResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented(
            "the baseline serves data keys only",
        ))
    }
}

//! `join_load`: K concurrent joiners (default 256), each a node with its own address
//! (`127.11.x.y`) and its own software-signed `tpm-quote` AK (pinned), ask one in-process
//! join service (with the real key service on a Unix socket and the real metadata service)
//! for a join ticket over a fresh aTLS connection. Prints tickets/s, p50/p99 latency, the
//! ratio to a plain TLS 1.3 gRPC unary baseline (fresh connection + one call, same
//! concurrency) measured in the same run, and the process's peak RSS.
//!
//! Run: `cargo bench -p asterism-join-service --features insecure-test-attestation --bench join_load`
//! Environment: `JOIN_BENCH_JOINERS` (default 256).

#![allow(
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::indexing_slicing
)]

#[path = "../tests/common/mod.rs"]
mod common;

use asterism_atls::Issuer;
use asterism_attestation::tpm::soft::{SoftAk, SoftTpm};
use asterism_metadata::{InstanceMetadata, MetadataConfig, MetadataServer, Role};
use asterism_proto::kms::api_client::ApiClient as KmsClient;
use asterism_proto::kms::api_server::{Api, ApiServer};
use asterism_proto::kms::{GetDataKeyRequest, GetDataKeyResponse};
use common::*;
use hyper_util::rt::TokioIo;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::Endpoint;
use tonic::transport::server::Connected;

#[derive(Clone)]
struct Fixed;

#[tonic::async_trait]
impl Api for Fixed {
    async fn get_data_key(
        &self,
        _request: tonic::Request<GetDataKeyRequest>,
    ) -> Result<tonic::Response<GetDataKeyResponse>, tonic::Status> {
        Ok(tonic::Response::new(GetDataKeyResponse {
            data_key: vec![0u8; 32],
        }))
    }
}

struct PlainTls(tokio_rustls::server::TlsStream<TcpStream>);

impl Connected for PlainTls {
    type ConnectInfo = ();
    fn connect_info(&self) {}
}
impl AsyncRead for PlainTls {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}
impl AsyncWrite for PlainTls {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

async fn plain_server() -> String {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    cfg.send_tls13_tickets = 0;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<PlainTls, std::io::Error>>(64);
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(tcp).await {
                    let _ = tx.send(Ok(PlainTls(tls))).await;
                }
            });
        }
    });
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ApiServer::new(Fixed))
            .serve_with_incoming(tokio_stream::wrappers::ReceiverStream::new(rx)),
    );
    format!("http://{addr}")
}

fn plain_connector() -> impl tower::Service<
    http::Uri,
    Response = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>,
    Error = std::io::Error,
    Future = impl Send,
> + Clone
+ Send
+ 'static {
    // The baseline trusts the server certificate by a dangerous accept-any verifier too,
    // so both sides of the comparison do the same signature work.
    #[derive(Debug)]
    struct AnyCert(rustls::crypto::WebPkiSupportedAlgorithms);
    impl rustls::client::danger::ServerCertVerifier for AnyCert {
        fn verify_server_cert(
            &self,
            _: &rustls::pki_types::CertificateDer<'_>,
            _: &[rustls::pki_types::CertificateDer<'_>],
            _: &rustls::pki_types::ServerName<'_>,
            _: &[u8],
            _: rustls::pki_types::UnixTime,
        ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            _: &[u8],
            _: &rustls::pki_types::CertificateDer<'_>,
            _: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            Err(rustls::Error::General("no TLS 1.2".into()))
        }
        fn verify_tls13_signature(
            &self,
            m: &[u8],
            c: &rustls::pki_types::CertificateDer<'_>,
            d: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(m, c, d, &self.0)
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.0.supported_schemes()
        }
    }
    let p = provider();
    let algs = p.signature_verification_algorithms;
    let mut cfg = rustls::ClientConfig::builder_with_provider(p)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCert(algs)))
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    cfg.resumption = rustls::client::Resumption::disabled();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    tower::service_fn(move |uri: http::Uri| {
        let connector = connector.clone();
        async move {
            let authority = uri.authority().unwrap().as_str().to_string();
            let tcp = TcpStream::connect(authority).await?;
            tcp.set_nodelay(true)?;
            let tls = connector
                .connect("localhost".try_into().unwrap(), tcp)
                .await?;
            Ok::<_, std::io::Error>(TokioIo::new(tls))
        }
    })
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn node_ip(i: usize) -> String {
    format!("127.11.{}.{}", i / 200, i % 200 + 1)
}

async fn baseline(k: usize) -> (f64, Vec<Duration>) {
    let url = plain_server().await;
    let connector = plain_connector();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..k {
        let (url, connector) = (url.clone(), connector.clone());
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            let channel = Endpoint::from_shared(url)
                .unwrap()
                .connect_with_connector(connector)
                .await
                .unwrap();
            KmsClient::new(channel)
                .get_data_key(GetDataKeyRequest {
                    data_key_id: "x".into(),
                    length: 32,
                })
                .await
                .unwrap();
            t.elapsed()
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.push(t.await.unwrap());
    }
    let secs = start.elapsed().as_secs_f64();
    lat.sort();
    (k as f64 / secs, lat)
}

fn main() {
    let k: usize = std::env::var("JOIN_BENCH_JOINERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let cluster = Cluster::start().await;
        // K worker instances with their own addresses, served by a second metadata service.
        let listener = TcpListener::bind("127.0.10.254:0").await.unwrap();
        let metadata_url = format!("http://{}", listener.local_addr().unwrap());
        let mut instances = Vec::new();
        for i in 0..k {
            instances.push(InstanceMetadata {
                name: format!("node-{i}"),
                provider_id: format!("asterism-local:///node-{i}"),
                role: Role::Worker,
                vpc_ip: node_ip(i),
                ..Default::default()
            });
        }
        tokio::spawn(
            MetadataServer::new(MetadataConfig {
                instances,
                init_secret_hash: String::new(),
            })
            .serve(listener, std::future::pending()),
        );
        let mut cluster = cluster;
        cluster.metadata_url = metadata_url;

        let mut nodes: Vec<Arc<dyn Issuer>> = Vec::new();
        let mut pins = Vec::new();
        for _ in 0..k {
            let tpm = SoftTpm::new(SoftAk::generate_ecdsa_p256().unwrap());
            pins.push(tpm.ak().fingerprint());
            nodes.push(Arc::new(tpm));
        }
        let mut options = Options::pinning(pins);
        options.rate = 1000.0;
        options.burst = 1000;
        let js = start_join_service(&cluster, options).await;
        let requests: Vec<_> = (0..k)
            .map(|i| {
                join_request(
                    &format!("node-{i}"),
                    &node_ip(i),
                    &format!("{:08x}-0000-4000-8000-000000000000", i),
                    false,
                )
            })
            .collect();

        let start = Instant::now();
        let mut tasks = Vec::new();
        for (i, (node, req)) in nodes.into_iter().zip(requests).enumerate() {
            let addr = js.addr;
            tasks.push(tokio::spawn(async move {
                let t = Instant::now();
                join(addr, &node_ip(i), node, req).await.unwrap();
                t.elapsed()
            }));
        }
        let mut lat = Vec::new();
        for t in tasks {
            lat.push(t.await.unwrap());
        }
        let secs = start.elapsed().as_secs_f64();
        lat.sort();
        let tickets_per_s = k as f64 / secs;
        // The baseline gets one unmeasured burst first (the join burst above warmed the
        // runtime for the join path), then the measured one.
        let _ = baseline(k).await;
        let (base_per_s, base_lat) = baseline(k).await;
        println!("join_load: {k} concurrent joiners, one join service, key service on a Unix socket");
        println!(
            "  join tickets:   {tickets_per_s:8.1}/s  p50 {:>8.2?}  p99 {:>8.2?}",
            percentile(&lat, 0.5),
            percentile(&lat, 0.99)
        );
        println!(
            "  plain TLS 1.3 gRPC unary (fresh connection): {base_per_s:8.1}/s  p50 {:>8.2?}  p99 {:>8.2?}",
            percentile(&base_lat, 0.5),
            percentile(&base_lat, 0.99)
        );
        println!("  ratio join/baseline: {:.3}", tickets_per_s / base_per_s);
        println!("  peak RSS (VmHWM): {} KiB", peak_rss_kib());
        js.stop().await;
    });
}

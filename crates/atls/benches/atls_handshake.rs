//! `atls_handshake`: connections per second on loopback, each a fresh TCP + TLS 1.3
//! connection carrying one gRPC unary call, for
//!
//! * (a) plain TLS 1.3 (rustls, same cipher suites and key type) + the call, and
//! * (b) aTLS with the Ed25519 test issuer (server attests, client verifies) + the call,
//! * (c) mutual aTLS (both attest and verify), for information,
//!
//! measured in one run, with the ratios b/a and c/a. Target: b/a ≥ 0.7.
//!
//! Run: `cargo bench -p asterism-atls --features insecure-test-attestation --bench atls_handshake`
//! Optional environment: `ATLS_BENCH_SECS` (per measurement, default 3),
//! `ATLS_BENCH_CONCURRENCY` (default 8).

#![allow(
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout
)]

use asterism_atls::attestation::test_ed25519::{InsecureTestIssuer, InsecureTestValidator};
use asterism_atls::{AtlsConfig, AtlsConnector, AtlsServer};
use asterism_proto::kms::GetDataKeyRequest;
use asterism_proto::kms::api_client::ApiClient;
use asterism_proto::kms::api_server::ApiServer;
use asterism_testkit::tls_server::FixedKeys;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tonic::transport::Endpoint;

async fn plain_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    asterism_testkit::tls_server::spawn_fixed_keys_server(listener).unwrap();
    format!("http://{addr}")
}

async fn atls_server(cfg: AtlsConfig) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = AtlsServer::new(cfg).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ApiServer::new(FixedKeys))
            .serve_with_incoming(server.incoming(listener)),
    );
    format!("http://{addr}")
}

/// Runs `concurrency` workers that each open a connection, make one call and drop it,
/// for `secs`; returns connections per second.
async fn measure<C>(uri: &str, connector: C, concurrency: usize, secs: f64) -> f64
where
    C: tower::Service<http::Uri> + Clone + Send + 'static,
    C::Response: hyper::rt::Read + hyper::rt::Write + Send + Unpin,
    C::Future: Send,
    Box<dyn std::error::Error + Send + Sync>: From<C::Error>,
    C::Error: Send,
{
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let uri = uri.to_string();
        let connector = connector.clone();
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                let channel = Endpoint::from_shared(uri.clone())
                    .unwrap()
                    .connect_with_connector(connector.clone())
                    .await
                    .expect("connect");
                ApiClient::new(channel)
                    .get_data_key(GetDataKeyRequest {
                        data_key_id: "bench".into(),
                        length: 32,
                    })
                    .await
                    .expect("call");
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let secs: f64 = std::env::var("ATLS_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let concurrency: usize = std::env::var("ATLS_BENCH_CONCURRENCY")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let server_issuer = Arc::new(InsecureTestIssuer::from_seed(&[1; 32]).unwrap());
        let client_issuer = Arc::new(InsecureTestIssuer::from_seed(&[2; 32]).unwrap());
        let trust_server = Arc::new(InsecureTestValidator::new([server_issuer.public_key()]));
        let trust_client = Arc::new(InsecureTestValidator::new([client_issuer.public_key()]));

        let plain_uri = plain_server().await;
        let one_way_uri = atls_server(AtlsConfig::attesting(server_issuer.clone())).await;
        let mutual_uri = atls_server(
            AtlsConfig::attesting(server_issuer.clone()).with_validator(trust_client.clone()),
        )
        .await;
        let one_way = AtlsConnector::new(AtlsConfig::verifying(trust_server.clone())).unwrap();
        let mutual = AtlsConnector::new(
            AtlsConfig::attesting(client_issuer.clone()).with_validator(trust_server.clone()),
        )
        .unwrap();

        // The plain baseline trusts any server certificate but checks the handshake
        // signature, so both sides of the comparison do the same signature work.
        // Warm up every path once.
        measure(&plain_uri, asterism_testkit::tls::h2_connector(), 2, 0.3).await;
        measure(&one_way_uri, one_way.clone(), 2, 0.3).await;
        measure(&mutual_uri, mutual.clone(), 2, 0.3).await;

        println!("atls_handshake: fresh TCP + TLS 1.3 connection + 1 gRPC unary call per iteration, loopback, {} worker threads", std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
        for conc in [1, concurrency] {
            let a = measure(&plain_uri, asterism_testkit::tls::h2_connector(), conc, secs).await;
            let b = measure(&one_way_uri, one_way.clone(), conc, secs).await;
            let c = measure(&mutual_uri, mutual.clone(), conc, secs).await;
            println!("concurrency {conc:>3}:");
            println!("  (a) plain TLS 1.3 + call        {a:>9.0} conn/s");
            println!("  (b) aTLS one-way (test issuer)  {b:>9.0} conn/s   b/a = {:.2}", b / a);
            println!("  (c) aTLS mutual                 {c:>9.0} conn/s   c/a = {:.2}", c / a);
        }
    });
}

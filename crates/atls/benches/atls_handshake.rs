//! `atls_handshake`: connections per second on loopback, each a fresh TCP + TLS 1.3
//! connection carrying one gRPC unary call, for
//!
//! * (a) plain TLS 1.3 (rustls, same cipher suites and key type) + the call, and
//! * (b) aTLS with the Ed25519 test issuer (server attests, client verifies) + the call,
//! * (c) mutual aTLS (both attest and verify), for information,
//!
//! measured in one run, with the ratios b/a and c/a. Targets (issue 26): b/a ≥ 0.85 and
//! c/a ≥ 0.80 at concurrency 8.
//!
//! Beside each ratio it prints the ratio's floor: the process's CPU per plain connection,
//! against that plus what aTLS cannot avoid per attesting side, one evidence issued and one
//! verified (the test issuer's and validator's own calls, timed alone in the same run). The
//! extra half round trip and the frames are not in the floor: they are what is left to cut.
//!
//! Run: `cargo bench -p asterism-atls --features insecure-test-attestation --bench atls_handshake`
//! Optional environment: `ATLS_BENCH_SECS` (per measurement, default 3),
//! `ATLS_BENCH_CONCURRENCY` (default 8), `ATLS_BENCH_PROFILE` (`plain`, `one-way` or
//! `mutual`: runs only that path, at the concurrency given, for ten seconds, for a profiler
//! such as `perf record`).

#![allow(
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout
)]

use asterism_atls::attestation::test_ed25519::{InsecureTestIssuer, InsecureTestValidator};
use asterism_atls::attestation::{Issuer as _, ReportData, Role, Validator as _};
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

/// This process's CPU time so far (user and system, all threads), from `/proc/self/stat`.
fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let ticks: u64 = rest
        .split_whitespace()
        .skip(11) // utime and stime are fields 14 and 15 of the line
        .take(2)
        .filter_map(|f| f.parse::<u64>().ok())
        .sum();
    // Linux reports them in USER_HZ, 100 on every architecture it supports.
    Duration::from_millis(ticks * 10)
}

/// CPU time of one call of `f`, averaged over half a second of calls on this thread.
fn per_call(mut f: impl FnMut()) -> Duration {
    let start = Instant::now();
    let mut n = 0u32;
    while start.elapsed() < Duration::from_millis(500) {
        f();
        n += 1;
    }
    start.elapsed() / n.max(1)
}

/// Runs `concurrency` workers that each open a connection, make one call and drop it,
/// for `secs`; returns connections per second and the process's CPU per connection.
async fn measure<C>(uri: &str, connector: C, concurrency: usize, secs: f64) -> (f64, Duration)
where
    C: tower::Service<http::Uri> + Clone + Send + 'static,
    C::Response: hyper::rt::Read + hyper::rt::Write + Send + Unpin,
    C::Future: Send,
    Box<dyn std::error::Error + Send + Sync>: From<C::Error>,
    C::Error: Send,
{
    let done = Arc::new(AtomicU64::new(0));
    let cpu = process_cpu();
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
    let n = done.load(Ordering::Relaxed);
    let cpu = (process_cpu().saturating_sub(cpu)).as_secs_f64() / n.max(1) as f64;
    (
        n as f64 / start.elapsed().as_secs_f64(),
        Duration::from_secs_f64(cpu),
    )
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

        if let Ok(path) = std::env::var("ATLS_BENCH_PROFILE") {
            let rate = match path.as_str() {
                "plain" => {
                    measure(&plain_uri, asterism_testkit::tls::h2_connector(), concurrency, 10.0)
                        .await
                }
                "one-way" => measure(&one_way_uri, one_way.clone(), concurrency, 10.0).await,
                "mutual" => measure(&mutual_uri, mutual.clone(), concurrency, 10.0).await,
                other => {
                    eprintln!("ATLS_BENCH_PROFILE={other}: want plain, one-way or mutual");
                    std::process::exit(2);
                }
            };
            println!("{path}: {:.0} conn/s", rate.0);
            return;
        }

        // The plain baseline trusts any server certificate but checks the handshake
        // signature, so both sides of the comparison do the same signature work.
        // Warm up every path once.
        measure(&plain_uri, asterism_testkit::tls::h2_connector(), 2, 0.3).await;
        measure(&one_way_uri, one_way.clone(), 2, 0.3).await;
        measure(&mutual_uri, mutual.clone(), 2, 0.3).await;

        // What each attesting side cannot avoid per connection: one evidence issued and one
        // verified, over a binding as fresh as a connection's.
        let binding = ReportData::atls(Role::Server, &[7; 32]);
        let evidence = server_issuer.issue(&binding).unwrap();
        let issue = per_call(|| {
            std::hint::black_box(server_issuer.issue(std::hint::black_box(&binding)).unwrap());
        });
        let verify = per_call(|| {
            std::hint::black_box(trust_server.validate(&evidence, &binding).unwrap());
        });
        let side = issue + verify;

        println!("atls_handshake: fresh TCP + TLS 1.3 connection + 1 gRPC unary call per iteration, loopback, {} worker threads", std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
        println!(
            "per attesting side, alone: issue {:.1} us + verify {:.1} us",
            issue.as_secs_f64() * 1e6,
            verify.as_secs_f64() * 1e6
        );
        let floor = |base: Duration, sides: u32| {
            base.as_secs_f64() / (base + side * sides).as_secs_f64()
        };
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        for conc in [1, concurrency] {
            let (a, a_cpu) =
                measure(&plain_uri, asterism_testkit::tls::h2_connector(), conc, secs).await;
            let (b, b_cpu) = measure(&one_way_uri, one_way.clone(), conc, secs).await;
            let (c, c_cpu) = measure(&mutual_uri, mutual.clone(), conc, secs).await;
            println!("concurrency {conc:>3}:");
            println!(
                "  (a) plain TLS 1.3 + call        {a:>9.0} conn/s   CPU {:>6.0} us/conn",
                us(a_cpu)
            );
            println!(
                "  (b) aTLS one-way (test issuer)  {b:>9.0} conn/s   CPU {:>6.0} us/conn   b/a = {:.2} (floor {:.2})",
                us(b_cpu),
                b / a,
                floor(a_cpu, 1)
            );
            println!(
                "  (c) aTLS mutual                 {c:>9.0} conn/s   CPU {:>6.0} us/conn   c/a = {:.2} (floor {:.2})",
                us(c_cpu),
                c / a,
                floor(a_cpu, 2)
            );
        }
    });
}

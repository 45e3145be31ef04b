//! `join_slow_tpm`: mutual-aTLS join tickets per second when the join service's TPM takes
//! 200 ms per quote, beside the same run with an undelayed swtpm.
//!
//! The join service attests to the nodes with an attested session key (docs/atls.md §4b)
//! whose quotes come from a real swtpm, through an issuer wrapper that sleeps before each
//! quote (the delayed runs) or not (the baseline). Every node is a fresh software-AK node
//! at its own address (`127.12.x.y`) that verifies the service's evidence (pinned swtpm
//! AK, PCRs 0–7) and asks for one join ticket over a fresh mutual-aTLS connection, with
//! `JOIN_SLOW_CONCURRENCY` joins in flight.
//!
//! Runs (each: a fresh cluster and join service, an unmeasured warm-up of 16 joins, which
//! includes the first quote, then K measured joins):
//! * (a) undelayed swtpm, refresh interval 60 s (the default);
//! * (b) 200 ms per quote, refresh interval 60 s;
//! * (c) 200 ms per quote, refresh interval 500 ms: several refreshes (and thus several
//!   slow quotes) fall inside the measured run.
//!
//! It prints tickets/s per round and the medians, the number of quotes, and the ratios
//! b/a and c/a (target: ≥ 0.9).
//!
//! Run: `cargo bench -p asterism-join-service --profile release --bench join_slow_tpm`
//! Environment: `JOIN_SLOW_JOINERS` (K, default 384), `JOIN_SLOW_CONCURRENCY` (default 16),
//! `JOIN_SLOW_ROUNDS` (interleaved rounds of a, b, c; medians are reported; default 3).

#![allow(
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    clippy::indexing_slicing
)]

#[path = "../tests/common/mod.rs"]
mod common;

use asterism_atls::{AtlsConfig, AtlsConnector, AtlsServer, Issuer, SessionKeyIssuer};
use asterism_attestation::{AkFingerprint, AkTrust, IssueError, ReportData, TpmQuoteValidator};
use asterism_join_service::{LIMITS, RedbState};
use asterism_metadata::{MetadataConfig, MetadataServer, Role};
use asterism_proto::join::IssueJoinTicketRequest;
use asterism_proto::join::api_client::ApiClient;
use asterism_soft_tpm::{SoftAk, SoftTpm};
use asterism_testkit::TpmNode;
use asterism_tpm::TpmIssuer;
use common::*;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::transport::Endpoint;

const WARM_UP: usize = 16;

/// The real swtpm issuer, slowed down by `delay` before every quote, counting quotes.
struct Delayed {
    inner: Arc<TpmIssuer>,
    delay: Duration,
    quotes: AtomicUsize,
}

impl Issuer for Delayed {
    fn variant(&self) -> &'static str {
        self.inner.variant()
    }
    fn issue(&self, rd: &ReportData) -> Result<Vec<u8>, IssueError> {
        self.quotes.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(self.delay);
        self.inner.issue(rd)
    }
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn node_ip(i: usize) -> String {
    format!("127.12.{}.{}", i / 200, i % 200 + 1)
}

struct Run {
    tickets_per_second: f64,
    quotes: usize,
}

async fn run(service_tpm: &TpmNode, delay: Duration, refresh: Duration) -> Run {
    let k = env_usize("JOIN_SLOW_JOINERS", 384);
    let concurrency = env_usize("JOIN_SLOW_CONCURRENCY", 16);
    let total = WARM_UP + k;
    let mut cluster = Cluster::start().await;

    // One worker instance per node, served by a metadata service of their own.
    let listener = TcpListener::bind("127.0.10.254:0").await.unwrap();
    cluster.metadata_url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let instances = (0..total)
        .map(|i| {
            asterism_testkit::metadata::instance(&format!("node-{i}"), Role::Worker, node_ip(i))
        })
        .collect();
    tokio::spawn(
        MetadataServer::new(MetadataConfig {
            instances,
            init_secret_hash: String::new(),
        })
        .serve(listener, stopped(stop_rx.clone())),
    );

    let mut pins: Vec<AkFingerprint> = Vec::new();
    let mut nodes: Vec<(Arc<dyn Issuer>, IssueJoinTicketRequest)> = Vec::new();
    for i in 0..total {
        let tpm = SoftTpm::new(SoftAk::generate_ecdsa_p256().unwrap());
        pins.push(tpm.ak().fingerprint());
        let disk = format!("{i:08x}-0000-4000-8000-000000000000");
        nodes.push((
            Arc::new(tpm),
            join_request(&format!("node-{i}"), &node_ip(i), &disk, false),
        ));
    }

    // The join service, attesting with a session key over the (delayed) swtpm.
    let delayed = Arc::new(Delayed {
        inner: service_tpm.issuer.clone(),
        delay,
        quotes: AtomicUsize::new(0),
    });
    let node_validator =
        TpmQuoteValidator::new(AkTrust::pinned(pins), zero_measurements().into_provider());
    let atls = AtlsServer::new(
        AtlsConfig::verifying(Arc::new(node_validator))
            .with_session_key(Arc::new(SessionKeyIssuer::new(delayed.clone(), refresh))),
    )
    .unwrap();
    let service = join_service(
        &cluster,
        RedbState::open(&cluster.state_dir()).unwrap(),
        Options::pinning(Vec::new()),
    );
    let listener = TcpListener::bind(format!("{CP}:0")).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let rx = stop_rx.clone();
    let grpc = tokio::spawn(async move {
        asterism_join_service::serve(listener, atls, service, &LIMITS, stopped(rx))
            .await
            .unwrap();
    });

    // The nodes verify the service: its pinned swtpm AK and PCRs 0–7.
    let service_validator = Arc::new(TpmQuoteValidator::new(
        service_tpm.ak_trust(),
        zero_measurements().into_provider(),
    ));
    let join_one = |(issuer, req): (Arc<dyn Issuer>, IssueJoinTicketRequest)| {
        let service_validator = service_validator.clone();
        async move {
            let local: IpAddr = req.host_certificate_principals[0].parse().unwrap();
            let connector =
                AtlsConnector::new(AtlsConfig::attesting(issuer).with_validator(service_validator))
                    .unwrap()
                    .from_address(local);
            let channel = Endpoint::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect_with_connector(connector)
                .await
                .unwrap();
            ApiClient::new(channel)
                .issue_join_ticket(req)
                .await
                .expect("join ticket");
        }
    };
    use futures::StreamExt as _;
    let measured = nodes.split_off(WARM_UP);
    futures::stream::iter(nodes)
        .map(join_one)
        .buffer_unordered(concurrency)
        .collect::<Vec<()>>()
        .await;
    let start = Instant::now();
    futures::stream::iter(measured)
        .map(join_one)
        .buffer_unordered(concurrency)
        .collect::<Vec<()>>()
        .await;
    let elapsed = start.elapsed();
    let _ = stop.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(15), grpc).await;
    Run {
        tickets_per_second: k as f64 / elapsed.as_secs_f64(),
        quotes: delayed.quotes.load(Ordering::SeqCst),
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let service = TpmNode::start().unwrap();
    let sixty = Duration::from_secs(60);
    let slow = Duration::from_millis(200);
    let rounds = env_usize("JOIN_SLOW_ROUNDS", 3);
    // Interleaved rounds, medians: the machine is shared, so a single run of each would
    // mostly measure what else ran at the time.
    let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        a.push(rt.block_on(run(&service, Duration::ZERO, sixty)));
        b.push(rt.block_on(run(&service, slow, sixty)));
        c.push(rt.block_on(run(&service, slow, Duration::from_millis(500))));
        println!(
            "round {round}: a {:.1}/s, b {:.1}/s, c {:.1}/s ({} quotes)",
            a[round].tickets_per_second,
            b[round].tickets_per_second,
            c[round].tickets_per_second,
            c[round].quotes
        );
    }
    let median = |runs: &[Run]| {
        let mut v: Vec<f64> = runs.iter().map(|r| r.tickets_per_second).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let quotes = |runs: &[Run]| runs.iter().map(|r| r.quotes).max().unwrap_or(0);
    let (ma, mb, mc) = (median(&a), median(&b), median(&c));
    println!("mutual-aTLS join tickets per second (join service attests with a session key),");
    println!("median of {rounds} interleaved rounds:");
    println!(
        "  (a) undelayed swtpm, refresh 60 s:   {ma:8.1}/s  (at most {} quotes per run)",
        quotes(&a)
    );
    println!(
        "  (b) quote +200 ms,   refresh 60 s:   {mb:8.1}/s  (at most {} quotes per run)",
        quotes(&b)
    );
    println!(
        "  (c) quote +200 ms,   refresh 500 ms: {mc:8.1}/s  (at most {} quotes per run)",
        quotes(&c)
    );
    println!(
        "  b/a = {:.3}, c/a = {:.3} (target >= 0.9)",
        mb / ma,
        mc / ma
    );
    drop(service);
}

//! End to end: an outsider without credentials opens hundreds of idle TCP connections to the
//! join service from one address (more than the listener's 512 pending-handshake slots).
//! A worker that boots meanwhile still joins, and the outsider's connections are closed:
//! those over the per-source limit at once, the others at the deadline for a peer that has
//! sent nothing.
//!
//! Real processes throughout: swtpm per node, the metadata service, bootstrappers,
//! `asterism init`, the key service and the join service.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use crate::common::{Teardown, bins, runtime};
use asterism_mini::LocalCluster;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt as _;
use tokio::net::TcpStream;

/// The join service port the bootstrappers dial.
const JOIN_PORT: u16 = 30090;
/// More idle connections than the listener has pending-handshake slots in all.
const IDLE_CONNECTIONS: usize = 520;

/// A TCP connection to `to` from `from` (port chosen by the kernel) that sends nothing.
async fn idle_connection(from: IpAddr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    socket.connect(to).await
}

/// Whether the server closed `stream` (end of file or a reset) within `within`.
async fn closed_by_server(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 64];
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            // The server never sends anything first; keep reading until it closes.
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

/// A plain HTTP/1.0 GET of the join service's local metrics endpoint.
fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut out = String::new();
    s.take(1 << 20).read_to_string(&mut out).unwrap();
    out
}

#[test]
fn idle_connections_from_one_address_do_not_keep_a_worker_out() {
    let tmp = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::create(&tmp.path().join("c"), 1, 35, bins()).unwrap();
    let _teardown = Teardown(&cluster);
    let rt = runtime();

    let (_done, cp) = rt.block_on(cluster.init()).unwrap();
    assert_eq!(cp.1, "ok", "the control-plane bootstrapper exits cleanly");
    cluster.start_key_service().unwrap();
    cluster.start_join_service().unwrap();

    // The outsider: an address of its own on the cluster's network, no credentials.
    let outsider: IpAddr = "127.0.35.200".parse().unwrap();
    let join: SocketAddr = format!("{}:{JOIN_PORT}", cluster.nodes[0].ip)
        .parse()
        .unwrap();
    let flood = || {
        rt.block_on(async {
            let mut out = Vec::new();
            for _ in 0..IDLE_CONNECTIONS {
                // The kernel completes the TCP handshake from the listen backlog whether or
                // not the service accepts, so every connect succeeds.
                out.push(idle_connection(outsider, join).await.unwrap());
            }
            out
        })
    };

    // None of the outsider's connections is kept: over the per-source limit they are closed
    // at once, within it at the deadline for a peer that sends nothing (5 s). Without these
    // limits they would hold every pending-handshake slot until the 30 s handshake deadline.
    let mut idle = flood();
    rt.block_on(async {
        for (i, stream) in idle.iter_mut().enumerate() {
            assert!(
                closed_by_server(stream, Duration::from_secs(20)).await,
                "idle connection {i} is still open"
            );
        }
    });
    drop(idle);

    // The join service counts both kinds of refusal in its metrics.
    let metrics = http_get(&cluster.metrics_addr(), "/metrics");
    for reason in ["source_limit", "silent_peer"] {
        assert!(
            metrics.contains(&format!(
                "asterism_join_atls_refusals_total{{reason=\"{reason}\"}}"
            )),
            "no {reason} refusals in the metrics:\n{metrics}"
        );
    }

    // A worker that boots while the outsider floods again still joins.
    let idle = flood();
    let worker = &cluster.nodes[1];
    let booting = cluster.start_bootstrapper(worker).unwrap();
    let (_, exit) = rt
        .block_on(cluster.finish_bootstrapper(booting, worker))
        .unwrap();
    assert_eq!(
        exit, "ok",
        "the worker joins while the outsider holds {IDLE_CONNECTIONS} connections"
    );
    let members = cluster.members().to_string();
    assert!(members.contains("worker-0"), "{members}");
    drop(idle);
}

//! The InitServer's limits on unauthenticated callers: per address, connections (each
//! costs a TPM quote in the handshake) and Init calls (each costs a bcrypt check) are held
//! to a burst and then a rate; other addresses are still served.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::common::init_helpers::*;
use crate::common::*;
use asterism_atls::{AtlsConfig, AtlsConnector};
use asterism_bootstrapper::LogBuffer;
use asterism_bootstrapper::limits::InitLimits;
use asterism_testkit::net::tcp_from;
use tonic::transport::{Channel, Endpoint};

/// Three per address, then one a minute (no refill during the test).
fn tight() -> InitLimits {
    InitLimits {
        max_in_flight: 4,
        max_pending_handshakes: 16,
        per_peer_in_flight: 2,
        per_peer_burst: 3,
        per_peer_interval: Duration::from_secs(60),
    }
}

/// An aTLS channel to `t`'s InitServer from the source address `src`, verifying the node.
async fn connect_from(t: &TestNode, src: &str) -> Result<Channel, tonic::transport::Error> {
    let connector = AtlsConnector::new(AtlsConfig::verifying(t.validator()))
        .unwrap()
        .from_address(src.parse().unwrap());
    let addr = SocketAddr::new(t.ip, t.init_port());
    Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(10))
        .connect_with_connector(connector)
        .await
}

/// Waits until the InitServer accepts TCP connections (probing from `probe`, an address
/// of its own so the probes do not count against the test's addresses).
async fn wait_listening(t: &TestNode, probe: &str) {
    let addr = SocketAddr::new(t.ip, t.init_port());
    for _ in 0..600 {
        if tcp_from(probe.parse().unwrap(), addr).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the InitServer does not listen");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connections_and_init_calls_from_one_address_are_held_to_its_burst() {
    let t = TestNode::new("127.0.15.1");
    let node = t.node_configured(
        metadata(&t),
        TestNode::none_driver(),
        1,
        None,
        LogBuffer::default(),
        |c| c.init_limits = tight(),
    );
    let _run = tokio::spawn(t.run(node, std::future::pending()));
    wait_listening(&t, "127.0.15.9").await;

    // Connections: three from one address are served, the fourth is closed before its
    // handshake; another address is still served.
    // (The server finishes a handshake a little after the client: a connection made at
    // once after another may find the address's two handshake slots still taken, which
    // costs it no token; it is tried again.)
    let mut channels = Vec::new();
    for i in 0..3 {
        let mut tries = 0;
        let channel = loop {
            match connect_from(&t, "127.0.15.2").await {
                Ok(channel) => break channel,
                Err(e) if tries < 50 => {
                    tries += 1;
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("connection {i}: {e:?}"),
            }
        };
        channels.push(channel);
    }
    // Every handshake slot is free again; only the burst is used up.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        connect_from(&t, "127.0.15.2").await.is_err(),
        "a fourth connection from the same address is refused"
    );
    let other = connect_from(&t, "127.0.15.3").await.unwrap();

    // Init calls: three bcrypt checks per address, then RESOURCE_EXHAUSTED, on one
    // connection as on several.
    let channel = channels.pop().unwrap();
    for _ in 0..3 {
        let refused = init(channel.clone(), request(b"wrong secret"))
            .await
            .unwrap();
        assert_eq!(failure_of(&refused).as_deref(), Some("invalid init secret"));
    }
    let status = init(channel.clone(), request(b"wrong secret"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    let status = init(channels.pop().unwrap(), request(INIT_SECRET))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert_eq!(t.pcr15(), [0; 32], "nothing happened");

    // The owner, calling from another address, initialises the node.
    let responses = init(other, request(INIT_SECRET)).await.unwrap();
    assert!(
        matches!(
            responses.first().and_then(|r| r.kind.as_ref()),
            Some(asterism_proto::init::init_response::Kind::InitSuccess(_))
        ),
        "{responses:?}"
    );
}

/// A flood from more addresses than the per-source table holds, each connecting and
/// closing at once (what keeps the table full of recent sources), does not keep the owner
/// out: the sources seen longest ago make room, and the owner's new address is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_from_more_addresses_than_the_table_holds_does_not_keep_the_owner_out() {
    use asterism_bootstrapper::limits::MAX_PEERS;
    use futures::StreamExt as _;
    let t = TestNode::new("127.0.16.1");
    let node = t.node_configured(
        metadata(&t),
        TestNode::none_driver(),
        1,
        None,
        LogBuffer::default(),
        |_| {},
    );
    let _run = tokio::spawn(t.run(node, std::future::pending()));
    wait_listening(&t, "127.0.16.9").await;

    let addr = SocketAddr::new(t.ip, t.init_port());
    let connected = std::sync::atomic::AtomicUsize::new(0);
    futures::stream::iter(0..MAX_PEERS + MAX_PEERS / 4)
        .for_each_concurrent(32, |i| {
            let connected = &connected;
            async move {
                let src = IpAddr::from([127, 17, (i / 250) as u8, (i % 250 + 1) as u8]);
                if tcp_from(src, addr).await.is_ok() {
                    connected.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        })
        .await;
    assert!(
        connected.into_inner() > MAX_PEERS,
        "the flood came from more sources than the table holds"
    );

    let owner = connect_from(&t, "127.0.16.2").await.unwrap();
    let responses = init(owner, request(INIT_SECRET)).await.unwrap();
    assert!(
        matches!(
            responses.first().and_then(|r| r.kind.as_ref()),
            Some(asterism_proto::init::init_response::Kind::InitSuccess(_))
        ),
        "{responses:?}"
    );
}

//! The metadata service and client over real loopback sockets. Clients bind to
//! `127.0.10.x` source addresses, so `/self` matching by source address is exercised for
//! real.

#![cfg(test)] // all of it test code: clippy.toml's test allowances cover its helpers too

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use asterism_metadata::{
    HttpMetadata, MAX_RESPONSE_LEN, Metadata, MetadataConfig, MetadataError, MetadataServer, Role,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use asterism_testkit::metadata::instance;

fn config() -> MetadataConfig {
    MetadataConfig {
        instances: vec![
            instance("cp-0", Role::ControlPlane, "127.0.10.1"),
            instance("worker-0", Role::Worker, "127.0.10.2"),
            instance("worker-1", Role::Worker, "127.0.10.3"),
        ],
        init_secret_hash: "$2b$10$0123456789012345678901uJ3d4f5g6h7j8k9l0z1x2c3v4b5n6m".into(),
    }
}

struct Running {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Running {
    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
}

async fn start(config: MetadataConfig) -> Running {
    let listener = TcpListener::bind("127.0.10.254:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = oneshot::channel();
    let task = tokio::spawn(MetadataServer::new(config).serve(listener, async {
        let _ = rx.await;
    }));
    Running {
        addr,
        stop: Some(tx),
        task,
    }
}

fn client(addr: SocketAddr, from: &str) -> HttpMetadata {
    plain_client(addr).with_local_address(from.parse::<IpAddr>().unwrap())
}

/// A client of the server at `addr`, from any local address.
fn plain_client(addr: SocketAddr) -> HttpMetadata {
    HttpMetadata::new(&format!("http://{addr}")).unwrap()
}

/// The error of a listing from a server that answers with `response` (`None`: never).
async fn list_error(response: Option<Vec<u8>>) -> MetadataError {
    let addr = raw_server(response).await;
    plain_client(addr).list().await.unwrap_err()
}

#[tokio::test]
async fn self_answers_each_node_with_its_own_record_by_source_address() {
    let server = start(config()).await;
    for (from, name, role) in [
        ("127.0.10.1", "cp-0", Role::ControlPlane),
        ("127.0.10.2", "worker-0", Role::Worker),
        ("127.0.10.3", "worker-1", Role::Worker),
    ] {
        let me = client(server.addr, from).self_instance().await.unwrap();
        assert_eq!((me.name.as_str(), me.role), (name, role), "from {from}");
        assert_eq!(me.vpc_ip, from);
    }
    server.stop().await;
}

#[tokio::test]
async fn self_from_an_address_outside_the_metadata_is_not_found() {
    let server = start(config()).await;
    let err = client(server.addr, "127.0.10.77")
        .self_instance()
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err:?}");
    server.stop().await;
}

#[tokio::test]
async fn peers_endpoint_and_init_secret_hash_round_trip() {
    let server = start(config()).await;
    let c = client(server.addr, "127.0.10.2");
    assert_eq!(c.list().await.unwrap(), config().instances);
    assert_eq!(c.control_plane_endpoint().await.unwrap(), "127.0.10.1");
    assert_eq!(
        c.init_secret_hash().await.unwrap(),
        config().init_secret_hash
    );
    server.stop().await;
}

#[tokio::test]
async fn endpoint_without_a_control_plane_is_not_found() {
    let mut cfg = config();
    cfg.instances.retain(|i| i.role == Role::Worker);
    let server = start(cfg).await;
    let err = client(server.addr, "127.0.10.2")
        .control_plane_endpoint()
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err:?}");
    server.stop().await;
}

/// A one-shot raw HTTP server that answers the first request with `response` (or never,
/// when `None`).
async fn raw_server(response: Option<Vec<u8>>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 4096];
        let _ = s.read(&mut buf).await;
        match response {
            Some(r) => {
                let _ = s.write_all(&r).await;
                let _ = s.shutdown().await;
            }
            None => tokio::time::sleep(Duration::from_secs(30)).await,
        }
    });
    addr
}

#[tokio::test]
async fn the_client_checks_the_http_status_unlike_the_original() {
    let body = r#"{"Name":"evil","VPCIP":"127.0.0.1"}"#;
    let addr = raw_server(Some(
        format!(
            "HTTP/1.1 500 Internal Server Error\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    ))
    .await;
    let err = plain_client(addr).self_instance().await.unwrap_err();
    assert!(
        matches!(err, MetadataError::Status { status: 500, .. }),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_response_above_one_mebibyte_is_refused_declared_or_streamed() {
    let big = vec![b' '; MAX_RESPONSE_LEN + 1];
    let mut declared =
        format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", big.len()).into_bytes();
    declared.extend_from_slice(&big);
    let err = list_error(Some(declared)).await;
    assert!(matches!(err, MetadataError::BodyTooLarge { .. }), "{err:?}");

    // Without a length: the body is read until the connection closes, and cut at the cap.
    let mut streamed = b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n".to_vec();
    streamed.extend_from_slice(&big);
    let err = list_error(Some(streamed)).await;
    assert!(matches!(err, MetadataError::BodyTooLarge { .. }), "{err:?}");
}

#[tokio::test]
async fn a_silent_server_hits_the_deadline() {
    let addr = raw_server(None).await;
    let err = plain_client(addr)
        .with_timeout(Duration::from_millis(300))
        .list()
        .await
        .unwrap_err();
    assert!(matches!(err, MetadataError::Timeout { .. }), "{err:?}");
}

#[tokio::test]
async fn malformed_json_is_a_decode_error() {
    let err = list_error(Some(
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n[1,2]".to_vec(),
    ))
    .await;
    assert!(matches!(err, MetadataError::Decode { .. }), "{err:?}");
}

#[test]
fn only_plain_http_urls_are_accepted() {
    for bad in [
        "https://127.0.0.1:1",
        "127.0.0.1:8080",
        "http://",
        "http://h:1/?q=1",
    ] {
        assert!(HttpMetadata::new(bad).is_err(), "{bad}");
    }
    assert!(HttpMetadata::new("http://127.0.10.254:8080/").is_ok());
}

/// Opens a keep-alive connection from `from` and asks for `/self` on it; the stream and
/// whether an answer came.
async fn ask_from(addr: SocketAddr, from: &str) -> (tokio::net::TcpStream, bool) {
    let mut tcp = asterism_testkit::net::tcp_from(from.parse().unwrap(), addr)
        .await
        .unwrap();
    tcp.write_all(b"GET /self HTTP/1.1\r\nhost: m\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 12];
    let answered = matches!(
        tokio::time::timeout(Duration::from_secs(5), tcp.read_exact(&mut buf)).await,
        Ok(Ok(_)) if buf.starts_with(b"HTTP/1.1 ")
    );
    (tcp, answered)
}

/// One source holding connections cannot take the service from the others: it holds at
/// most `MAX_CONNECTIONS_PER_SOURCE`, the next one is closed, another source is answered,
/// and a closed connection gives its share back.
#[tokio::test]
async fn one_source_holds_a_bounded_share_of_the_connections() {
    use asterism_metadata::MAX_CONNECTIONS_PER_SOURCE;
    let server = start(config()).await;
    let mut held = Vec::new();
    for i in 0..MAX_CONNECTIONS_PER_SOURCE {
        let (tcp, answered) = ask_from(server.addr, "127.0.10.2").await;
        assert!(answered, "connection {i} of the source was answered");
        held.push(tcp);
    }
    let (_over, answered) = ask_from(server.addr, "127.0.10.2").await;
    assert!(
        !answered,
        "a connection beyond the source's share was answered"
    );
    let (_other, answered) = ask_from(server.addr, "127.0.10.3").await;
    assert!(answered, "another source was answered");
    drop(held.pop());
    let mut again = false;
    for _ in 0..50 {
        if ask_from(server.addr, "127.0.10.2").await.1 {
            again = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(again, "the source got its share back");
    drop(held);
    server.stop().await;
}

//! The key service over real gRPC, in process: over a Unix socket and over TCP loopback.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::common::*;
use asterism_key_service::{
    BindError, KeyService, LIMITS, Limits, Listener, MAX_KEY_LEN, SocketError, serve,
};
use asterism_kms::KeyServiceAddress;
use asterism_kms::{ClusterKms, MasterSecret, Salt};
use asterism_proto::kms::api_client::ApiClient;
use futures::StreamExt as _;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::Code;
use tonic::transport::server::Connected;
use tonic::transport::{Endpoint, Uri};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const TIMEOUT: Duration = Duration::from_secs(5);

fn zero_kms() -> KeyService {
    KeyService::new(ClusterKms::new(
        MasterSecret::new(vec![0; 32]).unwrap(),
        Salt::new(vec![0; 32]).unwrap(),
    ))
}

/// A running server and the means to stop it.
struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), asterism_key_service::ServeError>>,
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(TIMEOUT, self.task)
            .await
            .expect("server did not stop")
            .unwrap()
            .unwrap();
    }
}

fn spawn(listener: Listener, limits: Limits) -> Running {
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        listener
            .serve(zero_kms(), &limits, async {
                let _ = stopped.await;
            })
            .await
    });
    Running { stop, task }
}

async fn start_unix(dir: &Path, limits: Limits) -> (PathBuf, Running) {
    let path = dir.join("key-service.sock");
    let listener = Listener::bind(&KeyServiceAddress::Unix(path.clone()))
        .await
        .unwrap();
    (path, spawn(listener, limits))
}

async fn assert_reference_keys(client: &mut ApiClient<tonic::transport::Channel>) {
    assert_eq!(
        get_key_hex(client, "measurementSecret").await,
        MEASUREMENT_SECRET_ZERO
    );
    assert_eq!(get_key_hex(client, ZERO_UUID).await, DISK_KEY_ZERO);
    assert_eq!(
        get_key_hex(client, "ca_emergency_ssh").await,
        SSH_CA_SEED_ZERO
    );
}

#[tokio::test]
async fn unix_socket_serves_the_reference_keys() {
    let dir = tempfile::tempdir().unwrap();
    let (path, server) = start_unix(dir.path(), LIMITS).await;
    let mut client = ApiClient::new(unix_channel(&path, TIMEOUT).await);
    assert_reference_keys(&mut client).await;
    drop(client);
    server.stop().await;
    assert!(!path.exists(), "the socket file is removed on shutdown");
}

#[tokio::test]
async fn a_loopback_tcp_listener_is_refused() {
    // Plaintext on TCP, even loopback, would let any local user derive every key.
    let err = Listener::bind(&KeyServiceAddress::Tcp("127.0.0.1:0".parse().unwrap()))
        .await
        .unwrap_err();
    assert!(
        matches!(err, asterism_key_service::BindError::PlaintextTcp { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("unix:"), "{err}");
}

#[tokio::test]
async fn serve_accepts_any_connection_stream() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(serve(TcpListenerStream::new(listener), zero_kms(), async {
        let _ = stopped.await;
    }));
    assert_serves_the_zero_secrets(tcp_channel(addr, TIMEOUT).await).await;
    let _ = stop.send(());
    tokio::time::timeout(TIMEOUT, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// An in-memory connection with its own connection info, standing in for a wrapped (for
/// instance attested-TLS) stream.
struct Pipe(tokio::io::DuplexStream);

#[derive(Clone)]
struct PipeInfo;

impl Connected for Pipe {
    type ConnectInfo = PipeInfo;

    fn connect_info(&self) -> PipeInfo {
        PipeInfo
    }
}

impl AsyncRead for Pipe {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Pipe {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

#[tokio::test]
async fn serve_accepts_wrapped_connections_with_their_own_connect_info() {
    let (connections, incoming) = tokio::sync::mpsc::channel::<Pipe>(4);
    let incoming =
        tokio_stream::wrappers::ReceiverStream::new(incoming).map(Ok::<_, std::io::Error>);
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(serve(incoming, zero_kms(), async {
        let _ = stopped.await;
    }));
    let channel = Endpoint::from_static("http://pipe.invalid")
        .timeout(TIMEOUT)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let connections = connections.clone();
            async move {
                let (client, server) = tokio::io::duplex(64 * 1024);
                connections
                    .send(Pipe(server))
                    .await
                    .map_err(|_| std::io::Error::other("server gone"))?;
                Ok::<_, std::io::Error>(TokioIo::new(client))
            }
        }))
        .await
        .unwrap();
    assert_serves_the_zero_secrets(channel).await;
    let _ = stop.send(());
    tokio::time::timeout(TIMEOUT, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn upper_case_disk_uuid_gives_the_same_key() {
    let dir = tempfile::tempdir().unwrap();
    let (path, server) = start_unix(dir.path(), LIMITS).await;
    let mut client = ApiClient::new(unix_channel(&path, TIMEOUT).await);
    let lower = get_key_hex(&mut client, "abcdef01-2345-6789-abcd-ef0123456789").await;
    let upper = get_key_hex(&mut client, "ABCDEF01-2345-6789-ABCD-EF0123456789").await;
    assert_eq!(lower, upper);
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn bad_requests_get_invalid_argument() {
    let dir = tempfile::tempdir().unwrap();
    let (path, server) = start_unix(dir.path(), LIMITS).await;
    let mut client = ApiClient::new(unix_channel(&path, TIMEOUT).await);

    let max = u32::try_from(MAX_KEY_LEN).unwrap();
    for (id, length) in [
        ("", 32),
        ("measurementSecret", 0),
        ("measurementSecret", max + 1),
        ("", 0),
        ("has space", 32),
    ] {
        let status = get_key(&mut client, id, length).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{id:?} {length}");
    }
    let too_long = "a".repeat(257);
    let status = get_key(&mut client, &too_long, 32).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        !status.message().contains(&too_long),
        "the ID is not echoed"
    );

    // The edges of the accepted range work.
    assert_eq!(
        get_key(&mut client, "measurementSecret", 1)
            .await
            .unwrap()
            .len(),
        1
    );
    let long = get_key(&mut client, "measurementSecret", max)
        .await
        .unwrap();
    assert_eq!(long.len(), 4096);
    // HKDF output is a prefix-stable stream for the same info.
    assert_eq!(hex::encode(&long[..32]), MEASUREMENT_SECRET_ZERO);
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn oversized_request_is_refused_before_the_handler() {
    let dir = tempfile::tempdir().unwrap();
    let (path, server) = start_unix(dir.path(), LIMITS).await;
    let mut client = ApiClient::new(unix_channel(&path, TIMEOUT).await);
    // Over the 4 KiB message cap: refused by the decoder (OutOfRange), so the handler
    // (which would say InvalidArgument) never sees it.
    let status = get_key(&mut client, &"a".repeat(5000), 32)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn health_service_reports_kms_api_serving() {
    let dir = tempfile::tempdir().unwrap();
    let (path, server) = start_unix(dir.path(), LIMITS).await;
    let mut health = HealthClient::new(unix_channel(&path, TIMEOUT).await);
    for service in ["kms.API", ""] {
        let status = health
            .check(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .unwrap()
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::Serving as i32, "{service:?}");
    }
    let unknown = health
        .check(HealthCheckRequest {
            service: "nope.API".to_owned(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    drop(health);
    server.stop().await;
}

#[tokio::test]
async fn unix_socket_is_created_with_mode_0600() {
    let dir = tempfile::tempdir().unwrap();
    // A permissive parent directory: the socket's own mode must protect it.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let (path, server) = start_unix(dir.path(), LIMITS).await;
    let meta = std::fs::symlink_metadata(&path).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    // No staging directory is left behind.
    let entries: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    server.stop().await;
}

#[tokio::test]
async fn stale_socket_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("key-service.sock");
    // A socket whose server is gone.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let listener = Listener::bind(&KeyServiceAddress::Unix(path.clone()))
        .await
        .unwrap();
    let server = spawn(listener, LIMITS);
    assert_serves_the_zero_secrets(unix_channel(&path, TIMEOUT).await).await;
    server.stop().await;
}

#[tokio::test]
async fn a_file_that_is_not_a_socket_is_never_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("key-service.sock");
    std::fs::write(&path, b"precious").unwrap();
    let err = Listener::bind(&KeyServiceAddress::Unix(path.clone()))
        .await
        .unwrap_err();
    assert!(
        matches!(err, BindError::Socket(SocketError::NotASocket(_))),
        "{err}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), b"precious");
}

#[tokio::test]
async fn a_live_socket_is_never_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let (path, server) = start_unix(dir.path(), LIMITS).await;
    let err = Listener::bind(&KeyServiceAddress::Unix(path.clone()))
        .await
        .unwrap_err();
    assert!(
        matches!(err, BindError::Socket(SocketError::InUse(_))),
        "{err}"
    );
    // The first server still answers.
    assert_serves_the_zero_secrets(unix_channel(&path, TIMEOUT).await).await;
    server.stop().await;
}

#[tokio::test]
async fn connections_beyond_the_limit_wait_for_a_free_slot() {
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits {
        max_connections: Some(1),
        ..LIMITS
    };
    let (path, server) = start_unix(dir.path(), limits).await;

    let mut first = ApiClient::new(unix_channel(&path, TIMEOUT).await);
    get_key(&mut first, "measurementSecret", 32).await.unwrap();

    // The first connection holds the only slot: the second is not served.
    let mut second = ApiClient::new(unix_channel(&path, Duration::from_millis(300)).await);
    let status = get_key(&mut second, "measurementSecret", 32)
        .await
        .unwrap_err();
    assert!(
        matches!(
            status.code(),
            Code::Cancelled | Code::DeadlineExceeded | Code::Unavailable
        ),
        "{status:?}"
    );

    // Once both are gone (the waiting second one took the slot when the first left), a
    // new connection is served.
    drop(first);
    drop(second);
    let mut third = ApiClient::new(unix_channel(&path, TIMEOUT).await);
    assert_eq!(
        get_key_hex(&mut third, "measurementSecret").await,
        MEASUREMENT_SECRET_ZERO
    );
    drop(third);
    server.stop().await;
}

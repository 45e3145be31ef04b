//! Helpers shared by the integration tests: clients and the reference key values.

// Not every test binary uses every helper.
#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use asterism_atls::{AtlsConfig, AtlsConnector, Issuer};
use asterism_testkit::process::{Process, free_port};

use asterism_proto::kms::GetDataKeyRequest;
use asterism_proto::kms::api_client::ApiClient;
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

/// `HKDF(00*32, 00*32, "key-measurementSecret", 32)`.
pub const MEASUREMENT_SECRET_ZERO: &str =
    "54d67b1d917d3464757d9b699f3ee416c209a2270e3876da90535e4108898cdd";
/// `HKDF(00*32, 00*32, "key-00000000-0000-0000-0000-000000000000", 32)`.
pub const DISK_KEY_ZERO: &str = "2b5c829f691bfd4232f8aac464bccc07e605c7c8e82cbca09837e86d0b6d0665";
/// `HKDF(00*32, 00*32, "key-ca_emergency_ssh", 32)`.
pub const SSH_CA_SEED_ZERO: &str =
    "9e713c43390b642211dac2251376b4ac901635b197ccd2288393cc61bb73e127";
/// The disk UUID of [`DISK_KEY_ZERO`].
pub const ZERO_UUID: &str = "00000000-0000-0000-0000-000000000000";

/// A channel over the Unix socket at `path`.
pub async fn unix_channel(path: &Path, timeout: Duration) -> Channel {
    let path: PathBuf = path.to_owned();
    Endpoint::from_static("http://key-service.invalid")
        .timeout(timeout)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await
        .unwrap()
}

/// A channel to `http://ADDR`.
pub async fn tcp_channel(addr: std::net::SocketAddr, timeout: Duration) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .timeout(timeout)
        .connect()
        .await
        .unwrap()
}

/// Asks for `length` bytes of key `id`.
pub async fn get_key(
    client: &mut ApiClient<Channel>,
    id: &str,
    length: u32,
) -> Result<Vec<u8>, tonic::Status> {
    client
        .get_data_key(GetDataKeyRequest {
            data_key_id: id.to_owned(),
            length,
        })
        .await
        .map(|r| r.into_inner().data_key)
}

/// Asks for 32 bytes of key `id` and returns them as hex.
pub async fn get_key_hex(client: &mut ApiClient<Channel>, id: &str) -> String {
    hex::encode(get_key(client, id, 32).await.unwrap())
}

/// The service behind `channel` answers with the measurement secret of the zero secrets.
pub async fn assert_serves_the_zero_secrets(channel: Channel) {
    let mut client = ApiClient::new(channel);
    assert_eq!(
        get_key_hex(&mut client, "measurementSecret").await,
        MEASUREMENT_SECRET_ZERO
    );
}

/// A directory with a master secret and a salt of 32 zero bytes, both mode 0600: the
/// secrets the `*_ZERO` keys are derived from.
pub struct Secrets {
    pub dir: tempfile::TempDir,
    pub master_secret: PathBuf,
    pub salt: PathBuf,
}

pub fn secrets() -> Secrets {
    let dir = tempfile::tempdir().unwrap();
    let master_secret = write_secret(dir.path(), "mastersecret", &[0; 32], 0o600);
    let salt = write_secret(dir.path(), "salt", &[0; 32], 0o600);
    Secrets {
        dir,
        master_secret,
        salt,
    }
}

/// Writes `contents` to `dir/name` with `mode`.
pub fn write_secret(dir: &Path, name: &str, contents: &[u8], mode: u32) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

/// The key-service program serving attested TLS on a free loopback port, with `secrets`
/// and `verify_clients` (the flags that say how it checks its clients); and its address.
pub fn start_atls_key_service(secrets: &Secrets, verify_clients: &[&str]) -> (Process, String) {
    let addr = format!("127.0.0.1:{}", free_port("127.0.0.1"));
    let child = Process::spawn(
        Command::new(env!("CARGO_BIN_EXE_asterism-key-service"))
            .arg("--master-secret-file")
            .arg(&secrets.master_secret)
            .arg("--salt-file")
            .arg(&secrets.salt)
            .args(["--atls-listen", &addr])
            .args(verify_clients)
            .stdout(Stdio::null()),
    );
    (child, addr)
}

/// A channel to the key service at `addr` over attested TLS, attesting with `issuer`.
pub async fn attested_channel(
    addr: &str,
    issuer: Arc<dyn Issuer>,
) -> Result<Channel, tonic::transport::Error> {
    let connector = AtlsConnector::new(AtlsConfig::attesting(issuer)).unwrap();
    Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_with_connector(connector)
        .await
}

/// [`attested_channel`], tried again every 50 ms while the service starts, for at most
/// 20 s; then why it failed.
pub async fn attested_channel_once_up(
    addr: &str,
    issuer: Arc<dyn Issuer>,
) -> Result<Channel, String> {
    let start = Instant::now();
    loop {
        match attested_channel(addr, issuer.clone()).await {
            Ok(channel) => return Ok(channel),
            Err(_) if start.elapsed() < Duration::from_secs(20) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(format!("no attested connection to the key service: {e:?}")),
        }
    }
}

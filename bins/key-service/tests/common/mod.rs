//! Helpers shared by the integration tests: clients and the reference key values.

// Not every test binary uses every helper; helpers may fail loudly.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::time::Duration;

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

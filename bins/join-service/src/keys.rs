//! Where the join service gets data keys: the key service, over gRPC on a Unix socket (or
//! a loopback address), behind the [`KeySource`] trait.

use asterism_kms::{DataKey, KeyId};
use asterism_proto::kms::GetDataKeyRequest;
use asterism_proto::kms::api_client::ApiClient;
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;
use tonic::transport::{Channel, Endpoint, Uri};

/// Deadline of one key-service call.
pub const KEY_CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Key-service calls in flight at once; more wait their turn. At most the key service's
/// streams per connection (16 by default): until its HTTP/2 settings arrive on a new
/// connection, the client does not know that limit, and the streams of a burst over it
/// would be refused (`UNAVAILABLE` for those tickets).
pub const KEY_CALLS_IN_FLIGHT: usize = 16;

/// Why a data key could not be obtained.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The key service cannot be reached, or did not answer in time.
    #[error("the key service is unavailable: {0}")]
    Unavailable(String),
    /// The key service refused or failed.
    #[error("the key service answered {code:?}: {message}")]
    Failed {
        /// The gRPC status code.
        code: tonic::Code,
        /// Its message.
        message: String,
    },
    /// The answer was not a key of the requested length.
    #[error("the key service returned {got} bytes instead of {want}")]
    Length {
        /// Requested.
        want: usize,
        /// Received.
        got: usize,
    },
}

/// A source of data keys.
pub trait KeySource: Send + Sync + 'static {
    /// `len` bytes of the data key `id`.
    fn data_key(
        &self,
        id: &KeyId,
        len: usize,
    ) -> impl Future<Output = Result<DataKey, KeyError>> + Send;
}

/// Where the key service listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyServiceAddress {
    /// `unix:/path/to.sock`.
    Unix(PathBuf),
    /// `http://IP:PORT` (plaintext; loopback only makes sense).
    Http(String),
}

impl std::str::FromStr for KeyServiceAddress {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("unix: needs a path".into());
            }
            Ok(Self::Unix(PathBuf::from(path)))
        } else if s.starts_with("http://") {
            Ok(Self::Http(s.to_owned()))
        } else {
            Err(format!(
                "{s:?} is neither unix:/path/to.sock nor http://IP:PORT"
            ))
        }
    }
}

/// A client of the key service (`/kms.API/GetDataKey`). The connection is made lazily and
/// re-made after failures, so the join service starts before the key service does.
#[derive(Debug, Clone)]
pub struct KeyServiceClient {
    client: ApiClient<Channel>,
}

impl KeyServiceClient {
    /// A client for the key service at `address`; every call has [`KEY_CALL_TIMEOUT`].
    pub fn new(address: &KeyServiceAddress) -> Result<Self, KeyError> {
        let channel = match address {
            KeyServiceAddress::Unix(path) => {
                let path = path.clone();
                Endpoint::from_static("http://key-service.invalid")
                    .timeout(KEY_CALL_TIMEOUT)
                    .connect_timeout(KEY_CALL_TIMEOUT)
                    .concurrency_limit(KEY_CALLS_IN_FLIGHT)
                    .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                        let path = path.clone();
                        async move {
                            let stream = tokio::net::UnixStream::connect(path).await?;
                            Ok::<_, std::io::Error>(TokioIo::new(stream))
                        }
                    }))
            }
            KeyServiceAddress::Http(url) => Endpoint::from_shared(url.clone())
                .map_err(|e| KeyError::Unavailable(e.to_string()))?
                .timeout(KEY_CALL_TIMEOUT)
                .connect_timeout(KEY_CALL_TIMEOUT)
                .concurrency_limit(KEY_CALLS_IN_FLIGHT)
                .connect_lazy(),
        };
        Ok(Self {
            client: ApiClient::new(channel).max_decoding_message_size(8 * 1024),
        })
    }
}

impl KeySource for KeyServiceClient {
    async fn data_key(&self, id: &KeyId, len: usize) -> Result<DataKey, KeyError> {
        let length = u32::try_from(len).map_err(|_| KeyError::Length { want: len, got: 0 })?;
        let request = GetDataKeyRequest {
            data_key_id: id.as_str().to_owned(),
            length,
        };
        let mut client = self.client.clone();
        let call = client.get_data_key(request);
        let response = tokio::time::timeout(KEY_CALL_TIMEOUT, call)
            .await
            .map_err(|_| KeyError::Unavailable(format!("no answer within {KEY_CALL_TIMEOUT:?}")))?
            .map_err(|status| match status.code() {
                tonic::Code::Unavailable
                | tonic::Code::DeadlineExceeded
                | tonic::Code::Cancelled
                | tonic::Code::Unknown => KeyError::Unavailable(status.message().to_owned()),
                code => KeyError::Failed {
                    code,
                    message: status.message().to_owned(),
                },
            })?;
        let bytes = response.into_inner().data_key;
        if bytes.len() != len {
            return Err(KeyError::Length {
                want: len,
                got: bytes.len(),
            });
        }
        DataKey::new(bytes).map_err(|_| KeyError::Length { want: len, got: 0 })
    }
}

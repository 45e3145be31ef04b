//! The key-service client (`/kms.API/GetDataKey`), with every check on the answer: a key
//! of exactly the requested length, within a deadline, from a bounded message.
//!
//! It needs tonic and a tokio runtime, so it is behind the `client` feature: the rest of
//! this crate stays free of both.

use std::path::PathBuf;
use std::time::Duration;

use asterism_proto::kms::api_client::ApiClient;
use asterism_proto::kms::{GetControlPlaneIdentityRequest, GetDataKeyRequest};
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::MAX_KEY_LEN;
use crate::address::KeyServiceAddress;
use crate::key_id::KeyId;
use crate::secret::DataKey;

/// Deadline of one key-service call.
pub const KEY_CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Key-service calls in flight at once on one client; more wait their turn. At most the key
/// service's streams per connection (16 by default): until its HTTP/2 settings arrive on a
/// new connection, the client does not know that limit, and the streams of a burst over it
/// would be refused (`UNAVAILABLE`).
pub const KEY_CALLS_IN_FLIGHT: usize = 16;
/// Largest answer decoded: a key of [`MAX_KEY_LEN`] bytes and its framing fit with room.
const MAX_ANSWER_LEN: usize = 8 * 1024;

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
    /// The requested length is zero or above [`MAX_KEY_LEN`]; nothing was sent.
    #[error("cannot ask for a {0}-byte key: the key service hands out 1 to {MAX_KEY_LEN} bytes")]
    RequestLength(usize),
    /// The answer was not a key of the requested length.
    #[error("the key service returned {got} bytes instead of {want}")]
    Length {
        /// Requested.
        want: usize,
        /// Received.
        got: usize,
    },
}

/// A client of the key service. Cheap to clone; clones share the connection.
#[derive(Debug, Clone)]
pub struct KeyServiceClient {
    client: ApiClient<Channel>,
    timeout: Duration,
}

impl KeyServiceClient {
    /// A client for the plaintext key service at `address`; every call has
    /// [`KEY_CALL_TIMEOUT`]. The connection is made lazily and re-made after failures, so
    /// the caller may start before the key service does.
    pub fn new(address: &KeyServiceAddress) -> Result<Self, KeyError> {
        let endpoint = |uri: String| {
            Endpoint::from_shared(uri).map(|e| {
                e.timeout(KEY_CALL_TIMEOUT)
                    .connect_timeout(KEY_CALL_TIMEOUT)
                    .concurrency_limit(KEY_CALLS_IN_FLIGHT)
            })
        };
        let channel = match address {
            KeyServiceAddress::Unix(path) => {
                let path: PathBuf = path.clone();
                endpoint("http://key-service.invalid".to_owned())
                    .map_err(|e| KeyError::Unavailable(e.to_string()))?
                    .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                        let path = path.clone();
                        async move {
                            let stream = tokio::net::UnixStream::connect(path).await?;
                            Ok::<_, std::io::Error>(TokioIo::new(stream))
                        }
                    }))
            }
            KeyServiceAddress::Tcp(addr) => endpoint(format!("http://{addr}"))
                .map_err(|e| KeyError::Unavailable(e.to_string()))?
                .connect_lazy(),
        };
        Ok(Self::from_channel(channel, KEY_CALL_TIMEOUT))
    }

    /// A client over an already built `channel` (for example one over attested TLS); every
    /// call has `timeout`.
    #[must_use]
    pub fn from_channel(channel: Channel, timeout: Duration) -> Self {
        Self {
            client: ApiClient::new(channel).max_decoding_message_size(MAX_ANSWER_LEN),
            timeout,
        }
    }

    /// `len` bytes of the data key `id`: exactly `len`, or an error.
    pub async fn data_key(&self, id: &KeyId, len: usize) -> Result<DataKey, KeyError> {
        let length = u32::try_from(len)
            .ok()
            .filter(|_| (1..=MAX_KEY_LEN).contains(&len))
            .ok_or(KeyError::RequestLength(len))?;
        let request = GetDataKeyRequest {
            data_key_id: id.as_str().to_owned(),
            length,
        };
        let mut client = self.client.clone();
        let call = client.get_data_key(request);
        let response = tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| KeyError::Unavailable(format!("no answer within {:?}", self.timeout)))?
            .map_err(status_error)?;
        let bytes = response.into_inner().data_key;
        let got = bytes.len();
        // `DataKey::new` takes the bytes first, so that they are wiped whatever follows.
        let key = DataKey::new(bytes).map_err(|_| KeyError::Length { want: len, got })?;
        if got != len {
            return Err(KeyError::Length { want: len, got });
        }
        Ok(key)
    }

    /// The seed of the control plane's identity key (`GetControlPlaneIdentity`).
    pub async fn control_plane_seed(&self) -> Result<crate::ControlPlaneSeed, KeyError> {
        let mut client = self.client.clone();
        let call = client.get_control_plane_identity(GetControlPlaneIdentityRequest {});
        let response = tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| KeyError::Unavailable(format!("no answer within {:?}", self.timeout)))?
            .map_err(status_error)?;
        let bytes = response.into_inner().seed;
        let got = bytes.len();
        crate::ControlPlaneSeed::from_bytes(bytes).map_err(|_| KeyError::Length {
            want: crate::CONTROL_PLANE_KEY_LEN,
            got,
        })
    }
}

fn status_error(status: tonic::Status) -> KeyError {
    match status.code() {
        tonic::Code::Unavailable
        | tonic::Code::DeadlineExceeded
        | tonic::Code::Cancelled
        | tonic::Code::Unknown => KeyError::Unavailable(status.message().to_owned()),
        code => KeyError::Failed {
            code,
            message: status.message().to_owned(),
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn lengths_the_service_would_refuse_are_not_sent() {
        let dir = tempfile::tempdir().unwrap();
        let client =
            KeyServiceClient::new(&KeyServiceAddress::Unix(dir.path().join("nobody"))).unwrap();
        for len in [0, MAX_KEY_LEN + 1, usize::MAX] {
            assert!(matches!(
                client.data_key(&KeyId::MeasurementSecret, len).await,
                Err(KeyError::RequestLength(l)) if l == len
            ));
        }
        // A length in range is sent, and finds no service.
        assert!(matches!(
            client.data_key(&KeyId::MeasurementSecret, 32).await,
            Err(KeyError::Unavailable(_))
        ));
    }
}

//! The `kms.API` gRPC handler: decode, derive, map the error.

use std::sync::Arc;

use asterism_binkit::error_chain;
use asterism_kms::{ClusterKms, KeyId, KeyIdError};
use asterism_proto::kms::api_server::Api;
use asterism_proto::kms::{
    GetControlPlaneIdentityRequest, GetControlPlaneIdentityResponse, GetDataKeyRequest,
    GetDataKeyResponse,
};
use tonic::transport::server::UdsConnectInfo;
use tonic::{Request, Response, Status};

pub use asterism_kms::MAX_KEY_LEN;

/// Why a `GetDataKey` request was refused before any derivation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The requested length is zero or above [`MAX_KEY_LEN`].
    #[error("requested key length {requested} is outside 1..={MAX_KEY_LEN}")]
    Length {
        /// The requested length.
        requested: u32,
    },
    /// The key ID is empty or malformed.
    #[error("invalid data key ID: {0}")]
    KeyId(#[from] KeyIdError),
}

/// Why a caller may not have the key it asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthorizationError {
    /// An attested peer asked for a key other than the measurement secret. Attestation
    /// says what the peer runs, not which node it is: every joined worker attests as well
    /// as the control plane, so a disk key (or the SSH CA seed) over attested TLS would go
    /// to any of them. Disk keys reach nodes only through the join service, which checks
    /// the disk's binding to the node's attestation key.
    #[error(
        "key {id} is not released over attested TLS: an attested peer gets only measurementSecret (disk keys go to nodes through the join service, which checks the disk's binding)"
    )]
    NotForAttestedPeers {
        /// The key asked for.
        id: String,
    },
}

/// Which keys an attested peer (on the `--atls-listen` listener) may have: only the
/// measurement secret, which every node that joins receives in its join ticket anyway.
pub fn authorize_attested(id: &KeyId) -> Result<(), AuthorizationError> {
    match id {
        KeyId::MeasurementSecret => Ok(()),
        other => Err(AuthorizationError::NotForAttestedPeers {
            id: other.to_string(),
        }),
    }
}

/// A validated `GetDataKey` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataKeyRequest {
    /// Which key.
    pub id: KeyId,
    /// How many bytes, in `1..=MAX_KEY_LEN`.
    pub len: usize,
}

impl TryFrom<GetDataKeyRequest> for DataKeyRequest {
    type Error = RequestError;

    /// Checks the length first and the ID second: a request wrong in both is refused for
    /// its length (docs/key-service.md).
    fn try_from(request: GetDataKeyRequest) -> Result<Self, Self::Error> {
        let len = usize::try_from(request.length)
            .ok()
            .filter(|len| (1..=MAX_KEY_LEN).contains(len))
            .ok_or(RequestError::Length {
                requested: request.length,
            })?;
        let id = KeyId::parse(&request.data_key_id)?;
        Ok(Self { id, len })
    }
}

/// The key service: answers `GetDataKey` with keys derived by a [`ClusterKms`].
pub struct KeyService {
    kms: Arc<ClusterKms>,
    require_attested_peer: bool,
}

impl KeyService {
    /// A service deriving from `kms`.
    #[must_use]
    pub fn new(kms: ClusterKms) -> Self {
        Self {
            kms: Arc::new(kms),
            require_attested_peer: false,
        }
    }

    /// A service that answers only requests arriving on an attested-TLS connection whose
    /// peer a validator accepted, and only for the keys [`authorize_attested`] allows;
    /// every other request gets `PermissionDenied`. Used when the service listens on a
    /// network address.
    #[must_use]
    pub fn attested_only(kms: ClusterKms) -> Self {
        Self {
            kms: Arc::new(kms),
            require_attested_peer: true,
        }
    }
}

impl std::fmt::Debug for KeyService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyService").finish_non_exhaustive()
    }
}

/// Who sent a request, for the log: the TCP address, or the credentials of a Unix-socket
/// peer.
fn peer<T>(request: &Request<T>) -> String {
    if let Some(addr) = request
        .extensions()
        .get::<asterism_atls::AtlsConnectInfo>()
        .and_then(|info| info.remote_addr)
    {
        return addr.to_string();
    }
    if let Some(addr) = request.remote_addr() {
        return addr.to_string();
    }
    if let Some(info) = request.extensions().get::<UdsConnectInfo>() {
        return match info.peer_cred {
            Some(cred) => match cred.pid() {
                Some(pid) => format!("unix:uid={},pid={pid}", cred.uid()),
                None => format!("unix:uid={}", cred.uid()),
            },
            None => "unix:unknown".to_owned(),
        };
    }
    "unknown".to_owned()
}

impl KeyService {
    /// Who sent `request`, if it may be answered: with [`KeyService::attested_only`], only
    /// a peer a validator accepted on this connection.
    fn admit<T>(&self, request: &Request<T>, what: &str) -> Result<String, Status> {
        let peer = peer(request);
        if !self.require_attested_peer {
            return Ok(peer);
        }
        let verified = asterism_atls::verified_peer(request).inspect_err(|_| {
            tracing::warn!(%peer, what, "refused a key request: peer is not attested");
        })?;
        Ok(format!(
            "{peer} ({} {})",
            verified.evidence().variant(),
            verified.evidence().identity()
        ))
    }
}

#[tonic::async_trait]
impl Api for KeyService {
    /// The control plane's identity seed, for the join service (docs/key-service.md), on
    /// the local socket only: whoever reaches that socket can already derive every data
    /// key. An attested peer is refused: attestation says what a node runs, not that it is
    /// the control plane, and with the seed a joined worker could sign join tickets and
    /// control-plane lists as the control plane.
    async fn get_control_plane_identity(
        &self,
        request: Request<GetControlPlaneIdentityRequest>,
    ) -> Result<Response<GetControlPlaneIdentityResponse>, Status> {
        let peer = self.admit(&request, "control-plane identity")?;
        if self.require_attested_peer {
            tracing::warn!(%peer, "refused the control-plane identity to an attested peer");
            return Err(Status::permission_denied(
                "the control-plane identity is not released over attested TLS",
            ));
        }
        let seed = self.kms.control_plane_seed().map_err(|err| {
            tracing::error!(%peer, error = %error_chain(&err), "deriving the control-plane identity failed");
            Status::internal("deriving the control-plane identity failed")
        })?;
        tracing::info!(%peer, "issued the control-plane identity");
        Ok(Response::new(GetControlPlaneIdentityResponse {
            seed: seed.expose_secret().to_vec(),
        }))
    }

    async fn get_data_key(
        &self,
        request: Request<GetDataKeyRequest>,
    ) -> Result<Response<GetDataKeyResponse>, Status> {
        let peer = self.admit(&request, "data key")?;
        let request = DataKeyRequest::try_from(request.into_inner()).map_err(|err| {
            tracing::warn!(%peer, error = %err, "refused data key request");
            Status::invalid_argument(err.to_string())
        })?;
        if self.require_attested_peer {
            authorize_attested(&request.id).map_err(|err| {
                tracing::warn!(%peer, key_id = %request.id, error = %err, "refused data key request");
                Status::permission_denied(err.to_string())
            })?;
        }
        let key = self.kms.data_key(&request.id, request.len).map_err(|err| {
            tracing::error!(
                %peer,
                key_id = %request.id,
                length = request.len,
                error = %error_chain(&err),
                "deriving a data key failed"
            );
            Status::internal("deriving the data key failed")
        })?;
        tracing::info!(%peer, key_id = %request.id, length = request.len, "issued data key");
        // The response leaves our control here: tonic encodes and frees it unwiped. The
        // derived key itself is wiped when `key` drops.
        Ok(Response::new(GetDataKeyResponse {
            data_key: key.expose_secret().to_vec(),
        }))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn request(id: &str, length: u32) -> GetDataKeyRequest {
        GetDataKeyRequest {
            data_key_id: id.to_owned(),
            length,
        }
    }

    #[test]
    fn lengths_outside_1_to_4096_are_refused() {
        let max = u32::try_from(MAX_KEY_LEN).unwrap();
        for length in [0, max + 1, u32::MAX] {
            assert_eq!(
                DataKeyRequest::try_from(request("measurementSecret", length)),
                Err(RequestError::Length { requested: length })
            );
        }
        for length in [1, 32, max] {
            assert!(DataKeyRequest::try_from(request("measurementSecret", length)).is_ok());
        }
    }

    #[test]
    fn length_is_checked_before_the_id() {
        assert_eq!(
            DataKeyRequest::try_from(request("", 0)),
            Err(RequestError::Length { requested: 0 })
        );
    }

    #[test]
    fn empty_and_malformed_ids_are_refused() {
        assert_eq!(
            DataKeyRequest::try_from(request("", 32)),
            Err(RequestError::KeyId(KeyIdError::Empty))
        );
        assert!(matches!(
            DataKeyRequest::try_from(request("a\u{7f}", 32)),
            Err(RequestError::KeyId(KeyIdError::NotPrintable { offset: 1 }))
        ));
    }
}

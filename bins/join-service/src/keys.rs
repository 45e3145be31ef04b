//! Where the join service gets data keys: the key service (the one client,
//! [`asterism_kms::KeyServiceClient`], over a Unix socket or a loopback address), behind the
//! [`KeySource`] trait.

use asterism_kms::{ControlPlaneSeed, DataKey, KeyError, KeyId, KeyServiceClient};
use std::future::Future;

/// A source of data keys.
pub trait KeySource: Send + Sync + 'static {
    /// `len` bytes of the data key `id`.
    fn data_key(
        &self,
        id: &KeyId,
        len: usize,
    ) -> impl Future<Output = Result<DataKey, KeyError>> + Send;

    /// The seed of the control plane's identity key, which signs every ticket.
    fn control_plane_seed(&self)
    -> impl Future<Output = Result<ControlPlaneSeed, KeyError>> + Send;
}

impl KeySource for KeyServiceClient {
    async fn data_key(&self, id: &KeyId, len: usize) -> Result<DataKey, KeyError> {
        KeyServiceClient::data_key(self, id, len).await
    }

    async fn control_plane_seed(&self) -> Result<ControlPlaneSeed, KeyError> {
        KeyServiceClient::control_plane_seed(self).await
    }
}

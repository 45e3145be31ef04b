//! The cluster KMS: every data key is derived from the master secret and its salt.

use std::fmt;

use crate::derive::{DeriveError, derive};
use crate::key_id::KeyId;
use crate::secret::{DataKey, MasterSecret, Salt};

/// Derives data keys from the cluster's master secret and salt:
/// `HKDF-SHA-256(IKM = master secret, salt = salt, info = "key-" + id, L = len)`.
pub struct ClusterKms {
    master_secret: MasterSecret,
    salt: Salt,
}

impl ClusterKms {
    /// A KMS over the given master secret and salt.
    #[must_use]
    pub fn new(master_secret: MasterSecret, salt: Salt) -> Self {
        Self {
            master_secret,
            salt,
        }
    }

    /// The data key `id`, `len` bytes long (`1..=MAX_DERIVED_LEN`).
    pub fn data_key(&self, id: &KeyId, len: usize) -> Result<DataKey, DeriveError> {
        derive(
            self.master_secret.expose_secret(),
            self.salt.expose_secret(),
            id.info().as_bytes(),
            len,
        )
    }

    /// The seed of the control plane's identity (`crate::ControlPlaneSeed`), which no
    /// `data_key` ID reaches.
    pub fn control_plane_seed(&self) -> Result<crate::ControlPlaneSeed, crate::IdentityError> {
        crate::ControlPlaneSeed::derive(&self.master_secret, &self.salt)
    }

    /// The master secret, for callers that must hand it on (the recovery client).
    #[must_use]
    pub fn master_secret(&self) -> &MasterSecret {
        &self.master_secret
    }

    /// The salt.
    #[must_use]
    pub fn salt(&self) -> &Salt {
        &self.salt
    }
}

impl fmt::Debug for ClusterKms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterKms")
            .field("master_secret", &self.master_secret)
            .field("salt", &self.salt)
            .finish()
    }
}

//! The keys of an Asterism cluster: the master secret and its salt, the data keys derived
//! from them with HKDF-SHA-256, the catalogue of key IDs, and KMS and storage URIs.
//!
//! It also holds the key service's address ([`KeyServiceAddress`]) and, behind the
//! `client` feature, its client (`KeyServiceClient`, which needs tonic and a tokio runtime).
//!
//! Without that feature this crate is pure: it does no I/O, starts no runtime and logs
//! nothing. It must never
//! let secret bytes reach a `Debug` or `Display` output, an error value or a clone: the
//! secret types ([`MasterSecret`], [`Salt`], [`DataKey`]) are not
//! `Clone`, redact themselves, wipe their memory when dropped and compare in constant time.
//!
//! ```
//! use asterism_kms::{ClusterKms, KeyId, MasterSecret, Salt};
//!
//! let kms = ClusterKms::new(MasterSecret::new(vec![0; 32])?, Salt::new(vec![0; 32])?);
//! let key = kms.data_key(&KeyId::MeasurementSecret, 32)?;
//! assert_eq!(key.len(), 32);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]

mod address;
#[cfg(feature = "client")]
mod client;
mod cluster;
mod derive;
mod identity;
mod key_id;
mod secret;
mod uri;

pub use address::{AddressError, KeyServiceAddress};
#[cfg(feature = "client")]
pub use client::{KEY_CALL_TIMEOUT, KEY_CALLS_IN_FLIGHT, KeyError, KeyServiceClient};
pub use cluster::ClusterKms;
pub use derive::{
    ClusterId, DeriveError, MAX_DERIVED_LEN, MEASUREMENT_SALT_LEN, derive, derive_cluster_id,
};
pub use identity::{
    CONTROL_PLANE_IDENTITY_INFO, CONTROL_PLANE_KEY_LEN, CONTROL_PLANE_SIGNATURE_LEN,
    ChannelBinding, ControlPlaneKey, ControlPlaneSeed, ControlPlaneSigner, IdentityError, Purpose,
};
pub use key_id::{DiskUuid, KEY_ID_PREFIX, KeyId, KeyIdError, OtherKeyId};
pub use secret::{DataKey, MasterSecret, Salt, SecretError};
pub use uri::{KmsUri, SetupError, StorageUri, UriError};

/// The length of a state-disk key, in bytes.
pub const STATE_DISK_KEY_LEN: usize = 32;

/// The longest data key the key service hands out, in bytes.
pub const MAX_KEY_LEN: usize = 4096;

/// The default length of a derived key, in bytes.
pub const DEFAULT_KEY_LEN: usize = 32;

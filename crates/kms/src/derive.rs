//! HKDF-SHA-256 (RFC 5869) derivations: data keys and the cluster ID.

use std::fmt;

use ring::hkdf;
use zeroize::Zeroizing;

use crate::secret::DataKey;

/// The longest output HKDF-SHA-256 can produce: 255 blocks of 32 bytes.
pub const MAX_DERIVED_LEN: usize = 255 * 32;

pub use asterism_cluster::MEASUREMENT_SALT_LEN;

/// Why a derivation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeriveError {
    /// The requested output length is zero or longer than HKDF-SHA-256 allows.
    #[error("cannot derive {requested} bytes: HKDF-SHA-256 gives 1 to {max} bytes")]
    InvalidLength {
        /// The requested length.
        requested: usize,
        /// [`MAX_DERIVED_LEN`].
        max: usize,
    },
    /// The HKDF implementation refused the expansion.
    #[error("HKDF-SHA-256 expansion failed")]
    Expand,
}

/// The output length as ring's HKDF wants it.
struct OutputLen(usize);

impl hkdf::KeyType for OutputLen {
    fn len(&self) -> usize {
        self.0
    }
}

/// HKDF-SHA-256 with input keying material `ikm`, `salt` and `info`, producing `len` bytes.
///
/// An empty `salt` means a block of zeros (RFC 5869 §2.2). `len` must lie in
/// `1..=MAX_DERIVED_LEN`.
pub fn derive(ikm: &[u8], salt: &[u8], info: &[u8], len: usize) -> Result<DataKey, DeriveError> {
    if len == 0 || len > MAX_DERIVED_LEN {
        return Err(DeriveError::InvalidLength {
            requested: len,
            max: MAX_DERIVED_LEN,
        });
    }
    // An HMAC key shorter than the block is zero-padded, so an empty salt already is the
    // RFC's zero block.
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, salt).extract(ikm);
    let info = [info];
    let okm = prk
        .expand(&info, OutputLen(len))
        .map_err(|_| DeriveError::Expand)?;
    let mut out = Zeroizing::new(vec![0u8; len]);
    okm.fill(out.as_mut_slice())
        .map_err(|_| DeriveError::Expand)?;
    Ok(DataKey::from_derived(out))
}

/// The HKDF info string of the cluster ID.
const CLUSTER_ID_INFO: &[u8] = b"key-clusterID";

/// The identity of a cluster: the same on every node, extended into the node's marker PCR.
/// Not secret.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClusterId([u8; 32]);

impl ClusterId {
    /// The raw 32 bytes.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lower-case hex, as the CLI stores it.
    #[must_use]
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl From<[u8; 32]> for ClusterId {
    fn from(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }
}

impl fmt::Debug for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClusterId({})", self.to_hex())
    }
}

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// The cluster ID: HKDF-SHA-256 over the measurement secret (IKM) and the measurement salt,
/// info `key-clusterID`, 32 bytes. The measurement secret is itself the data key
/// [`KeyId::MeasurementSecret`](crate::KeyId::MeasurementSecret).
pub fn derive_cluster_id(
    measurement_secret: &DataKey,
    measurement_salt: &[u8; MEASUREMENT_SALT_LEN],
) -> Result<ClusterId, DeriveError> {
    let key = derive(
        measurement_secret.expose_secret(),
        measurement_salt,
        CLUSTER_ID_INFO,
        32,
    )?;
    let bytes: [u8; 32] = key
        .expose_secret()
        .try_into()
        .map_err(|_| DeriveError::Expand)?;
    Ok(ClusterId(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_and_too_long_lengths_are_errors() {
        assert_eq!(
            derive(b"k", b"s", b"i", 0).err(),
            Some(DeriveError::InvalidLength {
                requested: 0,
                max: 8160
            })
        );
        assert!(matches!(
            derive(b"k", b"s", b"i", MAX_DERIVED_LEN + 1),
            Err(DeriveError::InvalidLength { .. })
        ));
        assert_eq!(
            derive(b"k", b"s", b"i", MAX_DERIVED_LEN).unwrap().len(),
            MAX_DERIVED_LEN
        );
        assert_eq!(derive(b"k", b"s", b"i", 1).unwrap().len(), 1);
    }

    #[test]
    fn empty_salt_equals_zero_block_salt() {
        let empty = derive(b"ikm", b"", b"info", 32).unwrap();
        let zeros = derive(b"ikm", &[0u8; 32], b"info", 32).unwrap();
        assert_eq!(empty, zeros);
    }
}

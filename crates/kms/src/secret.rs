//! Secret value types: the master secret, its salt, derived data keys and secret strings.
//!
//! Every type here is deliberately not `Clone` and not `Serialize`, prints `<redacted>` as
//! `Debug`, wipes its memory when dropped and compares in constant time. The bytes are
//! reachable only through an explicitly named `expose_secret`, so every place that lets a
//! secret out is easy to find.

use std::fmt;

use ring::rand::{SecureRandom, SystemRandom};
use subtle::ConstantTimeEq;
use zeroize::{Zeroize, Zeroizing};

/// What `Debug` prints instead of secret bytes.
pub(crate) const REDACTED: &str = "<redacted>";

/// Why a secret value was rejected. Carries lengths only, never the bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// The master secret is shorter than [`MasterSecret::MIN_LEN`].
    #[error("master secret is {len} bytes long, at least {min} are required")]
    MasterSecretTooShort {
        /// The length that was supplied.
        len: usize,
        /// The minimum length.
        min: usize,
    },
    /// The salt is shorter than [`Salt::MIN_LEN`].
    #[error("salt is {len} bytes long, at least {min} are required")]
    SaltTooShort {
        /// The length that was supplied.
        len: usize,
        /// The minimum length.
        min: usize,
    },
    /// A data key must hold at least one byte.
    #[error("a data key cannot be empty")]
    EmptyDataKey,
    /// The system's random number generator failed.
    #[error("the system random number generator failed")]
    Random,
}

/// Fills a fresh buffer of `len` bytes from the operating system's CSPRNG.
fn random_bytes(len: usize) -> Result<Zeroizing<Vec<u8>>, SecretError> {
    let mut buf = Zeroizing::new(vec![0u8; len]);
    SystemRandom::new()
        .fill(buf.as_mut_slice())
        .map_err(|_| SecretError::Random)?;
    Ok(buf)
}

/// Takes ownership of `bytes` without copying them, so that no unwiped copy is left behind.
fn adopt(bytes: Vec<u8>) -> Zeroizing<Vec<u8>> {
    Zeroizing::new(bytes)
}

/// Adopts `bytes` if there are at least `min` of them; otherwise wipes them and returns
/// `too_short(len, min)`.
fn adopt_at_least(
    bytes: Vec<u8>,
    min: usize,
    too_short: fn(usize, usize) -> SecretError,
) -> Result<Zeroizing<Vec<u8>>, SecretError> {
    let bytes = adopt(bytes);
    if bytes.len() < min {
        return Err(too_short(bytes.len(), min));
    }
    Ok(bytes)
}

/// Implements `Debug` (redacted), constant-time `PartialEq`, `expose_secret` and
/// `TryFrom<Vec<u8>>` (through the type's `new`) for a newtype around `Zeroizing<Vec<u8>>`.
macro_rules! secret_bytes {
    ($ty:ident) => {
        impl $ty {
            /// The secret bytes. Every caller is a place where the secret leaves this type:
            /// keep it out of logs, errors and long-lived copies.
            #[must_use]
            pub fn expose_secret(&self) -> &[u8] {
                self.0.as_slice()
            }

            /// The length in bytes (not secret).
            #[must_use]
            pub fn len(&self) -> usize {
                self.0.len()
            }

            /// Whether the value holds no bytes.
            #[must_use]
            pub fn is_empty(&self) -> bool {
                self.0.is_empty()
            }
        }

        impl fmt::Debug for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($ty), "({})"), REDACTED)
            }
        }

        /// Constant time in the contents; the lengths are not secret.
        impl PartialEq for $ty {
            fn eq(&self, other: &Self) -> bool {
                self.0.as_slice().ct_eq(other.0.as_slice()).into()
            }
        }

        impl Eq for $ty {}

        impl TryFrom<Vec<u8>> for $ty {
            type Error = SecretError;

            fn try_from(bytes: Vec<u8>) -> Result<Self, Self::Error> {
                Self::new(bytes)
            }
        }

        impl ConstantTimeEq for $ty {
            fn ct_eq(&self, other: &Self) -> subtle::Choice {
                self.0.as_slice().ct_eq(other.0.as_slice())
            }
        }
    };
}

/// The cluster's master secret: the input keying material of every data key.
///
/// At least [`MasterSecret::MIN_LEN`] bytes; [`MasterSecret::generate`] makes
/// [`MasterSecret::DEFAULT_LEN`] bytes.
pub struct MasterSecret(Zeroizing<Vec<u8>>);

secret_bytes!(MasterSecret);

impl MasterSecret {
    /// The shortest master secret accepted.
    pub const MIN_LEN: usize = 16;
    /// The length of a generated master secret.
    pub const DEFAULT_LEN: usize = 32;

    /// Takes `bytes` as the master secret. On rejection the bytes are wiped.
    pub fn new(bytes: Vec<u8>) -> Result<Self, SecretError> {
        adopt_at_least(bytes, Self::MIN_LEN, |len, min| {
            SecretError::MasterSecretTooShort { len, min }
        })
        .map(Self)
    }

    /// A fresh master secret of [`MasterSecret::DEFAULT_LEN`] bytes from the system CSPRNG.
    pub fn generate() -> Result<Self, SecretError> {
        Ok(Self(random_bytes(Self::DEFAULT_LEN)?))
    }
}

/// The salt that goes with the master secret into every data-key derivation.
///
/// At least [`Salt::MIN_LEN`] bytes, everywhere: salts are always generated with 32 bytes,
/// so a shorter one is a mistake, not an existing cluster's.
pub struct Salt(Zeroizing<Vec<u8>>);

secret_bytes!(Salt);

impl Salt {
    /// The shortest salt accepted.
    pub const MIN_LEN: usize = 32;
    /// The length of a generated salt.
    pub const DEFAULT_LEN: usize = 32;

    /// Takes `bytes` as the salt. On rejection the bytes are wiped.
    pub fn new(bytes: Vec<u8>) -> Result<Self, SecretError> {
        adopt_at_least(bytes, Self::MIN_LEN, |len, min| SecretError::SaltTooShort {
            len,
            min,
        })
        .map(Self)
    }

    /// A fresh salt of [`Salt::DEFAULT_LEN`] bytes from the system CSPRNG.
    pub fn generate() -> Result<Self, SecretError> {
        Ok(Self(random_bytes(Self::DEFAULT_LEN)?))
    }
}

/// A key derived from the master secret (a disk passphrase, the measurement secret, an SSH
/// CA seed, …), or received from a party that derived it.
pub struct DataKey(Zeroizing<Vec<u8>>);

secret_bytes!(DataKey);

impl DataKey {
    /// Takes `bytes` as a data key, for instance one received from the key service.
    /// On rejection the bytes are wiped.
    pub fn new(bytes: Vec<u8>) -> Result<Self, SecretError> {
        let bytes = adopt(bytes);
        if bytes.is_empty() {
            return Err(SecretError::EmptyDataKey);
        }
        Ok(Self(bytes))
    }

    /// Wraps freshly derived bytes (never empty by construction of the caller).
    pub(crate) fn from_derived(bytes: Zeroizing<Vec<u8>>) -> Self {
        Self(bytes)
    }
}

/// Wipes a buffer that held secret bytes but is about to be dropped on an error path.
pub(crate) fn wipe(mut bytes: Vec<u8>) {
    bytes.zeroize();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn master_secret_shorter_than_16_bytes_is_rejected() {
        assert_eq!(
            MasterSecret::new(vec![1; 15]).err(),
            Some(SecretError::MasterSecretTooShort { len: 15, min: 16 })
        );
        assert!(MasterSecret::new(vec![1; 16]).is_ok());
    }

    #[test]
    fn salt_shorter_than_32_bytes_is_rejected() {
        assert_eq!(
            Salt::new(vec![1; 31]).err(),
            Some(SecretError::SaltTooShort { len: 31, min: 32 })
        );
        assert!(Salt::new(vec![1; 32]).is_ok());
    }

    #[test]
    fn empty_data_key_is_rejected() {
        assert_eq!(
            DataKey::new(Vec::new()).err(),
            Some(SecretError::EmptyDataKey)
        );
    }

    #[test]
    fn generated_secrets_have_default_length_and_differ() {
        let a = MasterSecret::generate().unwrap();
        let b = MasterSecret::generate().unwrap();
        assert_eq!(a.len(), 32);
        assert_ne!(a, b);
        assert_eq!(Salt::generate().unwrap().len(), 32);
    }

    #[test]
    fn debug_never_shows_secret_bytes() {
        let m = MasterSecret::new(vec![0xab; 32]).unwrap();
        let s = Salt::new(vec![0xcd; 32]).unwrap();
        let k = DataKey::new(vec![0xef; 8]).unwrap();
        for shown in [format!("{m:?}"), format!("{s:?}"), format!("{k:?}")] {
            assert!(shown.contains(REDACTED), "{shown}");
            for needle in ["ab", "171", "cd", "205", "ef", "239"] {
                assert!(!shown.contains(needle), "{shown} contains {needle}");
            }
        }
    }

    #[test]
    fn equality_compares_contents() {
        let a = DataKey::new(vec![1, 2, 3]).unwrap();
        assert_eq!(a, DataKey::new(vec![1, 2, 3]).unwrap());
        assert_ne!(a, DataKey::new(vec![1, 2, 4]).unwrap());
        assert_ne!(a, DataKey::new(vec![1, 2]).unwrap());
        assert!(bool::from(a.ct_eq(&DataKey::new(vec![1, 2, 3]).unwrap())));
    }
}

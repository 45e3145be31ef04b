//! The catalogue of data-key IDs.
//!
//! A key ID is what a caller of the key service names (without the `key-` prefix); the HKDF
//! info string is `key-` followed by the ID.

use std::fmt;

/// The prefix of every data-key info string.
pub const KEY_ID_PREFIX: &str = "key-";

/// Why a key ID was rejected. Never echoes the ID itself: it came from the network.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyIdError {
    /// The ID is empty.
    #[error("the key ID is empty")]
    Empty,
    /// The ID is longer than [`KeyId::MAX_LEN`].
    #[error("the key ID is {len} bytes long, at most {max} are allowed")]
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// [`KeyId::MAX_LEN`].
        max: usize,
    },
    /// The ID holds a byte outside printable ASCII (`!` to `~`).
    #[error("the key ID holds a non-printable or non-ASCII byte at offset {offset}")]
    NotPrintable {
        /// Offset of the first offending byte.
        offset: usize,
    },
    /// The value is not a UUID in the 8-4-4-4-12 hexadecimal form.
    #[error("not a UUID of the form xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")]
    NotAUuid,
}

/// A disk UUID in canonical lower-case 8-4-4-4-12 form.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct DiskUuid(String);

impl DiskUuid {
    /// Parses a UUID in the 8-4-4-4-12 hex form, in either case, and lower-cases it.
    pub fn parse(value: &str) -> Result<Self, KeyIdError> {
        const HYPHENS: [usize; 4] = [8, 13, 18, 23];
        if value.len() != 36 {
            return Err(KeyIdError::NotAUuid);
        }
        let well_formed = value.bytes().enumerate().all(|(i, b)| {
            if HYPHENS.contains(&i) {
                b == b'-'
            } else {
                b.is_ascii_hexdigit()
            }
        });
        if !well_formed {
            return Err(KeyIdError::NotAUuid);
        }
        Ok(Self(value.to_ascii_lowercase()))
    }

    /// The canonical lower-case form.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for DiskUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DiskUuid({})", self.0)
    }
}

impl fmt::Display for DiskUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A key ID outside the fixed catalogue (for instance a persistent-volume key). Only
/// [`KeyId::parse`] makes one, so it never spells a catalogue entry.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct OtherKeyId(String);

impl OtherKeyId {
    /// The ID as given.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for OtherKeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OtherKeyId({})", self.0)
    }
}

/// A data-key ID, without the `key-` prefix.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KeyId {
    /// `measurementSecret`: the measurement secret, from which the cluster ID is derived.
    MeasurementSecret,
    /// A disk UUID: the passphrase of that node's state disk.
    Disk(DiskUuid),
    /// `ca_emergency_ssh`: the Ed25519 seed of the emergency SSH certificate authority.
    EmergencySshCa,
    /// Any other ID: non-empty, at most [`KeyId::MAX_LEN`] bytes of printable ASCII.
    Other(OtherKeyId),
}

impl KeyId {
    /// The longest key ID accepted, in bytes.
    pub const MAX_LEN: usize = 256;
    /// The ID of the measurement secret.
    pub const MEASUREMENT_SECRET: &'static str = "measurementSecret";
    /// The ID of the emergency SSH CA seed.
    pub const EMERGENCY_SSH_CA: &'static str = "ca_emergency_ssh";

    /// Parses an ID as a caller of the key service sends it (without the `key-` prefix).
    ///
    /// A UUID becomes [`KeyId::Disk`] and is lower-cased, so `ABCD…` and `abcd…` name the
    /// same disk key. Nodes always send lower case, so the keys of existing disks do not
    /// change.
    pub fn parse(id: &str) -> Result<Self, KeyIdError> {
        if id.is_empty() {
            return Err(KeyIdError::Empty);
        }
        if id.len() > Self::MAX_LEN {
            return Err(KeyIdError::TooLong {
                len: id.len(),
                max: Self::MAX_LEN,
            });
        }
        if let Some(offset) = id.bytes().position(|b| !b.is_ascii_graphic()) {
            return Err(KeyIdError::NotPrintable { offset });
        }
        Ok(match id {
            Self::MEASUREMENT_SECRET => Self::MeasurementSecret,
            Self::EMERGENCY_SSH_CA => Self::EmergencySshCa,
            _ => match DiskUuid::parse(id) {
                Ok(uuid) => Self::Disk(uuid),
                Err(_) => Self::Other(OtherKeyId(id.to_owned())),
            },
        })
    }

    /// The key of a state disk with the given UUID (either case).
    pub fn disk(uuid: &str) -> Result<Self, KeyIdError> {
        DiskUuid::parse(uuid).map(Self::Disk)
    }

    /// The ID without the prefix.
    #[must_use]
    pub fn as_str(&self) -> &str {
        match self {
            Self::MeasurementSecret => Self::MEASUREMENT_SECRET,
            Self::Disk(uuid) => uuid.as_str(),
            Self::EmergencySshCa => Self::EMERGENCY_SSH_CA,
            Self::Other(other) => other.as_str(),
        }
    }

    /// The HKDF info string: `key-` followed by the ID.
    #[must_use]
    pub fn info(&self) -> String {
        format!("{KEY_ID_PREFIX}{}", self.as_str())
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for KeyId {
    type Err = KeyIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalogue_entries_are_recognised() {
        assert_eq!(
            KeyId::parse("measurementSecret").unwrap(),
            KeyId::MeasurementSecret
        );
        assert_eq!(
            KeyId::parse("ca_emergency_ssh").unwrap(),
            KeyId::EmergencySshCa
        );
        assert_eq!(
            KeyId::MeasurementSecret.info(),
            "key-measurementSecret".to_owned()
        );
        assert_eq!(KeyId::EmergencySshCa.info(), "key-ca_emergency_ssh");
    }

    #[test]
    fn disk_uuids_are_lower_cased() {
        let upper = KeyId::parse("ABCDEF01-2345-6789-ABCD-EF0123456789").unwrap();
        let lower = KeyId::parse("abcdef01-2345-6789-abcd-ef0123456789").unwrap();
        assert_eq!(upper, lower);
        assert!(matches!(upper, KeyId::Disk(_)));
        assert_eq!(upper.info(), "key-abcdef01-2345-6789-abcd-ef0123456789");
        assert_eq!(
            KeyId::disk("FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF")
                .unwrap()
                .as_str(),
            "ffffffff-ffff-ffff-ffff-ffffffffffff"
        );
    }

    #[test]
    fn malformed_uuids_are_not_disk_ids() {
        for bad in [
            "abcdef01-2345-6789-abcd-ef012345678",
            "abcdef01-2345-6789-abcd-ef01234567890",
            "abcdef0102345-6789-abcd-ef0123456789",
            "abcdef01-2345-6789-abcd-ef012345678g",
            "{bcdef01-2345-6789-abcd-ef012345678}",
        ] {
            assert_eq!(KeyId::disk(bad), Err(KeyIdError::NotAUuid), "{bad}");
            assert!(matches!(KeyId::parse(bad), Ok(KeyId::Other(_))), "{bad}");
        }
    }

    #[test]
    fn other_ids_are_bounded_and_printable() {
        assert_eq!(KeyId::parse(""), Err(KeyIdError::Empty));
        assert!(matches!(KeyId::parse("pvc-1234"), Ok(KeyId::Other(_))));
        assert!(KeyId::parse(&"a".repeat(KeyId::MAX_LEN)).is_ok());
        assert_eq!(
            KeyId::parse(&"a".repeat(KeyId::MAX_LEN + 1)),
            Err(KeyIdError::TooLong { len: 257, max: 256 })
        );
        assert_eq!(
            KeyId::parse("a b"),
            Err(KeyIdError::NotPrintable { offset: 1 })
        );
        assert_eq!(
            KeyId::parse("ab\n"),
            Err(KeyIdError::NotPrintable { offset: 2 })
        );
        assert_eq!(
            KeyId::parse("é"),
            Err(KeyIdError::NotPrintable { offset: 0 })
        );
    }
}

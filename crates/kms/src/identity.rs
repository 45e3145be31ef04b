//! The control plane's identity: an Ed25519 key derived from the master secret, which
//! only the control plane holds (its key service derives it; its join service signs with
//! it). Workers never see the master secret, so no worker can sign as the control plane,
//! however genuine its TPM, measurements and PCR 15 marker are.
//!
//! * Seed: `HKDF-SHA-256(IKM = master secret, salt = salt, info =
//!   "asterism/control-plane-identity/v1", L = 32)`. Every data key's info starts with
//!   `key-` ([`crate::KEY_ID_PREFIX`]), so no `GetDataKey` ID can name this one.
//! * Public form ([`ControlPlaneKey`]): the 32-byte Ed25519 public key, written as 64 hex
//!   digits. Nodes and the owner's CLI are given it, like the cluster ID; it is not secret.
//! * Signatures cover a purpose label, a 32-byte binding (a TLS exporter value for
//!   per-connection answers, zeros for documents) and the SHA-256 of the signed bytes:
//!   `"asterism/control-plane/v1\0" ‖ purpose ‖ "\0" ‖ binding ‖ SHA-256(bytes)`.

use std::fmt;
use std::str::FromStr;

use ring::signature::{ED25519, Ed25519KeyPair, KeyPair as _, UnparsedPublicKey};
use zeroize::Zeroizing;

use crate::derive::{DeriveError, derive};
use crate::secret::{MasterSecret, Salt};

/// The HKDF info of the identity seed. It does not start with `key-`, so it lies outside
/// the key service's `GetDataKey` namespace.
pub const CONTROL_PLANE_IDENTITY_INFO: &[u8] = b"asterism/control-plane-identity/v1";

/// Length of the seed, of the public key and of a [`ChannelBinding`], in bytes.
pub const CONTROL_PLANE_KEY_LEN: usize = 32;

/// Length of a signature, in bytes.
pub const CONTROL_PLANE_SIGNATURE_LEN: usize = 64;

const MESSAGE_PREFIX: &[u8] = b"asterism/control-plane/v1\0";

/// Why an identity operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// A seed, key or signature has the wrong length.
    #[error("{what} has {len} bytes, {want} expected")]
    Length {
        /// What was given.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The length it must have.
        want: usize,
    },
    /// A public key is not 64 hex digits.
    #[error("a control-plane key is 64 hex digits")]
    Hex,
    /// The seed could not be derived.
    #[error("deriving the control-plane identity")]
    Derive(#[source] DeriveError),
    /// The signing key could not be built from the seed.
    #[error("building the control-plane signing key")]
    Key,
    /// No signature was given where one is required.
    #[error("not signed by the control plane")]
    Unsigned,
    /// The signature does not verify under the expected control-plane key.
    #[error("the signature is not the control plane's ({key})")]
    BadSignature {
        /// The key it was checked against.
        key: ControlPlaneKey,
    },
}

/// What a signature is for; part of the signed message, so that a signature for one
/// purpose never verifies for another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// A join ticket (`IssueJoinTicketResponse`), bound to its aTLS connection.
    JoinTicket,
    /// A rejoin ticket (`IssueRejoinTicketResponse`), bound to its aTLS connection.
    RejoinTicket,
    /// The list of control-plane members (a document, binding all zeros).
    MemberList,
}

impl Purpose {
    fn label(self) -> &'static [u8] {
        match self {
            Self::JoinTicket => b"join-ticket",
            Self::RejoinTicket => b"rejoin-ticket",
            Self::MemberList => b"member-list",
        }
    }
}

/// A 32-byte value both ends of one connection know and nobody else does (a TLS exporter
/// value), or [`ChannelBinding::DOCUMENT`] for a signed document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelBinding(pub [u8; CONTROL_PLANE_KEY_LEN]);

impl ChannelBinding {
    /// The binding of a document that is not tied to a connection.
    pub const DOCUMENT: Self = Self([0; CONTROL_PLANE_KEY_LEN]);
}

fn message(purpose: Purpose, binding: &ChannelBinding, signed: &[u8]) -> Vec<u8> {
    let digest = ring::digest::digest(&ring::digest::SHA256, signed);
    let label = purpose.label();
    let mut m = Vec::with_capacity(MESSAGE_PREFIX.len() + label.len() + 1 + 32 + 32);
    m.extend_from_slice(MESSAGE_PREFIX);
    m.extend_from_slice(label);
    m.push(0);
    m.extend_from_slice(&binding.0);
    m.extend_from_slice(digest.as_ref());
    m
}

/// The secret seed of the control plane's identity. Not `Clone`, redacted in `Debug`,
/// wiped on drop.
pub struct ControlPlaneSeed(Zeroizing<[u8; CONTROL_PLANE_KEY_LEN]>);

impl ControlPlaneSeed {
    /// Derives the seed from the cluster's master secret and salt.
    pub fn derive(master_secret: &MasterSecret, salt: &Salt) -> Result<Self, IdentityError> {
        let key = derive(
            master_secret.expose_secret(),
            salt.expose_secret(),
            CONTROL_PLANE_IDENTITY_INFO,
            CONTROL_PLANE_KEY_LEN,
        )
        .map_err(IdentityError::Derive)?;
        Self::from_slice(key.expose_secret())
    }

    /// A seed received from the key service. `bytes` is wiped whatever the outcome.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, IdentityError> {
        let bytes = Zeroizing::new(bytes);
        Self::from_slice(&bytes)
    }

    fn from_slice(bytes: &[u8]) -> Result<Self, IdentityError> {
        let mut seed = Zeroizing::new([0u8; CONTROL_PLANE_KEY_LEN]);
        if bytes.len() != CONTROL_PLANE_KEY_LEN {
            return Err(IdentityError::Length {
                what: "control-plane seed",
                len: bytes.len(),
                want: CONTROL_PLANE_KEY_LEN,
            });
        }
        seed.copy_from_slice(bytes);
        Ok(Self(seed))
    }

    /// The seed's bytes, for the key service's answer to the join service. Keep them out of
    /// logs and long-lived copies.
    #[must_use]
    pub fn expose_secret(&self) -> &[u8; CONTROL_PLANE_KEY_LEN] {
        &self.0
    }

    /// The public key of this seed.
    pub fn public_key(&self) -> Result<ControlPlaneKey, IdentityError> {
        Ok(ControlPlaneSigner::new(self)?.public_key())
    }
}

impl fmt::Debug for ControlPlaneSeed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ControlPlaneSeed(<redacted>)")
    }
}

/// The control plane's signing key (the join service holds one). Not `Clone`; `Debug`
/// shows the public key only. (ring keeps the expanded private key in memory it does not
/// wipe; the seed itself is wiped when the [`ControlPlaneSeed`] drops.)
pub struct ControlPlaneSigner {
    pair: Ed25519KeyPair,
    public: ControlPlaneKey,
}

impl ControlPlaneSigner {
    /// The signing key of `seed`.
    pub fn new(seed: &ControlPlaneSeed) -> Result<Self, IdentityError> {
        let pair = Ed25519KeyPair::from_seed_unchecked(seed.0.as_slice())
            .map_err(|_| IdentityError::Key)?;
        let public = ControlPlaneKey::try_from(pair.public_key().as_ref())?;
        Ok(Self { pair, public })
    }

    /// The public key.
    #[must_use]
    pub fn public_key(&self) -> ControlPlaneKey {
        self.public
    }

    /// Signs `signed` for `purpose`, bound to `binding`.
    #[must_use]
    pub fn sign(
        &self,
        purpose: Purpose,
        binding: &ChannelBinding,
        signed: &[u8],
    ) -> [u8; CONTROL_PLANE_SIGNATURE_LEN] {
        let sig = self.pair.sign(&message(purpose, binding, signed));
        let mut out = [0u8; CONTROL_PLANE_SIGNATURE_LEN];
        out.copy_from_slice(sig.as_ref());
        out
    }
}

impl fmt::Debug for ControlPlaneSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ControlPlaneSigner({})", self.public)
    }
}

/// The public form of the control plane's identity: an Ed25519 public key. Not secret;
/// printed and parsed as 64 lower-case hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ControlPlaneKey([u8; CONTROL_PLANE_KEY_LEN]);

impl ControlPlaneKey {
    /// The key's bytes.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8; CONTROL_PLANE_KEY_LEN] {
        &self.0
    }

    /// Checks that `signature` is this key's over `signed` for `purpose`, bound to
    /// `binding`. An empty signature is [`IdentityError::Unsigned`].
    pub fn verify(
        &self,
        purpose: Purpose,
        binding: &ChannelBinding,
        signed: &[u8],
        signature: &[u8],
    ) -> Result<(), IdentityError> {
        if signature.is_empty() {
            return Err(IdentityError::Unsigned);
        }
        if signature.len() != CONTROL_PLANE_SIGNATURE_LEN {
            return Err(IdentityError::Length {
                what: "control-plane signature",
                len: signature.len(),
                want: CONTROL_PLANE_SIGNATURE_LEN,
            });
        }
        UnparsedPublicKey::new(&ED25519, &self.0)
            .verify(&message(purpose, binding, signed), signature)
            .map_err(|_| IdentityError::BadSignature { key: *self })
    }
}

impl TryFrom<&[u8]> for ControlPlaneKey {
    type Error = IdentityError;

    fn try_from(bytes: &[u8]) -> Result<Self, IdentityError> {
        <[u8; CONTROL_PLANE_KEY_LEN]>::try_from(bytes)
            .map(Self)
            .map_err(|_| IdentityError::Length {
                what: "control-plane key",
                len: bytes.len(),
                want: CONTROL_PLANE_KEY_LEN,
            })
    }
}

impl FromStr for ControlPlaneKey {
    type Err = IdentityError;

    fn from_str(text: &str) -> Result<Self, IdentityError> {
        let text = text.trim();
        if text.len() != 2 * CONTROL_PLANE_KEY_LEN {
            return Err(IdentityError::Hex);
        }
        let mut out = [0u8; CONTROL_PLANE_KEY_LEN];
        hex::decode_to_slice(text, &mut out).map_err(|_| IdentityError::Hex)?;
        Ok(Self(out))
    }
}

impl fmt::Display for ControlPlaneKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for ControlPlaneKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ControlPlaneKey({self})")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::{ClusterKms, KeyId};

    fn seed(byte: u8) -> ControlPlaneSeed {
        ControlPlaneSeed::derive(
            &MasterSecret::new(vec![byte; 32]).unwrap(),
            &Salt::new(vec![2; 32]).unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn a_signature_verifies_only_for_its_purpose_binding_bytes_and_key() {
        let signer = ControlPlaneSigner::new(&seed(1)).unwrap();
        let key = signer.public_key();
        let b = ChannelBinding([7; 32]);
        let sig = signer.sign(Purpose::JoinTicket, &b, b"ticket");
        key.verify(Purpose::JoinTicket, &b, b"ticket", &sig)
            .unwrap();
        assert!(
            key.verify(Purpose::RejoinTicket, &b, b"ticket", &sig)
                .is_err()
        );
        assert!(
            key.verify(
                Purpose::JoinTicket,
                &ChannelBinding([8; 32]),
                b"ticket",
                &sig
            )
            .is_err()
        );
        assert!(
            key.verify(Purpose::JoinTicket, &b, b"ticket!", &sig)
                .is_err()
        );
        let other = ControlPlaneSigner::new(&seed(3)).unwrap().public_key();
        assert!(matches!(
            other.verify(Purpose::JoinTicket, &b, b"ticket", &sig),
            Err(IdentityError::BadSignature { .. })
        ));
        assert_eq!(
            key.verify(Purpose::JoinTicket, &b, b"ticket", &[]),
            Err(IdentityError::Unsigned)
        );
    }

    #[test]
    fn the_seed_is_no_data_key() {
        // No GetDataKey ID reaches the identity's info string: every data key's info starts
        // with "key-", and this one does not.
        assert!(!CONTROL_PLANE_IDENTITY_INFO.starts_with(crate::KEY_ID_PREFIX.as_bytes()));
        let kms = ClusterKms::new(
            MasterSecret::new(vec![1; 32]).unwrap(),
            Salt::new(vec![2; 32]).unwrap(),
        );
        let id = KeyId::parse("asterism/control-plane-identity/v1").unwrap();
        let data = kms.data_key(&id, 32).unwrap();
        assert_ne!(data.expose_secret(), seed(1).expose_secret().as_slice());
    }

    #[test]
    fn keys_print_and_parse_as_hex_and_wrong_forms_are_refused() {
        let key = seed(1).public_key().unwrap();
        assert_eq!(key.to_string().parse::<ControlPlaneKey>().unwrap(), key);
        assert!("00".parse::<ControlPlaneKey>().is_err());
        assert!("zz".repeat(32).parse::<ControlPlaneKey>().is_err());
        assert_eq!(format!("{:?}", seed(1)), "ControlPlaneSeed(<redacted>)");
    }
}

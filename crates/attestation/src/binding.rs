//! Report data: the 32 bytes every piece of evidence signs, domain-separated by purpose.

use std::fmt;

/// What the evidence is for. Each purpose has its own label, so evidence made for one
/// can never be accepted for another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// Attested TLS: binds evidence to one TLS session (`asterism/atls/v1`).
    Atls,
    /// `asterism verify`: binds evidence to a verifier's nonce (`asterism/verify/v1`).
    Verify,
    /// An aTLS session key: binds evidence to an ephemeral signing key, its expiry and the
    /// attesting role (`asterism/atls-session-key/v1`); see `docs/atls.md`.
    AtlsSessionKey,
}

impl Purpose {
    /// The domain-separation label hashed in front of everything else.
    pub fn label(self) -> &'static [u8] {
        match self {
            Purpose::Atls => b"asterism/atls/v1",
            Purpose::Verify => b"asterism/verify/v1",
            Purpose::AtlsSessionKey => b"asterism/atls-session-key/v1",
        }
    }
}

/// Which end of a connection attests; hashed into the binding so evidence cannot be
/// reflected back to the side that sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The side that opened the connection.
    Client,
    /// The side that accepted it.
    Server,
}

impl Role {
    /// The role label as hashed into the binding.
    pub fn label(self) -> &'static [u8] {
        match self {
            Role::Client => b"client",
            Role::Server => b"server",
        }
    }

    /// The other end.
    pub fn peer(self) -> Role {
        match self {
            Role::Client => Role::Server,
            Role::Server => Role::Client,
        }
    }
}

/// The 32 bytes an issuer signs. Only the purpose-specific constructors below make one.
#[derive(Clone, PartialEq, Eq)]
pub struct ReportData([u8; 32]);

impl ReportData {
    /// `SHA-256("asterism/atls/v1" || role || exporter)`: binds evidence to one TLS session
    /// (its RFC 8446 exporter value) and to the attesting side's role.
    pub fn atls(role: Role, exporter: &[u8; 32]) -> Self {
        Self(crate::sha::sha256_parts([
            Purpose::Atls.label(),
            role.label(),
            exporter.as_slice(),
        ]))
    }

    /// `SHA-256("asterism/atls-session-key/v1" || role || public_key || not_after)`, with
    /// `not_after` as 8 big-endian bytes (seconds since the Unix epoch): binds evidence to
    /// an aTLS session key of the attesting side, which then signs each connection.
    pub fn atls_session_key(role: Role, public_key: &[u8; 32], not_after_unix: u64) -> Self {
        Self(crate::sha::sha256_parts([
            Purpose::AtlsSessionKey.label(),
            role.label(),
            public_key.as_slice(),
            not_after_unix.to_be_bytes().as_slice(),
        ]))
    }

    /// `SHA-256("asterism/verify/v1" || nonce)`: binds evidence to a verifier's nonce.
    pub fn verify(nonce: &[u8]) -> Self {
        Self(crate::sha::sha256_parts([Purpose::Verify.label(), nonce]))
    }

    /// The bytes to embed in evidence (the TPM quote's qualifying data, say).
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Whether `bytes` equals this binding, in constant time.
    pub fn matches(&self, bytes: &[u8]) -> bool {
        use subtle::ConstantTimeEq;
        bytes.len() == 32 && bool::from(self.0.as_slice().ct_eq(bytes))
    }
}

impl fmt::Debug for ReportData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ReportData({})", hex::encode(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    #[test]
    fn roles_and_purposes_give_different_bindings() {
        let e = [7u8; 32];
        let c = ReportData::atls(Role::Client, &e);
        let s = ReportData::atls(Role::Server, &e);
        let v = ReportData::verify(&e);
        let k = ReportData::atls_session_key(Role::Server, &e, 0);
        assert_ne!(k, s);
        assert_ne!(k, ReportData::atls_session_key(Role::Client, &e, 0));
        assert_ne!(k, ReportData::atls_session_key(Role::Server, &e, 1));
        assert_ne!(c, s);
        assert_ne!(c, v);
        assert_ne!(s, v);
        assert_eq!(c, ReportData::atls(Role::Client, &e));
    }

    #[test]
    fn atls_binding_is_sha256_of_label_role_exporter() {
        let e = [0u8; 32];
        let mut input = b"asterism/atls/v1server".to_vec();
        input.extend_from_slice(&e);
        let want: [u8; 32] = Sha256::digest(&input).into();
        assert_eq!(ReportData::atls(Role::Server, &e).as_bytes(), &want);
    }

    #[test]
    fn matches_rejects_other_lengths() {
        let r = ReportData::verify(b"n");
        assert!(r.matches(r.as_bytes()));
        assert!(!r.matches(&r.as_bytes()[..31]));
        assert!(!r.matches(&[0u8; 32]));
    }
}

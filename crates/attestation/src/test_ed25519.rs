//! **Insecure, for tests and development only**: an issuer/validator pair that signs the
//! report data with an Ed25519 key instead of a hardware root of trust.
//!
//! The signatures are real (a wrong key, a tampered signature or another binding is
//! rejected), but nothing ties the key to a measured platform. Creating either side logs a
//! warning, and a release build refuses the `insecure-test-attestation` feature.
//!
//! Evidence layout (fixed size, 97 bytes):
//! `version (1 byte, = 1) || public key (32) || signature (64)`, where the signature is
//! Ed25519 over `"asterism/test-ed25519/v1" || report data (32)`.

use crate::{IssueError, Issuer, ReportData, ValidationError, Validator, VerifiedEvidence};
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use std::collections::HashSet;

/// Variant name of this evidence.
pub const VARIANT: &str = "insecure-test-ed25519";
const VERSION: u8 = 1;
const CONTEXT: &[u8] = b"asterism/test-ed25519/v1";
const EVIDENCE_LEN: usize = 1 + 32 + 64;

fn signed_message(report_data: &ReportData) -> [u8; CONTEXT.len() + 32] {
    let mut msg = [0u8; CONTEXT.len() + 32];
    let (ctx, rd) = msg.split_at_mut(CONTEXT.len());
    ctx.copy_from_slice(CONTEXT);
    rd.copy_from_slice(report_data.as_bytes());
    msg
}

/// Signs report data with an Ed25519 key. Insecure: see the module documentation.
pub struct InsecureTestIssuer {
    key: Ed25519KeyPair,
}

impl InsecureTestIssuer {
    /// An issuer with a key derived from a 32-byte seed.
    pub fn from_seed(seed: &[u8; 32]) -> Result<Self, IssueError> {
        tracing::warn!(
            "using the insecure Ed25519 test issuer: evidence proves nothing about the platform"
        );
        let key = Ed25519KeyPair::from_seed_unchecked(seed).map_err(|e| IssueError {
            variant: VARIANT,
            message: format!("invalid Ed25519 seed: {e}"),
            source: None,
        })?;
        Ok(Self { key })
    }

    /// The public key a validator must trust to accept this issuer's evidence.
    pub fn public_key(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        out.copy_from_slice(self.key.public_key().as_ref());
        out
    }
}

impl Issuer for InsecureTestIssuer {
    fn variant(&self) -> &'static str {
        VARIANT
    }

    fn issue(&self, report_data: &ReportData) -> Result<Vec<u8>, IssueError> {
        let sig = self.key.sign(&signed_message(report_data));
        let mut out = Vec::with_capacity(EVIDENCE_LEN);
        out.push(VERSION);
        out.extend_from_slice(self.key.public_key().as_ref());
        out.extend_from_slice(sig.as_ref());
        Ok(out)
    }

    fn blocks(&self) -> bool {
        false
    }
}

/// Accepts evidence signed by one of a set of pinned Ed25519 keys. Insecure: see the
/// module documentation.
pub struct InsecureTestValidator {
    trusted: HashSet<[u8; 32]>,
}

impl InsecureTestValidator {
    /// A validator that trusts exactly `trusted` public keys.
    pub fn new(trusted: impl IntoIterator<Item = [u8; 32]>) -> Self {
        tracing::warn!(
            "using the insecure Ed25519 test validator: accepted evidence proves nothing about the platform"
        );
        Self {
            trusted: trusted.into_iter().collect(),
        }
    }
}

impl crate::sealed::Sealed for InsecureTestValidator {}

impl Validator for InsecureTestValidator {
    fn variant(&self) -> &'static str {
        VARIANT
    }

    fn validate(
        &self,
        evidence: &[u8],
        expected: &ReportData,
    ) -> Result<VerifiedEvidence, ValidationError> {
        if evidence.len() != EVIDENCE_LEN {
            return Err(ValidationError::Malformed(format!(
                "test evidence is {} bytes, want {EVIDENCE_LEN}",
                evidence.len()
            )));
        }
        let (version, rest) = evidence
            .split_first()
            .ok_or_else(|| ValidationError::Malformed("empty".into()))?;
        if *version != VERSION {
            return Err(ValidationError::Malformed(format!(
                "unsupported test evidence version {version}"
            )));
        }
        let (pk, sig) = rest.split_at(32);
        let pk: [u8; 32] = pk
            .try_into()
            .map_err(|_| ValidationError::Malformed("public key".into()))?;
        if !self.trusted.contains(&pk) {
            return Err(ValidationError::UntrustedKey(hex::encode(pk)));
        }
        UnparsedPublicKey::new(&ED25519, pk)
            .verify(&signed_message(expected), sig)
            .map_err(|_| {
                // A valid signature by a trusted key over other report data is the
                // replay/reflection case; either way, the binding did not verify.
                ValidationError::BindingMismatch
            })?;
        Ok(VerifiedEvidence::new(
            VARIANT,
            hex::encode(pk),
            Vec::new(),
            Vec::new(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Role;

    fn pair() -> (InsecureTestIssuer, InsecureTestValidator) {
        let issuer = InsecureTestIssuer::from_seed(&[1u8; 32]).unwrap();
        let validator = InsecureTestValidator::new([issuer.public_key()]);
        (issuer, validator)
    }

    #[test]
    fn accepts_evidence_over_the_expected_binding() {
        let (issuer, validator) = pair();
        let rd = ReportData::atls(Role::Server, &[3u8; 32]);
        let ev = issuer.issue(&rd).unwrap();
        let verified = validator.validate(&ev, &rd).unwrap();
        assert_eq!(verified.identity(), hex::encode(issuer.public_key()));
    }

    #[test]
    fn rejects_evidence_bound_to_other_report_data() {
        let (issuer, validator) = pair();
        let ev = issuer
            .issue(&ReportData::atls(Role::Server, &[3u8; 32]))
            .unwrap();
        let other = ReportData::atls(Role::Client, &[3u8; 32]);
        assert_eq!(
            validator.validate(&ev, &other).unwrap_err(),
            ValidationError::BindingMismatch
        );
    }

    #[test]
    fn rejects_an_untrusted_key() {
        let (_, validator) = pair();
        let stranger = InsecureTestIssuer::from_seed(&[2u8; 32]).unwrap();
        let rd = ReportData::verify(b"n");
        let ev = stranger.issue(&rd).unwrap();
        assert!(matches!(
            validator.validate(&ev, &rd),
            Err(ValidationError::UntrustedKey(_))
        ));
    }

    #[test]
    fn rejects_a_tampered_signature_and_bad_lengths() {
        let (issuer, validator) = pair();
        let rd = ReportData::verify(b"n");
        let mut ev = issuer.issue(&rd).unwrap();
        ev[EVIDENCE_LEN - 1] ^= 1;
        assert!(validator.validate(&ev, &rd).is_err());
        let ev = issuer.issue(&rd).unwrap();
        assert!(matches!(
            validator.validate(&ev[..EVIDENCE_LEN - 1], &rd),
            Err(ValidationError::Malformed(_))
        ));
        let mut long = ev.clone();
        long.push(0);
        assert!(matches!(
            validator.validate(&long, &rd),
            Err(ValidationError::Malformed(_))
        ));
    }
}

//! The proof that a validator accepted evidence.

use std::fmt;

/// One measured value the evidence attested (for a TPM: a PCR index and its digest).
#[derive(Clone, PartialEq, Eq)]
pub struct Measurement {
    /// Measurement index (PCR number).
    pub index: u32,
    /// The attested value.
    pub value: Vec<u8>,
}

impl fmt::Debug for Measurement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.index, hex::encode(&self.value))
    }
}

/// Evidence that a validator of this crate checked and accepted.
///
/// There is no public constructor: a value of this type exists only because a
/// [`crate::Validator`] returned it.
#[derive(Clone)]
pub struct VerifiedEvidence {
    variant: &'static str,
    identity: String,
    measurements: Vec<Measurement>,
    warnings: Vec<String>,
}

impl VerifiedEvidence {
    /// Only validators in this crate make these.
    #[allow(dead_code)] // used by the feature-gated and later variants
    pub(crate) fn new(
        variant: &'static str,
        identity: String,
        measurements: Vec<Measurement>,
        warnings: Vec<String>,
    ) -> Self {
        Self {
            variant,
            identity,
            measurements,
            warnings,
        }
    }

    /// The evidence variant (for example `tpm-quote`).
    pub fn variant(&self) -> &'static str {
        self.variant
    }

    /// A stable, non-secret identity of the attesting key (for example the SHA-256 of the
    /// attestation key's public area, hex).
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The measured values the evidence attested, by index.
    pub fn measurements(&self) -> &[Measurement] {
        &self.measurements
    }

    /// Warn-only policy deviations that were accepted (already logged by the validator).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }
}

impl fmt::Debug for VerifiedEvidence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerifiedEvidence")
            .field("variant", &self.variant)
            .field("identity", &self.identity)
            .field("measurements", &self.measurements)
            .field("warnings", &self.warnings)
            .finish()
    }
}

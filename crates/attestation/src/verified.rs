//! The proof that a validator accepted evidence.

use crate::explain::Check;
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
    checks: Vec<Check>,
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
            checks: Vec::new(),
        }
    }

    /// Adds the field-by-field record of a confidential-VM report's checks.
    #[allow(dead_code)] // used by the confidential-VM AK trust modes
    pub(crate) fn with_checks(mut self, checks: Vec<Check>) -> Self {
        self.checks = checks;
        self
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

    /// What was checked of a confidential-VM hardware report under the evidence, field by
    /// field (empty for evidence without one).
    pub fn checks(&self) -> &[Check] {
        &self.checks
    }
}

impl fmt::Debug for VerifiedEvidence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerifiedEvidence")
            .field("variant", &self.variant)
            .field("identity", &self.identity)
            .field("measurements", &self.measurements)
            .field("warnings", &self.warnings)
            .field("checks", &self.checks.len())
            .finish()
    }
}

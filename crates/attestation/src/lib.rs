//! Attestation for Asterism: what a node presents to prove what it is, and how a verifier
//! checks it.
//!
//! * [`Issuer`] produces evidence over a [`ReportData`] binding.
//! * [`Validator`] checks evidence against the binding the verifier computed itself and,
//!   only on success, returns a [`VerifiedEvidence`]. That type has no public constructor
//!   and [`Validator`] is sealed, so holding a `VerifiedEvidence` proves a validator of this
//!   crate accepted the evidence. Whatever releases a secret must take it.
//! * [`ReportData`] is built only through purpose-specific constructors, so evidence issued
//!   for one purpose (say, `asterism verify`) can never satisfy another (attested TLS).
//!
//! This crate must never depend on an async runtime or a C library: verifiers embed it.
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::indexing_slicing))]

/// `Display` and `FromStr` for an enum of named values: a value is written as its
/// `name()`, and a text is read back as the value of `$all` with that name, any other text
/// being the error `$err(text)`.
macro_rules! display_and_parse_by_name {
    ($ty:ty, $err:ident, $all:expr) => {
        impl ::std::fmt::Display for $ty {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl ::std::str::FromStr for $ty {
            type Err = $err;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                $all.into_iter()
                    .find(|v| v.name() == s)
                    .ok_or_else(|| $err(s.to_owned()))
            }
        }
    };
}

mod binding;
pub mod cvm_policy;
pub mod explain;
pub mod hcl;
pub mod measurements;
pub(crate) mod memo;
pub mod revocation;
mod sha;
pub mod snp;
pub mod tdx;
pub mod tpm;
mod verified;

#[cfg(feature = "insecure-test-attestation")]
pub mod test_ed25519;

pub use binding::{Purpose, ReportData, Role};
pub use measurements::{
    CvmReferences, ExpectedPcr, InsecureNoLaunchMeasurement, MeasurementMode, Measurements,
    MeasurementsError, MeasurementsProvider, PcrIndex, ReferenceEvent, SharedMeasurements,
};
pub use tpm::{AkFingerprint, AkTrust, PlatformCa, TpmQuoteValidator};
pub use verified::{Measurement, VerifiedEvidence};

/// Why an [`Issuer`] could not produce evidence.
#[derive(Debug, thiserror::Error)]
#[error("{variant}: issuing evidence failed: {message}")]
pub struct IssueError {
    /// The variant whose issuer failed.
    pub variant: &'static str,
    /// What went wrong, without secrets.
    pub message: String,
    /// The underlying cause, when there is one.
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

/// Why evidence was rejected. The message names what failed (for measurements: index,
/// expected and observed value) and holds nothing secret, so it may go to the peer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    /// The evidence could not be decoded (wrong size, trailing bytes, bad version).
    #[error("malformed evidence: {0}")]
    Malformed(String),
    /// The evidence is for another variant than this validator's.
    #[error("evidence variant {got:?} does not match validator variant {want:?}")]
    WrongVariant {
        /// Variant the validator handles.
        want: &'static str,
        /// Variant named in the evidence.
        got: String,
    },
    /// The signing key is not trusted by the configured policy.
    #[error("untrusted attestation key: {0}")]
    UntrustedKey(String),
    /// A signature over the evidence did not verify.
    #[error("bad signature: {0}")]
    BadSignature(String),
    /// The evidence is bound to other report data (another session, role or purpose).
    #[error("evidence is bound to other report data (another session, role or purpose)")]
    BindingMismatch,
    /// An enforced measurement differs from its expected value.
    #[error("measurement mismatch at index {index}: expected {expected}, observed {observed}")]
    Measurement {
        /// Measurement (PCR) index.
        index: u32,
        /// Expected value, lower-case hex.
        expected: String,
        /// Observed value, lower-case hex.
        observed: String,
    },
    /// The evidence carries an event log that is not a well-formed TCG event log.
    #[error("event log: {0}")]
    EventLog(tpm::eventlog::EventLogError),
    /// The event log does not replay to a PCR value the quote signed: it is not the log of
    /// this boot, or it was edited.
    #[error(
        "the event log is inconsistent with the quote at PCR {index}: it replays to {replayed}, \
         the quote holds {quoted}"
    )]
    EventLogReplay {
        /// The PCR.
        index: u32,
        /// The value the log's SHA-256 digests extend to, lower-case hex.
        replayed: String,
        /// The signed value, lower-case hex.
        quoted: String,
    },
    /// A structural or policy check failed (attributes, algorithms, selection, …).
    #[error("policy: {0}")]
    Policy(String),
    /// A field of a confidential-VM report does not meet the policy.
    #[error("{field}: expected {expected}, observed {observed}")]
    Field {
        /// The field, named as in the vendor's specification (`reported_tcb.snp`).
        field: String,
        /// What the policy wants.
        expected: String,
        /// What the report holds.
        observed: String,
    },
    /// A certificate, CRL or signed collateral item is not acceptable.
    #[error("certificate {which}: {reason}")]
    Certificate {
        /// Which one (`VCEK`, `ASK`, `ARK`, `PCK`, `TCB info`, …).
        which: String,
        /// Why it was refused (signature, validity period, issuer, extension, revoked).
        reason: String,
    },
    /// A certificate of the chain is listed by a verified, current CRL of its issuer.
    #[error("certificate {which} (serial {serial}) is revoked by the CRL of {issuer}")]
    Revoked {
        /// Which one (`ASK`, `ASVK`, `PCK CA`, `PCK`).
        which: String,
        /// Its serial number, hex, as encoded in the certificate.
        serial: String,
        /// The issuer of the CRL that lists it.
        issuer: String,
    },
}

impl From<&explain::Check> for ValidationError {
    fn from(c: &explain::Check) -> Self {
        ValidationError::Field {
            field: c.field.to_string(),
            expected: c.expected.to_string(),
            observed: c.observed.to_string(),
        }
    }
}

/// Produces evidence that binds `report_data` to the attesting platform.
///
/// Implementations may block (a TPM quote takes milliseconds); callers in async code run
/// them off the reactor when [`Issuer::blocks`] says so.
pub trait Issuer: Send + Sync {
    /// The variant name written into the evidence (for example `tpm-quote`).
    fn variant(&self) -> &'static str;

    /// Produces evidence over `report_data`.
    fn issue(&self, report_data: &ReportData) -> Result<Vec<u8>, IssueError>;

    /// Whether [`Issuer::issue`] may block the calling thread for long (device I/O).
    fn blocks(&self) -> bool {
        true
    }
}

/// Checks evidence of one variant against the binding the verifier computed itself.
///
/// Sealed: only this crate implements it, so a [`VerifiedEvidence`] always comes from a
/// real check.
pub trait Validator: sealed::Sealed + Send + Sync {
    /// The variant this validator accepts.
    fn variant(&self) -> &'static str;

    /// Verifies `evidence`; `expected` is the binding the caller computed for this session.
    fn validate(
        &self,
        evidence: &[u8],
        expected: &ReportData,
    ) -> Result<VerifiedEvidence, ValidationError>;
}

pub(crate) mod sealed {
    /// Prevents implementations of [`super::Validator`] outside this crate.
    pub trait Sealed {}
}

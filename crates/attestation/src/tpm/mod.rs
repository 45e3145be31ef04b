//! The `tpm-quote` evidence variant: a TPM 2.0 quote over the SHA-256 PCR bank, signed by
//! an attestation key (AK), with the AK's public area and optionally its certificate chain.
//!
//! * [`evidence`]: the versioned protobuf message and its strict decoder;
//! * [`cloud`]: AK certificates a cloud's vTPM CA issued (GCE, Azure) ([`CloudAkCa`]);
//! * [`ek`]: EK certificates checked against the operator's bundle of TPM manufacturers'
//!   CAs ([`ek::EkCaBundle`], [`ek::VerifiedEk`]);
//! * [`eventlog`]: the TCG event log a node may send along, parsed exactly and replayed
//!   against the quoted PCRs;
//! * [`structures`]: parsers (and marshallers) for `TPMS_ATTEST`, `TPMT_SIGNATURE` and
//!   `TPMT_PUBLIC`;
//! * [`TpmQuoteValidator`]: the verification, with a mandatory [`AkTrust`] policy and a
//!   [`crate::MeasurementsProvider`];
//!
//! Tests and benchmarks make evidence with the software quote builder of the
//! `asterism-soft-tpm` crate, which no program depends on.

mod ak;
pub mod cloud;
pub mod ek;
pub mod eventlog;
pub mod evidence;
mod evidence_wire;
mod platform;
pub mod structures;
mod trust;
mod validator;
mod wire;

pub(crate) use ak::AkKey;
pub use ak::{
    AK_ATTRIBUTES, AkFingerprint, AkTrustError, MAX_RSA_BITS, MIN_RSA_BITS, REQUIRED_AK_ATTRIBUTES,
    ak_spki_der, check_ak_template,
};
pub use cloud::CloudAkCa;
pub use evidence::{
    AwsSnp, AzureSnp, AzureTdx, EVIDENCE_VERSION, EvidenceError, MAX_EVIDENCE_SIZE, PcrValue,
    PlatformKind, PlatformReport, QuoteEvidence, TpmQuoteEvidence, VARIANT,
};
pub use platform::{
    CvmAkTrust, CvmPlatform, CvmTrustError, MAX_TDX_COLLATERAL_SETS, MissingReferences,
    TdxCollateralSet, UnknownPlatform,
};
pub use structures::{TpmsAttest, TpmtPublic, TpmtSignature};
#[cfg(feature = "insecure-test-attestation")]
pub use trust::InsecureAnyAk;
pub use trust::{AkTrust, PinnedAks, PlatformCa};
pub use validator::{Explained, TpmQuoteValidator};
pub use wire::ParseError;

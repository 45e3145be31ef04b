//! The `tpm-quote` evidence message (protobuf, version 1) and its decoder.
//!
//! ```proto
//! syntax = "proto3";
//! package asterism.attestation.v1;
//!
//! // Evidence of variant "tpm-quote".
//! message TpmQuoteEvidence {
//!   uint32 version = 1;                // = 1
//!   bytes attest = 2;                  // TPMS_ATTEST (TPM_ST_ATTEST_QUOTE), as signed
//!   bytes signature = 3;               // TPMT_SIGNATURE over attest
//!   repeated PcrValue pcrs = 4;        // SHA-256 bank, strictly ascending index
//!   bytes ak_public = 5;               // TPMT_PUBLIC of the attestation key
//!   repeated bytes ak_cert_chain = 6;  // DER, leaf first; may be empty
//!   optional bytes event_log = 7;      // TCG event log (binary_bios_measurements); when
//!                                      // present, replayed against pcrs (tpm::eventlog)
//!   optional PlatformReport platform = 8; // confidential VM: the hardware report the AK
//!                                         // is bound to; absent on other machines
//! }
//!
//! // The confidential-VM hardware report that vouches for the AK (docs/attestation.md).
//! message PlatformReport {
//!   oneof kind {
//!     AzureSnp azure_sev_snp = 1;
//!     AzureTdx azure_tdx = 2;
//!     AwsSnp aws_sev_snp = 3;
//!   }
//! }
//! // Azure SEV-SNP: the HCL report read from the vTPM (SNP report + runtime data with the
//! // AK), and the VCEK (DER) with its ASK, as Azure's certificate service serves them.
//! message AzureSnp { bytes hcl_report = 1; repeated bytes certs = 2; }
//! // Azure TDX: the DCAP quote over the HCL report's TD report, and the runtime data
//! // (with the AK) whose SHA-256 the quote's REPORT_DATA carries.
//! message AzureTdx { bytes quote = 1; bytes runtime_data = 2; }
//! // AWS SEV-SNP: the SNP report whose REPORT_DATA is SHA-512 of the AK, and the VLEK
//! // (DER) with its ASVK.
//! message AwsSnp { bytes report = 1; repeated bytes certs = 2; }
//!
//! message PcrValue {
//!   uint32 index = 1;                  // 0..=23
//!   bytes value = 2;                   // 32 bytes
//! }
//! ```
//!
//! Decoding is strict: at most [`MAX_EVIDENCE_SIZE`] bytes, checked before decoding; the
//! encoding must be canonical (exactly what an encoder writes for the decoded message:
//! fields in number order, no unknown or repeated scalar fields, minimal varints; checked in
//! the same pass that reads it, [`super::evidence_wire`]); the version must be 1; and every
//! TPM structure must parse exactly.

use super::structures::{TpmsAttest, TpmtPublic, TpmtSignature};
use super::wire::ParseError;
use crate::measurements::PcrIndex;
use prost::Message;
use std::collections::BTreeMap;

/// The variant name of this evidence.
pub const VARIANT: &str = "tpm-quote";
/// The only evidence version this crate reads and writes.
pub const EVIDENCE_VERSION: u32 = 1;
/// Largest evidence accepted, checked before anything is decoded.
pub const MAX_EVIDENCE_SIZE: usize = 64 * 1024;
/// Most certificates an AK chain may carry (leaf and intermediates).
pub const MAX_CERT_CHAIN: usize = 4;

/// Wire form of the `tpm-quote` evidence (see the module documentation for the .proto).
#[derive(Clone, PartialEq, Message)]
pub struct TpmQuoteEvidence {
    /// Evidence format version; must be [`EVIDENCE_VERSION`].
    #[prost(uint32, tag = "1")]
    pub version: u32,
    /// `TPMS_ATTEST` bytes exactly as the TPM signed them.
    #[prost(bytes = "vec", tag = "2")]
    pub attest: Vec<u8>,
    /// `TPMT_SIGNATURE` over `attest`.
    #[prost(bytes = "vec", tag = "3")]
    pub signature: Vec<u8>,
    /// SHA-256 bank PCR values, strictly ascending by index.
    #[prost(message, repeated, tag = "4")]
    pub pcrs: Vec<PcrValue>,
    /// `TPMT_PUBLIC` of the attestation key.
    #[prost(bytes = "vec", tag = "5")]
    pub ak_public: Vec<u8>,
    /// DER certificates for the AK, leaf first; may be empty.
    #[prost(bytes = "vec", repeated, tag = "6")]
    pub ak_cert_chain: Vec<Vec<u8>>,
    /// TCG event log (`binary_bios_measurements`); when present, the validator replays it
    /// against `pcrs` ([`super::eventlog`]).
    #[prost(bytes = "vec", optional, tag = "7")]
    pub event_log: Option<Vec<u8>>,
    /// On a confidential VM: the hardware report the AK is bound to.
    #[prost(message, optional, tag = "8")]
    pub platform: Option<PlatformReport>,
}

/// The confidential-VM hardware report that vouches for the AK.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct PlatformReport {
    /// Which cloud's binding, with its report.
    #[prost(oneof = "PlatformKind", tags = "1, 2, 3")]
    pub kind: Option<PlatformKind>,
}

/// The bindings of a vTPM's AK to a hardware report, as the clouds ship them.
#[derive(Clone, PartialEq, Eq, prost::Oneof)]
pub enum PlatformKind {
    /// Azure SEV-SNP.
    #[prost(message, tag = "1")]
    AzureSevSnp(AzureSnp),
    /// Azure TDX.
    #[prost(message, tag = "2")]
    AzureTdx(AzureTdx),
    /// AWS SEV-SNP.
    #[prost(message, tag = "3")]
    AwsSevSnp(AwsSnp),
}

/// Azure SEV-SNP: the vTPM's HCL report and the VCEK chain.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct AzureSnp {
    /// The HCL report as read from the vTPM's NV index.
    #[prost(bytes = "vec", tag = "1")]
    pub hcl_report: Vec<u8>,
    /// The VCEK (DER), then the ASK (DER); the ARK is built into the verifier.
    #[prost(bytes = "vec", repeated, tag = "2")]
    pub certs: Vec<Vec<u8>>,
}

/// Azure TDX: the quote over the HCL report's TD report and the runtime data.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct AzureTdx {
    /// The DCAP quote (version 4 or 5).
    #[prost(bytes = "vec", tag = "1")]
    pub quote: Vec<u8>,
    /// The HCL runtime data (JSON with the AK) whose SHA-256 the quote's REPORT_DATA holds.
    #[prost(bytes = "vec", tag = "2")]
    pub runtime_data: Vec<u8>,
}

/// AWS SEV-SNP: the SNP report bound to the AK and the VLEK chain.
#[derive(Clone, PartialEq, Eq, Message)]
pub struct AwsSnp {
    /// The SNP attestation report.
    #[prost(bytes = "vec", tag = "1")]
    pub report: Vec<u8>,
    /// The VLEK (DER), then the ASVK (DER); the ARK is built into the verifier.
    #[prost(bytes = "vec", repeated, tag = "2")]
    pub certs: Vec<Vec<u8>>,
}

/// One SHA-256 PCR value.
#[derive(Clone, PartialEq, Message)]
pub struct PcrValue {
    /// PCR index, `0..=23`.
    #[prost(uint32, tag = "1")]
    pub index: u32,
    /// The 32-byte value.
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

/// Why `tpm-quote` evidence could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EvidenceError {
    /// Larger than [`MAX_EVIDENCE_SIZE`].
    #[error("evidence is {0} bytes, at most {MAX_EVIDENCE_SIZE} allowed")]
    TooLarge(usize),
    /// Not a protobuf `TpmQuoteEvidence`.
    #[error("not a TpmQuoteEvidence message: {0}")]
    Protobuf(String),
    /// Valid protobuf, but not the canonical encoding of the message.
    #[error(
        "evidence is not canonically encoded (field order, unknown or repeated fields, or padding)"
    )]
    NonCanonical,
    /// A version other than [`EVIDENCE_VERSION`].
    #[error("unsupported evidence version {0} (want {EVIDENCE_VERSION})")]
    UnsupportedVersion(u32),
    /// `attest` is not a quote `TPMS_ATTEST`.
    #[error("attest")]
    Attest(#[source] ParseError),
    /// `signature` is not a supported `TPMT_SIGNATURE`.
    #[error("signature")]
    Signature(#[source] ParseError),
    /// `ak_public` is not an RSA or ECC `TPMT_PUBLIC`.
    #[error("ak_public")]
    AkPublic(#[source] ParseError),
    /// A PCR index outside `0..=23`.
    #[error("PCR index {0} out of range 0..=23")]
    PcrIndex(u32),
    /// PCR indices not strictly ascending (unordered or repeated).
    #[error("PCR {0} is out of order or repeated (indices must be strictly ascending)")]
    PcrOrder(u32),
    /// A PCR value that is not 32 bytes.
    #[error("PCR {index} value is {len} bytes, want 32 (SHA-256)")]
    PcrLength {
        /// The PCR.
        index: u32,
        /// Its length.
        len: usize,
    },
    /// A `platform` field that names no platform (one meaning, one encoding: leave the
    /// field out instead).
    #[error("the platform report is empty")]
    EmptyPlatform,
    /// More certificates than [`MAX_CERT_CHAIN`].
    #[error("AK certificate chain has {0} certificates, at most {MAX_CERT_CHAIN} allowed")]
    CertChainTooLong(usize),
}

/// Decoded `tpm-quote` evidence: every structure parsed, nothing verified yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuoteEvidence {
    /// The `TPMS_ATTEST` bytes as signed.
    pub attest_bytes: Vec<u8>,
    /// The parsed quote.
    pub attest: TpmsAttest,
    /// The parsed signature.
    pub signature: TpmtSignature,
    /// The supplied SHA-256 PCR values.
    pub pcrs: BTreeMap<PcrIndex, [u8; 32]>,
    /// The `TPMT_PUBLIC` bytes of the AK as supplied.
    pub ak_public_bytes: Vec<u8>,
    /// The parsed AK public area.
    pub ak_public: TpmtPublic,
    /// DER certificates, leaf first.
    pub ak_cert_chain: Vec<Vec<u8>>,
    /// The event log, if any.
    pub event_log: Option<Vec<u8>>,
    /// The confidential-VM hardware report the AK is bound to, if any (checked by the AK
    /// trust policy that needs it).
    pub platform: Option<PlatformKind>,
}

impl QuoteEvidence {
    /// Builds decoded evidence from its wire fields, checking what the wire form leaves
    /// open: the version, a platform report that names a platform, the chain's length,
    /// each TPM structure, and the PCR list.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn from_parts(
        version: u32,
        platform: Option<Option<PlatformKind>>,
        attest: &[u8],
        signature: &[u8],
        ak_public: &[u8],
        chain: Vec<&[u8]>,
        pcrs: &[(u32, &[u8])],
        event_log: Option<&[u8]>,
    ) -> Result<Self, EvidenceError> {
        if version != EVIDENCE_VERSION {
            return Err(EvidenceError::UnsupportedVersion(version));
        }
        let platform = match platform {
            None => None,
            Some(None) => return Err(EvidenceError::EmptyPlatform),
            Some(kind) => kind,
        };
        if chain.len() > MAX_CERT_CHAIN {
            return Err(EvidenceError::CertChainTooLong(chain.len()));
        }
        let parsed_attest = TpmsAttest::parse(attest).map_err(EvidenceError::Attest)?;
        let parsed_signature = TpmtSignature::parse(signature).map_err(EvidenceError::Signature)?;
        let parsed_ak = TpmtPublic::parse(ak_public).map_err(EvidenceError::AkPublic)?;
        let mut map = BTreeMap::new();
        let mut last: Option<PcrIndex> = None;
        for &(raw, value) in pcrs {
            let index = u8::try_from(raw)
                .ok()
                .and_then(PcrIndex::new)
                .ok_or(EvidenceError::PcrIndex(raw))?;
            if last.is_some_and(|l| l >= index) {
                return Err(EvidenceError::PcrOrder(raw));
            }
            last = Some(index);
            let value: [u8; 32] = value.try_into().map_err(|_| EvidenceError::PcrLength {
                index: raw,
                len: value.len(),
            })?;
            map.insert(index, value);
        }
        Ok(Self {
            attest_bytes: attest.to_vec(),
            attest: parsed_attest,
            signature: parsed_signature,
            pcrs: map,
            ak_public_bytes: ak_public.to_vec(),
            ak_public: parsed_ak,
            ak_cert_chain: chain.into_iter().map(<[u8]>::to_vec).collect(),
            event_log: event_log.map(<[u8]>::to_vec),
            platform,
        })
    }
}

/// The wire message as prost decoded it; canonical encoding is not checked here (decode
/// bytes with [`QuoteEvidence::decode`], which does).
impl TryFrom<TpmQuoteEvidence> for QuoteEvidence {
    type Error = EvidenceError;

    fn try_from(wire: TpmQuoteEvidence) -> Result<Self, Self::Error> {
        let pcrs: Vec<(u32, &[u8])> = wire
            .pcrs
            .iter()
            .map(|p| (p.index, p.value.as_slice()))
            .collect();
        Self::from_parts(
            wire.version,
            wire.platform.map(|p| p.kind),
            &wire.attest,
            &wire.signature,
            &wire.ak_public,
            wire.ak_cert_chain.iter().map(Vec::as_slice).collect(),
            &pcrs,
            wire.event_log.as_deref(),
        )
    }
}

impl TpmQuoteEvidence {
    /// Assembles the wire message from already-marshalled TPM structures.
    pub fn new(
        attest: Vec<u8>,
        signature: Vec<u8>,
        pcrs: &BTreeMap<PcrIndex, [u8; 32]>,
        ak_public: Vec<u8>,
        ak_cert_chain: Vec<Vec<u8>>,
        event_log: Option<Vec<u8>>,
    ) -> Self {
        Self {
            version: EVIDENCE_VERSION,
            attest,
            signature,
            pcrs: pcrs
                .iter()
                .map(|(i, v)| PcrValue {
                    index: u32::from(i.get()),
                    value: v.to_vec(),
                })
                .collect(),
            ak_public,
            ak_cert_chain,
            event_log,
            platform: None,
        }
    }

    /// Adds the confidential-VM hardware report the AK is bound to.
    #[must_use]
    pub fn with_platform(mut self, kind: PlatformKind) -> Self {
        self.platform = Some(PlatformReport { kind: Some(kind) });
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_platform_report_round_trips_and_an_empty_one_is_refused() {
        let base = TpmQuoteEvidence::new(vec![1], vec![2], &BTreeMap::new(), vec![3], vec![], None);
        let kind = PlatformKind::AwsSevSnp(AwsSnp {
            report: vec![7; 16],
            certs: vec![vec![8; 4]],
        });
        let with = base.clone().with_platform(kind.clone());
        let decoded = TpmQuoteEvidence::decode(with.encode_to_vec().as_slice()).unwrap();
        assert_eq!(decoded.platform.and_then(|p| p.kind), Some(kind));

        let mut empty = base;
        empty.platform = Some(PlatformReport { kind: None });
        assert_eq!(
            QuoteEvidence::decode(&empty.encode_to_vec()),
            Err(EvidenceError::EmptyPlatform)
        );
    }
}

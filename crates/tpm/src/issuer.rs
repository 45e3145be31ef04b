//! The `tpm-quote` [`Issuer`]: evidence from a real TPM quote over the report data.
//!
//! Lives here rather than in `asterism-attestation` because it needs the TPM device, and
//! only this crate may link the TSS libraries; the verifier side stays pure Rust.

use crate::{AkConfig, AttestationKey, PcrSelection, Tpm, TpmError};
use asterism_attestation::tpm::{EVIDENCE_VERSION, PcrValue, TpmQuoteEvidence, VARIANT};
use asterism_attestation::{IssueError, Issuer, ReportData};
use prost::Message;
use std::sync::Mutex;

/// Quotes the configured PCRs with the report data as qualifying data and packs the
/// result, with the AK public area and certificate chain, into `tpm-quote` evidence.
///
/// The TPM is used from one thread at a time (a mutex); quotes take about a millisecond
/// on swtpm, so callers in async code run [`Issuer::issue`] on a blocking thread (the
/// aTLS crate does, because [`Issuer::blocks`] is true).
pub struct TpmIssuer {
    device: Mutex<(Tpm, AttestationKey)>,
    ak_public: Vec<u8>,
    selection: PcrSelection,
    ak_cert_chain: Vec<Vec<u8>>,
}

impl std::fmt::Debug for TpmIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TpmIssuer")
            .field("selection", &self.selection)
            .field("ak_cert_chain_len", &self.ak_cert_chain.len())
            .finish_non_exhaustive()
    }
}

impl TpmIssuer {
    /// Loads (or creates and persists) the AK described by `ak` on `tpm` and quotes
    /// `selection` on every [`Issuer::issue`]. `ak_cert_chain` (DER, leaf first) is sent
    /// along so that verifiers can check the AK against their platform CA.
    pub fn new(
        mut tpm: Tpm,
        ak: &AkConfig,
        selection: PcrSelection,
        ak_cert_chain: Vec<Vec<u8>>,
    ) -> Result<Self, TpmError> {
        let key = tpm.load_attestation_key(ak)?;
        Ok(Self {
            ak_public: key.public_area().to_vec(),
            device: Mutex::new((tpm, key)),
            selection,
            ak_cert_chain,
        })
    }

    /// The AK's `TPMT_PUBLIC`, as verifiers pin it.
    pub fn ak_public(&self) -> &[u8] {
        &self.ak_public
    }

    fn fail(message: impl Into<String>, source: Option<TpmError>) -> IssueError {
        IssueError {
            variant: VARIANT,
            message: message.into(),
            source: source.map(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>),
        }
    }
}

impl Issuer for TpmIssuer {
    fn variant(&self) -> &'static str {
        VARIANT
    }

    fn issue(&self, report_data: &ReportData) -> Result<Vec<u8>, IssueError> {
        let quote = {
            let mut guard = self
                .device
                .lock()
                .map_err(|_| Self::fail("the TPM lock is poisoned", None))?;
            let (tpm, key) = &mut *guard;
            tpm.quote(key, report_data.as_bytes(), &self.selection)
                .map_err(|e| Self::fail("quoting the PCRs failed", Some(e)))?
        };
        let evidence = TpmQuoteEvidence {
            version: EVIDENCE_VERSION,
            attest: quote.attest,
            signature: quote.signature,
            pcrs: quote
                .pcrs
                .into_iter()
                .map(|(index, value)| PcrValue {
                    index,
                    value: value.to_vec(),
                })
                .collect(),
            ak_public: self.ak_public.clone(),
            ak_cert_chain: self.ak_cert_chain.clone(),
            event_log: None,
        };
        Ok(evidence.encode_to_vec())
    }
}

//! The `tpm-quote` [`Issuer`]: evidence from a real TPM quote over the report data.
//!
//! Lives here rather than in `asterism-attestation` because it needs the TPM device, and
//! only this crate may link the TSS libraries; the verifier side stays pure Rust.

use crate::{AkConfig, AttestationKey, PcrSelection, Tpm, TpmConfig, TpmError};
use asterism_attestation::tpm::{
    EVIDENCE_VERSION, MAX_EVIDENCE_SIZE, PcrValue, PlatformKind, PlatformReport, TpmQuoteEvidence,
    VARIANT,
};
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
    device: Mutex<Device>,
    ak_public: Vec<u8>,
    selection: PcrSelection,
    ak_cert_chain: Vec<Vec<u8>>,
    platform: Option<PlatformKind>,
    event_log: Option<Vec<u8>>,
}

impl std::fmt::Debug for TpmIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TpmIssuer")
            .field("selection", &self.selection)
            .field("ak_cert_chain_len", &self.ak_cert_chain.len())
            .field("platform_report", &self.platform.is_some())
            .field("event_log_len", &self.event_log.as_ref().map(Vec::len))
            .finish_non_exhaustive()
    }
}

/// How the issuer reaches the TPM.
enum Device {
    /// One connection for the issuer's lifetime (fastest).
    Held(Box<Tpm>, AttestationKey),
    /// A new connection for every quote, closed right after: for TPMs that serve one client
    /// at a time (swtpm over TCP) and are shared between processes.
    PerUse(TpmConfig, AkConfig),
}

impl TpmIssuer {
    /// Like [`TpmIssuer::new`], but connects to the TPM for each quote and disconnects
    /// right after, so that other processes can use a TPM that serves one client at a time
    /// (swtpm). Costs a connection and an AK load (a persistent handle) per quote.
    pub fn connecting_per_use(
        config: TpmConfig,
        ak: AkConfig,
        selection: PcrSelection,
        ak_cert_chain: Vec<Vec<u8>>,
    ) -> Result<Self, TpmError> {
        let ak_public = {
            let mut tpm = Tpm::open(&config)?;
            tpm.load_attestation_key(&ak)?.public_area().to_vec()
        };
        Ok(Self {
            ak_public,
            device: Mutex::new(Device::PerUse(config, ak)),
            selection,
            ak_cert_chain,
            platform: None,
            event_log: None,
        })
    }

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
        Ok(Self::with_key(tpm, key, selection, ak_cert_chain))
    }

    /// Quotes with `key`, an AK already loaded on `tpm` (e.g. a cloud's AK made from its NV
    /// template, [`Tpm::load_nv_template_ak`]), on every [`Issuer::issue`]. `ak_cert_chain`
    /// as for [`TpmIssuer::new`].
    pub fn with_key(
        tpm: Tpm,
        key: AttestationKey,
        selection: PcrSelection,
        ak_cert_chain: Vec<Vec<u8>>,
    ) -> Self {
        Self {
            ak_public: key.public_area().to_vec(),
            device: Mutex::new(Device::Held(Box::new(tpm), key)),
            selection,
            ak_cert_chain,
            platform: None,
            event_log: None,
        }
    }

    /// Sends `report` with every quote: on a confidential VM, the hardware report that
    /// vouches for this AK (read once at start: it does not change while the VM runs).
    #[must_use]
    pub fn with_platform_report(mut self, report: PlatformKind) -> Self {
        self.platform = Some(report);
        self
    }

    /// Sends `log` with every quote: the TCG event log of this boot (read once at start:
    /// the firmware's log does not change after boot), which verifiers replay against the
    /// quoted PCRs to name the event behind a PCR that differs. A log that would make the
    /// evidence larger than [`MAX_EVIDENCE_SIZE`] is left out of that evidence, with a
    /// warning: the quote stands without it.
    #[must_use]
    pub fn with_event_log(mut self, log: Vec<u8>) -> Self {
        self.event_log = Some(log);
        self
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
            match &mut *guard {
                Device::Held(tpm, key) => tpm.quote(key, report_data.as_bytes(), &self.selection),
                Device::PerUse(config, ak) => Tpm::open(config).and_then(|mut tpm| {
                    let key = tpm.load_attestation_key(ak)?;
                    if key.public_area() != self.ak_public.as_slice() {
                        return Err(TpmError::AkReplaced {
                            handle: ak.handle.raw(),
                        });
                    }
                    tpm.quote(&key, report_data.as_bytes(), &self.selection)
                }),
            }
            .map_err(|e| Self::fail("quoting the PCRs failed", Some(e)))?
        };
        let mut evidence = TpmQuoteEvidence {
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
            event_log: self.event_log.clone(),
            platform: self
                .platform
                .clone()
                .map(|kind| PlatformReport { kind: Some(kind) }),
        };
        if evidence.encoded_len() > MAX_EVIDENCE_SIZE && evidence.event_log.is_some() {
            tracing::warn!(
                log_len = self.event_log.as_ref().map_or(0, Vec::len),
                max = MAX_EVIDENCE_SIZE,
                "the event log does not fit in the evidence; sending the quote without it"
            );
            evidence.event_log = None;
        }
        Ok(evidence.encode_to_vec())
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use asterism_attestation::tpm::QuoteEvidence;
    use asterism_attestation::{
        ExpectedPcr, Measurements, PcrIndex, Role, TpmQuoteValidator, ValidationError, Validator,
    };
    use asterism_testkit::{Swtpm, pin};

    /// A crypto-agile log (SHA-256 only) with one `EV_EFI_ACTION` event on PCR 23.
    fn log_extending_pcr23(digest: [u8; 32]) -> Vec<u8> {
        let mut spec = b"Spec ID Event03\0".to_vec();
        spec.extend_from_slice(&[0, 0, 0, 0, 0, 2, 0, 2, 1, 0, 0, 0, 0x0b, 0, 32, 0, 0]);
        let mut log = [0u32, 3].map(u32::to_le_bytes).concat();
        log.extend_from_slice(&[0; 20]);
        log.extend_from_slice(&u32::try_from(spec.len()).unwrap().to_le_bytes());
        log.extend_from_slice(&spec);
        log.extend_from_slice(&[23u32, 0x8000_0007, 1].map(u32::to_le_bytes).concat());
        log.extend_from_slice(&0x000bu16.to_le_bytes());
        log.extend_from_slice(&digest);
        log.extend_from_slice(&0u32.to_le_bytes());
        log
    }

    #[test]
    fn the_event_log_goes_with_the_quote_and_is_replayed_by_the_verifier() {
        let swtpm = Swtpm::start().unwrap();
        // Through its TCTI string: the test kit links its own build of this crate.
        let config: TpmConfig = swtpm.tcti().parse().unwrap();
        let mut tpm = Tpm::open(&config).unwrap();
        tpm.extend_pcr(23, &[0x23; 32]).unwrap();
        let pcr0 = tpm.read_pcrs(&PcrSelection::new([0]).unwrap()).unwrap()[0].1;
        let issuer = TpmIssuer::new(tpm, &AkConfig::default(), PcrSelection::all(), Vec::new())
            .unwrap()
            .with_event_log(log_extending_pcr23([0x23; 32]));
        let m =
            Measurements::new([(PcrIndex::new(0).unwrap(), ExpectedPcr::enforce(pcr0))]).unwrap();
        let validator = TpmQuoteValidator::new(pin(issuer.ak_public()), m.into_provider());
        let rd = ReportData::atls(Role::Client, &[7; 32]);
        let evidence = issuer.issue(&rd).unwrap();
        assert!(
            QuoteEvidence::decode(&evidence)
                .unwrap()
                .event_log
                .is_some()
        );
        validator.validate(&evidence, &rd).unwrap();

        // A log of another boot does not replay to this TPM's PCR 23.
        let issuer = issuer.with_event_log(log_extending_pcr23([0x24; 32]));
        assert!(matches!(
            validator.validate(&issuer.issue(&rd).unwrap(), &rd),
            Err(ValidationError::EventLogReplay { index: 23, .. })
        ));

        // A log too large for the evidence is left out; the quote still verifies.
        let issuer = issuer.with_event_log(vec![0; MAX_EVIDENCE_SIZE]);
        let evidence = issuer.issue(&rd).unwrap();
        assert_eq!(QuoteEvidence::decode(&evidence).unwrap().event_log, None);
        validator.validate(&evidence, &rd).unwrap();
    }
}

//! The set-up most TPM tests share: a private swtpm, a `tpm-quote` issuer on it with the
//! default AK, and that AK's fingerprint, which the verifying side pins.

use std::sync::Arc;

use asterism_attestation::{AkFingerprint, AkTrust};
use asterism_swtpm::SwtpmError;
use asterism_tpm::{AkConfig, PcrSelection, Tpm, TpmError, TpmIssuer};

use crate::Swtpm;

/// Why a [`TpmNode`] could not start.
#[derive(Debug, thiserror::Error)]
pub enum TpmNodeError {
    /// swtpm did not start.
    #[error("starting swtpm")]
    Swtpm(#[from] SwtpmError),
    /// The TPM did not open or refused to load the AK.
    #[error("making the TPM issuer")]
    Tpm(#[from] TpmError),
}

/// A node's TPM for a test: a private swtpm, an issuer quoting all PCRs with the default AK
/// and no AK certificate chain, and the fingerprint of that AK.
///
/// The issuer connects per use, so the swtpm stays free for other connections (the code
/// under test often opens the same TPM).
#[derive(Debug)]
pub struct TpmNode {
    /// The issuer (declared first so it is dropped before the swtpm stops).
    pub issuer: Arc<TpmIssuer>,
    /// The fingerprint of the issuer's AK.
    pub fingerprint: AkFingerprint,
    /// The running swtpm.
    pub swtpm: Swtpm,
}

impl TpmNode {
    /// Starts a fresh swtpm (no EK) and makes its issuer.
    pub fn start() -> Result<Self, TpmNodeError> {
        let swtpm = Swtpm::start()?;
        let issuer = swtpm.issuer()?;
        Ok(Self {
            fingerprint: AkFingerprint::of_public_area(issuer.ak_public()),
            issuer: Arc::new(issuer),
            swtpm,
        })
    }

    /// Trust in this node's AK alone.
    pub fn ak_trust(&self) -> AkTrust {
        AkTrust::pinned([self.fingerprint])
    }
}

impl Swtpm {
    /// An issuer that opens this swtpm for each quote: default AK (created and persisted on
    /// first use), all PCRs, no AK certificate chain.
    pub fn issuer(&self) -> Result<TpmIssuer, TpmError> {
        TpmIssuer::connecting_per_use(
            self.config(),
            AkConfig::default(),
            PcrSelection::all(),
            Vec::new(),
        )
    }

    /// Like [`Swtpm::issuer`], but holding one TPM connection for its whole life.
    pub fn held_issuer(&self) -> Result<TpmIssuer, TpmError> {
        let tpm = Tpm::open(&self.config())?;
        TpmIssuer::new(tpm, &AkConfig::default(), PcrSelection::all(), Vec::new())
    }
}

/// Trust in exactly the AK whose public area (`TPM2B_PUBLIC` contents) is `ak_public`.
pub fn pin(ak_public: &[u8]) -> AkTrust {
    AkTrust::pinned([AkFingerprint::of_public_area(ak_public)])
}

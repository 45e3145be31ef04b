//! Building the validator that checks a node's evidence from command-line options.

use anyhow::{Context, Result};
use asterism_attestation::{AkTrust, Measurements, TpmQuoteValidator, Validator};
use asterism_binkit::AkTrustArgs;
use std::path::PathBuf;
use std::sync::Arc;

/// How the CLI decides which nodes to trust: the node's attestation key (through the
/// platform CA or a pinned fingerprint) and the expected measurements.
#[derive(clap::Args, Debug, Clone)]
pub struct TrustArgs {
    /// Which node attestation keys to trust.
    #[command(flatten)]
    pub ak: AkTrustArgs,
    /// Expected measurements of the node (JSON, see docs/attestation.md). Mandatory.
    #[arg(long, value_name = "PATH")]
    pub measurements: PathBuf,
}

impl TrustArgs {
    /// Trusts the AKs that the platform CA(s) in `platform_ca` certify, expecting
    /// `measurements`.
    pub fn platform_ca(platform_ca: impl Into<PathBuf>, measurements: impl Into<PathBuf>) -> Self {
        Self {
            ak: AkTrustArgs::platform_ca(platform_ca),
            measurements: measurements.into(),
        }
    }

    /// The expected measurements, as loaded.
    pub fn load_measurements(&self) -> Result<Measurements> {
        Measurements::load(&self.measurements)
            .with_context(|| format!("loading measurements from {}", self.measurements.display()))
    }

    /// The AK trust policy.
    pub fn ak_trust(&self) -> Result<AkTrust> {
        Ok(self.ak.ak_trust()?)
    }

    /// The AK trust policy, refused when `measurements` lack a reference value that a
    /// confidential-VM platform requires ([`AkTrustArgs::ak_trust_for`]).
    pub fn ak_trust_for(&self, measurements: &Measurements) -> Result<AkTrust> {
        Ok(self.ak.ak_trust_for(measurements)?)
    }

    /// A validator for `tpm-quote` evidence against `measurements`.
    pub fn validator(&self, measurements: Measurements) -> Result<Arc<dyn Validator>> {
        Ok(Arc::new(TpmQuoteValidator::new(
            self.ak_trust_for(&measurements)?,
            measurements.into_provider(),
        )))
    }
}

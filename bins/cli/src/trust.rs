//! Building the validator that checks a node's evidence from command-line options.

use anyhow::{Context, Result, bail};
use asterism_attestation::{
    AkFingerprint, AkTrust, Measurements, PlatformCa, TpmQuoteValidator, Validator,
};
use std::path::PathBuf;
use std::sync::Arc;

/// How the CLI decides which nodes to trust: the node's attestation key (through the
/// platform CA or a pinned fingerprint) and the expected measurements.
#[derive(clap::Args, Debug, Clone)]
pub struct TrustArgs {
    /// PEM file with the platform CA that certifies node attestation keys.
    #[arg(long, value_name = "PATH")]
    pub platform_ca: Option<PathBuf>,
    /// Accept an attestation key with this fingerprint (SHA-256 of its TPMT_PUBLIC, hex)
    /// instead of a platform CA. Repeatable.
    #[arg(long, value_name = "HEX")]
    pub pinned_ak: Vec<String>,
    /// Expected measurements of the node (JSON, see docs/attestation.md). Mandatory.
    #[arg(long, value_name = "PATH")]
    pub measurements: PathBuf,
}

impl TrustArgs {
    /// The expected measurements, as loaded.
    pub fn load_measurements(&self) -> Result<Measurements> {
        Measurements::load(&self.measurements)
            .with_context(|| format!("loading measurements from {}", self.measurements.display()))
    }

    /// The AK trust policy.
    pub fn ak_trust(&self) -> Result<AkTrust> {
        match (&self.platform_ca, self.pinned_ak.is_empty()) {
            (Some(path), true) => {
                let pem =
                    std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
                Ok(AkTrust::platform_ca(
                    PlatformCa::from_pem(&pem).with_context(|| {
                        format!("{} holds no usable CA certificate", path.display())
                    })?,
                ))
            }
            (None, false) => Ok(AkTrust::pinned(
                self.pinned_ak
                    .iter()
                    .map(|h| {
                        AkFingerprint::from_hex(h).with_context(|| format!("--pinned-ak {h:?}"))
                    })
                    .collect::<Result<Vec<_>>>()?,
            )),
            _ => bail!(
                "give exactly one of --platform-ca or --pinned-ak to say which attestation keys to trust"
            ),
        }
    }

    /// A validator for `tpm-quote` evidence against `measurements`.
    pub fn validator(&self, measurements: Measurements) -> Result<Arc<dyn Validator>> {
        Ok(Arc::new(TpmQuoteValidator::new(
            self.ak_trust()?,
            measurements.into_provider(),
        )))
    }
}

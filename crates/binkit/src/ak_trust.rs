//! The flags that say which attestation keys (AKs) a verifier trusts, and the policy they
//! make.

use std::path::{Path, PathBuf};

use asterism_attestation::{AkFingerprint, AkTrust, PlatformCa};

use crate::fs::{FileError, read_capped};

/// Largest platform CA file read (a bundle of a few certificates is a few KiB).
const MAX_CA_FILE: u64 = 1024 * 1024;

/// Which attestation keys to trust: exactly one of a platform CA, pinned fingerprints or
/// (development builds only) any key.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct AkTrustArgs {
    /// PEM file of the platform CA(s) that certify attestation keys.
    #[arg(long, value_name = "PATH")]
    pub platform_ca: Option<PathBuf>,

    /// Accept attestation keys with this fingerprint (SHA-256 of the AK's TPMT_PUBLIC, 64
    /// hex digits) instead of a platform CA. Repeatable.
    #[arg(long, value_name = "HEX")]
    pub pinned_ak: Vec<String>,

    /// INSECURE, development only: accept any attestation key (the PCR values are still
    /// checked). Warned on every connection.
    #[cfg(feature = "insecure-test-attestation")]
    #[arg(long)]
    pub insecure_any_ak: bool,
}

/// Why the AK-trust flags make no policy.
#[derive(Debug, thiserror::Error)]
pub enum AkTrustArgsError {
    /// None or more than one policy was given.
    #[error("exactly one AK trust policy is needed: {}", policies())]
    NotExactlyOne,
    /// The platform CA file could not be read.
    #[error(transparent)]
    Read(#[from] FileError),
    /// The platform CA file holds no usable CA certificate.
    #[error("{} holds no usable CA certificate", path.display())]
    Ca {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: asterism_attestation::tpm::AkTrustError,
    },
    /// A pinned fingerprint is not 64 hex digits.
    #[error("--pinned-ak {value:?}")]
    Pin {
        /// The value given.
        value: String,
        /// Why.
        #[source]
        source: asterism_attestation::tpm::AkTrustError,
    },
}

/// The policies a build offers, for the error message.
fn policies() -> &'static str {
    if cfg!(feature = "insecure-test-attestation") {
        "--platform-ca, --pinned-ak or --insecure-any-ak"
    } else {
        "--platform-ca or --pinned-ak"
    }
}

impl AkTrustArgs {
    /// Trust the AKs that the platform CA(s) in `path` certify.
    pub fn platform_ca(path: impl Into<PathBuf>) -> Self {
        Self {
            platform_ca: Some(path.into()),
            ..Self::default()
        }
    }

    /// Trust the AKs with these fingerprints (hex).
    pub fn pinned(fingerprints: impl IntoIterator<Item = String>) -> Self {
        Self {
            pinned_ak: fingerprints.into_iter().collect(),
            ..Self::default()
        }
    }

    /// Whether any policy was given.
    pub fn is_given(&self) -> bool {
        self.given() > 0
    }

    fn given(&self) -> usize {
        usize::from(self.platform_ca.is_some())
            + usize::from(!self.pinned_ak.is_empty())
            + usize::from(self.insecure_any_ak())
    }

    #[cfg(feature = "insecure-test-attestation")]
    fn insecure_any_ak(&self) -> bool {
        self.insecure_any_ak
    }

    #[cfg(not(feature = "insecure-test-attestation"))]
    fn insecure_any_ak(&self) -> bool {
        false
    }

    /// The policy; exactly one must be given.
    pub fn ak_trust(&self) -> Result<AkTrust, AkTrustArgsError> {
        if self.given() != 1 {
            return Err(AkTrustArgsError::NotExactlyOne);
        }
        if let Some(path) = &self.platform_ca {
            return platform_ca(path).map(AkTrust::platform_ca);
        }
        if !self.pinned_ak.is_empty() {
            let pins = self
                .pinned_ak
                .iter()
                .map(|value| {
                    AkFingerprint::from_hex(value).map_err(|source| AkTrustArgsError::Pin {
                        value: value.clone(),
                        source,
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(AkTrust::pinned(pins));
        }
        insecure_any_ak()
    }
}

/// Reads and parses a platform CA file.
pub fn platform_ca(path: &Path) -> Result<PlatformCa, AkTrustArgsError> {
    let pem = read_capped(path, MAX_CA_FILE)?;
    PlatformCa::from_pem(&pem).map_err(|source| AkTrustArgsError::Ca {
        path: path.to_owned(),
        source,
    })
}

#[cfg(feature = "insecure-test-attestation")]
fn insecure_any_ak() -> Result<AkTrust, AkTrustArgsError> {
    tracing::warn!("accepting ANY attestation key (--insecure-any-ak): development only");
    Ok(AkTrust::insecure_any_ak())
}

/// Without the development feature there is no third policy: neither of the two was given.
#[cfg(not(feature = "insecure-test-attestation"))]
fn insecure_any_ak() -> Result<AkTrust, AkTrustArgsError> {
    Err(AkTrustArgsError::NotExactlyOne)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn exactly_one_policy_is_needed() {
        assert!(matches!(
            AkTrustArgs::default().ak_trust(),
            Err(AkTrustArgsError::NotExactlyOne)
        ));
        let both = AkTrustArgs {
            pinned_ak: vec!["ab".repeat(32)],
            ..AkTrustArgs::platform_ca("/ca.pem")
        };
        assert!(matches!(
            both.ak_trust(),
            Err(AkTrustArgsError::NotExactlyOne)
        ));
        assert!(AkTrustArgs::pinned(["ab".repeat(32)]).ak_trust().is_ok());
    }

    #[test]
    fn a_pin_must_be_64_hex_digits() {
        assert!(matches!(
            AkTrustArgs::pinned(["ab".repeat(31)]).ak_trust(),
            Err(AkTrustArgsError::Pin { .. })
        ));
    }

    #[test]
    fn a_file_without_a_ca_certificate_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, "not PEM").unwrap();
        assert!(matches!(
            AkTrustArgs::platform_ca(&path).ak_trust(),
            Err(AkTrustArgsError::Ca { .. })
        ));
        assert!(matches!(
            AkTrustArgs::platform_ca(dir.path().join("missing")).ak_trust(),
            Err(AkTrustArgsError::Read(_))
        ));
    }
}

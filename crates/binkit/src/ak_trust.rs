//! The flags that say which attestation keys (AKs) a verifier trusts, and the policy they
//! make.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use asterism_attestation::cvm_policy::CvmPolicy;
use asterism_attestation::revocation::CrlBundle;
use asterism_attestation::tdx::TdxCollateral;
use asterism_attestation::tpm::{
    CloudAkCa, CvmAkTrust, CvmPlatform, MissingReferences, TdxCollateralSet,
};
use asterism_attestation::{
    AkFingerprint, AkTrust, InsecureNoLaunchMeasurement, Measurements, PlatformCa,
};

use crate::fs::{FileError, read_capped};

/// Largest platform CA file read (a bundle of a few certificates is a few KiB).
const MAX_CA_FILE: u64 = 1024 * 1024;

/// Which attestation keys to trust: exactly one of a platform CA, pinned fingerprints, a
/// confidential VM's hardware report, a cloud's vTPM CA or (development builds only) any
/// key.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct AkTrustArgs {
    /// PEM file of the platform CA(s) that certify attestation keys.
    #[arg(long, value_name = "PATH")]
    pub platform_ca: Option<PathBuf>,

    /// Accept attestation keys with this fingerprint (SHA-256 of the AK's TPMT_PUBLIC, 64
    /// hex digits) instead of a platform CA. Repeatable.
    #[arg(long, value_name = "HEX")]
    pub pinned_ak: Vec<String>,

    /// Trust attestation keys whose certificate a cloud's vTPM CA issued and that chains to
    /// this root certificate (PEM or DER): Google's vTPM CA root for GCE Shielded and
    /// Confidential VMs, Azure's "Azure Virtual TPM Root Certificate Authority 2023" for
    /// Trusted Launch (docs/provisioning.md). Repeatable. The cloud is trusted as the
    /// hypervisor is.
    #[arg(long, value_name = "PATH")]
    pub cloud_ak_root: Vec<PathBuf>,

    /// With --cloud-ak-root: an intermediate CA certificate (PEM or DER) that AK
    /// certificates chain through when the nodes do not send it (GCE's AK certificates come
    /// without theirs). Repeatable.
    #[arg(long, value_name = "PATH", requires = "cloud_ak_root")]
    pub cloud_ak_intermediate: Vec<PathBuf>,

    /// Trust attestation keys that a confidential VM's hardware report vouches for:
    /// azure-sev-snp, azure-tdx or aws-sev-snp (docs/attestation.md).
    #[arg(long, value_name = "PLATFORM")]
    pub confidential_vm: Option<CvmPlatform>,

    /// With --confidential-vm: the policy for the hardware report (JSON: TCB minimums,
    /// guest policy, accepted TDX TCB statuses). Without it, the secure defaults.
    #[arg(long, value_name = "PATH", requires = "confidential_vm")]
    pub cvm_policy: Option<PathBuf>,

    /// With --confidential-vm azure-tdx: Intel PCS collateral (TCB info, QE identity,
    /// CRLs) as JSON, a file or a directory of `*.json` files, one per platform FMSPC.
    /// Repeatable. Verification never fetches collateral.
    #[arg(long, value_name = "PATH", requires = "confidential_vm")]
    pub tdx_collateral: Vec<PathBuf>,

    /// With --confidential-vm: certificate revocation lists, DER or PEM X.509 CRLs, a file
    /// or a directory of `*.crl`, `*.der` and `*.pem` files (the offline bundle): AMD's
    /// ARK CRLs from KDS (revoked ASKs and ASVKs), Intel's SGX Root CA and PCK CA CRLs.
    /// Repeatable. With it, a report whose chain the bundle cannot vouch for (no CRL of an
    /// issuer, one not signed by it, one past its nextUpdate) is refused; without it
    /// SEV-SNP revocation is not checked (warned at start).
    #[arg(long, value_name = "PATH", requires = "confidential_vm")]
    pub cvm_crl: Vec<PathBuf>,

    /// INSECURE, with --confidential-vm: accept hardware reports whose launch the
    /// measurements file pins with no reference value (SEV-SNP: the launch measurement;
    /// TDX: MRTD and the RTMRs). Without it a verifier refuses to start while one is
    /// missing. Any firmware and kernel on genuine hardware can then vouch for an AK.
    /// Warned at start and on every verification.
    #[arg(long, requires = "confidential_vm")]
    pub insecure_no_launch_measurement: bool,

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
    /// The confidential-VM policy file is not valid.
    #[error("confidential-VM policy {}", path.display())]
    CvmPolicy {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: asterism_attestation::cvm_policy::CvmPolicyError,
    },
    /// A TDX collateral file is not valid.
    #[error("TDX collateral {}", path.display())]
    TdxCollateral {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: asterism_attestation::ValidationError,
    },
    /// A TDX collateral directory could not be listed.
    #[error("listing TDX collateral in {}", path.display())]
    TdxCollateralDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A CRL file is not valid.
    #[error("CRL bundle")]
    Crl(#[source] asterism_attestation::revocation::CrlError),
    /// A CRL directory could not be listed.
    #[error("listing CRLs in {}", path.display())]
    CrlDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Azure TDX trust needs collateral, or collateral was given for another platform.
    #[error("{0}")]
    Collateral(String),
    /// The measurements lack a reference value the confidential-VM platform requires.
    #[error(transparent)]
    MissingReferences(#[from] MissingReferences),
    /// The cloud vTPM CA certificates are not usable.
    #[error("--cloud-ak-root / --cloud-ak-intermediate")]
    CloudCa(#[source] asterism_attestation::tpm::AkTrustError),
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
        "--platform-ca, --pinned-ak, --confidential-vm, --cloud-ak-root or --insecure-any-ak"
    } else {
        "--platform-ca, --pinned-ak, --confidential-vm or --cloud-ak-root"
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

    /// Trust the AKs whose certificates chain to the cloud vTPM CA roots in `roots`, through
    /// the intermediates in `intermediates` where needed.
    pub fn cloud_ak(roots: Vec<PathBuf>, intermediates: Vec<PathBuf>) -> Self {
        Self {
            cloud_ak_root: roots,
            cloud_ak_intermediate: intermediates,
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
            + usize::from(self.confidential_vm.is_some())
            + usize::from(!self.cloud_ak_root.is_empty())
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
        if let Some(platform) = self.confidential_vm {
            return self.confidential_vm_trust(platform);
        }
        if !self.cloud_ak_root.is_empty() {
            return cloud_ak_ca(&self.cloud_ak_root, &self.cloud_ak_intermediate)
                .map(AkTrust::cloud_ak);
        }
        insecure_any_ak()
    }

    /// The policy, checked against the reference values of `measurements`: a
    /// confidential-VM policy refuses to start without the launch reference values its
    /// platform requires (unless --insecure-no-launch-measurement). What every verifier
    /// builds its validator with.
    pub fn ak_trust_for(&self, measurements: &Measurements) -> Result<AkTrust, AkTrustArgsError> {
        let trust = self.ak_trust()?;
        trust.require_references(measurements.cvm())?;
        Ok(trust)
    }

    fn confidential_vm_trust(&self, platform: CvmPlatform) -> Result<AkTrust, AkTrustArgsError> {
        let policy =
            match &self.cvm_policy {
                Some(path) => CvmPolicy::from_json(&read_capped(path, MAX_POLICY_FILE)?).map_err(
                    |source| AkTrustArgsError::CvmPolicy {
                        path: path.clone(),
                        source,
                    },
                )?,
                None => CvmPolicy::default(),
            };
        let trust = if platform == CvmPlatform::AzureTdx {
            let sets = tdx_collateral(&self.tdx_collateral)?;
            if sets.is_empty() {
                return Err(AkTrustArgsError::Collateral(
                    "--confidential-vm azure-tdx needs --tdx-collateral (Intel PCS collateral \
                     for the nodes' platforms)"
                        .into(),
                ));
            }
            let set = TdxCollateralSet::new(sets)
                .map_err(|e| AkTrustArgsError::Collateral(e.to_string()))?;
            CvmAkTrust::azure_tdx(policy.tdx, set)
        } else {
            if !self.tdx_collateral.is_empty() {
                return Err(AkTrustArgsError::Collateral(format!(
                    "--tdx-collateral is for azure-tdx, not {platform}"
                )));
            }
            CvmAkTrust::sev_snp(platform, policy.snp)
                .map_err(|e| AkTrustArgsError::Collateral(e.to_string()))?
        };
        let trust = if self.insecure_no_launch_measurement {
            tracing::warn!(
                %platform,
                "--insecure-no-launch-measurement: hardware reports are accepted without a \
                 reference launch measurement"
            );
            trust.insecure_no_launch_measurement(InsecureNoLaunchMeasurement::insecure_new())
        } else {
            trust
        };
        let trust = if self.cvm_crl.is_empty() {
            if platform == CvmPlatform::AzureTdx {
                tracing::warn!(
                    %platform,
                    "no CRL bundle (--cvm-crl): revocation is checked only against the CRLs \
                     in the TDX collateral"
                );
            } else {
                tracing::warn!(
                    %platform,
                    "no CRL bundle (--cvm-crl): certificate revocation is NOT checked; a \
                     revoked ASK or ASVK would still be accepted"
                );
            }
            trust
        } else {
            let bundle = crl_bundle(&self.cvm_crl)?;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
            for crl in bundle.summaries() {
                let expired = crl.next_update.is_none_or(|next| next < now);
                if expired {
                    tracing::warn!(
                        file = %crl.file, issuer = %crl.issuer, next_update = ?crl.next_update,
                        "CRL is past its nextUpdate: chains it covers are refused until the \
                         bundle is refreshed"
                    );
                } else {
                    tracing::info!(
                        file = %crl.file, issuer = %crl.issuer, revoked = crl.revoked,
                        next_update = ?crl.next_update, "CRL loaded"
                    );
                }
            }
            trust.with_crls(Arc::new(bundle))
        };
        tracing::info!(%platform, "attestation keys are trusted through the confidential VM's hardware report");
        Ok(AkTrust::confidential_vm(trust))
    }
}

/// Largest confidential-VM policy file read.
const MAX_POLICY_FILE: u64 = 64 * 1024;
/// Largest TDX collateral file read (Intel's are about 16 KiB).
const MAX_COLLATERAL_FILE: u64 = 1024 * 1024;

/// Reads TDX collateral from files and directories of `*.json` files (an offline bundle),
/// in a fixed order.
fn tdx_collateral(paths: &[PathBuf]) -> Result<Vec<TdxCollateral>, AkTrustArgsError> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            let listing = |source| AkTrustArgsError::TdxCollateralDir {
                path: path.clone(),
                source,
            };
            let mut found = Vec::new();
            for entry in std::fs::read_dir(path).map_err(listing)? {
                let file = entry.map_err(listing)?.path();
                if file.extension().is_some_and(|e| e == "json") {
                    found.push(file);
                }
            }
            found.sort();
            files.extend(found);
        } else {
            files.push(path.clone());
        }
    }
    files
        .into_iter()
        .map(|file| {
            let json = read_capped(&file, MAX_COLLATERAL_FILE)?;
            TdxCollateral::from_json(&json)
                .map_err(|source| AkTrustArgsError::TdxCollateral { path: file, source })
        })
        .collect()
}

/// Largest CRL file read.
const MAX_CRL_FILE: u64 = asterism_attestation::revocation::MAX_CRL_LEN as u64;

/// Reads a CRL bundle from files and directories of `*.crl`, `*.der` and `*.pem` files, in
/// a fixed order.
fn crl_bundle(paths: &[PathBuf]) -> Result<CrlBundle, AkTrustArgsError> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            let listing = |source| AkTrustArgsError::CrlDir {
                path: path.clone(),
                source,
            };
            let mut found = Vec::new();
            for entry in std::fs::read_dir(path).map_err(listing)? {
                let file = entry.map_err(listing)?.path();
                if file
                    .extension()
                    .is_some_and(|e| e == "crl" || e == "der" || e == "pem")
                {
                    found.push(file);
                }
            }
            found.sort();
            files.extend(found);
        } else {
            files.push(path.clone());
        }
    }
    let contents = files
        .into_iter()
        .map(|file| {
            Ok((
                file.display().to_string(),
                read_capped(&file, MAX_CRL_FILE)?,
            ))
        })
        .collect::<Result<Vec<_>, AkTrustArgsError>>()?;
    CrlBundle::from_files(contents).map_err(AkTrustArgsError::Crl)
}

/// Reads and parses a platform CA file.
pub fn platform_ca(path: &Path) -> Result<PlatformCa, AkTrustArgsError> {
    let pem = read_capped(path, MAX_CA_FILE)?;
    PlatformCa::from_pem(&pem).map_err(|source| AkTrustArgsError::Ca {
        path: path.to_owned(),
        source,
    })
}

/// Reads the cloud vTPM CA roots and intermediates (each file PEM or DER).
pub fn cloud_ak_ca(
    roots: &[PathBuf],
    intermediates: &[PathBuf],
) -> Result<CloudAkCa, AkTrustArgsError> {
    let read = |paths: &[PathBuf]| {
        paths
            .iter()
            .map(|p| read_capped(p, MAX_CA_FILE))
            .collect::<Result<Vec<_>, _>>()
    };
    let ca = CloudAkCa::from_files(read(roots)?, read(intermediates)?)
        .map_err(AkTrustArgsError::CloudCa)?;
    tracing::info!(
        roots = roots.len(),
        intermediates = intermediates.len(),
        "attestation keys are trusted through a cloud's vTPM CA (the cloud is trusted as the \
         hypervisor)"
    );
    Ok(ca)
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

    const GCP_ROOT: &[u8] =
        include_bytes!("../../attestation/tests/data/tpm-ek-ca/gcp/tpm_ek_root_1.cer");
    const GCP_INTERMEDIATE: &[u8] =
        include_bytes!("../../attestation/tests/data/tpm-ek-ca/gcp/tpm_ek_intermediate_2.crt");
    const AZURE_ROOT: &[u8] = include_bytes!(
        "../../attestation/tests/data/cloud-ak-ca/azure/azure-virtual-tpm-root-2023.pem"
    );

    #[test]
    fn cloud_roots_are_a_policy_of_their_own_read_as_der_or_pem() {
        let dir = tempfile::tempdir().unwrap();
        let (root, inter, azure) = (
            dir.path().join("root.cer"),
            dir.path().join("inter.crt"),
            dir.path().join("azure.pem"),
        );
        std::fs::write(&root, GCP_ROOT).unwrap();
        std::fs::write(&inter, GCP_INTERMEDIATE).unwrap();
        std::fs::write(&azure, AZURE_ROOT).unwrap();
        let gce = AkTrustArgs::cloud_ak(vec![root.clone()], vec![inter.clone()]);
        assert!(matches!(gce.ak_trust(), Ok(AkTrust::CloudAk(_))));
        let both = AkTrustArgs::cloud_ak(vec![root.clone(), azure.clone()], Vec::new());
        assert!(matches!(both.ak_trust(), Ok(AkTrust::CloudAk(_))));
        // With another policy it is two.
        let two = AkTrustArgs {
            pinned_ak: vec!["ab".repeat(32)],
            ..AkTrustArgs::cloud_ak(vec![root.clone()], Vec::new())
        };
        assert!(matches!(
            two.ak_trust(),
            Err(AkTrustArgsError::NotExactlyOne)
        ));
        // A root that is not a CA (the intermediate is one; a text file is not a certificate).
        let text = dir.path().join("README");
        std::fs::write(&text, "not a certificate").unwrap();
        assert!(matches!(
            AkTrustArgs::cloud_ak(vec![text], Vec::new()).ak_trust(),
            Err(AkTrustArgsError::CloudCa(_))
        ));
    }

    #[test]
    fn cloud_ak_flags_parse() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            ak: AkTrustArgs,
        }
        let cli = Cli::try_parse_from([
            "x",
            "--cloud-ak-root",
            "/a.cer",
            "--cloud-ak-root",
            "/b.pem",
            "--cloud-ak-intermediate",
            "/i.crt",
        ])
        .unwrap();
        assert_eq!(cli.ak.cloud_ak_root.len(), 2);
        assert_eq!(cli.ak.cloud_ak_intermediate.len(), 1);
        assert!(Cli::try_parse_from(["x", "--cloud-ak-intermediate", "/i.crt"]).is_err());
    }

    /// A DER CRL from the real TDX collateral JSON (hex under `key`).
    fn collateral_crl(key: &str) -> Vec<u8> {
        let json =
            include_str!("../../attestation/tests/data/cvm/tdx-dcap/tdx_quote_collateral.json");
        let start = json.find(&format!("\"{key}\"")).unwrap();
        let hex = json[start..].split('"').nth(3).unwrap();
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn a_crl_bundle_is_read_from_a_directory_and_a_bad_file_is_refused_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let crls = dir.path().join("crls");
        std::fs::create_dir(&crls).unwrap();
        std::fs::write(crls.join("root.crl"), collateral_crl("root_ca_crl")).unwrap();
        std::fs::write(crls.join("pck.der"), collateral_crl("pck_crl")).unwrap();
        std::fs::write(crls.join("README"), "not a CRL").unwrap();
        let args = AkTrustArgs {
            confidential_vm: Some(CvmPlatform::AzureSevSnp),
            cvm_crl: vec![crls.clone()],
            ..AkTrustArgs::default()
        };
        match args.ak_trust().unwrap() {
            AkTrust::ConfidentialVm(trust) => assert_eq!(trust.crls().unwrap().len(), 2),
            other => panic!("expected a confidential-VM trust, got {other:?}"),
        }
        // Without the flag there is no bundle (and a warning at start).
        let none = AkTrustArgs {
            cvm_crl: Vec::new(),
            ..args.clone()
        };
        match none.ak_trust().unwrap() {
            AkTrust::ConfidentialVm(trust) => assert!(trust.crls().is_none()),
            other => panic!("expected a confidential-VM trust, got {other:?}"),
        }

        std::fs::write(crls.join("bad.pem"), "not a CRL").unwrap();
        assert!(matches!(args.ak_trust(), Err(AkTrustArgsError::Crl(_))));
    }

    #[test]
    fn confidential_vm_trust_reads_its_policy_and_collateral() {
        let dir = tempfile::tempdir().unwrap();
        let snp = AkTrustArgs {
            confidential_vm: Some(CvmPlatform::AzureSevSnp),
            ..AkTrustArgs::default()
        };
        assert!(matches!(snp.ak_trust(), Ok(AkTrust::ConfidentialVm(_))));

        let policy = dir.path().join("policy.json");
        std::fs::write(&policy, r#"{"snp": {"allowDebug": true}}"#).unwrap();
        let bad_policy = AkTrustArgs {
            cvm_policy: Some(policy),
            ..snp.clone()
        };
        assert!(matches!(
            bad_policy.ak_trust(),
            Err(AkTrustArgsError::CvmPolicy { .. })
        ));

        let tdx = AkTrustArgs {
            confidential_vm: Some(CvmPlatform::AzureTdx),
            ..AkTrustArgs::default()
        };
        assert!(matches!(
            tdx.ak_trust(),
            Err(AkTrustArgsError::Collateral(_))
        ));
        let bundle = dir.path().join("bundle");
        std::fs::create_dir(&bundle).unwrap();
        std::fs::write(
            bundle.join("00906ed50000.json"),
            include_bytes!("../../attestation/tests/data/cvm/tdx-dcap/tdx_quote_collateral.json"),
        )
        .unwrap();
        std::fs::write(bundle.join("README"), "not collateral").unwrap();
        let with = AkTrustArgs {
            tdx_collateral: vec![bundle.clone()],
            ..tdx
        };
        assert!(matches!(with.ak_trust(), Ok(AkTrust::ConfidentialVm(_))));
        std::fs::write(bundle.join("broken.json"), "{}").unwrap();
        assert!(matches!(
            with.ak_trust(),
            Err(AkTrustArgsError::TdxCollateral { .. })
        ));
        let misplaced = AkTrustArgs {
            tdx_collateral: vec![bundle],
            ..snp
        };
        assert!(matches!(
            misplaced.ak_trust(),
            Err(AkTrustArgsError::Collateral(_))
        ));
    }

    #[test]
    fn a_confidential_vm_verifier_needs_the_launch_reference_values_unless_told_insecure() {
        let pcr = format!(r#""measurements": {{"4": "{}"}}"#, "11".repeat(32));
        let bare = Measurements::from_json(format!("{{{pcr}}}").as_bytes()).unwrap();
        let pinned = Measurements::from_json(
            format!(
                r#"{{{pcr}, "snp": {{"launchMeasurement": "{}"}}}}"#,
                "22".repeat(48)
            )
            .as_bytes(),
        )
        .unwrap();
        for platform in [CvmPlatform::AzureSevSnp, CvmPlatform::AwsSevSnp] {
            let args = AkTrustArgs {
                confidential_vm: Some(platform),
                ..AkTrustArgs::default()
            };
            match args.ak_trust_for(&bare) {
                Err(AkTrustArgsError::MissingReferences(e)) => {
                    assert_eq!(e.missing, ["snp.launchMeasurement"]);
                }
                other => panic!("{platform}: want a refusal, got {other:?}"),
            }
            assert!(args.ak_trust_for(&pinned).is_ok(), "{platform}");
            let insecure = AkTrustArgs {
                insecure_no_launch_measurement: true,
                ..args
            };
            assert!(insecure.ak_trust_for(&bare).is_ok(), "{platform}");
        }
        // Other policies need no reference value.
        assert!(
            AkTrustArgs::pinned(["ab".repeat(32)])
                .ak_trust_for(&bare)
                .is_ok()
        );
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

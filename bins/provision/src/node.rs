//! `node`: provision one node's TPM, as a cloud provider does before it hands out a machine.
//!
//! 1. Load the platform CA (before anything is written).
//! 2. Check that the state directory is missing or empty and that none of the output files
//!    exists: this command never overwrites, so a provisioned node keeps its AK and its
//!    certificate (re-running it on the same directories is refused, not repeated).
//! 3. Manufacture the swtpm state with `swtpm_setup` (EKs, EK certificates from the
//!    manufacturer CA `<ca dir>/ek-ca/`, SHA-256 bank only).
//! 4. Start swtpm on it, create and persist the AK, certify it with the platform CA.
//! 5. Read PCRs 0–23 and derive the expected measurements ([`node_measurements`]).
//! 6. Self-check: quote with a fresh nonce and validate the evidence with
//!    `TpmQuoteValidator`, trusting exactly the platform CA and the measurements about to be
//!    written.
//! 7. Stop swtpm (the state persists), then write the outputs.
//!
//! On failure everything this run created is removed again, so it can simply be repeated.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use asterism_attestation::{
    AkFingerprint, AkTrust, ExpectedPcr, Measurements, PcrIndex, ReportData, TpmQuoteValidator,
    Validator,
};
use asterism_swtpm::{
    self as swtpm, ManufactureOptions, PcrBank, SwtpmConfig, SwtpmProcess, check_swtpm_installed,
};
use asterism_tpm::{AkAlgorithm, AkConfig, PcrSelection, PcrValue, Tpm, TpmIssuer};
use ring::rand::{SecureRandom, SystemRandom};

use crate::ca::{self, PlatformCa};
use crate::{AkKind, NodeArgs, files, progress};

/// The AK certificate, DER.
pub const AK_CERT_FILE: &str = "ak-cert.der";
/// The AK's TPMT_PUBLIC.
pub const AK_PUBLIC_FILE: &str = "ak-public.bin";
/// The expected measurements (docs/attestation.md format).
pub const MEASUREMENTS_FILE: &str = "measurements.json";
/// A copy of the platform CA certificate.
pub const PLATFORM_CA_FILE: &str = "platform-ca.pem";

/// PCRs enforced at the values read at provisioning: firmware and boot loader (0–7), boot
/// loader configuration and kernel (8, 9), unified kernel image and systemd (11–13).
/// PCR 10 (IMA, changes at run time) is left out.
pub const ENFORCED_PCRS: [u32; 13] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13];
/// PCRs compared but never gating: PCR 14 is warn-only.
pub const WARN_ONLY_PCRS: [u32; 1] = [14];
/// The node marker: enforced all-zero, so only nodes not yet bootstrapped pass.
pub const MARKER_PCR: u32 = asterism_tpm::marker::MARKER_PCR;

/// `node --state-dir S --ca-dir D [--ak ecc|rsa] --out O`.
pub fn provision(args: &NodeArgs) -> Result<()> {
    check_swtpm_installed(true)?;
    let ca = PlatformCa::load(&args.ca_dir)?;
    let outputs = [
        AK_CERT_FILE,
        AK_PUBLIC_FILE,
        MEASUREMENTS_FILE,
        PLATFORM_CA_FILE,
    ]
    .map(|name| args.out.join(name));
    files::refuse_existing(&outputs)?;
    let mut cleanup = Cleanup::default();
    let result = prepare_state_dir(&args.state_dir, &mut cleanup).and_then(|state_dir| {
        // The output directory early, so that a path that cannot be one fails fast.
        if let Some(created) = files::ensure_dir(&args.out, 0o755)? {
            cleanup.created_dirs.push(created);
        }
        provision_in(args, &ca, &state_dir, &outputs, &mut cleanup)
    });
    if result.is_err() {
        cleanup.undo();
    }
    result
}

fn provision_in(
    args: &NodeArgs,
    ca: &PlatformCa,
    state_dir: &Path,
    outputs: &[PathBuf; 4],
    cleanup: &mut Cleanup,
) -> Result<()> {
    progress!(
        "manufacturing the TPM in {} (EKs, EK certificates from {})",
        state_dir.display(),
        ca.dir().join(ca::EK_CA_DIR).display()
    );
    let options =
        ManufactureOptions::new(ca.dir().join(ca::EK_CA_DIR))?.with_pcr_banks([PcrBank::Sha256])?;
    swtpm::manufacture(state_dir, &options)?;

    let swtpm = SwtpmProcess::start(&SwtpmConfig::new(state_dir)?)?;
    progress!("swtpm running on {}", swtpm.tcti());
    let mut tpm = Tpm::open(&swtpm.tcti().parse()?)?;
    let ak_config = AkConfig::new(match args.ak {
        AkKind::Ecc => AkAlgorithm::EccP256,
        AkKind::Rsa => AkAlgorithm::Rsa2048,
    });
    let ak = tpm.load_attestation_key(&ak_config)?;
    if !ak.was_created() {
        bail!(
            "the new TPM already had an attestation key; refusing to certify a key made elsewhere"
        );
    }
    let ak_public = ak.public_area().to_vec();
    progress!(
        "created the attestation key ({:?}, {}, identity {})",
        ak.algorithm(),
        ak.location(),
        AkFingerprint::of_public_area(&ak_public)
    );
    let ak_cert = ca.certify_ak(&ak_public, args.validity_days)?;
    progress!(
        "certified it with the platform CA (valid {} days)",
        args.validity_days
    );

    let pcrs = tpm.read_pcrs(&PcrSelection::all())?;
    let measurements = node_measurements(&pcrs)?;

    self_check(tpm, &ak_config, &ak_public, &ak_cert, ca, &measurements)?;
    progress!("self-check passed: a quote of this TPM is accepted with the files below");

    swtpm.stop().context("stopping swtpm")?;

    let [cert_path, public_path, measurements_path, ca_path] = outputs;
    let measurements_json = measurements.to_json();
    let contents: [(&PathBuf, &[u8]); 4] = [
        (cert_path, &ak_cert),
        (public_path, &ak_public),
        (measurements_path, measurements_json.as_bytes()),
        (ca_path, ca.cert_pem().as_bytes()),
    ];
    for (path, bytes) in contents {
        files::write_new(path, bytes, 0o644)?;
        cleanup.created_files.push(path.clone());
    }
    progress!("node provisioned; swtpm state in {}", state_dir.display());
    for path in outputs {
        progress!("  {}", path.display());
    }
    cleanup.disarm();
    Ok(())
}

/// The expected measurements of a freshly provisioned node: [`ENFORCED_PCRS`] enforced at
/// the values read, [`WARN_ONLY_PCRS`] warn-only at the values read, PCR 15 enforced
/// all-zero (refusing a TPM that is marked already). PCRs 16 and 23 (resettable by any
/// software) and 17–22 are not listed.
pub fn node_measurements(pcrs: &[(u32, PcrValue)]) -> Result<Measurements> {
    let value = |index: u32| {
        pcrs.iter()
            .find(|(i, _)| *i == index)
            .map(|(_, v)| *v)
            .with_context(|| format!("the TPM returned no value for PCR {index}"))
    };
    let marker = value(MARKER_PCR)?;
    if marker != [0; 32] {
        bail!(
            "PCR {MARKER_PCR} is {}, not zero: this TPM is marked as bootstrapped, and expected \
             measurements must enforce an unmarked node",
            hex::encode(marker)
        );
    }
    let index = |i: u32| PcrIndex::try_from(i).map_err(anyhow::Error::from);
    let mut entries = Vec::new();
    for i in ENFORCED_PCRS {
        entries.push((index(i)?, ExpectedPcr::enforce(value(i)?)));
    }
    for i in WARN_ONLY_PCRS {
        entries.push((index(i)?, ExpectedPcr::warn_only(value(i)?)));
    }
    entries.push((index(MARKER_PCR)?, ExpectedPcr::enforce([0; 32])));
    Ok(Measurements::new(entries)?)
}

/// Quotes with a fresh nonce and validates the evidence exactly as a verifier with the
/// written files would.
fn self_check(
    tpm: Tpm,
    ak_config: &AkConfig,
    ak_public: &[u8],
    ak_cert: &[u8],
    ca: &PlatformCa,
    measurements: &Measurements,
) -> Result<()> {
    let issuer = TpmIssuer::new(tpm, ak_config, PcrSelection::all(), vec![ak_cert.to_vec()])?;
    if issuer.ak_public() != ak_public {
        bail!("self-check: the AK changed while provisioning");
    }
    let mut nonce = [0u8; 32];
    SystemRandom::new()
        .fill(&mut nonce)
        .map_err(|_| anyhow::anyhow!("the system random generator failed"))?;
    let report_data = ReportData::verify(&nonce);
    let evidence = asterism_attestation::Issuer::issue(&issuer, &report_data)
        .context("self-check: quoting")?;
    let trust = AkTrust::platform_ca(asterism_attestation::PlatformCa::from_der([ca.cert_der()])?);
    TpmQuoteValidator::new(trust, measurements.clone().into_provider())
        .validate(&evidence, &report_data)
        .context("self-check: the new node's quote is not accepted with the files to be written")?;
    Ok(())
}

/// Creates the state directory or checks that it is empty.
fn prepare_state_dir(dir: &Path, cleanup: &mut Cleanup) -> Result<PathBuf> {
    if let Some(created) = files::ensure_dir(dir, 0o700)? {
        cleanup.created_dirs.push(created);
    } else {
        let mut entries =
            fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
        if entries.next().is_some() {
            bail!(
                "{} is not empty; refusing to manufacture a TPM over it (a provisioned node's \
                 TPM is kept; remove the directory to provision it anew)",
                dir.display()
            );
        }
        cleanup.emptied_dirs.push(dir.to_owned());
        // It is about to hold the TPM's seeds.
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
            .with_context(|| format!("setting the mode of {}", dir.display()))?;
    }
    dir.canonicalize()
        .with_context(|| format!("resolving {}", dir.display()))
}

/// What a failed run removes again.
#[derive(Default)]
struct Cleanup {
    /// Directories this run created (removed with their contents).
    created_dirs: Vec<PathBuf>,
    /// Directories that were empty before this run (their contents are removed).
    emptied_dirs: Vec<PathBuf>,
    /// Files this run wrote.
    created_files: Vec<PathBuf>,
}

impl Cleanup {
    fn disarm(&mut self) {
        *self = Cleanup::default();
    }

    fn undo(&mut self) {
        if self.created_files.is_empty()
            && self.emptied_dirs.is_empty()
            && self.created_dirs.is_empty()
        {
            return;
        }
        for file in self.created_files.drain(..) {
            let _ = fs::remove_file(file);
        }
        for dir in self.emptied_dirs.drain(..) {
            if let Ok(entries) = fs::read_dir(&dir) {
                for entry in entries.flatten() {
                    let path = entry.path();
                    let _ = if path.is_dir() {
                        fs::remove_dir_all(&path)
                    } else {
                        fs::remove_file(&path)
                    };
                }
            }
        }
        for dir in self.created_dirs.drain(..).rev() {
            let _ = fs::remove_dir_all(dir);
        }
        progress!("provisioning failed; removed what this run had created");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pcrs(marker: [u8; 32]) -> Vec<(u32, PcrValue)> {
        (0..24u32)
            .map(|i| match i {
                15 => (i, marker),
                17..=22 => (i, [0xff; 32]),
                _ => (i, [i as u8; 32]),
            })
            .collect()
    }

    #[test]
    fn measurements_enforce_boot_pcrs_and_an_unmarked_pcr_15() {
        let m = node_measurements(&pcrs([0; 32])).unwrap();
        let listed: Vec<u8> = m.iter().map(|(i, _)| i.get()).collect();
        assert_eq!(
            listed,
            vec![0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 15]
        );
        let get = |i: u8| *m.get(PcrIndex::new(i).unwrap()).unwrap();
        assert_eq!(get(4), ExpectedPcr::enforce([4; 32]));
        assert_eq!(get(14), ExpectedPcr::warn_only([14; 32]));
        assert_eq!(get(15), ExpectedPcr::enforce([0; 32]));
    }

    #[test]
    fn a_marked_tpm_cannot_be_provisioned() {
        let error = node_measurements(&pcrs([1; 32])).unwrap_err().to_string();
        assert!(error.contains("PCR 15"), "{error}");
    }
}

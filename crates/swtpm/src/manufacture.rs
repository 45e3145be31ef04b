//! Manufacturing a TPM state with `swtpm_setup`: EKs, their certificates signed by a
//! manufacturer CA, the PCR banks.

use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use tracing::{debug, info};

use crate::config::existing_dir;
use crate::error::{SwtpmError, invalid, io_error};
use crate::files::{tail, write_atomically};
use crate::{SETUP_LOG_FILE, check_swtpm_installed, has_tpm_state};

/// A PCR bank to allocate when manufacturing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PcrBank {
    /// SHA-1.
    Sha1,
    /// SHA-256 (the only bank Asterism reads).
    Sha256,
    /// SHA-384.
    Sha384,
    /// SHA-512.
    Sha512,
}

impl PcrBank {
    fn name(self) -> &'static str {
        match self {
            PcrBank::Sha1 => "sha1",
            PcrBank::Sha256 => "sha256",
            PcrBank::Sha384 => "sha384",
            PcrBank::Sha512 => "sha512",
        }
    }
}

/// How [`manufacture`] makes a TPM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManufactureOptions {
    ek_ca_dir: PathBuf,
    pcr_banks: Vec<PcrBank>,
    log_file: Option<PathBuf>,
}

impl ManufactureOptions {
    /// EK certificates signed by the manufacturer CA in `ek_ca_dir` (created with mode 0700
    /// if missing; `swtpm_localca` creates the CA key and certificate there on first use and
    /// keeps its serial counter there), SHA-256 bank only, log in the state directory.
    pub fn new(ek_ca_dir: impl AsRef<Path>) -> Result<Self, SwtpmError> {
        let dir = ek_ca_dir.as_ref();
        if !dir.exists() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(io_error(format!(
                    "creating the EK CA directory {}",
                    dir.display()
                )))?;
        }
        Ok(ManufactureOptions {
            ek_ca_dir: existing_dir("EK CA directory", dir)?,
            pcr_banks: vec![PcrBank::Sha256],
            log_file: None,
        })
    }

    /// Allocates exactly these PCR banks (at least one).
    pub fn with_pcr_banks(
        mut self,
        banks: impl IntoIterator<Item = PcrBank>,
    ) -> Result<Self, SwtpmError> {
        let mut chosen: Vec<PcrBank> = Vec::new();
        for bank in banks {
            if !chosen.contains(&bank) {
                chosen.push(bank);
            }
        }
        if chosen.is_empty() {
            return Err(invalid("a TPM needs at least one PCR bank"));
        }
        self.pcr_banks = chosen;
        Ok(self)
    }

    /// Writes the `swtpm_setup` log to `path` instead of `<state dir>/swtpm_setup.log`.
    pub fn with_log_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.log_file = Some(path.into());
        self
    }

    /// The manufacturer CA directory (absolute).
    pub fn ek_ca_dir(&self) -> &Path {
        &self.ek_ca_dir
    }
}

/// Manufactures a TPM in the existing, TPM-less `state_dir` with `swtpm_setup`: RSA-2048
/// and ECC EKs, their certificates in NV (RSA at `0x01C00002`, ECC P-384 at `0x01C00016`
/// with swtpm 0.7) signed by the manufacturer CA of `options`, and the chosen PCR banks.
/// Refuses a directory that already holds a TPM state.
pub fn manufacture(state_dir: &Path, options: &ManufactureOptions) -> Result<(), SwtpmError> {
    check_swtpm_installed(true)?;
    let state_dir = existing_dir("swtpm state directory", state_dir)?;
    if has_tpm_state(&state_dir) {
        return Err(SwtpmError::AlreadyManufactured { state_dir });
    }
    let ca = &options.ek_ca_dir;
    let localca_conf = ca.join("swtpm-localca.conf");
    let localca_options = ca.join("swtpm-localca.options");
    let setup_conf = ca.join("swtpm_setup.conf");
    write_atomically(
        &localca_conf,
        format!(
            "statedir = {ca}\nsigningkey = {ca}/signkey.pem\nissuercert = {ca}/issuercert.pem\n\
             certserial = {ca}/certserial\n",
            ca = ca.display()
        )
        .as_bytes(),
    )?;
    write_atomically(
        &localca_options,
        b"--platform-manufacturer Asterism\n--platform-version 2.1\n--platform-model swtpm\n",
    )?;
    let banks: Vec<&str> = options.pcr_banks.iter().map(|b| b.name()).collect();
    let banks = banks.join(",");
    write_atomically(
        &setup_conf,
        format!(
            "create_certs_tool = swtpm_localca\ncreate_certs_tool_config = {}\n\
             create_certs_tool_options = {}\nactive_pcr_banks = {banks}\n",
            localca_conf.display(),
            localca_options.display()
        )
        .as_bytes(),
    )?;
    let log = options
        .log_file
        .clone()
        .unwrap_or_else(|| state_dir.join(SETUP_LOG_FILE));
    debug!(state_dir = %state_dir.display(), %banks, "manufacturing TPM with swtpm_setup");
    let status = asterism_children::status(
        Command::new("swtpm_setup")
            .arg("--tpm2")
            .arg("--tpmstate")
            .arg(&state_dir)
            .args(["--createek", "--create-ek-cert"])
            .args(["--pcr-banks", &banks])
            .arg("--config")
            .arg(&setup_conf)
            .arg("--logfile")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
    .map_err(io_error("running swtpm_setup"))?;
    if status.success() {
        info!(state_dir = %state_dir.display(), "manufactured TPM (EKs and EK certificates)");
        Ok(())
    } else {
        Err(SwtpmError::Setup {
            status,
            log: tail(&log),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manufacture_options_need_a_bank() {
        let dir = tempfile::tempdir().unwrap();
        let options = ManufactureOptions::new(dir.path().join("ek-ca")).unwrap();
        assert!(options.ek_ca_dir().is_dir());
        assert!(matches!(
            options.with_pcr_banks([]),
            Err(SwtpmError::InvalidConfig { .. })
        ));
    }
}

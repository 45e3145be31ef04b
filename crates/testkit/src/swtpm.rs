//! A private swtpm (TPM 2.0 emulator) per test, on top of the production launcher
//! [`asterism_swtpm`].
//!
//! [`Swtpm::start`] makes a temporary directory (absolute path), optionally manufactures the
//! TPM with `swtpm_setup` (EK and EK certificate signed by a throw-away local CA in that
//! directory), then runs `swtpm socket` as a supervised child process on two free loopback
//! TCP ports: the command port `P` and the control port `P + 1` (the swtpm TCTI derives the
//! latter). It returns once the control channel answers.
//!
//! Lifetime of TPM state, which tests rely on:
//!
//! * Persistent state (persistent objects such as the AK, NV indices such as the EK
//!   certificate, hierarchy seeds) lives in the state directory and survives
//!   [`Swtpm::restart`].
//! * PCRs are volatile: they keep their values only while the swtpm *process* runs, so they
//!   survive closing and reopening TPM connections. swtpm starts with
//!   `--flags not-need-init,startup-clear`, i.e. every (re)start is a TPM reset followed by
//!   `TPM2_Startup(CLEAR)`, which sets PCRs back to their reset values, as a reboot does.

use std::fs;
use std::path::{Path, PathBuf};

use asterism_swtpm::{ManufactureOptions, SwtpmConfig, SwtpmError, SwtpmProcess, manufacture};
use asterism_tpm::TpmConfig;

/// Options for [`Swtpm`].
#[derive(Clone, Debug, Default)]
pub struct SwtpmBuilder {
    ek_cert: bool,
}

impl SwtpmBuilder {
    /// Manufacture the TPM with `swtpm_setup`: RSA-2048 and ECC EKs, their certificates in NV
    /// (RSA at `0x01C00002`, ECC P-384 at `0x01C00016` with swtpm 0.7) signed by a local CA
    /// created in the temporary directory, and only the SHA-256 PCR bank allocated. Without
    /// it the TPM is fresh: no EK, no certificate, libtpms's default PCR banks.
    pub fn with_ek_cert(mut self, ek_cert: bool) -> Self {
        self.ek_cert = ek_cert;
        self
    }

    /// Starts swtpm.
    pub fn start(self) -> Result<Swtpm, SwtpmError> {
        asterism_swtpm::check_swtpm_installed(self.ek_cert)?;
        let io = |what: &'static str| {
            move |source| SwtpmError::Io {
                what: what.to_owned(),
                source,
            }
        };
        let dir = tempfile::Builder::new()
            .prefix("asterism-swtpm-")
            .tempdir()
            .map_err(io("creating the swtpm directory"))?;
        // swtpm needs an absolute state path; resolve symbolic links too.
        let root = dir
            .path()
            .canonicalize()
            .map_err(io("resolving the swtpm directory"))?;
        let state_dir = root.join("state");
        fs::create_dir(&state_dir).map_err(io("creating the swtpm state directory"))?;
        let ek_ca_dir = self.ek_cert.then(|| root.join("ca"));
        if let Some(ca) = &ek_ca_dir {
            let options = ManufactureOptions::new(ca)?.with_log_file(root.join("swtpm_setup.log"));
            manufacture(&state_dir, &options)?;
        }
        let config = SwtpmConfig::new(&state_dir)?.with_run_dir(&root)?;
        let process = SwtpmProcess::start(&config)?;
        Ok(Swtpm {
            process: Some(process),
            dir: Some(dir),
            state_dir,
            ek_ca_dir,
        })
    }
}

/// A running swtpm, private to its owner. Dropping it stops the process and deletes the
/// state directory.
#[derive(Debug)]
pub struct Swtpm {
    // Declared before `dir` so that the process stops before the directory is deleted.
    process: Option<SwtpmProcess>,
    dir: Option<tempfile::TempDir>,
    state_dir: PathBuf,
    ek_ca_dir: Option<PathBuf>,
}

impl Swtpm {
    /// Options: `Swtpm::builder().with_ek_cert(true).start()`.
    pub fn builder() -> SwtpmBuilder {
        SwtpmBuilder::default()
    }

    /// Starts a fresh swtpm without EK (see [`SwtpmBuilder::with_ek_cert`]).
    pub fn start() -> Result<Self, SwtpmError> {
        SwtpmBuilder::default().start()
    }

    /// The TCTI string, e.g. `swtpm:host=127.0.0.1,port=40123`.
    pub fn tcti(&self) -> String {
        self.config().to_string()
    }

    /// The TPM configuration to open this swtpm with.
    pub fn config(&self) -> TpmConfig {
        TpmConfig::SwtpmTcp {
            host: "127.0.0.1".to_owned(),
            port: self.port(),
        }
    }

    /// The command port (the control port is one above).
    pub fn port(&self) -> u16 {
        self.process.as_ref().map_or(0, SwtpmProcess::port)
    }

    /// The TPM state directory (absolute).
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// The local CA that signed the EK certificates, when the TPM was manufactured with
    /// them: `swtpm_localca` keeps its root in `swtpm-localca-rootca-cert.pem` and the CA
    /// that signs EK certificates, issued by that root, in `issuercert.pem` (both PEM). The
    /// TPM's NV holds neither.
    pub fn ek_ca_dir(&self) -> Option<&Path> {
        self.ek_ca_dir.as_deref()
    }

    /// Stops the swtpm process and starts a new one on the same state directory: a TPM
    /// reset. Persistent objects and NV survive; PCRs start from their reset values. The
    /// ports stay the same unless another process took them meanwhile, so re-read
    /// [`Swtpm::config`].
    pub fn restart(&mut self) -> Result<(), SwtpmError> {
        match self.process.as_mut() {
            Some(process) => process.restart(),
            None => Err(SwtpmError::NotRunning {
                run_dir: self.state_dir.clone(),
                reason: "the swtpm was stopped".to_owned(),
            }),
        }
    }

    /// Stops swtpm and deletes its directory, reporting failures (dropping does the same
    /// silently).
    pub fn stop(mut self) -> Result<(), SwtpmError> {
        if let Some(process) = self.process.take() {
            process.stop()?;
        }
        match self.dir.take() {
            Some(dir) => dir.close().map_err(|source| SwtpmError::Io {
                what: "removing the swtpm directory".to_owned(),
                source,
            }),
            None => Ok(()),
        }
    }
}

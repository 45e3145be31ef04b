//! A private swtpm (TPM 2.0 emulator) per test.
//!
//! [`Swtpm::start`] makes a temporary directory (absolute path), optionally manufactures the
//! TPM with `swtpm_setup` (EK and EK certificate signed by a throw-away local CA), then runs
//! `swtpm socket` in the foreground as a child process on two free loopback TCP ports: the
//! command port `P` and the control port `P + 1` (the swtpm TCTI derives the latter). It
//! returns once the control channel answers.
//!
//! Lifetime of TPM state, which tests rely on:
//!
//! * Persistent state (persistent objects such as the AK, NV indices such as the EK
//!   certificate, hierarchy seeds) lives in the state directory and survives
//!   [`Swtpm::restart`].
//! * PCRs are volatile: they keep their values only while the swtpm *process* runs, so they
//!   survive closing and reopening TPM connections. swtpm starts with
//!   `--flags not-need-init,startup-clear`, i.e. every (re)start is a TPM reset followed by
//!   `TPM2_Startup(CLEAR)`, which sets PCRs 0..=23 back to zero, as a reboot does.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use asterism_tpm::TpmConfig;
use tracing::debug;

/// How long swtpm may take to answer on its control channel.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a graceful shutdown may take before the process is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// Fresh port pairs tried when swtpm cannot bind (another process took a port meanwhile).
const START_ATTEMPTS: u32 = 5;

/// swtpm control-channel commands (big-endian u32 on the control socket).
const CMD_GET_CAPABILITY: u32 = 0x01;
const CMD_SHUTDOWN: u32 = 0x03;

/// Something went wrong running swtpm.
#[derive(Debug, thiserror::Error)]
pub enum SwtpmError {
    /// A program is not installed.
    #[error(
        "`{program}` not found; install the Debian packages `swtpm` and `swtpm-tools` \
         (apt-get install swtpm swtpm-tools) to run the TPM tests"
    )]
    NotInstalled {
        /// The missing program.
        program: &'static str,
    },
    /// A file-system or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// `swtpm_setup` failed.
    #[error("swtpm_setup failed ({status}); its log:\n{log}")]
    Setup {
        /// Its exit status.
        status: ExitStatus,
        /// The end of its log.
        log: String,
    },
    /// `swtpm` did not come up.
    #[error("swtpm did not start after {attempts} attempts: {reason}; its log:\n{log}")]
    Start {
        /// Port pairs tried.
        attempts: u32,
        /// The last failure.
        reason: String,
        /// The end of its log.
        log: String,
    },
}

fn io_error(what: impl Into<String>) -> impl FnOnce(io::Error) -> SwtpmError {
    let what = what.into();
    move |source| SwtpmError::Io { what, source }
}

/// Checks that `swtpm` (and, when an EK certificate is wanted, `swtpm_setup` and
/// `swtpm_localca`) can be run, with an error that says what to install otherwise.
pub fn check_swtpm_installed(with_setup: bool) -> Result<(), SwtpmError> {
    let mut programs = vec!["swtpm"];
    if with_setup {
        programs.extend(["swtpm_setup", "swtpm_localca"]);
    }
    for program in programs {
        let probe = Command::new(program)
            .arg("--help")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        match probe {
            Ok(_) => {}
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                return Err(SwtpmError::NotInstalled { program });
            }
            Err(error) => return Err(io_error(format!("running `{program} --help`"))(error)),
        }
    }
    Ok(())
}

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
        check_swtpm_installed(self.ek_cert)?;
        let dir = tempfile::Builder::new()
            .prefix("asterism-swtpm-")
            .tempdir()
            .map_err(io_error("creating the swtpm directory"))?;
        // swtpm needs an absolute state path; resolve symbolic links too.
        let root = dir
            .path()
            .canonicalize()
            .map_err(io_error("resolving the swtpm directory"))?;
        let state_dir = root.join("state");
        fs::create_dir(&state_dir).map_err(io_error("creating the swtpm state directory"))?;
        if self.ek_cert {
            manufacture(&root, &state_dir)?;
        }
        let mut swtpm = Swtpm {
            dir: Some(dir),
            root,
            state_dir,
            child: None,
            port: 0,
        };
        swtpm.spawn(None)?;
        Ok(swtpm)
    }
}

/// A running swtpm, private to its owner. Dropping it stops the process and deletes the
/// state directory.
#[derive(Debug)]
pub struct Swtpm {
    dir: Option<tempfile::TempDir>,
    root: PathBuf,
    state_dir: PathBuf,
    child: Option<Child>,
    port: u16,
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
            host: Ipv4Addr::LOCALHOST.to_string(),
            port: self.port,
        }
    }

    /// The command port (the control port is one above).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The TPM state directory (absolute).
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// Stops the swtpm process and starts a new one on the same state directory: a TPM
    /// reset. Persistent objects and NV survive; PCRs start from zero again. The ports stay
    /// the same unless another process took them meanwhile, so re-read [`Swtpm::config`].
    pub fn restart(&mut self) -> Result<(), SwtpmError> {
        self.stop_process()?;
        self.spawn(Some(self.port))
    }

    /// Stops swtpm and deletes its directory, reporting failures (dropping does the same
    /// silently).
    pub fn stop(mut self) -> Result<(), SwtpmError> {
        self.stop_process()?;
        match self.dir.take() {
            Some(dir) => dir
                .close()
                .map_err(io_error("removing the swtpm directory")),
            None => Ok(()),
        }
    }

    fn log_path(&self) -> PathBuf {
        self.root.join("swtpm.log")
    }

    fn spawn(&mut self, preferred_port: Option<u16>) -> Result<(), SwtpmError> {
        let mut last_reason = String::new();
        for attempt in 1..=START_ATTEMPTS {
            let port = match preferred_port.filter(|_| attempt == 1) {
                Some(port) => port,
                None => free_port_pair()?,
            };
            let log = File::options()
                .create(true)
                .append(true)
                .open(self.log_path())
                .map_err(io_error("opening the swtpm log"))?;
            let log_err = log.try_clone().map_err(io_error("opening the swtpm log"))?;
            // swtpm writes its pid file only once it has bound both ports: the proof that the
            // ports answer for this process and not for one that took them meanwhile.
            let pid_file = self.root.join("swtpm.pid");
            match fs::remove_file(&pid_file) {
                Ok(()) => {}
                Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                Err(error) => return Err(io_error("removing the old swtpm pid file")(error)),
            }
            let pid = format!("file={}", pid_file.display());
            let state = format!("dir={}", self.state_dir.display());
            let server = format!("type=tcp,port={port},bindaddr=127.0.0.1");
            let ctrl = format!("type=tcp,port={},bindaddr=127.0.0.1", port + 1);
            let child = Command::new("swtpm")
                .args([
                    "socket",
                    "--tpm2",
                    "--tpmstate",
                    &state,
                    "--server",
                    &server,
                ])
                .args(["--ctrl", &ctrl, "--flags", "not-need-init,startup-clear"])
                .args(["--pid", &pid])
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(log_err)
                .spawn()
                .map_err(io_error("starting swtpm"))?;
            self.child = Some(child);
            self.port = port;
            match self.wait_ready(&pid_file) {
                Ok(()) => {
                    debug!(port, state_dir = %self.state_dir.display(), "swtpm ready");
                    return Ok(());
                }
                Err(reason) => {
                    last_reason = reason;
                    // Best effort: the process may already be gone.
                    if let Some(mut child) = self.child.take() {
                        let _ = child.kill();
                        let _ = child.wait();
                    }
                }
            }
        }
        Err(SwtpmError::Start {
            attempts: START_ATTEMPTS,
            reason: last_reason,
            log: tail(&self.log_path()),
        })
    }

    /// Waits until our swtpm has bound its ports (its pid file names it) and its control
    /// channel answers a capability query.
    fn wait_ready(&mut self, pid_file: &Path) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let Some(child) = self.child.as_mut() else {
                return Err("no swtpm process".to_owned());
            };
            match child.try_wait() {
                Ok(Some(status)) => return Err(format!("swtpm exited with {status}")),
                Ok(None) => {}
                Err(error) => return Err(format!("cannot poll swtpm: {error}")),
            }
            let ours =
                fs::read_to_string(pid_file).is_ok_and(|pid| pid.trim() == child.id().to_string());
            let ready = ours
                && control(self.port + 1, CMD_GET_CAPABILITY).is_ok()
                && TcpStream::connect((Ipv4Addr::LOCALHOST, self.port)).is_ok();
            if ready {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("no answer within {START_TIMEOUT:?}"));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Asks swtpm to shut down, then kills it if it does not exit in time.
    fn stop_process(&mut self) -> Result<(), SwtpmError> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        // Only while our process runs is the control port certainly ours.
        if let Ok(Some(_)) = child.try_wait() {
            return Ok(());
        }
        if control(self.port + 1, CMD_SHUTDOWN).is_ok() {
            let deadline = Instant::now() + STOP_TIMEOUT;
            while Instant::now() < deadline {
                match child.try_wait() {
                    Ok(Some(_)) => return Ok(()),
                    Ok(None) => thread::sleep(Duration::from_millis(10)),
                    Err(_) => break,
                }
            }
        }
        match child.kill() {
            Ok(()) => {}
            // Already exited.
            Err(error) if error.kind() == io::ErrorKind::InvalidInput => {}
            Err(error) => return Err(io_error("killing swtpm")(error)),
        }
        child.wait().map_err(io_error("waiting for swtpm"))?;
        Ok(())
    }
}

impl Drop for Swtpm {
    fn drop(&mut self) {
        let _ = self.stop_process();
    }
}

/// Sends one control-channel command and reads its 4-byte result code.
fn control(port: u16, command: u32) -> io::Result<()> {
    let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(1))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(&command.to_be_bytes())?;
    let mut result = [0u8; 4];
    stream.read_exact(&mut result)?;
    if u32::from_be_bytes(result) == 0 {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "swtpm control command {command:#x} failed with {:#x}",
            u32::from_be_bytes(result)
        )))
    }
}

/// A port `P` such that `P` and `P + 1` were both free a moment ago. swtpm binds them
/// itself, so another process can still take one first; [`Swtpm::spawn`] then retries.
fn free_port_pair() -> Result<u16, SwtpmError> {
    for _ in 0..64 {
        let first =
            TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(io_error("finding a free port"))?;
        let port = first
            .local_addr()
            .map_err(io_error("finding a free port"))?
            .port();
        if port == u16::MAX {
            continue;
        }
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port + 1)).is_ok() {
            return Ok(port);
        }
    }
    Err(SwtpmError::Io {
        what: "finding two adjacent free ports".to_owned(),
        source: io::Error::from(io::ErrorKind::AddrInUse),
    })
}

/// Runs `swtpm_setup` with configuration files of our own (nothing under /etc is read or
/// written): EKs, EK certificates from a local CA in `root/ca`, SHA-256 bank only.
fn manufacture(root: &Path, state_dir: &Path) -> Result<(), SwtpmError> {
    let ca = root.join("ca");
    fs::create_dir(&ca).map_err(io_error("creating the local CA directory"))?;
    let localca_conf = root.join("swtpm-localca.conf");
    let localca_options = root.join("swtpm-localca.options");
    let setup_conf = root.join("swtpm_setup.conf");
    let write = |path: &Path, text: String| {
        fs::write(path, text).map_err(io_error(format!("writing {}", path.display())))
    };
    write(
        &localca_conf,
        format!(
            "statedir = {ca}\nsigningkey = {ca}/signkey.pem\nissuercert = {ca}/issuercert.pem\n\
             certserial = {ca}/certserial\n",
            ca = ca.display()
        ),
    )?;
    write(
        &localca_options,
        "--platform-manufacturer Asterism\n--platform-version 2.1\n--platform-model swtpm\n"
            .to_owned(),
    )?;
    write(
        &setup_conf,
        format!(
            "create_certs_tool = swtpm_localca\ncreate_certs_tool_config = {}\n\
             create_certs_tool_options = {}\nactive_pcr_banks = sha256\n",
            localca_conf.display(),
            localca_options.display()
        ),
    )?;
    let log = root.join("swtpm_setup.log");
    let status = Command::new("swtpm_setup")
        .arg("--tpm2")
        .arg("--tpmstate")
        .arg(state_dir)
        .args(["--createek", "--create-ek-cert", "--overwrite"])
        .args(["--pcr-banks", "sha256"])
        .arg("--config")
        .arg(&setup_conf)
        .arg("--logfile")
        .arg(&log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(io_error("running swtpm_setup"))?;
    if status.success() {
        Ok(())
    } else {
        Err(SwtpmError::Setup {
            status,
            log: tail(&log),
        })
    }
}

/// The last lines of a log file, for error messages.
fn tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let skip = lines.len().saturating_sub(20);
    lines.into_iter().skip(skip).collect::<Vec<_>>().join("\n")
}

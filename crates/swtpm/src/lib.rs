//! Running swtpm, the TPM 2.0 emulator, as a node's TPM: manufacture a TPM state (EKs and EK
//! certificates), start `swtpm socket` on a persistent state directory, find a running one
//! again, stop it.
//!
//! This crate is process management only: it runs the `swtpm`, `swtpm_setup` and (through
//! `swtpm_setup`) `swtpm_localca` programs of the Debian packages `swtpm` and `swtpm-tools`
//! and links nothing of the TSS, so that programs which only start and stop TPMs (`asterism
//! mini`, the provisioning tool's manufacturing step) need not link it either. The TPM
//! itself is then opened like any other, from its TCTI string:
//! `asterism_tpm::Tpm::open(&process.tcti().parse()?)`. It must never talk TPM commands.
//!
//! * [`SwtpmConfig`] names an existing state directory (absolute after resolution), the
//!   directory for the pid and port files and the log file (all in the state directory
//!   unless set otherwise) and a chosen TCP port or "any free port".
//! * [`manufacture`] runs `swtpm_setup` on an empty state directory: RSA-2048 and ECC EKs,
//!   their certificates in NV signed by a manufacturer CA in a directory of the caller's
//!   choice, and the chosen PCR banks ([`ManufactureOptions`]). Configuration files are
//!   written next to that CA; nothing under `/etc` is read or written.
//! * [`SwtpmProcess::start`] runs swtpm as a supervised child that is stopped when the value
//!   is dropped; [`SwtpmProcess::start_detached`] lets swtpm daemonise itself (its own
//!   session, parent init) and leaves it running; [`SwtpmProcess::attach`] finds a detached
//!   swtpm again from its pid and port files, so that another process can use or stop it.
//!   A detached process is recognised by its command line (`/proc/<pid>/cmdline`: an
//!   `swtpm` on this state directory and port), so a recycled pid is never shut down; it is
//!   stopped over its control channel, and killed with the `kill` program (this crate has
//!   no `unsafe` for a signal call) only if it does not exit.
//!
//! swtpm listens on `127.0.0.1` only: the command port `P` and the control port `P + 1` (the
//! TSS swtpm TCTI derives the latter). It runs with `--flags not-need-init,startup-clear`,
//! so every start is a power-on followed by `TPM2_Startup(CLEAR)`.
//!
//! # What survives what
//!
//! * **Persistent state** lives in the state directory (`tpm2-00.permall`): the hierarchy
//!   seeds, persistent objects such as the AK (`TPM2_EvictControl`), NV indices such as the
//!   EK certificates. It survives closing the TPM connection, stopping swtpm and
//!   [`SwtpmProcess::restart`].
//! * **PCRs** live only in the swtpm process. They survive closing and reopening TPM
//!   connections, but every (re)start of swtpm is a TPM reset, as a reboot is: PCRs 0–16
//!   and 23 start as zeros and 17–22 as all ones. In particular the node marker in PCR 15
//!   (`asterism_tpm::marker`) is cleared by a restart, exactly as by a reboot of a real node.
//!
//! # Files
//!
//! In the run directory: `swtpm.pid` (written by swtpm once it has bound its ports; the
//! proof that the ports answer for our process), `swtpm.port` (the command port, written
//! by this crate once swtpm answers) and, unless configured elsewhere, `swtpm.log`
//! (appended). Both the pid and port files
//! are removed when the process is stopped through this crate.
//!
//! Only one swtpm can run on a state directory at a time: swtpm locks it (`.lock`), and the
//! start functions refuse with [`SwtpmError::AlreadyRunning`] when the run directory names a
//! live swtpm on it.
#![forbid(unsafe_code)]

use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

/// How long swtpm may take to bind its ports and answer on its control channel.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a graceful shutdown may take before the process is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// Fresh port pairs tried when swtpm cannot bind a free port (another process took it).
const START_ATTEMPTS: u32 = 5;

/// swtpm control-channel commands (big-endian u32 on the control socket).
const CMD_GET_CAPABILITY: u32 = 0x01;
const CMD_SHUTDOWN: u32 = 0x03;

/// The file in which swtpm keeps a TPM 2.0's persistent state.
pub const STATE_FILE: &str = "tpm2-00.permall";
/// The pid file in the run directory.
pub const PID_FILE: &str = "swtpm.pid";
/// The port file in the run directory: the command port, decimal.
pub const PORT_FILE: &str = "swtpm.port";
/// The log file in the run directory.
pub const LOG_FILE: &str = "swtpm.log";
/// The default `swtpm_setup` log, in the state directory.
pub const SETUP_LOG_FILE: &str = "swtpm_setup.log";

/// Something went wrong running swtpm.
#[derive(Debug, thiserror::Error)]
pub enum SwtpmError {
    /// A program is not installed.
    #[error(
        "`{program}` not found; install the Debian packages `swtpm` and `swtpm-tools` \
         (apt-get install swtpm swtpm-tools)"
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
    /// A directory, port or option cannot be used.
    #[error("invalid swtpm configuration: {reason}")]
    InvalidConfig {
        /// What is wrong.
        reason: String,
    },
    /// [`manufacture`] was asked to overwrite an existing TPM.
    #[error(
        "{} already holds a TPM state ({STATE_FILE}); refusing to manufacture over it",
        state_dir.display()
    )]
    AlreadyManufactured {
        /// The state directory.
        state_dir: PathBuf,
    },
    /// `swtpm_setup` failed.
    #[error("swtpm_setup failed ({status}); its log:\n{log}")]
    Setup {
        /// Its exit status.
        status: ExitStatus,
        /// The end of its log.
        log: String,
    },
    /// An swtpm already runs on this state directory.
    #[error(
        "swtpm (pid {pid}, port {port}) already runs on {}",
        state_dir.display()
    )]
    AlreadyRunning {
        /// Its process ID.
        pid: u32,
        /// Its command port.
        port: u16,
        /// The state directory.
        state_dir: PathBuf,
    },
    /// swtpm did not come up.
    #[error("swtpm did not start after {attempts} attempt(s): {reason}; its log:\n{log}")]
    Start {
        /// Port pairs tried.
        attempts: u32,
        /// The last failure.
        reason: String,
        /// The end of its log.
        log: String,
    },
    /// No swtpm of ours runs for this run directory.
    #[error("no swtpm is running for {}: {reason}", run_dir.display())]
    NotRunning {
        /// The run directory.
        run_dir: PathBuf,
        /// Why we think so.
        reason: String,
    },
    /// swtpm would not stop.
    #[error("swtpm (pid {pid}) did not stop: {reason}")]
    Stop {
        /// Its process ID.
        pid: u32,
        /// What failed.
        reason: String,
    },
}

fn io_error(what: impl Into<String>) -> impl FnOnce(io::Error) -> SwtpmError {
    let what = what.into();
    move |source| SwtpmError::Io { what, source }
}

fn invalid(reason: impl Into<String>) -> SwtpmError {
    SwtpmError::InvalidConfig {
        reason: reason.into(),
    }
}

/// Checks that `swtpm` (and, with `with_setup`, `swtpm_setup` and `swtpm_localca`) can be
/// run, with an error that says what to install otherwise.
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

/// Whether `state_dir` holds a TPM 2.0 state (swtpm has run on it or it was manufactured).
pub fn has_tpm_state(state_dir: &Path) -> bool {
    state_dir.join(STATE_FILE).is_file()
}

/// Resolves an existing directory to an absolute path that swtpm's `key=value` option
/// syntax can carry (no comma).
fn existing_dir(what: &str, dir: &Path) -> Result<PathBuf, SwtpmError> {
    let resolved = dir
        .canonicalize()
        .map_err(io_error(format!("resolving the {what} {}", dir.display())))?;
    if !resolved.is_dir() {
        return Err(invalid(format!(
            "the {what} {} is not a directory",
            resolved.display()
        )));
    }
    if resolved.as_os_str().as_bytes().contains(&b',') {
        return Err(invalid(format!(
            "the {what} {} contains a comma, which swtpm's option syntax cannot carry",
            resolved.display()
        )));
    }
    Ok(resolved)
}

/// Where swtpm keeps its state and files, and which port it listens on. Valid by
/// construction: the directories exist and are absolute, the port leaves room for the
/// control port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SwtpmConfig {
    state_dir: PathBuf,
    run_dir: PathBuf,
    log_file: Option<PathBuf>,
    port: Option<u16>,
}

impl SwtpmConfig {
    /// swtpm on the existing `state_dir` (resolved to an absolute path), with its pid, port
    /// and log files in the same directory and any free port pair.
    ///
    /// An empty directory is a fresh TPM without EK; [`manufacture`] it first for one with
    /// EKs and EK certificates.
    pub fn new(state_dir: impl AsRef<Path>) -> Result<Self, SwtpmError> {
        let state_dir = existing_dir("swtpm state directory", state_dir.as_ref())?;
        Ok(SwtpmConfig {
            run_dir: state_dir.clone(),
            state_dir,
            log_file: None,
            port: None,
        })
    }

    /// Keeps the pid, port and log files in the existing directory `run_dir` instead.
    pub fn with_run_dir(mut self, run_dir: impl AsRef<Path>) -> Result<Self, SwtpmError> {
        self.run_dir = existing_dir("swtpm run directory", run_dir.as_ref())?;
        Ok(self)
    }

    /// Appends swtpm's log to `path` (made absolute against the current directory; it must
    /// not contain a comma) instead of `<run dir>/swtpm.log`.
    pub fn with_log_file(mut self, path: impl AsRef<Path>) -> Result<Self, SwtpmError> {
        let path = std::path::absolute(path.as_ref()).map_err(io_error(format!(
            "resolving the swtpm log file {}",
            path.as_ref().display()
        )))?;
        if path.as_os_str().as_bytes().contains(&b',') {
            return Err(invalid(format!(
                "the swtpm log file {} contains a comma, which swtpm's option syntax cannot carry",
                path.display()
            )));
        }
        self.log_file = Some(path);
        Ok(self)
    }

    /// Listens on `port` (commands) and `port + 1` (control) on 127.0.0.1; starting fails
    /// when they are taken. Ports 0 and 65535 are refused.
    pub fn with_port(mut self, port: u16) -> Result<Self, SwtpmError> {
        if port == 0 || port == u16::MAX {
            return Err(invalid(format!(
                "port {port}: expected 1..=65534 (the control port is port + 1)"
            )));
        }
        self.port = Some(port);
        Ok(self)
    }

    /// Listens on any free pair of adjacent loopback ports (the default).
    pub fn with_free_port(mut self) -> Self {
        self.port = None;
        self
    }

    /// The state directory (absolute).
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// The directory of the pid, port and log files (absolute).
    pub fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    /// The chosen command port, or `None` for any free one.
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// The pid file swtpm writes.
    pub fn pid_file(&self) -> PathBuf {
        self.run_dir.join(PID_FILE)
    }

    /// The file that records the command port of a running swtpm.
    pub fn port_file(&self) -> PathBuf {
        self.run_dir.join(PORT_FILE)
    }

    /// swtpm's log.
    pub fn log_file(&self) -> PathBuf {
        self.log_file
            .clone()
            .unwrap_or_else(|| self.run_dir.join(LOG_FILE))
    }

    /// The state argument exactly as passed to swtpm (also how its process is recognised).
    fn state_arg(&self) -> OsString {
        let mut arg = OsString::from("dir=");
        arg.push(&self.state_dir);
        arg
    }

    fn server_arg(port: u16) -> String {
        format!("type=tcp,port={port},bindaddr=127.0.0.1")
    }
}

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
    let status = Command::new("swtpm_setup")
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
        .stderr(Stdio::null())
        .status()
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

/// Writes `contents` to `path` through a temporary file in the same directory and a rename,
/// so a concurrent reader sees the old or the new file, never a partial one.
fn write_atomically(path: &Path, contents: &[u8]) -> Result<(), SwtpmError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut name = path.file_name().unwrap_or(OsStr::new("file")).to_owned();
    name.push(format!(
        ".tmp.{}.{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let temp = path.with_file_name(name);
    fs::write(&temp, contents).map_err(io_error(format!("writing {}", temp.display())))?;
    fs::rename(&temp, path).map_err(|error| {
        let _ = fs::remove_file(&temp);
        io_error(format!("replacing {}", path.display()))(error)
    })
}

/// A running swtpm started or found by this crate.
///
/// A supervised process ([`SwtpmProcess::start`]) is a child of this process and is
/// stopped when the value is dropped. A detached one ([`SwtpmProcess::start_detached`],
/// [`SwtpmProcess::attach`]) keeps running after the value is dropped and after this
/// process exits, until someone calls [`SwtpmProcess::stop`].
#[derive(Debug)]
pub struct SwtpmProcess {
    config: SwtpmConfig,
    port: u16,
    pid: u32,
    child: Option<Child>,
    detached: bool,
}

impl SwtpmProcess {
    /// Starts swtpm as a supervised child on `config`'s state directory and returns once it
    /// answers. Dropping the value stops it.
    pub fn start(config: &SwtpmConfig) -> Result<Self, SwtpmError> {
        Self::launch(config, false, config.port)
    }

    /// Starts swtpm detached: it daemonises itself (a session of its own, re-parented to
    /// init), so it outlives this value and this process. Returns once it answers; its pid
    /// and port are in the run directory, where [`SwtpmProcess::attach`] finds them.
    pub fn start_detached(config: &SwtpmConfig) -> Result<Self, SwtpmError> {
        Self::launch(config, true, config.port)
    }

    /// Finds the detached swtpm that runs on `config`'s state directory, from the pid and
    /// port files in the run directory. The process must be an `swtpm` on that state
    /// directory and port, and its control channel must answer.
    pub fn attach(config: &SwtpmConfig) -> Result<Self, SwtpmError> {
        let not_running = |reason: String| SwtpmError::NotRunning {
            run_dir: config.run_dir.clone(),
            reason,
        };
        let (pid, port) = recorded(config).map_err(not_running)?;
        if !process_matches(pid, config, port) {
            return Err(not_running(format!(
                "process {pid} is not an swtpm on {} and port {port}",
                config.state_dir.display()
            )));
        }
        control(port.saturating_add(1), CMD_GET_CAPABILITY).map_err(|error| {
            not_running(format!(
                "swtpm {pid} does not answer on control port {}: {error}",
                port.saturating_add(1)
            ))
        })?;
        Ok(SwtpmProcess {
            config: config.clone(),
            port,
            pid,
            child: None,
            detached: true,
        })
    }

    /// The TCTI string to open this swtpm with, e.g. `swtpm:host=127.0.0.1,port=40123`
    /// (`asterism_tpm::TpmConfig` parses it).
    pub fn tcti(&self) -> String {
        format!("swtpm:host={},port={}", Ipv4Addr::LOCALHOST, self.port)
    }

    /// The command port (the control port is one above).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The swtpm process ID.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The configuration it was started with.
    pub fn config(&self) -> &SwtpmConfig {
        &self.config
    }

    /// The TPM state directory (absolute).
    pub fn state_dir(&self) -> &Path {
        &self.config.state_dir
    }

    /// Whether it outlives this value.
    pub fn is_detached(&self) -> bool {
        self.detached
    }

    /// Whether the process still runs.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => process_matches(self.pid, &self.config, self.port),
        }
    }

    /// Stops swtpm and waits for it to exit: a shutdown over the control channel (swtpm
    /// writes its state and exits), then a kill if it does not exit in time. The state
    /// directory stays; the pid and port files are removed.
    pub fn stop(mut self) -> Result<(), SwtpmError> {
        self.stop_process()
    }

    /// Stops swtpm and starts it again on the same state directory, supervised or detached
    /// as before: a TPM reset. Persistent objects and NV survive; PCRs start from their
    /// reset values. The port stays the same unless it was chosen freely and another process
    /// took it meanwhile, so re-read [`SwtpmProcess::tcti`].
    pub fn restart(&mut self) -> Result<(), SwtpmError> {
        self.stop_process()?;
        let preferred = self.config.port.or(Some(self.port));
        let restarted = Self::launch(&self.config, self.detached, preferred)?;
        *self = restarted;
        Ok(())
    }

    /// Starts swtpm. `port`: the port to try first; when the configuration chose none,
    /// later attempts take fresh free ports.
    fn launch(config: &SwtpmConfig, detached: bool, port: Option<u16>) -> Result<Self, SwtpmError> {
        check_swtpm_installed(false)?;
        if let Ok((pid, running_port)) = recorded(config)
            && process_matches(pid, config, running_port)
        {
            return Err(SwtpmError::AlreadyRunning {
                pid,
                port: running_port,
                state_dir: config.state_dir.clone(),
            });
        }
        let attempts = if config.port.is_some() {
            1
        } else {
            START_ATTEMPTS
        };
        let mut last_reason = String::new();
        for attempt in 1..=attempts {
            let port = match port.filter(|_| attempt == 1) {
                Some(port) => port,
                None => free_port_pair()?,
            };
            match Self::spawn_once(config, detached, port) {
                Ok(mut process) => {
                    let recorded = format!("{port}\n");
                    if let Err(error) = write_atomically(&config.port_file(), recorded.as_bytes()) {
                        // Without its port file a detached swtpm could not be found again.
                        let _ = process.stop_process();
                        return Err(error);
                    }
                    info!(
                        pid = process.pid,
                        port,
                        detached,
                        state_dir = %config.state_dir.display(),
                        "swtpm running"
                    );
                    return Ok(process);
                }
                Err(StartFailure::Fatal(error)) => return Err(error),
                Err(StartFailure::Retry(reason)) => {
                    debug!(attempt, port, %reason, "swtpm did not start");
                    last_reason = reason;
                }
            }
        }
        Err(SwtpmError::Start {
            attempts,
            reason: last_reason,
            log: tail(&config.log_file()),
        })
    }

    fn spawn_once(
        config: &SwtpmConfig,
        detached: bool,
        port: u16,
    ) -> Result<SwtpmProcess, StartFailure> {
        let fatal = StartFailure::Fatal;
        remove_if_present(&config.pid_file()).map_err(fatal)?;
        remove_if_present(&config.port_file()).map_err(fatal)?;
        let log_path = config.log_file();
        let log = File::options()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| fatal(io_error(format!("opening {}", log_path.display()))(e)))?;
        let log_err = log
            .try_clone()
            .map_err(|e| fatal(io_error("duplicating the swtpm log handle")(e)))?;
        let mut pid_arg = OsString::from("file=");
        pid_arg.push(config.pid_file());
        let mut log_arg = OsString::from("file=");
        log_arg.push(&log_path);
        let mut command = Command::new("swtpm");
        command
            .args(["socket", "--tpm2", "--tpmstate"])
            .arg(config.state_arg())
            .args(["--server", &SwtpmConfig::server_arg(port)])
            .args([
                "--ctrl",
                &format!("type=tcp,port={},bindaddr=127.0.0.1", port + 1),
            ])
            .args(["--flags", "not-need-init,startup-clear"])
            .arg("--pid")
            .arg(pid_arg)
            .arg("--log")
            .arg(log_arg);
        if detached {
            command.arg("--daemon");
        }
        // Errors before swtpm opens its log (a port in use) go to stderr: keep them too.
        let mut child = command
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .map_err(|e| fatal(io_error("starting swtpm")(e)))?;
        let mut process = SwtpmProcess {
            config: config.clone(),
            port,
            pid: child.id(),
            child: None,
            detached,
        };
        if detached {
            // The launcher binds the ports, locks the state and then daemonises: its exit
            // status says whether that worked. The daemon writes the pid file afterwards.
            match wait_with_timeout(&mut child, START_TIMEOUT) {
                Ok(Some(status)) if status.success() => {}
                Ok(Some(status)) => {
                    return Err(StartFailure::Retry(format!("swtpm exited with {status}")));
                }
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(StartFailure::Retry(format!(
                        "swtpm did not daemonise within {START_TIMEOUT:?}"
                    )));
                }
                Err(error) => {
                    return Err(fatal(io_error("waiting for the swtpm launcher")(error)));
                }
            }
        } else {
            process.child = Some(child);
        }
        match process.wait_ready() {
            Ok(()) => Ok(process),
            Err(reason) => {
                // Best effort: whatever we started must not linger.
                let _ = process.stop_process();
                Err(StartFailure::Retry(reason))
            }
        }
    }

    /// Waits until our swtpm has bound its ports (its pid file names it) and its control
    /// channel answers a capability query.
    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        let pid_file = self.config.pid_file();
        loop {
            if let Some(child) = self.child.as_mut() {
                match child.try_wait() {
                    Ok(Some(status)) => return Err(format!("swtpm exited with {status}")),
                    Ok(None) => {}
                    Err(error) => return Err(format!("cannot poll swtpm: {error}")),
                }
            }
            let named = fs::read_to_string(&pid_file)
                .ok()
                .and_then(|text| text.trim().parse::<u32>().ok());
            let ours = match (named, self.child.as_ref()) {
                (Some(pid), Some(child)) => pid == child.id(),
                // Detached: the daemon is a grandchild; recognise it by its command line.
                (Some(pid), None) => process_matches(pid, &self.config, self.port),
                (None, _) => false,
            };
            if ours && let Some(pid) = named {
                self.pid = pid;
                let ready = control(self.port + 1, CMD_GET_CAPABILITY).is_ok()
                    && TcpStream::connect((Ipv4Addr::LOCALHOST, self.port)).is_ok();
                if ready {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                return Err(format!("no answer within {START_TIMEOUT:?}"));
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Asks swtpm to shut down, then kills it if it does not exit in time.
    /// A supervised process is stopped once (its child handle is taken); a detached one is
    /// looked up by its command line, so stopping it again finds it gone.
    fn stop_process(&mut self) -> Result<(), SwtpmError> {
        match self.child.take() {
            Some(child) => self.stop_child(child)?,
            None if self.detached => self.stop_detached()?,
            None => return Ok(()),
        }
        self.remove_own_files();
        debug!(pid = self.pid, "swtpm stopped");
        Ok(())
    }

    /// Removes the pid and port files unless they already name another process (a new
    /// swtpm started on this run directory after ours had exited).
    fn remove_own_files(&self) {
        let named = fs::read_to_string(self.config.pid_file())
            .ok()
            .and_then(|text| text.trim().parse::<u32>().ok());
        if named.is_none_or(|pid| pid == self.pid) {
            let _ = remove_if_present(&self.config.pid_file());
            let _ = remove_if_present(&self.config.port_file());
        }
    }

    fn stop_child(&mut self, mut child: Child) -> Result<(), SwtpmError> {
        // Only while our process runs is the control port certainly ours.
        if let Ok(Some(_)) = child.try_wait() {
            return Ok(());
        }
        if control(self.port + 1, CMD_SHUTDOWN).is_ok() {
            match wait_with_timeout(&mut child, STOP_TIMEOUT) {
                Ok(Some(_)) => return Ok(()),
                Ok(None) => warn!(pid = self.pid, "swtpm ignored the shutdown; killing it"),
                Err(_) => {}
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

    fn stop_detached(&mut self) -> Result<(), SwtpmError> {
        let pid = self.pid;
        let gone = |config: &SwtpmConfig, port| !process_matches(pid, config, port);
        if gone(&self.config, self.port) {
            return Ok(());
        }
        if control(self.port + 1, CMD_SHUTDOWN).is_ok()
            && wait_until(STOP_TIMEOUT, || gone(&self.config, self.port))
        {
            return Ok(());
        }
        warn!(
            pid,
            "swtpm did not shut down over its control channel; killing it"
        );
        // No signal API without `unsafe`: the `kill` program sends it. The process was just
        // recognised as our swtpm by its command line.
        let killed = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if let Err(error) = killed {
            return Err(SwtpmError::Stop {
                pid,
                reason: format!("running `kill`: {error}"),
            });
        }
        if wait_until(STOP_TIMEOUT, || gone(&self.config, self.port)) {
            Ok(())
        } else {
            Err(SwtpmError::Stop {
                pid,
                reason: "still running after SIGKILL".to_owned(),
            })
        }
    }
}

impl Drop for SwtpmProcess {
    fn drop(&mut self) {
        // Only a supervised child is stopped; a detached swtpm is meant to outlive us.
        if !self.detached {
            let _ = self.stop_process();
        }
    }
}

enum StartFailure {
    /// Worth another attempt (on another port, when the port was not chosen).
    Retry(String),
    /// Not worth another attempt.
    Fatal(SwtpmError),
}

/// The pid and port recorded in the run directory.
fn recorded(config: &SwtpmConfig) -> Result<(u32, u16), String> {
    let read = |path: PathBuf| {
        fs::read_to_string(&path).map_err(|error| format!("reading {}: {error}", path.display()))
    };
    let pid_text = read(config.pid_file())?;
    let pid = pid_text
        .trim()
        .parse::<u32>()
        .map_err(|_| format!("{} does not hold a process ID", config.pid_file().display()))?;
    let port_text = read(config.port_file())?;
    let port = port_text
        .trim()
        .parse::<u16>()
        .ok()
        .filter(|port| *port != 0 && *port != u16::MAX)
        .ok_or_else(|| format!("{} does not hold a port", config.port_file().display()))?;
    Ok((pid, port))
}

/// Whether process `pid` is an `swtpm` on `config`'s state directory listening on `port`,
/// judged by its command line (`/proc/<pid>/cmdline`). A zombie has an empty command line
/// and does not match, so a process that has exited counts as gone.
fn process_matches(pid: u32, config: &SwtpmConfig, port: u16) -> bool {
    let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&OsStr> = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(OsStr::from_bytes)
        .collect();
    let is_swtpm = args
        .first()
        .and_then(|program| Path::new(program).file_name())
        .is_some_and(|name| name == "swtpm");
    let state = config.state_arg();
    let server = SwtpmConfig::server_arg(port);
    is_swtpm && args.contains(&state.as_os_str()) && args.contains(&OsStr::new(&server))
}

fn remove_if_present(path: &Path) -> Result<(), SwtpmError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(io_error(format!("removing {}", path.display()))(error)),
    }
}

/// Waits for `child` to exit, at most `timeout`.
fn wait_with_timeout(child: &mut Child, timeout: Duration) -> io::Result<Option<ExitStatus>> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// Polls `done` until it holds or `timeout` passes; whether it held.
fn wait_until(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(10));
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
/// itself, so another process can still take one first; [`SwtpmProcess::start`] then
/// retries with another pair.
fn free_port_pair() -> Result<u16, SwtpmError> {
    for _ in 0..64 {
        let first =
            TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(io_error("finding a free port"))?;
        let port = first
            .local_addr()
            .map_err(io_error("finding a free port"))?
            .port();
        if port >= u16::MAX - 1 {
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

/// The last lines of a log file, for error messages.
fn tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let skip = lines.len().saturating_sub(20);
    lines.into_iter().skip(skip).collect::<Vec<_>>().join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_resolves_directories_and_checks_the_port() {
        let dir = tempfile::tempdir().unwrap();
        let config = SwtpmConfig::new(dir.path()).unwrap();
        assert!(config.state_dir().is_absolute());
        assert_eq!(config.run_dir(), config.state_dir());
        assert_eq!(config.port(), None);
        assert_eq!(config.pid_file(), config.state_dir().join("swtpm.pid"));
        assert!(matches!(
            config.clone().with_port(0),
            Err(SwtpmError::InvalidConfig { .. })
        ));
        assert!(matches!(
            config.clone().with_port(u16::MAX),
            Err(SwtpmError::InvalidConfig { .. })
        ));
        assert_eq!(config.with_port(2321).unwrap().port(), Some(2321));
    }

    #[test]
    fn config_refuses_missing_directories_and_commas() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            SwtpmConfig::new(dir.path().join("missing")),
            Err(SwtpmError::Io { .. })
        ));
        let file = dir.path().join("file");
        fs::write(&file, b"").unwrap();
        assert!(matches!(
            SwtpmConfig::new(&file),
            Err(SwtpmError::InvalidConfig { .. })
        ));
        let comma = dir.path().join("a,b");
        fs::create_dir(&comma).unwrap();
        assert!(matches!(
            SwtpmConfig::new(&comma),
            Err(SwtpmError::InvalidConfig { .. })
        ));
    }

    #[test]
    fn a_process_that_is_not_swtpm_does_not_match() {
        let dir = tempfile::tempdir().unwrap();
        let config = SwtpmConfig::new(dir.path()).unwrap();
        assert!(!process_matches(std::process::id(), &config, 2321));
        assert!(!process_matches(u32::MAX, &config, 2321));
    }

    #[test]
    fn attach_without_files_says_nothing_runs() {
        let dir = tempfile::tempdir().unwrap();
        let config = SwtpmConfig::new(dir.path()).unwrap();
        assert!(matches!(
            SwtpmProcess::attach(&config),
            Err(SwtpmError::NotRunning { .. })
        ));
    }

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

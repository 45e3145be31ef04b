//! The swtpm process: started supervised or detached, found again from its pid and port
//! files, stopped over its control channel (killed only if it does not exit).

use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use crate::check_swtpm_installed;
use crate::config::SwtpmConfig;
use crate::error::{SwtpmError, io_error};
use crate::files::{tail, write_atomically};

/// How long swtpm may take to bind its ports and answer on its control channel.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a graceful shutdown may take before the process is killed.
pub(crate) const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// Fresh port pairs tried when swtpm cannot bind a free port (another process took it).
pub(crate) const START_ATTEMPTS: u32 = 5;

/// swtpm control-channel commands (big-endian u32 on the control socket).
pub(crate) const CMD_GET_CAPABILITY: u32 = 0x01;
pub(crate) const CMD_SHUTDOWN: u32 = 0x03;

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
        command.stdin(Stdio::null()).stdout(log).stderr(log_err);
        // Inheriting only its standard streams (`asterism_children`): a swtpm that inherited
        // another swtpm's connection would stop that one for its whole life.
        let mut child = asterism_children::spawn(&mut command)
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
        let killed = asterism_children::status(
            Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        );
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

pub(crate) enum StartFailure {
    /// Worth another attempt (on another port, when the port was not chosen).
    Retry(String),
    /// Not worth another attempt.
    Fatal(SwtpmError),
}

/// The pid and port recorded in the run directory.
pub(crate) fn recorded(config: &SwtpmConfig) -> Result<(u32, u16), String> {
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
pub(crate) fn process_matches(pid: u32, config: &SwtpmConfig, port: u16) -> bool {
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

pub(crate) fn remove_if_present(path: &Path) -> Result<(), SwtpmError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(io_error(format!("removing {}", path.display()))(error)),
    }
}

/// Waits for `child` to exit, at most `timeout`.
pub(crate) fn wait_with_timeout(
    child: &mut Child,
    timeout: Duration,
) -> io::Result<Option<ExitStatus>> {
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
pub(crate) fn wait_until(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
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
pub(crate) fn control(port: u16, command: u32) -> io::Result<()> {
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
pub(crate) fn free_port_pair() -> Result<u16, SwtpmError> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}

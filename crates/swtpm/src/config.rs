//! Where swtpm keeps its state and files, and which port it listens on: a configuration
//! valid by construction.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::error::{SwtpmError, invalid, io_error};
use crate::{LOG_FILE, PID_FILE, PORT_FILE};

/// Resolves an existing directory to an absolute path that swtpm's `key=value` option
/// syntax can carry (no comma).
pub(crate) fn existing_dir(what: &str, dir: &Path) -> Result<PathBuf, SwtpmError> {
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
    pub(crate) state_dir: PathBuf,
    pub(crate) run_dir: PathBuf,
    pub(crate) log_file: Option<PathBuf>,
    pub(crate) port: Option<u16>,
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
    pub(crate) fn state_arg(&self) -> OsString {
        let mut arg = OsString::from("dir=");
        arg.push(&self.state_dir);
        arg
    }

    pub(crate) fn server_arg(port: u16) -> String {
        format!("type=tcp,port={port},bindaddr=127.0.0.1")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    pub(crate) fn config_resolves_directories_and_checks_the_port() {
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
    pub(crate) fn config_refuses_missing_directories_and_commas() {
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
}

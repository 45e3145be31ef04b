//! What can go wrong running swtpm, and the two ways errors are made here.

use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;

use crate::STATE_FILE;

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

pub(crate) fn io_error(what: impl Into<String>) -> impl FnOnce(io::Error) -> SwtpmError {
    let what = what.into();
    move |source| SwtpmError::Io { what, source }
}

pub(crate) fn invalid(reason: impl Into<String>) -> SwtpmError {
    SwtpmError::InvalidConfig {
        reason: reason.into(),
    }
}

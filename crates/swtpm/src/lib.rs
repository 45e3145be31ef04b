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
//!
//! One module per concern: `config` (the directories and the port), `manufacture`
//! (`swtpm_setup`), `process` (starting, finding, stopping), `files` (what the two share)
//! and `error`.
#![forbid(unsafe_code)]

mod config;
mod error;
mod files;
mod manufacture;
mod process;

pub use config::SwtpmConfig;
pub use error::SwtpmError;
use error::io_error;
pub use manufacture::{ManufactureOptions, PcrBank, manufacture};
pub use process::SwtpmProcess;

use std::io;
use std::path::Path;
use std::process::{Command, Stdio};

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

/// Checks that `swtpm` (and, with `with_setup`, `swtpm_setup` and `swtpm_localca`) can be
/// run, with an error that says what to install otherwise.
pub fn check_swtpm_installed(with_setup: bool) -> Result<(), SwtpmError> {
    let mut programs = vec!["swtpm"];
    if with_setup {
        programs.extend(["swtpm_setup", "swtpm_localca"]);
    }
    for program in programs {
        let probe = asterism_children::status(
            Command::new(program)
                .arg("--help")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        );
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

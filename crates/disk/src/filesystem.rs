//! The file system on the mapped state disk: made once, on the first boot, and mounted on
//! every boot, so that the node's files live on the encrypted disk and nowhere else.
//!
//! [`FileSystemCli`] builds the two command lines as values (`mke2fs`, `mount`);
//! [`StateFileSystem`] runs them through a [`CommandRunner`], each with a deadline, and turns
//! a failure into a [`FileSystemError`] that carries the program's sanitized standard error.
//! Neither command carries a secret: they work on the mapping, which the kernel decrypts.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tracing::info;
use zeroize::Zeroizing;

use crate::command::{
    CommandOutput, CommandRunner, Invocation, RunError, Step, SystemRunner, sanitize_stderr,
};
use crate::error::exit_text;

/// The file system made on the mapping: ext4, whose journal brings it back to a consistent
/// state after a power cut (the image has no fsck).
pub const FILE_SYSTEM_TYPE: &str = "ext4";
/// The file system's label.
pub const FILE_SYSTEM_LABEL: &str = "asterism-state";
/// The mount options: no set-user-ID programs and no device nodes from the disk.
pub const MOUNT_OPTIONS: &str = "nosuid,nodev";
/// The bound on each run of `mke2fs` and `mount` (a small disk; TCG and dm-integrity make
/// the writes slow, not long).
pub const DEFAULT_FILE_SYSTEM_TIMEOUT: Duration = Duration::from_secs(120);

/// The programs and the deadline of [`StateFileSystem`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSystemConfig {
    /// e2fsprogs' `mke2fs` (busybox's makes ext2 only, without a journal).
    pub mkfs: PathBuf,
    /// `mount(8)`.
    pub mount: PathBuf,
    /// The bound on each run.
    pub timeout: Duration,
}

impl Default for FileSystemConfig {
    fn default() -> Self {
        Self {
            mkfs: PathBuf::from("mke2fs"),
            mount: PathBuf::from("mount"),
            timeout: DEFAULT_FILE_SYSTEM_TIMEOUT,
        }
    }
}

/// Builds the command lines. Pure: nothing here touches the system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSystemCli {
    mkfs: PathBuf,
    mount: PathBuf,
}

impl FileSystemCli {
    /// Command lines for the given programs.
    #[must_use]
    pub fn new(mkfs: impl Into<PathBuf>, mount: impl Into<PathBuf>) -> Self {
        Self {
            mkfs: mkfs.into(),
            mount: mount.into(),
        }
    }

    /// `mke2fs -q -F -t ext4 -L asterism-state -E nodiscard DEVICE`: `-F` because no one
    /// could answer a question (there is no terminal), `nodiscard` because dm-integrity
    /// takes no discards and a new mapping holds nothing to discard.
    #[must_use]
    pub fn make(&self, device: &Path) -> Invocation {
        let mut inv = invocation(Step::MakeFileSystem, &self.mkfs);
        inv.push(["-q", "-F", "-t", FILE_SYSTEM_TYPE, "-L", FILE_SYSTEM_LABEL]);
        inv.push(["-E", "nodiscard"]);
        inv.push_path(device);
        inv
    }

    /// `mount -t ext4 -o nosuid,nodev DEVICE TARGET`.
    #[must_use]
    pub fn mount(&self, device: &Path, target: &Path) -> Invocation {
        let mut inv = invocation(Step::Mount, &self.mount);
        inv.push(["-t", FILE_SYSTEM_TYPE, "-o", MOUNT_OPTIONS]);
        inv.push_path(device);
        inv.push_path(target);
        inv
    }
}

fn invocation(step: Step, program: &Path) -> Invocation {
    Invocation {
        step,
        program: program.to_path_buf(),
        args: Vec::new(),
        stdin: Zeroizing::new(Vec::new()),
    }
}

/// Why the file system could not be made or mounted.
#[derive(Debug, thiserror::Error)]
pub enum FileSystemError {
    /// The program could not be run, or did not finish in time.
    #[error("{}: {step}", .device.display())]
    Run {
        /// The mapping.
        device: PathBuf,
        /// `mke2fs` or `mount`.
        step: Step,
        /// The cause (includes the timeout).
        #[source]
        source: RunError,
    },
    /// The program failed.
    #[error("{}: {step} failed ({}): {stderr}", .device.display(), exit_text(*.status))]
    Failed {
        /// The mapping.
        device: PathBuf,
        /// `mke2fs` or `mount`.
        step: Step,
        /// The exit status (`None`: ended by a signal).
        status: Option<i32>,
        /// Its standard error, sanitized and bounded.
        stderr: String,
    },
}

/// The state disk's file system, on the mapping [`crate::StateDisk::unlock`] made.
/// Blocking: each call runs a program.
#[derive(Debug, Clone)]
pub struct StateFileSystem<R: CommandRunner = SystemRunner> {
    cli: FileSystemCli,
    timeout: Duration,
    runner: R,
}

impl StateFileSystem<SystemRunner> {
    /// The programs of `config`, run for real.
    #[must_use]
    pub fn new(config: &FileSystemConfig) -> Self {
        // The runner's device-mapper probe is not used here.
        Self::with_runner(config, SystemRunner::new("/dev/mapper/control"))
    }
}

impl<R: CommandRunner> StateFileSystem<R> {
    /// Like [`StateFileSystem::new`], with another way of running the programs.
    #[must_use]
    pub fn with_runner(config: &FileSystemConfig, runner: R) -> Self {
        Self {
            cli: FileSystemCli::new(&config.mkfs, &config.mount),
            timeout: config.timeout,
            runner,
        }
    }

    /// Makes a new, empty file system on `device` (a mapping of a disk formatted in this
    /// boot): whatever it held is lost.
    pub fn make(&self, device: &Path) -> Result<(), FileSystemError> {
        self.run_ok(device, &self.cli.make(device))?;
        info!(device = %device.display(), fs = FILE_SYSTEM_TYPE, "made the state disk's file system");
        Ok(())
    }

    /// Mounts the file system on `device` at `target`.
    pub fn mount(&self, device: &Path, target: &Path) -> Result<(), FileSystemError> {
        self.run_ok(device, &self.cli.mount(device, target))?;
        info!(device = %device.display(), target = %target.display(), "mounted the state disk's file system");
        Ok(())
    }

    fn run_ok(&self, device: &Path, inv: &Invocation) -> Result<CommandOutput, FileSystemError> {
        let out = self
            .runner
            .run(inv, self.timeout)
            .map_err(|source| FileSystemError::Run {
                device: device.to_path_buf(),
                step: inv.step(),
                source,
            })?;
        if out.success() {
            Ok(out)
        } else {
            Err(FileSystemError::Failed {
                device: device.to_path_buf(),
                step: inv.step(),
                status: out.status,
                stderr: sanitize_stderr(&out.stderr),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;
    use std::sync::Mutex;

    /// Records each invocation and answers with a fixed status and standard error.
    struct Answer {
        status: Option<i32>,
        stderr: &'static [u8],
        seen: Mutex<Vec<(Step, Vec<OsString>)>>,
    }

    impl CommandRunner for Answer {
        fn run(&self, inv: &Invocation, _: Duration) -> Result<CommandOutput, RunError> {
            self.seen
                .lock()
                .unwrap()
                .push((inv.step(), inv.args().to_vec()));
            Ok(CommandOutput {
                status: self.status,
                stdout: Vec::new(),
                stderr: self.stderr.to_vec(),
            })
        }
        fn device_mapper_available(&self) -> bool {
            true
        }
    }

    fn words(args: &[OsString]) -> Vec<&str> {
        args.iter().map(|a| a.to_str().unwrap()).collect()
    }

    #[test]
    fn the_command_lines_make_ext4_and_mount_it_without_suid_and_devices() {
        let cli = FileSystemCli::new("/usr/sbin/mke2fs", "mount");
        let make = cli.make(Path::new("/dev/mapper/state"));
        assert_eq!(make.program(), Path::new("/usr/sbin/mke2fs"));
        assert_eq!(
            words(make.args()),
            [
                "-q",
                "-F",
                "-t",
                "ext4",
                "-L",
                "asterism-state",
                "-E",
                "nodiscard",
                "/dev/mapper/state"
            ]
        );
        assert!(make.expose_stdin().is_empty());
        let mount = cli.mount(Path::new("/dev/mapper/state"), Path::new("-odd"));
        assert_eq!(
            words(mount.args()),
            [
                "-t",
                "ext4",
                "-o",
                "nosuid,nodev",
                "/dev/mapper/state",
                "./-odd"
            ]
        );
    }

    #[test]
    fn a_failed_mount_is_an_error_with_the_programs_reason() {
        let runner = Answer {
            status: Some(32),
            stderr: b"mount: wrong fs type\n",
            seen: Mutex::new(Vec::new()),
        };
        let fs = StateFileSystem::with_runner(&FileSystemConfig::default(), runner);
        let err = fs
            .mount(Path::new("/dev/mapper/state"), Path::new("/run/node/state"))
            .unwrap_err();
        match &err {
            FileSystemError::Failed {
                step: Step::Mount,
                status: Some(32),
                stderr,
                ..
            } => assert_eq!(stderr, "mount: wrong fs type"),
            other => panic!("unexpected: {other:?}"),
        }
        assert_eq!(fs.runner.seen.lock().unwrap().len(), 1);
    }

    #[test]
    fn a_program_that_succeeds_makes_and_mounts() {
        let runner = Answer {
            status: Some(0),
            stderr: b"",
            seen: Mutex::new(Vec::new()),
        };
        let fs = StateFileSystem::with_runner(&FileSystemConfig::default(), runner);
        let dev = Path::new("/dev/mapper/state");
        fs.make(dev).unwrap();
        fs.mount(dev, Path::new("/run/node/state")).unwrap();
        let steps: Vec<Step> = fs.runner.seen.lock().unwrap().iter().map(|s| s.0).collect();
        assert_eq!(steps, [Step::MakeFileSystem, Step::Mount]);
    }

    #[test]
    fn a_missing_program_is_a_run_error() {
        let config = FileSystemConfig {
            mkfs: PathBuf::from("/nonexistent/mke2fs"),
            ..FileSystemConfig::default()
        };
        let err = StateFileSystem::new(&config)
            .make(Path::new("/dev/null"))
            .unwrap_err();
        assert!(
            matches!(
                err,
                FileSystemError::Run {
                    step: Step::MakeFileSystem,
                    source: RunError::Spawn(_),
                    ..
                }
            ),
            "{err:?}"
        );
    }
}

//! Child processes that inherit standard input, output and error, and no other descriptor.
//!
//! Rust opens every descriptor with close-on-exec; C libraries need not, and the TSS
//! (tpm2-tss) does not: its swtpm transport opens a socket for each TPM command, and its
//! device transport opens the TPM device. A child started while such a descriptor is open
//! inherits it and keeps it for as long as it lives. swtpm serves one connection at a time
//! and waits for its client to close it, so one long-lived child (another swtpm, a service)
//! started in the middle of a command stops that swtpm for every other client until the
//! child exits; a child started beside a TPM device would hold the device.
//!
//! So every child starts through this crate. Between fork and exec, in the child, one
//! system call marks every descriptor above standard error close-on-exec
//! (`close_range(3, ~0, CLOSE_RANGE_CLOEXEC)`, Linux 5.11), and the kernel closes them all as
//! the new program starts, whatever another thread of the parent holds open at that moment.
//! Marking rather than closing keeps the descriptor through which the standard library
//! reports a program that could not start (it is close-on-exec already). A kernel without
//! the call fails the start with its error: no child starts that could inherit.
//!
//! * [`spawn`], [`status`] and [`output`] are [`Command`]'s three ways to start a child.
//! * [`inherit_only_stdio`] sets a [`Command`] up without starting it, for a caller that
//!   starts it another way (`tokio::process::Command::from`).
//!
//! `clippy.toml` refuses `Command::spawn`, `status` and `output` (std's and tokio's)
//! everywhere else. This crate and `asterism-cryptsetup` are the only ones with `unsafe`
//! code (docs/dependencies.md); here it is the one hook above and its test helper.

// The reason this crate exists: the child's hook needs `CommandExt::pre_exec` and a system
// call, both `unsafe`; each block says why it is sound (`clippy::undocumented_unsafe_blocks`).
#![allow(unsafe_code)]

use std::ffi::c_uint;
use std::io;
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, ExitStatus, Output, Stdio};

/// The first descriptor a child does not inherit: standard error is 2.
const FIRST_NOT_INHERITED: c_uint = 3;

/// Sets `command` up so that its child inherits only standard input, output and error (and
/// what `command` maps onto them); returns it for chaining. Starting it any way starts the
/// child so; [`spawn`], [`status`] and [`output`] call this themselves.
pub fn inherit_only_stdio(command: &mut Command) -> &mut Command {
    // SAFETY: the hook runs in the child between fork and exec, where only async-signal-safe
    // work is sound. It makes one system call with constant arguments, allocates nothing
    // (an `io::Error` from an OS code holds the code only), takes no lock and touches no
    // state of the parent.
    unsafe { command.pre_exec(mark_close_on_exec_above_stderr) }
}

/// In the child: every descriptor from 3 up becomes close-on-exec.
fn mark_close_on_exec_above_stderr() -> io::Result<()> {
    // SAFETY: `close_range` takes three integers and touches no memory of ours. Marking
    // descriptors close-on-exec changes nothing in this process image, which exec replaces;
    // the standard library's own descriptor for reporting a failed exec is close-on-exec
    // already and keeps working.
    let marked = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            FIRST_NOT_INHERITED,
            c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if marked == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// [`Command::spawn`], the child inheriting only its standard streams
/// ([`inherit_only_stdio`]). The workspace's lints send every start of a child here.
#[allow(clippy::disallowed_methods)]
pub fn spawn(command: &mut Command) -> io::Result<Child> {
    inherit_only_stdio(command).spawn()
}

/// [`Command::status`], the child started by [`spawn`]: standard input, output and error
/// are inherited unless set.
pub fn status(command: &mut Command) -> io::Result<ExitStatus> {
    spawn(command)?.wait()
}

/// [`Command::output`], the child started by [`spawn`]. Unlike [`Command::output`], it sets
/// what it needs whatever was set before: standard input closed, output and error captured.
pub fn output(command: &mut Command) -> io::Result<Output> {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    spawn(command)?.wait_with_output()
}

/// For tests of code that starts children: a descriptor opened the way a C library opens
/// one, without close-on-exec, which a child started without [`inherit_only_stdio`]
/// inherits.
#[cfg(any(test, feature = "testing"))]
pub mod testing {
    use std::io;
    use std::os::fd::{FromRawFd as _, OwnedFd};

    /// A pipe whose two ends are not close-on-exec: (read end, write end).
    pub fn pipe_without_close_on_exec() -> io::Result<(OwnedFd, OwnedFd)> {
        let mut ends = [0; 2];
        // SAFETY: `pipe` writes two descriptors into the two-element array it is given.
        if unsafe { libc::pipe(ends.as_mut_ptr()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let [read, write] = ends;
        // SAFETY: both descriptors were just opened by `pipe` and are owned by nothing else.
        let ends = unsafe { (OwnedFd::from_raw_fd(read), OwnedFd::from_raw_fd(write)) };
        Ok(ends)
    }

    /// A shell command line whose exit status says whether descriptor `fd` is open in the
    /// shell: 0 when it is (`[` is the shell's own, so `/proc/self` is the shell).
    pub fn is_open(fd: i32) -> String {
        format!("[ -e /proc/self/fd/{fd} ]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;
    use std::os::fd::AsRawFd as _;

    #[test]
    fn a_child_inherits_no_descriptor_that_a_c_library_left_open() {
        let (read, _write) = testing::pipe_without_close_on_exec().unwrap();
        let check = testing::is_open(read.as_raw_fd());
        // The control: started as the standard library starts it, the child inherits it.
        #[allow(clippy::disallowed_methods)]
        let plain = Command::new("sh").args(["-c", &check]).status().unwrap();
        assert!(plain.success(), "the test's descriptor is not inheritable");
        let ours = status(Command::new("sh").args(["-c", &check])).unwrap();
        assert_eq!(ours.code(), Some(1), "the child inherited the descriptor");
    }

    #[test]
    fn standard_streams_still_reach_the_child() {
        let mut child = spawn(
            Command::new("sh")
                .args(["-c", "cat; echo err >&2"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped()),
        )
        .unwrap();
        child.stdin.take().unwrap().write_all(b"in\n").unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        assert_eq!(out.stdout, b"in\n");
        assert_eq!(out.stderr, b"err\n");
    }

    #[test]
    fn a_program_that_cannot_start_is_an_error() {
        // The standard library learns of a failed exec through a close-on-exec descriptor:
        // closed by the hook instead of marked, the failure would pass for a started child.
        let error = spawn(&mut Command::new("/nonexistent/program")).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn output_closes_standard_input_and_captures_the_rest() {
        let out = output(Command::new("sh").args(["-c", "cat; echo out; echo err >&2"])).unwrap();
        assert!(out.status.success());
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(out.stderr, b"err\n");
    }
}

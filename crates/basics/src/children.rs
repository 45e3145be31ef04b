//! Child processes and the descriptors that C libraries open without close-on-exec.
//!
//! Rust opens every descriptor with close-on-exec, but the TSS (tpm2-tss) does not: its
//! swtpm transport opens a socket for each TPM command and closes it after the answer, and
//! its device transport opens the TPM device. A child started while such a socket is open
//! inherits it, and the socket stays open for as long as the child lives. swtpm serves one
//! connection at a time and waits for the client to close it, so one child started at the
//! wrong moment (a long-lived one: another swtpm, a service) stops that swtpm for every
//! other client until the child exits.
//!
//! Safe Rust cannot close the inherited descriptor in the child, so the two are kept apart:
//! code that may hold such a descriptor open runs inside [`with_c_descriptors`] (shared, many
//! at once), and a child is started with [`spawn`] or under [`spawning`] (exclusive). A
//! spawn waits at most [`SPAWN_WAIT`] for the commands in flight, then starts the child
//! anyway: a hung TPM must not stop a process from starting children.
//!
//! This is the one piece of process-wide state in this crate.

use std::io;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};
use std::time::{Duration, Instant};

/// The longest a spawn waits for descriptors of C libraries to close.
pub const SPAWN_WAIT: Duration = Duration::from_secs(5);

static C_DESCRIPTORS: RwLock<()> = RwLock::new(());

/// Runs `f`, which may open descriptors without close-on-exec (a TSS call), while no child
/// is being started. Calls may nest (a starting child never queues ahead of them), but `f`
/// must not start a child itself: its [`spawn`] would wait [`SPAWN_WAIT`] for `f`.
pub fn with_c_descriptors<T>(f: impl FnOnce() -> T) -> T {
    let _open: RwLockReadGuard<'_, ()> =
        C_DESCRIPTORS.read().unwrap_or_else(PoisonError::into_inner);
    f()
}

/// Starting children: while the guard lives, no [`with_c_descriptors`] call runs. Waits at
/// most [`SPAWN_WAIT`] for the calls in flight; `None` when they did not finish in time
/// (start the child anyway).
#[must_use]
pub fn spawning() -> Option<RwLockWriteGuard<'static, ()>> {
    spawning_within(SPAWN_WAIT)
}

/// Polls instead of queueing, so that waiting children never block new calls (nor a
/// nested one, which would deadlock behind a queued writer).
fn spawning_within(wait: Duration) -> Option<RwLockWriteGuard<'static, ()>> {
    let deadline = Instant::now() + wait;
    loop {
        match C_DESCRIPTORS.try_write() {
            Ok(guard) => return Some(guard),
            Err(TryLockError::Poisoned(poisoned)) => return Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) if Instant::now() >= deadline => return None,
            Err(TryLockError::WouldBlock) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}

/// [`Command::spawn`] while no [`with_c_descriptors`] call runs (see [`spawning`]). The
/// workspace's lints send every start of a child here (clippy.toml).
#[allow(clippy::disallowed_methods)]
pub fn spawn(command: &mut Command) -> io::Result<Child> {
    let _alone = spawning();
    command.spawn()
}

/// [`Command::status`], the child started by [`spawn`]: standard input, output and error
/// are inherited unless set.
pub fn status(command: &mut Command) -> io::Result<ExitStatus> {
    spawn(command)?.wait()
}

/// [`Command::output`], the child started by [`spawn`] and waited for without the lock.
/// Unlike [`Command::output`], it sets what it needs whatever was set before: standard input
/// closed, output and error captured.
pub fn output(command: &mut Command) -> io::Result<Output> {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    spawn(command)?.wait_with_output()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Barrier};

    #[test]
    fn a_spawn_waits_for_the_calls_in_flight() {
        let inside = Arc::new(AtomicBool::new(false));
        let entered = Arc::new(Barrier::new(2));
        let call = {
            let (inside, entered) = (inside.clone(), entered.clone());
            std::thread::spawn(move || {
                with_c_descriptors(|| {
                    inside.store(true, Ordering::SeqCst);
                    entered.wait();
                    std::thread::sleep(Duration::from_millis(200));
                    inside.store(false, Ordering::SeqCst);
                })
            })
        };
        entered.wait();
        let guard = spawning();
        assert!(guard.is_some());
        assert!(
            !inside.load(Ordering::SeqCst),
            "a child would start while a call holds its descriptors"
        );
        drop(guard);
        call.join().unwrap();
    }

    #[test]
    fn a_spawn_gives_up_waiting_at_its_deadline() {
        with_c_descriptors(|| {
            assert!(spawning_within(Duration::from_millis(50)).is_none());
        });
    }

    #[test]
    fn calls_run_side_by_side_and_children_start_after_them() {
        let (tx, rx) = std::sync::mpsc::channel();
        with_c_descriptors(|| {
            // A second call on another thread runs while this one is in flight.
            let other = std::thread::spawn(move || with_c_descriptors(|| tx.send(()).unwrap()));
            rx.recv_timeout(Duration::from_secs(5)).unwrap();
            other.join().unwrap();
        });
        let out = output(Command::new("true").arg("x")).unwrap();
        assert!(out.status.success());
    }
}

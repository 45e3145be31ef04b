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
//! A waiting spawn holds back new calls (not nested ones), so that callers who start one
//! command as soon as the last has finished, or whose commands overlap, cannot keep it
//! waiting until its deadline and then have it start the child while a socket is open.
//!
//! This is the one piece of process-wide state in this crate.

use std::cell::Cell;
use std::io;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};
use std::time::{Duration, Instant};

/// The longest a spawn waits for descriptors of C libraries to close.
pub const SPAWN_WAIT: Duration = Duration::from_secs(5);

static C_DESCRIPTORS: RwLock<()> = RwLock::new(());

/// How many spawns are waiting for the calls in flight to finish.
static SPAWNS_WAITING: AtomicUsize = AtomicUsize::new(0);

/// How often a new call looks again whether a spawn still waits.
const YIELD_POLL: Duration = Duration::from_micros(200);

thread_local! {
    /// How many [`with_c_descriptors`] calls this thread is inside.
    static DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// Runs `f`, which may open descriptors without close-on-exec (a TSS call), while no child
/// is being started. A call that is not nested in another first lets a waiting spawn go
/// ahead (waiting [`SPAWN_WAIT`] at most, also while spawns follow one another; a spawn
/// that waits for a hung call holds new calls back for as long). Calls may nest (a nested
/// call never waits for a spawn, which could not go ahead anyway), but `f` must not start
/// a child itself: its [`spawn`] would wait [`SPAWN_WAIT`] for `f`. Nor should `f` wait for another thread's call, which would wait behind a
/// waiting spawn, which waits for `f`, until the spawn's deadline.
pub fn with_c_descriptors<T>(f: impl FnOnce() -> T) -> T {
    let outermost = DEPTH.with(Cell::get) == 0;
    if outermost {
        // Spawns that follow one another could keep the count above zero: a call waits
        // [`SPAWN_WAIT`] at most, as a spawn does.
        let deadline = Instant::now() + SPAWN_WAIT;
        while SPAWNS_WAITING.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(YIELD_POLL);
        }
    }
    let _open: RwLockReadGuard<'_, ()> =
        C_DESCRIPTORS.read().unwrap_or_else(PoisonError::into_inner);
    DEPTH.with(|depth| depth.set(depth.get() + 1));
    let _depth = Leave;
    f()
}

/// Counts a [`with_c_descriptors`] call out of its thread's depth, also when `f` panics.
struct Leave;

impl Drop for Leave {
    fn drop(&mut self) {
        DEPTH.with(|depth| depth.set(depth.get() - 1));
    }
}

/// Counts a spawn as waiting while it lives.
struct Waiting;

impl Waiting {
    fn start() -> Self {
        SPAWNS_WAITING.fetch_add(1, Ordering::SeqCst);
        Waiting
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        SPAWNS_WAITING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Starting children: while the guard lives, no [`with_c_descriptors`] call runs. Waits at
/// most [`SPAWN_WAIT`] for the calls in flight; `None` when they did not finish in time
/// (start the child anyway).
#[must_use]
pub fn spawning() -> Option<RwLockWriteGuard<'static, ()>> {
    spawning_within(SPAWN_WAIT)
}

/// Polls instead of queueing on the lock, so that a nested call never waits behind a queued
/// writer (which would deadlock); new calls wait for [`SPAWNS_WAITING`] instead.
fn spawning_within(wait: Duration) -> Option<RwLockWriteGuard<'static, ()>> {
    let deadline = Instant::now() + wait;
    let _waiting = Waiting::start();
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
    use std::sync::atomic::AtomicBool;
    use std::sync::{Arc, Barrier, Mutex, MutexGuard};

    /// The lock and the count of waiting spawns are one per process: these tests take turns.
    fn alone() -> MutexGuard<'static, ()> {
        static TURN: Mutex<()> = Mutex::new(());
        TURN.lock().unwrap_or_else(PoisonError::into_inner)
    }

    #[test]
    fn a_spawn_waits_for_the_calls_in_flight() {
        let _turn = alone();
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
        let _turn = alone();
        with_c_descriptors(|| {
            assert!(spawning_within(Duration::from_millis(50)).is_none());
        });
    }

    #[test]
    fn calls_run_side_by_side_and_children_start_after_them() {
        let _turn = alone();
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

    #[test]
    fn a_spawn_is_not_kept_waiting_by_calls_that_overlap_without_pause() {
        let _turn = alone();
        let stop = Arc::new(AtomicBool::new(false));
        let started = Arc::new(Barrier::new(3));
        let calls: Vec<_> = (0..2u64)
            .map(|n| {
                let (stop, started) = (stop.clone(), started.clone());
                std::thread::spawn(move || {
                    // Two threads whose calls overlap: at no moment is no call in flight.
                    std::thread::sleep(Duration::from_millis(n));
                    with_c_descriptors(|| {
                        started.wait();
                        std::thread::sleep(Duration::from_millis(2));
                    });
                    let mut made = 1u32;
                    while !stop.load(Ordering::SeqCst) {
                        with_c_descriptors(|| std::thread::sleep(Duration::from_millis(2)));
                        made += 1;
                    }
                    made
                })
            })
            .collect();
        // Both threads are inside a call, so the spawn starts while calls are in flight.
        started.wait();
        let guard = spawning_within(Duration::from_secs(5));
        let got = guard.is_some();
        drop(guard);
        stop.store(true, Ordering::SeqCst);
        let made: Vec<u32> = calls.into_iter().map(|c| c.join().unwrap()).collect();
        assert!(made.iter().all(|&m| m > 0), "the calls ran: {made:?}");
        assert!(got, "the calls kept the spawn waiting until its deadline");
    }

    #[test]
    fn a_nested_call_runs_while_a_spawn_waits_for_its_outer_call() {
        let _turn = alone();
        let (tx, rx) = std::sync::mpsc::channel();
        let nested_ran = with_c_descriptors(|| {
            let spawner = std::thread::spawn(move || {
                let got = spawning_within(Duration::from_secs(2)).is_some();
                tx.send(got).unwrap();
            });
            let since = Instant::now();
            while SPAWNS_WAITING.load(Ordering::SeqCst) == 0 {
                assert!(
                    since.elapsed() < Duration::from_secs(10),
                    "the spawn never waited"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            // Waiting here for the spawn would keep the outer call, and so the spawn,
            // waiting until its deadline.
            let ran = with_c_descriptors(|| true);
            drop(spawner);
            ran
        });
        assert!(nested_ran);
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(10)),
            Ok(true),
            "the nested call waited for the spawn, which waited for it"
        );
        assert_eq!(DEPTH.with(Cell::get), 0, "the calls were counted out");
    }

    #[test]
    fn a_call_that_panics_is_counted_out_of_its_thread() {
        let _turn = alone();
        let panicked = std::panic::catch_unwind(|| with_c_descriptors(|| panic!("in the call")));
        assert!(panicked.is_err());
        assert_eq!(
            DEPTH.with(Cell::get),
            0,
            "the thread's later calls would count as nested"
        );
        // The lock was released too: a spawn gets it.
        assert!(spawning_within(Duration::from_secs(2)).is_some());
    }
}

//! etcd's I/O priority on a control-plane node: after `kubeadm init`, after a control-plane
//! `kubeadm join` and after the kubelet starts on a bootstrapped node, the etcd process is
//! found by scanning `/proc/<pid>/exe` and given the realtime I/O class, level 0, so that
//! the disk-bound consensus is not starved by other I/O on the node.
//!
//! This step never fails its caller: a missing etcd (after the bounded wait), several etcd
//! processes or a refused priority are logged at warn and swallowed: the priority helps etcd
//! but the node works without it.
//!
//! The process table root and the priority call are behind seams ([`EtcdIoPriority::new`]
//! takes the root, [`IoPrioritySetter`] the call) so the search runs on a fake `/proc` in
//! the tests. The production setter is [`Ionice`], util-linux's `ionice`, which makes the
//! same `ioprio_set(IOPRIO_WHO_PROCESS, pid, IOPRIO_PRIO_VALUE(class, level))` call: the
//! workspace keeps `unsafe` (a raw `syscall`) in one crate, and rustix has no `ioprio_set`.

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::future::BoxFuture;
use tracing::{info, warn};

use super::runner::{CommandSpec, Commands, Kubeadm, KubeadmError};

/// The executable name looked for (the basename of `/proc/<pid>/exe`).
pub const ETCD_EXECUTABLE: &str = "etcd";
/// How often the process table is scanned again while no etcd runs yet.
pub const RETRY_INTERVAL: Duration = Duration::from_secs(1);
/// How long etcd is waited for before the step gives up.
pub const MAX_WAIT: Duration = Duration::from_secs(10);

/// An I/O scheduling class (`IOPRIO_CLASS_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoClass {
    /// `IOPRIO_CLASS_RT` (1): served first.
    Realtime,
    /// `IOPRIO_CLASS_BE` (2): the default class.
    BestEffort,
    /// `IOPRIO_CLASS_IDLE` (3): served when nothing else waits.
    Idle,
}

impl IoClass {
    /// The kernel's number of the class.
    #[must_use]
    pub fn number(self) -> u16 {
        match self {
            Self::Realtime => 1,
            Self::BestEffort => 2,
            Self::Idle => 3,
        }
    }
}

/// A class and a level within it (0, the highest, to 7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoPriority {
    /// The class.
    pub class: IoClass,
    /// The level within the class.
    pub level: u8,
}

impl IoPriority {
    /// The value `ioprio_set` takes: `IOPRIO_PRIO_VALUE(class, level)` = `class << 13 | level`.
    #[must_use]
    pub fn ioprio_value(self) -> u16 {
        (self.class.number() << 13) | u16::from(self.level)
    }
}

/// etcd's priority: realtime, level 0 (`ioprio` value `1 << 13`).
pub const ETCD_IO_PRIORITY: IoPriority = IoPriority {
    class: IoClass::Realtime,
    level: 0,
};

/// Sets the I/O priority of a process.
pub trait IoPrioritySetter: Send + Sync {
    /// Gives process `pid` the priority `priority`.
    fn set(&self, pid: u32, priority: IoPriority) -> BoxFuture<'_, Result<(), KubeadmError>>;
}

/// The setter that runs `ionice -c <class> -n <level> -p <pid>`.
#[derive(Debug, Clone)]
pub struct Ionice<C> {
    program: PathBuf,
    commands: C,
}

impl<C: Commands> Ionice<C> {
    /// `ionice` at `program`, run through `commands`.
    pub fn new(program: impl Into<PathBuf>, commands: C) -> Self {
        Self {
            program: program.into(),
            commands,
        }
    }
}

impl<C: Commands> IoPrioritySetter for Ionice<C> {
    fn set(&self, pid: u32, priority: IoPriority) -> BoxFuture<'_, Result<(), KubeadmError>> {
        Box::pin(async move {
            let cmd = CommandSpec {
                program: self.program.clone(),
                args: [
                    "-c".to_owned(),
                    priority.class.number().to_string(),
                    "-n".to_owned(),
                    priority.level.to_string(),
                    "-p".to_owned(),
                    pid.to_string(),
                ]
                .into_iter()
                .map(Into::into)
                .collect(),
                secret_stdout: false,
            };
            Kubeadm::new(self.program.clone(), &self.commands)
                .run(&cmd)
                .await
                .map(drop)
        })
    }
}

/// Why one attempt did not set etcd's priority.
#[derive(Debug, thiserror::Error)]
pub enum EtcdIoError {
    /// No process runs the etcd executable (yet).
    #[error("no etcd process")]
    NoProcess,
    /// More than one process runs it: which one is the cluster's is unknown.
    #[error("several etcd processes: {0:?}")]
    Several(Vec<u32>),
    /// The process table could not be listed.
    #[error("cannot list {path:?}")]
    ProcessTable {
        /// The process table root.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The priority call failed.
    #[error("cannot set the I/O priority of etcd (pid {pid})")]
    Set {
        /// etcd's process id.
        pid: u32,
        /// The cause.
        #[source]
        source: KubeadmError,
    },
}

/// The one process under `proc_root` whose `exe` link's basename is `name`. Entries that
/// are not process ids, and processes whose link cannot be read (gone, kernel threads,
/// not permitted), are skipped.
pub fn find_process(proc_root: &Path, name: &str) -> Result<u32, EtcdIoError> {
    let table = |source| EtcdIoError::ProcessTable {
        path: proc_root.to_path_buf(),
        source,
    };
    let mut found = Vec::new();
    for entry in fs::read_dir(proc_root).map_err(table)? {
        let entry = entry.map_err(table)?;
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(exe) = fs::read_link(entry.path().join("exe")) else {
            continue;
        };
        if exe.file_name().is_some_and(|n| n == name) {
            found.push(pid);
        }
    }
    found.sort_unstable();
    match found.as_slice() {
        [] => Err(EtcdIoError::NoProcess),
        [pid] => Ok(*pid),
        _ => Err(EtcdIoError::Several(found)),
    }
}

/// The etcd I/O priority step.
pub struct EtcdIoPriority {
    proc_root: PathBuf,
    setter: Box<dyn IoPrioritySetter>,
    interval: Duration,
    max_wait: Duration,
}

impl fmt::Debug for EtcdIoPriority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdIoPriority")
            .field("proc_root", &self.proc_root)
            .field("interval", &self.interval)
            .field("max_wait", &self.max_wait)
            .finish_non_exhaustive()
    }
}

impl EtcdIoPriority {
    /// The step on the real process table (`/proc`), waiting [`MAX_WAIT`] for etcd and
    /// looking every [`RETRY_INTERVAL`].
    pub fn standard(setter: impl IoPrioritySetter + 'static) -> Self {
        Self::new("/proc", setter, RETRY_INTERVAL, MAX_WAIT)
    }

    /// The step on the process table at `proc_root`, looking for etcd every `interval`
    /// for at most `max_wait`.
    pub fn new(
        proc_root: impl Into<PathBuf>,
        setter: impl IoPrioritySetter + 'static,
        interval: Duration,
        max_wait: Duration,
    ) -> Self {
        Self {
            proc_root: proc_root.into(),
            setter: Box::new(setter),
            interval,
            max_wait,
        }
    }

    /// Finds etcd, waiting while there is none, and sets [`ETCD_IO_PRIORITY`]. Returns the
    /// last attempt's outcome: etcd's pid, or why it was not prioritised.
    pub async fn try_prioritize(&self) -> Result<u32, EtcdIoError> {
        let deadline = tokio::time::Instant::now() + self.max_wait;
        loop {
            match find_process(&self.proc_root, ETCD_EXECUTABLE) {
                Ok(pid) => {
                    self.setter
                        .set(pid, ETCD_IO_PRIORITY)
                        .await
                        .map_err(|source| EtcdIoError::Set { pid, source })?;
                    return Ok(pid);
                }
                Err(EtcdIoError::NoProcess) => {
                    let now = tokio::time::Instant::now();
                    if now >= deadline {
                        return Err(EtcdIoError::NoProcess);
                    }
                    tokio::time::sleep(self.interval.min(deadline - now)).await;
                }
                Err(other) => return Err(other),
            }
        }
    }

    /// [`Self::try_prioritize`], logging the outcome; never fails.
    pub async fn prioritize(&self) {
        match self.try_prioritize().await {
            Ok(pid) => info!(
                pid,
                class = ?ETCD_IO_PRIORITY.class,
                level = ETCD_IO_PRIORITY.level,
                "prioritised etcd's I/O"
            ),
            Err(e) => warn!(
                error = ?e,
                waited = ?self.max_wait,
                "etcd's I/O priority is left as it was"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use std::sync::{Arc, Mutex};

    #[derive(Default, Clone)]
    struct Recording {
        calls: Arc<Mutex<Vec<(u32, IoPriority)>>>,
        refuse: bool,
    }

    impl IoPrioritySetter for Recording {
        fn set(&self, pid: u32, priority: IoPriority) -> BoxFuture<'_, Result<(), KubeadmError>> {
            self.calls.lock().unwrap().push((pid, priority));
            let refuse = self.refuse;
            Box::pin(async move {
                if refuse {
                    Err(KubeadmError::Failed {
                        command: "ionice".into(),
                        code: Some(1),
                        output_tail: "Operation not permitted".into(),
                    })
                } else {
                    Ok(())
                }
            })
        }
    }

    /// A process `pid` running `exe` in the fake table.
    fn process(root: &Path, pid: &str, exe: &str) {
        let dir = root.join(pid);
        fs::create_dir_all(&dir).unwrap();
        symlink(exe, dir.join("exe")).unwrap();
    }

    fn fake_proc() -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        process(root.path(), "1", "/usr/lib/systemd/systemd");
        process(root.path(), "812", "/usr/local/bin/etcdctl");
        process(root.path(), "813", "/usr/bin/etcd-wrapper");
        // A kernel thread: no exe link. A non-process entry.
        fs::create_dir_all(root.path().join("2")).unwrap();
        fs::create_dir_all(root.path().join("sys")).unwrap();
        fs::write(root.path().join("uptime"), "1.0 1.0").unwrap();
        // A process named etcd but not a pid directory.
        process(root.path(), "self", "/usr/local/bin/etcd");
        root
    }

    fn step(root: &Path, setter: &Recording, max_wait: Duration) -> EtcdIoPriority {
        EtcdIoPriority::new(root, setter.clone(), Duration::from_millis(10), max_wait)
    }

    #[test]
    fn etcds_priority_is_realtime_level_0() {
        assert_eq!(ETCD_IO_PRIORITY.ioprio_value(), 1 << 13);
        assert_eq!(
            IoPriority {
                class: IoClass::BestEffort,
                level: 4
            }
            .ioprio_value(),
            (2 << 13) | 4
        );
    }

    #[tokio::test]
    async fn finds_the_one_etcd_and_sets_realtime_level_0() {
        let root = fake_proc();
        process(root.path(), "4242", "/usr/local/bin/etcd");
        let setter = Recording::default();
        let pid = step(root.path(), &setter, Duration::from_secs(5))
            .try_prioritize()
            .await
            .unwrap();
        assert_eq!(pid, 4242);
        assert_eq!(*setter.calls.lock().unwrap(), [(4242, ETCD_IO_PRIORITY)]);
    }

    #[tokio::test]
    async fn waits_for_etcd_to_start() {
        let root = fake_proc();
        let setter = Recording::default();
        let late = root.path().to_path_buf();
        let starter = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            process(&late, "977", "/usr/local/bin/etcd");
        });
        let pid = step(root.path(), &setter, Duration::from_secs(5))
            .try_prioritize()
            .await
            .unwrap();
        starter.await.unwrap();
        assert_eq!(pid, 977);
        assert_eq!(setter.calls.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn gives_up_after_the_bounded_wait_without_calling_the_setter() {
        let root = fake_proc();
        let setter = Recording::default();
        let started = std::time::Instant::now();
        let err = step(root.path(), &setter, Duration::from_millis(80))
            .try_prioritize()
            .await
            .unwrap_err();
        let waited = started.elapsed();
        assert!(matches!(err, EtcdIoError::NoProcess), "{err:?}");
        assert!(waited >= Duration::from_millis(80), "{waited:?}");
        assert!(waited < Duration::from_secs(2), "{waited:?}");
        assert!(setter.calls.lock().unwrap().is_empty());
        // The logging form swallows it.
        step(root.path(), &setter, Duration::ZERO)
            .prioritize()
            .await;
    }

    #[tokio::test]
    async fn several_etcd_processes_are_not_guessed_between() {
        let root = fake_proc();
        process(root.path(), "20", "/usr/local/bin/etcd");
        process(root.path(), "31", "/opt/etcd/etcd");
        let setter = Recording::default();
        let started = std::time::Instant::now();
        let err = step(root.path(), &setter, Duration::from_secs(5))
            .try_prioritize()
            .await
            .unwrap_err();
        assert!(
            matches!(&err, EtcdIoError::Several(p) if p == &[20, 31]),
            "{err:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(2), "not retried");
        assert!(setter.calls.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_refused_priority_is_reported_with_the_pid_and_swallowed() {
        let root = fake_proc();
        process(root.path(), "4242", "/usr/local/bin/etcd");
        let setter = Recording {
            refuse: true,
            ..Recording::default()
        };
        let s = step(root.path(), &setter, Duration::from_secs(5));
        let err = s.try_prioritize().await.unwrap_err();
        assert!(matches!(err, EtcdIoError::Set { pid: 4242, .. }), "{err:?}");
        s.prioritize().await;
        assert_eq!(
            setter.calls.lock().unwrap().len(),
            2,
            "one call per attempt"
        );
    }

    #[tokio::test]
    async fn a_missing_process_table_is_an_error_not_a_wait() {
        let setter = Recording::default();
        let err = step(
            Path::new("/nonexistent-proc"),
            &setter,
            Duration::from_secs(5),
        )
        .try_prioritize()
        .await
        .unwrap_err();
        assert!(matches!(err, EtcdIoError::ProcessTable { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn ionice_sets_the_priority_of_a_real_process_where_the_kernel_allows_it() {
        use crate::runner::ProcessCommands;
        let Ok(mut child) = asterism_children::spawn(std::process::Command::new("sleep").arg("30"))
        else {
            eprintln!("skipped: no sleep program");
            return;
        };
        let pid = child.id();
        let ionice = Ionice::new("ionice", ProcessCommands::default());
        let set = ionice.set(pid, ETCD_IO_PRIORITY).await;
        let shown = asterism_children::output(
            std::process::Command::new("ionice").args(["-p", &pid.to_string()]),
        );
        child.kill().unwrap();
        child.wait().unwrap();
        match set {
            Ok(()) => {
                let shown = String::from_utf8(shown.unwrap().stdout).unwrap();
                assert_eq!(shown.trim(), "realtime: prio 0");
            }
            // No ionice here, or the realtime class needs a capability this test lacks.
            Err(KubeadmError::Spawn { .. }) => eprintln!("skipped: no ionice program"),
            Err(e @ KubeadmError::Failed { .. }) => eprintln!("skipped: {e}"),
            Err(e) => panic!("{e:?}"),
        }
    }

    #[test]
    fn the_real_process_table_lists_this_test() {
        // The scan works on the kernel's own table: this process's executable is found.
        let me = std::env::current_exe().unwrap();
        let name = me.file_name().unwrap().to_str().unwrap();
        match find_process(Path::new("/proc"), name) {
            Ok(pid) => assert_eq!(pid, std::process::id()),
            // Another test binary of the same name may run at the same time.
            Err(EtcdIoError::Several(pids)) => assert!(pids.contains(&std::process::id())),
            Err(e) => panic!("{e:?}"),
        }
    }
}

//! The `main` of a service: its async runtime, and its result turned into an exit code.
//!
//! Every service's `main` parses its flags and installs its log subscriber (the filter is
//! the service's own), then hands its `run` future to [`main`] (or [`Runtime::main`] for a
//! runtime of another shape). A failure is logged with its whole chain of causes, once,
//! and the process exits with 1. A command-line tool's async steps run on [`block_on`].

use std::future::Future;
use std::process::ExitCode;

/// Runs `run` to its end on a single-threaded runtime made for it: the async step of a
/// command-line tool (`asterism`, `asterism-mini`), whose error its caller reports.
pub fn block_on<T>(run: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    use anyhow::Context as _;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(run)
}

/// What a service's `run` returns when it succeeds, as an exit code: `()` is 0, a `u8` is
/// itself (a program whose outcomes have codes of their own, the bootstrapper's).
pub trait Exit {
    /// The process's exit code.
    fn exit_code(self) -> ExitCode;
}

impl Exit for () {
    fn exit_code(self) -> ExitCode {
        ExitCode::SUCCESS
    }
}

impl Exit for u8 {
    fn exit_code(self) -> ExitCode {
        ExitCode::from(self)
    }
}

/// The shape of a service's tokio runtime: multi-threaded, with I/O and timers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Runtime {
    /// Worker threads; `None` is one per CPU (tokio's default).
    pub worker_threads: Option<usize>,
    /// Most threads for blocking work (`spawn_blocking`); `None` is tokio's default, 512.
    pub max_blocking_threads: Option<usize>,
}

impl Runtime {
    /// A runtime with `n` worker threads, for a service whose load is small whatever the
    /// machine (the metadata server, the verify service).
    pub fn with_worker_threads(n: usize) -> Self {
        Self {
            worker_threads: Some(n),
            ..Self::default()
        }
    }

    /// The same runtime with at most `n` threads for blocking work: for a service whose
    /// blocking calls wait on one lock, where more threads only add stacks and, in glibc,
    /// malloc arenas.
    #[must_use]
    pub fn with_max_blocking_threads(self, n: usize) -> Self {
        Self {
            max_blocking_threads: Some(n),
            ..self
        }
    }

    /// Runs `run` on this runtime and returns the exit code: what `run` returned, or 1
    /// when the runtime cannot start or `run` fails (logged as `"<name> failed"` with the
    /// error's chain of causes).
    ///
    /// `run` is spawned as a task on the runtime's workers, not polled by the thread that
    /// waits for it. A server's accept loop is usually part of `run`; on the waiting thread,
    /// every connection handed to it would wake a third thread, through the kernel, and
    /// switch to it. A panic in `run` is carried on to this thread, as if `run` had been
    /// polled here.
    pub fn main<T: Exit + Send + 'static>(
        self,
        name: &str,
        run: impl Future<Output = anyhow::Result<T>> + Send + 'static,
    ) -> ExitCode {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        if let Some(n) = self.worker_threads {
            builder.worker_threads(n);
        }
        if let Some(n) = self.max_blocking_threads {
            builder.max_blocking_threads(n);
        }
        let runtime = match builder.enable_all().build() {
            Ok(runtime) => runtime,
            Err(e) => {
                tracing::error!(error = %e, "cannot start the async runtime");
                return ExitCode::FAILURE;
            }
        };
        let outcome = runtime.block_on(async {
            match tokio::spawn(run).await {
                Ok(outcome) => outcome,
                Err(e) => match e.try_into_panic() {
                    Ok(panic) => std::panic::resume_unwind(panic),
                    Err(e) => {
                        Err(anyhow::Error::new(e).context("the service's task was cancelled"))
                    }
                },
            }
        });
        match outcome {
            Ok(done) => done.exit_code(),
            Err(e) => {
                tracing::error!(error = format!("{e:#}"), "{name} failed");
                ExitCode::FAILURE
            }
        }
    }
}

/// Runs a service's `run` future on a multi-threaded runtime with one worker per CPU and
/// returns its exit code ([`Runtime::main`]).
pub fn main<T: Exit + Send + 'static>(
    name: &str,
    run: impl Future<Output = anyhow::Result<T>> + Send + 'static,
) -> ExitCode {
    Runtime::default().main(name, run)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn success_exits_with_zero_or_the_code_run_chose() {
        assert_eq!(main("t", async { Ok(()) }), ExitCode::SUCCESS);
        assert_eq!(
            Runtime::with_worker_threads(1).main("t", async { Ok(3u8) }),
            ExitCode::from(3)
        );
    }

    #[test]
    fn blocking_work_runs_on_at_most_the_threads_allowed() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let (r, m) = (Arc::clone(&running), Arc::clone(&most));
        let code = Runtime::with_worker_threads(1)
            .with_max_blocking_threads(2)
            .main("t", async move {
                let tasks: Vec<_> = (0..6)
                    .map(|_| {
                        let (r, m) = (Arc::clone(&r), Arc::clone(&m));
                        tokio::task::spawn_blocking(move || {
                            let now = r.fetch_add(1, Ordering::SeqCst) + 1;
                            m.fetch_max(now, Ordering::SeqCst);
                            std::thread::sleep(std::time::Duration::from_millis(40));
                            r.fetch_sub(1, Ordering::SeqCst);
                        })
                    })
                    .collect();
                for t in tasks {
                    t.await?;
                }
                Ok(())
            });
        assert_eq!(code, ExitCode::SUCCESS);
        assert_eq!(most.load(Ordering::SeqCst), 2, "six sleepers, two threads");
    }

    #[test]
    fn the_runtime_has_the_workers_asked_for() {
        let workers = || async {
            Ok(u8::try_from(
                tokio::runtime::Handle::current().metrics().num_workers(),
            )?)
        };
        assert_eq!(
            Runtime::with_worker_threads(1).main("t", workers()),
            ExitCode::from(1)
        );
        assert_eq!(
            Runtime::with_worker_threads(3).main("t", workers()),
            ExitCode::from(3)
        );
    }

    #[test]
    fn run_is_polled_by_a_worker_not_by_the_thread_that_waits() {
        let waiting = std::thread::current().id();
        let code = main("t", async move {
            anyhow::ensure!(
                std::thread::current().id() != waiting,
                "run was polled by the waiting thread"
            );
            Ok(())
        });
        assert_eq!(code, ExitCode::SUCCESS);
    }

    #[test]
    fn a_panic_in_run_reaches_the_caller() {
        let caught = std::panic::catch_unwind(|| {
            main("t", async {
                if true {
                    panic!("run panicked");
                }
                Ok(())
            })
        });
        let payload = caught.expect_err("the panic reaches main's caller");
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"run panicked"));
    }

    #[test]
    fn a_failure_exits_with_one() {
        let failed = main("t", async { Err::<(), _>(anyhow::anyhow!("boom")) });
        assert_eq!(failed, ExitCode::FAILURE);
    }
}

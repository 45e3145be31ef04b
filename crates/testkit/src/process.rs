//! Programs under test as real processes: a free port to give them, their standard error
//! read as it comes, a line waited for, an exit waited for with a deadline.

// Test helpers fail the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A TCP port on `ip` that was free a moment ago (the system's choice, then released).
pub fn free_port(ip: &str) -> u16 {
    std::net::TcpListener::bind(format!("{ip}:0"))
        .and_then(|l| l.local_addr())
        .unwrap_or_else(|e| panic!("no free port on {ip}: {e}"))
        .port()
}

/// Polls `done` every 50 ms until it holds; fails the test after `deadline`.
pub fn wait_for(what: &str, deadline: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < deadline,
            "{what}: not within {deadline:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A running program whose standard error a thread reads line by line into a buffer the
/// test can look at while it runs. Killed on drop if still running.
pub struct Process {
    child: Child,
    stderr: Arc<Mutex<String>>,
    reader: Option<JoinHandle<()>>,
}

impl Process {
    /// Starts `command` with its standard error piped (and its standard input closed).
    pub fn spawn(command: &mut Command) -> Self {
        command.stdin(Stdio::null()).stderr(Stdio::piped());
        let mut child = asterism_children::spawn(command)
            .unwrap_or_else(|e| panic!("starting {command:?}: {e}"));
        let pipe = child.stderr.take().expect("stderr is piped");
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut all = sink.lock().unwrap();
                all.push_str(&line);
                all.push('\n');
            }
        });
        Self {
            child,
            stderr,
            reader: Some(reader),
        }
    }

    /// The process's id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// What the process has written to standard error so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// The first value `find` returns for a line of standard error, waiting for the line;
    /// fails the test (showing the log) after `deadline`.
    pub fn wait_for_line<T>(
        &self,
        what: &str,
        deadline: Duration,
        mut find: impl FnMut(&str) -> Option<T>,
    ) -> T {
        let start = Instant::now();
        loop {
            if let Some(found) = self.stderr.lock().unwrap().lines().find_map(&mut find) {
                return found;
            }
            assert!(
                start.elapsed() < deadline,
                "{what}: not logged within {deadline:?}:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the process has exited.
    pub fn has_exited(&mut self) -> bool {
        self.child.try_wait().unwrap().is_some()
    }

    /// Sends SIGTERM (with the shell's built-in `kill`, so that no separate package is
    /// needed).
    pub fn terminate(&self) {
        let status = asterism_children::status(Command::new("sh").args([
            "-c",
            "kill -TERM \"$1\"",
            "sh",
            &self.id().to_string(),
        ]))
        .expect("running sh");
        assert!(status.success(), "kill -TERM {}", self.id());
    }

    /// Waits for the process to exit and returns its status and its whole standard error;
    /// kills it and fails the test after `within`.
    pub fn wait(&mut self, within: Duration) -> (ExitStatus, String) {
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if start.elapsed() > within {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "the process did not exit within {within:?}:\n{}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // The pipe closes with the process, and the reader takes the last lines; unless the
        // process left a child holding the pipe, which is not waited for beyond 2 s.
        if let Some(reader) = self.reader.take() {
            let start = Instant::now();
            while !reader.is_finished() && start.elapsed() < Duration::from_secs(2) {
                std::thread::sleep(Duration::from_millis(10));
            }
            if reader.is_finished() {
                let _ = reader.join();
            }
        }
        (status, self.stderr())
    }

    /// [`Process::terminate`], then [`Process::wait`].
    pub fn stop(&mut self, within: Duration) -> (ExitStatus, String) {
        self.terminate();
        self.wait(within)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs `command` to its exit (at most `within`) and returns its status and standard error.
pub fn run_to_exit(command: &mut Command, within: Duration) -> (ExitStatus, String) {
    Process::spawn(command).wait(within)
}

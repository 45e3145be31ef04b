//! Starting and watching the cluster's processes: programs run to completion or as
//! services with a pid file, their logs, readiness waits and small HTTP requests.

use crate::STEP_DEADLINE;
use anyhow::{Context, Result, bail};
use std::ffi::OsString;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Runs a program to completion, its output appended to `log`; fails with the log's tail.
pub(crate) fn run_logged(program: &Path, args: &[OsString], log: &Path) -> Result<()> {
    let out = log_file(log)?;
    let status = asterism_children::status(
        Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out),
    )
    .with_context(|| format!("running {}", program.display()))?;
    if !status.success() {
        bail!(
            "{} failed ({status}); its log ends:\n{}",
            program.display(),
            tail(log)
        );
    }
    Ok(())
}

pub(crate) fn log_file(path: &Path) -> Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))
}

pub(crate) fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines
        .get(lines.len().saturating_sub(15)..)
        .unwrap_or_default()
        .join("\n")
}

/// Starts a long-running service in its own process group (so that ^C on the terminal
/// does not reach it), output to `log`, pid recorded in `pid_file` for `mini down`.
pub(crate) fn spawn_service(
    program: &Path,
    args: &[OsString],
    log: &Path,
    pid_file: &Path,
) -> Result<Child> {
    let out = log_file(log)?;
    let mut command = Command::new(program);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .process_group(0);
    let child = asterism_children::spawn(&mut command)
        .with_context(|| format!("starting {}", program.display()))?;
    std::fs::write(pid_file, format!("{}\n", child.id()))
        .with_context(|| format!("writing {}", pid_file.display()))?;
    Ok(child)
}

pub(crate) fn wait_until(what: &str, log: &Path, mut ready: impl FnMut() -> bool) -> Result<()> {
    let start = Instant::now();
    while !ready() {
        if start.elapsed() > STEP_DEADLINE {
            bail!(
                "{what} did not come up within {STEP_DEADLINE:?}; its log ends:\n{}",
                tail(log)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

pub(crate) fn tcp_ready(addr: &str) -> bool {
    addr.parse::<SocketAddr>()
        .ok()
        .and_then(|a| TcpStream::connect_timeout(&a, Duration::from_millis(200)).ok())
        .is_some()
}

/// A minimal HTTP/1.0 GET for the local metrics endpoint (bounded to 1 MiB).
pub(crate) fn http_get(addr: &str, path: &str) -> Result<String> {
    let body = http_get_raw(addr, path)?;
    let text = String::from_utf8_lossy(&body).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("malformed HTTP answer")?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        bail!("GET {path}: {}", head.lines().next().unwrap_or_default());
    }
    Ok(body.to_string())
}

/// The body of `GET path` over the Unix socket at `socket` (the join service's admin
/// socket), bounded to 1 MiB.
pub(crate) fn unix_http_get(socket: &Path, path: &str) -> Result<String> {
    let mut s = std::os::unix::net::UnixStream::connect(socket)
        .with_context(|| format!("connecting to {}", socket.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n"
    )?;
    let answer = asterism_binkit::fs::read_capped_from(&mut s, 1 << 20)?
        .context("the HTTP answer is larger than 1 MiB")?;
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("malformed HTTP answer")?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!("GET {path}: {}", head.lines().next().unwrap_or_default());
    }
    Ok(body.to_string())
}

/// The whole answer (status line, headers, body) to an HTTP/1.0 GET, bounded to 1 MiB.
pub(crate) fn http_get_raw(addr: &str, path: &str) -> Result<Vec<u8>> {
    let addr: SocketAddr = addr.parse().context("address")?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    asterism_binkit::fs::read_capped_from(&mut s, 1 << 20)?
        .context("the HTTP answer is larger than 1 MiB")
}

pub(crate) fn os(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Vec<OsString> {
    args.iter().map(|a| a.as_ref().to_os_string()).collect()
}

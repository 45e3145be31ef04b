//! The cluster's pid files: finding them, stopping what they name, and `down`.

use crate::{DirArgs, abs};
use anyhow::{Context, Result, bail};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Every pid file of the cluster: services under `run/`, swtpm and bootstrappers under
/// `nodes/*/run/`.
pub(crate) fn pid_files(dir: &Path) -> Result<Vec<(String, u32)>> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.join("run")];
    if let Ok(nodes) = std::fs::read_dir(dir.join("nodes")) {
        for n in nodes.flatten() {
            dirs.push(n.path().join("run"));
        }
    }
    for d in dirs {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            if path.extension().and_then(|x| x.to_str()) != Some("pid") {
                continue;
            }
            if let Some(pid) = std::fs::read_to_string(&path)
                .ok()
                .and_then(|t| t.trim().parse::<u32>().ok())
            {
                found.push((
                    path.strip_prefix(dir)
                        .unwrap_or(&path)
                        .display()
                        .to_string(),
                    pid,
                ));
            }
        }
    }
    found.sort();
    Ok(found)
}

/// Kills (SIGKILL) the process a pid file names, waits for it to be gone and removes the
/// file; nothing to do without the file.
pub(crate) fn kill_pid_file(path: &Path) -> Result<()> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(());
    };
    let pid: u32 = text
        .trim()
        .parse()
        .with_context(|| format!("{} holds no pid", path.display()))?;
    signal(pid, "KILL");
    let start = Instant::now();
    while alive(pid) {
        if start.elapsed() > Duration::from_secs(5) {
            bail!("pid {pid} ({}) survived SIGKILL", path.display());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = std::fs::remove_file(path);
    Ok(())
}

pub(crate) fn alive(pid: u32) -> bool {
    // A zombie has exited: only a process that is not in state Z counts.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit_once(") ")
                .is_some_and(|(_, rest)| !rest.starts_with('Z'))
        })
        .unwrap_or(false)
}

pub(crate) fn signal(pid: u32, sig: &str) {
    let _ = asterism_children::status(Command::new("sh").args([
        "-c",
        &format!("kill -{sig} \"$1\" 2>/dev/null"),
        "sh",
        &pid.to_string(),
    ]));
}

/// `asterism mini down`: stops every process the cluster started; nothing keeps running.
pub fn down(args: DirArgs) -> Result<()> {
    let dir = abs(&args.dir)?;
    if !dir.exists() {
        bail!("no local cluster at {}", dir.display());
    }
    let procs = pid_files(&dir)?;
    for (_, pid) in &procs {
        if alive(*pid) {
            signal(*pid, "TERM");
        }
    }
    let start = Instant::now();
    while procs.iter().any(|(_, p)| alive(*p)) && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
    }
    for (what, pid) in &procs {
        if alive(*pid) {
            eprintln!("{what} (pid {pid}) ignored SIGTERM; killing it");
            signal(*pid, "KILL");
        }
    }
    let start = Instant::now();
    while procs.iter().any(|(_, p)| alive(*p)) && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left: Vec<_> = procs.iter().filter(|(_, p)| alive(*p)).collect();
    if !left.is_empty() {
        bail!("still running: {left:?}");
    }
    for (what, _) in &procs {
        let _ = std::fs::remove_file(dir.join(what));
    }
    eprintln!(
        "stopped {} processes; the cluster's files stay in {} (remove the directory to start afresh)",
        procs.len(),
        dir.display()
    );
    Ok(())
}

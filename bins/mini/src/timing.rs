//! Where a node's bootstrapper spent its time, from its own log lines (`asterism-mini
//! timing`), in either mode: a process node's `log/bootstrapper.log` or a VM node's serial
//! console. With the VM's boot split (`boot-timing.json`: firmware, kernel, init), it is the
//! VM benchmark's figure (`scripts/bench-vm-boot`, docs/mini.md "How long it takes").
//!
//! The bootstrapper's time splits into:
//! * **disk**: formatting the state disk (with dm-integrity in a VM, which writes the whole
//!   device), mapping it and making and mounting its file system (VM only), and re-keying it
//!   after the node lock (with PCR 15's marking): cryptsetup's, mke2fs's and the kernel's
//!   work;
//! * **wait**: what another party takes: a worker's join (its request to the ticket, the
//!   join service's verification and key derivation included), or, on the first node, the
//!   time between its InitServer listening and the owner's init request taking the lock;
//! * **own**: the rest, the bootstrapper's own work (TPM, attestation key, SSH key,
//!   metadata, files, node state).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};

/// The bootstrapper's time, split (seconds).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Phases {
    /// From its first log line to its last.
    pub total: f64,
    /// Formatting the state disk.
    pub format: f64,
    /// Mapping it and making and mounting its file system (VM only; 0 in process mode).
    pub map: f64,
    /// The node lock, PCR 15 and re-keying the disk.
    pub rekey: f64,
    /// The join service (a worker) or the owner (the first node).
    pub wait: f64,
}

impl Phases {
    /// The disk's part: format, map and re-key.
    #[must_use]
    pub fn disk(&self) -> f64 {
        self.format + self.map + self.rekey
    }

    /// The bootstrapper's own part: the rest.
    #[must_use]
    pub fn own(&self) -> f64 {
        (self.total - self.disk() - self.wait).max(0.0)
    }
}

/// The markers, by the messages the bootstrapper logs.
const START: &str = "bootstrapper starting";
const FORMAT: &str = "formatting the state disk (first boot)";
const FORMATTED: &str = "formatted the state disk with a first-boot passphrase";
const MOUNTED: &str = "made the state disk's file system and mounted it";
const LISTENING: &str = "InitServer listening";
const ASKING: &str = "asking the join service for a join ticket";
const TICKET: &str = "received a join ticket";
const LOCKED: &str = "took the node lock";
const REKEYED: &str = "re-keyed the state disk with the cluster-derived key";
const EXITING: &str = "exiting";

/// Splits the bootstrapper's log (`log`: a log file, or a console with other lines mixed
/// in; colours are ignored). `None` when the log is not a first boot's that got as far as
/// its re-key.
#[must_use]
pub fn phases(log: &str) -> Option<Phases> {
    let lines: Vec<(f64, String)> = log
        .lines()
        .map(strip_ansi)
        .filter_map(|l| Some((seconds_of_day(&l)?, l)))
        .collect();
    let first = |marker: &str| {
        lines
            .iter()
            .find(|(_, l)| l.contains(marker))
            .map(|(t, _)| *t)
    };
    let start = first(START)?;
    let end = lines
        .iter()
        .rev()
        .find(|(_, l)| l.contains(EXITING))
        .map(|(t, _)| *t)?;
    let since = |from: f64, to: f64| {
        let d = to - from;
        // A run across midnight.
        if d < 0.0 { d + 86_400.0 } else { d }
    };
    let formatted = first(FORMATTED)?;
    let format = since(first(FORMAT)?, formatted);
    let map = first(MOUNTED).map_or(0.0, |t| since(formatted, t));
    let locked = first(LOCKED)?;
    let rekey = since(locked, first(REKEYED)?);
    let wait = match (first(ASKING), first(TICKET)) {
        (Some(asking), Some(ticket)) => since(asking, ticket),
        _ => since(first(LISTENING)?, locked),
    };
    Some(Phases {
        total: since(start, end),
        format,
        map,
        rekey,
        wait,
    })
}

/// A log line without its ANSI colour sequences.
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters final-byte.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The time of day of a line that starts with an RFC 3339 UTC timestamp
/// (`2026-11-26T02:55:31.703095Z …`), in seconds.
fn seconds_of_day(line: &str) -> Option<f64> {
    let stamp = line.split_whitespace().next()?;
    let time = stamp.split_once('T')?.1.strip_suffix('Z')?;
    let mut parts = time.split(':');
    let h: f64 = parts.next()?.parse().ok()?;
    let m: f64 = parts.next()?.parse().ok()?;
    let s: f64 = parts.next()?.parse().ok()?;
    Some(h * 3600.0 + m * 60.0 + s)
}

/// One node's figures: its bootstrapper's phases and, for a VM, its boot's split.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NodeTiming {
    /// The node's name.
    pub name: String,
    /// Whether it ran as a VM.
    pub vm: bool,
    /// How it ran: `process`, or the VM's boot mode (`uefi`, `secure-boot`,
    /// `direct-kernel`; `VM` for a boot that did not record it).
    pub mode: String,
    /// The VM's boot (`boot-timing.json`).
    pub boot: Option<serde_json::Value>,
    /// The bootstrapper's phases.
    pub phases: Phases,
}

/// The figures of every node of the cluster in `dir` that has them.
pub fn cluster(dir: &Path) -> Result<Vec<NodeTiming>> {
    let mut out = Vec::new();
    let nodes = dir.join("nodes");
    let mut names: Vec<String> = std::fs::read_dir(&nodes)
        .with_context(|| format!("reading {}", nodes.display()))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    names.sort();
    for name in names {
        let ndir = nodes.join(&name);
        let console = ndir.join("console.log");
        let vm = console.is_file();
        let log = if vm {
            console
        } else {
            ndir.join("log/bootstrapper.log")
        };
        let Ok(bytes) = std::fs::read(&log) else {
            continue;
        };
        let Some(phases) = phases(&String::from_utf8_lossy(&bytes)) else {
            continue;
        };
        let boot = std::fs::read(ndir.join("boot-timing.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        let mode = if vm {
            boot.as_ref()
                .and_then(|b: &serde_json::Value| b.get("boot_mode"))
                .and_then(serde_json::Value::as_str)
                .unwrap_or("VM")
                .to_owned()
        } else {
            "process".to_owned()
        };
        out.push(NodeTiming {
            name,
            vm,
            mode,
            boot,
            phases,
        });
    }
    Ok(out)
}

/// Arguments of `asterism-mini timing`.
#[derive(clap::Args, Debug)]
pub struct TimingArgs {
    /// A cluster directory to read (repeatable): each node's figures are printed, and the
    /// medians of the VM nodes and of the process nodes by role, and their ratio.
    #[arg(long = "dir", value_name = "DIR", required = true)]
    pub dirs: Vec<std::path::PathBuf>,
    /// Print the figures as JSON instead.
    #[arg(long)]
    pub json: bool,
}

/// `asterism-mini timing`.
pub fn report(args: &TimingArgs) -> Result<()> {
    let mut all = Vec::new();
    for dir in &args.dirs {
        for node in cluster(dir)? {
            all.push((dir.display().to_string(), node));
        }
    }
    let text = if args.json {
        let list: Vec<_> = all
            .iter()
            .map(|(dir, n)| serde_json::json!({ "dir": dir, "node": n }))
            .collect();
        serde_json::to_string_pretty(&list)? + "\n"
    } else {
        render(&all)
    };
    std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes())?;
    Ok(())
}

/// The table of every node's figures (`(cluster directory, node)`), the medians by mode
/// and role, and the ratios of VM to process mode.
fn render(all: &[(String, NodeTiming)]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<28} {:<16} {:<14} {:>7} {:>8} {:>7} {:>7} {:>9} | {:>7} {:>6} {:>6} {:>6} {:>6} {:>6}",
        "cluster",
        "node",
        "mode",
        "wall",
        "firmware",
        "kernel",
        "init",
        "bootstr.",
        "format",
        "map",
        "re-key",
        "wait",
        "own",
        "disk"
    );
    let boot = |n: &NodeTiming, key: &str| {
        n.boot
            .as_ref()
            .and_then(|b| b.get(key))
            .and_then(serde_json::Value::as_f64)
    };
    let cell = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.2}"));
    for (dir, n) in all {
        let p = &n.phases;
        let short = dir.rsplit('/').next().unwrap_or(dir);
        let _ = writeln!(
            out,
            "{short:<28} {:<16} {:<14} {:>7} {:>8} {:>7} {:>7} {:>9.2} | {:>7.2} {:>6.2} {:>6.2} {:>6.2} {:>6.2} {:>6.2}",
            n.name,
            n.mode,
            cell(boot(n, "wall_seconds")),
            cell(boot(n, "firmware_seconds")),
            cell(boot(n, "kernel_seconds")),
            cell(boot(n, "init_seconds")),
            p.total,
            p.format,
            p.map,
            p.rekey,
            p.wait,
            p.own(),
            p.disk()
        );
    }
    // Medians by mode and role (the first node waits for the owner, workers for a join).
    let _ = writeln!(
        out,
        "
medians (seconds): a VM's boot (QEMU's start to the bootstrapper's exit: for a worker,
boot to joined) and its firmware, kernel and init; the bootstrapper total, and its disk,
wait and own parts"
    );
    // The modes in the order they are compared: the VM boot modes, then process mode.
    let mut modes: Vec<&str> = Vec::new();
    for (_, n) in all {
        if !modes.contains(&n.mode.as_str()) {
            modes.push(&n.mode);
        }
    }
    modes.sort_by_key(|m| *m == "process");
    let mut rows = Vec::new();
    for role in ["control-plane", "worker"] {
        for mode in &modes {
            let of: Vec<&NodeTiming> = all
                .iter()
                .filter(|(_, n)| n.mode == *mode && n.name.starts_with(role))
                .map(|(_, n)| n)
                .collect();
            if of.is_empty() {
                continue;
            }
            let m = |f: fn(&Phases) -> f64| median(of.iter().map(|n| f(&n.phases)).collect());
            let b = |key: &str| {
                let v: Vec<f64> = of.iter().filter_map(|n| boot(n, key)).collect();
                if v.is_empty() {
                    "     -".to_owned()
                } else {
                    format!("{:>6.2}", median(v))
                }
            };
            let row = (
                role,
                *mode,
                m(|p| p.total),
                m(Phases::disk),
                m(|p| p.wait),
                m(Phases::own),
            );
            let _ = writeln!(
                out,
                "  {role:<14} {mode:<14} n={:<2} boot {} (firmware {}, kernel {}, init {})  bootstrapper {:>6.2}  disk {:>6.2}  wait {:>6.2}  own {:>6.2}",
                of.len(),
                b("wall_seconds"),
                b("firmware_seconds"),
                b("kernel_seconds"),
                b("init_seconds"),
                row.2,
                row.3,
                row.4,
                row.5
            );
            rows.push(row);
        }
    }
    for role in ["control-plane", "worker"] {
        let Some(p) = rows.iter().find(|r| r.0 == role && r.1 == "process") else {
            continue;
        };
        for v in rows.iter().filter(|r| r.0 == role && r.1 != "process") {
            let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
            let _ = writeln!(
                out,
                "  {role:<14} {} / process: total {:.1}x, disk {:.1}x, own {:.1}x, total without the wait {:.1}x",
                v.1,
                ratio(v.2, p.2),
                ratio(v.3, p.3),
                ratio(v.5, p.5),
                ratio(v.2 - v.4, p.2 - p.4)
            );
        }
    }
    out
}

/// The median of `values` (0 when empty).
#[must_use]
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values.get(n / 2).copied().unwrap_or(0.0),
        n => {
            let a = values.get(n / 2 - 1).copied().unwrap_or(0.0);
            let b = values.get(n / 2).copied().unwrap_or(0.0);
            (a + b) / 2.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WORKER_VM: &str = "\
asterism-init: bootstrapper start uptime=7.61
\u{1b}[2m2026-11-26T02:55:31.703095Z\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m asterism_bootstrapper: bootstrapper starting node_dir=/run/node
2026-11-26T02:55:31.964365Z  INFO asterism_bootstrapper::boot: formatting the state disk (first boot) step=\"format\"
2026-11-26T02:55:38.457761Z  INFO asterism_bootstrapper::boot: formatted the state disk with a first-boot passphrase step=\"format\"
2026-11-26T02:55:41.219167Z  INFO asterism_bootstrapper::boot: made the state disk's file system and mounted it on state/ step=\"format\"
2026-11-26T02:55:41.549308Z  INFO asterism_bootstrapper::run: InitServer listening (aTLS, the node attests) step=\"serve\"
2026-11-26T02:55:41.682361Z  INFO asterism_bootstrapper::join: asking the join service for a join ticket step=\"join\" attempt=1
2026-11-26T02:55:42.586221Z  INFO asterism_bootstrapper::join: received a join ticket step=\"join\"
2026-11-26T02:55:42.591075Z  INFO asterism_bootstrapper::lock: took the node lock; marking PCR 15 (point of no return) by=Join
2026-11-26T02:55:44.751104Z  INFO asterism_bootstrapper::activation: re-keyed the state disk with the cluster-derived key step=\"disk\"
2026-11-26T02:55:44.857890Z  INFO asterism_bootstrapper: exiting peak_rss=17828 kB
asterism-init: bootstrapper exited with status 0 uptime=21.19
2026-11-26T02:55:45.161395Z  INFO asterism_verify_service: verify service listening
";

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6
    }

    #[test]
    fn a_workers_vm_console_splits_into_disk_wait_and_own_time() {
        let p = phases(WORKER_VM).unwrap();
        assert!(close(p.total, 13.154795), "{p:?}");
        assert!(close(p.format, 6.493396), "{p:?}");
        assert!(close(p.map, 2.761406), "{p:?}");
        assert!(close(p.rekey, 2.160029), "{p:?}");
        assert!(close(p.wait, 0.90386), "{p:?}");
        assert!(close(
            p.own(),
            13.154795 - 6.493396 - 2.761406 - 2.160029 - 0.90386
        ));
    }

    #[test]
    fn the_first_node_waits_from_listening_to_the_lock_and_a_run_may_cross_midnight() {
        let log = "\
2026-11-26T23:59:59.000000Z  INFO a: bootstrapper starting
2026-11-26T23:59:59.100000Z  INFO a: formatting the state disk (first boot)
2026-11-26T23:59:59.300000Z  INFO a: formatted the state disk with a first-boot passphrase
2026-11-26T23:59:59.500000Z  INFO a: InitServer listening (aTLS, the node attests)
2026-11-27T00:00:02.500000Z  INFO a: took the node lock; marking PCR 15
2026-11-27T00:00:02.600000Z  INFO a: re-keyed the state disk with the cluster-derived key
2026-11-27T00:00:03.000000Z  INFO a: exiting peak_rss=1 kB
";
        let p = phases(log).unwrap();
        assert!(close(p.total, 4.0), "{p:?}");
        assert!(close(p.map, 0.0), "no mapping in process mode: {p:?}");
        assert!(close(p.wait, 3.0), "{p:?}");
        assert!(close(p.own(), 4.0 - 0.2 - 0.1 - 3.0), "{p:?}");
    }

    #[test]
    fn a_log_without_a_first_boot_or_an_exit_has_no_phases() {
        assert_eq!(phases(""), None);
        let unfinished = WORKER_VM
            .lines()
            .filter(|l| !l.contains("exiting"))
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(phases(&unfinished), None);
    }

    #[test]
    fn the_report_gives_medians_by_mode_and_role_and_their_ratio() {
        let node = |name: &str, mode: &str, total: f64| NodeTiming {
            name: name.into(),
            vm: mode != "process",
            mode: mode.into(),
            boot: (mode != "process").then(
                || serde_json::json!({"firmware_seconds": 14.0, "wall_seconds": total + 20.0}),
            ),
            phases: Phases {
                total,
                format: total / 4.0,
                map: 0.0,
                rekey: total / 4.0,
                wait: total / 4.0,
            },
        };
        let all = vec![
            ("t/vm-1".to_owned(), node("worker-0", "uefi", 12.0)),
            ("t/vm-2".to_owned(), node("worker-0", "uefi", 16.0)),
            (
                "t/direct-1".to_owned(),
                node("worker-0", "direct-kernel", 8.0),
            ),
            ("t/process-1".to_owned(), node("worker-0", "process", 0.4)),
        ];
        let text = render(&all);
        assert!(text.contains("vm-1"), "{text}");
        assert!(text.contains("   14.00"), "the firmware column: {text}");
        assert!(
            text.contains(
                "worker         uefi           n=2  boot  34.00 (firmware  14.00, kernel      -, init      -)  bootstrapper  14.00  disk   7.00  wait   3.50  own   3.50"
            ),
            "{text}"
        );
        assert!(
            text.contains("worker         direct-kernel  n=1  boot  28.00"),
            "{text}"
        );
        assert!(
            text.contains("worker         uefi / process: total 35.0x, disk 35.0x, own 35.0x"),
            "{text}"
        );
        assert!(
            text.contains("worker         direct-kernel / process: total 20.0x"),
            "{text}"
        );
    }

    #[test]
    fn medians() {
        assert!(close(median(vec![]), 0.0));
        assert!(close(median(vec![3.0, 1.0, 2.0]), 2.0));
        assert!(close(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5));
    }
}

//! End to end: no secret of a local cluster shows in anything its processes print.
//!
//! A local cluster of real processes (swtpm per node, the metadata service, bootstrappers,
//! `asterism init`, key, join and verify services) runs with every process at `trace` level
//! (`ASTERISM_LOG=trace`): init, a worker's join, `asterism verify`, the join service's
//! metrics and members, and a reboot of the worker with a rejoin. Then every log file, every
//! process's output and the metrics are searched for the master secret, the salt, the
//! measurement salt, the measurement secret and the other derived cluster key, every node's
//! disk key, the bootstrap tokens and the init secret: raw, hex (either case), base64 (standard
//! and URL-safe) and as a Rust `Debug` byte list, whole or in part (any 8 bytes in a row in
//! hex, any 12 bytes in base64, any 16 raw bytes, the first or last 6 as a byte list). Any hit
//! fails the test.
//!
//! The cluster runs in a child process (this test binary, started again with the
//! environment below), so that every process of the cluster, and `asterism init` in the
//! child itself, inherits `ASTERISM_LOG=trace`, and so that the child's own output can be
//! searched too.

#![cfg(test)] // all of it test code: clippy.toml's test allowances cover its helpers too

mod common;

use asterism_mini::LocalCluster;
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE_NO_PAD};
use common::{Teardown, bins, verify_node};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Set in the child: the directory of the cluster it runs.
const CHILD_DIR: &str = "ASTERISM_SECRET_SCAN_CLUSTER";
/// The name of the test, for the child's command line.
const TEST_NAME: &str = "no_secret_reaches_a_log_an_error_output_or_the_metrics";
/// Markers around what the child fetched over HTTP, in its standard output.
const METRICS_BEGIN: &str = "----- metrics -----";
const MEMBERS_BEGIN: &str = "----- members -----";

#[test]
fn no_secret_reaches_a_log_an_error_output_or_the_metrics() {
    if let Some(dir) = std::env::var_os(CHILD_DIR) {
        run_cluster(Path::new(&dir));
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("c");
    let child = asterism_children::output(
        Command::new(std::env::current_exe().unwrap())
            .args([TEST_NAME, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_DIR, &dir)
            .env("ASTERISM_LOG", "trace"),
    )
    .unwrap();
    let stdout = String::from_utf8_lossy(&child.stdout).into_owned();
    // Stop whatever the child left running (it stops the cluster itself when it passes).
    if dir.join("run").exists() {
        let _ = asterism_mini::down(asterism_mini::DirArgs { dir: dir.clone() });
    }
    assert!(
        child.status.success() && stdout.contains("1 passed"),
        "the cluster run failed ({}); its output ends:\n{}",
        child.status,
        tail(&child.stderr, 60)
    );

    let secrets = cluster_secrets(&dir);
    let mut haystacks = vec![
        (
            "the child's standard output".to_owned(),
            child.stdout.clone(),
        ),
        (
            "the child's standard error".to_owned(),
            child.stderr.clone(),
        ),
    ];
    for file in log_files(&dir) {
        let name = file.strip_prefix(&dir).unwrap().display().to_string();
        haystacks.push((name, std::fs::read(&file).unwrap()));
    }

    // The search is only worth something if the processes did log at trace level and the
    // child did fetch the metrics.
    // (The metadata service has no trace events of its own: a debug line shows the filter.)
    for (log, level) in [
        ("nodes/control-plane-0/log/join-service.log", "TRACE"),
        ("nodes/control-plane-0/log/key-service.log", "TRACE"),
        ("nodes/worker-0/log/bootstrapper.log", "TRACE"),
        ("nodes/worker-0/log/verify-service.log", "TRACE"),
        ("log/metadata.log", "DEBUG"),
    ] {
        let (_, text) = haystacks
            .iter()
            .find(|(name, _)| name == log)
            .unwrap_or_else(|| panic!("{log} is missing"));
        assert!(
            String::from_utf8_lossy(text).contains(level),
            "{log} has no {level} line: ASTERISM_LOG did not reach it"
        );
    }
    let metrics = stdout.split(METRICS_BEGIN).nth(1).unwrap_or_default();
    assert!(
        metrics.contains("# TYPE"),
        "the child printed no metrics:\n{stdout}"
    );
    assert!(
        stdout.contains(MEMBERS_BEGIN) && stdout.contains("worker-0"),
        "the child printed no members:\n{stdout}"
    );

    let hits = secrets.search(&haystacks);
    assert!(
        hits.is_empty(),
        "secrets in logs, outputs or metrics:\n{}",
        hits.join("\n")
    );
}

/// The child: runs the cluster, prints what the join service serves over HTTP, stops.
fn run_cluster(dir: &Path) {
    // `asterism init` and `asterism verify` run in this process: log them like the services.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("trace"))
        .with_writer(std::io::stderr)
        .try_init();
    // Loopback network 127.0.57.0/24: apart from the other end-to-end tests and bench-mini.
    let cluster = LocalCluster::create(dir, 1, 57, bins()).unwrap();
    let _teardown = Teardown(&cluster);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();

    let (done, cp) = rt.block_on(cluster.init()).unwrap();
    assert_eq!(cp.1, "ok");
    cluster.start_key_service().unwrap();
    cluster.start_join_service().unwrap();
    let worker = cluster.nodes[1].clone();
    let booting = cluster.start_bootstrapper(&worker).unwrap();
    let joined = rt
        .block_on(cluster.finish_bootstrapper(booting, &worker))
        .unwrap();
    let record = cluster.record(&done.cluster_id, &[cp, joined]).unwrap();
    assert!(
        record
            .nodes
            .iter()
            .all(|n| n.exit == "ok" && n.disk_rekeyed)
    );

    cluster.start_verify_services().unwrap();
    verify_node(&cluster, &rt, &worker);

    println!(
        "{METRICS_BEGIN}\n{}",
        http_get(&cluster.metrics_addr(), "/metrics")
    );
    println!("{MEMBERS_BEGIN}\n{}", cluster.members());

    // A reboot of the worker: its TPM resets, and its bootstrapper asks for a rejoin ticket.
    let mut worker = worker;
    let mut swtpm = common::node_swtpm(&worker);
    swtpm.restart().unwrap();
    worker.tcti = swtpm.tcti();
    let booting = cluster.start_bootstrapper(&worker).unwrap();
    let (_, exit) = rt
        .block_on(cluster.finish_bootstrapper(booting, &worker))
        .unwrap();
    assert_eq!(exit, "ok");
    let log = std::fs::read_to_string(worker.dir.join("log/bootstrapper.log")).unwrap();
    assert!(log.to_lowercase().contains("rejoin"));
    println!(
        "{METRICS_BEGIN}\n{}",
        http_get(&cluster.metrics_addr(), "/metrics")
    );
}

/// A bounded HTTP/1.0 GET of the join service's local HTTP endpoint.
fn http_get(addr: &str, path: &str) -> String {
    let addr: SocketAddr = addr.parse().unwrap();
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut body = Vec::new();
    s.take(4 << 20).read_to_end(&mut body).unwrap();
    String::from_utf8_lossy(&body).into_owned()
}

fn tail(bytes: &[u8], lines: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Every log the cluster wrote: files under a `log` directory or named `*.log`, and the
/// record `mini up` keeps.
fn log_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                todo.push(path);
            } else if kind.is_file()
                && (path.extension().is_some_and(|e| e == "log")
                    || path.parent().is_some_and(|p| p.ends_with("log"))
                    || path.file_name().is_some_and(|n| n == "mini.json"))
            {
                out.push(path);
            }
        }
    }
    out.sort();
    assert!(out.len() >= 8, "too few logs: {out:?}");
    out
}

/// The secrets of the cluster in `dir`, read from the owner's workspace and the init secret
/// file, derived from the master secret like the key service does, and found in the join
/// service's store (bootstrap tokens).
fn cluster_secrets(dir: &Path) -> Needles {
    let mut n = Needles::default();
    let workspace = dir.join("workspace");
    let master: serde_json::Value =
        serde_json::from_slice(&std::fs::read(workspace.join("master-secret.json")).unwrap())
            .unwrap();
    let b64 = |v: &serde_json::Value| STANDARD.decode(v.as_str().unwrap()).unwrap();
    let key = b64(&master["key"]);
    let salt = b64(&master["salt"]);
    n.bytes("the master secret", &key);
    n.bytes("the salt", &salt);
    let cluster: serde_json::Value =
        serde_json::from_slice(&std::fs::read(workspace.join("cluster.json")).unwrap()).unwrap();
    let measurement_salt = hex::decode(cluster["measurementSalt"].as_str().unwrap()).unwrap();
    n.bytes("the measurement salt", &measurement_salt);

    let init_secret = std::fs::read_to_string(dir.join("init-secret")).unwrap();
    n.text("the init secret", init_secret.trim());
    if let Ok(raw) = hex::decode(init_secret.trim()) {
        n.bytes("the init secret's bytes", &raw);
    }

    let kms = asterism_kms::ClusterKms::new(
        asterism_kms::MasterSecret::new(key).unwrap(),
        asterism_kms::Salt::new(salt).unwrap(),
    );
    for (what, id) in [
        (
            "the measurement secret",
            asterism_kms::KeyId::MeasurementSecret,
        ),
        (
            "the emergency SSH CA seed",
            asterism_kms::KeyId::EmergencySshCa,
        ),
    ] {
        n.bytes(what, kms.data_key(&id, 32).unwrap().expose_secret());
    }
    let nodes = std::fs::read_dir(dir.join("nodes")).unwrap();
    let mut disks = 0;
    for node in nodes.flatten() {
        let disk = asterism_disk::StateDisk::open(
            node.path().join("state.img"),
            asterism_disk::DiskConfig::local(),
        )
        .unwrap();
        let key = kms
            .data_key(
                &asterism_kms::KeyId::Disk(disk.uuid().unwrap()),
                asterism_kms::STATE_DISK_KEY_LEN,
            )
            .unwrap();
        n.bytes(
            &format!("the disk key of {}", node.file_name().to_string_lossy()),
            key.expose_secret(),
        );
        disks += 1;
    }
    assert_eq!(disks, 2);

    let store = dir.join("nodes/control-plane-0/run/join-service");
    let mut tokens = Vec::new();
    for file in std::fs::read_dir(&store).unwrap().flatten() {
        if file.file_type().unwrap().is_file() {
            tokens.extend(bootstrap_tokens(&std::fs::read(file.path()).unwrap()));
        }
    }
    tokens.sort();
    tokens.dedup();
    assert!(
        !tokens.is_empty(),
        "no bootstrap token in {}",
        store.display()
    );
    for token in &tokens {
        // The token ID (before the dot) is public; the part after it is the secret.
        n.text("a bootstrap token", &token[7..]);
    }
    n
}

/// Every `[a-z0-9]{6}.[a-z0-9]{16}` (a kubeadm bootstrap token) in `bytes`.
fn bootstrap_tokens(bytes: &[u8]) -> Vec<String> {
    let ok = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let mut out = Vec::new();
    for (dot, _) in bytes.iter().enumerate().filter(|(_, b)| **b == b'.') {
        if dot < 6 || dot + 17 > bytes.len() {
            continue;
        }
        let (id, secret) = (&bytes[dot - 6..dot], &bytes[dot + 1..dot + 17]);
        let bounded = |i: Option<&u8>| i.is_none_or(|b| !ok(b));
        if id.iter().all(ok)
            && secret.iter().all(ok)
            && bounded(dot.checked_sub(7).and_then(|i| bytes.get(i)))
            && bounded(bytes.get(dot + 17))
        {
            out.push(String::from_utf8(bytes[dot - 6..dot + 17].to_vec()).unwrap());
        }
    }
    out
}

/// Length of every fixed needle: 8 bytes in hex, 12 in base64, 16 raw or 16 characters of a
/// text secret.
const WINDOW: usize = 16;

/// What to look for: fixed-length needles (exact bytes, and lower-case hex matched against a
/// lower-cased haystack), and a few texts of other lengths.
#[derive(Default)]
struct Needles {
    exact: HashMap<Vec<u8>, String>,
    hex: HashMap<Vec<u8>, String>,
    texts: Vec<(String, String)>,
}

impl Needles {
    /// A binary secret of at least 16 bytes, in every form and every window.
    fn bytes(&mut self, what: &str, secret: &[u8]) {
        assert!(secret.len() >= WINDOW, "{what} is too short to search for");
        for w in secret.windows(WINDOW) {
            self.exact.insert(w.to_vec(), format!("{what} (raw)"));
        }
        let hex = hex::encode(secret);
        for i in (0..=hex.len() - WINDOW).step_by(2) {
            self.hex.insert(
                hex.as_bytes()[i..i + WINDOW].to_vec(),
                format!("{what} (hex)"),
            );
        }
        for w in secret.windows(12) {
            for (engine, form) in [
                (&STANDARD_NO_PAD, "base64"),
                (&URL_SAFE_NO_PAD, "base64url"),
            ] {
                let text = engine.encode(w);
                self.exact
                    .insert(text.into_bytes(), format!("{what} ({form})"));
            }
        }
        let list = |b: &[u8]| {
            let s = format!("{b:?}");
            s[1..s.len() - 1].to_owned()
        };
        let n = secret.len();
        self.texts
            .push((list(&secret[..6]), format!("{what} (Debug byte list)")));
        self.texts
            .push((list(&secret[n - 6..]), format!("{what} (Debug byte list)")));
    }

    /// A text secret of at least 16 characters: the text, and its bytes in hex and base64.
    fn text(&mut self, what: &str, secret: &str) {
        assert!(secret.len() >= WINDOW, "{what} is too short to search for");
        for w in secret.as_bytes().windows(WINDOW) {
            self.exact.insert(w.to_vec(), format!("{what} (text)"));
        }
        self.texts
            .push((secret.to_owned(), format!("{what} (text)")));
        self.bytes(&format!("{what}'s text"), secret.as_bytes());
    }

    /// Every hit, as `where: what`, at most once per pair.
    fn search(&self, haystacks: &[(String, Vec<u8>)]) -> Vec<String> {
        let mut hits = Vec::new();
        for (name, bytes) in haystacks {
            let lower = bytes.to_ascii_lowercase();
            let mut found: Vec<&String> = Vec::new();
            for i in 0..bytes.len().saturating_sub(WINDOW - 1) {
                let w = i..i + WINDOW;
                if let Some(what) = self.exact.get(&bytes[w.clone()]) {
                    found.push(what);
                }
                if let Some(what) = self.hex.get(&lower[w]) {
                    found.push(what);
                }
            }
            let text = String::from_utf8_lossy(bytes);
            for (needle, what) in &self.texts {
                if text.contains(needle.as_str()) {
                    found.push(what);
                }
            }
            found.sort();
            found.dedup();
            hits.extend(found.into_iter().map(|what| format!("{name}: {what}")));
        }
        hits
    }
}

/// The search itself finds each form of a secret, and nothing in unrelated text.
#[test]
fn the_search_finds_every_form_of_a_secret() {
    let secret: Vec<u8> = (0u8..32)
        .map(|i| i.wrapping_mul(37).wrapping_add(11))
        .collect();
    let mut n = Needles::default();
    n.bytes("k", &secret);
    n.text("t", "0123456789abcdef0123456789abcdef");
    let hex = hex::encode(&secret);
    let forms = [
        format!("key={hex}"),
        format!("KEY={}", hex.to_uppercase()),
        format!("key={}…", &hex[10..26]),
        format!("key={}", STANDARD.encode(&secret)),
        format!("key={}", URL_SAFE_NO_PAD.encode(&secret[5..])),
        format!("key={:?}", &secret),
        format!("tail={:?}", &secret[20..]),
        "init secret 0123456789abcdef0123456789abcdef".to_owned(),
        format!(
            "init secret {}",
            STANDARD.encode("0123456789abcdef0123456789abcdef")
        ),
    ];
    for form in forms {
        let hits = n.search(&[("h".into(), form.clone().into_bytes())]);
        assert!(!hits.is_empty(), "not found: {form}");
    }
    let mut raw = b"prefix ".to_vec();
    raw.extend_from_slice(&secret);
    assert!(
        !n.search(&[("h".into(), raw)]).is_empty(),
        "raw form not found"
    );

    let unrelated = format!(
        "INFO node joined: issued a join ticket node=worker-0 ak={} {}",
        hex::encode([0x5au8; 32]),
        STANDARD.encode([0xa5u8; 48])
    );
    assert!(n.search(&[("h".into(), unrelated.into_bytes())]).is_empty());
}

#[test]
fn bootstrap_tokens_are_found_in_a_store() {
    let store = b"\x00\x01{\"token\":\"abcdef.0123456789abcdef\",\"expires\":1}\x00xabcdef.0123456789abcdef0";
    assert_eq!(bootstrap_tokens(store), ["abcdef.0123456789abcdef"]);
}

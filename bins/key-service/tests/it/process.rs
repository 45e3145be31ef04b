//! The `asterism-key-service` binary as a real process: refusals at start-up, and a run
//! that serves requests, keeps key material out of its logs and stops on SIGTERM.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use asterism_proto::kms::api_client::ApiClient;
use asterism_testkit::process::Process;
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE};

const BIN: &str = env!("CARGO_BIN_EXE_asterism-key-service");
const DEADLINE: Duration = Duration::from_secs(20);

fn command(master_secret: &Path, salt: &Path, listen: &str) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("--master-secret-file")
        .arg(master_secret)
        .arg("--salt-file")
        .arg(salt)
        .arg("--listen")
        .arg(listen)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    cmd
}

/// Runs the binary to completion and returns its exit status and stderr.
fn run_to_exit(mut cmd: Command) -> (ExitStatus, String) {
    asterism_testkit::process::run_to_exit(&mut cmd, DEADLINE)
}

fn unix_listen(dir: &Path) -> (PathBuf, String) {
    let socket = dir.join("ks.sock");
    let listen = format!("unix:{}", socket.display());
    (socket, listen)
}

#[test]
fn refuses_a_master_secret_file_readable_by_others() {
    let s = secrets();
    std::fs::set_permissions(&s.master_secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (socket, listen) = unix_listen(s.dir.path());
    let (status, stderr) = run_to_exit(command(&s.master_secret, &s.salt, &listen));
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&s.master_secret.display().to_string()),
        "{stderr}"
    );
    assert!(stderr.contains("0644"), "{stderr}");
    assert!(stderr.contains("chmod 600"), "{stderr}");
    assert!(!socket.exists(), "nothing is served");
}

#[test]
fn refuses_a_salt_file_writable_by_group() {
    let s = secrets();
    std::fs::set_permissions(&s.salt, std::fs::Permissions::from_mode(0o620)).unwrap();
    let (_, listen) = unix_listen(s.dir.path());
    let (status, stderr) = run_to_exit(command(&s.master_secret, &s.salt, &listen));
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&s.salt.display().to_string()), "{stderr}");
    assert!(stderr.contains("0620"), "{stderr}");
}

#[test]
fn refuses_a_directory_as_master_secret_file() {
    let s = secrets();
    let (_, listen) = unix_listen(s.dir.path());
    let (status, stderr) = run_to_exit(command(s.dir.path(), &s.salt, &listen));
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("not a regular file"), "{stderr}");
}

#[test]
fn refuses_a_short_master_secret_or_salt() {
    let s = secrets();
    let (_, listen) = unix_listen(s.dir.path());
    let short_secret = write_secret(s.dir.path(), "short-secret", &[1; 15], 0o600);
    let (status, stderr) = run_to_exit(command(&short_secret, &s.salt, &listen));
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("at least 16"), "{stderr}");

    let short_salt = write_secret(s.dir.path(), "short-salt", &[1; 31], 0o600);
    let (status, stderr) = run_to_exit(command(&s.master_secret, &short_salt, &listen));
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("at least 32"), "{stderr}");
}

#[test]
fn refuses_to_serve_plaintext_on_any_tcp_address_loopback_included() {
    // A loopback port is open to every local user: an unprivileged one could derive every
    // key. Only the Unix socket (mode 0600) is served.
    let s = secrets();
    for listen in ["0.0.0.0:0", "[::]:0", "127.0.0.1:0", "[::1]:0"] {
        let (status, stderr) = run_to_exit(command(&s.master_secret, &s.salt, listen));
        assert!(!status.success(), "{listen}: {stderr}");
        assert!(stderr.contains("refusing plaintext gRPC"), "{stderr}");
    }
}

#[test]
fn has_no_flag_that_takes_a_secret_value() {
    let output = asterism_children::output(Command::new(BIN).arg("--help")).unwrap();
    let help = String::from_utf8(output.stdout).unwrap();
    assert!(help.contains("--master-secret-file"), "{help}");
    for flag in ["--master-secret ", "--master-secret=", "--salt ", "--key "] {
        assert!(!help.contains(flag), "{help}");
    }
}

#[test]
fn serves_then_stops_on_sigterm_and_never_logs_key_material() {
    let s = secrets();
    let (socket, listen) = unix_listen(s.dir.path());
    let mut cmd = command(&s.master_secret, &s.salt, &listen);
    // The most verbose logs, in both formats' field style.
    cmd.args(["--log-format", "json", "-vv"]);
    let mut child = Process::spawn(&mut cmd);

    let start = Instant::now();
    while !socket.exists() {
        if start.elapsed() > DEADLINE || child.has_exited() {
            panic!("the key service did not come up: {}", child.stderr());
        }
        std::thread::sleep(Duration::from_millis(20));
    }

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let keys: Vec<Vec<u8>> = runtime.block_on(async {
        let mut client = ApiClient::new(unix_channel(&socket, Duration::from_secs(5)).await);
        assert_eq!(
            get_key_hex(&mut client, "measurementSecret").await,
            MEASUREMENT_SECRET_ZERO
        );
        assert_eq!(get_key_hex(&mut client, ZERO_UUID).await, DISK_KEY_ZERO);
        let long = get_key(&mut client, "pvc-logging-test", 64).await.unwrap();
        vec![
            hex::decode(MEASUREMENT_SECRET_ZERO).unwrap(),
            hex::decode(DISK_KEY_ZERO).unwrap(),
            long,
        ]
    });
    drop(runtime);

    let (status, logs) = child.stop(DEADLINE);
    assert!(status.success(), "exit {status:?}: {logs}");
    assert!(!socket.exists(), "the socket file is removed on exit");

    // The decisions are logged…
    assert!(logs.contains("issued data key"), "{logs}");
    assert!(logs.contains("measurementSecret"), "{logs}");
    assert!(logs.contains(ZERO_UUID), "{logs}");
    assert!(logs.contains("received SIGTERM"), "{logs}");
    // …the keys are not, in any common encoding.
    for key in &keys {
        for encoded in [
            hex::encode(key),
            hex::encode_upper(key),
            STANDARD.encode(key),
            URL_SAFE.encode(key),
            format!("{key:?}"),
        ] {
            // A prefix is enough to catch a key printed in full or in part.
            let needle = &encoded[..16];
            assert!(
                !logs.contains(needle),
                "key material {needle} in logs:\n{logs}"
            );
        }
    }
}

//! The `asterism-bootstrapper` program as a process: exit statuses, the log it streams to
//! an authenticated caller after a failure, and a graceful stop on SIGTERM.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use asterism_kms::{KmsUri, MasterSecret, Salt};
use asterism_metadata::{MetadataConfig, Role as MetaRole};
use asterism_proto::init::api_client::ApiClient;
use asterism_proto::init::{InitRequest, init_response};
use asterism_testkit::process::Process;

/// Serves metadata naming `t` as its only (control-plane) instance.
async fn metadata_server(t: &TestNode) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    metadata_server_of(serde_json::json!([instance(
        "cp-0",
        MetaRole::ControlPlane,
        t.ip
    )]))
    .await
}

/// Serves metadata naming `instances`.
async fn metadata_server_of(
    instances: serde_json::Value,
) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let json = serde_json::json!({
        "instances": instances,
        "initSecretHash": init_secret_hash(),
    });
    let config = MetadataConfig::from_json(json.to_string().as_bytes()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(asterism_metadata::serve(listener, config, async {
        let _ = rx.await;
    }));
    (addr, tx)
}

/// Starts the bootstrapper with an InitServer on a port of the system's choosing, and
/// points `t` at that port once the bootstrapper has logged it.
fn spawn(t: &TestNode, metadata: SocketAddr) -> Process {
    spawn_with(t, metadata, &["--join-port", "1"])
}

/// Like [`spawn`], with `extra` arguments (which must name `--join-port`).
fn spawn_with(t: &TestNode, metadata: SocketAddr, extra: &[&str]) -> Process {
    let mut command = Command::new(env!("CARGO_BIN_EXE_asterism-bootstrapper"));
    command
        .arg("--node-dir")
        .arg(t.node_dir.root())
        .args(["--node-ip", &t.ip.to_string()])
        .args(["--tpm", &t.swtpm.tcti()])
        .args(["--metadata-url", &format!("http://{metadata}")])
        .args(["--init-port", "0"])
        .args(extra)
        .args(["--join-retry-interval", "200ms"])
        .args(["--kubernetes-driver", "none", "--insecure-fast-disk-kdf"])
        .args([
            "--state-disk-integrity",
            "none",
            "--state-disk-size-mib",
            "32",
        ])
        .stdout(Stdio::null());
    let process = Process::spawn(&mut command);
    let port = process.wait_for_line("the InitServer's address", Duration::from_secs(60), |l| {
        if !l.contains("InitServer listening") {
            return None;
        }
        let addr = l.split("listen=").nth(1)?.split_whitespace().next()?;
        addr.parse::<SocketAddr>().ok().map(|a| a.port())
    });
    t.use_init_port(port);
    process
}

/// Waits for the bootstrapper to exit (failing after `within`): its exit code and log.
fn wait(process: &mut Process, within: Duration) -> (i32, String) {
    let (status, logs) = process.wait(within);
    (status.code().unwrap_or(-1), logs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_disk_step_after_the_lock_resets_the_disk_streams_the_log_and_exits_3() {
    let t = TestNode::new("127.0.13.1");
    let (metadata, _stop) = metadata_server(&t).await;
    let mut child = spawn(&t, metadata);
    let channel = t.init_channel().await;

    // The first-boot passphrase is lost: the re-key after the lock cannot work.
    let key = t.node_dir.initial_key();
    std::fs::remove_file(&key).unwrap();
    std::fs::write(&key, [0u8; 32]).unwrap();

    let uri = KmsUri::cluster(
        MasterSecret::new(vec![1; 32]).unwrap(),
        Salt::new(vec![2; 32]).unwrap(),
    );
    let mut stream = ApiClient::new(channel)
        .init(InitRequest {
            kms_uri: uri.to_uri_string().to_string(),
            storage_uri: "storage://no-store".into(),
            measurement_salt: vec![3; 32],
            init_secret: INIT_SECRET.to_vec(),
            kubernetes_version: "v1.31.13".into(),
            ..InitRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut failure = None;
    let mut logs = Vec::new();
    while let Some(m) = stream.message().await.unwrap() {
        match m.kind {
            Some(init_response::Kind::InitFailure(f)) => failure = Some(f.error),
            Some(init_response::Kind::Log(l)) => {
                assert!(l.log.len() <= 1024);
                logs.extend(l.log);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    let failure = failure.unwrap();
    assert!(
        failure.contains("after the point of no return"),
        "{failure}"
    );
    let logs = String::from_utf8(logs).unwrap();
    assert!(logs.contains("took the node lock"), "{logs}");
    assert!(logs.contains("marked the state disk for reset"), "{logs}");

    let (code, stderr) = wait(&mut child, Duration::from_secs(60));
    assert_eq!(code, 3, "{stderr}");
    assert!(token0(&t.image()).contains("\"diskIsInitialized\":false"));
    assert!(!stderr.contains("cluster-kms?key"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_before_the_lock_stops_gracefully_with_exit_4() {
    let t = TestNode::new("127.0.13.2");
    let (metadata, _stop) = metadata_server(&t).await;
    let mut child = spawn(&t, metadata);
    let _ = t.init_channel().await;
    let status =
        asterism_children::status(Command::new("kill").args(["-TERM", &child.id().to_string()]))
            .unwrap();
    assert!(status.success());
    let (code, stderr) = wait(&mut child, Duration::from_secs(30));
    assert_eq!(code, 4, "{stderr}");
    assert!(stderr.contains("stopping before the node lock"), "{stderr}");
    assert_eq!(t.pcr15(), [0; 32]);
}

#[test]
fn hosting_the_cluster_services_needs_a_mapped_disk() {
    let dir = tempfile::tempdir().unwrap();
    let out = asterism_children::output(
        Command::new(env!("CARGO_BIN_EXE_asterism-bootstrapper"))
            .arg("--node-dir")
            .arg(dir.path().join("node"))
            .args(["--node-ip", "127.0.11.30", "--host-cluster-services"]),
    )
    .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--host-cluster-services keeps the master secret on the state disk"),
        "{stderr}"
    );
    assert!(
        !dir.path().join("node").exists(),
        "refused before anything is made"
    );
}

/// A bare-metal worker that pins the join service's AK joins through a mutually attested
/// join service, with no insecure flag: `--pinned-ak` is how the process trusts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_pinning_the_join_services_ak_joins_without_an_insecure_flag() {
    use crate::join::{Seen, cluster_id, control_plane_signer, start_stub};
    let cp = TestNode::new("127.0.13.5");
    let t = TestNode::new("127.0.13.6");
    cp.mark(&cluster_id());
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (port, _stop_stub) = start_stub(cp.ip, &cp, &t, seen.clone()).await;
    let (metadata, _stop) = metadata_server_of(serde_json::json!([
        instance("cp-0", MetaRole::ControlPlane, cp.ip),
        instance("worker-0", MetaRole::Worker, t.ip),
    ]))
    .await;
    // The join service's firmware PCRs, as an operator records them from the control
    // plane; PCR 15 is the cluster marker whatever the file says.
    let measurements = t.node_dir.root().join("join-service-measurements.json");
    std::fs::create_dir_all(t.node_dir.root()).unwrap();
    std::fs::write(&measurements, cp.measurements_json(|i| i <= 7)).unwrap();
    let pin = asterism_attestation::AkFingerprint::of_public_area(&cp.ak_public).to_string();
    let port = port.to_string();
    let cluster = cluster_id().to_hex();
    let key = control_plane_signer().public_key().to_string();
    let mut process = spawn_with(
        &t,
        metadata,
        &[
            "--join-port",
            &port,
            "--cluster-id",
            &cluster,
            "--control-plane-key",
            &key,
            "--verify-join-service-measurements",
            measurements.to_str().unwrap(),
            "--pinned-ak",
            &pin,
        ],
    );
    let (code, stderr) = wait(&mut process, Duration::from_secs(120));
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("Joined"), "{stderr}");
    assert!(!stderr.contains("INSECURE"), "{stderr}");
    assert_eq!(seen.lock().unwrap().join_peers.len(), 1);
    assert_eq!(
        t.pcr15(),
        asterism_tpm::marker::expected_marker_pcr(cluster_id().as_bytes())
    );
}

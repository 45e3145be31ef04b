//! End to end: a join service of another cluster, on a TPM certified by the same platform
//! CA with the same PCRs 0–14, poses as this cluster's join service at the address the
//! metadata names. A fresh worker of this cluster refuses it: its disk stays as it was, its
//! PCR 15 stays zero, and the impostor issues no ticket.
//!
//! Real processes throughout: swtpm per node, the metadata service, bootstrappers,
//! `asterism init` (twice: once for this cluster, once for the impostor's), and the
//! impostor's own key service and join service.

use crate::common::{bins, node_swtpm};
use asterism_mini::{LocalCluster, Node};
use asterism_testkit::process::wait_for;
use base64::Engine as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The join service port the bootstrappers dial.
const JOIN_PORT: u16 = 30090;
/// The InitServer port.
const INIT_PORT: u16 = 9000;

/// Stops the cluster's processes and the impostor's, even when the test fails.
struct Teardown<'a>(&'a LocalCluster, Vec<Child>);

impl Drop for Teardown<'_> {
    fn drop(&mut self) {
        for child in &mut self.1 {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = self.0.down();
    }
}

fn log_of(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn spawn(program: &str, args: &[&std::ffi::OsStr], log: &Path) -> Child {
    let out = std::fs::File::create(log).unwrap();
    let mut command = Command::new(bins().join(program));
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out);
    asterism_children::spawn(&mut command).unwrap()
}

fn write_private(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// The impostor's key service and join service on `host`'s TPM with the secrets of the
/// workspace `ws`, the join service listening on `listen`.
fn start_impostor(
    cluster: &LocalCluster,
    host: &Node,
    ws: &Path,
    listen: &str,
) -> (Vec<Child>, PathBuf) {
    let master: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ws.join("master-secret.json")).unwrap()).unwrap();
    let info: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ws.join("cluster.json")).unwrap()).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD;
    let secrets = host.dir.join("run/impostor-secrets");
    std::fs::create_dir_all(&secrets).unwrap();
    std::fs::set_permissions(&secrets, std::fs::Permissions::from_mode(0o700)).unwrap();
    write_private(
        &secrets.join("mastersecret"),
        &b64.decode(master["key"].as_str().unwrap()).unwrap(),
    );
    write_private(
        &secrets.join("salt"),
        &b64.decode(master["salt"].as_str().unwrap()).unwrap(),
    );
    write_private(
        &secrets.join("measurementSalt"),
        &hex::decode(info["measurementSalt"].as_str().unwrap()).unwrap(),
    );
    let sock = host.dir.join("run/impostor-key-service.sock");
    let ks = spawn(
        "asterism-key-service",
        &[
            "--master-secret-file".as_ref(),
            secrets.join("mastersecret").as_os_str(),
            "--salt-file".as_ref(),
            secrets.join("salt").as_os_str(),
            "--listen".as_ref(),
            format!("unix:{}", sock.display()).as_ref(),
        ],
        &host.dir.join("log/impostor-key-service.log"),
    );
    wait_for(
        "the impostor's key service",
        Duration::from_secs(30),
        || sock.exists(),
    );
    let metrics = format!("{}:9103", host.ip);
    let js_log = host.dir.join("log/impostor-join-service.log");
    let js = spawn(
        "asterism-join-service",
        &[
            "--listen".as_ref(),
            listen.as_ref(),
            "--metrics-listen".as_ref(),
            metrics.as_ref(),
            "--platform-ca".as_ref(),
            cluster.platform_ca.as_os_str(),
            "--measurements".as_ref(),
            cluster.measurements.as_os_str(),
            "--key-service".as_ref(),
            format!("unix:{}", sock.display()).as_ref(),
            "--pki-dir".as_ref(),
            host.dir.join("state/kubernetes/pki").as_os_str(),
            "--measurement-salt-file".as_ref(),
            secrets.join("measurementSalt").as_os_str(),
            "--state-dir".as_ref(),
            host.dir.join("run/impostor-join-service").as_os_str(),
            "--metadata-url".as_ref(),
            format!("http://{}", cluster.metadata_addr).as_ref(),
            "--tpm".as_ref(),
            host.tcti.as_ref(),
            "--ak-cert".as_ref(),
            host.dir.join("attestation/ak-cert.der").as_os_str(),
        ],
        &js_log,
    );
    wait_for(
        "the impostor's join service",
        Duration::from_secs(60),
        || std::net::TcpStream::connect(listen).is_ok(),
    );
    (vec![js, ks], js_log)
}

/// PCR 15 of `node`'s TPM (its swtpm keeps running).
fn pcr15(node: &Node) -> [u8; 32] {
    let swtpm = node_swtpm(node);
    let mut tpm = asterism_tpm::Tpm::open(&swtpm.tcti().parse().unwrap()).unwrap();
    asterism_tpm::marker::read_marker_pcr(&mut tpm).unwrap()
}

/// Token 0 and the keyslot count of `node`'s disk, read by the cryptsetup program.
fn disk_header(node: &Node) -> (String, usize) {
    let image = node.dir.join("state.img");
    let token = asterism_children::output(
        Command::new("cryptsetup")
            .args(["token", "export", "--token-id", "0"])
            .arg(&image),
    )
    .unwrap();
    let dump = asterism_children::output(
        Command::new("cryptsetup")
            .args(["luksDump", "--dump-json-metadata"])
            .arg(&image),
    )
    .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&dump.stdout).unwrap();
    (
        String::from_utf8(token.stdout).unwrap(),
        json["keyslots"].as_object().unwrap().len(),
    )
}

#[test]
fn a_join_service_of_another_cluster_is_refused_by_a_fresh_worker() {
    let tmp = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::create(&tmp.path().join("c"), 2, 26, bins()).unwrap();
    let mut teardown = Teardown(&cluster, Vec::new());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();

    // This cluster: the control plane is initialised; its own join service is not started,
    // so the only join service a worker can reach is the impostor's.
    let (ours, cp) = rt.block_on(cluster.init()).unwrap();
    assert_eq!(cp.1, "ok");

    // The impostor: worker-1 (a TPM of the same platform CA, the same PCRs 0–14) is
    // initialised as the first node of another cluster, so its PCR 15 holds that
    // cluster's marker.
    let host = cluster.nodes[2].clone();
    let booting = cluster.start_bootstrapper(&host).unwrap();
    let init_addr = format!("{}:{INIT_PORT}", host.ip);
    wait_for("the impostor's InitServer", Duration::from_secs(60), || {
        std::net::TcpStream::connect(&init_addr).is_ok()
    });
    let mut args = cluster.init_args();
    args.endpoint = init_addr;
    args.workspace = tmp.path().join("impostor-workspace");
    let theirs = rt.block_on(asterism::init::run(args)).unwrap();
    assert_ne!(theirs.cluster_id, ours.cluster_id);
    let (_, exit) = rt
        .block_on(cluster.finish_bootstrapper(booting, &host))
        .unwrap();
    assert_eq!(exit, "ok");

    // Its join service takes the address where this cluster's join service is expected.
    let cp_addr = format!("{}:{JOIN_PORT}", cluster.nodes[0].ip);
    let (children, impostor_log) = start_impostor(&cluster, &host, &theirs.workspace, &cp_addr);
    teardown.1.extend(children);

    // A fresh worker of this cluster asks it for a ticket, round after round.
    let victim = cluster.nodes[1].clone();
    let victim_log = victim.dir.join("log/bootstrapper.log");
    let booting = cluster.start_bootstrapper(&victim).unwrap();
    wait_for(
        "three refused join attempts",
        Duration::from_secs(90),
        || {
            let log = log_of(&victim_log);
            log.matches("join attempt failed").count() + log.matches("unusable ticket").count() >= 3
        },
    );
    let pid: i32 = std::fs::read_to_string(victim.dir.join("run/bootstrapper.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        asterism_children::status(Command::new("kill").args(["-TERM", &pid.to_string()]))
            .unwrap()
            .success()
    );
    let (_, exit) = rt
        .block_on(cluster.finish_bootstrapper(booting, &victim))
        .unwrap();
    assert_eq!(exit, "exit status: 4", "stopped before the node lock");

    let log = log_of(&victim_log);
    assert!(
        log.contains("measurement mismatch at index 15"),
        "the worker refused the impostor for its PCR 15:\n{log}"
    );
    assert!(
        !log_of(&impostor_log).contains("issued a join ticket"),
        "the impostor issued no ticket"
    );
    assert_eq!(pcr15(&victim), [0; 32], "the worker is not marked");
    let (token, keyslots) = disk_header(&victim);
    assert!(
        token.contains("\"diskIsInitialized\":false"),
        "the disk is not re-keyed: {token}"
    );
    assert_eq!(keyslots, 1, "only the first-boot passphrase opens the disk");
}

//! End to end, with real processes (swtpm per node, LUKS2 image files, the metadata, key
//! and join services, bootstrappers, the `asterism` CLI): a disk key goes only to the
//! attestation key its disk is bound to, the init node's disk included; a node that comes
//! back with another attestation key waits for `asterism readmit`; a joined worker cannot
//! squat the disk of a node that has not joined yet; SSH host certificates name the node
//! only, and expire.

use crate::common::{TestCluster, bins, cryptsetup_opens, join_worker, runtime};
use asterism_mini::{LocalCluster, Node};
use asterism_testkit::process::wait_for;
use std::process::Command;
use std::time::Duration;

fn join_service_log(cluster: &LocalCluster) -> String {
    std::fs::read_to_string(cluster.nodes[0].dir.join("log/join-service.log")).unwrap_or_default()
}

/// The UUID in the node's LUKS2 header, read by the cryptsetup program.
fn luks_uuid(node: &Node) -> String {
    let out = asterism_children::output(
        Command::new("cryptsetup")
            .arg("luksUUID")
            .arg(node.dir.join("state.img")),
    )
    .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn member<'a>(members: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    members
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == name)
        .unwrap_or_else(|| panic!("no member {name}: {members}"))
}

/// `ssh-keygen -L` of the node's host certificate: its principals, validity and serial as
/// OpenSSH reads them.
fn host_certificate(node: &Node) -> String {
    let out = asterism_children::output(
        Command::new("ssh-keygen")
            .arg("-L")
            .arg("-f")
            .arg(node.dir.join("state/ssh/ssh_host_cert.pub")),
    )
    .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn a_worker_naming_the_control_planes_disk_gets_nothing_and_the_control_plane_still_rejoins() {
    let cluster = TestCluster::create(1, 41);
    let rt = runtime();
    let (_, cp) = rt.block_on(cluster.init()).unwrap();
    assert_eq!(cp.1, "ok");
    join_worker(&cluster, &rt);
    let worker = cluster.nodes[1].clone();

    // The init node is a member, its disk bound to its AK, from its bootstrapper's record.
    let cp_node = cluster.nodes[0].clone();
    let cp_disk = luks_uuid(&cp_node);
    let members = cluster.members();
    let cp_member = member(&members, "control-plane-0");
    assert_eq!(cp_member["role"], "ControlPlane", "{members}");
    let record: serde_json::Value = serde_json::from_slice(
        &std::fs::read(cp_node.dir.join("state/asterism/init-node.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(record["disk"], cp_disk.as_str());
    assert_eq!(cp_member["ak"], record["ak"]);
    assert_ne!(member(&members, "worker-0")["ak"], record["ak"]);

    // The owner's `asterism control-plane sync` takes the join service's signed list from
    // its admin socket: the control plane, recorded at init, stays the only member of the
    // workspace's record; the joined worker is not added.
    let sync = |extra: &[&std::ffi::OsStr]| {
        asterism_children::output(
            Command::new(bins().join("asterism"))
                .args(["control-plane", "sync", "--workspace"])
                .arg(&cluster.workspace)
                .args(extra),
        )
        .unwrap()
    };
    let out = sync(&[
        "--admin-socket".as_ref(),
        cluster.admin_socket().as_os_str(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("0 new control-plane node(s)"), "{stderr}");
    let recorded: serde_json::Value = serde_json::from_slice(
        &std::fs::read(cluster.workspace.join("control-plane.json")).unwrap(),
    )
    .unwrap();
    let recorded = recorded["members"].as_array().unwrap().clone();
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert_eq!(recorded[0]["ak"], record["ak"]);
    assert_eq!(recorded[0]["disk"], cp_disk.as_str());
    // A list whose payload a worker rewrote to name itself is refused, and the record
    // stays as it was.
    let mut envelope: serde_json::Value =
        serde_json::from_str(&cluster.signed_control_plane_list().unwrap()).unwrap();
    let forged = serde_json::json!({"members": [{
        "name": "control-plane-1",
        "ak": member(&members, "worker-0")["ak"],
        "disk": luks_uuid(&worker),
    }], "issuedAt": 0});
    envelope["payload"] = base64::Engine::encode(
        &base64::engine::general_purpose::STANDARD,
        serde_json::to_vec(&forged).unwrap(),
    )
    .into();
    let forged_file = cluster.scratch_dir().join("forged-control-plane.json");
    std::fs::write(&forged_file, serde_json::to_vec(&envelope).unwrap()).unwrap();
    let out = sync(&["--from".as_ref(), forged_file.as_os_str()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("not signed by this cluster's control plane"),
        "{stderr}"
    );
    let after: serde_json::Value = serde_json::from_slice(
        &std::fs::read(cluster.workspace.join("control-plane.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(after["members"].as_array().unwrap(), &recorded);

    // The worker's SSH host certificate names the worker only, expires, has a serial.
    let cert = host_certificate(&worker);
    let principals: Vec<&str> = cert
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("Principals:"))
        .skip(1)
        .take_while(|l| l.starts_with("                "))
        .map(str::trim)
        .collect();
    assert_eq!(principals, [worker.ip.as_str(), "worker-0"], "{cert}");
    assert!(!cert.contains("forever"), "{cert}");
    assert!(!cert.contains("Serial: 0\n"), "{cert}");

    // The worker reboots with its disk header claiming the control plane's UUID (the
    // attacker owns its disk; the UUID is in the control plane's plaintext header).
    let mut attacker = worker.clone();
    attacker.reset_tpm().unwrap();
    let status = asterism_children::status(
        Command::new("cryptsetup")
            .args(["luksUUID", "-q", "--uuid", &cp_disk])
            .arg(attacker.dir.join("state.img")),
    )
    .unwrap();
    assert!(status.success());
    let before = join_service_log(&cluster).len();
    let _attack = cluster.start_bootstrapper(&attacker).unwrap();
    wait_for(
        "the join service refuses the worker's rejoin for the control plane's disk",
        Duration::from_secs(60),
        || {
            join_service_log(&cluster)[before..].contains(&format!(
                "disk {cp_disk} belongs to another attestation key"
            ))
        },
    );
    attacker.kill_bootstrapper().unwrap();
    assert!(
        !join_service_log(&cluster)[before..].contains("issued a rejoin ticket"),
        "{}",
        join_service_log(&cluster)
    );

    // The control plane reboots and asks for its own disk's key with its own TPM: granted,
    // and the key opens its disk. (Its bootstrapper does not ask itself: a single
    // control-plane node knows no other join service. This is the same request over the
    // same attested TLS, from its address, with its AK.)
    let mut cp_node = cp_node;
    cp_node.reset_tpm().unwrap();
    let key = rt
        .block_on(rejoin_as(&cp_node, &cp_node.ip, &cp_disk))
        .unwrap();
    assert!(
        cryptsetup_opens(&cp_node, &key),
        "the key opens the control plane's disk"
    );
    let log = join_service_log(&cluster);
    assert!(
        log[before..]
            .lines()
            .any(|l| l.contains("issued a rejoin ticket") && l.contains("control-plane-0")),
        "{log}"
    );
    // The same request with the worker's TPM is refused.
    let err = rt
        .block_on(rejoin_as(&attacker, &cp_node.ip, &cp_disk))
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
}

#[test]
fn a_joined_worker_cannot_squat_the_disk_of_a_node_that_has_not_joined() {
    let cluster = TestCluster::create(2, 43);
    let rt = runtime();
    let (_, cp) = rt.block_on(cluster.init()).unwrap();
    assert_eq!(cp.1, "ok");
    join_worker(&cluster, &rt);
    let attacker = cluster.nodes[1].clone();
    let victim = cluster.nodes[2].clone();

    // The victim boots while no join service answers: its bootstrapper formats its disk
    // (a fresh UUID in the plaintext LUKS2 header) and waits; it is stopped there.
    cluster.kill_join_service().unwrap();
    let _waiting = cluster.start_bootstrapper(&victim).unwrap();
    wait_for(
        "the victim's disk is formatted",
        Duration::from_secs(60),
        || {
            asterism_children::status(
                Command::new("cryptsetup")
                    .arg("isLuks")
                    .arg(victim.dir.join("state.img")),
            )
            .is_ok_and(|s| s.success())
        },
    );
    victim.kill_bootstrapper().unwrap();
    let victim_disk = luks_uuid(&victim);
    cluster.start_join_service().unwrap();

    // The attacker, root on the joined worker (after a reboot: its PCR 15 is zero again),
    // asks for a join ticket under its own name with the victim's disk UUID.
    let mut attacker_after_reboot = attacker.clone();
    attacker_after_reboot.reset_tpm().unwrap();
    let err = rt
        .block_on(join_as(
            &attacker_after_reboot,
            &cluster.nodes[0].ip,
            "worker-0",
            &victim_disk,
        ))
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("second"), "{err:?}");

    // Nothing was bound: the victim boots again and joins with its disk.
    let booting = cluster.start_bootstrapper(&victim).unwrap();
    let (_, exit) = rt
        .block_on(cluster.finish_bootstrapper(booting, &victim))
        .unwrap();
    assert_eq!(exit, "ok", "the victim joins");
    let members = cluster.members();
    assert_eq!(
        member(&members, &victim.name)["role"],
        "Worker",
        "{members}"
    );
    let key = cluster.derived_disk_key(&victim).unwrap();
    assert!(cryptsetup_opens(&victim, key.expose_secret()));
}

/// `IssueJoinTicket` as worker `name` for `disk`, attesting with `node`'s TPM and AK
/// certificate, from its address.
async fn join_as(
    node: &Node,
    join_service: &str,
    name: &str,
    disk: &str,
) -> Result<(), tonic::Status> {
    use asterism_proto::join::{IssueJoinTicketRequest, api_client::ApiClient};
    let channel = attested_channel(node, join_service).await?;
    let csr = asterism_pki::kubelet_key_and_csr(name, &[node.ip.parse().unwrap()]).unwrap();
    let host = asterism_pki::HostKey::generate().unwrap();
    ApiClient::new(channel)
        .issue_join_ticket(IssueJoinTicketRequest {
            disk_uuid: disk.to_owned(),
            certificate_request: csr.csr_der,
            is_control_plane: false,
            host_public_key: host.public_key_wire().unwrap(),
            host_certificate_principals: vec![node.ip.clone(), name.to_owned()],
        })
        .await
        .map(|_| ())
}

/// `IssueRejoinTicket` for `disk`, attesting with `node`'s TPM and AK certificate, from its
/// address.
async fn rejoin_as(node: &Node, join_service: &str, disk: &str) -> Result<Vec<u8>, tonic::Status> {
    use asterism_proto::join::{IssueRejoinTicketRequest, api_client::ApiClient};
    let channel = attested_channel(node, join_service).await?;
    ApiClient::new(channel)
        .issue_rejoin_ticket(IssueRejoinTicketRequest {
            disk_uuid: disk.to_owned(),
        })
        .await
        .map(|r| r.into_inner().state_disk_key)
}

#[test]
fn a_worker_with_a_new_tpm_waits_for_asterism_readmit() {
    let cluster = TestCluster::create(1, 42);
    let rt = runtime();
    rt.block_on(cluster.init()).unwrap();
    join_worker(&cluster, &rt);
    let worker = cluster.nodes[1].clone();
    let old_ak = member(&cluster.members(), "worker-0")["ak"].clone();

    // The worker is re-installed: a new TPM (another AK, certified by the same platform
    // CA) and a blank disk.
    let cfg = asterism_swtpm::SwtpmConfig::new(worker.dir.join("tpm"))
        .unwrap()
        .with_run_dir(worker.dir.join("run"))
        .unwrap();
    asterism_swtpm::SwtpmProcess::attach(&cfg)
        .unwrap()
        .stop()
        .unwrap();
    for gone in ["tpm", "attestation", "state"] {
        std::fs::remove_dir_all(worker.dir.join(gone)).unwrap();
        std::fs::create_dir_all(worker.dir.join(gone)).unwrap();
    }
    std::fs::remove_file(worker.dir.join("state.img")).unwrap();
    let out = asterism_children::output(
        Command::new(bins().join("asterism-provision"))
            .args(["node", "--state-dir"])
            .arg(worker.dir.join("tpm"))
            .arg("--ca-dir")
            .arg(cluster.dir.join("platform-ca"))
            .arg("--out")
            .arg(worker.dir.join("attestation")),
    )
    .unwrap();
    assert!(out.status.success(), "{out:?}");
    let swtpm = asterism_swtpm::SwtpmProcess::start_detached(&cfg).unwrap();
    let mut renewed = worker.clone();
    renewed.tcti = swtpm.tcti();

    let before = join_service_log(&cluster).len();
    let _booting = cluster.start_bootstrapper(&renewed).unwrap();
    wait_for(
        "the join service refuses worker-0 with another attestation key",
        Duration::from_secs(60),
        || join_service_log(&cluster)[before..].contains("asterism readmit worker-0"),
    );
    assert_eq!(member(&cluster.members(), "worker-0")["ak"], old_ak);

    // The operator re-admits it, over the admin socket.
    let out = asterism_children::output(
        Command::new(bins().join("asterism"))
            .args(["readmit", "worker-0", "--admin-socket"])
            .arg(cluster.admin_socket()),
    )
    .unwrap();
    assert!(out.status.success(), "{out:?}");
    let log = join_service_log(&cluster);
    assert!(
        log[before..]
            .lines()
            .any(|l| l.contains("WARN") && l.contains("an operator re-admitted the node")),
        "{log}"
    );
    // Its bootstrapper, retrying, now joins.
    wait_for(
        "worker-0 joins with its new attestation key",
        Duration::from_secs(60),
        || member(&cluster.members(), "worker-0")["ak"] != old_ak,
    );
    renewed.kill_bootstrapper().unwrap();
    let m = cluster.members();
    assert_eq!(member(&m, "worker-0")["readmit"], false, "{m}");

    // Another re-admission of an unknown node is refused by the service.
    let out = asterism_children::output(
        Command::new(bins().join("asterism"))
            .args(["readmit", "worker-9", "--admin-socket"])
            .arg(cluster.admin_socket()),
    )
    .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no member"),
        "{out:?}"
    );
}

/// An aTLS channel to the join service on `join_service`, attesting with `node`'s TPM and AK
/// certificate, from its address.
async fn attested_channel(
    node: &Node,
    join_service: &str,
) -> Result<tonic::transport::Channel, tonic::Status> {
    use asterism_tpm::{AkConfig, PcrSelection, Tpm, TpmIssuer};
    let chain = vec![std::fs::read(node.dir.join("attestation/ak-cert.der")).unwrap()];
    let tpm = Tpm::open(&node.tcti.parse().unwrap()).unwrap();
    let issuer = TpmIssuer::new(tpm, &AkConfig::default(), PcrSelection::all(), chain).unwrap();
    let connector = asterism_atls::AtlsConnector::new(asterism_atls::AtlsConfig::attesting(
        std::sync::Arc::new(issuer),
    ))
    .unwrap()
    .from_address(node.ip.parse().unwrap());
    let server: std::net::SocketAddr = format!("{join_service}:30090").parse().unwrap();
    tonic::transport::Endpoint::from_shared(format!("http://{server}"))
        .unwrap()
        .timeout(Duration::from_secs(30))
        .connect_with_connector(connector)
        .await
        .map_err(|e| tonic::Status::unavailable(format!("{e:?}")))
}

//! End to end, with real processes (swtpm per node, LUKS2 image files, the metadata, key
//! and join services, bootstrappers, `asterism recover`): a whole-cluster outage, and the
//! owner bringing the control plane back with the master secret, or with M of N custodian
//! shares. Before that, the refusals: a node whose PCRs differ gets nothing, a relayed
//! recovery session fails, and a wrong key changes nothing on the node.

use crate::common::{TeardownAt, bins, cryptsetup_opens, join_worker, runtime};
use asterism::recover::{NodeKeys, Target};
use asterism_atls::{AtlsConfig, AtlsConnector};
use asterism_kms::DiskUuid;
use asterism_mini::{LocalCluster, Node};
use asterism_proto::recover::api_client::ApiClient;
use asterism_proto::recover::{DescribeRequest, RecoverMessage};
use asterism_testkit::process::wait_for;
use std::time::Duration;

/// The recovery of `endpoint` as `asterism recover` runs it, with the cluster's trust
/// (platform CA, the nodes' measurements with PCR 15 enforced zero) and a short pause
/// between attempts.
fn target(cluster: &LocalCluster, endpoint: String) -> Target {
    Target {
        endpoint,
        validator: asterism::recover::validator(&asterism::trust::TrustArgs::platform_ca(
            &cluster.platform_ca,
            &cluster.measurements,
        ))
        .unwrap(),
        insecure_send_master_secret: false,
        control_plane: asterism::recover::ControlPlaneAks::from_workspace(
            &cluster.workspace,
            false,
        )
        .unwrap(),
        deadline: Duration::from_secs(90),
        retry_interval: Duration::from_millis(300),
    }
}

fn bootstrapper_log(node: &Node) -> String {
    std::fs::read_to_string(node.dir.join("log/bootstrapper.log")).unwrap_or_default()
}

/// PCR 15 of the node's TPM.
fn marker_pcr(node: &Node) -> [u8; 32] {
    let mut tpm = asterism_tpm::Tpm::open(&node.tcti.parse().unwrap()).unwrap();
    asterism_tpm::marker::read_marker_pcr(&mut tpm).unwrap()
}

/// The bootstrapper of `node` waits for its keys: its recovery server answers.
fn wait_for_recovery_server(node: &Node) {
    wait_for(
        &format!("the recovery server of {}", node.name),
        Duration::from_secs(60),
        || std::net::TcpStream::connect(node.recover_endpoint()).is_ok(),
    );
}

/// A cluster of one control-plane node and one worker, initialised by `init`, whose
/// worker joined; then a whole-cluster outage: every process stopped, every TPM reset.
fn outage(cluster: &mut LocalCluster, init: impl FnOnce(&LocalCluster, &tokio::runtime::Runtime)) {
    let rt = runtime();
    init(cluster, &rt);
    join_worker(cluster, &rt);
    cluster.outage().unwrap();
    for n in &cluster.nodes {
        assert_eq!(marker_pcr(n), [0; 32], "{} was power-cycled", n.name);
    }
}

/// `asterism recover` against the waiting control plane: exactly one node recovered, its
/// bootstrapper ends with `Recovered`, and the disk key the CLI derived for the UUID the
/// node named opens the disk (checked by the cryptsetup program). Returns the keys.
fn recover_control_plane(
    cluster: &LocalCluster,
    rt: &tokio::runtime::Runtime,
    kms: &asterism_kms::ClusterKms,
    booting: asterism_mini::Booting,
) -> NodeKeys {
    let cp = &cluster.nodes[0];
    let recovered = rt
        .block_on(asterism::recover::recover(
            &target(cluster, cp.recover_endpoint()),
            kms,
        ))
        .unwrap();
    assert_eq!(recovered.len(), 1, "{recovered:?}");
    let uuid = DiskUuid::parse(recovered[0].disk_uuid.as_deref().unwrap()).unwrap();
    let (_, exit) = rt
        .block_on(cluster.finish_bootstrapper(booting, cp))
        .unwrap();
    assert_eq!(exit, "ok", "{}", bootstrapper_log(cp));
    assert!(
        bootstrapper_log(cp).contains("outcome=Recovered"),
        "{}",
        bootstrapper_log(cp)
    );
    let keys = NodeKeys::derive(kms, &uuid).unwrap();
    assert!(cryptsetup_opens(cp, keys.disk_key.expose_secret()));
    keys
}

/// After the control plane is back: the key and join services start again on it, and the
/// worker, waiting since its reboot, rejoins through them.
fn workers_rejoin(
    cluster: &LocalCluster,
    rt: &tokio::runtime::Runtime,
    booting: asterism_mini::Booting,
) {
    cluster.start_key_service().unwrap();
    cluster.start_join_service().unwrap();
    let worker = &cluster.nodes[1];
    let (_, exit) = rt
        .block_on(cluster.finish_bootstrapper(booting, worker))
        .unwrap();
    assert_eq!(exit, "ok", "{}", bootstrapper_log(worker));
    assert!(
        bootstrapper_log(worker).contains("rejoin"),
        "{}",
        bootstrapper_log(worker)
    );
}

#[test]
fn a_whole_cluster_outage_is_recovered_by_the_owner_and_the_workers_rejoin() {
    let tmp = tempfile::tempdir().unwrap();
    let _teardown = TeardownAt(tmp.path().join("c"));
    let mut cluster = LocalCluster::create(&tmp.path().join("c"), 1, 61, bins()).unwrap();
    outage(&mut cluster, |c, rt| {
        assert_eq!(rt.block_on(c.init()).unwrap().1.1, "ok");
    });
    let rt = runtime();
    let cp = cluster.nodes[0].clone();
    let worker = cluster.nodes[1].clone();
    let kms = asterism::recover::read_master_secret(&cluster.workspace.join("master-secret.json"))
        .unwrap();
    asterism::recover::check_cluster(&cluster.workspace, &kms).unwrap();

    // Both nodes reboot. No join service answers: they wait.
    let cp_boot = cluster.start_bootstrapper(&cp).unwrap();
    let worker_boot = cluster.start_bootstrapper(&worker).unwrap();
    wait_for_recovery_server(&cp);

    // Refusal: a relayed session. The relay holds TLS with the node and with the owner, and
    // copies the node's evidence across unchanged; it is bound to the other session.
    let relay = rt.block_on(asterism_testkit::relay::TlsRelay::start(
        cp.recover_endpoint().parse().unwrap(),
    ));
    let err = rt
        .block_on(asterism::recover::recover(
            &target(&cluster, relay.addr().to_string()),
            &kms,
        ))
        .unwrap_err();
    assert!(relay.relayed() >= 1, "the relay reached the node");
    assert!(
        format!("{err:#}").contains("bound to other report data"),
        "{err:#}"
    );
    drop(relay);

    // Refusal: an attested caller pushes a key that does not open the disk, or the disk's
    // key with another cluster's measurement secret. Refused; the node keeps waiting, its
    // disk and PCR 15 untouched.
    for wrong in [WrongKey::Disk, WrongKey::MeasurementSecret] {
        let status = rt
            .block_on(push_wrong_key(&cluster, &cp, &kms, wrong))
            .unwrap_err();
        assert_eq!(
            status.code(),
            tonic::Code::PermissionDenied,
            "{wrong:?}: {status:?}"
        );
        assert_eq!(marker_pcr(&cp), [0; 32], "{wrong:?}");
    }
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        std::net::TcpStream::connect(cp.recover_endpoint()).is_ok(),
        "the node still waits for its keys"
    );

    // The owner recovers: one node, its disk, with keys derived on the owner's side.
    let keys = recover_control_plane(&cluster, &rt, &kms, cp_boot);
    // mini's own derivation, from the disk's LUKS2 header, agrees.
    assert_eq!(
        cluster.derived_disk_key(&cp).unwrap().expose_secret(),
        keys.disk_key.expose_secret()
    );
    // PCR 15 carries the cluster's marker again.
    let cluster_id: [u8; 32] = hex::decode(cluster.cluster_id().unwrap())
        .unwrap()
        .try_into()
        .unwrap();
    assert_eq!(
        marker_pcr(&cp),
        asterism_tpm::marker::expected_marker_pcr(&cluster_id)
    );
    // Nothing left to recover: a second run says so and succeeds.
    assert!(
        rt.block_on(asterism::recover::recover(
            &target(&cluster, cp.recover_endpoint()),
            &kms,
        ))
        .unwrap()
        .is_empty()
    );

    workers_rejoin(&cluster, &rt, worker_boot);
}

/// What a caller pushes instead of the node's keys.
#[derive(Clone, Copy, Debug)]
enum WrongKey {
    /// A disk key that opens nothing, with the cluster's true measurement secret.
    Disk,
    /// The disk's true key, with a measurement secret of another cluster.
    MeasurementSecret,
}

/// An attested connection to the node's recovery server, its disk UUID asked, then keys for
/// that UUID, one of them wrong.
async fn push_wrong_key(
    cluster: &LocalCluster,
    node: &Node,
    kms: &asterism_kms::ClusterKms,
    wrong: WrongKey,
) -> Result<(), tonic::Status> {
    let validator = asterism::recover::validator(&asterism::trust::TrustArgs::platform_ca(
        &cluster.platform_ca,
        &cluster.measurements,
    ))
    .unwrap();
    let connector = AtlsConnector::new(AtlsConfig::verifying(validator)).unwrap();
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{}", node.recover_endpoint()))
            .unwrap()
            .connect_with_connector(connector.clone())
            .await
            .unwrap();
    assert!(connector.last_verified_peer().is_some());
    let mut client = ApiClient::new(channel);
    let uuid = client
        .describe(DescribeRequest {})
        .await?
        .into_inner()
        .disk_uuid;
    let keys = NodeKeys::derive(kms, &DiskUuid::parse(&uuid).unwrap()).unwrap();
    let (disk_key, cluster_measurement_secret) = match wrong {
        WrongKey::Disk => (
            vec![0x42; 32],
            keys.measurement_secret.expose_secret().to_vec(),
        ),
        WrongKey::MeasurementSecret => (keys.disk_key.expose_secret().to_vec(), vec![0x43; 32]),
    };
    client
        .recover(RecoverMessage {
            disk_key,
            cluster_measurement_secret,
            disk_uuid: uuid,
            ..RecoverMessage::default()
        })
        .await
        .map(|_| ())
}

#[test]
fn a_node_whose_pcrs_differ_gets_nothing_and_is_recovered_after_a_clean_boot() {
    let tmp = tempfile::tempdir().unwrap();
    let _teardown = TeardownAt(tmp.path().join("c"));
    let mut cluster = LocalCluster::create(&tmp.path().join("c"), 1, 62, bins()).unwrap();
    outage(&mut cluster, |c, rt| {
        assert_eq!(rt.block_on(c.init()).unwrap().1.1, "ok");
    });
    let rt = runtime();
    let kms = asterism::recover::read_master_secret(&cluster.workspace.join("master-secret.json"))
        .unwrap();

    // The control plane boots other software: PCR 9 measured differently.
    let cp = cluster.nodes[0].clone();
    let mut tpm = asterism_tpm::Tpm::open(&cp.tcti.parse().unwrap()).unwrap();
    tpm.extend_pcr(9, &[0x99; 32]).unwrap();
    drop(tpm);
    let booting = cluster.start_bootstrapper(&cp).unwrap();
    wait_for_recovery_server(&cp);
    let err = rt
        .block_on(asterism::recover::recover(
            &target(&cluster, cp.recover_endpoint()),
            &kms,
        ))
        .unwrap_err();
    let text = format!("{err:#}");
    assert!(text.contains("evidence was refused"), "{text}");
    assert!(text.contains("index 9"), "{text}");
    // It got nothing: still waiting, PCR 15 unmarked.
    assert!(std::net::TcpStream::connect(cp.recover_endpoint()).is_ok());
    assert_eq!(marker_pcr(&cp), [0; 32]);

    // Rebooted into the expected software, it is recovered.
    cluster.nodes[0].kill_bootstrapper().unwrap();
    drop(booting);
    cluster.nodes[0].reset_tpm().unwrap();
    let cp = cluster.nodes[0].clone();
    let booting = cluster.start_bootstrapper(&cp).unwrap();
    let recovered = rt
        .block_on(asterism::recover::recover(
            &target(&cluster, cp.recover_endpoint()),
            &kms,
        ))
        .unwrap();
    assert_eq!(recovered.len(), 1);
    let (_, exit) = rt
        .block_on(cluster.finish_bootstrapper(booting, &cp))
        .unwrap();
    assert_eq!(exit, "ok", "{}", bootstrapper_log(&cp));
}

/// A custodian's SSH Ed25519 key pair, made by `ssh-keygen`; returns the private key's path
/// (the public key is next to it, `.pub`).
fn custodian_key(dir: &std::path::Path, name: &str) -> std::path::PathBuf {
    let key = dir.join(name);
    let status = asterism_children::status(
        std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"])
            .arg(&key),
    )
    .unwrap();
    assert!(status.success());
    key
}

/// Custodian `index` (1-based) decrypts their share of the workspace with their key.
fn decrypt_share(
    cluster: &LocalCluster,
    keys: &[std::path::PathBuf],
    index: usize,
) -> std::path::PathBuf {
    asterism::recovery_share::run(&asterism::recovery_share::Args {
        command: asterism::recovery_share::Command::Decrypt(
            asterism::recovery_share::DecryptArgs {
                share: cluster
                    .workspace
                    .join(format!("recovery-shares/share-{index}-of-3.json")),
                identity: keys[index - 1].clone(),
                out: None,
            },
        ),
    })
    .unwrap()
}

#[test]
fn a_whole_cluster_outage_is_recovered_from_m_of_n_custodian_shares() {
    let tmp = tempfile::tempdir().unwrap();
    let _teardown = TeardownAt(tmp.path().join("c"));
    let mut cluster = LocalCluster::create(&tmp.path().join("c"), 1, 63, bins()).unwrap();
    let keys: Vec<_> = ["alice", "bob", "carol"]
        .iter()
        .map(|name| custodian_key(tmp.path(), name))
        .collect();
    // Initialised with 2-of-3 custody and no master-secret file. The key service gets the
    // secret from two custodians, as the owner would deploy it.
    let mut decrypted = Vec::new();
    outage(&mut cluster, |c, rt| {
        let mut args = c.init_args();
        args.recovery_shares = Some("2-of-3".parse().unwrap());
        args.recovery_recipients = keys.iter().map(|k| k.with_extension("pub")).collect();
        args.no_master_secret_file = true;
        assert_eq!(rt.block_on(c.init_with(args)).unwrap().1.1, "ok");
        assert!(!c.workspace.join("master-secret.json").exists());
        decrypted = vec![decrypt_share(c, &keys, 1), decrypt_share(c, &keys, 3)];
        let kms = asterism::recover::read_shares(&c.workspace, &decrypted).unwrap();
        c.provide_key_service_secrets(&kms).unwrap();
    });
    let rt = runtime();
    let (cp, worker) = (cluster.nodes[0].clone(), cluster.nodes[1].clone());
    let cp_boot = cluster.start_bootstrapper(&cp).unwrap();
    let worker_boot = cluster.start_bootstrapper(&worker).unwrap();
    wait_for_recovery_server(&cp);

    // One share is not enough, and says so.
    let err = asterism::recover::read_shares(&cluster.workspace, &decrypted[..1]).unwrap_err();
    assert!(format!("{err:#}").contains("2 of 3"), "{err:#}");

    // Two shares: the secret comes back (it derives the workspace's cluster ID) and the
    // control plane is recovered with it.
    let kms = asterism::recover::read_shares(&cluster.workspace, &decrypted).unwrap();
    asterism::recover::check_cluster(&cluster.workspace, &kms).unwrap();
    recover_control_plane(&cluster, &rt, &kms, cp_boot);

    workers_rejoin(&cluster, &rt, worker_boot);
}

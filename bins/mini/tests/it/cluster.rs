//! End to end: local clusters of real processes (swtpm per node, LUKS2 image files with
//! the cryptsetup program, the metadata service, bootstrappers, `asterism init`, key and
//! join services), driven step by step through `asterism_mini::LocalCluster`.
//!
//! The binaries are the workspace's own, built next to `asterism` (`cargo test --workspace`
//! builds them all). Kubernetes cannot run here; the bootstrappers use the `none` driver.

use crate::common::{TestCluster, bins, cryptsetup_opens, node_swtpm, runtime, verify_node};
use asterism_mini::{LocalCluster, Node};
use asterism_testkit::process::wait_for;
use std::process::Command;
use std::time::Duration;

/// Number of LUKS2 keyslots in the node's disk header, read by the cryptsetup program.
fn keyslots(node: &Node) -> usize {
    let out = asterism_children::output(
        Command::new("cryptsetup")
            .args(["luksDump", "--dump-json-metadata"])
            .arg(node.dir.join("state.img")),
    )
    .unwrap();
    assert!(out.status.success());
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    json["keyslots"].as_object().unwrap().len()
}

fn member_names(cluster: &LocalCluster) -> Vec<String> {
    let members = cluster.members();
    let list = members
        .as_array()
        .or_else(|| members.get("members").and_then(|m| m.as_array()))
        .cloned()
        .unwrap_or_default();
    let mut names: Vec<String> = list
        .iter()
        .filter_map(|m| m.get("name").and_then(|n| n.as_str()).map(String::from))
        .collect();
    names.sort();
    names
}

/// Every node, the control plane through the init request and each worker through its join
/// ticket, was handed the release `asterism init` picks by default (v1.31.13), component
/// for component; the record, the table, `status --json` and the bootstrapper's log all say
/// so, and that the `none` driver installed nothing.
fn handed_the_default_release_and_installed_nothing(
    cluster: &LocalCluster,
    record: &asterism_mini::ClusterRecord,
) {
    let table = asterism_kubernetes_versions::VersionTable::builtin().unwrap();
    let release = table
        .resolve(asterism_kubernetes_versions::DEFAULT_REQUEST)
        .unwrap();
    assert_eq!(release.version().to_string(), "v1.31.13");
    let components = release.components();
    assert!(!components.is_empty());
    let roles: Vec<&str> = record.nodes.iter().map(|n| n.role.as_str()).collect();
    assert_eq!(roles, ["ControlPlane", "Worker", "Worker"]);
    for n in &record.nodes {
        let k = n
            .kubernetes
            .as_ref()
            .unwrap_or_else(|| panic!("{}: no hand-over recorded", n.name));
        assert_eq!(k.driver, "none", "{}", n.name);
        assert_eq!(k.kubernetes_version, Some(release.version()), "{}", n.name);
        assert_eq!(k.kubernetes_components, components, "{}", n.name);
    }

    let summary = format!(
        "v1.31.13, {} components (none driver: not installed)",
        components.len()
    );
    let text = asterism_mini::table(record);
    for n in &record.nodes {
        let line = text
            .lines()
            .find(|l| l.starts_with(&n.name))
            .unwrap_or_else(|| panic!("{}: no line in\n{text}", n.name));
        assert!(line.ends_with(&summary), "{line}");
    }

    let out = asterism_children::output(
        Command::new(bins().join("asterism-mini"))
            .args(["status", "--json", "--dir"])
            .arg(&cluster.dir),
    )
    .unwrap();
    assert!(out.status.success(), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let nodes = json["cluster"]["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), record.nodes.len());
    for n in nodes {
        let listed: Vec<asterism_kubernetes_versions::Component> =
            serde_json::from_value(n["kubernetes"]["kubernetes_components"].clone()).unwrap();
        assert_eq!(listed, components, "{}", n["name"]);
        assert_eq!(n["kubernetes"]["kubernetes_version"], "v1.31.13");
    }

    for node in &cluster.nodes {
        let log = std::fs::read_to_string(node.dir.join("log/bootstrapper.log")).unwrap();
        let said = format!(
            "none driver: {} components for v1.31.13 handed over, nothing installed",
            components.len()
        );
        assert!(log.contains(&said), "{}: {log}", node.name);
    }
}

#[test]
fn init_two_joins_verify_and_a_reboot_with_rejoin() {
    let cluster = TestCluster::create(2, 21);
    let rt = runtime();

    let (done, cp) = rt.block_on(cluster.init()).unwrap();
    assert_eq!(cp.1, "ok", "the control-plane bootstrapper exits cleanly");
    cluster.start_key_service().unwrap();
    cluster.start_join_service().unwrap();
    let booting: Vec<_> = cluster.nodes[1..]
        .iter()
        .map(|n| cluster.start_bootstrapper(n).unwrap())
        .collect();
    let mut results = vec![cp];
    for (b, n) in booting.into_iter().zip(&cluster.nodes[1..]) {
        results.push(rt.block_on(cluster.finish_bootstrapper(b, n)).unwrap());
    }
    let record = cluster.record(&done.cluster_id, &results).unwrap();
    for n in &record.nodes {
        assert_eq!(n.exit, "ok", "{n:?}");
        assert!(n.disk_rekeyed, "{n:?}");
    }
    assert_eq!(
        member_names(&cluster),
        ["control-plane-0", "worker-0", "worker-1"]
    );
    handed_the_default_release_and_installed_nothing(&cluster, &record);

    // Independently of our crates: the derived key opens each disk, and it is the only
    // key left (the first-boot passphrase's keyslot is gone).
    for node in &cluster.nodes {
        let key = cluster.derived_disk_key(node).unwrap();
        assert!(cryptsetup_opens(node, key.expose_secret()), "{}", node.name);
        assert_eq!(
            keyslots(node),
            1,
            "{}: only the derived key remains",
            node.name
        );
        assert!(
            !node.dir.join("state/initial.key").exists(),
            "{}",
            node.name
        );
    }

    // `asterism verify` against a worker: fresh evidence, PCR 15 shows this cluster.
    cluster.start_verify_services().unwrap();
    let worker = &cluster.nodes[1];
    verify_node(&cluster, &rt, worker);

    // A reboot of worker-0: its TPM resets (PCRs cleared, AK kept), its bootstrapper starts
    // again, gets a rejoin ticket, unlocks the disk and marks PCR 15 again.
    let mut worker = cluster.nodes[1].clone();
    // The verify service of this node holds no TPM connection between requests; stop it
    // anyway, as a reboot would.
    let mut swtpm = node_swtpm(&worker);
    swtpm.restart().unwrap();
    worker.tcti = swtpm.tcti();
    {
        let mut tpm = asterism_tpm::Tpm::open(&swtpm.tcti().parse().unwrap()).unwrap();
        assert!(!asterism_tpm::marker::is_node_bootstrapped(&mut tpm).unwrap());
    }
    let booting = cluster.start_bootstrapper(&worker).unwrap();
    let (_, exit) = rt
        .block_on(cluster.finish_bootstrapper(booting, &worker))
        .unwrap();
    assert_eq!(exit, "ok");
    let mut tpm = asterism_tpm::Tpm::open(&swtpm.tcti().parse().unwrap()).unwrap();
    let cluster_id: [u8; 32] = hex::decode(&done.cluster_id).unwrap().try_into().unwrap();
    assert_eq!(
        asterism_tpm::marker::read_marker_pcr(&mut tpm).unwrap(),
        asterism_tpm::marker::expected_marker_pcr(&cluster_id),
        "the rejoined node carries this cluster's marker"
    );
    let log = std::fs::read_to_string(worker.dir.join("log/bootstrapper.log")).unwrap();
    assert!(log.to_lowercase().contains("rejoin"), "{log}");
    assert_eq!(
        member_names(&cluster),
        ["control-plane-0", "worker-0", "worker-1"],
        "no second admission"
    );
}

#[test]
fn a_node_whose_pcrs_differ_is_refused_and_receives_nothing() {
    let cluster = TestCluster::create(1, 22);
    let rt = runtime();
    rt.block_on(cluster.init()).unwrap();
    cluster.start_key_service().unwrap();
    cluster.start_join_service().unwrap();

    // The worker runs other software: an enforced PCR differs from the measurements.
    let worker = &cluster.nodes[1];
    {
        let cfg: asterism_tpm::TpmConfig = worker.tcti.parse().unwrap();
        let mut tpm = asterism_tpm::Tpm::open(&cfg).unwrap();
        tpm.extend_pcr(4, &[0x66; 32]).unwrap();
    }
    let booting = cluster.start_bootstrapper(worker).unwrap();
    let js_log = cluster.nodes[0].dir.join("log/join-service.log");
    wait_for(
        "the join service refuses the worker",
        Duration::from_secs(60),
        || {
            std::fs::read_to_string(&js_log)
                .unwrap_or_default()
                .contains("measurement mismatch at index 4")
        },
    );
    drop(booting); // the bootstrapper keeps retrying; the teardown stops it

    assert_eq!(
        member_names(&cluster),
        ["control-plane-0"],
        "only the init node"
    );
    let key = cluster.derived_disk_key(worker).unwrap();
    assert!(
        !cryptsetup_opens(worker, key.expose_secret()),
        "no disk key reached the disk"
    );
    let initial = std::fs::read(worker.dir.join("state/initial.key")).unwrap();
    assert!(cryptsetup_opens(worker, &initial), "the disk is untouched");
    assert_eq!(keyslots(worker), 1, "no key was added");
    for file in [
        "state/kubelet/pki/kubelet-client-crt.pem",
        "state/ssh/ssh_host_cert.pub",
        "state/constellation/node_state.json",
    ] {
        assert!(!worker.dir.join(file).exists(), "{file} must not exist");
    }
    let metrics = std::fs::read_to_string(&js_log).unwrap();
    assert!(!metrics.contains("issued join ticket"), "{metrics}");
}

#[test]
fn nodes_join_after_the_join_service_is_killed_and_restarted() {
    let cluster = TestCluster::create(2, 23);
    let rt = runtime();
    let (done, cp) = rt.block_on(cluster.init()).unwrap();
    cluster.start_key_service().unwrap();

    // Workers boot while no join service answers; then it starts and is killed at once,
    // in the middle of their attempts; then it starts again.
    let booting: Vec<_> = cluster.nodes[1..]
        .iter()
        .map(|n| cluster.start_bootstrapper(n).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    cluster.start_join_service().unwrap();
    cluster.kill_join_service().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    cluster.start_join_service().unwrap();

    let mut results = vec![cp];
    for (b, n) in booting.into_iter().zip(&cluster.nodes[1..]) {
        results.push(rt.block_on(cluster.finish_bootstrapper(b, n)).unwrap());
    }
    let record = cluster.record(&done.cluster_id, &results).unwrap();
    for n in &record.nodes {
        assert_eq!(n.exit, "ok", "{n:?}");
        assert!(n.disk_rekeyed, "{n:?}");
    }
    // Each node admitted exactly once, across both lives of the join service.
    assert_eq!(
        member_names(&cluster),
        ["control-plane-0", "worker-0", "worker-1"]
    );
}

//! The `asterism-join-service` binary: starts from its flags, issues a ticket, serves
//! health and members, and stops with status 0 on SIGTERM; its tickets carry the Kubernetes
//! release the init node recorded, and a recorded release with a bad hash stops it.

use std::net::SocketAddr;

use asterism_testkit::process::{Process, free_port};

use crate::common::*;
use asterism_cluster::Role;
use asterism_join_service::InitNode;
use asterism_kubernetes_versions::{Component, VersionTable};

/// Starts the binary on `cluster` with the embedded state, trusting `fp`, with `extra`
/// arguments; returns it and its join.API address.
fn spawn(
    cluster: &Cluster,
    fp: &asterism_attestation::AkFingerprint,
    extra: &[&std::ffi::OsStr],
) -> (Process, SocketAddr) {
    let (mut command, listen) = join_service_command(cluster, fp);
    let metrics = format!("{CP}:{}", free_port(CP));
    command
        .args(["--metrics-listen", &metrics])
        .arg("--state-dir")
        .arg(cluster.state_dir())
        .args(extra);
    (Process::spawn(&mut command), listen.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_issues_tickets_and_stops_cleanly_on_sigterm() {
    let (node, fp) = soft_node();
    let cluster = Cluster::start().await;
    let (child, addr) = spawn(&cluster, &fp, &[]);
    let ticket = first_ticket(addr, node).await;
    assert_eq!(
        ticket.state_disk_key,
        expected_key(asterism_kms::KeyId::disk(DISK_A).unwrap())
    );
    let (exit, logs) = stop(child).await;
    assert!(exit.success(), "{exit:?}\n{logs}");
    assert!(logs.contains("node joined"), "{logs}");
    assert!(!logs.contains(&ticket.token), "the token is never logged");
    assert!(
        !logs.contains(&hex::encode(&ticket.state_disk_key)),
        "the disk key is never logged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_gce_the_binary_learns_who_a_node_is_from_the_compute_engine_api() {
    let (node, fp) = soft_node();
    let cluster = Cluster::start_on_gce().await;
    let (child, addr) = spawn(&cluster, &fp, &[]);
    let ticket = first_ticket(addr, node).await;
    assert!(!ticket.token.is_empty());
    let (exit, logs) = stop(child).await;
    assert!(exit.success(), "{exit:?}\n{logs}");
    let project = cluster.gce.as_ref().unwrap();
    assert!(
        !project.calls.lock().unwrap().is_empty(),
        "the API was asked"
    );
    assert!(logs.contains("gce://test-project/test"), "{logs}");
    assert!(
        !logs.contains(&project.token),
        "the service account's token is never logged"
    );
}

/// The init node's record as its bootstrapper writes it at init, with `components`.
fn write_init_node(cluster: &Cluster, components: Vec<Component>) -> std::path::PathBuf {
    let record = InitNode {
        disk: DISK_B.into(),
        ak: "a1".repeat(32),
        name: "cp-0".into(),
        role: Role::ControlPlane,
        kubernetes_version: Some("v1.31.13".parse().unwrap()),
        kubernetes_components: components,
    };
    let path = cluster.dir.path().join("init-node.json");
    std::fs::write(&path, record.to_json().unwrap()).unwrap();
    path
}

fn v1_31_components() -> Vec<Component> {
    let table = VersionTable::builtin().unwrap();
    table.select("v1.31.13").unwrap().components().to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tickets_carry_the_version_and_components_the_init_node_recorded() {
    let (node, fp) = soft_node();
    let cluster = Cluster::start().await;
    let components = v1_31_components();
    assert!(!components.is_empty());
    let record = write_init_node(&cluster, components.clone());
    let (child, addr) = spawn(&cluster, &fp, &["--init-node".as_ref(), record.as_os_str()]);
    let ticket = first_ticket(addr, node).await;
    let (exit, logs) = stop(child).await;
    assert!(exit.success(), "{exit:?}\n{logs}");
    assert_eq!(ticket.kubernetes_version, "v1.31.13");
    let carried: Vec<Component> = ticket
        .kubernetes_components
        .into_iter()
        .map(Component::from)
        .collect();
    assert_eq!(carried, components, "exactly the recorded list, in order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_component_with_a_bad_hash_stops_the_service_before_it_listens() {
    let (_, fp) = soft_node();
    let cluster = Cluster::start().await;
    let mut components = v1_31_components();
    // One digit too few: a hash no download can match, refused at start, not at a node.
    components[1].hash.pop();
    let record = write_init_node(&cluster, components.clone());
    let (child, addr) = spawn(&cluster, &fp, &["--init-node".as_ref(), record.as_os_str()]);
    let (exit, logs) = wait(child).await;
    assert!(!exit.success(), "{logs}");
    assert!(
        logs.contains("the Kubernetes release recorded by the init node cp-0")
            && logs.contains("component 1")
            && logs.contains(&components[1].install_path),
        "{logs}"
    );
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "it never listened"
    );
    // Nothing of the record was written either: the init node's disk is still unbound.
    let state = asterism_join_service::RedbState::open(&cluster.state_dir()).unwrap();
    assert!(
        asterism_join_service::ClusterState::members(&state)
            .await
            .unwrap()
            .is_empty()
    );
}

//! The `asterism-join-service` binary: starts from its flags, issues a ticket, serves
//! health and members, and stops with status 0 on SIGTERM.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn free_port(ip: &str) -> u16 {
    std::net::TcpListener::bind(format!("{ip}:0"))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_issues_tickets_and_stops_cleanly_on_sigterm() {
    let (node, fp) = soft_node();
    let cluster = Cluster::start().await;
    let dir = cluster.dir.path();
    std::fs::write(dir.join("salt"), SALT).unwrap();
    std::fs::write(dir.join("measurements.json"), zero_measurements().to_json()).unwrap();
    let listen = format!("{CP}:{}", free_port(CP));
    let metrics = format!("{CP}:{}", free_port(CP));
    let mut child = Command::new(env!("CARGO_BIN_EXE_asterism-join-service"))
        .args(["--listen", &listen, "--metrics-listen", &metrics])
        .args(["--pinned-ak", &fp.to_string()])
        .arg("--measurements")
        .arg(dir.join("measurements.json"))
        .arg("--key-service")
        .arg(format!("unix:{}", cluster.key_socket.display()))
        .args(["--metadata-url", &cluster.metadata_url])
        .arg("--pki-dir")
        .arg(cluster.pki_dir())
        .arg("--measurement-salt-file")
        .arg(dir.join("salt"))
        .arg("--state-dir")
        .arg(cluster.state_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();

    let addr = listen.parse().unwrap();
    let start = Instant::now();
    let ticket = loop {
        match join(
            addr,
            W0,
            node.clone(),
            join_request("worker-0", W0, DISK_A, false),
        )
        .await
        {
            Ok(t) => break t,
            Err(e) if start.elapsed() > Duration::from_secs(30) => panic!("{e:?}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    assert_eq!(
        ticket.state_disk_key,
        expected_key(asterism_kms::KeyId::disk(DISK_A).unwrap())
    );
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let start = Instant::now();
    let exit = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "did not stop");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut logs = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut logs).unwrap();
    assert!(exit.success(), "{exit:?}\n{logs}");
    assert!(logs.contains("node joined"), "{logs}");
    assert!(!logs.contains(&ticket.token), "the token is never logged");
    assert!(
        !logs.contains(&hex::encode(&ticket.state_disk_key)),
        "the disk key is never logged"
    );
}

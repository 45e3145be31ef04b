//! The `asterism-metadata` program: it serves its configuration file over HTTP (`/self` by
//! the caller's source address, checked with the library's client) and stops on SIGTERM.

#![cfg(test)] // all of it test code: clippy.toml's test allowances cover its helpers too

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use asterism_metadata::{HttpMetadata, Metadata, MetadataConfig, Role};

fn config() -> MetadataConfig {
    let instance = asterism_testkit::metadata::instance;
    MetadataConfig {
        instances: vec![
            instance("cp-0", Role::ControlPlane, "127.0.10.1"),
            instance("worker-1", Role::Worker, "127.0.10.3"),
        ],
        init_secret_hash: "$2b$10$0123456789012345678901uJ3d4f5g6h7j8k9l0z1x2c3v4b5n6m".into(),
    }
}

fn client(addr: SocketAddr, from: &str) -> HttpMetadata {
    HttpMetadata::new(&format!("http://{addr}"))
        .unwrap()
        .with_local_address(from.parse::<IpAddr>().unwrap())
}

#[test]
fn the_binary_serves_its_config_file_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metadata.json");
    std::fs::write(&path, serde_json::to_vec(&config()).unwrap()).unwrap();
    let port = std::net::TcpListener::bind("127.0.10.254:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: SocketAddr = format!("127.0.10.254:{port}").parse().unwrap();
    let mut child = asterism_children::spawn(
        std::process::Command::new(env!("CARGO_BIN_EXE_asterism-metadata"))
            .args(["--listen", &addr.to_string(), "--config"])
            .arg(&path)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null()),
    )
    .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let me = rt.block_on(async {
        let c = client(addr, "127.0.10.3");
        let start = std::time::Instant::now();
        loop {
            match c.self_instance().await {
                Ok(me) => break me,
                Err(e) if start.elapsed() > Duration::from_secs(20) => panic!("{e:?}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    });
    assert_eq!(me.name, "worker-1");
    let status = asterism_children::status(
        std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]),
    )
    .unwrap();
    assert!(status.success());
    let start = std::time::Instant::now();
    let exit = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(start.elapsed() < Duration::from_secs(15), "did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(exit.success(), "{exit:?}");
}

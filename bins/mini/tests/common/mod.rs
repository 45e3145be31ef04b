//! What the end-to-end tests of local clusters share: where the workspace's binaries are,
//! a teardown that stops a cluster even when a test fails, a runtime, and an independent
//! key check with the cryptsetup program (`asterism_testkit::luks`).

#![allow(dead_code)]

use asterism_mini::{LocalCluster, Node};

use std::path::PathBuf;

/// The directory of the workspace's binaries, built next to `asterism-mini` (`cargo test
/// --workspace` or `cargo build --workspace --bins` builds them all, `asterism` among them).
pub fn bins() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_asterism-mini"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A local cluster in a temporary directory (`workers` workers, loopback network
/// `127.0.<net>.0/24`), stopped when dropped, even when the test fails, and then deleted.
pub struct TestCluster {
    cluster: LocalCluster,
    dir: tempfile::TempDir,
}

impl TestCluster {
    pub fn create(workers: usize, net: u8) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let cluster = LocalCluster::create(&dir.path().join("c"), workers, net, bins()).unwrap();
        Self { cluster, dir }
    }

    /// A directory for the test's own files, beside the cluster's and deleted with it.
    pub fn scratch_dir(&self) -> &std::path::Path {
        self.dir.path()
    }
}

impl std::ops::Deref for TestCluster {
    type Target = LocalCluster;

    fn deref(&self) -> &LocalCluster {
        &self.cluster
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        let _ = self.cluster.down();
    }
}

/// Stops every process of the cluster, even when the test fails.
pub struct Teardown<'a>(pub &'a LocalCluster);

impl Drop for Teardown<'_> {
    fn drop(&mut self) {
        let _ = self.0.down();
    }
}

/// Stops every process of the cluster in a directory, even when the test fails; for tests
/// that change the cluster (so cannot lend it to [`Teardown`]).
pub struct TeardownAt(pub PathBuf);

impl Drop for TeardownAt {
    fn drop(&mut self) {
        if self.0.exists() {
            let _ = asterism_mini::down(asterism_mini::DirArgs {
                dir: self.0.clone(),
            });
        }
    }
}

/// After init: starts the key and join services, and the first worker joins.
pub fn join_worker(cluster: &LocalCluster, rt: &tokio::runtime::Runtime) {
    cluster.start_key_service().unwrap();
    cluster.start_join_service().unwrap();
    let worker = &cluster.nodes[1];
    let b = cluster.start_bootstrapper(worker).unwrap();
    let (_, exit) = rt.block_on(cluster.finish_bootstrapper(b, worker)).unwrap();
    assert_eq!(exit, "ok", "{} joins", worker.name);
}

/// `asterism verify` against `node`'s verify service: fresh evidence from its TPM,
/// checked against the cluster's measurements (PCR 15 included) and platform CA.
pub fn verify_node(cluster: &LocalCluster, rt: &tokio::runtime::Runtime, node: &Node) {
    rt.block_on(asterism::verify::run(asterism::verify::Args::for_node(
        &format!("{}:9090", node.ip),
        &cluster.workspace,
        &cluster.platform_ca,
        &cluster.measurements,
    )))
    .unwrap();
}

/// A single-threaded runtime for the cluster's async steps.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// `cryptsetup open --test-passphrase` on the node's image with `key` on stdin: whether the
/// key opens the disk, checked with the program itself, independently of our crates.
pub fn cryptsetup_opens(node: &Node, key: &[u8]) -> bool {
    asterism_testkit::luks::opens(&node.dir.join("state.img"), key)
}

/// The running swtpm of `node` (its state under `tpm/`, its pid and sockets under `run/`).
pub fn node_swtpm(node: &Node) -> asterism_swtpm::SwtpmProcess {
    let cfg = asterism_swtpm::SwtpmConfig::new(node.dir.join("tpm"))
        .unwrap()
        .with_run_dir(node.dir.join("run"))
        .unwrap();
    asterism_swtpm::SwtpmProcess::attach(&cfg).unwrap()
}

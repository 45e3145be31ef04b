//! A node for the tests: a real swtpm, a real LUKS2 image file driven by cryptsetup, real
//! aTLS on loopback, real bcrypt; metadata in memory.

#![allow(dead_code)]

pub mod init_helpers;

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use asterism_atls::{AtlsConfig, AtlsConnector};
use asterism_attestation::{Measurements, TpmQuoteValidator};
use asterism_bootstrapper::{
    Config, Failure, JoinServiceTrust, KubernetesDriver, Listeners, LogBuffer, LuksDisk, Node,
    NodeDir, NoneDriver, Outcome, TpmMarker, UnlockMode,
};
use asterism_disk::{DiskConfig, FileSystemConfig, Integrity, Pbkdf, StateDisk, StateFileSystem};
use asterism_metadata::StaticMetadata;
use asterism_testkit::{Swtpm, pin};
use asterism_tpm::{PcrSelection, Tpm};
use tonic::transport::Channel;

pub const INIT_SECRET: &[u8] = b"correct horse battery staple";

/// A bcrypt hash of [`INIT_SECRET`] (cost 4: cheap, still real bcrypt).
pub fn init_secret_hash() -> String {
    bcrypt::hash(INIT_SECRET, 4).unwrap()
}

#[allow(unused_imports)]
pub use asterism_testkit::metadata::instance;

/// One test node.
pub struct TestNode {
    pub swtpm: Swtpm,
    pub dir: tempfile::TempDir,
    pub node_dir: NodeDir,
    pub ip: IpAddr,
    /// The port of the InitServer's listener bound last (0 before [`TestNode::run`]).
    init_port: AtomicU16,
    /// The port of the recovery server's listener bound last.
    recover_port: AtomicU16,
    pub ak_public: Vec<u8>,
}

impl TestNode {
    pub fn new(ip: &str) -> Self {
        let swtpm = Swtpm::start().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let node_dir = NodeDir::new(dir.path().join("node"));
        let ip: IpAddr = ip.parse().unwrap();
        let issuer = swtpm.held_issuer().unwrap();
        let ak_public = issuer.ak_public().to_vec();
        Self {
            swtpm,
            dir,
            node_dir,
            ip,
            init_port: AtomicU16::new(0),
            recover_port: AtomicU16::new(0),
            ak_public,
        }
    }

    pub fn disk_config(&self) -> DiskConfig {
        DiskConfig {
            pbkdf: Pbkdf::FAST_FOR_TESTS,
            integrity: Integrity::None,
            scratch_dir: self.node_dir.run(),
            device_mapper_control: self.dir.path().join("no-device-mapper"),
            ..DiskConfig::local()
        }
    }

    pub fn image(&self) -> PathBuf {
        self.node_dir.state_image()
    }

    /// The node, with `metadata` and `driver`.
    pub fn node(
        &self,
        metadata: StaticMetadata,
        driver: Arc<dyn KubernetesDriver>,
        join_port: u16,
        join_service: Option<JoinServiceTrust>,
    ) -> Arc<Node<StaticMetadata>> {
        self.node_with_logs(
            metadata,
            driver,
            join_port,
            join_service,
            LogBuffer::default(),
        )
    }

    /// Like [`TestNode::node`], with the log buffer a failed Init streams back.
    pub fn node_with_logs(
        &self,
        metadata: StaticMetadata,
        driver: Arc<dyn KubernetesDriver>,
        join_port: u16,
        join_service: Option<JoinServiceTrust>,
        logs: LogBuffer,
    ) -> Arc<Node<StaticMetadata>> {
        self.node_configured(metadata, driver, join_port, join_service, logs, |_| {})
    }

    /// Like [`TestNode::node_with_logs`], with `edit` applied to the configuration last.
    pub fn node_configured(
        &self,
        metadata: StaticMetadata,
        driver: Arc<dyn KubernetesDriver>,
        join_port: u16,
        join_service: Option<JoinServiceTrust>,
        logs: LogBuffer,
        edit: impl FnOnce(&mut Config),
    ) -> Arc<Node<StaticMetadata>> {
        asterism_bootstrapper::prepare_state_image(&self.image(), 32 * 1024 * 1024).unwrap();
        asterism_bootstrapper::files::create_dirs(&self.node_dir.run()).unwrap();
        let disk = StateDisk::open(self.image(), self.disk_config()).unwrap();
        let mut config = Config::new(self.node_dir.clone(), self.ip);
        config.join_port = join_port;
        config.retry_interval = Duration::from_millis(200);
        config.rpc_timeout = Duration::from_secs(10);
        if let Some(trust) = join_service {
            config.join_service = trust;
        }
        edit(&mut config);
        Arc::new(Node::new(
            config,
            Arc::new(TpmMarker::new(self.swtpm.config())),
            Arc::new(LuksDisk::new(disk, UnlockMode::KeyCheck)),
            // Never used: a disk opened by a key check is not mapped.
            Arc::new(StateFileSystem::new(&FileSystemConfig::default())),
            Arc::new(self.swtpm.held_issuer().unwrap()),
            metadata,
            driver,
            logs,
        ))
    }

    /// The InitServer's port (of the listener [`TestNode::run`] bound last).
    pub fn init_port(&self) -> u16 {
        self.init_port.load(Ordering::SeqCst)
    }

    /// The recovery server's port (of the listener [`TestNode::run`] bound last).
    pub fn recover_port(&self) -> u16 {
        self.recover_port.load(Ordering::SeqCst)
    }

    /// Points [`TestNode::init_channel`] at `port` (an InitServer this test did not bind).
    pub fn use_init_port(&self, port: u16) {
        self.init_port.store(port, Ordering::SeqCst);
    }

    /// Runs the bootstrapper on `node` with an InitServer listener on this node's address
    /// and a port the system picks.
    pub fn run(
        &self,
        node: Arc<Node<StaticMetadata>>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> impl Future<Output = Result<Outcome, Failure>> + Send + 'static {
        let bind = |port: &AtomicU16| {
            let listener = std::net::TcpListener::bind(SocketAddr::new(self.ip, 0)).unwrap();
            listener.set_nonblocking(true).unwrap();
            port.store(listener.local_addr().unwrap().port(), Ordering::SeqCst);
            tokio::net::TcpListener::from_std(listener).unwrap()
        };
        let listeners = Listeners {
            init: bind(&self.init_port),
            recover: bind(&self.recover_port),
        };
        asterism_bootstrapper::run(node, listeners, shutdown)
    }

    pub fn none_driver() -> Arc<dyn KubernetesDriver> {
        Arc::new(NoneDriver::new())
    }

    /// `read` on a new connection to the node's swtpm, tried again on failure (at most 20
    /// times, 100 ms apart), in case a read meets swtpm between two clients under load.
    /// (A swtpm that stopped answering for minutes was a child holding its connection:
    /// `asterism_children`.) Only for reads: a retried extend could extend twice.
    fn read_tpm<T, E: std::fmt::Debug>(&self, read: impl Fn(&mut Tpm) -> Result<T, E>) -> T {
        let mut last = String::new();
        for _ in 0..20 {
            match Tpm::open(&self.swtpm.config()) {
                Ok(mut tpm) => match read(&mut tpm) {
                    Ok(value) => return value,
                    Err(e) => last = format!("{e:?}"),
                },
                Err(e) => last = format!("{e:?}"),
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        panic!("reading the node's TPM failed 20 times; the last time: {last}")
    }

    /// PCR 15 of the node's TPM.
    pub fn pcr15(&self) -> [u8; 32] {
        self.read_tpm(asterism_tpm::marker::read_marker_pcr)
    }

    /// A validator that accepts this node's TPM with PCR 15 all zero (a fresh node).
    pub fn validator(&self) -> Arc<TpmQuoteValidator> {
        self.validator_with(|_| true)
    }

    /// A validator for this node's AK and its current PCRs whose index passes `keep`.
    pub fn validator_with(&self, keep: impl Fn(u32) -> bool) -> Arc<TpmQuoteValidator> {
        Arc::new(TpmQuoteValidator::new(
            pin(&self.ak_public),
            self.measurements_with(keep).into_provider(),
        ))
    }

    /// This node's PCRs 0–7 and 15 as they are now, those whose index passes `keep`.
    pub fn measurements_with(&self, keep: impl Fn(u32) -> bool) -> Measurements {
        let pcrs = self.read_tpm(|tpm| tpm.read_pcrs(&PcrSelection::all()));
        let entries: Vec<String> = pcrs
            .iter()
            .filter(|(i, _)| (*i <= 7 || *i == 15) && keep(*i))
            .map(|(i, v)| format!("\"{i}\": \"{}\"", hex::encode(v)))
            .collect();
        let json = format!("{{\"measurements\": {{{}}}}}", entries.join(", "));
        Measurements::from_json(json.as_bytes()).unwrap()
    }

    /// A measurements file (JSON) of this node's PCRs as they are now, those whose index
    /// passes `keep`.
    pub fn measurements_json(&self, keep: impl Fn(u32) -> bool) -> String {
        let pcrs = self.read_tpm(|tpm| tpm.read_pcrs(&PcrSelection::all()));
        let entries: Vec<String> = pcrs
            .iter()
            .filter(|(i, _)| keep(*i))
            .map(|(i, v)| format!("\"{i}\": \"{}\"", hex::encode(v)))
            .collect();
        format!("{{\"measurements\": {{{}}}}}", entries.join(", "))
    }

    /// Trust in this node as the join service of `cluster_id`: its AK (pinned), PCRs 0–7 as
    /// they are now, and PCR 15 as the marker of `cluster_id`.
    /// Tickets must be signed as `identity` says.
    pub fn join_service_trust(
        &self,
        cluster_id: asterism_kms::ClusterId,
        identity: asterism_bootstrapper::ControlPlaneIdentity,
    ) -> JoinServiceTrust {
        let json = self.measurements_json(|i| i <= 7);
        let measurements = Measurements::from_json(json.as_bytes()).unwrap();
        JoinServiceTrust::cluster(
            pin(&self.ak_public),
            measurements.into_provider(),
            cluster_id,
            identity,
        )
        .unwrap()
    }

    /// Marks PCR 15 of this node's TPM with `cluster_id`, as an initialised node has it.
    pub fn mark(&self, cluster_id: &asterism_kms::ClusterId) {
        let mut tpm = Tpm::open(&self.swtpm.config()).unwrap();
        asterism_tpm::marker::mark_node_bootstrapped(&mut tpm, cluster_id.as_bytes()).unwrap();
    }

    /// An aTLS channel to the node's InitServer that verifies the node first.
    pub async fn init_channel(&self) -> Channel {
        self.attested_channel(self.init_port(), "the InitServer")
            .await
    }

    /// An aTLS channel to the node's server on `port` (`what`, for the failure message)
    /// that verifies the node first; retried for a minute while the server starts.
    pub async fn attested_channel(&self, port: u16, what: &str) -> Channel {
        let connector = AtlsConnector::new(AtlsConfig::verifying(self.validator())).unwrap();
        let addr = SocketAddr::new(self.ip, port);
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            match tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect_with_connector(connector.clone())
                .await
            {
                Ok(channel) => return channel,
                Err(_) if std::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("cannot reach {what}: {e:?}"),
            }
        }
    }
}

/// A TPM issuer on `swtpm` (a connection of its own).
// Not every test program uses each.
#[allow(unused_imports)]
pub use asterism_testkit::luks::{opens, token0, uuid as luks_uuid};

//! What the bootstrapper is told: its configuration, checked once, and its defaults.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::limits::InitLimits;
use crate::trust::JoinServiceTrust;
use asterism_cluster::NodeDir;

/// The InitServer port (the port the owner's CLI dials).
pub const DEFAULT_INIT_PORT: u16 = 9000;
/// The join service's node port on control-plane nodes.
pub const DEFAULT_JOIN_PORT: u16 = 30090;
/// The pause between join rounds and metadata attempts.
pub const DEFAULT_RETRY_INTERVAL: Duration = Duration::from_secs(30);
/// The deadline of one metadata call or join-ticket RPC.
pub const DEFAULT_RPC_TIMEOUT: Duration = Duration::from_secs(30);
/// The deadline of everything after the node lock.
pub const DEFAULT_ACTIVATION_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// The size of a new state disk image (sparse).
pub const DEFAULT_STATE_DISK_SIZE: u64 = 64 * 1024 * 1024;
/// The directories a join ticket's Kubernetes components may install into: the node's
/// binaries, the CNI plugins and kubeadm's patches, as the versions table places them.
/// Nothing a ticket names may land anywhere else.
pub const DEFAULT_COMPONENTS_DIRS: [&str; 3] =
    ["/run/state/bin", "/opt/cni/bin", "/opt/kubernetes/patches"];
/// The size of one `log` chunk of a failed Init (docs/bootstrapper.md).
pub const LOG_CHUNK_SIZE: usize = 1024;

/// Everything the bootstrapper is told, checked once.
#[derive(Clone)]
pub struct Config {
    /// The node directory.
    pub node_dir: NodeDir,
    /// The node's address: servers bind to it, outgoing connections come from it.
    pub node_ip: IpAddr,
    /// The join service port on control-plane nodes.
    pub join_port: u16,
    /// Pause between join (and rejoin, and metadata) attempts.
    pub retry_interval: Duration,
    /// Deadline of one metadata call, aTLS connect or join RPC.
    pub rpc_timeout: Duration,
    /// Deadline of the whole activation after the node lock.
    pub activation_timeout: Duration,
    /// The size of a new state disk image.
    pub state_disk_size: u64,
    /// Which join services the node trusts (and whether it joins at all).
    pub join_service: JoinServiceTrust,
    /// The fixed directories a join ticket's Kubernetes components may install into.
    pub components_dirs: Vec<PathBuf>,
    /// What the InitServer lets unauthenticated callers do (connections and Init calls).
    pub init_limits: InitLimits,
    /// This node's attestation key identity as verifiers report it (SHA-256 of the AK's
    /// public area, hex): recorded at init with the disk UUID, so that the join service
    /// binds the first node's disk to it.
    pub ak_identity: Option<String>,
    /// Whether the recovery server accepts the master-secret request form (`kms_uri`), which
    /// carries the cluster's master secret (logged at warn on every use). Off: only the two derived
    /// keys are accepted.
    pub insecure_accept_master_secret: bool,
    /// Whether this node, as the first control plane, hosts the cluster's key and join
    /// services outside Kubernetes: the init request must then configure them, and their
    /// secrets are kept on the (mapped, encrypted) state disk.
    pub host_cluster_services: bool,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("node_dir", &self.node_dir)
            .field("node_ip", &self.node_ip)
            .field("join_port", &self.join_port)
            .field("retry_interval", &self.retry_interval)
            .field("rpc_timeout", &self.rpc_timeout)
            .field("activation_timeout", &self.activation_timeout)
            .field("state_disk_size", &self.state_disk_size)
            .field("join_service", &self.join_service)
            .field("components_dirs", &self.components_dirs)
            .field("init_limits", &self.init_limits)
            .field("ak_identity", &self.ak_identity)
            .field(
                "insecure_accept_master_secret",
                &self.insecure_accept_master_secret,
            )
            .field("host_cluster_services", &self.host_cluster_services)
            .finish()
    }
}

impl Config {
    /// Defaults for a node at `node_ip` with directory `node_dir`.
    #[must_use]
    pub fn new(node_dir: NodeDir, node_ip: IpAddr) -> Self {
        Self {
            node_dir,
            node_ip,
            join_port: DEFAULT_JOIN_PORT,
            retry_interval: DEFAULT_RETRY_INTERVAL,
            rpc_timeout: DEFAULT_RPC_TIMEOUT,
            activation_timeout: DEFAULT_ACTIVATION_TIMEOUT,
            state_disk_size: DEFAULT_STATE_DISK_SIZE,
            join_service: JoinServiceTrust::init_only(),
            components_dirs: DEFAULT_COMPONENTS_DIRS.iter().map(PathBuf::from).collect(),
            init_limits: InitLimits::default(),
            ak_identity: None,
            insecure_accept_master_secret: false,
            host_cluster_services: false,
        }
    }
}

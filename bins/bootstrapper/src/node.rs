//! The node: its configuration, its effects, and the steps both flows take after the node
//! lock (the point of no return).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use asterism_attestation::Issuer;
use asterism_disk::{DataKey, DiskError};
use asterism_kms::{DeriveError, KeyIdError};
use asterism_metadata::Metadata;
use tracing::{info, warn};

use crate::effects::{DiskOps, DriverError, KubernetesDriver, MarkError, NodeMarker};
use crate::files::{self, FileError};
use crate::lock::{LockError, NodeLock};
use crate::logbuf::LogBuffer;
use crate::node_state::{NodeDir, NodeStateError, Role};
use crate::pki::PkiError;

/// The InitServer port (REFERENCE §1.1).
pub const DEFAULT_INIT_PORT: u16 = 9000;
/// The join service node port (REFERENCE §1.1).
pub const DEFAULT_JOIN_PORT: u16 = 30090;
/// The original's interval between join rounds and metadata attempts (REFERENCE §4.1).
pub const DEFAULT_RETRY_INTERVAL: Duration = Duration::from_secs(30);
/// The deadline of one metadata call or join-ticket RPC (REFERENCE §4.1).
pub const DEFAULT_RPC_TIMEOUT: Duration = Duration::from_secs(30);
/// The deadline of everything after the node lock (REFERENCE §4.1 `joinTimeout`).
pub const DEFAULT_ACTIVATION_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// The size of a new state disk image (sparse).
pub const DEFAULT_STATE_DISK_SIZE: u64 = 64 * 1024 * 1024;
/// The directories a join ticket's Kubernetes components may install into: the node's
/// binaries, the CNI plugins and kubeadm's patches, as the versions table places them.
/// Nothing a ticket names may land anywhere else.
pub const DEFAULT_COMPONENTS_DIRS: [&str; 3] =
    ["/run/state/bin", "/opt/cni/bin", "/opt/kubernetes/patches"];
/// The size of one `log` chunk of a failed Init (REFERENCE §3.7).
pub const LOG_CHUNK_SIZE: usize = 1024;

/// Everything the bootstrapper is told, checked once.
#[derive(Clone)]
pub struct Config {
    /// The node directory.
    pub node_dir: NodeDir,
    /// The node's address: servers bind to it, outgoing connections come from it.
    pub node_ip: IpAddr,
    /// The InitServer port.
    pub init_port: u16,
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
    pub join_service: crate::trust::JoinServiceTrust,
    /// The fixed directories a join ticket's Kubernetes components may install into.
    pub components_dirs: Vec<PathBuf>,
    /// What the InitServer lets unauthenticated callers do (connections and Init calls).
    pub init_limits: crate::limits::InitLimits,
    /// This node's attestation key identity as verifiers report it (SHA-256 of the AK's
    /// public area, hex): recorded at init with the disk UUID, so that the join service
    /// binds the first node's disk to it.
    pub ak_identity: Option<String>,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("node_dir", &self.node_dir)
            .field("node_ip", &self.node_ip)
            .field("init_port", &self.init_port)
            .field("join_port", &self.join_port)
            .field("retry_interval", &self.retry_interval)
            .field("rpc_timeout", &self.rpc_timeout)
            .field("activation_timeout", &self.activation_timeout)
            .field("state_disk_size", &self.state_disk_size)
            .field("join_service", &self.join_service)
            .field("components_dirs", &self.components_dirs)
            .field("init_limits", &self.init_limits)
            .field("ak_identity", &self.ak_identity)
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
            init_port: DEFAULT_INIT_PORT,
            join_port: DEFAULT_JOIN_PORT,
            retry_interval: DEFAULT_RETRY_INTERVAL,
            rpc_timeout: DEFAULT_RPC_TIMEOUT,
            activation_timeout: DEFAULT_ACTIVATION_TIMEOUT,
            state_disk_size: DEFAULT_STATE_DISK_SIZE,
            join_service: crate::trust::JoinServiceTrust::init_only(),
            components_dirs: DEFAULT_COMPONENTS_DIRS.iter().map(PathBuf::from).collect(),
            init_limits: crate::limits::InitLimits::default(),
            ak_identity: None,
        }
    }
}

/// A step of a flow failed.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    /// A state disk operation failed.
    #[error("state disk")]
    Disk(#[from] DiskError),
    /// A file could not be read or written.
    #[error(transparent)]
    File(#[from] FileError),
    /// The node state file is missing or malformed.
    #[error(transparent)]
    NodeState(#[from] NodeStateError),
    /// PCR 15 could not be read or extended.
    #[error("node marker")]
    Marker(#[from] MarkError),
    /// The node lock was taken but the node could not be marked.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// A key derivation failed.
    #[error("key derivation")]
    Derive(#[from] DeriveError),
    /// A key ID could not be formed.
    #[error("key ID")]
    KeyId(#[from] KeyIdError),
    /// The Kubernetes driver failed.
    #[error("Kubernetes driver")]
    Driver(#[from] DriverError),
    /// A certificate or key could not be made.
    #[error(transparent)]
    Pki(#[from] PkiError),
    /// A join service could not be reached.
    #[error(transparent)]
    Dial(#[from] crate::dial::DialError),
    /// A join or rejoin ticket is unusable.
    #[error("ticket: {0}")]
    Ticket(String),
    /// The activation did not finish in time.
    #[error("did not finish within {0:?}")]
    Timeout(Duration),
    /// A blocking task died.
    #[error("a background task failed: {0}")]
    Task(String),
}

/// Runs `f` on a blocking thread.
pub(crate) async fn blocking<T, E>(
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, StepError>
where
    T: Send + 'static,
    E: Into<StepError> + Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StepError::Task(e.to_string()))?
        .map_err(Into::into)
}

/// What metadata says about this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The instance name (the Kubernetes node name).
    pub name: String,
    /// The node's role.
    pub role: Role,
}

/// A node and its effects. Built once by the program (or a test) and shared by the flows.
pub struct Node<M> {
    pub(crate) config: Config,
    pub(crate) marker: Arc<dyn NodeMarker>,
    pub(crate) disk: Arc<dyn DiskOps>,
    pub(crate) issuer: Arc<dyn Issuer>,
    pub(crate) metadata: M,
    pub(crate) driver: Arc<dyn KubernetesDriver>,
    pub(crate) logs: LogBuffer,
    pub(crate) lock: NodeLock,
    pub(crate) identity: OnceLock<Identity>,
}

impl<M> std::fmt::Debug for Node<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("config", &self.config)
            .field("driver", &self.driver.name())
            .field("lock", &self.lock)
            .finish_non_exhaustive()
    }
}

impl<M: Metadata + 'static> Node<M> {
    /// A node with its effects: the node marker (PCR 15), the state disk, the attestation
    /// issuer, the metadata client, the Kubernetes driver and the log buffer that failed
    /// Inits stream back.
    pub fn new(
        config: Config,
        marker: Arc<dyn NodeMarker>,
        disk: Arc<dyn DiskOps>,
        issuer: Arc<dyn Issuer>,
        metadata: M,
        driver: Arc<dyn KubernetesDriver>,
        logs: LogBuffer,
    ) -> Self {
        Self {
            lock: NodeLock::new(marker.clone()),
            config,
            marker,
            disk,
            issuer,
            metadata,
            driver,
            logs,
            identity: OnceLock::new(),
        }
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The node directory.
    pub(crate) fn dir(&self) -> &NodeDir {
        &self.config.node_dir
    }

    /// Re-keys the state disk from the first-boot passphrase to `new` (REFERENCE §10.8),
    /// then removes the first-boot passphrase file: it opens nothing any more.
    pub(crate) async fn rekey_disk(&self, new: DataKey) -> Result<(), StepError> {
        let path = self.dir().initial_key();
        let old = files::read_capped(&path, 1024)?;
        let old =
            DataKey::new(old).map_err(|_| StepError::Ticket("empty first-boot key".into()))?;
        let disk = self.disk.clone();
        blocking(move || disk.replace_passphrase(&old, &new)).await?;
        info!(
            step = "disk",
            "re-keyed the state disk with the cluster-derived key"
        );
        if let Err(e) = std::fs::remove_file(&path) {
            warn!(error = %e, "cannot remove the first-boot passphrase file");
        }
        Ok(())
    }

    /// Marks the state disk for reset after a failure past the point of no return
    /// (REFERENCE §14 item 4: the original left such nodes half-initialised).
    pub(crate) async fn reset_after_failure(&self, error: &StepError) {
        tracing::error!(error = %chain(error), "a step after the point of no return failed; marking the state disk for reset");
        let disk = self.disk.clone();
        match blocking(move || disk.mark_for_reset()).await {
            Ok(()) => warn!(
                "the state disk is marked for reset: the next boot formats it; reboot the node (reset its TPM) to start over"
            ),
            Err(e) => tracing::error!(error = %chain(&e), "cannot mark the state disk for reset"),
        }
    }
}

/// An error with its causes, `a: b: c`.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        out.push_str(": ");
        out.push_str(&e.to_string());
        source = e.source();
    }
    out
}

pub(crate) use error_chain as chain;

/// Checks a control-plane file name from a join ticket: a relative path of plain
/// components (`ca.crt`, `etcd/ca.key`), nothing that could leave the PKI directory.
pub(crate) fn safe_relative_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name.split('/').all(|c| {
            !c.is_empty()
                && c != "."
                && c != ".."
                && c.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-+".contains(&b))
        })
}

/// Whether `path` exists (a missing file is `false`; any other error is `true` so that it
/// surfaces on the read).
pub(crate) fn exists(path: &Path) -> bool {
    !matches!(std::fs::metadata(path), Err(e) if e.kind() == std::io::ErrorKind::NotFound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_plane_file_names_cannot_leave_the_pki_directory() {
        for ok in ["ca.crt", "etcd/ca.key", "front-proxy-ca.crt", "sa.pub"] {
            assert!(safe_relative_name(ok), "{ok}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "etcd/../../x",
            "a//b",
            "./a",
            "a b",
        ] {
            assert!(!safe_relative_name(bad), "{bad}");
        }
    }
}

//! The external effects the bootstrapper has, each behind a narrow trait: the node marker
//! (PCR 15 of the TPM), the state disk (cryptsetup) and its file system (mke2fs, mount),
//! and Kubernetes (a driver).
//!
//! All of them are blocking or slow; the flows call the blocking ones on blocking threads.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use asterism_cluster::{BootstrapToken, Role};
use asterism_components::{CheckedComponents, Component, ComponentError};
use asterism_disk::{
    DataKey, DiskError, DiskUuid, FileSystemError, StateDisk, StateFileSystem, Unlocked,
};
use asterism_kms::ClusterId;
use asterism_kubeadm::setup::ControlPlaneFile;
use asterism_kubernetes_versions::KubernetesVersion;
use asterism_tpm::marker::{self, MarkerError};
use asterism_tpm::{Tpm, TpmConfig, TpmError};
use futures::future::BoxFuture;
use zeroize::Zeroizing;

/// The node marker: PCR 15, all zero until the node takes the node lock, then extended
/// with the cluster ID (docs/bootstrapper.md).
pub trait NodeMarker: Send + Sync {
    /// Whether the node has been marked (PCR 15 is not all zero).
    fn is_marked(&self) -> Result<bool, MarkError>;
    /// Extends the cluster ID into PCR 15.
    fn mark(&self, cluster_id: &ClusterId) -> Result<(), MarkError>;
}

/// Why the marker could not be read or set.
#[derive(Debug, thiserror::Error)]
pub enum MarkError {
    /// The TPM could not be opened.
    #[error("cannot open the TPM")]
    Open(#[source] TpmError),
    /// Reading or extending PCR 15 failed.
    #[error(transparent)]
    Marker(#[from] MarkerError),
}

/// The marker on a TPM, opened for each operation (the TPM is shared with the attestation
/// issuer, which holds its own connection).
#[derive(Debug, Clone)]
pub struct TpmMarker {
    config: TpmConfig,
}

impl TpmMarker {
    /// The marker of the TPM `config` names.
    #[must_use]
    pub fn new(config: TpmConfig) -> Self {
        Self { config }
    }
}

impl NodeMarker for TpmMarker {
    fn is_marked(&self) -> Result<bool, MarkError> {
        let mut tpm = Tpm::open(&self.config).map_err(MarkError::Open)?;
        Ok(marker::is_node_bootstrapped(&mut tpm)?)
    }

    fn mark(&self, cluster_id: &ClusterId) -> Result<(), MarkError> {
        let mut tpm = Tpm::open(&self.config).map_err(MarkError::Open)?;
        Ok(marker::mark_node_bootstrapped(
            &mut tpm,
            cluster_id.as_bytes(),
        )?)
    }
}

/// The state disk operations the bootstrapper needs (docs/disk.md).
pub trait DiskOps: Send + Sync {
    /// Whether the disk holds an initialized state disk.
    fn is_initialized(&self) -> Result<bool, DiskError>;
    /// Formats a new disk with `passphrase` in its first keyslot; returns its UUID.
    fn format_new(&self, passphrase: &DataKey) -> Result<DiskUuid, DiskError>;
    /// The LUKS UUID, lower case.
    fn uuid(&self) -> Result<DiskUuid, DiskError>;
    /// Replaces `old` by `new` safely and marks the disk initialized.
    fn replace_passphrase(&self, old: &DataKey, new: &DataKey) -> Result<(), DiskError>;
    /// Marks the disk for reset: the next boot formats it.
    fn mark_for_reset(&self) -> Result<(), DiskError>;
    /// Unlocks the disk: maps it, or (without device-mapper, or when mapping is not
    /// wanted) checks the key.
    fn unlock(&self, passphrase: &DataKey) -> Result<Unlocked, DiskError>;
    /// Whether `passphrase` opens a keyslot of the disk; changes nothing (a refused
    /// recovery key must leave the disk as it was).
    fn check_key(&self, passphrase: &DataKey) -> Result<bool, DiskError>;
    /// Whether [`DiskOps::unlock`] maps the disk (where the kernel has device-mapper), so
    /// that `state/` becomes the mount point of its file system. Decides, before the first
    /// boot's format, that the first-boot passphrase is kept outside `state/`.
    fn maps(&self) -> bool;
}

/// The state disk's file system: made on the first boot and mounted on `state/` on every
/// boot, once the disk is mapped. Without a mapping (no device-mapper: local mode) it is
/// never used, and `state/` is a plain directory that stands for the disk.
pub trait StateMount: Send + Sync {
    /// Makes a new, empty file system on `device`, the mapping of a disk formatted in this
    /// boot.
    fn make_file_system(&self, device: &Path) -> Result<(), FileSystemError>;
    /// Mounts the file system on `device` at `target`.
    fn mount(&self, device: &Path, target: &Path) -> Result<(), FileSystemError>;
}

impl StateMount for StateFileSystem {
    fn make_file_system(&self, device: &Path) -> Result<(), FileSystemError> {
        self.make(device)
    }

    fn mount(&self, device: &Path, target: &Path) -> Result<(), FileSystemError> {
        StateFileSystem::mount(self, device, target)
    }
}

/// How [`LuksDisk`] unlocks a disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnlockMode {
    /// Check the key against the validated header; map nothing. Local mode, where the node
    /// directory's `state/` stands for the mounted disk.
    KeyCheck,
    /// Map the disk with device-mapper (falling back to a key check where the disk
    /// configuration allows it).
    Map,
}

/// The real state disk, through `asterism-disk`.
pub struct LuksDisk {
    disk: StateDisk,
    unlock: UnlockMode,
}

impl LuksDisk {
    /// Wraps an opened state disk.
    #[must_use]
    pub fn new(disk: StateDisk, unlock: UnlockMode) -> Self {
        Self { disk, unlock }
    }
}

impl DiskOps for LuksDisk {
    fn is_initialized(&self) -> Result<bool, DiskError> {
        self.disk.is_initialized()
    }

    fn format_new(&self, passphrase: &DataKey) -> Result<DiskUuid, DiskError> {
        self.disk.format_new(passphrase).map(|f| f.uuid)
    }

    fn uuid(&self) -> Result<DiskUuid, DiskError> {
        self.disk.uuid()
    }

    fn replace_passphrase(&self, old: &DataKey, new: &DataKey) -> Result<(), DiskError> {
        self.disk.replace_passphrase(old, new)
    }

    fn mark_for_reset(&self) -> Result<(), DiskError> {
        self.disk.mark_for_reset()
    }

    fn check_key(&self, passphrase: &DataKey) -> Result<bool, DiskError> {
        self.disk.check_key(passphrase)
    }

    fn maps(&self) -> bool {
        self.unlock == UnlockMode::Map
    }

    fn unlock(&self, passphrase: &DataKey) -> Result<Unlocked, DiskError> {
        match self.unlock {
            UnlockMode::Map => self.disk.unlock(passphrase),
            UnlockMode::KeyCheck => {
                if self.disk.check_key(passphrase)? {
                    Ok(Unlocked::KeyChecked)
                } else {
                    Err(DiskError::WrongPassphrase {
                        path: self.disk.path().to_path_buf(),
                    })
                }
            }
        }
    }
}

/// The Kubernetes components of an init request or a join ticket (docs/kubernetes.md),
/// checked: every one has a supported URL, a well-formed `sha256:<hex>` hash and a plain
/// absolute install path. The strings are kept exactly as sent, since the components
/// ConfigMap records them and is named by their hashes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Components(CheckedComponents);

impl Components {
    /// Checks `list`; the first bad component refuses the whole list.
    pub fn new(list: Vec<Component>) -> Result<Self, ComponentError> {
        Ok(Self(CheckedComponents::new(list)?))
    }

    /// The components as received, in order.
    #[must_use]
    pub fn as_slice(&self) -> &[Component] {
        self.0.received()
    }

    /// The checked components, for the installer: nothing checks them again.
    #[must_use]
    pub fn checked(&self) -> &CheckedComponents {
        &self.0
    }

    /// How many there are.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none (the image holds what kubeadm needs).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The components in their wire form (for the components ConfigMap).
    #[must_use]
    pub fn to_proto(&self) -> Vec<asterism_proto::components::Component> {
        self.0.received().iter().cloned().map(Into::into).collect()
    }
}

/// The one conversion from the wire type (init request, join ticket).
impl TryFrom<Vec<asterism_proto::components::Component>> for Components {
    type Error = ComponentError;

    fn try_from(list: Vec<asterism_proto::components::Component>) -> Result<Self, Self::Error> {
        Self::new(list.into_iter().map(Component::from).collect())
    }
}

/// What the Kubernetes driver needs to set up the first control-plane node.
#[derive(Debug, Clone)]
pub struct ClusterInit {
    /// The cluster name (`constellation` when the request left it empty).
    pub cluster_name: String,
    /// The Kubernetes version the owner asked for.
    pub kubernetes_version: KubernetesVersion,
    /// Extra subject alternative names of the API server certificate.
    pub apiserver_cert_sans: Vec<String>,
    /// The service CIDR (may be empty: the default).
    pub service_cidr: String,
    /// Keep kube-proxy (conformance mode).
    pub conformance_mode: bool,
    /// The node's address: the API server's address.
    pub node_ip: IpAddr,
    /// The node's name.
    pub node_name: String,
    /// Where the cluster PKI lives (`state/kubernetes/pki`).
    pub pki_dir: PathBuf,
    /// The components the init request names (may be empty).
    pub components: Components,
}

/// The API server a node joins through, `host:port`, as the join service decided it (its
/// configuration) and put into the join ticket. Checked for its form once, when the ticket
/// is checked; nothing looks it up again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiServerEndpoint(String);

/// Why a ticket's API server endpoint is refused.
#[derive(Debug, thiserror::Error)]
#[error("the API server endpoint {0:?} is not host:port")]
pub struct EndpointError(String);

impl ApiServerEndpoint {
    /// Parses `host:port`: an IPv4 address, a bracketed IPv6 address or a DNS name, and a
    /// port other than 0.
    pub fn parse(text: &str) -> Result<Self, EndpointError> {
        let bad = || EndpointError(text.to_owned());
        if text.parse::<SocketAddr>().is_ok_and(|a| a.port() != 0) {
            return Ok(Self(text.to_owned()));
        }
        let (host, port) = text.rsplit_once(':').ok_or_else(bad)?;
        let port_ok = port.parse::<u16>().is_ok_and(|p| p != 0);
        if port_ok && asterism_basics::is_host_name(host) {
            Ok(Self(text.to_owned()))
        } else {
            Err(bad())
        }
    }

    /// `host:port`.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ApiServerEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What the Kubernetes driver needs to join the node to the cluster.
#[derive(Debug)]
pub struct ClusterJoin {
    /// The API server to join through, from the join ticket.
    pub api_server_endpoint: ApiServerEndpoint,
    /// The bootstrap token (secret), checked when the ticket was.
    pub token: BootstrapToken,
    /// `sha256:<hex>` of the cluster CA's public key.
    pub discovery_token_ca_cert_hash: String,
    /// The node's role.
    pub role: Role,
    /// The node's name.
    pub node_name: String,
    /// Where the cluster PKI lives (`state/kubernetes/pki`).
    pub pki_dir: PathBuf,
    /// The Kubernetes version the join ticket names, or `None` when the join service
    /// records no release.
    pub kubernetes_version: Option<KubernetesVersion>,
    /// The components the join ticket names (may be empty).
    pub components: Components,
    /// The control-plane files of a control-plane node's ticket, checked (empty for a
    /// worker): handed over in memory, the driver writes them where its Kubernetes reads
    /// them, once.
    pub control_plane_files: Vec<ControlPlaneFile>,
}

/// A Kubernetes driver failed: what it was doing, and why.
#[derive(Debug, thiserror::Error)]
#[error("{what}")]
pub struct DriverError {
    /// What the driver was doing.
    pub what: &'static str,
    /// The cause.
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

impl DriverError {
    /// The driver failed at `what` because of `source`.
    pub fn new(
        what: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self {
            what,
            source: source.into(),
        }
    }
}

/// Sets up Kubernetes on the node: `kubeadm` in production, `none` in local mode
/// (docs/design/local-cluster.md).
pub trait KubernetesDriver: Send + Sync {
    /// The driver's name, for logs.
    fn name(&self) -> &'static str;

    /// Initialises the cluster on this (first control-plane) node and returns the admin
    /// kubeconfig (secret: it holds the admin's private key).
    fn init<'a>(
        &'a self,
        params: &'a ClusterInit,
    ) -> BoxFuture<'a, Result<Zeroizing<Vec<u8>>, DriverError>>;

    /// Joins this node to the cluster. The parameters are handed over: the bootstrap
    /// token goes on into the kubeadm configuration without a copy.
    fn join(&self, params: ClusterJoin) -> BoxFuture<'_, Result<(), DriverError>>;
}

/// Stand-ins for the unit tests.
#[cfg(test)]
pub(crate) mod fakes {
    use std::path::{Path, PathBuf};
    use std::sync::{Arc, Mutex};

    use asterism_disk::{FileSystemError, Step};

    use super::StateMount;

    /// A stand-in for mke2fs and mount, which need device-mapper and root (these tests run
    /// without either). It records each call in `log` (shared with a disk stand-in, so the
    /// order of disk and file-system steps shows), a mount with how many entries its target
    /// held (a mount hides them), and on `mount` puts `contents` into the target, as the
    /// mounted file system would show them. `fail` makes that step fail.
    #[derive(Default)]
    pub(crate) struct RecordingMount {
        pub(crate) log: Arc<Mutex<Vec<String>>>,
        pub(crate) contents: Vec<(PathBuf, Vec<u8>)>,
        pub(crate) fail: Option<Step>,
    }

    impl RecordingMount {
        fn failed(&self, step: Step, device: &Path) -> Result<(), FileSystemError> {
            if self.fail == Some(step) {
                return Err(FileSystemError::Failed {
                    device: device.to_path_buf(),
                    step,
                    status: Some(32),
                    stderr: "refused by the test".into(),
                });
            }
            Ok(())
        }
    }

    impl StateMount for RecordingMount {
        fn make_file_system(&self, device: &Path) -> Result<(), FileSystemError> {
            self.log
                .lock()
                .unwrap()
                .push(format!("mkfs {}", device.display()));
            self.failed(Step::MakeFileSystem, device)
        }

        fn mount(&self, device: &Path, target: &Path) -> Result<(), FileSystemError> {
            let held = std::fs::read_dir(target).map_or(usize::MAX, Iterator::count);
            self.log.lock().unwrap().push(format!(
                "mount {} on {} over {held} entries",
                device.display(),
                target.display()
            ));
            self.failed(Step::Mount, device)?;
            for (path, data) in &self.contents {
                let path = target.join(path);
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(path, data).unwrap();
            }
            Ok(())
        }
    }
}

//! One activation: what a node needs to become a member of its cluster, built once from a
//! checked join ticket or a checked init request, and [`Activation::activate`], which does
//! the same four things for both after the node lock (the point of no return):
//!
//! 1. re-key the state disk from the first-boot passphrase to the cluster-derived key;
//! 2. write the node's files (one batch: each file atomic, the syncs shared), among them
//!    the record of what the node hands its Kubernetes driver;
//! 3. set up Kubernetes through the driver (init or join);
//! 4. write the node state, last: its presence says the node finished bootstrapping.
//!
//! A crash at any step leaves PCR 15 marked without a node state, which the next boot
//! finds and answers by resetting the disk. A failure marks the disk for reset at once.

use std::path::PathBuf;

use asterism_cluster::{KubernetesHandover, MEASUREMENT_SALT_LEN, NodeDir, Role};
use asterism_kms::{ClusterId, DataKey};
use asterism_kubeadm::setup::ControlPlaneFile;
use tracing::{info, warn};
use zeroize::Zeroizing;

use crate::effects::{ClusterInit, ClusterJoin};
use crate::error::{StepError, blocking};
use crate::files;
use crate::identity::Identity;
use crate::node::Node;
use crate::node_state::NodeState;
use crate::pki::SshFiles;
use crate::ticket::JoinTicket;

/// The largest first-boot passphrase file read back.
const MAX_INITIAL_KEY_FILE: u64 = 1024;

/// One file of the node, checked or made before the lock, written after it.
pub(crate) struct NodeFile {
    path: PathBuf,
    data: Zeroizing<Vec<u8>>,
    mode: u32,
}

impl NodeFile {
    pub(crate) fn new(path: PathBuf, data: impl Into<Vec<u8>>, mode: u32) -> Self {
        Self {
            path,
            data: Zeroizing::new(data.into()),
            mode,
        }
    }
}

/// How the node sets up Kubernetes.
pub(crate) enum KubernetesStep {
    /// Initialise the cluster on this, its first control-plane node.
    Init(ClusterInit),
    /// Join the cluster.
    Join(ClusterJoin),
}

impl KubernetesStep {
    /// What this step hands the driver named `driver`.
    fn handover(&self, driver: &str) -> KubernetesHandover {
        let (version, components) = match self {
            Self::Init(p) => (Some(p.kubernetes_version), &p.components),
            Self::Join(p) => (p.kubernetes_version, &p.components),
        };
        KubernetesHandover {
            driver: driver.to_owned(),
            kubernetes_version: version,
            kubernetes_components: components.as_slice().to_vec(),
        }
    }
}

/// Everything an activation needs, checked.
pub(crate) struct Activation {
    cluster_id: ClusterId,
    measurement_salt: [u8; MEASUREMENT_SALT_LEN],
    disk_key: DataKey,
    identity: Identity,
    files: Vec<NodeFile>,
    kubernetes: KubernetesStep,
}

/// What an activation achieved: the node is a member of `cluster_id`.
pub(crate) struct Activated {
    /// The cluster.
    pub(crate) cluster_id: ClusterId,
    /// After an init, the admin kubeconfig (secret), for the owner.
    pub(crate) kubeconfig: Option<Zeroizing<Vec<u8>>>,
}

/// The checked parts of an init request, with what was derived from them before the lock.
pub(crate) struct InitActivation {
    /// The cluster ID.
    pub(crate) cluster_id: ClusterId,
    /// The measurement salt.
    pub(crate) measurement_salt: [u8; MEASUREMENT_SALT_LEN],
    /// The state disk's cluster-derived key.
    pub(crate) disk_key: DataKey,
    /// The emergency SSH CA's public key and this node's host certificate.
    pub(crate) ssh: SshFiles,
    /// The record of this node's disk and attestation key for the join service
    /// ([`asterism_cluster::InitNode`], as JSON), if the node knows its attestation key
    /// identity.
    pub(crate) init_node_record: Option<String>,
    /// The files of the cluster's services when this node hosts them ([`crate::hosted`]).
    pub(crate) hosted_services: Vec<NodeFile>,
    /// What the driver needs.
    pub(crate) params: ClusterInit,
}

impl Activation {
    /// The activation of a checked join ticket, with the kubelet key the node made for its
    /// request.
    pub(crate) fn from_ticket(
        ticket: JoinTicket,
        kubelet_key: Zeroizing<Vec<u8>>,
        identity: Identity,
        dir: &NodeDir,
    ) -> Self {
        let control_plane_files = if identity.role == Role::ControlPlane {
            ticket
                .control_plane_files
                .into_iter()
                .map(|(name, data)| ControlPlaneFile { name, data })
                .collect()
        } else {
            if !ticket.control_plane_files.is_empty() {
                warn!(
                    count = ticket.control_plane_files.len(),
                    "ignored control-plane files sent to a worker"
                );
            }
            Vec::new()
        };
        let files = vec![
            NodeFile::new(dir.kubelet_cert(), ticket.kubelet_cert, files::PUBLIC_MODE),
            NodeFile::new(dir.kubelet_key(), kubelet_key.to_vec(), files::SECRET_MODE),
            NodeFile::new(
                dir.ssh_ca_pub(),
                ticket.ssh_ca_public_key,
                files::PUBLIC_MODE,
            ),
            NodeFile::new(
                dir.ssh_host_cert(),
                ticket.host_certificate,
                files::PUBLIC_MODE,
            ),
        ];
        let kubernetes = KubernetesStep::Join(ClusterJoin {
            api_server_endpoint: ticket.api_server_endpoint,
            token: ticket.token,
            discovery_token_ca_cert_hash: ticket.discovery_token_ca_cert_hash,
            role: identity.role,
            node_name: identity.name.clone(),
            pki_dir: dir.kubernetes_pki(),
            kubernetes_version: ticket.kubernetes_version,
            components: ticket.components,
            control_plane_files,
        });
        Self {
            cluster_id: ticket.cluster_id,
            measurement_salt: ticket.measurement_salt,
            disk_key: ticket.state_disk_key,
            identity,
            files,
            kubernetes,
        }
    }

    /// The activation of a checked init request: this node becomes the cluster's first
    /// control-plane node.
    pub(crate) fn from_init(init: InitActivation, identity: Identity, dir: &NodeDir) -> Self {
        let mut files = Vec::new();
        if let Some(record) = init.init_node_record {
            files.push(NodeFile::new(
                dir.init_node_record(),
                record.into_bytes(),
                files::SECRET_MODE,
            ));
        }
        files.extend(init.hosted_services);
        files.push(NodeFile::new(
            dir.ssh_ca_pub(),
            init.ssh.ca_line.into_bytes(),
            files::PUBLIC_MODE,
        ));
        files.push(NodeFile::new(
            dir.ssh_host_cert(),
            init.ssh.host_certificate.into_bytes(),
            files::PUBLIC_MODE,
        ));
        Self {
            cluster_id: init.cluster_id,
            measurement_salt: init.measurement_salt,
            disk_key: init.disk_key,
            identity: Identity {
                role: Role::ControlPlane,
                ..identity
            },
            files,
            kubernetes: KubernetesStep::Init(init.params),
        }
    }

    /// The cluster this activation makes the node a member of.
    pub(crate) fn cluster_id(&self) -> &ClusterId {
        &self.cluster_id
    }

    /// Activates the node, after the node lock: re-key, files, Kubernetes, node state,
    /// within the configured deadline. On failure the state disk is marked for reset.
    pub(crate) async fn activate<M>(self, node: &Node<M>) -> Result<Activated, StepError> {
        let timeout = node.config.activation_timeout;
        let result = tokio::time::timeout(timeout, self.steps(node))
            .await
            .unwrap_or(Err(StepError::Timeout(timeout)));
        if let Err(e) = &result {
            node.reset_after_failure(e).await;
        }
        result
    }

    async fn steps<M>(self, node: &Node<M>) -> Result<Activated, StepError> {
        let dir = node.dir();
        // 1. The disk.
        rekey_disk(node, self.disk_key).await?;
        // 2. The files, with the record of what the driver is handed.
        let handover = NodeFile::new(
            dir.kubernetes_handover(),
            self.kubernetes.handover(node.driver.name()).to_json()?,
            files::PUBLIC_MODE,
        );
        let batch: Vec<files::FileToWrite<'_>> = self
            .files
            .iter()
            .chain(std::iter::once(&handover))
            .map(|f| (f.path.as_path(), f.data.as_slice(), f.mode))
            .collect();
        files::write_all_atomic(&batch)?;
        info!(
            step = "files",
            count = batch.len(),
            "wrote the node's files"
        );
        drop(batch);
        // 3. Kubernetes.
        let kubeconfig = match self.kubernetes {
            KubernetesStep::Init(params) => {
                info!(step = "kubernetes", driver = node.driver.name(), cluster = %params.cluster_name, "initialising Kubernetes");
                let kubeconfig = node.driver.init(&params).await?;
                info!(step = "kubernetes", "Kubernetes initialised");
                Some(kubeconfig)
            }
            KubernetesStep::Join(params) => {
                info!(step = "kubernetes", driver = node.driver.name(), endpoint = %params.api_server_endpoint, "joining Kubernetes");
                node.driver.join(params).await?;
                None
            }
        };
        // 4. The node state, written last: its presence says the node finished.
        let state = NodeState {
            role: self.identity.role,
            measurement_salt: self.measurement_salt,
        };
        state.write(&dir.node_state())?;
        info!(step = "node-state", role = %state.role, "wrote the node state");
        if kubeconfig.is_some() {
            info!(step = "done", cluster_id = %self.cluster_id, "the node is initialised");
        } else {
            info!(step = "done", cluster_id = %self.cluster_id, name = %self.identity.name, role = %self.identity.role, "the node joined the cluster");
        }
        Ok(Activated {
            cluster_id: self.cluster_id,
            kubeconfig,
        })
    }
}

/// Re-keys the state disk from the first-boot passphrase to `new` (crash-safe: see
/// docs/disk.md), then removes the first-boot passphrase file: it opens nothing any more.
async fn rekey_disk<M>(node: &Node<M>, new: DataKey) -> Result<(), StepError> {
    let path = crate::boot::initial_key_path(node.disk.as_ref(), node.dir());
    let old = files::read_capped(&path, MAX_INITIAL_KEY_FILE)?;
    let old = DataKey::new(old).map_err(|_| StepError::EmptyInitialKey { path: path.clone() })?;
    let disk = node.disk.clone();
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

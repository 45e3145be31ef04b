//! The layout of a node directory (docs/design/local-cluster.md, "Per-node directory"):
//! where the bootstrapper keeps the state disk, the files on it and its scratch space, and
//! where the local cluster (`asterism mini`) finds them. Paths only; nothing here touches
//! the file system.

use std::path::{Path, PathBuf};

/// The paths of one node directory (`<cluster dir>/nodes/<name>/`, `/run` in the node
/// image). `state/` is the mount point of the state disk's file system where the disk is
/// mapped (device-mapper); without device-mapper it is a plain directory that stands for
/// the mounted disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeDir {
    root: PathBuf,
}

impl NodeDir {
    /// The node directory at `root`.
    #[must_use]
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The directory itself.
    #[must_use]
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `state.img`: the LUKS2 state disk image.
    #[must_use]
    pub fn state_image(&self) -> PathBuf {
        self.root.join("state.img")
    }

    /// `attestation/`: what provisioning put beside the node's TPM for verifiers, the AK
    /// certificate among it.
    #[must_use]
    pub fn attestation(&self) -> PathBuf {
        self.root.join("attestation")
    }

    /// `attestation/ak-cert.der`: the AK certificate a platform CA issued, if any.
    #[must_use]
    pub fn ak_certificate(&self) -> PathBuf {
        self.attestation().join("ak-cert.der")
    }

    /// `state/`: the mounted state disk, or the plain directory that stands for it.
    #[must_use]
    pub fn state(&self) -> PathBuf {
        self.root.join("state")
    }

    /// `state/initial.key`: the first-boot passphrase (0400) until re-keying replaces it,
    /// where `state/` only stands for the disk (no device-mapper).
    #[must_use]
    pub fn initial_key(&self) -> PathBuf {
        self.state().join("initial.key")
    }

    /// `run/initial.key`: the first-boot passphrase of a disk that is mapped, outside the
    /// file system it protects (it is written before the format, and `run/` is memory on a
    /// node); removed after re-keying.
    #[must_use]
    pub fn mapped_initial_key(&self) -> PathBuf {
        self.run().join("initial.key")
    }

    /// `state/constellation/node_state.json`: the path existing state disks have it at.
    #[must_use]
    pub fn node_state(&self) -> PathBuf {
        self.state().join("constellation").join("node_state.json")
    }

    /// `state/asterism/init-node.json`: on the first node, its disk UUID and attestation
    /// key identity, for the join service to bind (docs/join-service.md).
    #[must_use]
    pub fn init_node_record(&self) -> PathBuf {
        self.asterism().join("init-node.json")
    }

    /// `state/asterism/services/`: on a control plane that hosts the cluster's key and join
    /// services outside Kubernetes, their secrets and trust.
    #[must_use]
    pub fn hosted_services(&self) -> PathBuf {
        self.asterism().join("services")
    }

    /// `state/asterism/kubernetes.json`: what the node was handed to set up Kubernetes with
    /// (`KubernetesHandover`, feature `node-records`).
    #[must_use]
    pub fn kubernetes_handover(&self) -> PathBuf {
        self.asterism().join("kubernetes.json")
    }

    /// `state/asterism/`: the records and files Asterism itself keeps on the state disk.
    #[must_use]
    pub fn asterism(&self) -> PathBuf {
        self.state().join("asterism")
    }

    /// `state/ssh/`.
    #[must_use]
    pub fn ssh(&self) -> PathBuf {
        self.state().join("ssh")
    }

    /// `state/ssh/ssh_host_ed25519_key`.
    #[must_use]
    pub fn ssh_host_key(&self) -> PathBuf {
        self.ssh().join("ssh_host_ed25519_key")
    }

    /// `state/ssh/ssh_ca.pub`.
    #[must_use]
    pub fn ssh_ca_pub(&self) -> PathBuf {
        self.ssh().join("ssh_ca.pub")
    }

    /// `state/ssh/ssh_host_cert.pub`.
    #[must_use]
    pub fn ssh_host_cert(&self) -> PathBuf {
        self.ssh().join("ssh_host_cert.pub")
    }

    /// `state/kubernetes/pki/`: the cluster CA and control-plane files.
    #[must_use]
    pub fn kubernetes_pki(&self) -> PathBuf {
        self.state().join("kubernetes").join("pki")
    }

    /// `state/kubelet/pki/kubelet-client-crt.pem`.
    #[must_use]
    pub fn kubelet_cert(&self) -> PathBuf {
        self.state()
            .join("kubelet")
            .join("pki")
            .join("kubelet-client-crt.pem")
    }

    /// `state/kubelet/pki/kubelet-client-key.pem`.
    #[must_use]
    pub fn kubelet_key(&self) -> PathBuf {
        self.state()
            .join("kubelet")
            .join("pki")
            .join("kubelet-client-key.pem")
    }

    /// `run/`: scratch space (detached LUKS header copies; the first-boot passphrase of a
    /// mapped disk).
    #[must_use]
    pub fn run(&self) -> PathBuf {
        self.root.join("run")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_paths_other_programs_read_are_pinned() {
        let dir = NodeDir::new("/n");
        for (path, expected) in [
            (dir.state_image(), "/n/state.img"),
            (dir.init_node_record(), "/n/state/asterism/init-node.json"),
            (
                dir.kubernetes_handover(),
                "/n/state/asterism/kubernetes.json",
            ),
            (dir.kubernetes_pki(), "/n/state/kubernetes/pki"),
            (dir.node_state(), "/n/state/constellation/node_state.json"),
            (dir.run(), "/n/run"),
        ] {
            assert_eq!(path, Path::new(expected));
        }
    }
}

//! The layout of a node directory (docs/design/local-cluster.md, "Per-node directory"):
//! where the bootstrapper keeps the state disk, the files on it and its scratch space, and
//! where the local cluster (`asterism mini`) finds them. Paths only; nothing here touches
//! the file system.

use std::path::{Path, PathBuf};

/// The node directory's accessors: `name = base / "a" / "b";` is `pub fn name(&self) ->
/// PathBuf`, the path `a/b` below `base`, which is `root` or another accessor.
macro_rules! paths {
    ($($(#[doc = $doc:expr])* $name:ident = $base:ident $(/ $part:literal)+;)*) => {
        $(
            $(#[doc = $doc])*
            #[must_use]
            pub fn $name(&self) -> PathBuf {
                self.$base()$(.join($part))+
            }
        )*
    };
}

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

    paths! {
        /// `state.img`: the LUKS2 state disk image.
        state_image = root / "state.img";

        /// `attestation/`: what provisioning put beside the node's TPM for verifiers, the AK
        /// certificate among it.
        attestation = root / "attestation";

        /// `attestation/ak-cert.der`: the AK certificate a platform CA issued, if any.
        ak_certificate = attestation / "ak-cert.der";

        /// `state/`: the mounted state disk, or the plain directory that stands for it.
        state = root / "state";

        /// `state/initial.key`: the first-boot passphrase (0400) until re-keying replaces it,
        /// where `state/` only stands for the disk (no device-mapper).
        initial_key = state / "initial.key";

        /// `run/initial.key`: the first-boot passphrase of a disk that is mapped, outside the
        /// file system it protects (it is written before the format, and `run/` is memory on a
        /// node); removed after re-keying.
        mapped_initial_key = run / "initial.key";

        /// `state/constellation/node_state.json`: the path existing state disks have it at.
        node_state = state / "constellation" / "node_state.json";

        /// `state/asterism/init-node.json`: on the first node, its disk UUID and attestation
        /// key identity, for the join service to bind (docs/join-service.md).
        init_node_record = asterism / "init-node.json";

        /// `state/asterism/services/`: on a control plane that hosts the cluster's key and join
        /// services outside Kubernetes, their secrets and trust.
        hosted_services = asterism / "services";

        /// `state/asterism/kubernetes.json`: what the node was handed to set up Kubernetes with
        /// (`KubernetesHandover`, feature `node-records`).
        kubernetes_handover = asterism / "kubernetes.json";

        /// `state/asterism/`: the records and files Asterism itself keeps on the state disk.
        asterism = state / "asterism";

        /// `state/ssh/`.
        ssh = state / "ssh";

        /// `state/ssh/ssh_host_ed25519_key`.
        ssh_host_key = ssh / "ssh_host_ed25519_key";

        /// `state/ssh/ssh_ca.pub`.
        ssh_ca_pub = ssh / "ssh_ca.pub";

        /// `state/ssh/ssh_host_cert.pub`.
        ssh_host_cert = ssh / "ssh_host_cert.pub";

        /// `state/kubernetes/pki/`: the cluster CA and control-plane files.
        kubernetes_pki = state / "kubernetes" / "pki";

        /// `state/kubelet/pki/kubelet-client-crt.pem`.
        kubelet_cert = state / "kubelet" / "pki" / "kubelet-client-crt.pem";

        /// `state/kubelet/pki/kubelet-client-key.pem`.
        kubelet_key = state / "kubelet" / "pki" / "kubelet-client-key.pem";

        /// `run/`: scratch space (detached LUKS header copies; the first-boot passphrase of a
        /// mapped disk).
        run = root / "run";
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_is_pinned() {
        let dir = NodeDir::new("/n");
        for (path, expected) in [
            (dir.state_image(), "/n/state.img"),
            (dir.attestation(), "/n/attestation"),
            (dir.ak_certificate(), "/n/attestation/ak-cert.der"),
            (dir.state(), "/n/state"),
            (dir.initial_key(), "/n/state/initial.key"),
            (dir.mapped_initial_key(), "/n/run/initial.key"),
            (dir.node_state(), "/n/state/constellation/node_state.json"),
            (dir.init_node_record(), "/n/state/asterism/init-node.json"),
            (dir.hosted_services(), "/n/state/asterism/services"),
            (
                dir.kubernetes_handover(),
                "/n/state/asterism/kubernetes.json",
            ),
            (dir.asterism(), "/n/state/asterism"),
            (dir.ssh(), "/n/state/ssh"),
            (dir.ssh_host_key(), "/n/state/ssh/ssh_host_ed25519_key"),
            (dir.ssh_ca_pub(), "/n/state/ssh/ssh_ca.pub"),
            (dir.ssh_host_cert(), "/n/state/ssh/ssh_host_cert.pub"),
            (dir.kubernetes_pki(), "/n/state/kubernetes/pki"),
            (
                dir.kubelet_cert(),
                "/n/state/kubelet/pki/kubelet-client-crt.pem",
            ),
            (
                dir.kubelet_key(),
                "/n/state/kubelet/pki/kubelet-client-key.pem",
            ),
            (dir.run(), "/n/run"),
        ] {
            assert_eq!(path, Path::new(expected));
        }
    }
}

//! The vocabulary of an Asterism cluster that the bootstrapper, the join service and the
//! Kubernetes crates share, defined once: a node's [`Role`], the kubeadm
//! [`BootstrapToken`], the control-plane files a joining control-plane node receives, the
//! API server port, the length of the measurement salt, the layout of a node directory
//! ([`NodeDir`]) and (feature `node-records`) the records the bootstrapper writes there for
//! the join service and the operator.
//!
//! This crate is pure and small: values and checks, no I/O, no randomness of its own, no
//! runtime. It must never let a token's secret reach a `Debug` output or an error.
#![forbid(unsafe_code)]

mod node_dir;
#[cfg(feature = "node-records")]
mod records;
mod role;
mod token;

pub use node_dir::NodeDir;
#[cfg(feature = "node-records")]
pub use records::{InitNode, KubernetesHandover, RecordError};
pub use role::Role;
pub use token::{
    BootstrapToken, ExpiringToken, TOKEN_ID_LEN, TOKEN_SECRET_LEN, TokenError, is_bootstrap_token,
};

/// The port the Kubernetes API server listens on, on every control-plane node and behind
/// the cluster's load balancer.
pub const API_SERVER_PORT: u16 = 6443;

/// The length of the cluster's measurement salt, in bytes. The salt is chosen at init, is
/// not secret, and with the measurement secret gives the cluster ID.
pub const MEASUREMENT_SALT_LEN: usize = 32;

/// The control-plane files a joining control-plane node receives from the join service,
/// relative to kubeadm's certificate directory (`/etc/kubernetes/pki`): the keys and
/// certificates of the cluster CA, the service-account signing key pair, the front-proxy
/// CA and the etcd CA, keys first. A control-plane node needs them to run the API server,
/// the controller manager and etcd members that trust the same authorities.
pub const CONTROL_PLANE_FILES: [&str; 8] = [
    "ca.key",
    "sa.key",
    "front-proxy-ca.key",
    "etcd/ca.key",
    "ca.crt",
    "sa.pub",
    "front-proxy-ca.crt",
    "etcd/ca.crt",
];

/// One of the [`CONTROL_PLANE_FILES`] as the join service sends it and the bootstrapper
/// hands it to kubeadm. Its `Debug` shows the name and the length, never the content.
pub struct ControlPlaneFile {
    /// The name relative to the certificate directory (`ca.key`, `etcd/ca.crt`). The
    /// receiver checks it (kubeadm's set-up takes only a plain relative path).
    pub name: String,
    /// The content (secret for keys).
    pub data: zeroize::Zeroizing<Vec<u8>>,
}

impl std::fmt::Debug for ControlPlaneFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlaneFile")
            .field("name", &self.name)
            .field("len", &self.data.len())
            .finish_non_exhaustive()
    }
}

/// Of [`CONTROL_PLANE_FILES`], the ones that must exist; the others are sent when present
/// (in local mode, without Kubernetes, only the cluster CA exists).
pub const REQUIRED_CONTROL_PLANE_FILES: [&str; 2] = ["ca.crt", "ca.key"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_control_plane_file_shows_its_name_and_length_never_its_content() {
        let file = ControlPlaneFile {
            name: "ca.key".into(),
            data: zeroize::Zeroizing::new(b"-----BEGIN PRIVATE KEY-----secret".to_vec()),
        };
        let shown = format!("{file:?}");
        assert!(shown.contains("ca.key") && shown.contains("33"), "{shown}");
        assert!(
            !shown.contains("secret") && !shown.contains("BEGIN"),
            "{shown}"
        );
    }

    #[test]
    fn the_required_control_plane_files_are_control_plane_files() {
        for name in REQUIRED_CONTROL_PLANE_FILES {
            assert!(CONTROL_PLANE_FILES.contains(&name), "{name}");
        }
    }
}

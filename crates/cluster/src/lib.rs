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

/// Of [`CONTROL_PLANE_FILES`], the ones that must exist; the others are sent when present
/// (in local mode, without Kubernetes, only the cluster CA exists).
pub const REQUIRED_CONTROL_PLANE_FILES: [&str; 2] = ["ca.crt", "ca.key"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_required_control_plane_files_are_control_plane_files() {
        for name in REQUIRED_CONTROL_PLANE_FILES {
            assert!(CONTROL_PLANE_FILES.contains(&name), "{name}");
        }
    }
}

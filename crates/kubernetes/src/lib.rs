//! Kubernetes for Asterism: what the bootstrapper and the join service need to run a real
//! cluster with kubeadm (REFERENCE §6, §11).
//!
//! * [`components`]: download, check (SHA-256, mandatory) and install the Kubernetes
//!   binaries and archives an init request names.
//! * [`kubeadm`]: typed kubeadm configuration (InitConfiguration, ClusterConfiguration,
//!   KubeletConfiguration, JoinConfiguration) and the kubeadm runner.
//! * [`api`]: the Kubernetes API through kube-rs: waiting for the API server, the
//!   join-config ConfigMap, and the join service's cluster state (bootstrap tokens,
//!   JoiningNode records, the components ConfigMap).
//!
//! This is the only crate that may depend on `kube`. It never logs tokens or keys.

pub mod api;
pub mod components;
pub mod kubeadm;

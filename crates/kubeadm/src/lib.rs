//! kubeadm for Asterism: typed configuration ([`config`]), the runner ([`runner`]) that
//! drives the `kubeadm` program through a narrow command trait, and the node setup
//! ([`setup`]) that puts components (`asterism-components`), files, configuration and
//! runner together for init, join and a restart, with etcd's I/O priority ([`etcdio`])
//! after each on a control-plane node.
//!
//! It talks to no Kubernetes API (that is `asterism-kube-api`) and never logs bootstrap
//! tokens, certificate keys or the admin kubeconfig. docs/kubernetes.md describes it.
#![forbid(unsafe_code)]

pub mod config;
pub mod etcdio;
pub mod runner;
pub mod setup;

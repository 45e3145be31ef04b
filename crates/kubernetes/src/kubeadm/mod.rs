//! kubeadm: typed configuration ([`config`]), the runner ([`runner`]) that drives the
//! `kubeadm` program through a narrow command trait, and the node setup ([`setup`]) that
//! puts components, files, configuration and runner together for init, join and a
//! restart.

pub mod config;
pub mod runner;
pub mod setup;

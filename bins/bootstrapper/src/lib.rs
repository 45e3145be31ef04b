//! The Asterism node bootstrapper (`asterism-bootstrapper`): runs on every node at boot
//! until the node is part of the cluster.
//!
//! * **Boot phase** ([`run`] first): PCR 15 and the state disk say what this boot is. A
//!   marked node is already bootstrapped; an initialized disk means a reboot, which asks a
//!   join service for a rejoin ticket and, in parallel, serves `recoverproto.API/Recover`
//!   (`<node ip>:9999`, aTLS, the node attests) for the owner's keys; the first keys that
//!   open the disk unlock it and re-mark PCR 15. A new disk is formatted with a random
//!   first-boot passphrase. Where the disk is mapped (device-mapper), `state/` is the mount
//!   point of its file system: made after the format, mounted before anything is written
//!   into `state/` and, on a reboot, before the node state is read.
//! * **What this node is** (its name and role from the metadata, its SSH host key, its disk
//!   UUID) is learned once, then handed to both flows.
//! * **InitServer** (`init.API/Init` on the listener [`run`] is given, `<node ip>:9000` in
//!   production, aTLS, the node attests) and **JoinClient** (to `<control-plane ip>:30090`,
//!   aTLS, the node attests and optionally verifies the join service) run in parallel. Each
//!   checks what it receives (an init request, a join ticket) into one *activation*; they
//!   meet at the **node lock**: the first to take it marks PCR 15 with the cluster ID (the
//!   point of no return), stops the other, and activates: re-keys the state disk with the
//!   cluster-derived key, writes the node's files, calls the Kubernetes driver and writes
//!   the node state.
//! * A failure after the point of no return marks the state disk for reset and ends the
//!   run with [`Failure::AfterLock`] (exit status [`EXIT_RESET`]).
//!
//! External effects sit behind narrow traits ([`NodeMarker`], [`DiskOps`], [`StateMount`],
//! [`KubernetesDriver`], `asterism_metadata::Metadata`, `asterism_attestation::Issuer`).
//!
//! This crate must never log or return a secret (init secret, KMS URI, keys, tokens), never
//! send its logs to a caller that did not present the right init secret, and never take a
//! step past the node lock without marking the disk for reset when it fails.
#![forbid(unsafe_code)]

mod activation;
pub mod boot;
mod config;
mod dial;
mod driver;
mod effects;
mod error;
pub mod files;
mod flow;
mod hosted;
mod identity;
mod init;
mod join;
pub mod limits;
mod lock;
mod logbuf;
mod node;
pub mod node_state;
mod pki;
pub mod platform;
mod recover;
mod run;
mod ticket;
mod trust;

pub use asterism_binkit::error_chain;
pub use asterism_cluster::Role;
pub use asterism_cluster::{KubernetesHandover, NodeDir};
pub use boot::prepare_state_image;
pub use config::{
    Config, DEFAULT_ACTIVATION_TIMEOUT, DEFAULT_COMPONENTS_DIRS, DEFAULT_INIT_PORT,
    DEFAULT_JOIN_PORT, DEFAULT_RETRY_INTERVAL, DEFAULT_RPC_TIMEOUT, DEFAULT_STATE_DISK_SIZE,
    LOG_CHUNK_SIZE,
};
pub use dial::{DialError, Dialed, Dialer};
pub use driver::{
    KubeadmDriver, KubeadmDriverConfig, NoneDriver, PostInitApi, kubeadm_init_params,
    post_init_api_steps,
};
pub use effects::{
    ApiServerEndpoint, ClusterInit, ClusterJoin, Components, DiskOps, DriverError, EndpointError,
    KubernetesDriver, LuksDisk, MarkError, NodeMarker, StateMount, TpmMarker, UnlockMode,
};
pub use error::ResumeError;
pub use error::StepError;
pub use identity::Identity;
pub use init::DEFAULT_CLUSTER_NAME;
pub use lock::{Holder, LockError, NodeLock};
pub use logbuf::{DEFAULT_LOG_BUFFER_BYTES, LogBuffer, LogBufferLayer};
pub use node::Node;
pub use node_state::NodeState;
pub use pki::PkiError;
pub use recover::DEFAULT_RECOVER_PORT;
pub use run::{EXIT_FAILED, EXIT_RESET, EXIT_STOPPED, Failure, Listeners, Outcome, run};
pub use ticket::TicketError;
#[doc(hidden)]
pub use ticket::check_join_ticket;
pub use trust::{ClusterMismatch, ControlPlaneIdentity, JoinServiceTrust};

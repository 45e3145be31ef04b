//! The Asterism join service: nodes that want to join (or rejoin) the cluster connect over
//! attested TLS, and the service answers `join.API` (`IssueJoinTicket`,
//! `IssueRejoinTicket`) with their disk key, the measurement secret, a kubelet certificate,
//! an SSH host certificate, a bootstrap token and, for control-plane nodes, the CA files.
//!
//! Attestation proves *what* a node runs; this service adds *who* it is: the peer's source
//! address must be an instance of the metadata, the CSR must name that instance, the role
//! must match, and a disk's key goes only to the attestation key the disk is bound to
//! (otherwise any attested node could take any disk's key). Handlers take the
//! [`asterism_atls::VerifiedPeer`] of the connection, never raw evidence.
//!
//! * [`JoinService`]: the core, generic over [`asterism_metadata::Metadata`],
//!   [`KeySource`] and [`ClusterState`];
//! * [`serve`] (aTLS + gRPC), [`serve_http`] (metrics, health, members; loopback or
//!   [`serve_http_with`] a bearer token) and [`serve_admin`] (the operator's Unix socket:
//!   members, re-admission);
//! * [`RedbState`]: the default, persistent cluster state in an embedded database;
//! * [`KubeState`]: the cluster state on the Kubernetes API, shared by every replica.
//!
//! It must never log or return a secret except inside a ticket to the attested node it
//! belongs to.
#![forbid(unsafe_code)]

mod error;
mod keys;
mod kube_state;
mod metrics;
mod redb_state;
mod release;
mod request;
mod serve;
mod service;
mod state;

pub use error::{DenyReason, JoinError};
pub use keys::KeySource;
// The key-service client the binary, the tests and the benchmarks build the service with.
pub use asterism_binkit::RateLimiter;
pub use asterism_cluster::InitNode;
pub use asterism_kms::{KeyError, KeyServiceAddress, KeyServiceClient};
pub use kube_state::{JoiningNodes, KubeReleaseError, KubeState};
pub use metrics::Metrics;
pub use redb_state::RedbState;
pub use release::{ClusterRelease, ReleaseError};
pub use serve::{
    HttpAccess, LIMITS, LISTEN_BACKLOG, Limits, MAX_CONNECTIONS_PER_KEY, bind_admin_socket,
    bind_listener, is_loopback, serve, serve_admin, serve_http, serve_http_with,
};
pub use service::{JoinConfig, JoinService, METADATA_CACHE_TTL};
pub use state::{Admission, ClusterState, Member, StateError, TOKEN_MIN_REMAINING, TOKEN_TTL};

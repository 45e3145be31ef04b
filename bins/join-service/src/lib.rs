//! The Asterism join service: nodes that want to join (or rejoin) the cluster connect over
//! attested TLS, and the service answers `join.API` (`IssueJoinTicket`,
//! `IssueRejoinTicket`) with their disk key, the measurement secret, a kubelet certificate,
//! an SSH host certificate, a bootstrap token and, for control-plane nodes, the CA files.
//!
//! Attestation proves *what* a node runs; this service adds *who* it is: the peer's source
//! address must be an instance of the metadata, the CSR must name that instance, the role
//! must match, and a disk's key goes only to the attestation key the disk is bound to
//! (REFERENCE §14 item 3). Handlers take the [`asterism_atls::VerifiedPeer`] of the
//! connection, never raw evidence.
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

mod error;
mod keys;
mod kube_state;
mod metrics;
mod ratelimit;
mod serve;
mod service;
mod state;

pub use error::{DenyReason, JoinError};
pub use keys::{
    KEY_CALL_TIMEOUT, KEY_CALLS_IN_FLIGHT, KeyError, KeyServiceAddress, KeyServiceClient, KeySource,
};
pub use kube_state::{JoiningNodes, KubeState};
pub use metrics::Metrics;
pub use ratelimit::RateLimiter;
pub use serve::{
    HttpAccess, LISTEN_BACKLOG, Limits, bind_admin_socket, bind_listener, is_loopback, serve,
    serve_admin, serve_http, serve_http_with,
};
pub use service::{
    API_SERVER_PORT, CONTROL_PLANE_FILES, JoinConfig, JoinService, METADATA_CACHE_TTL,
    REQUIRED_CONTROL_PLANE_FILES,
};
pub use state::{
    Admission, BootstrapToken, ClusterState, InitNode, Member, RedbState, StateError,
    TOKEN_MIN_REMAINING, TOKEN_TTL,
};

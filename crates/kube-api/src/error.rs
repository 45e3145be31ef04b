//! Every way a Kubernetes API operation can fail, classified once (from the HTTP status and the
//! API's `Status` reason) so that callers can tell "retry later" from "fix the cluster".

use std::path::PathBuf;
use std::time::Duration;

/// Why a Kubernetes API operation failed. `op` names the operation and object
/// (`create Secret kube-system/bootstrap-token-abcdef`); no variant carries a secret.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The kubeconfig could not be read or used.
    #[error("loading the kubeconfig {path}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// The in-cluster configuration (service account) could not be loaded.
    #[error("loading the in-cluster configuration")]
    InCluster(#[source] kube::config::InClusterError),
    /// The client could not be built from the configuration (TLS material, URL).
    #[error("building the Kubernetes client")]
    Client(#[source] kube::Error),
    /// The API server did not answer successfully before the deadline.
    #[error("the API server was not ready within {waited:?} ({attempts} attempts)")]
    NotReady {
        /// How long it was waited for.
        waited: Duration,
        /// How many requests were made.
        attempts: u32,
        /// The last failure.
        #[source]
        last: Box<ApiError>,
    },
    /// The credentials were rejected (401).
    #[error("{op}: the API server rejected the credentials")]
    Unauthorized {
        /// The operation.
        op: String,
    },
    /// RBAC refused the operation (403): the service account lacks a permission.
    #[error("{op}: forbidden: {message}")]
    Forbidden {
        /// The operation.
        op: String,
        /// The API server's message (names the missing verb and resource).
        message: String,
    },
    /// The object does not exist (404).
    #[error("{op}: not found")]
    NotFound {
        /// The operation.
        op: String,
    },
    /// A resource type the operation needs is not served (404 on a create or apply: its
    /// CustomResourceDefinition is not installed).
    #[error("{op}: the resource type is not installed (is its CustomResourceDefinition applied?)")]
    NotInstalled {
        /// The operation.
        op: String,
    },
    /// A create found the object already there (409 `AlreadyExists`).
    #[error("{op}: already exists")]
    AlreadyExists {
        /// The operation.
        op: String,
    },
    /// An update lost a race (409 `Conflict`: the resourceVersion moved on), also after the
    /// retries this module makes.
    #[error("{op}: conflicting concurrent update: {message}")]
    Conflict {
        /// The operation.
        op: String,
        /// The API server's message.
        message: String,
    },
    /// The API server answered with a server-side failure or asked to slow down (429, 5xx):
    /// retry later.
    #[error("{op}: the API server failed ({code} {reason}): {message}")]
    Server {
        /// The operation.
        op: String,
        /// HTTP status code.
        code: u16,
        /// The `Status` reason (`InternalError`, `ServiceUnavailable`, `TooManyRequests`, …).
        reason: String,
        /// The API server's message.
        message: String,
    },
    /// The API server refused the request for another reason (400, 405, 422, …): a bug or a
    /// version skew, not worth retrying.
    #[error("{op}: rejected ({code} {reason}): {message}")]
    Rejected {
        /// The operation.
        op: String,
        /// HTTP status code.
        code: u16,
        /// The `Status` reason.
        reason: String,
        /// The API server's message.
        message: String,
    },
    /// The API server could not be reached or its answer not read (connection, TLS, timeout,
    /// undecodable body).
    #[error("{op}: no usable answer from the API server")]
    Unreachable {
        /// The operation.
        op: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// An object this module reads does not have the expected shape.
    #[error("{object}: malformed: {detail}")]
    Malformed {
        /// The object.
        object: String,
        /// What is wrong (never a secret value).
        detail: String,
    },
    /// The disk UUID is bound to another attestation key.
    #[error("disk {uuid} is bound to another attestation key")]
    DiskBoundToOtherKey {
        /// The disk.
        uuid: String,
    },
    /// The attestation key is claimed by another node: one key is one node.
    #[error("the attestation key is claimed by node {member}")]
    KeyClaimedByOtherNode {
        /// The node that holds the claim.
        member: String,
    },
    /// A member came back with another attestation key and no operator re-admitted it.
    #[error("node {name} is a member with another attestation key and was not re-admitted")]
    MemberKeyChanged {
        /// The node.
        name: String,
    },
    /// Another control-plane node holds the `control-plane` JoiningNode: control-plane joins
    /// are serialised; retry later.
    #[error("control-plane node {joining:?} is joining; one control-plane node joins at a time")]
    ControlPlaneJoinInProgress {
        /// The node named in the existing JoiningNode.
        joining: String,
    },
    /// A DaemonSet did not have a ready pod on every node it runs on before the deadline.
    #[error("DaemonSet kube-system/{name} was not ready within {waited:?}: {status}")]
    DaemonSetNotReady {
        /// The DaemonSet.
        name: String,
        /// How long it was waited for.
        waited: Duration,
        /// What was last seen (pods ready, or the last read error).
        status: String,
    },
    /// `join-config` holds another measurement salt. The salt is fixed at init (the cluster
    /// ID derives from it) and is never overwritten.
    #[error("kube-system/join-config holds another measurement salt; it never changes after init")]
    SaltMismatch,
    /// A components ConfigMap whose list does not hash to its name: the name is what nodes
    /// and the NodeVersion refer to, so this content is not the list they mean.
    #[error("ConfigMap kube-system/{name}: its components hash to {content_hash}, not to its name")]
    ComponentsMismatch {
        /// The ConfigMap.
        name: String,
        /// What its list hashes to (`sha256:<hex>`).
        content_hash: String,
    },
    /// An argument is not usable as (part of) an object name or value.
    #[error("invalid {what}: {detail}")]
    InvalidInput {
        /// Which argument.
        what: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// The system random number generator failed.
    #[error("the system random number generator failed")]
    Random,
}

impl ApiError {
    /// What makes the [`ApiError::Malformed`] errors of one `object` from their details.
    pub(crate) fn malformed_in(object: String) -> impl Fn(&str) -> ApiError {
        move |detail| ApiError::Malformed {
            object: object.clone(),
            detail: detail.to_owned(),
        }
    }

    /// Whether the same call may succeed later without anyone changing the cluster: the API
    /// server is unreachable, overloaded or failing, a race was lost, or another control-plane
    /// node is joining.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Server { .. }
            | Self::Unreachable { .. }
            | Self::Conflict { .. }
            | Self::NotReady { .. }
            | Self::DaemonSetNotReady { .. }
            | Self::ControlPlaneJoinInProgress { .. } => true,
            Self::Kubeconfig { .. }
            | Self::InCluster(_)
            | Self::Client(_)
            | Self::Unauthorized { .. }
            | Self::Forbidden { .. }
            | Self::NotFound { .. }
            | Self::NotInstalled { .. }
            | Self::AlreadyExists { .. }
            | Self::Rejected { .. }
            | Self::Malformed { .. }
            | Self::DiskBoundToOtherKey { .. }
            | Self::KeyClaimedByOtherNode { .. }
            | Self::MemberKeyChanged { .. }
            | Self::SaltMismatch
            | Self::ComponentsMismatch { .. }
            | Self::InvalidInput { .. }
            | Self::Random => false,
        }
    }

    /// Classifies a kube-rs error of operation `op`.
    pub(crate) fn from_kube(op: impl Into<String>, e: kube::Error) -> Self {
        let op = op.into();
        match e {
            kube::Error::Api(status) => {
                let code = status.code;
                let reason = status.reason.clone();
                let message = status.message.clone();
                match code {
                    401 => Self::Unauthorized { op },
                    403 => Self::Forbidden { op, message },
                    404 => Self::NotFound { op },
                    409 if reason == "AlreadyExists" => Self::AlreadyExists { op },
                    409 => Self::Conflict { op, message },
                    429 | 500..=599 => Self::Server {
                        op,
                        code,
                        reason,
                        message,
                    },
                    _ => Self::Rejected {
                        op,
                        code,
                        reason,
                        message,
                    },
                }
            }
            other => Self::Unreachable { op, source: other },
        }
    }
}

/// Result of this module.
pub type Result<T, E = ApiError> = std::result::Result<T, E>;

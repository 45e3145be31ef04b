//! Every way a ticket request can fail, and the one place that maps them to gRPC status
//! codes: client mistakes are `INVALID_ARGUMENT` or `PERMISSION_DENIED` with a reason the
//! node can act on, an unreachable dependency is `UNAVAILABLE`, everything else is
//! `INTERNAL` with a coarse message (the full chain goes to the log only).

use crate::state::StateError;
use asterism_kms::KeyError;
use asterism_metadata::MetadataError;
use tonic::{Code, Status};

/// Why the join service refused a node although it attested.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenyReason {
    /// The peer's source address belongs to no instance in the metadata.
    UnknownPeer,
    /// The CSR names another node than the instance the peer is.
    NodeNameMismatch,
    /// The CSR asks for IP addresses that are not the peer's.
    IpMismatch,
    /// `is_control_plane` does not match the instance's role.
    RoleMismatch,
    /// The disk UUID is bound to another attestation key.
    DiskBoundToOtherKey,
    /// A rejoin names a disk bound to no attestation key.
    DiskUnbound,
    /// A new disk for an attestation key (a member) that already has one, without an
    /// operator's re-admission.
    SecondDisk,
    /// A member came back with another attestation key and was not re-admitted.
    MemberKeyChanged,
    /// A member asked for another role than it was admitted in, and was not re-admitted.
    MemberRoleChanged,
    /// The attestation key is a member under another name.
    KeyIsAnotherMember,
    /// The SSH host certificate would name a host the peer is not.
    PrincipalNotAllowed,
}

impl DenyReason {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::UnknownPeer => "unknown_peer",
            Self::NodeNameMismatch => "node_name_mismatch",
            Self::IpMismatch => "ip_mismatch",
            Self::RoleMismatch => "role_mismatch",
            Self::DiskBoundToOtherKey => "disk_bound_to_other_key",
            Self::DiskUnbound => "disk_unbound",
            Self::SecondDisk => "second_disk",
            Self::MemberKeyChanged => "member_key_changed",
            Self::MemberRoleChanged => "member_role_changed",
            Self::KeyIsAnotherMember => "key_is_another_member",
            Self::PrincipalNotAllowed => "principal_not_allowed",
        }
    }
}

/// Why a ticket request failed.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// The connection was not attested (cannot happen behind aTLS; defensive).
    #[error("peer is not attested")]
    NotAttested,
    /// The request is malformed.
    #[error("invalid {field}: {detail}")]
    Invalid {
        /// Which field.
        field: &'static str,
        /// What is wrong (no secrets).
        detail: String,
    },
    /// An authorization check refused the peer.
    #[error("{detail}")]
    Denied {
        /// Which check.
        reason: DenyReason,
        /// What it found (no secrets).
        detail: String,
    },
    /// The peer's identity exceeded its request rate.
    #[error("too many requests from this attestation key")]
    RateLimited,
    /// The key service cannot be reached.
    #[error("key service unavailable")]
    KeyServiceUnavailable(#[source] KeyError),
    /// The metadata service cannot be reached.
    #[error("metadata service unavailable")]
    MetadataUnavailable(#[source] MetadataError),
    /// The cluster state (the Kubernetes API) cannot be reached or is busy.
    #[error("cluster state unavailable")]
    ClusterStateUnavailable(#[source] StateError),
    /// Anything else.
    #[error("{what}")]
    Internal {
        /// What was being done.
        what: &'static str,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl JoinError {
    /// An internal failure while doing `what`.
    pub fn internal(
        what: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::Internal {
            what,
            source: source.into(),
        }
    }

    /// The metric label of the refusal.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotAttested => "not_attested",
            Self::Invalid { field, .. } => field,
            Self::Denied { reason, .. } => reason.label(),
            Self::RateLimited => "rate_limited",
            Self::KeyServiceUnavailable(_) => "key_service_unavailable",
            Self::MetadataUnavailable(_) => "metadata_unavailable",
            Self::ClusterStateUnavailable(_) => "cluster_state_unavailable",
            Self::Internal { .. } => "internal",
        }
    }

    /// The gRPC status the peer sees.
    pub fn to_status(&self) -> Status {
        match self {
            Self::NotAttested | Self::Denied { .. } => {
                Status::new(Code::PermissionDenied, self.to_string())
            }
            Self::Invalid { .. } => Status::new(Code::InvalidArgument, self.to_string()),
            Self::RateLimited => Status::new(Code::ResourceExhausted, self.to_string()),
            Self::KeyServiceUnavailable(_)
            | Self::MetadataUnavailable(_)
            | Self::ClusterStateUnavailable(_) => {
                Status::new(Code::Unavailable, format!("{self}; retry later"))
            }
            Self::Internal { .. } => Status::new(Code::Internal, "issuing the ticket failed"),
        }
    }
}

impl From<KeyError> for JoinError {
    fn from(e: KeyError) -> Self {
        match e {
            KeyError::Unavailable(_) => Self::KeyServiceUnavailable(e),
            other => Self::internal("getting a data key", other),
        }
    }
}

/// The error and its causes, `: `-separated, for the log.
pub use asterism_binkit::error_chain as chain;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_follow_who_is_at_fault() {
        let cases = [
            (JoinError::NotAttested, Code::PermissionDenied),
            (
                JoinError::Invalid {
                    field: "disk_uuid",
                    detail: "x".into(),
                },
                Code::InvalidArgument,
            ),
            (
                JoinError::Denied {
                    reason: DenyReason::RoleMismatch,
                    detail: "x".into(),
                },
                Code::PermissionDenied,
            ),
            (JoinError::RateLimited, Code::ResourceExhausted),
            (
                JoinError::from(KeyError::Unavailable("down".into())),
                Code::Unavailable,
            ),
            (
                JoinError::from(KeyError::Length { want: 32, got: 1 }),
                Code::Internal,
            ),
            (
                JoinError::ClusterStateUnavailable(StateError::Unavailable("busy".into())),
                Code::Unavailable,
            ),
        ];
        for (e, code) in cases {
            assert_eq!(e.to_status().code(), code, "{e:?}");
        }
    }

    #[test]
    fn internal_errors_tell_the_peer_nothing_specific() {
        let e = JoinError::internal("reading /secret/path", std::io::Error::other("boom"));
        assert_eq!(e.to_status().message(), "issuing the ticket failed");
        assert!(chain(&e).contains("boom"));
    }
}

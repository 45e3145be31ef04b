//! The cluster's membership state: bootstrap tokens, members and disk bindings, behind the
//! [`ClusterState`] trait. The default implementation, [`crate::RedbState`]
//! (`redb_state.rs`), keeps them in an embedded database file so they survive restarts;
//! [`crate::KubeState`] keeps them in Kubernetes.

use asterism_attestation::AkFingerprint;
use asterism_cluster::{ExpiringToken, InitNode, Role};
use asterism_kms::DiskUuid;
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::time::{Duration, SystemTime};

/// How long a minted bootstrap token is valid: 15 min, ample for a node to run `kubeadm join`.
pub const TOKEN_TTL: Duration = Duration::from_secs(15 * 60);
/// A stored token is handed out again while it has at least this long left.
pub const TOKEN_MIN_REMAINING: Duration = Duration::from_secs(5 * 60);

/// Why a state operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The disk UUID is bound to another attestation key.
    #[error("disk {uuid} is bound to another attestation key")]
    DiskBoundToOtherKey {
        /// The disk.
        uuid: String,
    },
    /// A rejoin names a disk that is bound to no attestation key: no node ever received
    /// its key from this cluster, so none may now.
    #[error("disk {uuid} is bound to no attestation key")]
    DiskUnbound {
        /// The disk.
        uuid: String,
    },
    /// A member came back with another attestation key and no operator re-admitted it.
    #[error(
        "node {name} is a member with another attestation key; an operator must re-admit it (asterism readmit {name})"
    )]
    MemberKeyChanged {
        /// The node.
        name: String,
    },
    /// A member asked for another role than the one it was admitted in, and no operator
    /// re-admitted it. A worker stays a worker whatever the metadata comes to say: a
    /// worker that could change its own record (a cloud label it may set) cannot make
    /// itself the control plane.
    #[error(
        "node {name} is a member as {was}, not {asked}; a change of role needs an operator to re-admit it (asterism readmit {name})"
    )]
    MemberRoleChanged {
        /// The node.
        name: String,
        /// The role it was admitted in.
        was: String,
        /// The role it asked for.
        asked: Role,
    },
    /// The attestation key is a member under another name. One key is one node: a joined
    /// node's key may not take the name of a node that has not joined (a control-plane
    /// name among them), whatever address it asks from.
    #[error("attestation key {ak} is member {member}; a node keeps its one name")]
    KeyIsAnotherMember {
        /// The attestation key.
        ak: String,
        /// The member it is.
        member: String,
    },
    /// A new disk for an attestation key that already has one: a member's first disk is
    /// its only one, and another needs an operator (`asterism readmit`).
    #[error(
        "attestation key {ak} already has disk {bound}; a second disk ({requested}) needs an operator to re-admit the node (asterism readmit)"
    )]
    SecondDisk {
        /// The attestation key.
        ak: String,
        /// The disk it is bound to.
        bound: String,
        /// The disk it asked for.
        requested: String,
    },
    /// The node is no member.
    #[error("node {name} is no member")]
    NoSuchMember {
        /// The node.
        name: String,
    },
    /// The store cannot be reached or is busy (the API server is down or overloaded, a race
    /// was lost, another control-plane node is joining): the same request may succeed later.
    #[error("cluster state unavailable")]
    Unavailable(#[source] Cause),
    /// The store failed.
    #[error("cluster state store: {what}")]
    Store {
        /// What failed.
        what: String,
        /// Why, when another error says it.
        #[source]
        source: Option<Cause>,
    },
}

/// The cause a [`StateError`] carries, kept whole so that the log shows the full chain.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

impl StateError {
    /// A store failure of `what`, with no further cause.
    pub fn store_failed(what: impl Into<String>) -> Self {
        StateError::Store {
            what: what.into(),
            source: None,
        }
    }

    /// A store failure of `what`, caused by `source`.
    pub fn store_caused(what: impl Into<String>, source: impl Into<Cause>) -> Self {
        StateError::Store {
            what: what.into(),
            source: Some(source.into()),
        }
    }
}

/// A node admitted to the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Node name (from the metadata, equal to the CSR's).
    pub name: String,
    /// Role.
    pub role: String,
    /// The attested AK identity of the node's last ticket.
    pub ak: String,
    /// The state disk (UUID) of the node's last ticket, or of its init record; empty in
    /// records written before members carried it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub disk: String,
    /// When the node was first admitted (Unix seconds).
    pub admitted_at: u64,
    /// When the node last received a ticket (Unix seconds).
    pub last_ticket_at: u64,
    /// How many join tickets the node has received.
    pub tickets: u64,
    /// An operator re-admitted the node (`asterism readmit`): its next join ticket may
    /// come with another attestation key, which then replaces `ak`.
    #[serde(default)]
    pub readmit: bool,
}

impl Member {
    /// Whether a join ticket with attestation key `ak` may update this record: the same key,
    /// or another one after an operator re-admitted the node.
    pub fn accepts(&self, ak: &AkFingerprint) -> bool {
        is_ak(&self.ak, ak) || self.readmit
    }

    /// Why a join ticket with `ak` in `role` may not update this record, if it may not:
    /// another key, or another role than the one it was admitted in, unless an operator
    /// re-admitted the node.
    pub fn refusal(&self, ak: &AkFingerprint, role: Role) -> Option<StateError> {
        if !self.accepts(ak) {
            return Some(StateError::MemberKeyChanged {
                name: self.name.clone(),
            });
        }
        (!self.readmit && self.role != role.as_str()).then(|| StateError::MemberRoleChanged {
            name: self.name.clone(),
            was: self.role.clone(),
            asked: role,
        })
    }
}

/// Whether `stored`, an AK identity as the state keeps it (the fingerprint's hex, as
/// written from an [`AkFingerprint`]), names `ak`.
pub(crate) fn is_ak(stored: &str, ak: &AkFingerprint) -> bool {
    stored == ak.to_string()
}

/// What a successful join records: the node, its role, its attested identity and disk.
#[derive(Debug, Clone)]
pub struct Admission {
    /// Node name.
    pub name: String,
    /// Role.
    pub role: Role,
    /// The attested AK identity.
    pub ak: AkFingerprint,
    /// The state disk.
    pub disk: DiskUuid,
    /// Now.
    pub now: SystemTime,
}

/// The cluster state the join service needs. Every method is atomic.
pub trait ClusterState: Send + Sync + 'static {
    /// Succeeds if `disk` is bound to `ak`, or unbound and `ak` has no disk yet (or node
    /// `name` was re-admitted by an operator): a join may bind it. Fails with
    /// [`StateError::DiskBoundToOtherKey`] or [`StateError::SecondDisk`]; writes nothing.
    fn check_disk(
        &self,
        disk: &DiskUuid,
        ak: &AkFingerprint,
        name: &str,
    ) -> impl Future<Output = Result<(), StateError>> + Send;

    /// Succeeds only if `disk` is bound to `ak` (a rejoin binds nothing): fails with
    /// [`StateError::DiskUnbound`] if no key holds it and
    /// [`StateError::DiskBoundToOtherKey`] if another does. Writes nothing.
    fn check_rejoin(
        &self,
        disk: &DiskUuid,
        ak: &AkFingerprint,
    ) -> impl Future<Output = Result<(), StateError>> + Send;

    /// Succeeds if node `name` is no member, or a member that [`Member::refusal`] lets have
    /// a ticket with `ak` in `role`; otherwise [`StateError::MemberKeyChanged`] or
    /// [`StateError::MemberRoleChanged`]. Writes nothing.
    fn check_member(
        &self,
        name: &str,
        ak: &AkFingerprint,
        role: Role,
    ) -> impl Future<Output = Result<(), StateError>> + Send;

    /// Succeeds if [`ClusterState::admit`] of `a` would, as the state is now: the checks of
    /// [`ClusterState::check_disk`], then of [`ClusterState::check_member`]. Writes
    /// nothing. A join runs it before it signs anything, so a refused node costs no
    /// signature and no key; `admit` checks again in its own transaction.
    fn check_admission(
        &self,
        a: &Admission,
    ) -> impl Future<Output = Result<(), StateError>> + Send {
        async move {
            self.check_disk(&a.disk, &a.ak, &a.name).await?;
            self.check_member(&a.name, &a.ak, a.role).await
        }
    }

    /// Records the init node: binds its disk to its AK and records it as a member, unless
    /// both are already there. Fails with [`StateError::DiskBoundToOtherKey`] or
    /// [`StateError::MemberKeyChanged`] (writing nothing) if the state says otherwise.
    fn record_init_node(
        &self,
        init: &InitNode,
        now: SystemTime,
    ) -> impl Future<Output = Result<(), StateError>> + Send;

    /// Lets member `name` receive its next join ticket with another attestation key
    /// (`asterism readmit`); [`StateError::NoSuchMember`] if there is none.
    fn allow_readmission(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Member, StateError>> + Send;

    /// In one transaction: binds the disk (unless another key holds it, or the key has
    /// another disk and the member was not re-admitted), records the
    /// member (one record per node name; a member with another AK only after
    /// [`ClusterState::allow_readmission`], which this clears), and returns a bootstrap
    /// token (a stored one with at least [`TOKEN_MIN_REMAINING`] left, or a new one valid
    /// for [`TOKEN_TTL`]). Nothing is written if the disk belongs to another key or the
    /// member to another key.
    fn admit(
        &self,
        admission: Admission,
    ) -> impl Future<Output = Result<ExpiringToken, StateError>> + Send;

    /// All members, by name.
    fn members(&self) -> impl Future<Output = Result<Vec<Member>, StateError>> + Send;
}

/// The init node's AK identity, parsed from its record.
pub(crate) fn init_node_ak(init: &InitNode) -> Result<AkFingerprint, StateError> {
    AkFingerprint::from_hex(&init.ak)
        .map_err(|e| StateError::store_caused("the init node's attestation key identity", e))
}

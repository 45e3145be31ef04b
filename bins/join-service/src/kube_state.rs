//! [`ClusterState`] on the Kubernetes API ([`asterism_kube_api`]), so that every
//! join-service replica on every control-plane node sees the same tokens, disk bindings and
//! members (docs/kubernetes-api.md).

use crate::error::chain;
use crate::release::{ClusterRelease, ReleaseError};
use crate::state::{
    Admission, ClusterState, Member, StateError, TOKEN_MIN_REMAINING, TOKEN_TTL, init_node_ak,
    is_ak,
};
use asterism_attestation::AkFingerprint;
use asterism_cluster::{ExpiringToken, InitNode, Role};
use asterism_kms::DiskUuid;
use asterism_kube_api::{ApiError, ClusterApi, JoiningNode, MemberRecord, TokenPolicy};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// What to do when the JoiningNode resource type (a CustomResourceDefinition of the node
/// operator) or the NodeVersion naming the components is not there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoiningNodes {
    /// Every join writes its JoiningNode; without the CRD or the NodeVersion a join fails
    /// (for a cluster whose node operator is installed and relies on the records).
    Required,
    /// Write JoiningNode records when the CRD and the NodeVersion exist; otherwise skip them
    /// with a warning. Control-plane joins are then **not serialised**.
    WhenInstalled,
}

/// Why the cluster's release could not be read from the Kubernetes API.
#[derive(Debug, thiserror::Error)]
pub enum KubeReleaseError {
    /// The NodeVersion or the components ConfigMap could not be read, or the ConfigMap's
    /// list does not hash to its name ([`ApiError::ComponentsMismatch`]).
    #[error("reading the cluster's Kubernetes components")]
    Api(#[source] ApiError),
    /// The ConfigMap's version or a component's hash is malformed.
    #[error("the components ConfigMap {name}")]
    Release {
        /// The ConfigMap.
        name: String,
        /// What is wrong.
        #[source]
        source: ReleaseError,
    },
}

/// [`ClusterState`] on the Kubernetes API. Per join: a read and (first time only) a create
/// for the disk binding, the JoiningNode (a NodeVersion read and a create or apply), a
/// token list (a create only when no stored token has 5 minutes left), and the member
/// record (a read and a create or update).
pub struct KubeState {
    api: ClusterApi,
    joining_nodes: JoiningNodes,
    warned: AtomicBool,
}

impl std::fmt::Debug for KubeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeState")
            .field("joining_nodes", &self.joining_nodes)
            .finish_non_exhaustive()
    }
}

/// The token policy of both implementations: 15 min, reused while 5 min are left.
fn token_policy() -> TokenPolicy {
    TokenPolicy {
        ttl: TOKEN_TTL,
        min_remaining: TOKEN_MIN_REMAINING,
    }
}

/// The one place API errors become state errors: a disk of another key is a refusal,
/// whatever may pass with time is "unavailable", the rest is a store failure.
fn state_error(e: ApiError) -> StateError {
    match e {
        ApiError::DiskBoundToOtherKey { uuid } => StateError::DiskBoundToOtherKey { uuid },
        ApiError::MemberKeyChanged { name } => StateError::MemberKeyChanged { name },
        e if e.is_retryable() => StateError::Unavailable(Box::new(e)),
        e => StateError::store_caused("the Kubernetes API", e),
    }
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn member(r: MemberRecord) -> Member {
    Member {
        name: r.name,
        role: r.role,
        ak: r.ak,
        // Empty in records written before members carried their disk: such a member is
        // left out of the signed control-plane list until its next ticket.
        disk: r.disk,
        admitted_at: unix(r.admitted_at),
        last_ticket_at: unix(r.last_ticket_at),
        tickets: r.tickets,
        readmit: r.readmit,
    }
}

impl KubeState {
    /// The state on the cluster `api` talks to.
    pub fn new(api: ClusterApi, joining_nodes: JoiningNodes) -> Self {
        Self {
            api,
            joining_nodes,
            warned: AtomicBool::new(false),
        }
    }

    /// Writes the JoiningNode of an admitted node (docs/kubernetes-api.md) per the policy.
    async fn joining_node(&self, a: &Admission) -> Result<(), StateError> {
        let skip = |e: &ApiError| {
            self.joining_nodes == JoiningNodes::WhenInstalled
                && matches!(e, ApiError::NotFound { .. } | ApiError::NotInstalled { .. })
        };
        let record = match self.api.components_reference().await {
            Ok(reference) => {
                JoiningNode::new(&a.name, &reference, a.role == Role::ControlPlane, a.now)
            }
            Err(e) if skip(&e) => {
                self.warn_skipped(&e);
                return Ok(());
            }
            Err(e) => return Err(state_error(e)),
        };
        match self.api.add_joining_node(&record).await {
            Ok(()) => Ok(()),
            Err(e) if skip(&e) => {
                self.warn_skipped(&e);
                Ok(())
            }
            Err(e) => Err(state_error(e)),
        }
    }

    /// The cluster's Kubernetes version and components: the components ConfigMap the
    /// NodeVersion names, checked to hash to its name and then as a release. Without the
    /// NodeVersion (or its CRD) and with [`JoiningNodes::WhenInstalled`], `None` with a
    /// warning: tickets then carry no components.
    pub async fn release(&self) -> Result<Option<ClusterRelease>, KubeReleaseError> {
        let name = match self.api.components_reference().await {
            Ok(name) => name,
            Err(e @ (ApiError::NotFound { .. } | ApiError::NotInstalled { .. }))
                if self.joining_nodes == JoiningNodes::WhenInstalled =>
            {
                tracing::warn!(error = %chain(&e), "no NodeVersion names the cluster's components: join tickets carry none");
                return Ok(None);
            }
            Err(e) => return Err(KubeReleaseError::Api(e)),
        };
        let recorded = self
            .api
            .components_config_map(&name)
            .await
            .map_err(KubeReleaseError::Api)?;
        let components = recorded.components.into_iter().map(Into::into).collect();
        let release = ClusterRelease::parse(&recorded.cluster_version, components)
            .map_err(|source| KubeReleaseError::Release { name, source })?;
        Ok(Some(release))
    }

    fn warn_skipped(&self, e: &ApiError) {
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(error = %chain(e), "writing no JoiningNode records (--joining-nodes when-installed): control-plane joins are not serialised");
        } else {
            tracing::debug!(error = %chain(e), "no JoiningNode record written");
        }
    }

    /// Refuses `ak` (hex) for member `name` if it is a member under another name: one key
    /// is one node. The member records are read whole (the API has no index by key). This
    /// read alone is not atomic with the later writes; what makes the rule hold under
    /// concurrency is the key's claim ([`ClusterApi::claim_key`]), which [`Self::admit`]
    /// and [`Self::record_init_node`] take before they write anything else. This check
    /// also covers members recorded before claims existed.
    async fn key_free_for(&self, ak: &str, name: &str) -> Result<(), StateError> {
        let members = self.api.members().await.map_err(state_error)?;
        match members.into_iter().find(|m| m.ak == ak && m.name != name) {
            Some(other) => Err(StateError::KeyIsAnotherMember {
                ak: ak.to_owned(),
                member: other.name,
            }),
            None => Ok(()),
        }
    }

    /// Claims `ak` (hex) for node `name` and its disk ([`ClusterApi::claim_key`]); a key
    /// another node claimed is [`StateError::KeyIsAnotherMember`]. One key also binds one
    /// new disk under concurrency: the claim names the disk of the key's first admission,
    /// and a claim of another disk lets the request on only if the member's record already
    /// names this disk (moved there after an operator's re-admission) or the member is
    /// re-admitted now. Of two simultaneous first requests of one key for two disks, the
    /// one whose claim lost is refused [`StateError::SecondDisk`] before it binds anything.
    async fn claim_key(
        &self,
        ak: &str,
        name: &str,
        disk: &DiskUuid,
        now: SystemTime,
    ) -> Result<(), StateError> {
        let claim = match self.api.claim_key(ak, name, disk.as_str(), now).await {
            Err(ApiError::KeyClaimedByOtherNode { member }) => {
                return Err(StateError::KeyIsAnotherMember {
                    ak: ak.to_owned(),
                    member,
                });
            }
            other => other.map_err(state_error)?,
        };
        let Some(first) = claim.disk.filter(|d| d != disk.as_str()) else {
            return Ok(());
        };
        match self.api.member(name).await.map_err(state_error)? {
            Some(m) if m.ak == ak && (m.readmit || m.disk == disk.as_str()) => Ok(()),
            _ => Err(StateError::SecondDisk {
                ak: ak.to_owned(),
                bound: first,
                requested: disk.as_str().to_owned(),
            }),
        }
    }
}

impl ClusterState for KubeState {
    /// The disk of another key is refused by the API's check; a new disk for a member
    /// (not re-admitted) whose key it is, by the member rule: every member's first
    /// admission bound its disk, so a member may only name a disk already bound to its key.
    /// (The embedded store also refuses a second disk for a key under another name; here the
    /// member's name, tied to its address by the metadata check, is what holds it.)
    async fn check_disk(
        &self,
        disk: &DiskUuid,
        ak: &AkFingerprint,
        name: &str,
    ) -> Result<(), StateError> {
        let ak = ak.to_string();
        self.api
            .check_disk(disk.as_str(), &ak)
            .await
            .map_err(state_error)?;
        let Some(member) = self.api.member(name).await.map_err(state_error)? else {
            return Ok(());
        };
        if member.ak != ak || member.readmit {
            return Ok(());
        }
        match self
            .api
            .disk_binding(disk.as_str())
            .await
            .map_err(state_error)?
        {
            Some(b) if b.ak == ak => Ok(()),
            _ => Err(StateError::SecondDisk {
                ak,
                bound: "(recorded in its disk binding)".to_owned(),
                requested: disk.as_str().to_owned(),
            }),
        }
    }

    async fn check_rejoin(&self, disk: &DiskUuid, ak: &AkFingerprint) -> Result<(), StateError> {
        match self
            .api
            .disk_binding(disk.as_str())
            .await
            .map_err(state_error)?
        {
            None => Err(StateError::DiskUnbound {
                uuid: disk.as_str().to_owned(),
            }),
            Some(b) if !is_ak(&b.ak, ak) => Err(StateError::DiskBoundToOtherKey {
                uuid: disk.as_str().to_owned(),
            }),
            Some(_) => Ok(()),
        }
    }

    async fn check_member(
        &self,
        name: &str,
        ak: &AkFingerprint,
        role: Role,
    ) -> Result<(), StateError> {
        let record = self.api.member(name).await.map_err(state_error)?;
        match record.and_then(|r| member(r).refusal(ak, role)) {
            Some(refused) => Err(refused),
            None => self.key_free_for(&ak.to_string(), name).await,
        }
    }

    /// The member first (a record of another key refuses before anything is written), then
    /// the disk binding, then the member record.
    async fn record_init_node(&self, init: &InitNode, now: SystemTime) -> Result<(), StateError> {
        let disk = DiskUuid::parse(&init.disk)
            .map_err(|e| StateError::store_caused("the init node's disk UUID", e))?;
        let ak = init_node_ak(init)?.to_string();
        if let Some(m) = self.api.member(&init.name).await.map_err(state_error)?
            && m.ak != ak
        {
            return Err(StateError::MemberKeyChanged {
                name: init.name.clone(),
            });
        }
        self.key_free_for(&ak, &init.name).await?;
        self.claim_key(&ak, &init.name, &disk, now).await?;
        self.api
            .bind_disk(disk.as_str(), &ak, now)
            .await
            .map_err(state_error)?;
        self.api
            .record_init_member(&init.name, init.role.as_str(), &ak, disk.as_str(), now)
            .await
            .map_err(state_error)
    }

    async fn allow_readmission(&self, name: &str) -> Result<Member, StateError> {
        match self.api.allow_readmission(name).await {
            Ok(r) => Ok(member(r)),
            Err(ApiError::NotFound { .. }) => Err(StateError::NoSuchMember {
                name: name.to_owned(),
            }),
            Err(e) => Err(state_error(e)),
        }
    }

    /// Not one transaction, but in an order where each step is safe to repeat and a refusal
    /// comes before any write: the member's key is checked first (a member of another key
    /// writes nothing; `record_member` checks again under its resourceVersion), then the
    /// disk binding (a disk of another key writes nothing), then the key's claim (the
    /// atomic step of "one key is one node": of two requests of one key under two names,
    /// only one claims it), the disk binding, the JoiningNode (a control-plane join in
    /// progress refuses before a token is minted), the token, and the member record last.
    async fn admit(&self, a: Admission) -> Result<ExpiringToken, StateError> {
        self.check_member(&a.name, &a.ak, a.role).await?;
        self.check_disk(&a.disk, &a.ak, &a.name).await?;
        let ak = a.ak.to_string();
        self.claim_key(&ak, &a.name, &a.disk, a.now).await?;
        self.api
            .bind_disk(a.disk.as_str(), &ak, a.now)
            .await
            .map_err(state_error)?;
        self.joining_node(&a).await?;
        let token = self
            .api
            .bootstrap_token(a.now, token_policy())
            .await
            .map_err(state_error)?;
        self.api
            .record_member(&a.name, a.role.as_str(), &ak, a.disk.as_str(), a.now)
            .await
            .map_err(state_error)?;
        Ok(token)
    }

    async fn members(&self) -> Result<Vec<Member>, StateError> {
        let records = self.api.members().await.map_err(state_error)?;
        Ok(records.into_iter().map(member).collect())
    }
}

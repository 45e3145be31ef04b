//! The join service's cluster state on the API, where every replica sees it: disk-to-AK
//! bindings and members as ConfigMaps in `kube-system`, and JoiningNode records
//!.
//!
//! * A disk binding is an **immutable** ConfigMap `asterism-disk-<uuid>` created once: the
//!   API server's create is the atomic "first writer wins"; a create answered `AlreadyExists`
//!   reads the winner and refuses another AK.
//! * A key claim is an **immutable** ConfigMap `asterism-ak-<fingerprint>` created the same
//!   way: the first node to claim an attestation key holds it, and a request of that key
//!   under another name is refused, also when two replicas (or two requests) race.
//! * A member is a ConfigMap `asterism-member-<node>`, updated with its resourceVersion
//!   (optimistic concurrency; a lost race reads and tries again).
//! * A JoiningNode is created for a control-plane node (an existing one of another node
//!   serialises control-plane joins) and applied server-side for a worker.

use super::error::{ApiError, Result};
use super::{
    ClusterApi, MANAGED_BY, MANAGED_BY_LABEL, NAMESPACE, RECORD_LABEL, labels, rfc3339, timestamp,
};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

/// Name prefix of disk-binding ConfigMaps (the lower-case disk UUID follows).
pub const DISK_PREFIX: &str = "asterism-disk-";
/// Name prefix of key-claim ConfigMaps (the AK fingerprint, 64 lower-case hex digits,
/// follows).
pub const AK_PREFIX: &str = "asterism-ak-";
/// Name prefix of member ConfigMaps (the node name follows).
pub const MEMBER_PREFIX: &str = "asterism-member-";
/// API group of JoiningNode and NodeVersion.
pub const UPDATE_GROUP: &str = "update.edgeless.systems";
/// Their version.
pub const UPDATE_VERSION: &str = "v1alpha1";
/// The cluster-scoped NodeVersion naming the current components ConfigMap. The node
/// operator keeps it under this name, so the name must not change.
pub const NODE_VERSION: &str = "constellation-version";
/// Field manager of the server-side apply of worker JoiningNodes.
pub const FIELD_MANAGER: &str = "join-service";
/// The JoiningNode name of a joining control-plane node (one at a time).
pub const CONTROL_PLANE_JOINING_NODE: &str = "control-plane";
/// How long a worker's JoiningNode is valid.
pub const WORKER_JOIN_DEADLINE: Duration = Duration::from_secs(48 * 3600);
/// How long a control-plane node's JoiningNode is valid.
pub const CONTROL_PLANE_JOIN_DEADLINE: Duration = Duration::from_secs(10 * 60);

const UPDATE_ATTEMPTS: u32 = 5;
const MAX_NAME_LEN: usize = 253;

/// `Ok` if `valid`, else the invalid input `what`, described by `detail`.
fn require(valid: bool, what: &'static str, detail: impl FnOnce() -> String) -> Result<()> {
    if valid {
        Ok(())
    } else {
        Err(ApiError::InvalidInput {
            what,
            detail: detail(),
        })
    }
}

/// Whether `b` is a lower-case hex digit.
fn is_lower_hex(b: u8) -> bool {
    b.is_ascii_digit() || (b'a'..=b'f').contains(&b)
}

/// An AK fingerprint as it names an object: 64 lower-case hex digits.
fn check_ak(ak: &str) -> Result<()> {
    require(
        ak.len() == 64 && ak.bytes().all(is_lower_hex),
        "attestation key fingerprint",
        || "not 64 lower-case hex digits".into(),
    )
}

/// A disk UUID as it names an object: canonical, lower case (`8-4-4-4-12` hex digits).
fn check_disk_uuid(uuid: &str) -> Result<()> {
    let canonical = uuid.len() == 36
        && uuid.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => is_lower_hex(b),
        });
    require(canonical, "disk UUID", || {
        "not a canonical lower-case UUID".into()
    })
}

/// A node name as it names an object: a DNS-1123 subdomain short enough for the prefix.
fn check_node_name(name: &str) -> Result<()> {
    require(
        name.len() + MEMBER_PREFIX.len() <= MAX_NAME_LEN && asterism_basics::is_node_name(name),
        "node name",
        || {
            format!(
                "{name:?} is not a DNS-1123 subdomain of at most {} characters",
                MAX_NAME_LEN - MEMBER_PREFIX.len()
            )
        },
    )
}

/// The ConfigMap `object` that holds a new member record.
fn member_config_map(object: &str, record: &MemberRecord) -> Result<ConfigMap> {
    Ok(ConfigMap {
        metadata: ObjectMeta {
            name: Some(object.to_owned()),
            namespace: Some(NAMESPACE.to_owned()),
            labels: Some(labels("member")),
            ..ObjectMeta::default()
        },
        data: Some(record.to_data()?),
        ..ConfigMap::default()
    })
}

/// Where a disk is bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskBinding {
    /// The attestation key identity holding the disk.
    pub ak: String,
    /// When it was bound.
    pub bound_at: SystemTime,
}

/// Which node holds an attestation key, and the disk its first admission bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyClaim {
    /// The node that claimed the key.
    pub member: String,
    /// The disk (canonical UUID) the claim was made for; `None` in a claim written before
    /// claims named their disk.
    pub disk: Option<String>,
}

/// A node admitted to the cluster, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberRecord {
    /// Node name.
    pub name: String,
    /// Role (`ControlPlane`, `Worker`).
    pub role: String,
    /// The attested AK identity of the node's last ticket.
    pub ak: String,
    /// The state disk (canonical UUID) of the node's last ticket, or of its init record;
    /// empty in records written before members carried it.
    pub disk: String,
    /// When the node was first admitted.
    pub admitted_at: SystemTime,
    /// When the node last received a ticket.
    pub last_ticket_at: SystemTime,
    /// How many join tickets the node has received.
    pub tickets: u64,
    /// An operator re-admitted the node: its next ticket may come with another key.
    pub readmit: bool,
}

impl MemberRecord {
    /// A member admitted at `now` that has been given `tickets` tickets (the init node
    /// none).
    fn admitted(
        name: &str,
        role: &str,
        ak: &str,
        disk: &str,
        now: SystemTime,
        tickets: u64,
    ) -> Self {
        Self {
            name: name.to_owned(),
            role: role.to_owned(),
            ak: ak.to_owned(),
            disk: disk.to_owned(),
            admitted_at: now,
            last_ticket_at: now,
            tickets,
            readmit: false,
        }
    }

    /// Whether a ticket with attestation key `ak` may update this record: the same key, or
    /// another one after an operator re-admitted the node.
    pub fn accepts(&self, ak: &str) -> bool {
        self.ak == ak || self.readmit
    }

    fn from_config_map(cm: &ConfigMap) -> Result<Self> {
        let malformed = ApiError::malformed_in(format!(
            "ConfigMap {NAMESPACE}/{}",
            cm.metadata.name.as_deref().unwrap_or_default()
        ));
        let data = cm.data.as_ref().ok_or_else(|| malformed("no data"))?;
        let field = |k: &str| {
            data.get(k)
                .map(String::as_str)
                .ok_or_else(|| malformed(&format!("no {k}")))
        };
        let time = |k: &str| {
            field(k).and_then(|v| {
                timestamp(v).ok_or_else(|| malformed(&format!("{k} is no RFC 3339 time")))
            })
        };
        Ok(Self {
            name: field("name")?.to_owned(),
            role: field("role")?.to_owned(),
            ak: field("ak")?.to_owned(),
            disk: data.get("disk").cloned().unwrap_or_default(),
            admitted_at: time("admittedAt")?,
            last_ticket_at: time("lastTicketAt")?,
            tickets: field("tickets")?
                .parse()
                .map_err(|_| malformed("tickets is no number"))?,
            readmit: data.get("readmit").is_some_and(|v| v == "true"),
        })
    }

    fn to_data(&self) -> Result<BTreeMap<String, String>> {
        let mut data = BTreeMap::from([
            ("name".to_owned(), self.name.clone()),
            ("role".to_owned(), self.role.clone()),
            ("ak".to_owned(), self.ak.clone()),
            ("admittedAt".to_owned(), rfc3339(self.admitted_at)?),
            ("lastTicketAt".to_owned(), rfc3339(self.last_ticket_at)?),
            ("tickets".to_owned(), self.tickets.to_string()),
        ]);
        if !self.disk.is_empty() {
            data.insert("disk".to_owned(), self.disk.clone());
        }
        if self.readmit {
            data.insert("readmit".to_owned(), "true".to_owned());
        }
        Ok(data)
    }
}

/// A JoiningNode record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoiningNode {
    /// The Kubernetes node name (lower case, `_` → `-`).
    pub node: String,
    /// The components ConfigMap the node installs.
    pub components_reference: String,
    /// Whether it is a control-plane node.
    pub control_plane: bool,
    /// Until when the record is valid: 10 min (control plane) or 48 h (worker) after `now`.
    pub deadline: SystemTime,
}

impl JoiningNode {
    /// The record of node `node_name` joining at `now`.
    pub fn new(
        node_name: &str,
        components_reference: &str,
        control_plane: bool,
        now: SystemTime,
    ) -> Self {
        let ttl = if control_plane {
            CONTROL_PLANE_JOIN_DEADLINE
        } else {
            WORKER_JOIN_DEADLINE
        };
        Self {
            node: node_name.to_lowercase().replace('_', "-"),
            components_reference: components_reference.to_owned(),
            control_plane,
            deadline: now.checked_add(ttl).unwrap_or(now),
        }
    }

    /// The object's name: `control-plane` for control-plane nodes, the node name otherwise.
    pub fn object_name(&self) -> &str {
        if self.control_plane {
            CONTROL_PLANE_JOINING_NODE
        } else {
            &self.node
        }
    }

    fn to_object(&self) -> Result<DynamicObject> {
        Ok(
            DynamicObject::new(self.object_name(), &joining_node_resource()).data(
                serde_json::json!({
                    "spec": {
                        "name": self.node,
                        "componentsreference": self.components_reference,
                        "iscontrolplane": self.control_plane,
                        "deadline": rfc3339(self.deadline)?,
                    }
                }),
            ),
        )
    }
}

/// The JoiningNode resource (cluster-scoped).
pub fn joining_node_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(UPDATE_GROUP, UPDATE_VERSION, "JoiningNode"),
        "joiningnodes",
    )
}

/// The NodeVersion resource (cluster-scoped).
pub fn node_version_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(UPDATE_GROUP, UPDATE_VERSION, "NodeVersion"),
        "nodeversions",
    )
}

impl ClusterApi {
    /// The ConfigMap `name` of the join service's namespace, if it exists.
    async fn config_map(&self, name: &str) -> Result<Option<ConfigMap>> {
        let op = format!("get ConfigMap {NAMESPACE}/{name}");
        self.config_maps()
            .get_opt(name)
            .await
            .map_err(|e| ApiError::from_kube(op, e))
    }

    /// The binding of `disk_uuid` (canonical lower case), if any.
    pub async fn disk_binding(&self, disk_uuid: &str) -> Result<Option<DiskBinding>> {
        check_disk_uuid(disk_uuid)?;
        let name = format!("{DISK_PREFIX}{disk_uuid}");
        let Some(cm) = self.config_map(&name).await? else {
            return Ok(None);
        };
        let malformed = ApiError::malformed_in(format!("ConfigMap {NAMESPACE}/{name}"));
        let data = cm.data.as_ref().ok_or_else(|| malformed("no data"))?;
        let ak = data
            .get("ak")
            .filter(|a| !a.is_empty())
            .ok_or_else(|| malformed("no ak"))?;
        let bound_at = data
            .get("boundAt")
            .and_then(|t| timestamp(t))
            .ok_or_else(|| malformed("no valid boundAt"))?;
        Ok(Some(DiskBinding {
            ak: ak.clone(),
            bound_at,
        }))
    }

    /// Succeeds if `disk_uuid` is unbound or bound to `ak`; writes nothing.
    pub async fn check_disk(&self, disk_uuid: &str, ak: &str) -> Result<()> {
        match self.disk_binding(disk_uuid).await? {
            Some(b) if b.ak != ak => Err(ApiError::DiskBoundToOtherKey {
                uuid: disk_uuid.to_owned(),
            }),
            _ => Ok(()),
        }
    }

    /// Binds `disk_uuid` to `ak` if it is unbound (creating its immutable ConfigMap);
    /// succeeds if it is bound to `ak`; [`ApiError::DiskBoundToOtherKey`] if another key
    /// holds it, also when another replica's create won a race.
    pub async fn bind_disk(&self, disk_uuid: &str, ak: &str, now: SystemTime) -> Result<()> {
        if ak.is_empty() {
            return Err(ApiError::InvalidInput {
                what: "attestation key identity",
                detail: "empty".into(),
            });
        }
        // Most calls (rejoins, retries) find the binding: read first.
        if self.disk_binding(disk_uuid).await?.is_some() {
            return self.check_disk(disk_uuid, ak).await;
        }
        let name = format!("{DISK_PREFIX}{disk_uuid}");
        let data = [("disk", disk_uuid), ("ak", ak), ("boundAt", &rfc3339(now)?)];
        if self.create_once(&name, "disk-binding", data).await? {
            tracing::info!(
                disk = disk_uuid,
                ak,
                "bound the disk to the attestation key"
            );
            Ok(())
        } else {
            // Another replica bound it meanwhile: theirs stands.
            self.check_disk(disk_uuid, ak).await
        }
    }

    /// Creates the immutable ConfigMap `name` (record label `record`) holding `data`:
    /// `true` if this call created it, `false` if it exists (the API server's create is
    /// atomic: of two writers, one creates and the other learns it lost).
    async fn create_once<const N: usize>(
        &self,
        name: &str,
        record: &str,
        data: [(&str, &str); N],
    ) -> Result<bool> {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(NAMESPACE.to_owned()),
                labels: Some(labels(record)),
                ..ObjectMeta::default()
            },
            immutable: Some(true),
            data: Some(
                data.into_iter()
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect(),
            ),
            ..ConfigMap::default()
        };
        let op = format!("create ConfigMap {NAMESPACE}/{name}");
        match self.config_maps().create(&PostParams::default(), &cm).await {
            Ok(_) => Ok(true),
            Err(e) => match ApiError::from_kube(op, e) {
                ApiError::AlreadyExists { .. } => Ok(false),
                other => Err(other),
            },
        }
    }

    /// The claim of attestation key `ak` (its fingerprint, lower-case hex), if any.
    pub async fn key_claim(&self, ak: &str) -> Result<Option<KeyClaim>> {
        check_ak(ak)?;
        let name = format!("{AK_PREFIX}{ak}");
        let Some(cm) = self.config_map(&name).await? else {
            return Ok(None);
        };
        let malformed = ApiError::malformed_in(format!("ConfigMap {NAMESPACE}/{name}"));
        let data = cm.data.as_ref();
        let claimed = data.and_then(|d| Some((d.get("ak")?, d.get("member")?)));
        let member = match claimed {
            Some((a, member)) if a == ak && !member.is_empty() => member.clone(),
            _ => return Err(malformed("not a claim of this key by a node")),
        };
        let disk = match data.and_then(|d| d.get("disk")) {
            None => None,
            Some(disk) if check_disk_uuid(disk).is_ok() => Some(disk.clone()),
            Some(_) => return Err(malformed("its disk is no canonical UUID")),
        };
        Ok(Some(KeyClaim { member, disk }))
    }

    /// Claims attestation key `ak` (fingerprint, lower-case hex) for node `member` and its
    /// disk `disk_uuid` (canonical lower case), and returns the claim that holds: the new
    /// one if the key was unclaimed (creating its immutable ConfigMap), or the existing one
    /// of `member`, whose disk may be another (the caller decides whether that is allowed).
    /// [`ApiError::KeyClaimedByOtherNode`] if another node holds it, also when another
    /// request's create won a race. Claims are never removed: a key an operator replaced
    /// (`asterism readmit`) stays its node's.
    pub async fn claim_key(
        &self,
        ak: &str,
        member: &str,
        disk_uuid: &str,
        now: SystemTime,
    ) -> Result<KeyClaim> {
        check_node_name(member)?;
        check_disk_uuid(disk_uuid)?;
        let held = |claim: KeyClaim| {
            if claim.member == member {
                Ok(claim)
            } else {
                Err(ApiError::KeyClaimedByOtherNode {
                    member: claim.member,
                })
            }
        };
        // Every request of a member finds its claim: read first.
        if let Some(claim) = self.key_claim(ak).await? {
            return held(claim);
        }
        let name = format!("{AK_PREFIX}{ak}");
        let data = [
            ("ak", ak),
            ("member", member),
            ("disk", disk_uuid),
            ("claimedAt", &rfc3339(now)?),
        ];
        if self.create_once(&name, "key-claim", data).await? {
            tracing::info!(
                ak,
                member,
                disk = disk_uuid,
                "claimed the attestation key for the node"
            );
            return Ok(KeyClaim {
                member: member.to_owned(),
                disk: Some(disk_uuid.to_owned()),
            });
        }
        // Another request claimed it meanwhile: its claim stands.
        match self.key_claim(ak).await? {
            Some(claim) => held(claim),
            None => Err(ApiError::Malformed {
                object: format!("ConfigMap {NAMESPACE}/{name}"),
                detail: "its create was refused as existing, and it is not there".into(),
            }),
        }
    }

    /// The member record of node `name`, if any.
    pub async fn member(&self, name: &str) -> Result<Option<MemberRecord>> {
        check_node_name(name)?;
        let object = format!("{MEMBER_PREFIX}{name}");
        let op = format!("get ConfigMap {NAMESPACE}/{object}");
        self.config_maps()
            .get_opt(&object)
            .await
            .map_err(|e| ApiError::from_kube(op, e))?
            .as_ref()
            .map(MemberRecord::from_config_map)
            .transpose()
    }

    /// Marks member `name` as re-admitted by an operator: its next ticket may come with
    /// another attestation key ([`ClusterApi::record_member`] then replaces the key and
    /// clears the mark). [`ApiError::NotFound`] if there is no such member.
    pub async fn allow_readmission(&self, name: &str) -> Result<MemberRecord> {
        check_node_name(name)?;
        let object = format!("{MEMBER_PREFIX}{name}");
        let api = self.config_maps();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let op = format!("get ConfigMap {NAMESPACE}/{object}");
            let mut cm = api
                .get(&object)
                .await
                .map_err(|e| ApiError::from_kube(op, e))?;
            let record = MemberRecord {
                readmit: true,
                ..MemberRecord::from_config_map(&cm)?
            };
            cm.data = Some(record.to_data()?);
            let op = format!("update ConfigMap {NAMESPACE}/{object}");
            match api
                .replace(&object, &PostParams::default(), &cm)
                .await
                .map_err(|e| ApiError::from_kube(op, e))
            {
                Ok(_) => return Ok(record),
                Err(ApiError::Conflict { .. }) if attempt < UPDATE_ATTEMPTS => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Records the cluster's first node (which received no join ticket) with its state disk
    /// `disk`: creates its member record with no tickets unless one exists with the same
    /// key; [`ApiError::MemberKeyChanged`] if one exists with another.
    pub async fn record_init_member(
        &self,
        name: &str,
        role: &str,
        ak: &str,
        disk: &str,
        now: SystemTime,
    ) -> Result<()> {
        check_node_name(name)?;
        check_disk_uuid(disk)?;
        match self.member(name).await? {
            Some(m) if m.ak == ak => return Ok(()),
            Some(_) => {
                return Err(ApiError::MemberKeyChanged {
                    name: name.to_owned(),
                });
            }
            None => {}
        }
        let object = format!("{MEMBER_PREFIX}{name}");
        let record = MemberRecord::admitted(name, role, ak, disk, now, 0);
        let cm = member_config_map(&object, &record)?;
        let op = format!("create ConfigMap {NAMESPACE}/{object}");
        match self.config_maps().create(&PostParams::default(), &cm).await {
            Ok(_) => Ok(()),
            // Another replica recorded it meanwhile: check it is the same key.
            Err(e) => match ApiError::from_kube(op, e) {
                ApiError::AlreadyExists { .. } => match self.member(name).await? {
                    Some(m) if m.ak == ak => Ok(()),
                    _ => Err(ApiError::MemberKeyChanged {
                        name: name.to_owned(),
                    }),
                },
                other => Err(other),
            },
        }
    }

    /// Records that node `name` (role `role`, attestation key `ak`, state disk `disk`)
    /// received a ticket at `now`: creates its member record or updates it (resourceVersion-guarded, retried after
    /// a lost race). A member recorded with another key is refused with
    /// [`ApiError::MemberKeyChanged`] unless an operator re-admitted it
    /// ([`ClusterApi::allow_readmission`]). Returns the record as stored.
    pub async fn record_member(
        &self,
        name: &str,
        role: &str,
        ak: &str,
        disk: &str,
        now: SystemTime,
    ) -> Result<MemberRecord> {
        check_node_name(name)?;
        check_disk_uuid(disk)?;
        let object = format!("{MEMBER_PREFIX}{name}");
        let api = self.config_maps();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let op = format!("get ConfigMap {NAMESPACE}/{object}");
            let current = api
                .get_opt(&object)
                .await
                .map_err(|e| ApiError::from_kube(op, e))?;
            let (record, write) = match current {
                None => {
                    let record = MemberRecord::admitted(name, role, ak, disk, now, 1);
                    let cm = member_config_map(&object, &record)?;
                    let op = format!("create ConfigMap {NAMESPACE}/{object}");
                    (
                        record,
                        api.create(&PostParams::default(), &cm)
                            .await
                            .map_err(|e| ApiError::from_kube(op, e)),
                    )
                }
                Some(mut cm) => {
                    let previous = MemberRecord::from_config_map(&cm)?;
                    if !previous.accepts(ak) {
                        return Err(ApiError::MemberKeyChanged {
                            name: name.to_owned(),
                        });
                    }
                    if previous.ak != ak {
                        tracing::warn!(node = name, old_ak = %previous.ak, new_ak = ak, "member re-admitted by an operator: its attestation key is replaced");
                    }
                    let record = MemberRecord {
                        role: role.to_owned(),
                        ak: ak.to_owned(),
                        disk: disk.to_owned(),
                        last_ticket_at: now,
                        tickets: previous.tickets.saturating_add(1),
                        readmit: false,
                        ..previous
                    };
                    cm.data = Some(record.to_data()?);
                    let op = format!("update ConfigMap {NAMESPACE}/{object}");
                    (
                        record,
                        api.replace(&object, &PostParams::default(), &cm)
                            .await
                            .map_err(|e| ApiError::from_kube(op, e)),
                    )
                }
            };
            match write {
                Ok(_) => return Ok(record),
                Err(ApiError::AlreadyExists { .. } | ApiError::Conflict { .. })
                    if attempt < UPDATE_ATTEMPTS =>
                {
                    tracing::debug!(
                        node = name,
                        attempt,
                        "lost a race on the member record; reading again"
                    );
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// All member records, by name.
    pub async fn members(&self) -> Result<Vec<MemberRecord>> {
        let params = ListParams::default().labels(&format!(
            "{MANAGED_BY_LABEL}={MANAGED_BY},{RECORD_LABEL}=member"
        ));
        let list = self.config_maps().list(&params).await.map_err(|e| {
            ApiError::from_kube(format!("list member ConfigMaps in {NAMESPACE}"), e)
        })?;
        let mut out = list
            .items
            .iter()
            .map(MemberRecord::from_config_map)
            .collect::<Result<Vec<_>>>()?;
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// The components ConfigMap name the NodeVersion `constellation-version` names
    /// (`spec.kubernetesComponentsReference`).
    pub async fn components_reference(&self) -> Result<String> {
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &node_version_resource());
        let op = format!("get NodeVersion {NODE_VERSION}");
        let nv = api
            .get(NODE_VERSION)
            .await
            .map_err(|e| ApiError::from_kube(op, e))?;
        nv.data
            .pointer("/spec/kubernetesComponentsReference")
            .and_then(serde_json::Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| ApiError::Malformed {
                object: format!("NodeVersion {NODE_VERSION}"),
                detail: "no spec.kubernetesComponentsReference".into(),
            })
    }

    /// Writes the JoiningNode record of a node: a control-plane node's is **created** under
    /// the one name `control-plane`, so that an existing record of another node (a
    /// control-plane join in progress) refuses it with
    /// [`ApiError::ControlPlaneJoinInProgress`]; the same node's own record (a retry) is
    /// accepted. A worker's is applied server-side (field manager `join-service`, forced:
    /// the join service owns these fields). [`ApiError::NotInstalled`] if the
    /// JoiningNode CRD is not installed.
    pub async fn add_joining_node(&self, node: &JoiningNode) -> Result<()> {
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &joining_node_resource());
        let object = node.to_object()?;
        let name = node.object_name();
        let not_installed = |e: ApiError| match e {
            // A create or an apply of a served type never answers 404: the type is missing.
            ApiError::NotFound { op } => ApiError::NotInstalled { op },
            other => other,
        };
        if node.control_plane {
            let op = format!("create JoiningNode {name}");
            match api.create(&PostParams::default(), &object).await {
                Ok(_) => Ok(()),
                Err(e) => match not_installed(ApiError::from_kube(op, e)) {
                    ApiError::AlreadyExists { .. } => {
                        let op = format!("get JoiningNode {name}");
                        let existing = api
                            .get(name)
                            .await
                            .map_err(|e| ApiError::from_kube(op, e))?;
                        let joining = existing
                            .data
                            .pointer("/spec/name")
                            .and_then(serde_json::Value::as_str)
                            .unwrap_or_default()
                            .to_owned();
                        if joining == node.node {
                            Ok(())
                        } else {
                            Err(ApiError::ControlPlaneJoinInProgress { joining })
                        }
                    }
                    other => Err(other),
                },
            }
        } else {
            let op = format!("apply JoiningNode {name}");
            api.patch(
                name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&object),
            )
            .await
            .map_err(|e| not_installed(ApiError::from_kube(op, e)))?;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn object_names_are_checked() {
        assert!(check_disk_uuid("aaaaaaaa-0000-4000-8000-00000000000a").is_ok());
        for bad in [
            "AAAAAAAA-0000-4000-8000-00000000000A",
            "aaaaaaaa00000-4000-8000-00000000000a",
            "aaaaaaaa-0000-4000-8000-00000000000",
            "../aaaaa-0000-4000-8000-00000000000a",
        ] {
            assert!(check_disk_uuid(bad).is_err(), "{bad}");
        }
        assert!(check_node_name("worker-0").is_ok());
        assert!(check_node_name("worker-0.zone.example").is_ok());
        for bad in ["", "Worker", "-w", "w-", "a..b", "a/b", &"a".repeat(240)] {
            assert!(check_node_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn joining_node_names_and_deadlines_follow_the_role() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let w = JoiningNode::new("Worker_0", "k8s-components-sha256-aa", false, now);
        assert_eq!((w.node.as_str(), w.object_name()), ("worker-0", "worker-0"));
        assert_eq!(w.deadline, now + Duration::from_secs(48 * 3600));
        let c = JoiningNode::new("cp-1", "k8s-components-sha256-aa", true, now);
        assert_eq!(c.object_name(), "control-plane");
        assert_eq!(c.deadline, now + Duration::from_secs(600));
        let o = c.to_object().unwrap();
        assert_eq!(o.data["spec"]["name"], "cp-1");
        assert_eq!(o.data["spec"]["iscontrolplane"], true);
        assert_eq!(o.data["spec"]["deadline"], "1970-01-12T13:56:40Z");
    }
}

//! The `join.API` handlers: thin tonic glue around [`JoinService`]. Each handler takes the
//! [`VerifiedPeer`] of the connection, decodes the request at the edge (`request.rs`), runs
//! the core on domain types and encodes the domain ticket into the response.

use crate::error::{DenyReason, JoinError, chain};
use crate::keys::KeySource;
use crate::metrics::Metrics;
use crate::release::ClusterRelease;
use crate::request::{JoinRequest, JoinTicket, RejoinRequest, RejoinTicket};
use crate::state::{Admission, ClusterState, Member, StateError};
use asterism_atls::{AtlsConnectInfo, VerifiedPeer};
use asterism_attestation::AkFingerprint;
use asterism_binkit::RateLimiter;
use asterism_cluster::{
    API_SERVER_PORT, CONTROL_PLANE_FILES, ControlPlaneFile, REQUIRED_CONTROL_PLANE_FILES, Role,
};
use asterism_kms::{
    ChannelBinding, ControlPlaneSigner, DataKey, KeyId, Purpose, STATE_DISK_KEY_LEN,
};
use asterism_metadata::{InstanceMetadata, Metadata};
use asterism_pki::{ClusterCa, SshCa, SshError};
use asterism_proto::join::api_server::Api;
use asterism_proto::join::{
    IssueJoinTicketRequest, IssueJoinTicketResponse, IssueRejoinTicketRequest,
    IssueRejoinTicketResponse,
};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tonic::{Request, Response, Status};
use zeroize::Zeroizing;

/// Largest control-plane file read.
pub const MAX_CONTROL_PLANE_FILE_LEN: u64 = 1024 * 1024;
/// How long a metadata listing is reused.
pub const METADATA_CACHE_TTL: Duration = Duration::from_secs(1);

/// Configuration of a [`JoinService`].
#[derive(Debug, Clone)]
pub struct JoinConfig {
    /// The cluster's measurement salt, returned in join tickets.
    pub measurement_salt: Vec<u8>,
    /// The host of `api_server_endpoint` (the control-plane node's address).
    pub api_server_host: IpAddr,
    /// Where the control-plane files are (`ca.crt`, `ca.key`, …).
    pub pki_dir: PathBuf,
    /// Sustained requests per second per attestation key.
    pub rate_per_second: f64,
    /// Burst per attestation key.
    pub burst: u32,
    /// The cluster's names (the API server certificate's SANs) that a control-plane node's
    /// SSH host certificate may carry besides its own name and address.
    pub cluster_sans: Vec<String>,
    /// The cluster's Kubernetes version and components, put into every join ticket; `None`
    /// when the cluster state records none (tickets then carry none).
    pub kubernetes: Option<ClusterRelease>,
}

/// The join service: verifies what attestation cannot (who the node is, per the metadata;
/// which disk it may open) and issues join and rejoin tickets.
pub struct JoinService<M, K, S> {
    inner: Arc<Inner<M, K, S>>,
}

impl<M, K, S> Clone for JoinService<M, K, S> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<M, K, S> {
    metadata: M,
    keys: K,
    state: S,
    ca: ClusterCa,
    discovery_hash: String,
    config: JoinConfig,
    limiter: RateLimiter,
    metrics: Metrics,
    /// The last metadata listing, by VPC IP, and when it was fetched.
    instances: Mutex<Option<(Instant, Arc<InstancesByIp>)>>,
    /// Held while the listing is fetched, so that a burst of requests finding it stale
    /// fetches it once.
    refreshing: tokio::sync::Mutex<()>,
    cluster_keys: tokio::sync::OnceCell<ClusterKeys>,
}

/// The keys from the key service that are the same in every ticket of the cluster (they
/// are derived from the master secret): fetched once, on first use, and kept like the
/// cluster CA key this service holds anyway. Both secrets are wiped on drop.
struct ClusterKeys {
    measurement_secret: DataKey,
    /// The control plane's identity, which signs every ticket (docs/join-service.md).
    signer: ControlPlaneSigner,
    ssh_ca: SshCa,
    /// The SSH CA's `authorized_keys` line (public).
    ssh_ca_line: Vec<u8>,
}

/// A metadata listing by VPC IP.
type InstancesByIp = HashMap<IpAddr, InstanceMetadata>;

/// What the attested peer is.
struct Peer {
    ak: AkFingerprint,
    ip: IpAddr,
}

impl<M: Metadata, K: KeySource, S: ClusterState> JoinService<M, K, S> {
    /// A service issuing tickets signed by `ca`, with keys from `keys`, identities from
    /// `metadata` and membership in `state`.
    pub fn new(
        metadata: M,
        keys: K,
        state: S,
        ca: ClusterCa,
        config: JoinConfig,
        metrics: Metrics,
    ) -> Result<Self, JoinError> {
        let discovery_hash = ca
            .discovery_hash()
            .map_err(|e| JoinError::internal("computing the discovery hash", e))?;
        Ok(Self {
            inner: Arc::new(Inner {
                metadata,
                keys,
                state,
                ca,
                discovery_hash,
                limiter: RateLimiter::new(config.rate_per_second, config.burst),
                config,
                metrics,
                instances: Mutex::new(None),
                refreshing: tokio::sync::Mutex::new(()),
                cluster_keys: tokio::sync::OnceCell::new(),
            }),
        })
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The cluster state.
    pub fn state(&self) -> &S {
        &self.inner.state
    }

    /// The attested peer of a request, if it is within its request rate.
    fn peer(&self, peer: Option<&VerifiedPeer>) -> Result<Peer, JoinError> {
        let peer = peer.ok_or(JoinError::NotAttested)?;
        let ip = peer
            .remote_addr()
            .map(|a| a.ip().to_canonical())
            .ok_or(JoinError::NotAttested)?;
        let identity = peer.evidence().identity();
        if !self.inner.limiter.allow(identity, Instant::now()) {
            return Err(JoinError::RateLimited);
        }
        // Every validator names the attesting key by 32 bytes in hex.
        let ak = AkFingerprint::from_hex(identity)
            .map_err(|e| JoinError::internal("reading the peer's attestation key identity", e))?;
        Ok(Peer { ak, ip })
    }

    /// The cached listing, if it is younger than [`METADATA_CACHE_TTL`].
    fn fresh_instances(&self) -> Option<Arc<InstancesByIp>> {
        self.inner
            .instances
            .lock()
            .ok()
            .and_then(|c| c.clone())
            .filter(|(at, _)| at.elapsed() < METADATA_CACHE_TTL)
            .map(|(_, index)| index)
    }

    /// The instance whose VPC IP is the peer's address.
    async fn identify(&self, ip: IpAddr) -> Result<InstanceMetadata, JoinError> {
        let index = match self.fresh_instances() {
            Some(index) => index,
            None => {
                let _one_fetch = self.inner.refreshing.lock().await;
                // Whoever held the lock before may have just fetched it.
                match self.fresh_instances() {
                    Some(index) => index,
                    None => {
                        let list = self
                            .inner
                            .metadata
                            .list()
                            .await
                            .map_err(JoinError::MetadataUnavailable)?;
                        let index = Arc::new(index_by_ip(list));
                        if let Ok(mut c) = self.inner.instances.lock() {
                            *c = Some((Instant::now(), index.clone()));
                        }
                        index
                    }
                }
            }
        };
        index
            .get(&ip.to_canonical())
            .cloned()
            .ok_or_else(|| JoinError::Denied {
                reason: DenyReason::UnknownPeer,
                detail: format!("no instance in the metadata has address {ip}"),
            })
    }

    async fn key(&self, id: KeyId) -> Result<DataKey, JoinError> {
        Ok(self.inner.keys.data_key(&id, STATE_DISK_KEY_LEN).await?)
    }

    /// The measurement secret and the SSH CA; concurrent first callers wait for one fetch,
    /// and a failed fetch is tried again by the next caller.
    async fn cluster_keys(&self) -> Result<&ClusterKeys, JoinError> {
        self.inner
            .cluster_keys
            .get_or_try_init(|| async {
                let (measurement_secret, ssh_seed, identity) = futures::try_join!(
                    self.key(KeyId::MeasurementSecret),
                    self.key(KeyId::EmergencySshCa),
                    async { Ok(self.inner.keys.control_plane_seed().await?) },
                )?;
                let signer = ControlPlaneSigner::new(&identity)
                    .map_err(|e| JoinError::internal("building the control-plane identity", e))?;
                let ssh_ca = SshCa::from_seed(&ssh_seed)
                    .map_err(|e| JoinError::internal("building the SSH CA", e))?;
                let ssh_ca_line = ssh_ca.authorized_keys_line().into_bytes();
                Ok(ClusterKeys {
                    measurement_secret,
                    signer,
                    ssh_ca,
                    ssh_ca_line,
                })
            })
            .await
    }

    /// Signs `response` with the control plane's identity for `purpose`, bound to the
    /// connection it goes out on: the signature covers `binding` and the SHA-256 of the
    /// response encoded with its signature field empty.
    async fn sign<T: prost::Message>(
        &self,
        purpose: Purpose,
        binding: Option<ChannelBinding>,
        mut response: T,
        field: fn(&mut T) -> &mut Vec<u8>,
    ) -> Result<T, JoinError> {
        let binding = binding.ok_or(JoinError::NotAttested)?;
        let keys = self.cluster_keys().await?;
        field(&mut response).clear();
        let encoded = Zeroizing::new(response.encode_to_vec());
        *field(&mut response) = keys.signer.sign(purpose, &binding, &encoded).to_vec();
        Ok(response)
    }

    /// The control-plane members with their attestation keys and disks, signed by the
    /// control plane's identity (docs/join-service.md, "The signed control-plane list"):
    /// what `asterism control-plane sync` adds to the owner's workspace, so that
    /// `asterism recover` sends keys only to these AKs, for these disks.
    pub async fn signed_control_plane(&self) -> Result<String, JoinError> {
        #[derive(serde::Serialize)]
        struct Entry<'a> {
            name: &'a str,
            ak: &'a str,
            disk: &'a str,
        }
        #[derive(serde::Serialize)]
        struct Payload<'a> {
            members: Vec<Entry<'a>>,
            #[serde(rename = "issuedAt")]
            issued_at: u64,
        }
        #[derive(serde::Serialize)]
        struct Envelope<'a> {
            version: u32,
            kind: &'a str,
            payload: String,
            signature: String,
        }
        let members = self.inner.state.members().await.map_err(state_error)?;
        let payload = Payload {
            members: members
                .iter()
                .filter(|m| m.role == Role::ControlPlane.to_string() && !m.disk.is_empty())
                .map(|m| Entry {
                    name: &m.name,
                    ak: &m.ak,
                    disk: &m.disk,
                })
                .collect(),
            issued_at: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        };
        let payload = serde_json::to_vec(&payload)
            .map_err(|e| JoinError::internal("encoding the control-plane list", e))?;
        let keys = self.cluster_keys().await?;
        let signature = keys
            .signer
            .sign(Purpose::MemberList, &ChannelBinding::DOCUMENT, &payload);
        use base64::Engine as _;
        serde_json::to_string(&Envelope {
            version: 1,
            kind: "asterism-control-plane-members",
            payload: base64::engine::general_purpose::STANDARD.encode(&payload),
            signature: hex::encode(signature),
        })
        .map_err(|e| JoinError::internal("encoding the control-plane list", e))
    }

    /// The public form of the identity this service signs with, once the key service
    /// answered.
    pub async fn control_plane_key(&self) -> Result<asterism_kms::ControlPlaneKey, JoinError> {
        Ok(self.cluster_keys().await?.signer.public_key())
    }

    /// A join ticket for `req` (`IssueJoinTicket`, docs/join-service.md), with the
    /// authorization checks of docs/join-service.md in their order.
    async fn join(&self, peer: &Peer, req: JoinRequest) -> Result<JoinTicket<'_>, JoinError> {
        let JoinRequest {
            disk,
            csr,
            host_key,
            principals,
            role,
        } = req;
        // No principals asked for: the address alone (with a port it would be no host
        // name).
        let principals = principals.unwrap_or_else(|| vec![peer.ip.to_string()]);

        // Who is it? The metadata, by source address, decides; attestation alone does not
        // (attestation proves what a node runs, not which node it is).
        let instance = self.identify(peer.ip).await?;
        if csr.node_name() != instance.name {
            return Err(JoinError::Denied {
                reason: DenyReason::NodeNameMismatch,
                detail: format!(
                    "the certificate request names node {:?}, but {} is {:?}",
                    csr.node_name(),
                    peer.ip,
                    instance.name
                ),
            });
        }
        if let Some(ip) = csr
            .ip_addresses()
            .iter()
            .find(|ip| !instance.has_vpc_ip(**ip))
        {
            return Err(JoinError::Denied {
                reason: DenyReason::IpMismatch,
                detail: format!(
                    "the certificate request asks for address {ip}, which is not {}'s",
                    instance.name
                ),
            });
        }
        // An unknown role in the metadata matches no request.
        if instance.role == Role::Unknown || role != instance.role {
            return Err(JoinError::Denied {
                reason: DenyReason::RoleMismatch,
                detail: format!(
                    "is_control_plane is {}, but {} has role {}",
                    role == Role::ControlPlane,
                    instance.name,
                    instance.role
                ),
            });
        }
        if let Some(p) = principals
            .iter()
            .find(|p| !self.may_name(&instance, peer.ip, p))
        {
            return Err(JoinError::Denied {
                reason: DenyReason::PrincipalNotAllowed,
                detail: format!(
                    "the host certificate may name {} only by its name and address{}, not {p:?}",
                    instance.name,
                    if instance.role == Role::ControlPlane {
                        " and the cluster's names"
                    } else {
                        ""
                    }
                ),
            });
        }
        let now = SystemTime::now();
        let admission = Admission {
            name: instance.name.clone(),
            role: instance.role,
            ak: peer.ak,
            disk: disk.clone(),
            now,
        };
        self.inner
            .state
            .check_admission(&admission)
            .await
            .map_err(state_error)?;

        // Keys, certificates, files.
        let (cluster_keys, disk_key) =
            futures::try_join!(self.cluster_keys(), self.key(KeyId::Disk(disk.clone())),)?;
        let host_certificate = cluster_keys
            .ssh_ca
            .sign_host_certificate(&host_key, &principals, now)
            .and_then(|c| c.to_authorized_keys_line())
            .map_err(|e| match e {
                SshError::Principals(_) => JoinError::Invalid {
                    field: "host_certificate_principals",
                    detail: e.to_string(),
                },
                other => JoinError::internal("signing the SSH host certificate", other),
            })?;
        let kubelet_cert = self
            .inner
            .ca
            .sign_kubelet(&csr, now)
            .map_err(|e| JoinError::internal("signing the kubelet certificate", e))?;
        let control_plane_files = if role == Role::ControlPlane {
            self.control_plane_files().await?
        } else {
            Vec::new()
        };

        // Record the admission (and bind the disk) atomically; only then release anything.
        let token = self
            .inner
            .state
            .admit(admission)
            .await
            .map_err(state_error)?
            .token;

        tracing::info!(
            node = %instance.name,
            role = %instance.role,
            peer = %peer.ip,
            ak = %peer.ak,
            disk = %disk,
            token_id = token.id(),
            control_plane_files = control_plane_files.len(),
            "node joined: issued a join ticket"
        );
        Ok(JoinTicket {
            disk_key,
            measurement_salt: &self.inner.config.measurement_salt,
            measurement_secret: &cluster_keys.measurement_secret,
            kubelet_cert_chain: format!("{kubelet_cert}{}", self.inner.ca.cert_pem()),
            api_server_endpoint: SocketAddr::new(
                self.inner.config.api_server_host,
                API_SERVER_PORT,
            ),
            token,
            discovery_hash: &self.inner.discovery_hash,
            control_plane_files,
            ssh_ca_line: &cluster_keys.ssh_ca_line,
            host_certificate,
            kubernetes: self.inner.config.kubernetes.as_ref(),
        })
    }

    /// A rejoin ticket for `req` (`IssueRejoinTicket`): the disk key and the measurement
    /// secret, for a node of the metadata whose disk is bound to its attestation key. An
    /// unbound disk is refused: a disk is bound when its node first receives its key (its
    /// join ticket, or init for the first node), so an unbound one was never this
    /// cluster's to hand out.
    async fn rejoin(&self, peer: &Peer, req: RejoinRequest) -> Result<RejoinTicket<'_>, JoinError> {
        let RejoinRequest { disk } = req;
        let instance = self.identify(peer.ip).await?;
        self.inner
            .state
            .check_rejoin(&disk, &peer.ak)
            .await
            .map_err(state_error)?;
        let (cluster_keys, disk_key) =
            futures::try_join!(self.cluster_keys(), self.key(KeyId::Disk(disk.clone())),)?;
        tracing::info!(node = %instance.name, peer = %peer.ip, ak = %peer.ak, disk = %disk, "issued a rejoin ticket");
        Ok(RejoinTicket {
            disk_key,
            measurement_secret: &cluster_keys.measurement_secret,
        })
    }

    /// Whether `instance` (connecting from `ip`) may carry `principal` in its SSH host
    /// certificate: its own metadata name or address; a control-plane node also the API
    /// server host and the cluster's SANs. Anything else (`*`, a pattern, another node's
    /// name or address) would let it pose as another host to an SSH client that trusts the
    /// cluster's SSH CA.
    fn may_name(&self, instance: &InstanceMetadata, ip: IpAddr, principal: &str) -> bool {
        if principal == instance.name {
            return true;
        }
        if let Ok(p) = principal.parse::<IpAddr>() {
            let p = p.to_canonical();
            if p == ip.to_canonical() || instance.has_vpc_ip(p) {
                return true;
            }
        }
        instance.role == Role::ControlPlane
            && (principal == self.inner.config.api_server_host.to_string()
                || self
                    .inner
                    .config
                    .cluster_sans
                    .iter()
                    .any(|s| s == principal))
    }

    /// Lets member `name` receive its next join ticket with another attestation key: the
    /// operator's `asterism readmit`, over the admin socket. Logged at warn: it is the one
    /// way a node's recorded identity changes.
    pub async fn readmit(&self, name: &str) -> Result<Member, StateError> {
        let member = self.inner.state.allow_readmission(name).await?;
        tracing::warn!(node = %member.name, old_ak = %member.ak, "an operator re-admitted the node: its next join ticket may come with another attestation key");
        Ok(member)
    }

    async fn control_plane_files(&self) -> Result<Vec<ControlPlaneFile>, JoinError> {
        let dir = self.inner.config.pki_dir.clone();
        tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            for name in CONTROL_PLANE_FILES {
                let path = dir.join(name);
                match read_capped(&path) {
                    Ok(data) => out.push(ControlPlaneFile {
                        name: name.to_owned(),
                        data: Zeroizing::new(data),
                    }),
                    Err(e)
                        if e.kind() == std::io::ErrorKind::NotFound
                            && !REQUIRED_CONTROL_PLANE_FILES.contains(&name) =>
                    {
                        tracing::debug!(file = %path.display(), "control-plane file absent; not sent");
                    }
                    Err(e) => {
                        return Err(JoinError::internal(
                            "reading the control-plane files",
                            std::io::Error::new(e.kind(), format!("{}: {e}", path.display())),
                        ));
                    }
                }
            }
            Ok(out)
        })
        .await
        .map_err(|e| JoinError::internal("reading the control-plane files", e))?
    }

    /// One ticket request, from the connection to the signed answer: the peer attested
    /// and within its rate first (a malformed request counts too), then the request decoded
    /// and answered by `issue`, the answer signed on this connection, and the outcome
    /// counted. The peer is read from the connection before the request is taken apart,
    /// so its verified evidence is borrowed, not copied.
    async fn ticket<W, R, A>(
        &self,
        request: Request<W>,
        issue: impl AsyncFnOnce(&Peer, R) -> Result<A, JoinError>,
    ) -> Result<Response<A>, Status>
    where
        R: TryFrom<W, Error = JoinError>,
        A: TicketAnswer,
    {
        let started = Instant::now();
        let verified = asterism_atls::verified_peer(&request).ok();
        let binding = channel_binding(&request);
        let who = describe(verified);
        let peer = self.peer(verified);
        let result = async {
            let peer = peer?;
            let req = R::try_from(request.into_inner())?;
            let response = issue(&peer, req).await?;
            self.sign(A::PURPOSE, binding, response, A::signature).await
        }
        .await;
        self.finish(A::KIND, who, started, result)
    }

    /// Logs and counts the outcome of one request and turns it into a gRPC answer; the
    /// only place errors become statuses.
    fn finish<T>(
        &self,
        kind: &'static str,
        request_peer: String,
        started: Instant,
        result: Result<T, JoinError>,
    ) -> Result<Response<T>, Status> {
        let metrics = &self.inner.metrics;
        metrics.observe(kind, started.elapsed().as_secs_f64());
        match result {
            Ok(response) => {
                metrics.issued(kind);
                Ok(Response::new(response))
            }
            Err(e) => {
                metrics.rejected(kind, e.reason());
                let status = e.to_status();
                match &e {
                    JoinError::Internal { .. }
                    | JoinError::KeyServiceUnavailable(_)
                    | JoinError::MetadataUnavailable(_)
                    | JoinError::ClusterStateUnavailable(_) => {
                        tracing::error!(kind, peer = %request_peer, reason = e.reason(), error = %chain(&e), "ticket request failed");
                    }
                    _ => {
                        tracing::warn!(kind, peer = %request_peer, reason = e.reason(), error = %chain(&e), "refused a ticket request");
                    }
                }
                Err(status)
            }
        }
    }
}

/// The instances by VPC IP; where two claim one address, the first in the listing wins
/// (as [`asterism_metadata::find_by_ip`] decides).
fn index_by_ip(list: Vec<InstanceMetadata>) -> InstancesByIp {
    let mut index = HashMap::with_capacity(list.len());
    for instance in list {
        if let Some(ip) = instance.vpc_ip_addr() {
            index.entry(ip).or_insert(instance);
        }
    }
    index
}

fn state_error(e: StateError) -> JoinError {
    match e {
        StateError::DiskBoundToOtherKey { uuid } => JoinError::Denied {
            reason: DenyReason::DiskBoundToOtherKey,
            detail: format!("disk {uuid} belongs to another attestation key"),
        },
        StateError::DiskUnbound { uuid } => JoinError::Denied {
            reason: DenyReason::DiskUnbound,
            detail: format!(
                "disk {uuid} was never bound to an attestation key: no node received its key, so a rejoin may not"
            ),
        },
        StateError::SecondDisk {
            bound, requested, ..
        } => JoinError::Denied {
            reason: DenyReason::SecondDisk,
            detail: format!(
                "this attestation key already has disk {bound}; disk {requested} is a second one, which needs an operator to re-admit the node (asterism readmit)"
            ),
        },
        StateError::MemberKeyChanged { name } => JoinError::Denied {
            reason: DenyReason::MemberKeyChanged,
            detail: format!(
                "node {name} is a member with another attestation key; an operator must re-admit it (asterism readmit {name})"
            ),
        },
        StateError::MemberRoleChanged { name, was, asked } => JoinError::Denied {
            reason: DenyReason::MemberRoleChanged,
            detail: format!(
                "node {name} is a member as {was}, not {asked}; a change of role needs an operator to re-admit it (asterism readmit {name})"
            ),
        },
        StateError::KeyIsAnotherMember { member, .. } => JoinError::Denied {
            reason: DenyReason::KeyIsAnotherMember,
            detail: format!(
                "this attestation key is member {member}: one key is one node, and a node keeps its name"
            ),
        },
        e @ StateError::Unavailable(_) => JoinError::ClusterStateUnavailable(e),
        other => JoinError::internal("updating the cluster state", other),
    }
}

/// A control-plane file, refused if larger than [`MAX_CONTROL_PLANE_FILE_LEN`].
fn read_capped(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    asterism_basics::read_file_capped(path, MAX_CONTROL_PLANE_FILE_LEN)?
        .ok_or_else(|| std::io::Error::other("larger than 1 MiB"))
}

/// The channel binding of the aTLS connection `request` arrived on.
fn channel_binding<T>(request: &Request<T>) -> Option<ChannelBinding> {
    request
        .extensions()
        .get::<AtlsConnectInfo>()
        .map(|info| ChannelBinding(info.channel_binding))
}

fn describe(peer: Option<&VerifiedPeer>) -> String {
    match peer {
        Some(p) => format!(
            "{} (ak {})",
            p.remote_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|| "?".into()),
            p.evidence().identity()
        ),
        None => "unattested".into(),
    }
}

#[tonic::async_trait]
impl<M, K, S> Api for JoinService<M, K, S>
where
    M: Metadata + 'static,
    K: KeySource,
    S: ClusterState,
{
    async fn issue_join_ticket(
        &self,
        request: Request<IssueJoinTicketRequest>,
    ) -> Result<Response<IssueJoinTicketResponse>, Status> {
        let issue = async |peer: &Peer, req| self.join(peer, req).await.map(From::from);
        self.ticket(request, issue).await
    }

    async fn issue_rejoin_ticket(
        &self,
        request: Request<IssueRejoinTicketRequest>,
    ) -> Result<Response<IssueRejoinTicketResponse>, Status> {
        let issue = async |peer: &Peer, req| self.rejoin(peer, req).await.map(From::from);
        self.ticket(request, issue).await
    }
}

/// A ticket answer: what its signature is for, the name its outcome is counted under, and
/// the field the signature goes in.
trait TicketAnswer: prost::Message + Sized {
    const PURPOSE: Purpose;
    const KIND: &'static str;
    fn signature(&mut self) -> &mut Vec<u8>;
}

impl TicketAnswer for IssueJoinTicketResponse {
    const PURPOSE: Purpose = Purpose::JoinTicket;
    const KIND: &'static str = "join";
    fn signature(&mut self) -> &mut Vec<u8> {
        &mut self.control_plane_signature
    }
}

impl TicketAnswer for IssueRejoinTicketResponse {
    const PURPOSE: Purpose = Purpose::RejoinTicket;
    const KIND: &'static str = "rejoin";
    fn signature(&mut self) -> &mut Vec<u8> {
        &mut self.control_plane_signature
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::redb_state::RedbState;
    use asterism_kms::{KeyServiceAddress, KeyServiceClient};
    use asterism_metadata::MetadataError;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// The platform's metadata as the service sees it, counting the listings it is asked
    /// for; the instances can change between calls, as a cloud's do.
    #[derive(Default)]
    struct CountingMetadata {
        instances: Mutex<Vec<InstanceMetadata>>,
        lists: AtomicUsize,
    }

    impl Metadata for CountingMetadata {
        async fn self_instance(&self) -> Result<InstanceMetadata, MetadataError> {
            Err(MetadataError::Status {
                path: "/self",
                status: 404,
            })
        }

        async fn list(&self) -> Result<Vec<InstanceMetadata>, MetadataError> {
            self.lists.fetch_add(1, Ordering::SeqCst);
            // A listing takes a moment, so that concurrent requests overlap.
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok(self.instances.lock().unwrap().clone())
        }

        async fn control_plane_endpoint(&self) -> Result<String, MetadataError> {
            Err(MetadataError::Status {
                path: "/endpoint",
                status: 404,
            })
        }

        async fn init_secret_hash(&self) -> Result<String, MetadataError> {
            Ok(String::new())
        }
    }

    type TestService = JoinService<Arc<CountingMetadata>, KeyServiceClient, RedbState>;

    fn service(
        metadata: Arc<CountingMetadata>,
        pki_dir: &std::path::Path,
        state_dir: &std::path::Path,
    ) -> TestService {
        JoinService::new(
            metadata,
            KeyServiceClient::new(&KeyServiceAddress::Unix(state_dir.join("no-key-service")))
                .unwrap(),
            RedbState::open(state_dir).unwrap(),
            ClusterCa::generate(SystemTime::now()).unwrap(),
            JoinConfig {
                measurement_salt: vec![1; 32],
                api_server_host: "127.0.10.1".parse().unwrap(),
                pki_dir: pki_dir.to_owned(),
                rate_per_second: 10.0,
                burst: 20,
                cluster_sans: Vec::new(),
                kubernetes: None,
            },
            Metrics::new(),
        )
        .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_listing_is_reused_while_fresh_fetched_once_by_a_burst_and_refetched_when_stale() {
        let dir = tempfile::tempdir().unwrap();
        let metadata = Arc::new(CountingMetadata::default());
        *metadata.instances.lock().unwrap() = vec![instance("a", "10.0.0.1")];
        let s = service(metadata.clone(), dir.path(), dir.path());
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();

        // A burst that finds no listing fetches it once.
        let burst: Vec<_> = (0..16)
            .map(|_| {
                let s = s.clone();
                tokio::spawn(async move { s.identify(a).await.map(|i| i.name) })
            })
            .collect();
        for t in burst {
            assert_eq!(t.await.unwrap().unwrap(), "a");
        }
        assert_eq!(metadata.lists.load(Ordering::SeqCst), 1);

        // A node added meanwhile is not seen while the listing is fresh…
        metadata
            .instances
            .lock()
            .unwrap()
            .push(instance("b", "10.0.0.2"));
        assert!(matches!(
            s.identify(b).await,
            Err(JoinError::Denied {
                reason: DenyReason::UnknownPeer,
                ..
            })
        ));
        assert_eq!(metadata.lists.load(Ordering::SeqCst), 1);

        // …and is once it is stale.
        tokio::time::sleep(METADATA_CACHE_TTL + Duration::from_millis(100)).await;
        assert_eq!(s.identify(b).await.unwrap().name, "b");
        assert_eq!(metadata.lists.load(Ordering::SeqCst), 2);
        assert_eq!(s.identify(a).await.unwrap().name, "a");
        assert_eq!(metadata.lists.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn control_plane_files_need_the_ca_and_send_the_others_present_in_order() {
        let pki = tempfile::tempdir().unwrap();
        let state = tempfile::tempdir().unwrap();
        let s = service(Arc::default(), pki.path(), state.path());
        let names = |files: &[ControlPlaneFile]| -> Vec<String> {
            files.iter().map(|f| f.name.clone()).collect()
        };

        // Nothing there: the CA files are missing.
        assert!(matches!(
            s.control_plane_files().await,
            Err(JoinError::Internal { .. })
        ));
        std::fs::write(pki.path().join("ca.crt"), b"cert").unwrap();
        // ca.key is required too.
        let err = s.control_plane_files().await.unwrap_err();
        assert!(chain(&err).contains("ca.key"), "{}", chain(&err));
        std::fs::write(pki.path().join("ca.key"), b"key").unwrap();
        assert_eq!(
            names(&s.control_plane_files().await.unwrap()),
            ["ca.key", "ca.crt"]
        );
        // The optional ones are sent when present, in the fixed order.
        std::fs::create_dir_all(pki.path().join("etcd")).unwrap();
        std::fs::write(pki.path().join("etcd/ca.crt"), b"etcd").unwrap();
        std::fs::write(pki.path().join("sa.pub"), b"sa").unwrap();
        let files = s.control_plane_files().await.unwrap();
        assert_eq!(names(&files), ["ca.key", "ca.crt", "sa.pub", "etcd/ca.crt"]);
        let data: Vec<&[u8]> = files.iter().map(|f| f.data.as_slice()).collect();
        assert_eq!(data, [&b"key"[..], b"cert", b"sa", b"etcd"]);
        // One larger than 1 MiB is refused, not truncated.
        std::fs::write(
            pki.path().join("sa.pub"),
            vec![b'x'; usize::try_from(MAX_CONTROL_PLANE_FILE_LEN).unwrap() + 1],
        )
        .unwrap();
        assert!(s.control_plane_files().await.is_err());
    }

    fn instance(name: &str, ip: &str) -> InstanceMetadata {
        InstanceMetadata {
            name: name.into(),
            vpc_ip: ip.into(),
            ..Default::default()
        }
    }

    #[test]
    fn the_index_finds_what_find_by_ip_finds() {
        let list = vec![
            instance("bad", "not an address"),
            instance("a", "10.0.0.1"),
            instance("a-again", "10.0.0.1"),
            instance("b", "10.0.0.2"),
        ];
        let index = index_by_ip(list.clone());
        for ip in ["10.0.0.1", "10.0.0.2", "::ffff:10.0.0.2", "10.0.0.3"] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(
                index.get(&ip.to_canonical()).map(|i| &i.name),
                asterism_metadata::find_by_ip(&list, ip).map(|i| &i.name),
                "{ip}"
            );
        }
        assert_eq!(index.len(), 2);
    }
}

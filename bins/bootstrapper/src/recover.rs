//! A rebooted control-plane node comes back (docs/recovery.md): it asks a join service
//! for its keys (the rejoin client, module `join`) and, in parallel, serves
//! `recoverproto.API` over aTLS so that the owner can hand it the same two keys when no
//! join service is left. Both paths end in [`Resume::resume`], which serialises them: the
//! first pair of keys that opens the disk and derives this node's cluster takes the node
//! lock (marks PCR 15); every later call, and the other path, finds it taken and changes
//! nothing.
//!
//! The order inside [`Resume::resume`] makes a refused call harmless: the disk key is
//! checked against the LUKS2 header first (nothing is mapped, nothing written), the
//! measurement secret is checked by the cluster it derives before PCR 15 is touched. Where
//! the disk is mapped, its file system is mounted on `state/` before the node state is read
//! from it.

use std::sync::Arc;

use asterism_binkit::error_chain;
use asterism_disk::Unlocked;
use asterism_kms::{ClusterId, DataKey, DiskUuid, KeyId, KmsUri, StorageUri, derive_cluster_id};
use asterism_proto::recover::api_server::Api;
use asterism_proto::recover::{DescribeRequest, DescribeResponse, RecoverMessage, RecoverResponse};
use tokio::sync::{Mutex, mpsc};
use tonic::{Request, Response, Status};
use tracing::{info, warn};
use zeroize::Zeroizing;

use crate::error::{ResumeError, StepError, blocking};
use crate::lock::Holder;
use crate::node::Node;
use crate::node_state::NodeState;
use crate::ticket::{TicketError, key32};

/// The recovery server's port: the owner's CLI dials it, so it must not change.
pub const DEFAULT_RECOVER_PORT: u16 = 9999;
/// The largest Recover request decoded (two 32-byte keys and a UUID; the master-secret form
/// carries a KMS URI of a few hundred bytes).
const MAX_RECOVER_MESSAGE: usize = 4096;

/// The two keys that bring a rebooted node back, whoever sent them.
pub(crate) struct RejoinKeys {
    /// The state disk's key (`key-<uuid>`).
    pub(crate) disk_key: DataKey,
    /// The cluster's measurement secret (`key-measurementSecret`).
    pub(crate) measurement_secret: DataKey,
}

/// Where the keys came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// A rejoin ticket from a join service.
    RejoinTicket,
    /// The owner, through the recovery server.
    Recovery,
}

impl Source {
    fn holder(self) -> Holder {
        match self {
            Self::RejoinTicket => Holder::Rejoin,
            Self::Recovery => Holder::Recovery,
        }
    }
}

/// The one place where a rebooted node's keys are used; see the module documentation.
pub(crate) struct Resume<M> {
    node: Arc<Node<M>>,
    uuid: DiskUuid,
    /// Held through one whole attempt: calls are serialised. `true` once a disk key opened
    /// (and, with device-mapper, mapped) the disk, so that it is not mapped twice.
    unlocked: Mutex<bool>,
}

impl<M: Send + Sync + 'static> Resume<M> {
    /// For `node`, whose state disk has `uuid`.
    pub(crate) fn new(node: Arc<Node<M>>, uuid: DiskUuid) -> Self {
        Self {
            node,
            uuid,
            unlocked: Mutex::new(false),
        }
    }

    /// The state disk's UUID.
    pub(crate) fn uuid(&self) -> &DiskUuid {
        &self.uuid
    }

    /// Checks `keys` and, if they are this node's, unlocks the disk, reads the node state,
    /// takes the node lock and marks PCR 15 with the cluster ID. A refused call changes
    /// nothing the next call depends on.
    pub(crate) async fn resume(
        &self,
        keys: RejoinKeys,
        source: Source,
    ) -> Result<ClusterId, ResumeError> {
        let mut unlocked = self.unlocked.lock().await;
        let node = &self.node;
        if node.lock.is_taken() {
            return Err(ResumeError::AlreadyDone);
        }
        let RejoinKeys {
            disk_key,
            measurement_secret,
        } = keys;
        let disk = node.disk.clone();
        let (opens, disk_key) =
            blocking(move || disk.check_key(&disk_key).map(|ok| (ok, disk_key)))
                .await
                .map_err(ResumeError::Step)?;
        if !opens {
            warn!(step = "resume", source = ?source, "refused a disk key that does not open the state disk; nothing changed");
            return Err(ResumeError::WrongKey);
        }
        if !*unlocked {
            let disk = node.disk.clone();
            let opened = blocking(move || disk.unlock(&disk_key))
                .await
                .map_err(ResumeError::Step)?;
            // Not mapped twice, whatever follows: a failed mount ends the run.
            *unlocked = true;
            match opened {
                Unlocked::KeyChecked => info!(
                    step = "resume",
                    "unlocked the state disk by a key check, without device-mapper (local mode: the node directory's state/ stands for the mounted disk)"
                ),
                Unlocked::Mapped(device) => {
                    info!(step = "resume", mapped = %device.display(), "unlocked the state disk");
                    mount_state(node, device)
                        .await
                        .map_err(ResumeError::Incomplete)?;
                }
            }
        }
        let state = NodeState::read(&node.dir().node_state())
            .map_err(|e| ResumeError::Incomplete(e.into()))?;
        let cluster_id = derive_cluster_id(&measurement_secret, &state.measurement_salt)
            .map_err(|e| ResumeError::Step(e.into()))?;
        drop(measurement_secret);
        if let Err(e) = node.config.join_service.accepts_cluster(&cluster_id) {
            warn!(step = "resume", source = ?source, error = %e, "refused a measurement secret of another cluster; PCR 15 not marked");
            return Err(ResumeError::OtherCluster(e));
        }
        let locking = node.clone();
        let holder = source.holder();
        match blocking(move || locking.lock.try_lock_once(holder, &cluster_id)).await {
            Ok(true) => {}
            Ok(false) => return Err(ResumeError::AlreadyDone),
            Err(e) => return Err(ResumeError::Marking(e)),
        }
        info!(step = "done", source = ?source, cluster_id = %cluster_id, role = %state.role, "the node is back: marked PCR 15 with the cluster ID");
        Ok(cluster_id)
    }
}

/// Mounts the file system of the mapped state disk on `state/`, before the node state is read
/// from it. A disk that opens with this node's key but whose file system does not mount
/// holds no usable node state.
async fn mount_state<M>(node: &Node<M>, device: std::path::PathBuf) -> Result<(), StepError> {
    let state = node.dir().state();
    crate::files::create_dirs(&state)?;
    let mount = node.mount.clone();
    blocking(move || mount.mount(&device, &state)).await
}

/// Why a Recover request is refused before its keys are tried.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RequestError {
    /// The master-secret form (`kms_uri`), without the flag that allows it.
    #[error(
        "the request carries the master secret (kms_uri); this node accepts only the two derived keys (start it with --insecure-accept-master-secret to allow it)"
    )]
    MasterSecretRefused,
    /// The master-secret form, allowed, but its KMS URI or storage URI is unusable.
    #[error("the KMS URI: {0}")]
    Kms(String),
    /// A key has the wrong length.
    #[error(transparent)]
    Key(#[from] TicketError),
    /// The keys were derived for another disk.
    #[error("the keys are for disk {got:?}, this node's state disk is {want}")]
    OtherDisk {
        /// The UUID the request names.
        got: String,
        /// This node's disk UUID.
        want: DiskUuid,
    },
}

/// A Recover request decoded into this node's two keys. `accept_master_secret` allows the
/// master-secret form (the keys are derived here from the master secret in `kms_uri`).
pub(crate) fn decode(
    mut msg: RecoverMessage,
    uuid: &DiskUuid,
    accept_master_secret: bool,
) -> Result<RejoinKeys, RequestError> {
    let kms_uri = Zeroizing::new(std::mem::take(&mut msg.kms_uri));
    if !kms_uri.is_empty() {
        if !accept_master_secret {
            return Err(RequestError::MasterSecretRefused);
        }
        warn!(
            step = "recover",
            "INSECURE: the caller sent the cluster's master secret (--insecure-accept-master-secret); deriving this node's keys from it"
        );
        let storage = if msg.storage_uri.is_empty() {
            StorageUri::NoStore
        } else {
            StorageUri::parse(&msg.storage_uri).map_err(|e| RequestError::Kms(e.to_string()))?
        };
        let kms = KmsUri::parse(&kms_uri)
            .map_err(|e| RequestError::Kms(e.to_string()))?
            .into_kms(&storage)
            .map_err(|e| RequestError::Kms(e.to_string()))?;
        let derive = |id: &KeyId| {
            kms.data_key(id, asterism_kms::STATE_DISK_KEY_LEN)
                .map_err(|e| RequestError::Kms(e.to_string()))
        };
        return Ok(RejoinKeys {
            disk_key: derive(&KeyId::Disk(uuid.clone()))?,
            measurement_secret: derive(&KeyId::MeasurementSecret)?,
        });
    }
    if msg.disk_uuid != uuid.as_str() {
        return Err(RequestError::OtherDisk {
            got: msg.disk_uuid,
            want: uuid.clone(),
        });
    }
    Ok(RejoinKeys {
        disk_key: key32(&mut msg.disk_key, "disk_key")?,
        measurement_secret: key32(
            &mut msg.cluster_measurement_secret,
            "cluster_measurement_secret",
        )?,
    })
}

/// The `recoverproto.API` service: thin; the keys go to [`Resume::resume`].
pub(crate) struct RecoverService<M> {
    resume: Arc<Resume<M>>,
    accept_master_secret: bool,
    /// Success, or a failure that ends the run, for the orchestrator.
    events: mpsc::UnboundedSender<Result<ClusterId, ResumeError>>,
    /// Bounds the disk-key checks (each a LUKS2 key derivation) callers can cause per
    /// address.
    attempts: Arc<crate::limits::PeerLimiter>,
    /// Bounds the disk-key checks in all: further calls wait their turn.
    checks: Arc<asterism_binkit::FairQueue>,
}

impl<M: Send + Sync + 'static> RecoverService<M> {
    /// The service over `resume`.
    pub(crate) fn new(
        resume: Arc<Resume<M>>,
        accept_master_secret: bool,
        limits: crate::limits::InitLimits,
        events: mpsc::UnboundedSender<Result<ClusterId, ResumeError>>,
    ) -> Self {
        Self {
            resume,
            accept_master_secret,
            events,
            attempts: crate::limits::PeerLimiter::for_calls(limits),
            checks: crate::limits::check_queue(limits.max_in_flight),
        }
    }

    /// The tonic server of this service, with its message size cap.
    pub(crate) fn into_server(self) -> asterism_proto::recover::api_server::ApiServer<Self>
    where
        M: Send + Sync + 'static,
    {
        asterism_proto::recover::api_server::ApiServer::new(self)
            .max_decoding_message_size(MAX_RECOVER_MESSAGE)
    }
}

/// The one place a resume error becomes a status: a coarse reason for the caller.
fn to_status(e: &ResumeError) -> Status {
    match e {
        ResumeError::WrongKey => Status::permission_denied(e.to_string()),
        ResumeError::OtherCluster(_) => Status::permission_denied(e.to_string()),
        ResumeError::AlreadyDone => Status::failed_precondition(e.to_string()),
        ResumeError::Incomplete(_) | ResumeError::Marking(_) => Status::internal(format!(
            "{e}; the state disk is marked for reset, reboot the node"
        )),
        ResumeError::Step(_) => Status::internal("the node could not try the keys"),
    }
}

#[tonic::async_trait]
impl<M: Send + Sync + 'static> Api for RecoverService<M> {
    async fn describe(
        &self,
        _request: Request<DescribeRequest>,
    ) -> Result<Response<DescribeResponse>, Status> {
        Ok(Response::new(DescribeResponse {
            disk_uuid: self.resume.uuid().as_str().to_owned(),
        }))
    }

    async fn recover(
        &self,
        request: Request<RecoverMessage>,
    ) -> Result<Response<RecoverResponse>, Status> {
        let peer = request
            .extensions()
            .get::<asterism_atls::AtlsConnectInfo>()
            .and_then(|i| i.remote_addr);
        let ip = peer.map_or(std::net::Ipv4Addr::UNSPECIFIED.into(), |a| a.ip());
        let _attempt = self.attempts.try_acquire(ip).map_err(|refused| {
            warn!(step = "recover", peer = ?peer, reason = %refused, "refused a Recover call");
            Status::resource_exhausted(refused.to_string())
        })?;
        let _turn = self.checks.turn(ip).await.map_err(|refused| {
            warn!(step = "recover", peer = ?peer, reason = %refused, "refused a Recover call: no turn for the key check");
            Status::resource_exhausted(refused.to_string())
        })?;
        info!(step = "recover", peer = ?peer, "received a Recover request");
        let keys = decode(
            request.into_inner(),
            self.resume.uuid(),
            self.accept_master_secret,
        )
        .map_err(|e| {
            warn!(step = "recover", peer = ?peer, error = %e, "refused a Recover request");
            Status::invalid_argument(e.to_string())
        })?;
        // The attempt runs to its end even if the caller goes away: once it took the node
        // lock, the orchestrator must hear of it.
        let (resume, events) = (self.resume.clone(), self.events.clone());
        let attempt = tokio::spawn(async move {
            let result = resume.resume(keys, Source::Recovery).await;
            match &result {
                Ok(cluster_id) => {
                    let _ = events.send(Ok(*cluster_id));
                }
                Err(e) if e.is_terminal() => {
                    tracing::error!(error = %error_chain(e), "recovery failed after the disk opened");
                }
                Err(e) => {
                    warn!(step = "recover", peer = ?peer, error = %error_chain(e), "refused the recovery keys; still waiting");
                }
            }
            let status = result.as_ref().err().map(to_status);
            if let Err(e) = result
                && e.is_terminal()
            {
                let _ = events.send(Err(e));
            }
            status
        });
        match attempt.await {
            Ok(None) => Ok(Response::new(RecoverResponse {})),
            Ok(Some(status)) => Err(status),
            Err(_) => Err(Status::internal("the recovery attempt failed")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex as StdMutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use asterism_attestation::{IssueError, Issuer, Measurements, ReportData};
    use asterism_cluster::Role;
    use asterism_disk::DiskError;
    use asterism_kms::{ClusterKms, MasterSecret, Salt};

    use crate::config::Config;
    use crate::effects::fakes::RecordingMount;
    use crate::effects::{DiskOps, MarkError, NodeMarker};
    use crate::logbuf::LogBuffer;
    use crate::trust::JoinServiceTrust;
    use asterism_cluster::NodeDir;

    const UUID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
    const SALT: [u8; 32] = [5; 32];

    fn kms() -> ClusterKms {
        ClusterKms::new(
            MasterSecret::new(vec![1; 32]).unwrap(),
            Salt::new(vec![2; 32]).unwrap(),
        )
    }

    fn keys_of(kms: &ClusterKms) -> RejoinKeys {
        let uuid = DiskUuid::parse(UUID).unwrap();
        RejoinKeys {
            disk_key: kms.data_key(&KeyId::Disk(uuid), 32).unwrap(),
            measurement_secret: kms.data_key(&KeyId::MeasurementSecret, 32).unwrap(),
        }
    }

    fn cluster_of(kms: &ClusterKms) -> ClusterId {
        let secret = kms.data_key(&KeyId::MeasurementSecret, 32).unwrap();
        derive_cluster_id(&secret, &SALT).unwrap()
    }

    /// A disk that one key opens; it counts unlocks and the key checks in flight at once.
    /// `mapped`: it unlocks as a mapping, as with device-mapper.
    struct FakeDisk {
        key: Vec<u8>,
        mapped: bool,
        unlocks: AtomicUsize,
        in_flight: AtomicUsize,
        most_in_flight: AtomicUsize,
    }

    impl DiskOps for FakeDisk {
        fn is_initialized(&self) -> Result<bool, DiskError> {
            Ok(true)
        }
        fn format_new(&self, _: &DataKey) -> Result<DiskUuid, DiskError> {
            unreachable!("a recovered disk is never formatted")
        }
        fn uuid(&self) -> Result<DiskUuid, DiskError> {
            Ok(DiskUuid::parse(UUID).unwrap())
        }
        fn replace_passphrase(&self, _: &DataKey, _: &DataKey) -> Result<(), DiskError> {
            unreachable!("a recovered disk is never re-keyed")
        }
        fn mark_for_reset(&self) -> Result<(), DiskError> {
            unreachable!("no test here resets")
        }
        fn unlock(&self, _: &DataKey) -> Result<Unlocked, DiskError> {
            self.unlocks.fetch_add(1, Ordering::SeqCst);
            Ok(if self.mapped {
                Unlocked::Mapped(MAPPING.into())
            } else {
                Unlocked::KeyChecked
            })
        }
        fn maps(&self) -> bool {
            self.mapped
        }
        fn check_key(&self, passphrase: &DataKey) -> Result<bool, DiskError> {
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_in_flight.fetch_max(now, Ordering::SeqCst);
            // Long enough for concurrent callers to overlap if nothing serialised them.
            std::thread::sleep(std::time::Duration::from_millis(20));
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            Ok(passphrase.expose_secret() == self.key.as_slice())
        }
    }

    #[derive(Default)]
    struct Marks(StdMutex<Vec<ClusterId>>);

    impl NodeMarker for Marks {
        fn is_marked(&self) -> Result<bool, MarkError> {
            Ok(!self.0.lock().unwrap().is_empty())
        }
        fn mark(&self, cluster_id: &ClusterId) -> Result<(), MarkError> {
            self.0.lock().unwrap().push(*cluster_id);
            Ok(())
        }
    }

    struct NoIssuer;

    impl Issuer for NoIssuer {
        fn variant(&self) -> &'static str {
            "none"
        }
        fn issue(&self, _: &ReportData) -> Result<Vec<u8>, IssueError> {
            unreachable!("Resume never attests")
        }
    }

    struct Fixture {
        resume: Arc<Resume<()>>,
        disk: Arc<FakeDisk>,
        marks: Arc<Marks>,
        node: Arc<Node<()>>,
        mount: Arc<RecordingMount>,
        _dir: tempfile::TempDir,
    }

    /// Where the fake disk is mapped.
    const MAPPING: &str = "/dev/mapper/state";

    fn node_state() -> NodeState {
        NodeState {
            role: Role::ControlPlane,
            measurement_salt: SALT,
        }
    }

    impl Fixture {
        /// The owner's recovery with the cluster's right keys.
        async fn recover(&self) -> Result<ClusterId, ResumeError> {
            self.resume.resume(keys_of(&kms()), Source::Recovery).await
        }
    }

    /// A node whose state is in `state/` (which stands for the disk).
    fn fixture(trust: JoinServiceTrust) -> Fixture {
        fixture_with(trust, false, RecordingMount::default())
    }

    /// With `mapped`, the node state is on the disk's file system only: `mount` shows it
    /// in `state/` once mounted.
    fn fixture_with(trust: JoinServiceTrust, mapped: bool, mut mount: RecordingMount) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let node_dir = NodeDir::new(dir.path().join("node"));
        if mapped {
            let relative = node_dir.node_state();
            let relative = relative.strip_prefix(node_dir.state()).unwrap();
            mount
                .contents
                .push((relative.to_path_buf(), node_state().to_json().into_bytes()));
        } else {
            node_state().write(&node_dir.node_state()).unwrap();
        }
        let mount = Arc::new(mount);
        let mut config = Config::new(node_dir, "127.0.0.1".parse().unwrap());
        config.join_service = trust;
        let disk = Arc::new(FakeDisk {
            mapped,
            key: keys_of(&kms()).disk_key.expose_secret().to_vec(),
            unlocks: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            most_in_flight: AtomicUsize::new(0),
        });
        let marks = Arc::new(Marks::default());
        let node = Arc::new(Node::new(
            config,
            marks.clone(),
            disk.clone(),
            mount.clone(),
            Arc::new(NoIssuer),
            (),
            Arc::new(crate::driver::NoneDriver::new()),
            LogBuffer::new(1024),
        ));
        let resume = Arc::new(Resume::new(node.clone(), DiskUuid::parse(UUID).unwrap()));
        Fixture {
            resume,
            disk,
            marks,
            node,
            mount,
            _dir: dir,
        }
    }

    fn trusting_cluster(cluster_id: ClusterId) -> JoinServiceTrust {
        let measurements = Measurements::from_json(
            format!("{{\"measurements\": {{\"0\": \"{}\"}}}}", "00".repeat(32)).as_bytes(),
        )
        .unwrap();
        JoinServiceTrust::cluster(
            asterism_testkit::pin(b"ak"),
            measurements.into_provider(),
            cluster_id,
            crate::ControlPlaneIdentity::key(
                kms().control_plane_seed().unwrap().public_key().unwrap(),
            ),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn a_key_that_does_not_open_the_disk_is_refused_and_changes_nothing() {
        let f = fixture(trusting_cluster(cluster_of(&kms())));
        let other = ClusterKms::new(
            MasterSecret::new(vec![9; 32]).unwrap(),
            Salt::new(vec![2; 32]).unwrap(),
        );
        let refused = f.resume.resume(keys_of(&other), Source::Recovery).await;
        assert!(matches!(refused, Err(ResumeError::WrongKey)), "{refused:?}");
        assert_eq!(f.disk.unlocks.load(Ordering::SeqCst), 0);
        assert!(f.marks.0.lock().unwrap().is_empty());
        assert!(!f.node.lock.is_taken());
        // The node kept waiting: the right keys still bring it back.
        let id = f.recover().await.unwrap();
        assert_eq!(id, cluster_of(&kms()));
        assert_eq!(*f.marks.0.lock().unwrap(), [id]);
    }

    #[tokio::test]
    async fn a_measurement_secret_of_another_cluster_marks_nothing_and_the_disk_is_opened_once() {
        let f = fixture(trusting_cluster(cluster_of(&kms())));
        let mut keys = keys_of(&kms());
        keys.measurement_secret = DataKey::new(vec![7; 32]).unwrap();
        let refused = f.resume.resume(keys, Source::Recovery).await;
        assert!(
            matches!(refused, Err(ResumeError::OtherCluster(_))),
            "{refused:?}"
        );
        assert!(f.marks.0.lock().unwrap().is_empty());
        assert!(!f.node.lock.is_taken());
        f.recover().await.unwrap();
        // The disk key was right both times: the disk is unlocked (mapped) once only.
        assert_eq!(f.disk.unlocks.load(Ordering::SeqCst), 1);
        assert_eq!(f.marks.0.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_repeated_call_after_success_is_refused_and_changes_nothing() {
        let f = fixture(JoinServiceTrust::insecure_skip_verification());
        f.recover().await.unwrap();
        let again = f.recover().await;
        assert!(matches!(again, Err(ResumeError::AlreadyDone)), "{again:?}");
        // The loser of the race (a rejoin ticket arriving after the recovery) likewise.
        let late = f.resume.resume(keys_of(&kms()), Source::RejoinTicket).await;
        assert!(matches!(late, Err(ResumeError::AlreadyDone)), "{late:?}");
        assert_eq!(f.disk.unlocks.load(Ordering::SeqCst), 1);
        assert_eq!(f.marks.0.lock().unwrap().len(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_calls_are_serialised_and_exactly_one_wins() {
        let f = fixture(JoinServiceTrust::insecure_skip_verification());
        let calls: Vec<_> = (0..6)
            .map(|i| {
                let resume = f.resume.clone();
                let source = if i % 2 == 0 {
                    Source::Recovery
                } else {
                    Source::RejoinTicket
                };
                tokio::spawn(async move { resume.resume(keys_of(&kms()), source).await })
            })
            .collect();
        let mut won = 0;
        for call in calls {
            match call.await.unwrap() {
                Ok(_) => won += 1,
                Err(ResumeError::AlreadyDone) => {}
                Err(e) => panic!("unexpected: {e:?}"),
            }
        }
        assert_eq!(won, 1);
        assert_eq!(f.disk.most_in_flight.load(Ordering::SeqCst), 1);
        assert_eq!(f.disk.unlocks.load(Ordering::SeqCst), 1);
        assert_eq!(f.marks.0.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_mapped_disk_is_mounted_before_its_node_state_is_read_and_never_formatted() {
        let f = fixture_with(
            trusting_cluster(cluster_of(&kms())),
            true,
            RecordingMount::default(),
        );
        let state = f.node.dir().state();
        // Before the mount, the node state is nowhere but on the disk.
        assert!(!f.node.dir().node_state().exists());
        let id = f.recover().await.unwrap();
        assert_eq!(id, cluster_of(&kms()));
        assert_eq!(
            *f.mount.log.lock().unwrap(),
            [format!(
                "mount {MAPPING} on {} over 0 entries",
                state.display()
            )],
            "mounted once on an empty state/, and no file system was made over the node's data"
        );
        assert_eq!(*f.marks.0.lock().unwrap(), [id]);
    }

    #[tokio::test]
    async fn a_mapped_disk_whose_file_system_does_not_mount_is_incomplete_and_marks_nothing() {
        let mount = RecordingMount {
            fail: Some(asterism_disk::Step::Mount),
            ..RecordingMount::default()
        };
        let f = fixture_with(trusting_cluster(cluster_of(&kms())), true, mount);
        let refused = f.recover().await;
        assert!(
            matches!(
                &refused,
                Err(ResumeError::Incomplete(StepError::FileSystem(
                    asterism_disk::FileSystemError::Failed {
                        step: asterism_disk::Step::Mount,
                        ..
                    }
                )))
            ),
            "{refused:?}"
        );
        assert!(refused.unwrap_err().is_terminal(), "the disk is reset");
        assert!(f.marks.0.lock().unwrap().is_empty());
        assert!(!f.node.lock.is_taken());
    }

    fn uuid() -> DiskUuid {
        DiskUuid::parse(UUID).unwrap()
    }

    fn original_form() -> RecoverMessage {
        RecoverMessage {
            kms_uri: KmsUri::cluster(
                MasterSecret::new(vec![1; 32]).unwrap(),
                Salt::new(vec![2; 32]).unwrap(),
            )
            .to_uri_string()
            .to_string(),
            storage_uri: "storage://no-store".into(),
            ..Default::default()
        }
    }

    #[test]
    fn the_original_form_with_the_master_secret_is_refused_by_default() {
        let refused = decode(original_form(), &uuid(), false);
        assert!(
            matches!(refused, Err(RequestError::MasterSecretRefused)),
            "{:?}",
            refused.err()
        );
    }

    #[test]
    fn the_original_form_when_allowed_derives_the_same_keys_as_the_key_service() {
        let keys = decode(original_form(), &uuid(), true).unwrap();
        let want = keys_of(&kms());
        assert_eq!(keys.disk_key.expose_secret(), want.disk_key.expose_secret());
        assert_eq!(
            keys.measurement_secret.expose_secret(),
            want.measurement_secret.expose_secret()
        );
    }

    #[test]
    fn keys_derived_for_another_disk_are_refused() {
        let want = keys_of(&kms());
        let msg = RecoverMessage {
            disk_key: want.disk_key.expose_secret().to_vec(),
            cluster_measurement_secret: want.measurement_secret.expose_secret().to_vec(),
            disk_uuid: "00000000-0000-0000-0000-000000000000".into(),
            ..Default::default()
        };
        let refused = decode(msg, &uuid(), false);
        assert!(
            matches!(refused, Err(RequestError::OtherDisk { .. })),
            "{:?}",
            refused.err()
        );
    }

    #[test]
    fn a_key_of_the_wrong_length_is_refused() {
        let msg = RecoverMessage {
            disk_key: vec![1; 31],
            cluster_measurement_secret: vec![2; 32],
            disk_uuid: UUID.into(),
            ..Default::default()
        };
        let refused = decode(msg, &uuid(), false);
        assert!(
            matches!(
                refused,
                Err(RequestError::Key(TicketError::KeyLength {
                    field: "disk_key",
                    len: 31
                }))
            ),
            "{:?}",
            refused.err()
        );
    }
}

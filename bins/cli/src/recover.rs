//! `asterism recover`: bring back the control-plane nodes of a cluster that went down
//! whole (docs/recovery.md, "Recovering a control plane").
//!
//! Per node, on one attested connection: the node's evidence is checked against the
//! expected measurements with PCR 15 required to be zero (a node waiting for recovery has
//! not marked it yet), `Describe` names its disk UUID, and `Recover` sends the two keys
//! derived for that UUID. The master secret never leaves this machine, unless
//! `--insecure-send-master-secret` asks for the master-secret form (`kms_uri`).
//!
//! The master secret comes from wherever [`recover`] is given it: [`read_master_secret`]
//! reads the workspace's `master-secret.json`, [`read_shares`] reconstructs it from M
//! custodians' decrypted shares and the workspace's `recovery.json`; [`cluster_kms`] picks
//! between the two as the flags say.

use crate::refuse_readable_by_others;
use crate::trust::TrustArgs;
use anyhow::{Context, Result, bail};
use asterism_atls::{AtlsConfig, AtlsConnector, AtlsError, VerifiedPeer};
use asterism_attestation::{
    ExpectedPcr, Measurements, PcrIndex, TpmQuoteValidator, ValidationError, Validator,
};
use asterism_kms::{ClusterKms, DataKey, DiskUuid, KeyId, KmsUri, MasterSecret, Salt};
use asterism_proto::recover::api_client::ApiClient;
use asterism_proto::recover::{DescribeRequest, RecoverMessage};
use asterism_recovery_shares::{DecryptedShareFile, EncryptedShareFile, RecoveryRecord};
use base64::Engine as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;
use tokio::time::Instant;
use zeroize::Zeroizing;

/// The recovery server's port on a node.
pub const DEFAULT_PORT: u16 = 9999;
/// The pause between attempts of one retrier while nothing listens: a node that is still
/// booting is asked again soon, without flooding the endpoint.
pub const RETRY_INTERVAL: Duration = Duration::from_secs(5);
/// The deadline of one connection, its attestation and both calls.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest master-secret file read.
const MAX_MASTER_SECRET_FILE: u64 = 4096;
/// The largest decrypted share read: a few hundred bytes for a 32-byte secret.
const MAX_SHARE_FILE: u64 = 64 * 1024;
/// The largest `recovery.json` read: a line per custodian, at most 255 of them.
const MAX_RECORD_FILE: u64 = 1024 * 1024;
/// The largest `cluster.json` read (a few hundred bytes in practice).
const MAX_CLUSTER_FILE: u64 = 64 * 1024;
/// The workspace's master-secret file.
const MASTER_SECRET_FILE: &str = "master-secret.json";
/// The workspace's record of the split (`asterism init --recovery-shares`).
const RECORD_FILE: &str = "recovery.json";

/// Arguments of `asterism recover`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The control-plane endpoint, HOST[:PORT] (port 9999 when left out). Behind a load
    /// balancer, every control-plane node it reaches is recovered.
    #[arg(long)]
    pub endpoint: String,
    /// The cluster's workspace (cluster ID, measurement salt, and master-secret.json or
    /// recovery.json).
    #[arg(long, value_name = "DIR")]
    pub workspace: PathBuf,
    /// The master-secret file (default: master-secret.json in the workspace).
    #[arg(long, value_name = "FILE")]
    pub master_secret: Option<PathBuf>,
    /// A custodian's decrypted share (`asterism recovery-share decrypt`), once per share:
    /// M of them and the workspace's recovery.json give the master secret back.
    #[arg(long = "share", value_name = "FILE", conflicts_with = "master_secret")]
    pub shares: Vec<PathBuf>,
    /// Deadline for the whole recovery, in seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout_secs: u64,
    /// INSECURE: send the whole master secret (for nodes that accept only that form) instead
    /// of the two keys each node needs. Warned on every use.
    #[arg(long)]
    pub insecure_send_master_secret: bool,
    /// INSECURE: send keys to any attestation key that passes the measurements, for a
    /// workspace that records no control-plane members (made before they were recorded).
    /// Any joined worker rebooted at the endpoint's address could then receive every
    /// disk key it names. Warned on every use.
    #[arg(long)]
    pub insecure_any_control_plane_ak: bool,
    /// Which nodes to trust.
    #[command(flatten)]
    pub trust: TrustArgs,
}

/// One recovered node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovered {
    /// The address the node answered from.
    pub peer: String,
    /// Its attestation key's identity (SHA-256 of the AK's public area, hex).
    pub ak: String,
    /// Its state disk's UUID (`None` when the master secret was sent instead).
    pub disk_uuid: Option<String>,
}

/// Where to recover, and how.
pub struct Target {
    /// `host:port`.
    pub endpoint: String,
    /// Checks a node's evidence: the measurements with PCR 15 required zero.
    pub validator: Arc<dyn Validator>,
    /// Send the master-secret form (the whole master secret in `kms_uri`).
    pub insecure_send_master_secret: bool,
    /// Which attestation keys may receive keys, and for which disk.
    pub control_plane: ControlPlaneAks,
    /// The deadline of the whole recovery.
    pub deadline: Duration,
    /// The pause between attempts.
    pub retry_interval: Duration,
}

/// Which nodes `asterism recover` sends keys to.
#[derive(Debug, Clone)]
pub enum ControlPlaneAks {
    /// Only these: each AK gets the keys of the one disk recorded for it.
    Recorded(crate::control_plane::Record),
    /// **Insecure**: any AK that passes the measurements, for the disk it names.
    InsecureAny,
}

impl ControlPlaneAks {
    /// The workspace's record; without one, refused unless `insecure_any` (warned).
    pub fn from_workspace(workspace: &Path, insecure_any: bool) -> Result<Self> {
        match crate::control_plane::Record::load(workspace)? {
            Some(record) => Ok(Self::Recorded(record)),
            None if insecure_any => {
                tracing::warn!(
                    "INSECURE: the workspace records no control-plane nodes; keys go to any attestation key that passes the measurements (--insecure-any-control-plane-ak)"
                );
                Ok(Self::InsecureAny)
            }
            None => bail!(
                "{} records no control-plane nodes ({}), so it cannot tell a control-plane node \
                 from a rebooted worker at the same address; --insecure-any-control-plane-ak \
                 accepts that risk",
                workspace.display(),
                crate::control_plane::RECORD_FILE
            ),
        }
    }

    /// The disk whose keys `ak` may receive: the recorded one (an unknown AK is refused),
    /// or, insecurely, whatever the node named.
    fn disk_for(&self, ak: &str) -> Result<Option<DiskUuid>, AttemptError> {
        match self {
            Self::Recorded(record) => match record.disk_for(ak) {
                Some(disk) => disk.map(Some).map_err(AttemptError::Fatal),
                None => Err(AttemptError::Fatal(anyhow::anyhow!(
                    "the node's attestation key {ak} is no control-plane node of this workspace \
                     ({}); nothing was sent. A control-plane node that joined after init is \
                     added by `asterism control-plane sync`",
                    crate::control_plane::RECORD_FILE
                ))),
            },
            Self::InsecureAny => {
                tracing::warn!(
                    ak,
                    "INSECURE: sending keys to an attestation key the workspace does not record (--insecure-any-control-plane-ak)"
                );
                Ok(None)
            }
        }
    }
}

/// Runs `asterism recover` with the master secret from `--share`, `--master-secret` or
/// the workspace ([`cluster_kms`]), printing per node what it did.
pub async fn run(args: Args) -> Result<Vec<Recovered>> {
    let kms = cluster_kms(&args)?;
    check_cluster(&args.workspace, &kms)?;
    let target = Target {
        endpoint: with_default_port(&args.endpoint),
        validator: validator(&args.trust)?,
        insecure_send_master_secret: args.insecure_send_master_secret,
        control_plane: ControlPlaneAks::from_workspace(
            &args.workspace,
            args.insecure_any_control_plane_ak,
        )?,
        deadline: Duration::from_secs(args.timeout_secs),
        retry_interval: RETRY_INTERVAL,
    };
    recover(&target, &kms).await
}

/// Recovers every node that `target` reaches with keys derived from `kms`. Each success
/// starts a new retrier (the endpoint may route to another node needing recovery); the
/// recovery ends when a retrier finds nothing listening twice, or at the deadline.
pub async fn recover(target: &Target, kms: &ClusterKms) -> Result<Vec<Recovered>> {
    let deadline = Instant::now() + target.deadline;
    let mut recovered = Vec::new();
    while let Some(node) = retrier(target, kms, deadline, !recovered.is_empty()).await? {
        eprintln!(
            "▸ recovered {}: attestation key {}, disk {}",
            node.peer,
            node.ak,
            node.disk_uuid.as_deref().unwrap_or("(not asked)")
        );
        recovered.push(node);
    }
    if recovered.is_empty() {
        eprintln!(
            "▸ no control-plane node at {} needs recovery",
            target.endpoint
        );
    } else {
        eprintln!("▸ recovered {} node(s)", recovered.len());
    }
    Ok(recovered)
}

/// Why one attempt failed.
#[derive(Debug, thiserror::Error)]
enum AttemptError {
    /// Nothing listens (no node waits for recovery there).
    #[error("nothing listens: {0}")]
    Unavailable(String),
    /// A connection or handshake that broke: retried.
    #[error("{0}")]
    Transient(String),
    /// The node's PCR 15 is marked: it is back already. Right after a recovery this is
    /// the node just recovered, still answering for a moment before its recovery server
    /// closes, so it counts as nothing listening; on a first attempt it is the end.
    #[error(transparent)]
    AlreadyBack(anyhow::Error),
    /// The node's evidence was refused, or the node refused the keys: the end.
    #[error(transparent)]
    Fatal(anyhow::Error),
}

/// One retrier: attempts every `retry_interval` until a node is recovered (`Some`), or
/// nothing listened twice in a row (`None`: one `Unavailable` per retrier is forgiven, a
/// second means no node there needs recovery). `after_recovery`: a node was recovered
/// before this retrier began.
async fn retrier(
    target: &Target,
    kms: &ClusterKms,
    deadline: Instant,
    after_recovery: bool,
) -> Result<Option<Recovered>> {
    let mut unavailable_once = false;
    let mut backoff = crate::retry::Backoff::new(target.retry_interval);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!(
                "recovery did not finish within {:?}; run it again to go on",
                target.deadline
            );
        }
        let attempt = tokio::time::timeout(left.min(ATTEMPT_TIMEOUT), attempt(target, kms));
        match attempt.await {
            Ok(Ok(node)) => return Ok(Some(node)),
            Ok(Err(AttemptError::Fatal(e))) => return Err(e),
            Ok(Err(AttemptError::AlreadyBack(e))) if !after_recovery => return Err(e),
            Ok(Err(AttemptError::AlreadyBack(_))) if unavailable_once => return Ok(None),
            Ok(Err(AttemptError::AlreadyBack(e))) => {
                tracing::info!(endpoint = %target.endpoint, reason = %format!("{e:#}"), "a node that is back already answered; retrying once");
                unavailable_once = true;
                tokio::time::sleep(target.retry_interval.min(left)).await;
                continue;
            }
            Ok(Err(AttemptError::Unavailable(why))) => {
                if unavailable_once {
                    return Ok(None);
                }
                tracing::info!(endpoint = %target.endpoint, reason = %why, "nothing listens yet; retrying once");
                unavailable_once = true;
                tokio::time::sleep(target.retry_interval.min(left)).await;
                continue;
            }
            Ok(Err(AttemptError::Transient(why))) => {
                tracing::info!(endpoint = %target.endpoint, reason = %why, "attempt failed; retrying");
                // A busy node (a flood holding its handshake slots, its key checks queued)
                // is tried again soon, then less and less often.
                let wait = backoff.next_wait();
                eprintln!(
                    "▸ attempt {} at {} failed: {why}; retrying in {:.1} s",
                    backoff.attempts,
                    target.endpoint,
                    wait.as_secs_f64()
                );
                tokio::time::sleep(wait.min(left)).await;
                continue;
            }
            Err(_) => tracing::info!(endpoint = %target.endpoint, "attempt timed out; retrying"),
        }
        tokio::time::sleep(target.retry_interval.min(left)).await;
    }
}

/// One node: connect, verify, describe, send its keys.
async fn attempt(target: &Target, kms: &ClusterKms) -> Result<Recovered, AttemptError> {
    let connector = AtlsConnector::new(
        AtlsConfig::verifying(target.validator.clone())
            .with_handshake_timeout(ATTEMPT_TIMEOUT)
            .with_exchange_timeout(ATTEMPT_TIMEOUT),
    )
    .map_err(|e| AttemptError::Fatal(e.into()))?;
    let once = OneConnection::new(connector.clone());
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", target.endpoint))
        .map_err(|e| AttemptError::Fatal(anyhow::anyhow!("invalid endpoint: {e}")))?
        .connect_timeout(ATTEMPT_TIMEOUT)
        .timeout(ATTEMPT_TIMEOUT)
        .connect_with_connector(once)
        .await
        .map_err(|e| classify_connect(&target.endpoint, &e))?;
    let peer = connector.last_verified_peer().ok_or_else(|| {
        AttemptError::Fatal(anyhow::anyhow!(
            "the connection carried no verified evidence"
        ))
    })?;
    // Before anything is asked or sent: is this one of the control plane's own TPMs?
    let recorded = target.control_plane.disk_for(peer.evidence().identity())?;
    let mut client = ApiClient::new(channel).max_decoding_message_size(4096);
    let (message, disk_uuid) = if target.insecure_send_master_secret {
        tracing::warn!(
            endpoint = %target.endpoint,
            "INSECURE: sending the cluster's whole master secret to the node (--insecure-send-master-secret)"
        );
        (original_form(kms).map_err(AttemptError::Fatal)?, None)
    } else {
        let uuid = client
            .describe(DescribeRequest {})
            .await
            .map_err(|s| classify_status(&s, "describe"))?
            .into_inner()
            .disk_uuid;
        let uuid = DiskUuid::parse(&uuid).map_err(|e| {
            AttemptError::Fatal(anyhow::anyhow!("the node named an unusable disk UUID: {e}"))
        })?;
        // One AK, one disk: the keys of the recorded disk only, never of one it names.
        let uuid = match recorded {
            Some(want) if want != uuid => {
                return Err(AttemptError::Fatal(anyhow::anyhow!(
                    "the node with attestation key {} names disk {uuid}, but the workspace \
                     records disk {want} for it; nothing was sent",
                    peer.evidence().identity()
                )));
            }
            Some(want) => want,
            None => uuid,
        };
        let keys = NodeKeys::derive(kms, &uuid).map_err(AttemptError::Fatal)?;
        (keys.into_message(&uuid), Some(uuid.as_str().to_owned()))
    };
    client
        .recover(message)
        .await
        .map_err(|s| classify_status(&s, "recover"))?;
    Ok(Recovered {
        peer: peer_name(&peer, &target.endpoint),
        ak: peer.evidence().identity().to_string(),
        disk_uuid,
    })
}

fn peer_name(peer: &VerifiedPeer, endpoint: &str) -> String {
    peer.remote_addr()
        .map_or_else(|| endpoint.to_owned(), |a| a.to_string())
}

/// The two keys one node needs, derived as the key service derives them.
pub struct NodeKeys {
    /// `key-<uuid>`: the node's state disk key.
    pub disk_key: DataKey,
    /// `key-measurementSecret`: the cluster's measurement secret.
    pub measurement_secret: DataKey,
}

impl NodeKeys {
    /// The keys for the node whose disk is `uuid`.
    pub fn derive(kms: &ClusterKms, uuid: &DiskUuid) -> Result<Self> {
        Ok(Self {
            disk_key: kms
                .data_key(&KeyId::Disk(uuid.clone()), asterism_kms::STATE_DISK_KEY_LEN)
                .context("deriving the disk key")?,
            measurement_secret: kms
                .data_key(&KeyId::MeasurementSecret, 32)
                .context("deriving the measurement secret")?,
        })
    }

    fn into_message(self, uuid: &DiskUuid) -> RecoverMessage {
        RecoverMessage {
            disk_key: self.disk_key.expose_secret().to_vec(),
            cluster_measurement_secret: self.measurement_secret.expose_secret().to_vec(),
            disk_uuid: uuid.as_str().to_owned(),
            ..RecoverMessage::default()
        }
    }
}

/// The master-secret form: the master secret in a KMS URI.
fn original_form(kms: &ClusterKms) -> Result<RecoverMessage> {
    let uri = KmsUri::cluster(
        MasterSecret::new(kms.master_secret().expose_secret().to_vec())?,
        Salt::new(kms.salt().expose_secret().to_vec())?,
    )
    .to_uri_string();
    Ok(RecoverMessage {
        kms_uri: uri.to_string(),
        storage_uri: "storage://no-store".into(),
        ..RecoverMessage::default()
    })
}

/// The master secret that `args` names: reconstructed from the `--share` files, else read
/// from `--master-secret` or the workspace's `master-secret.json`. A workspace that keeps
/// only shares (`init --no-master-secret-file`) without `--share` is refused with what to
/// give.
pub fn cluster_kms(args: &Args) -> Result<ClusterKms> {
    if !args.shares.is_empty() {
        return read_shares(&args.workspace, &args.shares);
    }
    if let Some(path) = &args.master_secret {
        return read_master_secret(path);
    }
    let path = args.workspace.join(MASTER_SECRET_FILE);
    match std::fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        // Present, or unreadable for another reason that reading it will name.
        _ => return read_master_secret(&path),
    }
    let record_path = args.workspace.join(RECORD_FILE);
    if !record_path.exists() {
        bail!(
            "{} has neither {MASTER_SECRET_FILE} nor {RECORD_FILE}: give the master secret \
             with --master-secret FILE, or custodians' decrypted shares with --share FILE",
            args.workspace.display()
        );
    }
    let threshold = read_record(&args.workspace)?.threshold();
    bail!(
        "{} keeps no {MASTER_SECRET_FILE}, only the custodians' shares ({} of {} needed): \
         have {} custodians decrypt theirs with `asterism recovery-share decrypt` and give \
         each with --share FILE",
        args.workspace.display(),
        threshold.needed(),
        threshold.total(),
        threshold.needed()
    )
}

/// Reconstructs the master secret from custodians' decrypted shares (`files`) and the
/// workspace's `recovery.json`, and pairs it with the record's salt. Every share is
/// checked against the record before any is used; errors name the file. A share file that
/// others can read is refused, as the master-secret file is.
pub fn read_shares(workspace: &Path, files: &[PathBuf]) -> Result<ClusterKms> {
    let record = read_record(workspace)?;
    let shares = files
        .iter()
        .map(|path| read_share(path))
        .collect::<Result<Vec<_>>>()?;
    let secret = asterism_recovery_shares::reconstruct(&shares, &record).with_context(|| {
        format!(
            "reconstructing the master secret from {} share(s) with {}",
            shares.len(),
            workspace.join(RECORD_FILE).display()
        )
    })?;
    let salt = record
        .salt()
        .with_context(|| format!("{}: salt", workspace.join(RECORD_FILE).display()))?;
    Ok(ClusterKms::new(secret, salt))
}

/// The workspace's `recovery.json`.
fn read_record(workspace: &Path) -> Result<RecoveryRecord> {
    let path = workspace.join(RECORD_FILE);
    let bytes = asterism_binkit::read_capped(&path, MAX_RECORD_FILE)
        .with_context(|| format!("reading {}", path.display()))?;
    Ok(RecoveryRecord::from_json(
        &bytes,
        &path.display().to_string(),
    )?)
}

/// One decrypted share. An encrypted one is named as such: its custodian decrypts it first.
fn read_share(path: &Path) -> Result<DecryptedShareFile> {
    refuse_readable_by_others(path)?;
    let bytes = Zeroizing::new(
        asterism_binkit::read_capped(path, MAX_SHARE_FILE)
            .with_context(|| format!("reading {}", path.display()))?,
    );
    let origin = path.display().to_string();
    DecryptedShareFile::from_json(&bytes, &origin).map_err(|e| {
        if EncryptedShareFile::from_json(&bytes, &origin).is_ok() {
            anyhow::anyhow!(
                "{origin} is a share still encrypted to its custodian; they decrypt it with \
                 `asterism recovery-share decrypt --share {origin} --identity KEY`"
            )
        } else {
            e.into()
        }
    })
}

/// Reads a `master-secret.json` (`{"key": base64, "salt": base64}`), refusing a file that
/// others can read.
pub fn read_master_secret(path: &Path) -> Result<ClusterKms> {
    // Borrowed from the zeroizing buffer: the base64 text is never copied.
    #[derive(serde::Deserialize)]
    struct File<'a> {
        key: &'a str,
        salt: &'a str,
    }
    refuse_readable_by_others(path)?;
    let text = Zeroizing::new(
        asterism_binkit::read_capped(path, MAX_MASTER_SECRET_FILE)
            .with_context(|| format!("reading {}", path.display()))?,
    );
    let file: File = serde_json::from_slice(&text)
        .with_context(|| format!("{} is not a master-secret file", path.display()))?;
    let b64 = base64::engine::general_purpose::STANDARD;
    let key = Zeroizing::new(
        b64.decode(file.key.as_bytes())
            .with_context(|| format!("{}: key is not base64", path.display()))?,
    );
    let salt = b64
        .decode(file.salt.as_bytes())
        .with_context(|| format!("{}: salt is not base64", path.display()))?;
    Ok(ClusterKms::new(
        MasterSecret::new(key.to_vec()).with_context(|| format!("{}: key", path.display()))?,
        Salt::new(salt).with_context(|| format!("{}: salt", path.display()))?,
    ))
}

/// Checks that `kms` is the workspace's cluster: its measurement secret and the
/// workspace's measurement salt derive the workspace's cluster ID. A master secret of
/// another cluster would send keys that open nothing.
pub fn check_cluster(workspace: &Path, kms: &ClusterKms) -> Result<()> {
    #[derive(serde::Deserialize)]
    struct Cluster {
        #[serde(rename = "clusterID")]
        cluster_id: String,
        #[serde(rename = "measurementSalt")]
        measurement_salt: String,
    }
    let path = workspace.join("cluster.json");
    let text = asterism_binkit::read_capped(&path, MAX_CLUSTER_FILE)
        .with_context(|| format!("reading {}", path.display()))?;
    let cluster: Cluster =
        serde_json::from_slice(&text).with_context(|| format!("{}", path.display()))?;
    let salt: [u8; 32] = hex::decode(&cluster.measurement_salt)
        .ok()
        .and_then(|s| s.try_into().ok())
        .with_context(|| format!("{}: measurementSalt is not 32 hex bytes", path.display()))?;
    let secret = kms.data_key(&KeyId::MeasurementSecret, 32)?;
    let derived = asterism_kms::derive_cluster_id(&secret, &salt)?;
    if hex::encode(derived.as_bytes()) != cluster.cluster_id.trim().to_ascii_lowercase() {
        bail!(
            "the master secret is not this workspace's: it derives cluster {derived}, the workspace is cluster {}",
            cluster.cluster_id.trim()
        );
    }
    Ok(())
}

/// The validator of a node waiting for recovery: the expected measurements with PCR 15
/// enforced as zero (see [`recovery_measurements`]).
pub fn validator(trust: &TrustArgs) -> Result<Arc<dyn Validator>> {
    let measurements = recovery_measurements(&trust.load_measurements()?)?;
    Ok(Arc::new(TpmQuoteValidator::new(
        trust.ak_trust_for(&measurements)?,
        measurements.into_provider(),
    )))
}

/// `loaded` with PCR 15 enforced as zero whatever it said. A node waiting for its keys has
/// not marked PCR 15 (it marks it only once its keys opened the disk); a marked node is
/// back already and needs nothing, and any other value is not a node of this cluster in
/// a fresh boot.
pub fn recovery_measurements(loaded: &Measurements) -> Result<Measurements> {
    let pcr15 = PcrIndex::new(15).context("PCR 15")?;
    let expected = loaded
        .iter()
        .filter(|(i, _)| *i != pcr15)
        .map(|(i, e)| (i, *e))
        .chain([(pcr15, ExpectedPcr::enforce([0; 32]))]);
    Ok(Measurements::new(expected)?.with_cvm(loaded.cvm().clone()))
}

/// `host:port`, with the recovery port added when `endpoint` names none.
#[must_use]
pub fn with_default_port(endpoint: &str) -> String {
    if endpoint.parse::<std::net::SocketAddr>().is_ok() {
        return endpoint.to_owned();
    }
    if let Ok(ip) = endpoint.parse::<std::net::IpAddr>() {
        return std::net::SocketAddr::new(ip, DEFAULT_PORT).to_string();
    }
    match endpoint.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') && port.parse::<u16>().is_ok() => {
            endpoint.to_owned()
        }
        _ => format!("{endpoint}:{DEFAULT_PORT}"),
    }
}

fn classify_connect(endpoint: &str, e: &tonic::transport::Error) -> AttemptError {
    // The aTLS error is in the cause chain; its variant decides, never its text.
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if let Some(atls) = c.downcast_ref::<AtlsError>() {
            return classify_atls(endpoint, atls);
        }
        cause = c.source();
    }
    AttemptError::Transient(format!("could not connect to {endpoint}: {e}"))
}

fn classify_atls(endpoint: &str, e: &AtlsError) -> AttemptError {
    match e {
        AtlsError::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            AttemptError::Unavailable(format!("nothing listens at {endpoint}"))
        }
        AtlsError::Rejected(ValidationError::Measurement { index: 15, .. }) => {
            AttemptError::AlreadyBack(anyhow::anyhow!(
                "the node at {endpoint} is not one to recover: its PCR 15 is not zero (it is back already, or marked by something else); nothing was sent. Details: {e}"
            ))
        }
        AtlsError::Rejected(_) => AttemptError::Fatal(anyhow::anyhow!(
            "the node at {endpoint} is not one to recover: its evidence was refused (other software, or an untrusted attestation key); nothing was sent. Details: {e}"
        )),
        _ => AttemptError::Transient(format!(
            "could not open an attested connection to {endpoint}: {e}"
        )),
    }
}

fn classify_status(s: &tonic::Status, call: &str) -> AttemptError {
    match s.code() {
        tonic::Code::Unavailable => AttemptError::Unavailable(s.message().to_owned()),
        // Busy (its key checks queued too long, or this address at its rate): nothing was
        // checked; try again.
        tonic::Code::ResourceExhausted => {
            AttemptError::Transient(format!("the node is busy: {}", s.message()))
        }
        // Brought back meanwhile (its rejoin won, or another recovery): it needs nothing;
        // the next attempt finds its port closed or another node.
        tonic::Code::FailedPrecondition => AttemptError::Transient(format!(
            "the node no longer needs recovery: {}",
            s.message()
        )),
        _ => AttemptError::Fatal(anyhow::anyhow!(
            "the node refused {call}: {:?}: {}",
            s.code(),
            s.message()
        )),
    }
}

/// A connector that opens one attested connection and refuses a second: `Describe` and
/// `Recover` travel on the session whose evidence was checked, never on a reconnection
/// that a load balancer could route to another node.
#[derive(Clone)]
struct OneConnection {
    inner: AtlsConnector,
    used: Arc<AtomicBool>,
}

impl OneConnection {
    fn new(inner: AtlsConnector) -> Self {
        Self {
            inner,
            used: Arc::new(AtomicBool::new(false)),
        }
    }
}

impl tower::Service<http::Uri> for OneConnection {
    type Response = <AtlsConnector as tower::Service<http::Uri>>::Response;
    type Error = AtlsError;
    type Future = <AtlsConnector as tower::Service<http::Uri>>::Future;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        if self.used.swap(true, Ordering::SeqCst) {
            return Box::pin(async {
                Err(AtlsError::Config(
                    "the attested session ended; a new attempt verifies the node again".into(),
                ))
            });
        }
        self.inner.call(uri)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// HKDF-SHA-256 computed here with ring, independently of the kms crate: the formula
    /// the key service derives with.
    fn hkdf(ikm: &[u8], salt: &[u8], info: &str) -> Vec<u8> {
        struct Len32;
        impl ring::hkdf::KeyType for Len32 {
            fn len(&self) -> usize {
                32
            }
        }
        let prk = ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, salt).extract(ikm);
        let info = [info.as_bytes()];
        let okm = prk.expand(&info, Len32).unwrap();
        let mut out = vec![0; 32];
        okm.fill(&mut out).unwrap();
        out
    }

    #[test]
    fn the_keys_sent_are_the_key_services_for_that_disk() {
        let (master, salt) = (vec![0x55; 32], vec![0x66; 32]);
        let kms = ClusterKms::new(
            MasterSecret::new(master.clone()).unwrap(),
            Salt::new(salt.clone()).unwrap(),
        );
        let uuid = DiskUuid::parse("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0").unwrap();
        let keys = NodeKeys::derive(&kms, &uuid).unwrap();
        assert_eq!(
            keys.disk_key.expose_secret(),
            hkdf(&master, &salt, "key-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0")
        );
        assert_eq!(
            keys.measurement_secret.expose_secret(),
            hkdf(&master, &salt, "key-measurementSecret")
        );
        // Another disk, another key.
        let other = DiskUuid::parse("00000000-0000-0000-0000-000000000001").unwrap();
        assert_ne!(
            NodeKeys::derive(&kms, &other)
                .unwrap()
                .disk_key
                .expose_secret(),
            keys.disk_key.expose_secret()
        );
        let message = keys.into_message(&uuid);
        assert!(message.kms_uri.is_empty(), "the master secret never leaves");
        assert_eq!(message.disk_uuid, uuid.as_str());
    }

    #[test]
    fn pcr15_is_enforced_zero_whatever_the_measurements_file_says() {
        let marker = "ab".repeat(32);
        let loaded = Measurements::from_json(
            format!(
                "{{\"measurements\": {{\"4\": \"{}\", \"15\": {{\"expected\": \"{marker}\", \"warnOnly\": true}}}}}}",
                "11".repeat(32)
            )
            .as_bytes(),
        )
        .unwrap();
        let m = recovery_measurements(&loaded).unwrap();
        let pcr15 = m.get(PcrIndex::new(15).unwrap()).unwrap();
        assert_eq!(*pcr15, ExpectedPcr::enforce([0; 32]));
        assert_eq!(
            m.get(PcrIndex::new(4).unwrap()),
            loaded.get(PcrIndex::new(4).unwrap())
        );
    }

    #[test]
    fn the_default_port_is_added_only_where_none_is_named() {
        assert_eq!(with_default_port("10.0.0.1"), "10.0.0.1:9999");
        assert_eq!(with_default_port("10.0.0.1:1234"), "10.0.0.1:1234");
        assert_eq!(with_default_port("cp.example"), "cp.example:9999");
        assert_eq!(with_default_port("cp.example:1"), "cp.example:1");
        assert_eq!(with_default_port("::1"), "[::1]:9999");
        assert_eq!(with_default_port("[::1]:5"), "[::1]:5");
    }
}

//! Recovery of a rebooted node with no join service left: a real swtpm, a real LUKS2 image
//! keyed with the cluster-derived key, the node's recovery server over real aTLS (the node
//! attests; the test verifies its quote), and the keys derived from a master secret.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::common::*;
use asterism_atls::{AtlsConfig, AtlsServer};
use asterism_bootstrapper::{NodeState, Outcome, Role};
use asterism_disk::StateDisk;
use asterism_kms::{ClusterKms, DataKey, KeyId, MasterSecret, Salt, derive_cluster_id};
use asterism_metadata::{Role as MetaRole, StaticMetadata};
use asterism_proto::recover::api_client::ApiClient;
use asterism_proto::recover::api_server::{Api as RecoverApi, ApiServer as RecoverApiServer};
use asterism_proto::recover::{DescribeRequest, RecoverMessage};
use tonic::transport::Channel;

const MEASUREMENT_SALT: [u8; 32] = [0x44; 32];

fn kms() -> ClusterKms {
    ClusterKms::new(
        MasterSecret::new(vec![0x55; 32]).unwrap(),
        Salt::new(vec![0x66; 32]).unwrap(),
    )
}

fn cluster_id() -> asterism_kms::ClusterId {
    let secret = kms().data_key(&KeyId::MeasurementSecret, 32).unwrap();
    derive_cluster_id(&secret, &MEASUREMENT_SALT).unwrap()
}

/// A node as an earlier boot left it: its disk formatted and re-keyed with the key derived
/// for its UUID, its node state written, PCR 15 not marked (the TPM was reset). Returns
/// the disk's UUID.
fn rebooted_node(t: &TestNode) -> String {
    asterism_bootstrapper::prepare_state_image(&t.image(), 32 * 1024 * 1024).unwrap();
    asterism_bootstrapper::files::create_dirs(&t.node_dir.run()).unwrap();
    let disk = StateDisk::open(t.image(), t.disk_config()).unwrap();
    let first = DataKey::new(vec![0x11; 32]).unwrap();
    let uuid = disk.format_new(&first).unwrap().uuid;
    let key = kms().data_key(&KeyId::Disk(uuid.clone()), 32).unwrap();
    disk.replace_passphrase(&first, &key).unwrap();
    NodeState {
        role: Role::ControlPlane,
        measurement_salt: MEASUREMENT_SALT,
    }
    .write(&t.node_dir.node_state())
    .unwrap();
    uuid.as_str().to_owned()
}

/// Starts the bootstrapper of the rebooted node `t`. The metadata names another
/// control-plane node at `other_cp` where no join service answers, so the rejoin client
/// keeps trying while the recovery server waits for keys.
fn wait_for_keys(
    t: &TestNode,
    other_cp: std::net::IpAddr,
) -> tokio::task::JoinHandle<Result<Outcome, asterism_bootstrapper::Failure>> {
    let metadata = StaticMetadata::new(vec![
        instance("cp-0", MetaRole::ControlPlane, t.ip),
        instance("cp-1", MetaRole::ControlPlane, other_cp),
    ])
    .with_self("cp-0")
    .with_init_secret_hash(init_secret_hash());
    let node = t.node(
        metadata,
        TestNode::none_driver(),
        30090,
        Some(t.join_service_trust(
            cluster_id(),
            asterism_bootstrapper::ControlPlaneIdentity::key(
                kms().control_plane_seed().unwrap().public_key().unwrap(),
            ),
        )),
    );
    tokio::spawn(t.run(node, std::future::pending()))
}

/// The bootstrapper of `t` ends with `Recovered`, and PCR 15 holds the cluster's marker.
async fn assert_recovered(
    t: &TestNode,
    run: tokio::task::JoinHandle<Result<Outcome, asterism_bootstrapper::Failure>>,
) {
    let outcome = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(outcome, Outcome::Recovered(cluster_id()));
    assert_eq!(
        t.pcr15(),
        asterism_tpm::marker::expected_marker_pcr(cluster_id().as_bytes())
    );
}

/// An aTLS channel to the node's recovery server that verifies the node (PCR 15 zero).
async fn recover_channel(t: &TestNode) -> Channel {
    t.attested_channel(t.recover_port(), "the recovery server")
        .await
}

fn keys_for(kms: &ClusterKms, uuid: &str) -> RecoverMessage {
    RecoverMessage {
        disk_key: kms
            .data_key(&KeyId::disk(uuid).unwrap(), 32)
            .unwrap()
            .expose_secret()
            .to_vec(),
        cluster_measurement_secret: kms
            .data_key(&KeyId::MeasurementSecret, 32)
            .unwrap()
            .expose_secret()
            .to_vec(),
        disk_uuid: uuid.to_owned(),
        ..RecoverMessage::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rebooted_node_with_no_join_service_refuses_a_wrong_key_and_is_recovered_by_the_right_one()
 {
    let t = TestNode::new("127.0.13.1");
    let uuid = rebooted_node(&t);
    let run = wait_for_keys(&t, "127.0.13.2".parse().unwrap());

    let mut client = ApiClient::new(recover_channel(&t).await);
    let described = client.describe(DescribeRequest {}).await.unwrap();
    assert_eq!(described.into_inner().disk_uuid, uuid);

    // Keys of another master secret: the disk key opens nothing; refused, nothing changed.
    let other = ClusterKms::new(
        MasterSecret::new(vec![0x77; 32]).unwrap(),
        Salt::new(vec![0x66; 32]).unwrap(),
    );
    let refused = client.recover(keys_for(&other, &uuid)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("does not open"), "{refused:?}");
    // The original's form (the master secret itself) is refused by default.
    let original = RecoverMessage {
        kms_uri: asterism_kms::KmsUri::cluster(
            MasterSecret::new(vec![0x55; 32]).unwrap(),
            Salt::new(vec![0x66; 32]).unwrap(),
        )
        .to_uri_string()
        .to_string(),
        storage_uri: "storage://no-store".into(),
        ..RecoverMessage::default()
    };
    let refused = client.recover(original).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("master secret"), "{refused:?}");
    assert_eq!(t.pcr15(), [0; 32]);
    assert!(!run.is_finished(), "the node keeps waiting after a refusal");

    // The right keys: the node unlocks its disk and marks PCR 15.
    let started = Instant::now();
    client.recover(keys_for(&kms(), &uuid)).await.unwrap();
    eprintln!("recover: call to recovered in {:?}", started.elapsed());
    assert_recovered(&t, run).await;
    // The disk still opens with the key the owner derived: nothing re-keyed it.
    let key = kms().data_key(&KeyId::disk(&uuid).unwrap(), 32).unwrap();
    assert!(opens(&t.image(), key.expose_secret()));
}

/// `asterism recover`'s target for `t`, trusting its AK and its PCRs as they are now, and
/// expecting PCR 15 as a `verify` of the running cluster would (its marker): the recovery
/// overrides that with zero.
fn cli_target(t: &TestNode) -> asterism::recover::Target {
    let uuid = StateDisk::open(t.image(), t.disk_config())
        .unwrap()
        .uuid()
        .unwrap();
    cli_target_recording(t, &ak_identity(t), uuid.as_str())
}

/// The attestation key identity of `t`'s TPM, as validators report it.
fn ak_identity(t: &TestNode) -> String {
    asterism_attestation::AkFingerprint::of_public_area(&t.ak_public).to_string()
}

/// [`cli_target`] with a workspace that records `ak` with disk `disk` as its only
/// control-plane node.
fn cli_target_recording(t: &TestNode, ak: &str, disk: &str) -> asterism::recover::Target {
    let marker = asterism_tpm::marker::expected_marker_pcr(cluster_id().as_bytes());
    let loaded = t.measurements_with(|i| i != 15);
    let pcr15 = asterism_attestation::PcrIndex::new(15).unwrap();
    let as_verify_expects = asterism_attestation::Measurements::new(
        loaded
            .iter()
            .map(|(i, e)| (i, *e))
            .chain([(pcr15, asterism_attestation::ExpectedPcr::enforce(marker))]),
    )
    .unwrap();
    let measurements = asterism::recover::recovery_measurements(&as_verify_expects).unwrap();
    asterism::recover::Target {
        endpoint: SocketAddr::new(t.ip, t.recover_port()).to_string(),
        validator: Arc::new(asterism_attestation::TpmQuoteValidator::new(
            asterism_testkit::pin(&t.ak_public),
            measurements.into_provider(),
        )),
        insecure_send_master_secret: false,
        control_plane: asterism::recover::ControlPlaneAks::Recorded(
            asterism::control_plane::Record::new(
                kms().control_plane_seed().unwrap().public_key().unwrap(),
                asterism::control_plane::Member {
                    name: "cp-0".into(),
                    ak: ak.into(),
                    disk: disk.into(),
                },
            ),
        ),
        deadline: Duration::from_secs(90),
        retry_interval: Duration::from_millis(100),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn asterism_recover_brings_a_waiting_node_back_then_finds_none_left() {
    let t = TestNode::new("127.0.13.3");
    let uuid = rebooted_node(&t);
    let run = wait_for_keys(&t, "127.0.13.4".parse().unwrap());
    let target = cli_target(&t);

    let started = Instant::now();
    let recovered = asterism::recover::recover(&target, &kms()).await.unwrap();
    eprintln!("asterism recover: start to done in {:?}", started.elapsed());
    assert_eq!(recovered.len(), 1, "{recovered:?}");
    assert_eq!(recovered[0].disk_uuid.as_deref(), Some(uuid.as_str()));
    assert_recovered(&t, run).await;

    // Run again: nothing waits any more; it says so and succeeds.
    let again = asterism::recover::recover(&target, &kms()).await.unwrap();
    assert!(again.is_empty(), "{again:?}");
}

/// Issue 22, attack 2: while the control plane is down, a rebooted worker (genuine TPM and
/// measurements, PCR 15 zero) answers at the recovery endpoint. The workspace records the
/// control plane's AK and disk; the worker's AK is not among them, so `asterism recover`
/// sends it nothing, whatever disk it names. And a recorded AK that names another disk
/// than the one recorded for it gets nothing either (never a second UUID for one AK).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn asterism_recover_sends_nothing_to_an_attestation_key_or_disk_the_workspace_does_not_record()
 {
    let t = TestNode::new("127.0.13.7");
    let uuid = rebooted_node(&t);
    let run = wait_for_keys(&t, "127.0.13.8".parse().unwrap());

    // The workspace knows another TPM as the control plane (its disk is this one's UUID,
    // as a worker could name it: UUIDs are not secret).
    let control_plane_ak = "ab".repeat(32);
    let target = cli_target_recording(&t, &control_plane_ak, &uuid);
    let refused = asterism::recover::recover(&target, &kms())
        .await
        .unwrap_err();
    let why = format!("{refused:#}");
    assert!(
        why.contains("no control-plane node of this workspace"),
        "{why}"
    );
    assert_eq!(t.pcr15(), [0; 32], "the node got no keys and waits");

    // Its own AK recorded, but with another disk: the node names its disk, which is not
    // the recorded one, so no key of either disk is sent.
    let target = cli_target_recording(&t, &ak_identity(&t), "0b7e5f1e-0000-4000-8000-000000000001");
    let refused = asterism::recover::recover(&target, &kms())
        .await
        .unwrap_err();
    let why = format!("{refused:#}");
    assert!(why.contains("records disk"), "{why}");
    assert_eq!(t.pcr15(), [0; 32], "the node got no keys and waits");

    // The workspace that records it recovers it.
    let recovered = asterism::recover::recover(&cli_target(&t), &kms())
        .await
        .unwrap();
    assert_eq!(recovered.len(), 1, "{recovered:?}");
    assert_recovered(&t, run).await;
}

/// A recovery server that records whether it was called at all.
struct RecordingServer(Arc<AtomicUsize>);

#[tonic::async_trait]
impl RecoverApi for RecordingServer {
    async fn describe(
        &self,
        _: tonic::Request<DescribeRequest>,
    ) -> Result<tonic::Response<asterism_proto::recover::DescribeResponse>, tonic::Status> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Err(tonic::Status::unimplemented("recording"))
    }

    async fn recover(
        &self,
        _: tonic::Request<RecoverMessage>,
    ) -> Result<tonic::Response<asterism_proto::recover::RecoverResponse>, tonic::Status> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Err(tonic::Status::unimplemented("recording"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_whose_pcr15_is_already_marked_gets_nothing() {
    let t = TestNode::new("127.0.13.5");
    let listener = tokio::net::TcpListener::bind(SocketAddr::new(t.ip, 0))
        .await
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    // The target is made while PCR 15 is still zero; then the node is marked (a node that
    // is back already, or one marked by something else).
    let mut target =
        cli_target_recording(&t, &ak_identity(&t), "0b7e5f1e-0000-4000-8000-000000000002");
    target.endpoint = SocketAddr::new(t.ip, port).to_string();
    t.mark(&cluster_id());
    let calls = Arc::new(AtomicUsize::new(0));
    let server = AtlsServer::new(AtlsConfig::attesting(Arc::new(
        t.swtpm.held_issuer().unwrap(),
    )))
    .unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RecoverApiServer::new(RecordingServer(calls.clone())))
            .serve_with_incoming(server.incoming(listener)),
    );

    let refused = asterism::recover::recover(&target, &kms())
        .await
        .unwrap_err();
    assert!(
        format!("{refused:#}").contains("not one to recover"),
        "{refused:#}"
    );
    assert!(format!("{refused:#}").contains("PCR 15"), "{refused:#}");
    assert_eq!(calls.load(Ordering::SeqCst), 0, "nothing reached the node");
}

/// The master secret and salt of [`kms`] split 2-of-3 to three age custodians, as
/// `asterism init --recovery-shares 2-of-3 --no-master-secret-file` splits them: the
/// workspace's `recovery.json`, and shares 1 and 3 as `asterism recovery-share decrypt`
/// wrote them. Made once; the custodians' keys were thrown away.
const RECOVERY_JSON: &str = r#"{
  "version": 1,
  "kind": "asterism-recovery",
  "shareSet": "93b3a3942b1a1f250e5e724d15a245ebe953d676eea4a5164b9e8ba97b367599",
  "threshold": 2,
  "shares": 3,
  "secretLength": 32,
  "secretCommitment": "69350d4759abcf1bc83b8e3dcc494389be77bd84316075d3e931601078c00dc7",
  "salt": "ZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmZmY=",
  "custodians": [
    {
      "index": 1,
      "recipient": "age1pll9l4ean5lvpye3g7ztuegwne9ys9nc73f7krsr5l6jayg9zejsr6wqyr",
      "shareDigest": "ff0d97ef36429c87830b9902eacf2e4a6811128bcfb3ee95fc7767126e01cf0d"
    },
    {
      "index": 2,
      "recipient": "age12qk9svcw3tvymvql0jdcuudgzthy7prp4eqpl5ekxe6ftjkse33qnmynkl",
      "shareDigest": "9799ba0cab0b17ab586637d0b804672a600d9735ff9ce750f3b99ded6145716d"
    },
    {
      "index": 3,
      "recipient": "age1ylgthg5wvzsncq24lf22sc0z4hwa8msrwdfuq6lhrpask9k06psq50y45a",
      "shareDigest": "6a6034c465274304eba637083b8199227efc139d61afa22d975d48678200a600"
    }
  ]
}"#;
const SHARE_1_OF_3: &str = r#"{
  "version": 1,
  "kind": "asterism-recovery-share",
  "shareSet": "93b3a3942b1a1f250e5e724d15a245ebe953d676eea4a5164b9e8ba97b367599",
  "index": 1,
  "threshold": 2,
  "shares": 3,
  "value": "M+QoxNsD6CrCeu6gMPJsKNEKLcseMAQ+3JVawP/UP5s="
}"#;
const SHARE_3_OF_3: &str = r#"{
  "version": 1,
  "kind": "asterism-recovery-share",
  "shareSet": "93b3a3942b1a1f250e5e724d15a245ebe953d676eea4a5164b9e8ba97b367599",
  "index": 3,
  "threshold": 2,
  "shares": 3,
  "value": "/53S/dyvidT3JINR+qce0sK03eyI+qbo1Q5E8bDN6xw="
}"#;

/// A workspace that keeps only custodians' shares, and two of the three, decrypted (0600).
fn shares_workspace(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::write(
        dir.join("cluster.json"),
        format!(
            "{{\"clusterID\": \"{}\", \"measurementSalt\": \"{}\", \"initEndpoint\": \"127.0.0.1:9000\"}}",
            cluster_id(),
            hex::encode(MEASUREMENT_SALT)
        ),
    )
    .unwrap();
    std::fs::write(dir.join("recovery.json"), RECOVERY_JSON).unwrap();
    [
        ("share-1-of-3", SHARE_1_OF_3),
        ("share-3-of-3", SHARE_3_OF_3),
    ]
    .into_iter()
    .map(|(name, json)| {
        let path = dir.join(format!("{name}.decrypted.json"));
        std::fs::write(&path, json).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        path
    })
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn asterism_recover_with_two_of_three_shares_brings_a_waiting_node_back() {
    let t = TestNode::new("127.0.13.6");
    let uuid = rebooted_node(&t);
    let run = wait_for_keys(&t, "127.0.13.7".parse().unwrap());

    // As `asterism recover --workspace DIR --share A --share B` gets its keys: no
    // master-secret file anywhere.
    let workspace = tempfile::tempdir().unwrap();
    let shares = shares_workspace(workspace.path());
    assert!(!workspace.path().join("master-secret.json").exists());
    let from_shares = asterism::recover::read_shares(workspace.path(), &shares).unwrap();
    asterism::recover::check_cluster(workspace.path(), &from_shares).unwrap();

    let recovered = asterism::recover::recover(&cli_target(&t), &from_shares)
        .await
        .unwrap();
    assert_eq!(recovered.len(), 1, "{recovered:?}");
    assert_eq!(recovered[0].disk_uuid.as_deref(), Some(uuid.as_str()));
    assert_recovered(&t, run).await;
    // The disk opens with the key the original master secret derives.
    let key = kms().data_key(&KeyId::disk(&uuid).unwrap(), 32).unwrap();
    assert!(opens(&t.image(), key.expose_secret()));
}

/// A recovery server that takes the keys, marks PCR 15 as a recovered node does, and goes
/// on answering for a while (the moment between a node's recovery and its server closing).
struct MarkingServer {
    calls: Arc<AtomicUsize>,
    tpm: asterism_tpm::TpmConfig,
    disk: String,
}

#[tonic::async_trait]
impl RecoverApi for MarkingServer {
    async fn describe(
        &self,
        _: tonic::Request<DescribeRequest>,
    ) -> Result<tonic::Response<asterism_proto::recover::DescribeResponse>, tonic::Status> {
        Ok(tonic::Response::new(
            asterism_proto::recover::DescribeResponse {
                disk_uuid: self.disk.clone(),
            },
        ))
    }

    async fn recover(
        &self,
        _: tonic::Request<RecoverMessage>,
    ) -> Result<tonic::Response<asterism_proto::recover::RecoverResponse>, tonic::Status> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let mut tpm = asterism_tpm::Tpm::open(&self.tpm).unwrap();
        asterism_tpm::marker::mark_node_bootstrapped(&mut tpm, cluster_id().as_bytes()).unwrap();
        Ok(tonic::Response::new(
            asterism_proto::recover::RecoverResponse::default(),
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_still_answering_after_its_recovery_ends_the_recovery_without_an_error() {
    let t = TestNode::new("127.0.13.6");
    let listener = tokio::net::TcpListener::bind(SocketAddr::new(t.ip, 0))
        .await
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let disk = "0b7e5f1e-0000-4000-8000-000000000003";
    let mut target = cli_target_recording(&t, &ak_identity(&t), disk);
    target.endpoint = SocketAddr::new(t.ip, port).to_string();
    let calls = Arc::new(AtomicUsize::new(0));
    let server = AtlsServer::new(AtlsConfig::attesting(Arc::new(
        t.swtpm.held_issuer().unwrap(),
    )))
    .unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RecoverApiServer::new(MarkingServer {
                calls: calls.clone(),
                tpm: t.swtpm.config(),
                disk: disk.into(),
            }))
            .serve_with_incoming(server.incoming(listener)),
    );

    // The second retrier meets the same node, marked now: that ends the recovery.
    let recovered = asterism::recover::recover(&target, &kms()).await.unwrap();
    assert_eq!(recovered.len(), 1, "{recovered:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the keys went once");
}

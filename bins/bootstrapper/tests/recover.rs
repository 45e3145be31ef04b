//! Recovery of a rebooted node with no join service left: a real swtpm, a real LUKS2 image
//! keyed with the cluster-derived key, the node's recovery server over real aTLS (the node
//! attests; the test verifies its quote), and the keys derived from a master secret.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use asterism_atls::{AtlsConfig, AtlsConnector};
use asterism_bootstrapper::{NodeState, Outcome, Role};
use asterism_disk::StateDisk;
use asterism_kms::{ClusterKms, DataKey, KeyId, MasterSecret, Salt, derive_cluster_id};
use asterism_metadata::{Role as MetaRole, StaticMetadata};
use asterism_proto::recover::api_client::ApiClient;
use asterism_proto::recover::{DescribeRequest, RecoverMessage};
use common::*;
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

/// An aTLS channel to the node's recovery server that verifies the node (PCR 15 zero).
async fn recover_channel(t: &TestNode) -> Channel {
    let connector = AtlsConnector::new(AtlsConfig::verifying(t.validator())).unwrap();
    let addr = SocketAddr::new(t.ip, t.recover_port());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_with_connector(connector.clone())
            .await
        {
            Ok(channel) => return channel,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("cannot reach the recovery server: {e:?}"),
        }
    }
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
    // The metadata names a control-plane endpoint where no join service answers: the
    // rejoin client keeps trying while the recovery server waits.
    let gone = "127.0.13.2".parse().unwrap();
    let metadata = StaticMetadata::new(vec![
        instance("cp-0", MetaRole::ControlPlane, t.ip),
        instance("cp-1", MetaRole::ControlPlane, gone),
    ])
    .with_self("cp-0")
    .with_init_secret_hash(init_secret_hash());
    let node = t.node(
        metadata,
        TestNode::none_driver(),
        30090,
        Some(t.join_service_trust(cluster_id())),
    );
    let run = tokio::spawn(t.run(node, std::future::pending()));

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
    // The disk still opens with the key the owner derived: nothing re-keyed it.
    let key = kms().data_key(&KeyId::disk(&uuid).unwrap(), 32).unwrap();
    assert!(opens(&t.image(), key.expose_secret()));
}

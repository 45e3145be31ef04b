//! Helpers shared by the InitServer tests.

use super::*;
use asterism_bootstrapper::{ClusterInit, ClusterJoin, DriverError, KubernetesDriver};
use asterism_kms::{ClusterKms, KeyId, KmsUri, MasterSecret, Salt, derive_cluster_id};
use asterism_metadata::{Role as MetaRole, StaticMetadata};
use asterism_proto::init::api_client::ApiClient;
use asterism_proto::init::{InitRequest, InitResponse, init_response};
use futures::future::BoxFuture;
use tonic::transport::Channel;
use zeroize::Zeroizing;

pub const MASTER: [u8; 32] = [0x11; 32];
pub const SALT: [u8; 32] = [0x22; 32];
pub const MEASUREMENT_SALT: [u8; 32] = [0x33; 32];

pub fn kms() -> ClusterKms {
    ClusterKms::new(
        MasterSecret::new(MASTER.to_vec()).unwrap(),
        Salt::new(SALT.to_vec()).unwrap(),
    )
}

pub fn request(secret: &[u8]) -> InitRequest {
    let uri = KmsUri::cluster(
        MasterSecret::new(MASTER.to_vec()).unwrap(),
        Salt::new(SALT.to_vec()).unwrap(),
    );
    InitRequest {
        kms_uri: uri.to_uri_string().to_string(),
        storage_uri: "storage://no-store".into(),
        measurement_salt: MEASUREMENT_SALT.to_vec(),
        kubernetes_version: "v1.31.0".into(),
        init_secret: secret.to_vec(),
        cluster_name: "test".into(),
        ..InitRequest::default()
    }
}

/// Asserts that the Init stream reported success first.
pub fn assert_succeeded(responses: &[InitResponse]) {
    assert!(
        matches!(
            responses.first().and_then(|r| r.kind.as_ref()),
            Some(asterism_proto::init::init_response::Kind::InitSuccess(_))
        ),
        "{responses:?}"
    );
}

/// Sends Init and collects the whole stream.
pub async fn init(channel: Channel, req: InitRequest) -> Result<Vec<InitResponse>, tonic::Status> {
    let mut stream = ApiClient::new(channel).init(req).await?.into_inner();
    let mut out = Vec::new();
    while let Some(m) = stream.message().await? {
        out.push(m);
    }
    Ok(out)
}

pub fn metadata(node: &TestNode) -> StaticMetadata {
    StaticMetadata::new(vec![instance("cp-0", MetaRole::ControlPlane, node.ip)])
        .with_self("cp-0")
        .with_init_secret_hash(init_secret_hash())
}

pub fn expected_cluster_id() -> [u8; 32] {
    let secret = kms().data_key(&KeyId::MeasurementSecret, 32).unwrap();
    *derive_cluster_id(&secret, &MEASUREMENT_SALT)
        .unwrap()
        .as_bytes()
}

pub fn logs_of(responses: &[InitResponse]) -> Vec<Vec<u8>> {
    responses
        .iter()
        .filter_map(|r| match &r.kind {
            Some(init_response::Kind::Log(l)) => Some(l.log.clone()),
            _ => None,
        })
        .collect()
}

pub fn failure_of(responses: &[InitResponse]) -> Option<String> {
    responses.iter().find_map(|r| match &r.kind {
        Some(init_response::Kind::InitFailure(f)) => Some(f.error.clone()),
        _ => None,
    })
}

/// A driver that waits until released, then fails or succeeds.
pub struct GateDriver {
    /// Released to let the driver finish.
    pub gate: tokio::sync::Semaphore,
    /// Whether it fails.
    pub fail: bool,
}

impl KubernetesDriver for GateDriver {
    fn name(&self) -> &'static str {
        "gate"
    }

    fn init<'a>(
        &'a self,
        _params: &'a ClusterInit,
    ) -> BoxFuture<'a, Result<Zeroizing<Vec<u8>>, DriverError>> {
        Box::pin(async move {
            let _permit = self.gate.acquire().await;
            if self.fail {
                Err(DriverError::new(
                    "kubeadm init",
                    std::io::Error::other("kubeadm init failed (test driver)"),
                ))
            } else {
                Ok(Zeroizing::new(b"apiVersion: v1\nkind: Config\n".to_vec()))
            }
        })
    }

    fn join(&self, _params: ClusterJoin) -> BoxFuture<'_, Result<(), DriverError>> {
        Box::pin(async { Ok(()) })
    }
}

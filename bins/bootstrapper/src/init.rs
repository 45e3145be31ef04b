//! The InitServer (`init.API/Init`, docs/bootstrapper.md): the owner initialises the first
//! control-plane node over aTLS, with the node attesting.
//!
//! The path of a request: the init secret, then the request checked into an
//! [`Activation`] (still before the node lock: a mistake leaves the server up for a
//! corrected Init), then the node lock, then [`Activation::activate`].
//!
//! * A failure after the node lock marks the disk for reset and ends the process non-zero
//!   (a half-initialised node would otherwise stay behind);
//! * failure logs are this process's own bounded log buffer, sent only to a caller that
//!   presented the right init secret;
//! * the work after the lock runs to its end even if the caller goes away;
//! * a second Init after the lock gets `FailedPrecondition` as the call's status.

use std::pin::Pin;
use std::sync::Arc;

use asterism_binkit::error_chain;
use asterism_cluster::{InitNode, MEASUREMENT_SALT_LEN, Role};
use asterism_kms::{KeyId, KmsUri, STATE_DISK_KEY_LEN, StorageUri, derive_cluster_id};
use asterism_kubernetes_versions::KubernetesVersion;
use asterism_metadata::Metadata;
use asterism_proto::init::api_server::Api;
use asterism_proto::init::{
    InitFailureResponse, InitRequest, InitResponse, InitSuccessResponse, LogResponseType,
    init_response,
};
use futures::{Stream, StreamExt as _};
use tokio::sync::{mpsc, oneshot, watch};
use tonic::{Request, Response, Status};
use tracing::{info, warn};
use zeroize::Zeroizing;

use crate::activation::{Activated, Activation, InitActivation};
use crate::config::LOG_CHUNK_SIZE;
use crate::effects::{ClusterInit, Components};
use crate::error::blocking;
use crate::flow::{Event, pause};
use crate::hosted;
use crate::identity::ThisNode;
use crate::lock::Holder;
use crate::logbuf;
use crate::node::Node;
use crate::pki;

/// The cluster name when the request leaves it empty. Clusters made so far carry it, so it
/// must not change.
pub const DEFAULT_CLUSTER_NAME: &str = "constellation";
/// The longest init secret considered (bcrypt uses only the first 72 bytes anyway).
const MAX_INIT_SECRET: usize = 1024;
/// The message a caller with a wrong init secret gets: nothing more.
const WRONG_SECRET: &str = "invalid init secret";

/// The `init.API` service.
pub(crate) struct InitService<M> {
    node: Arc<Node<M>>,
    secret_hash: String,
    this: ThisNode,
    events: mpsc::UnboundedSender<Event>,
    /// Bounds the bcrypt checks unauthenticated callers can cause per address (module
    /// `limits`).
    attempts: Arc<crate::limits::PeerLimiter>,
    /// Bounds the bcrypt checks in all: further calls wait their turn.
    checks: Arc<asterism_binkit::FairQueue>,
}

impl<M: Metadata + 'static> InitService<M> {
    pub(crate) fn new(
        node: Arc<Node<M>>,
        secret_hash: String,
        this: ThisNode,
        events: mpsc::UnboundedSender<Event>,
    ) -> Self {
        let attempts = crate::limits::PeerLimiter::for_calls(node.config.init_limits);
        let checks = crate::limits::check_queue(node.config.init_limits.max_in_flight);
        Self {
            node,
            secret_hash,
            this,
            events,
            attempts,
            checks,
        }
    }
}

type InitStream = Pin<Box<dyn Stream<Item = Result<InitResponse, Status>> + Send>>;

fn failure(error: String) -> InitResponse {
    InitResponse {
        kind: Some(init_response::Kind::InitFailure(InitFailureResponse {
            error,
        })),
    }
}

fn stream_of(messages: Vec<InitResponse>) -> InitStream {
    Box::pin(futures::stream::iter(messages.into_iter().map(Ok)))
}

/// The failure message followed by the log buffer in chunks: only for authenticated
/// callers.
fn failure_with_logs(error: String, logs: &logbuf::LogBuffer) -> Vec<InitResponse> {
    let snapshot = logs.snapshot();
    let mut out = vec![failure(error)];
    out.extend(
        logbuf::chunks(&snapshot, LOG_CHUNK_SIZE).map(|log| InitResponse {
            kind: Some(init_response::Kind::Log(LogResponseType { log })),
        }),
    );
    out
}

impl<M: Metadata + 'static> InitService<M> {
    /// Checks the request after the init secret: the Kubernetes components, KMS URI
    /// (cluster KMS only), storage URI, measurement salt; derives the cluster ID, the disk
    /// key and the emergency SSH CA's files. Errors are for the (authenticated) caller.
    fn check(&self, req: &mut InitRequest) -> Result<Activation, String> {
        // The components first: a bad hash, URL or path refuses the request here, before
        // the lock, rather than fail the driver after it.
        let components = Components::try_from(std::mem::take(&mut req.kubernetes_components))
            .map_err(|e| format!("Kubernetes components: {}", error_chain(&e)))?;
        // Parsed here, as in a join ticket: the node records it, the join service hands it
        // to every joining node, and kubeadm needs a patch version.
        let kubernetes_version = req
            .kubernetes_version
            .parse::<KubernetesVersion>()
            .map_err(|e| format!("Kubernetes version: {}", error_chain(&e)))?;
        let kms_uri = Zeroizing::new(std::mem::take(&mut req.kms_uri));
        let kms = KmsUri::parse(&kms_uri).map_err(|e| format!("KMS URI: {e}"))?;
        let storage = if req.storage_uri.is_empty() {
            StorageUri::NoStore
        } else {
            StorageUri::parse(&req.storage_uri).map_err(|e| format!("storage URI: {e}"))?
        };
        let kms = kms
            .into_kms(&storage)
            .map_err(|e| format!("KMS setup: {e}"))?;
        let measurement_salt = <[u8; MEASUREMENT_SALT_LEN]>::try_from(
            req.measurement_salt.as_slice(),
        )
        .map_err(|_| {
            format!(
                "the measurement salt has {} bytes, {MEASUREMENT_SALT_LEN} are required",
                req.measurement_salt.len()
            )
        })?;
        let measurement_secret = kms
            .data_key(&KeyId::MeasurementSecret, 32)
            .map_err(|e| format!("deriving the measurement secret: {e}"))?;
        let cluster_id = derive_cluster_id(&measurement_secret, &measurement_salt)
            .map_err(|e| format!("deriving the cluster ID: {e}"))?;
        let hosted_services = hosted::files(
            self.node.config.host_cluster_services,
            req.hosted_services.take(),
            &kms,
            &measurement_salt,
            self.node.dir(),
        )?;
        // The disk passphrase: key-<lowercase uuid>.
        let disk_key = kms
            .data_key(
                &KeyId::Disk(self.this.disk_uuid.clone()),
                STATE_DISK_KEY_LEN,
            )
            .map_err(|e| format!("deriving the state disk key: {e}"))?;
        // The emergency SSH CA and this node's host certificate.
        let seed = kms
            .data_key(&KeyId::EmergencySshCa, 32)
            .map_err(|e| format!("deriving the emergency SSH CA: {e}"))?;
        let identity = &self.this.identity;
        let mut principals = pki::host_principals(self.node.config.node_ip, &identity.name);
        principals.extend(req.apiserver_cert_sans.iter().cloned());
        let ssh = pki::ssh_files_from_ca_seed(&seed, &self.this.host_key, &principals)
            .map_err(|e| format!("the emergency SSH CA: {}", error_chain(&e)))?;
        drop(seed);
        let cluster_name = if req.cluster_name.is_empty() {
            DEFAULT_CLUSTER_NAME.to_owned()
        } else {
            req.cluster_name.clone()
        };
        let init = InitActivation {
            cluster_id,
            measurement_salt,
            disk_key,
            ssh,
            init_node_record: self.init_node_record(kubernetes_version, &components)?,
            hosted_services,
            params: ClusterInit {
                cluster_name,
                kubernetes_version,
                apiserver_cert_sans: req.apiserver_cert_sans.clone(),
                service_cidr: req.service_cidr.clone(),
                conformance_mode: req.conformance_mode,
                node_ip: self.node.config.node_ip,
                node_name: identity.name.clone(),
                pki_dir: self.node.dir().kubernetes_pki(),
                components,
            },
        };
        Ok(Activation::from_init(
            init,
            identity.clone(),
            self.node.dir(),
        ))
    }

    /// This node's disk UUID and attestation key identity, for the join service, which
    /// binds the disk to the key at its start: the first node derives its disk key itself,
    /// so no join ticket binds it, and an unbound disk would be refused on rejoin. With them
    /// the cluster's Kubernetes version and components, which the join service puts into
    /// every join ticket (the embedded cluster state's record of them).
    fn init_node_record(
        &self,
        kubernetes_version: KubernetesVersion,
        components: &Components,
    ) -> Result<Option<String>, String> {
        let Some(ak) = &self.node.config.ak_identity else {
            warn!(
                step = "disk",
                "no attestation key identity: the join service cannot bind this node's disk, and its rejoin will be refused"
            );
            return Ok(None);
        };
        let record = InitNode {
            disk: self.this.disk_uuid.as_str().to_owned(),
            ak: ak.clone(),
            name: self.this.identity.name.clone(),
            role: Role::ControlPlane,
            kubernetes_version: Some(kubernetes_version),
            kubernetes_components: components.as_slice().to_vec(),
        };
        record.to_json().map(Some).map_err(|e| error_chain(&e))
    }
}

#[tonic::async_trait]
impl<M: Metadata + 'static> Api for InitService<M> {
    type InitStream = InitStream;

    async fn init(
        &self,
        request: Request<InitRequest>,
    ) -> Result<Response<Self::InitStream>, Status> {
        let peer = request
            .extensions()
            .get::<asterism_atls::AtlsConnectInfo>()
            .and_then(|i| i.remote_addr);
        let mut req = request.into_inner();
        info!(step = "init", peer = ?peer, "received an Init request");
        let ip = peer.map_or(std::net::Ipv4Addr::UNSPECIFIED.into(), |a| a.ip());
        let attempt = self.attempts.try_acquire(ip).map_err(|refused| {
            warn!(step = "init", peer = ?peer, reason = %refused, "refused an Init call before the secret check");
            Status::resource_exhausted(refused.to_string())
        })?;
        // Waits for its turn among the checks of all addresses (the owner's first call goes
        // ahead of a flood's); refused only when the queue is full or the wait too long.
        let turn = self.checks.turn(ip).await.map_err(|refused| {
            warn!(step = "init", peer = ?peer, reason = %refused, "refused an Init call: no turn for the secret check");
            Status::resource_exhausted(refused.to_string())
        })?;

        // 1. The init secret, against the bcrypt hash from the metadata. Constant time is
        //    inside bcrypt's verify. A wrong secret gets a generic failure and no logs.
        let secret = Zeroizing::new(std::mem::take(&mut req.init_secret));
        let hash = self.secret_hash.clone();
        let verified = if secret.is_empty() || secret.len() > MAX_INIT_SECRET {
            false
        } else {
            tokio::task::spawn_blocking(move || bcrypt::verify(&*secret, &hash).unwrap_or(false))
                .await
                .unwrap_or(false)
        };
        drop(turn);
        drop(attempt);
        if !verified {
            warn!(step = "init", peer = ?peer, "refused an Init: wrong init secret (no logs sent)");
            return Ok(Response::new(stream_of(vec![failure(WRONG_SECRET.into())])));
        }
        info!(step = "init", "init secret verified");

        // 2. The request, checked into an activation. Still before the lock: a mistake
        //    here leaves the server up for a corrected Init.
        let activation = match self.check(&mut req) {
            Ok(c) => c,
            Err(message) => {
                warn!(step = "init", error = %message, "refused an Init request");
                return Ok(Response::new(stream_of(failure_with_logs(
                    format!("invalid init request: {message}"),
                    &self.node.logs,
                ))));
            }
        };
        info!(step = "init", cluster_id = %activation.cluster_id(), "derived the cluster ID");

        // 3. The node lock.
        if self.node.lock.is_taken() {
            return Err(Status::failed_precondition(
                "node is already being activated",
            ));
        }
        let node = self.node.clone();
        let cluster_id = *activation.cluster_id();
        let disk_uuid = self.this.disk_uuid.as_str().to_owned();
        let locked = blocking(move || node.lock.try_lock_once(Holder::Init, &cluster_id)).await;
        let (tx, rx) = oneshot::channel();
        match locked {
            Ok(false) => {
                return Err(Status::failed_precondition(
                    "node is already being activated",
                ));
            }
            Ok(true) => {
                // 4. Stop the JoinClient.
                let _ = self.events.send(Event::InitLocked);
                let node = self.node.clone();
                let events = self.events.clone();
                // The rest runs to its end even if the caller disconnects.
                tokio::spawn(async move {
                    // 5. Activate (on failure the disk is marked for reset).
                    let result = activation.activate(&node).await;
                    let (responses, outcome) = match result {
                        Ok(Activated {
                            cluster_id,
                            kubeconfig,
                        }) => (
                            vec![InitResponse {
                                kind: Some(init_response::Kind::InitSuccess(InitSuccessResponse {
                                    kubeconfig: kubeconfig.map(|k| k.to_vec()).unwrap_or_default(),
                                    owner_id: Vec::new(),
                                    cluster_id: cluster_id.as_bytes().to_vec(),
                                    disk_uuid,
                                })),
                            }],
                            Ok(cluster_id),
                        ),
                        Err(e) => {
                            let message = format!(
                                "initialization failed after the point of no return: {}; \
                                 the state disk is marked for reset, reboot the node",
                                error_chain(&e)
                            );
                            (failure_with_logs(message, &node.logs), Err(e))
                        }
                    };
                    let _ = tx.send(responses);
                    let _ = events.send(Event::InitDone(outcome));
                });
            }
            Err(e) => {
                // The lock is taken but PCR 15 could not be marked: past the point of no
                // return all the same.
                let _ = self.events.send(Event::InitLocked);
                self.node.reset_after_failure(&e).await;
                let message = format!(
                    "initialization failed after the point of no return: {}",
                    error_chain(&e)
                );
                let responses = failure_with_logs(message, &self.node.logs);
                let _ = self.events.send(Event::InitDone(Err(e)));
                return Ok(Response::new(stream_of(responses)));
            }
        }
        let stream = futures::stream::once(async move { rx.await.unwrap_or_default() })
            .flat_map(|responses| futures::stream::iter(responses.into_iter().map(Ok)));
        Ok(Response::new(Box::pin(stream)))
    }
}

/// Fetches the init-secret hash from the metadata, retrying until it is there or `stop`;
/// the InitServer cannot check a secret without it.
pub(crate) async fn fetch_secret_hash<M: Metadata>(
    metadata: &M,
    timeout: std::time::Duration,
    retry: std::time::Duration,
    stop: &mut watch::Receiver<bool>,
) -> Option<String> {
    loop {
        match tokio::time::timeout(timeout, metadata.init_secret_hash()).await {
            Ok(Ok(hash)) if !hash.trim().is_empty() => return Some(hash.trim().to_owned()),
            Ok(Ok(_)) => warn!("the metadata has no init-secret hash"),
            Ok(Err(e)) => warn!(error = %error_chain(&e), "cannot fetch the init-secret hash"),
            Err(_) => warn!("the metadata did not answer in time"),
        }
        if pause(stop, retry).await {
            return None;
        }
    }
}

//! The JoinClient and the rejoin client against a stub join service: a real aTLS server
//! (mutual: the stub attests with its own swtpm and verifies the node's quote) with the
//! tonic `join.API`, handing out tickets with keys derived from a master secret.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::common::*;
use asterism_atls::{AtlsConfig, AtlsConnectInfo, AtlsServer, verified_peer};
use asterism_bootstrapper::{ControlPlaneIdentity, KubernetesHandover, NodeState, Outcome, Role};
use asterism_kms::{
    ChannelBinding, ClusterKms, ControlPlaneSeed, ControlPlaneSigner, KeyId, MasterSecret, Purpose,
    Salt, derive_cluster_id,
};
use asterism_metadata::{Role as MetaRole, StaticMetadata};
use asterism_pki::{ClusterCa, KubeletCsr, SshCa, parse_wire_public_key};
use asterism_proto::join::api_server::{Api, ApiServer};
use asterism_proto::join::{
    IssueJoinTicketRequest, IssueJoinTicketResponse, IssueRejoinTicketRequest,
    IssueRejoinTicketResponse,
};
use prost::Message as _;
use tonic::{Request, Response, Status};

const MEASUREMENT_SALT: [u8; 32] = [0x44; 32];

fn kms() -> ClusterKms {
    ClusterKms::new(
        MasterSecret::new(vec![0x55; 32]).unwrap(),
        Salt::new(vec![0x66; 32]).unwrap(),
    )
}

/// What the stub saw.
#[derive(Default)]
pub(crate) struct Seen {
    pub(crate) join_peers: Vec<SocketAddr>,
    rejoin_uuids: Vec<String>,
}

/// Changes a ticket before the stub sends it (a join service that lies).
type Tamper = Arc<dyn Fn(&mut IssueJoinTicketResponse) + Send + Sync>;

/// How the stub signs its tickets.
#[derive(Clone, Copy, Debug)]
enum Signing {
    /// With the control plane's identity, over this connection: a genuine join service.
    ControlPlane,
    /// Not at all: a joined worker posing as the join service (it holds no key derived
    /// from the master secret).
    Unsigned,
    /// With a key of its own: a worker that made up a key.
    OwnKey,
    /// With the control plane's identity, over another connection's binding: a genuine
    /// signature replayed.
    OtherConnection,
}

struct StubJoinService {
    ca: ClusterCa,
    seen: Arc<Mutex<Seen>>,
    tamper: Option<Tamper>,
    signing: Signing,
}

/// The control plane's identity key of the stub's cluster.
pub(crate) fn control_plane_signer() -> ControlPlaneSigner {
    ControlPlaneSigner::new(&kms().control_plane_seed().unwrap()).unwrap()
}

/// What a fresh node of the stub's cluster is given: the control plane's public key.
fn control_plane() -> ControlPlaneIdentity {
    ControlPlaneIdentity::key(control_plane_signer().public_key())
}

impl StubJoinService {
    fn sign(&self, purpose: Purpose, binding: [u8; 32], signed: &[u8]) -> Vec<u8> {
        let own = || {
            ControlPlaneSigner::new(&ControlPlaneSeed::from_bytes(vec![0x99; 32]).unwrap()).unwrap()
        };
        match self.signing {
            Signing::ControlPlane => control_plane_signer()
                .sign(purpose, &ChannelBinding(binding), signed)
                .to_vec(),
            Signing::Unsigned => Vec::new(),
            Signing::OwnKey => own()
                .sign(purpose, &ChannelBinding(binding), signed)
                .to_vec(),
            Signing::OtherConnection => control_plane_signer()
                .sign(purpose, &ChannelBinding([0x42; 32]), signed)
                .to_vec(),
        }
    }
}

fn binding<T>(request: &Request<T>) -> [u8; 32] {
    request
        .extensions()
        .get::<AtlsConnectInfo>()
        .unwrap()
        .channel_binding
}

/// The cluster the stub's keys derive.
pub(crate) fn cluster_id() -> asterism_kms::ClusterId {
    let secret = kms().data_key(&KeyId::MeasurementSecret, 32).unwrap();
    derive_cluster_id(&secret, &MEASUREMENT_SALT).unwrap()
}

/// The release the stub's tickets name, as a join service takes it from the cluster state.
fn release() -> asterism_kubernetes_versions::Release {
    asterism_kubernetes_versions::VersionTable::builtin()
        .unwrap()
        .select("v1.31.13")
        .unwrap()
}

fn key(id: &KeyId) -> Vec<u8> {
    kms().data_key(id, 32).unwrap().expose_secret().to_vec()
}

#[tonic::async_trait]
impl Api for StubJoinService {
    async fn issue_join_ticket(
        &self,
        request: Request<IssueJoinTicketRequest>,
    ) -> Result<Response<IssueJoinTicketResponse>, Status> {
        let peer = verified_peer(&request)?.remote_addr().unwrap();
        self.seen.lock().unwrap().join_peers.push(peer);
        let binding = binding(&request);
        let req = request.into_inner();
        let csr = KubeletCsr::parse(&req.certificate_request)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let kubelet_cert = self.ca.sign_kubelet(&csr, SystemTime::now()).unwrap();
        let ssh_ca =
            SshCa::from_seed(&kms().data_key(&KeyId::EmergencySshCa, 32).unwrap()).unwrap();
        let host = parse_wire_public_key(&req.host_public_key).unwrap();
        let host_cert = ssh_ca
            .sign_host_certificate(&host, &req.host_certificate_principals, SystemTime::now())
            .unwrap()
            .to_authorized_keys_line()
            .unwrap();
        let mut ticket = IssueJoinTicketResponse {
            state_disk_key: key(&KeyId::disk(&req.disk_uuid).unwrap()),
            measurement_salt: MEASUREMENT_SALT.to_vec(),
            measurement_secret: key(&KeyId::MeasurementSecret),
            kubelet_cert: format!("{kubelet_cert}{}", self.ca.cert_pem()).into_bytes(),
            api_server_endpoint: "127.0.12.1:6443".into(),
            token: "abcdef.0123456789abcdef".into(),
            discovery_token_ca_cert_hash: self.ca.discovery_hash().unwrap(),
            authorized_ca_public_key: ssh_ca.authorized_keys_line().into_bytes(),
            host_certificate: host_cert.into_bytes(),
            kubernetes_version: release().version().to_string(),
            kubernetes_components: release()
                .components()
                .iter()
                .cloned()
                .map(Into::into)
                .collect(),
            ..IssueJoinTicketResponse::default()
        };
        if let Some(tamper) = &self.tamper {
            tamper(&mut ticket);
        }
        ticket.control_plane_signature =
            self.sign(Purpose::JoinTicket, binding, &ticket.encode_to_vec());
        Ok(Response::new(ticket))
    }

    async fn issue_rejoin_ticket(
        &self,
        request: Request<IssueRejoinTicketRequest>,
    ) -> Result<Response<IssueRejoinTicketResponse>, Status> {
        verified_peer(&request)?;
        let binding = binding(&request);
        let req = request.into_inner();
        self.seen
            .lock()
            .unwrap()
            .rejoin_uuids
            .push(req.disk_uuid.clone());
        let mut ticket = IssueRejoinTicketResponse {
            state_disk_key: key(&KeyId::disk(&req.disk_uuid).unwrap()),
            measurement_secret: key(&KeyId::MeasurementSecret),
            control_plane_signature: Vec::new(),
        };
        ticket.control_plane_signature =
            self.sign(Purpose::RejoinTicket, binding, &ticket.encode_to_vec());
        Ok(Response::new(ticket))
    }
}

/// Starts the stub on `ip` (mutual aTLS: attests with `cp`'s TPM, verifies `node`'s).
pub(crate) async fn start_stub(
    ip: IpAddr,
    cp: &TestNode,
    node: &TestNode,
    seen: Arc<Mutex<Seen>>,
) -> (u16, tokio::sync::oneshot::Sender<()>) {
    start_tampering_stub(ip, cp, node, seen, None).await
}

/// Like [`start_stub`], signing as `signing` says.
async fn start_signing_stub(
    ip: IpAddr,
    cp: &TestNode,
    node: &TestNode,
    seen: Arc<Mutex<Seen>>,
    signing: Signing,
) -> (u16, tokio::sync::oneshot::Sender<()>) {
    start_stub_with(ip, held_issuer(cp), node, seen, None, signing).await
}

/// One TPM connection of `cp` for its stubs. swtpm serves one connection at a time, and a
/// stopped stub's server lets go of its connection only some time after its stop signal:
/// a test that starts several stubs on one node gives them this one.
fn held_issuer(cp: &TestNode) -> Arc<asterism_tpm::TpmIssuer> {
    Arc::new(cp.swtpm.held_issuer().unwrap())
}

/// Like [`start_stub`], with every ticket changed by `tamper`.
async fn start_tampering_stub(
    ip: IpAddr,
    cp: &TestNode,
    node: &TestNode,
    seen: Arc<Mutex<Seen>>,
    tamper: Option<Tamper>,
) -> (u16, tokio::sync::oneshot::Sender<()>) {
    start_stub_with(
        ip,
        held_issuer(cp),
        node,
        seen,
        tamper,
        Signing::ControlPlane,
    )
    .await
}

async fn start_stub_with(
    ip: IpAddr,
    issuer: Arc<asterism_tpm::TpmIssuer>,
    node: &TestNode,
    seen: Arc<Mutex<Seen>>,
    tamper: Option<Tamper>,
    signing: Signing,
) -> (u16, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind(SocketAddr::new(ip, 0))
        .await
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let server =
        AtlsServer::new(AtlsConfig::attesting(issuer).with_validator(node.validator())).unwrap();
    let service = StubJoinService {
        ca: ClusterCa::generate(SystemTime::now()).unwrap(),
        seen,
        tamper,
        signing,
    };
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ApiServer::new(service))
            .serve_with_incoming_shutdown(server.incoming(listener), async {
                let _ = rx.await;
            }),
    );
    (port, tx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_joins_through_a_mutually_attested_join_service_and_rejoins_after_a_reboot() {
    let cp = TestNode::new("127.0.12.1");
    let mut t = TestNode::new("127.0.12.2");
    let seen = Arc::new(Mutex::new(Seen::default()));
    // The join service runs on an initialised control-plane node: PCR 15 is marked.
    cp.mark(&cluster_id());
    let (port, _stop) = start_stub(cp.ip, &cp, &t, seen.clone()).await;
    let metadata = StaticMetadata::new(vec![
        instance("cp-0", MetaRole::ControlPlane, cp.ip),
        instance("worker-0", MetaRole::Worker, t.ip),
    ])
    .with_self("worker-0")
    .with_init_secret_hash(init_secret_hash());

    // Join, verifying the join service's quote (mutual mode).
    let node = t.node(
        metadata.clone(),
        TestNode::none_driver(),
        port,
        Some(cp.join_service_trust(cluster_id(), control_plane())),
    );
    let started = Instant::now();
    let outcome = tokio::time::timeout(
        Duration::from_secs(120),
        t.run(node, std::future::pending()),
    )
    .await
    .unwrap()
    .unwrap();
    eprintln!(
        "join: bootstrapper start to joined in {:?}",
        started.elapsed()
    );
    let secret = kms().data_key(&KeyId::MeasurementSecret, 32).unwrap();
    let cluster_id = derive_cluster_id(&secret, &MEASUREMENT_SALT).unwrap();
    assert_eq!(outcome, Outcome::Joined(cluster_id));
    // The join service saw the node's own address.
    assert_eq!(seen.lock().unwrap().join_peers[0].ip(), t.ip);
    assert_eq!(
        t.pcr15(),
        asterism_tpm::marker::expected_marker_pcr(cluster_id.as_bytes())
    );
    let uuid = luks_uuid(&t.image());
    assert!(opens(&t.image(), &key(&KeyId::disk(&uuid).unwrap())));
    assert!(token0(&t.image()).contains("\"diskIsInitialized\":true"));
    assert_eq!(
        NodeState::read(&t.node_dir.node_state()).unwrap(),
        NodeState {
            role: Role::Worker,
            measurement_salt: MEASUREMENT_SALT
        }
    );
    let cert = std::fs::read_to_string(t.node_dir.kubelet_cert()).unwrap();
    assert!(cert.starts_with("-----BEGIN CERTIFICATE-----"));
    let key_pem = std::fs::read_to_string(t.node_dir.kubelet_key()).unwrap();
    assert!(key_pem.contains("PRIVATE KEY"));
    assert!(
        std::fs::read_to_string(t.node_dir.ssh_host_cert())
            .unwrap()
            .starts_with("ssh-ed25519-cert-v01@openssh.com ")
    );
    assert!(
        !t.node_dir.kubernetes_pki().join("ca.key").exists(),
        "a worker gets no CA key"
    );
    // What the ticket named reached the driver, and the node recorded it.
    let handover =
        KubernetesHandover::from_json(&std::fs::read(t.node_dir.kubernetes_handover()).unwrap())
            .unwrap();
    assert_eq!(
        handover,
        KubernetesHandover {
            driver: "none".into(),
            kubernetes_version: Some("v1.31.13".parse().unwrap()),
            kubernetes_components: release().components().to_vec(),
        }
    );

    // Reboot: the TPM resets (PCR 15 cleared, AK kept); the disk is initialized, so the
    // node asks for a rejoin ticket, unlocks its disk and marks PCR 15 again.
    t.swtpm.restart().unwrap();
    assert_eq!(t.pcr15(), [0; 32]);
    let node = t.node(
        metadata,
        TestNode::none_driver(),
        port,
        Some(cp.join_service_trust(cluster_id, control_plane())),
    );
    let started = Instant::now();
    let outcome = tokio::time::timeout(
        Duration::from_secs(120),
        t.run(node, std::future::pending()),
    )
    .await
    .unwrap()
    .unwrap();
    eprintln!(
        "rejoin: bootstrapper start to rejoined in {:?}",
        started.elapsed()
    );
    assert_eq!(outcome, Outcome::Rejoined(cluster_id));
    assert_eq!(seen.lock().unwrap().rejoin_uuids, [uuid]);
    assert_eq!(
        t.pcr15(),
        asterism_tpm::marker::expected_marker_pcr(cluster_id.as_bytes())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_join_service_whose_evidence_does_not_verify_gets_nothing() {
    let cp = TestNode::new("127.0.12.3");
    let t = TestNode::new("127.0.12.4");
    let seen = Arc::new(Mutex::new(Seen::default()));
    cp.mark(&cluster_id());
    let (port, _stop) = start_stub(cp.ip, &cp, &t, seen.clone()).await;
    let metadata = StaticMetadata::new(vec![
        instance("cp-0", MetaRole::ControlPlane, cp.ip),
        instance("worker-0", MetaRole::Worker, t.ip),
    ])
    .with_self("worker-0")
    .with_init_secret_hash(init_secret_hash());
    // The node expects another platform: it pins its own AK for the join service.
    let node = t.node(
        metadata,
        TestNode::none_driver(),
        port,
        Some(t.join_service_trust(cluster_id(), control_plane())),
    );
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(t.run(node, async {
        let _ = stop_rx.await;
    }));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let _ = stop_tx.send(());
    let outcome = run.await.unwrap().unwrap();
    assert_eq!(outcome, Outcome::Stopped);
    assert!(
        seen.lock().unwrap().join_peers.is_empty(),
        "no request reached the handler"
    );
    assert_eq!(t.pcr15(), [0; 32]);
    assert!(token0(&t.image()).contains("\"diskIsInitialized\":false"));
}

/// Runs a fresh worker against a join service on `cp` for a few seconds, then stops it:
/// the worker must have refused, so nothing happened to it.
async fn refused(cp: &TestNode, t: &TestNode, port: u16, expected: asterism_kms::ClusterId) {
    let metadata = StaticMetadata::new(vec![
        instance("cp-0", MetaRole::ControlPlane, cp.ip),
        instance("worker-0", MetaRole::Worker, t.ip),
    ])
    .with_self("worker-0")
    .with_init_secret_hash(init_secret_hash());
    let node = t.node(
        metadata,
        TestNode::none_driver(),
        port,
        Some(cp.join_service_trust(expected, control_plane())),
    );
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(t.run(node, async {
        let _ = stop_rx.await;
    }));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let _ = stop_tx.send(());
    let outcome = run.await.unwrap().unwrap();
    assert_eq!(outcome, Outcome::Stopped);
    assert_eq!(t.pcr15(), [0; 32], "the worker was not marked");
    assert!(token0(&t.image()).contains("\"diskIsInitialized\":false"));
    assert!(!t.node_dir.kubelet_cert().exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_join_service_marked_with_another_cluster_gets_no_request() {
    let cp = TestNode::new("127.0.12.5");
    let t = TestNode::new("127.0.12.6");
    let seen = Arc::new(Mutex::new(Seen::default()));
    // Same TPM, same PCRs 0–14, same AK: only the cluster marker differs.
    cp.mark(&asterism_kms::ClusterId::from([0xee; 32]));
    let (port, _stop) = start_stub(cp.ip, &cp, &t, seen.clone()).await;
    refused(&cp, &t, port, cluster_id()).await;
    assert!(
        seen.lock().unwrap().join_peers.is_empty(),
        "no request reached the handler"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_ticket_for_another_cluster_or_with_a_bad_kubelet_certificate_is_refused() {
    let cp = TestNode::new("127.0.12.7");
    cp.mark(&cluster_id());
    let tampers: Vec<(&str, Tamper)> = vec![
        (
            "another cluster",
            Arc::new(|t: &mut IssueJoinTicketResponse| t.measurement_secret = vec![0x77; 32]),
        ),
        (
            "a kubelet certificate that is no certificate",
            Arc::new(|t: &mut IssueJoinTicketResponse| {
                t.kubelet_cert =
                    b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".to_vec()
            }),
        ),
        (
            "a kubelet certificate from another CA",
            Arc::new(|t: &mut IssueJoinTicketResponse| {
                let other = ClusterCa::generate(SystemTime::now()).unwrap();
                t.discovery_token_ca_cert_hash = other.discovery_hash().unwrap();
            }),
        ),
    ];
    let issuer = held_issuer(&cp);
    for (i, (what, tamper)) in tampers.into_iter().enumerate() {
        eprintln!("tampered ticket: {what}");
        let t = TestNode::new(&format!("127.0.12.{}", 20 + i));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (port, _stop) = start_stub_with(
            cp.ip,
            issuer.clone(),
            &t,
            seen.clone(),
            Some(tamper),
            Signing::ControlPlane,
        )
        .await;
        refused(&cp, &t, port, cluster_id()).await;
        assert!(
            !seen.lock().unwrap().join_peers.is_empty(),
            "{what}: the join service was asked"
        );
    }
}

/// Issue 22, attack 1: a joined worker (genuine TPM and measurements, this cluster's marker
/// in PCR 15, the measurement secret and salt its own ticket gave it, CAs of its own)
/// answers a fresh node as the join service. Its ticket agrees with itself and derives
/// the right cluster ID; only the control plane's signature, which it cannot make, tells
/// it apart. Unsigned, signed with a key of its own, or carrying a genuine signature made
/// for another connection: the fresh node refuses all three and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_posing_as_the_join_service_is_refused_without_the_control_planes_signature() {
    let worker = TestNode::new("127.0.12.40");
    // The worker joined this cluster: its PCR 15 holds the cluster's marker.
    worker.mark(&cluster_id());
    let issuer = held_issuer(&worker);
    for (i, signing) in [Signing::Unsigned, Signing::OwnKey, Signing::OtherConnection]
        .into_iter()
        .enumerate()
    {
        eprintln!("posing worker signs: {signing:?}");
        let t = TestNode::new(&format!("127.0.12.{}", 41 + i));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (port, _stop) =
            start_stub_with(worker.ip, issuer.clone(), &t, seen.clone(), None, signing).await;
        refused(&worker, &t, port, cluster_id()).await;
        assert!(
            !seen.lock().unwrap().join_peers.is_empty(),
            "{signing:?}: the posing worker passed attestation and was asked"
        );
    }
    // The same worker's ticket is taken by a node that skips the check, by name: what the
    // signature is the only defence against.
    let t = TestNode::new("127.0.12.44");
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (port, _stop) =
        start_signing_stub(worker.ip, &worker, &t, seen.clone(), Signing::Unsigned).await;
    let metadata = StaticMetadata::new(vec![
        instance("cp-0", MetaRole::ControlPlane, worker.ip),
        instance("worker-1", MetaRole::Worker, t.ip),
    ])
    .with_self("worker-1")
    .with_init_secret_hash(init_secret_hash());
    let node = t.node(
        metadata,
        TestNode::none_driver(),
        port,
        Some(worker.join_service_trust(cluster_id(), ControlPlaneIdentity::insecure_unchecked())),
    );
    let outcome = tokio::time::timeout(
        Duration::from_secs(120),
        t.run(node, std::future::pending()),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(outcome, Outcome::Joined(cluster_id()));
}

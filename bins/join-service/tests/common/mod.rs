//! A cluster in one process for the tests: metadata service, key service on a Unix
//! socket, the join service over aTLS, and clients bound to node addresses.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use asterism_atls::{AtlsConfig, AtlsConnector, AtlsServer, Issuer};
use asterism_attestation::{
    AkFingerprint, AkTrust, ExpectedPcr, Measurements, PcrIndex, TpmQuoteValidator,
};
use asterism_join_service::{
    ClusterState, JoinConfig, JoinService, KeyServiceAddress, KeyServiceClient, LIMITS, Limits,
    Metrics, RedbState,
};
use asterism_kms::{ClusterKms, KeyId, MasterSecret, Salt};
use asterism_metadata::{AnyMetadata, InstanceMetadata, MetadataConfig, MetadataServer, Role};
use asterism_pki::{ClusterCa, kubelet_key_and_csr};
use asterism_proto::join::api_client::ApiClient;
use asterism_proto::join::{IssueJoinTicketRequest, IssueJoinTicketResponse};
use asterism_testkit::process::Process;
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint};

pub const CP: &str = "127.0.10.1";
pub const W0: &str = "127.0.10.2";
pub const W1: &str = "127.0.10.3";
pub const DISK_A: &str = "aaaaaaaa-0000-4000-8000-00000000000a";
pub const DISK_B: &str = "bbbbbbbb-0000-4000-8000-00000000000b";
pub const DISK_C: &str = "cccccccc-0000-4000-8000-00000000000c";
pub const DISK_D: &str = "dddddddd-0000-4000-8000-00000000000d";
pub const SALT: &[u8] = b"measurement salt of 32 bytes....";

pub fn instances() -> Vec<InstanceMetadata> {
    let mk = asterism_testkit::metadata::instance;
    vec![
        mk("cp-0", Role::ControlPlane, CP),
        mk("worker-0", Role::Worker, W0),
        mk("worker-1", Role::Worker, W1),
    ]
}

/// The KMS of the test cluster (master secret and salt all zero), to compute expected keys.
pub fn kms() -> ClusterKms {
    ClusterKms::new(
        MasterSecret::new(vec![0; 32]).unwrap(),
        Salt::new(vec![0; 32]).unwrap(),
    )
}

pub fn expected_key(id: KeyId) -> Vec<u8> {
    kms().data_key(&id, 32).unwrap().expose_secret().to_vec()
}

/// PCRs 0..=7 all zero, enforced (a fresh swtpm and a fresh software TPM both match).
pub fn zero_measurements() -> Measurements {
    Measurements::new((0..=7u8).map(|i| (PcrIndex::new(i).unwrap(), ExpectedPcr::enforce([0; 32]))))
        .unwrap()
}

/// Everything but the join service, which tests start (and restart) themselves.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    /// The join service's `--metadata-url`.
    pub metadata_url: String,
    /// With [`Cluster::start_on_gce`], the project its Compute Engine API stand-in lists.
    pub gce: Option<Arc<asterism_testkit::cloud::GceProject>>,
    pub key_socket: PathBuf,
    stop: watch::Sender<bool>,
}

impl Cluster {
    /// The cluster with its instances in the metadata service.
    pub async fn start() -> Self {
        Self::start_with(false).await
    }

    /// The cluster with its instances in a GCE project: each instance of [`instances`]
    /// labelled with the cluster and its role, listed by a Compute Engine API stand-in over
    /// HTTPS, which the join service calls with the token its metadata server stand-in
    /// gives (`gce://…`, docs/metadata.md).
    pub async fn start_on_gce() -> Self {
        Self::start_with(true).await
    }

    async fn start_with(gce: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        // Cluster CA in the PKI directory.
        let pki = dir.path().join("pki");
        std::fs::create_dir_all(&pki).unwrap();
        let ca = ClusterCa::generate(std::time::SystemTime::now()).unwrap();
        std::fs::write(pki.join("ca.crt"), ca.cert_pem()).unwrap();
        asterism_binkit::fs::write_private(
            &pki.join("ca.key"),
            ca.key_pem().unwrap().expose_secret().as_bytes(),
        )
        .unwrap();

        let (stop, stop_rx) = watch::channel(false);
        let stopped = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };

        let listener = tokio::net::TcpListener::bind("127.0.10.254:0")
            .await
            .unwrap();
        let metadata_url = format!("http://{}", listener.local_addr().unwrap());
        let config = MetadataConfig {
            instances: instances(),
            init_secret_hash: String::new(),
        };
        tokio::spawn(MetadataServer::new(config).serve(listener, stopped(stop_rx.clone())));

        let key_socket = dir.path().join("key-service.sock");
        let ks = asterism_key_service::Listener::bind(&KeyServiceAddress::Unix(key_socket.clone()))
            .await
            .unwrap();
        let service = asterism_key_service::KeyService::new(kms());
        let rx = stop_rx.clone();
        tokio::spawn(async move {
            ks.serve(service, &asterism_key_service::LIMITS, stopped(rx))
                .await
        });
        let (metadata_url, gce) = if gce {
            use asterism_testkit::cloud;
            let labelled = instances()
                .iter()
                .map(|i| {
                    let role = match i.role {
                        Role::ControlPlane => "control-plane",
                        _ => "worker",
                    };
                    cloud::gce_api_instance(
                        &i.name,
                        "europe-west3-a",
                        &i.vpc_ip,
                        &[("asterism-cluster", "test"), ("asterism-role", role)],
                    )
                })
                .collect();
            let project = Arc::new(cloud::GceProject::new("test-project", labelled));
            let (api, ca_pem) = cloud::serve_https(cloud::gce_compute(project.clone())).await;
            let server = cloud::serve(cloud::gce_identity(project.clone(), "cp-0", None)).await;
            let ca = dir.path().join("compute-ca.pem");
            std::fs::write(&ca, ca_pem).unwrap();
            let url = format!(
                "gce://test-project/test?compute=https://{api}&compute-ca={}&metadata-server=http://{server}",
                ca.display()
            );
            (url, Some(project))
        } else {
            (metadata_url, None)
        };
        Self {
            dir,
            metadata_url,
            gce,
            key_socket,
            stop,
        }
    }

    pub fn pki_dir(&self) -> PathBuf {
        self.dir.path().join("pki")
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    pub fn ca(&self) -> ClusterCa {
        let p = self.pki_dir();
        ClusterCa::from_pem(
            &std::fs::read_to_string(p.join("ca.crt")).unwrap(),
            &std::fs::read_to_string(p.join("ca.key")).unwrap(),
        )
        .unwrap()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// Options of one join service.
pub struct Options {
    pub pinned: Vec<AkFingerprint>,
    pub measurements: Measurements,
    pub burst: u32,
    pub rate: f64,
    pub key_socket: Option<PathBuf>,
    pub cluster_sans: Vec<String>,
    pub kubernetes: Option<asterism_join_service::ClusterRelease>,
}

impl Options {
    pub fn pinning(pinned: Vec<AkFingerprint>) -> Self {
        Self {
            pinned,
            measurements: zero_measurements(),
            burst: 20,
            rate: 10.0,
            key_socket: None,
            cluster_sans: Vec::new(),
            kubernetes: None,
        }
    }
}

pub type Service<S = RedbState> = JoinService<AnyMetadata, KeyServiceClient, S>;

pub struct Running<S = RedbState> {
    pub addr: SocketAddr,
    pub http: SocketAddr,
    /// The operator's Unix socket (member lists, readmit).
    pub admin_socket: PathBuf,
    _admin_dir: tempfile::TempDir,
    pub service: Service<S>,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl<S> Running<S> {
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            tokio::time::timeout(Duration::from_secs(15), t)
                .await
                .unwrap()
                .unwrap();
        }
    }

    pub async fn http_get(&self, path: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(self.http).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out.split_once("\r\n\r\n").unwrap().1.to_owned()
    }

    /// The body of `GET path` on the admin socket (where the member lists are served).
    pub async fn admin_get(&self, path: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::UnixStream::connect(&self.admin_socket)
            .await
            .unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out.split_once("\r\n\r\n").unwrap().1.to_owned()
    }
}

/// The join service on `cluster` over `state`, with the key socket, rate, SANs and release
/// of `options` (its AK trust and measurements are the aTLS server's, made by the caller).
pub fn join_service<S: ClusterState>(cluster: &Cluster, state: S, options: Options) -> Service<S> {
    let keys = KeyServiceClient::new(&KeyServiceAddress::Unix(
        options
            .key_socket
            .unwrap_or_else(|| cluster.key_socket.clone()),
    ))
    .unwrap();
    JoinService::new(
        AnyMetadata::from_url(&cluster.metadata_url).unwrap(),
        keys,
        state,
        cluster.ca(),
        JoinConfig {
            measurement_salt: SALT.to_vec(),
            api_server_host: CP.parse().unwrap(),
            pki_dir: cluster.pki_dir(),
            rate_per_second: options.rate,
            burst: options.burst,
            cluster_sans: options.cluster_sans,
            kubernetes: options.kubernetes,
        },
        Metrics::new(),
    )
    .unwrap()
}

pub async fn start_join_service(cluster: &Cluster, options: Options) -> Running {
    let state = RedbState::open(&cluster.state_dir()).unwrap();
    start_join_service_with(cluster, options, state).await
}

/// A join service over `state`.
pub async fn start_join_service_with<S: ClusterState>(
    cluster: &Cluster,
    mut options: Options,
    state: S,
) -> Running<S> {
    let validator = TpmQuoteValidator::new(
        AkTrust::pinned(std::mem::take(&mut options.pinned)),
        options.measurements.clone().into_provider(),
    );
    let atls = AtlsServer::new(AtlsConfig::verifying(Arc::new(validator))).unwrap();
    let service = join_service(cluster, state, options);
    let (stop, rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let listener = tokio::net::TcpListener::bind(format!("{CP}:0"))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let http_listener = tokio::net::TcpListener::bind(format!("{CP}:0"))
        .await
        .unwrap();
    let http = http_listener.local_addr().unwrap();
    let s = service.clone();
    let rx1 = rx.clone();
    let grpc = tokio::spawn(async move {
        let limits = Limits {
            shutdown_grace: Some(Duration::from_secs(1)),
            ..LIMITS
        };
        asterism_join_service::serve(listener, atls, s, &limits, stopped(rx1))
            .await
            .unwrap();
    });
    let s = service.clone();
    let rx2 = rx.clone();
    let web = tokio::spawn(async move {
        asterism_join_service::serve_http(http_listener, s, stopped(rx2))
            .await
            .unwrap();
    });
    let admin_dir = tempfile::tempdir().unwrap();
    let admin_socket = admin_dir.path().join("admin.sock");
    let admin_listener = asterism_join_service::bind_admin_socket(&admin_socket).unwrap();
    let s = service.clone();
    let admin = tokio::spawn(async move {
        asterism_join_service::serve_admin(admin_listener, s, stopped(rx))
            .await
            .unwrap();
    });
    Running {
        addr,
        http,
        admin_socket,
        _admin_dir: admin_dir,
        service,
        stop,
        tasks: vec![grpc, web, admin],
    }
}

/// A join.API client that attests with `issuer`, connecting from `from`.
pub async fn client(
    server: SocketAddr,
    from: &str,
    issuer: Arc<dyn Issuer>,
) -> Result<ApiClient<Channel>, tonic::transport::Error> {
    let connector = AtlsConnector::new(AtlsConfig::attesting(issuer))
        .unwrap()
        .from_address(from.parse().unwrap());
    let channel = Endpoint::from_shared(format!("http://{server}"))
        .unwrap()
        .timeout(Duration::from_secs(30))
        .connect_with_connector(connector)
        .await?;
    Ok(ApiClient::new(channel))
}

/// A join request as the bootstrapper of node `name` (address `ip`) sends it.
pub fn join_request(
    name: &str,
    ip: &str,
    disk: &str,
    control_plane: bool,
) -> IssueJoinTicketRequest {
    let kc = kubelet_key_and_csr(name, &[ip.parse().unwrap()]).unwrap();
    let host = asterism_pki::HostKey::generate().unwrap();
    IssueJoinTicketRequest {
        disk_uuid: disk.into(),
        certificate_request: kc.csr_der,
        is_control_plane: control_plane,
        host_public_key: host.public_key_wire().unwrap(),
        host_certificate_principals: vec![ip.into(), name.into()],
    }
}

/// [`join`] as worker-0: from [`W0`], with disk [`DISK_A`], as a worker.
pub async fn join_worker_0(
    server: SocketAddr,
    issuer: Arc<dyn Issuer>,
) -> Result<IssueJoinTicketResponse, tonic::Status> {
    join_worker_0_with_disk(server, issuer, DISK_A).await
}

/// worker-0's join request from its address, with the disk `disk` (a disk UUID).
pub async fn join_worker_0_with_disk(
    server: SocketAddr,
    issuer: Arc<dyn Issuer>,
    disk: &str,
) -> Result<IssueJoinTicketResponse, tonic::Status> {
    join(
        server,
        W0,
        issuer,
        join_request("worker-0", W0, disk, false),
    )
    .await
}

pub async fn join(
    server: SocketAddr,
    from: &str,
    issuer: Arc<dyn Issuer>,
    req: IssueJoinTicketRequest,
) -> Result<IssueJoinTicketResponse, tonic::Status> {
    let mut c = client(server, from, issuer)
        .await
        .map_err(|e| tonic::Status::unavailable(format!("{e:?}")))?;
    c.issue_join_ticket(req).await.map(|r| r.into_inner())
}

/// `N` fresh software nodes, a cluster, and its join service trusting exactly their AKs
/// (pinned, [`Options::pinning`]). Keep the cluster while the service runs: it holds the
/// service's directories.
pub async fn pinned_cluster<const N: usize>()
-> (Cluster, Running, [(Arc<dyn Issuer>, AkFingerprint); N]) {
    let nodes: [_; N] = std::array::from_fn(|_| soft_node());
    let cluster = Cluster::start().await;
    let pinned = nodes.iter().map(|(_, fp)| *fp).collect();
    let js = start_join_service(&cluster, Options::pinning(pinned)).await;
    (cluster, js, nodes)
}

/// A software-TPM issuer whose AK tests pin.
pub fn soft_node() -> (Arc<dyn Issuer>, AkFingerprint) {
    use asterism_soft_tpm::{SoftAk, SoftTpm};
    let tpm = SoftTpm::new(SoftAk::generate_ecdsa_p256().unwrap());
    let fp = tpm.ak().fingerprint();
    (Arc::new(tpm), fp)
}

pub fn path_str(p: &Path) -> String {
    p.display().to_string()
}

/// worker-0's join ticket from the join service at `addr`, once it answers (30 s at most).
pub async fn first_ticket(addr: SocketAddr, node: Arc<dyn Issuer>) -> IssueJoinTicketResponse {
    let start = std::time::Instant::now();
    loop {
        match join(
            addr,
            W0,
            node.clone(),
            join_request("worker-0", W0, DISK_A, false),
        )
        .await
        {
            Ok(t) => break t,
            Err(e) if start.elapsed() > Duration::from_secs(30) => panic!("{e:?}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Sends SIGTERM to the join service process and waits (20 s at most) for it to end;
/// returns its status and its log. The wait blocks a thread of its own, not the runtime.
pub async fn stop(process: Process) -> (ExitStatus, String) {
    tokio::task::spawn_blocking(move || {
        let mut process = process;
        process.stop(Duration::from_secs(20))
    })
    .await
    .unwrap()
}

/// Waits (20 s at most) for the join service process to end; returns its status and its
/// log.
pub async fn wait(process: Process) -> (ExitStatus, String) {
    tokio::task::spawn_blocking(move || {
        let mut process = process;
        process.wait(Duration::from_secs(20))
    })
    .await
    .unwrap()
}

/// The join-service program on `cluster`, trusting `fp`, listening on a free port of
/// [`CP`]: the command with the flags every run shares (the measurement salt and zero
/// measurements written to the cluster's directory), for the caller to add where the
/// cluster state lives; and the join.API address.
pub fn join_service_command(
    cluster: &Cluster,
    fp: &asterism_attestation::AkFingerprint,
) -> (std::process::Command, String) {
    let dir = cluster.dir.path();
    std::fs::write(dir.join("salt"), SALT).unwrap();
    std::fs::write(dir.join("measurements.json"), zero_measurements().to_json()).unwrap();
    let listen = format!("{CP}:{}", asterism_testkit::process::free_port(CP));
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_asterism-join-service"));
    command
        .args(["--listen", &listen])
        .args(["--pinned-ak", &fp.to_string()])
        .arg("--measurements")
        .arg(dir.join("measurements.json"))
        .arg("--key-service")
        .arg(format!("unix:{}", cluster.key_socket.display()))
        .args(["--metadata-url", &cluster.metadata_url])
        .arg("--pki-dir")
        .arg(cluster.pki_dir())
        .arg("--measurement-salt-file")
        .arg(dir.join("salt"))
        .stdout(std::process::Stdio::null());
    (command, listen)
}

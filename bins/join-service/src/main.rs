//! `asterism-join-service`: verifies joining nodes over attested TLS and issues join and
//! rejoin tickets; serves metrics, health and the member list on a plain HTTP listener.
#![forbid(unsafe_code)]

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use asterism_atls::{AtlsConfig, AtlsServer};
use asterism_attestation::TpmQuoteValidator;
use asterism_binkit::{AkTrustArgs, LogArgs, read_capped};
use asterism_join_service::{
    ClusterRelease, ClusterState, HttpAccess, InitNode, JoinConfig, JoinService, JoiningNodes,
    KeyServiceAddress, KeyServiceClient, KubeState, LIMITS, Metrics, RedbState,
};
use asterism_kube_api::{ApiOptions, ClusterApi, WaitPolicy};
use asterism_metadata::AnyMetadata;
use asterism_pki::ClusterCa;
use clap::{Parser, ValueEnum};

/// Verifies joining nodes over attested TLS and issues join tickets (join.API).
#[derive(Debug, Parser)]
#[command(name = "asterism-join-service", version)]
struct Args {
    /// Where to serve join.API over attested TLS (the control-plane node's address).
    #[arg(long, value_name = "IP:PORT")]
    listen: SocketAddr,

    /// Host of `api_server_endpoint` in tickets (port 6443). Default: the --listen address.
    #[arg(long, value_name = "IP")]
    api_server_host: Option<IpAddr>,

    /// Plain HTTP listener for /metrics and /healthz: a loopback address (`127.0.0.1:9102`),
    /// or any address together with --metrics-token-file (which also serves /v1/members and
    /// /v1/control-plane there; without a token they are on --admin-socket only).
    #[arg(long, value_name = "IP:PORT")]
    metrics_listen: Option<SocketAddr>,

    /// File holding a bearer token that /metrics, /v1/members and /v1/control-plane require
    /// (`Authorization: Bearer <token>`); needed when --metrics-listen is not loopback.
    #[arg(long, value_name = "PATH", requires = "metrics_listen")]
    metrics_token_file: Option<PathBuf>,

    /// Unix socket (created mode 0600; keep it in a directory only this user can enter) of
    /// the operator's endpoints: the member list and `asterism readmit`.
    #[arg(long, value_name = "PATH")]
    admin_socket: Option<PathBuf>,

    /// The key service: `unix:/path/to.sock` or a loopback `IP:PORT`.
    #[arg(long, value_name = "ADDRESS")]
    key_service: KeyServiceAddress,

    /// Where the cluster's instances, roles and addresses come from: the metadata service
    /// (`http://HOST:PORT`), or on GCE the Compute Engine API, `gce://PROJECT/CLUSTER` (the
    /// instances of PROJECT labelled `asterism-cluster=CLUSTER`; docs/metadata.md).
    #[arg(long, value_name = "URL", default_value = "http://127.0.10.254:8080")]
    metadata_url: String,

    /// Directory of the cluster CA (`ca.crt`, `ca.key`) and the other control-plane files.
    #[arg(long, value_name = "DIR")]
    pki_dir: PathBuf,

    /// File holding the raw measurement salt.
    #[arg(long, value_name = "PATH")]
    measurement_salt_file: PathBuf,

    /// Where the cluster state (bootstrap tokens, disk bindings, members) is kept.
    #[arg(long, value_enum, default_value_t = ClusterStateKind::Embedded)]
    cluster_state: ClusterStateKind,

    /// Directory of the persistent cluster state (created 0700), with --cluster-state
    /// embedded.
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,

    /// The init node's record (JSON: disk, ak, name, role), written by its bootstrapper at
    /// init: recorded in the cluster state at start, so that the first node's disk is bound
    /// to its attestation key like every other node's.
    #[arg(long, value_name = "PATH")]
    init_node: Option<PathBuf>,

    /// Kubeconfig for the Kubernetes API, with --cluster-state kubernetes. Default: the
    /// pod's service account.
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,

    /// With --cluster-state kubernetes: whether every join must write its JoiningNode
    /// record (`required`) or only when the CRD and the NodeVersion exist
    /// (`when-installed`; control-plane joins are then not serialised).
    #[arg(long, value_enum, default_value_t = JoiningNodesArg::Required)]
    joining_nodes: JoiningNodesArg,

    /// Expected measurements of joining nodes (JSON, docs/attestation.md); re-read when it
    /// changes.
    #[arg(long, value_name = "PATH")]
    measurements: PathBuf,

    /// Which node attestation keys to trust.
    #[command(flatten)]
    ak_trust: AkTrustArgs,

    /// Attest this service to nodes that ask (mutual aTLS) with this TPM, e.g.
    /// `swtpm:host=127.0.0.1,port=2321` or `device:/dev/tpmrm0`.
    #[arg(long, value_name = "TCTI", requires = "ak_cert")]
    tpm: Option<String>,

    /// DER certificate of this node's AK (sent with the evidence), with --tpm.
    #[arg(long, value_name = "PATH", requires = "tpm")]
    ak_cert: Option<PathBuf>,

    /// A name of the cluster (a SAN of the API server certificate) that control-plane
    /// nodes' SSH host certificates may carry. Repeatable.
    #[arg(long, value_name = "NAME")]
    host_cert_san: Vec<String>,

    /// Sustained ticket requests per second per attestation key.
    #[arg(long, value_name = "N", default_value_t = 10.0)]
    rate_limit_per_second: f64,

    /// Burst of ticket requests per attestation key.
    #[arg(long, value_name = "N", default_value_t = 20)]
    rate_limit_burst: u32,

    #[command(flatten)]
    log: LogArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ClusterStateKind {
    /// An embedded database in --state-dir (one replica).
    Embedded,
    /// The Kubernetes API (any number of replicas).
    Kubernetes,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum JoiningNodesArg {
    /// Every join writes its JoiningNode.
    Required,
    /// Only when the JoiningNode CRD and the NodeVersion exist.
    WhenInstalled,
}

impl Args {
    /// Combinations clap cannot express; a violation is a usage error (exit status 2).
    fn check(&self) -> Result<(), clap::Error> {
        use clap::CommandFactory as _;
        use clap::error::ErrorKind;
        let mut cmd = Self::command();
        if let Some(addr) = self.metrics_listen
            && !asterism_join_service::is_loopback(addr)
            && self.metrics_token_file.is_none()
        {
            return Err(cmd.error(
                ErrorKind::ArgumentConflict,
                format!(
                    "--metrics-listen {addr} is reachable from the network: the member list and the metrics would be open to anyone; use a loopback address or add --metrics-token-file"
                ),
            ));
        }
        match self.cluster_state {
            ClusterStateKind::Embedded if self.state_dir.is_none() => Err(cmd.error(
                ErrorKind::MissingRequiredArgument,
                "--cluster-state embedded needs --state-dir",
            )),
            ClusterStateKind::Embedded if self.kubeconfig.is_some() => Err(cmd.error(
                ErrorKind::ArgumentConflict,
                "--kubeconfig is for --cluster-state kubernetes",
            )),
            ClusterStateKind::Kubernetes if self.state_dir.is_some() => Err(cmd.error(
                ErrorKind::ArgumentConflict,
                "--state-dir is for --cluster-state embedded",
            )),
            _ => Ok(()),
        }
    }
}

fn validator(args: &Args) -> anyhow::Result<Arc<TpmQuoteValidator>> {
    // Re-read when the file changes, here at the edge; validation reads only memory.
    let measurements = asterism_binkit::measurements::watch(&args.measurements)
        .with_context(|| format!("loading measurements from {}", args.measurements.display()))?;
    let trust =
        args.ak_trust
            .ak_trust_for(&asterism_attestation::MeasurementsProvider::current(
                &measurements,
            ))?;
    Ok(Arc::new(TpmQuoteValidator::new(
        trust,
        Arc::new(measurements),
    )))
}

fn atls_config(args: &Args, metrics: &Metrics) -> anyhow::Result<AtlsConfig> {
    let counted = metrics.clone();
    let mut config = AtlsConfig::verifying(validator(args)?)
        .with_refusal_observer(Arc::new(move |reason| counted.atls_refused(reason)));
    if let (Some(tcti), Some(ak_cert)) = (&args.tpm, &args.ak_cert) {
        let tpm: asterism_tpm::TpmConfig =
            tcti.parse().with_context(|| format!("--tpm {tcti:?}"))?;
        let cert = read_capped(ak_cert, 64 * 1024)?;
        let issuer = asterism_tpm::TpmIssuer::connecting_per_use(
            tpm,
            asterism_tpm::AkConfig::default(),
            asterism_tpm::PcrSelection::all(),
            vec![cert],
        )
        .context("loading the attestation key from the TPM")?;
        // A session key, quoted once per refresh interval: nodes that ask for the
        // service's evidence get a signature over their connection with it, so no
        // client, attested or not, can make the service quote its TPM more often.
        tracing::info!("attesting to nodes that ask (mutual aTLS) with a TPM-quoted session key");
        config = config.with_session_key_issuer(Arc::new(issuer));
    }
    Ok(config)
}

async fn run(args: Args) -> anyhow::Result<()> {
    let shutdown = asterism_binkit::shutdown_signal()?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });

    let api_server_host = match args.api_server_host {
        Some(ip) => ip,
        None if !args.listen.ip().is_unspecified() => args.listen.ip(),
        None => anyhow::bail!(
            "--listen is a wildcard address; name the node's address with --api-server-host"
        ),
    };
    let ca = {
        let cert = read_capped(&args.pki_dir.join("ca.crt"), 1024 * 1024)?;
        let key = zeroize::Zeroizing::new(read_capped(&args.pki_dir.join("ca.key"), 1024 * 1024)?);
        ClusterCa::from_pem(
            &String::from_utf8_lossy(&cert),
            std::str::from_utf8(&key).context("ca.key is not PEM text")?,
        )
        .with_context(|| format!("loading the cluster CA from {}", args.pki_dir.display()))?
    };
    let measurement_salt = read_capped(&args.measurement_salt_file, 4096)?;
    anyhow::ensure!(
        !measurement_salt.is_empty(),
        "the measurement salt file is empty"
    );
    let init_node = args.init_node.as_deref().map(read_init_node).transpose()?;
    let kubernetes = match &init_node {
        Some(init) => cluster_release(init)?,
        None => None,
    };
    let metadata = AnyMetadata::from_url(&args.metadata_url)?;
    let keys = KeyServiceClient::new(&args.key_service)?;
    let metrics = Metrics::new();
    let atls = AtlsServer::new(atls_config(&args, &metrics)?).context("setting up attested TLS")?;
    let config = JoinConfig {
        measurement_salt,
        api_server_host,
        pki_dir: args.pki_dir.clone(),
        rate_per_second: args.rate_limit_per_second,
        burst: args.rate_limit_burst,
        cluster_sans: args.host_cert_san.clone(),
        kubernetes,
    };
    let mut parts = Parts {
        init_node,
        metadata,
        keys,
        ca,
        config,
        atls,
        metrics,
        stop_rx,
    };
    match (args.cluster_state, &args.state_dir) {
        (ClusterStateKind::Embedded, Some(dir)) => {
            let state = RedbState::open(dir)?;
            tracing::info!(state = %dir.display(), "cluster state: embedded database");
            serve_with(&args, parts, state).await
        }
        (ClusterStateKind::Embedded, None) => anyhow::bail!("--state-dir is missing"),
        (ClusterStateKind::Kubernetes, _) => {
            let options = ApiOptions::default();
            let api = match &args.kubeconfig {
                Some(path) => ClusterApi::from_kubeconfig(path, options).await?,
                None => ClusterApi::in_cluster(options)?,
            };
            tracing::info!(kubeconfig = ?args.kubeconfig, "cluster state: the Kubernetes API; waiting for the API server");
            let mut stop = parts.stop_rx.clone();
            tokio::select! {
                ready = api.wait_until_ready(WaitPolicy::default()) => ready?,
                _ = stop.wait_for(|s| *s) => {
                    tracing::info!("stopped while waiting for the API server");
                    return Ok(());
                }
            }
            let joining_nodes = match args.joining_nodes {
                JoiningNodesArg::Required => JoiningNodes::Required,
                JoiningNodesArg::WhenInstalled => JoiningNodes::WhenInstalled,
            };
            let state = KubeState::new(api, joining_nodes);
            // The cluster's record (the components ConfigMap) over the init node's file.
            if let Some(release) = state
                .release()
                .await
                .context("loading the cluster's Kubernetes version and components")?
            {
                tracing::info!(version = %release.version(), components = release.components().len(), "join tickets carry the components ConfigMap's version and components");
                parts.config.kubernetes = Some(release);
            }
            serve_with(&args, parts, state).await
        }
    }
}

/// Everything of the service but its cluster state.
struct Parts {
    init_node: Option<InitNode>,
    metadata: AnyMetadata,
    keys: KeyServiceClient,
    ca: ClusterCa,
    config: JoinConfig,
    atls: AtlsServer,
    metrics: Metrics,
    stop_rx: tokio::sync::watch::Receiver<bool>,
}

async fn serve_with<S: ClusterState>(args: &Args, parts: Parts, state: S) -> anyhow::Result<()> {
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    if let Some(init) = &parts.init_node {
        record_init_node(init, &state).await?;
    }
    let service = JoinService::new(
        parts.metadata,
        parts.keys,
        state,
        parts.ca,
        parts.config,
        parts.metrics,
    )?;

    let listener = asterism_join_service::bind_listener(args.listen)
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let http = match args.metrics_listen {
        Some(addr) => {
            let access = match &args.metrics_token_file {
                Some(path) => {
                    let token = zeroize::Zeroizing::new(read_capped(path, 4096)?);
                    let token = std::str::from_utf8(&token)
                        .context("the metrics token is not text")?
                        .trim();
                    anyhow::ensure!(!token.is_empty(), "the metrics token file is empty");
                    HttpAccess::bearer(token)
                }
                None => HttpAccess::open(),
            };
            let l = asterism_join_service::bind_listener(addr)
                .with_context(|| format!("cannot listen on {addr}"))?;
            tracing::info!(listen = %l.local_addr()?, token = args.metrics_token_file.is_some(), "metrics, health and members (plain HTTP)");
            Some(tokio::spawn(asterism_join_service::serve_http_with(
                l,
                service.clone(),
                access,
                stopped(parts.stop_rx.clone()),
            )))
        }
        None => None,
    };
    let admin = match &args.admin_socket {
        Some(path) => {
            let l = asterism_join_service::bind_admin_socket(path)
                .with_context(|| format!("cannot listen on {}", path.display()))?;
            tracing::info!(socket = %path.display(), "admin endpoints (members, readmit)");
            Some(tokio::spawn(asterism_join_service::serve_admin(
                l,
                service.clone(),
                stopped(parts.stop_rx.clone()),
            )))
        }
        None => None,
    };
    tracing::info!(listen = %listener.local_addr()?, key_service = ?args.key_service, metadata = %args.metadata_url, "join service listening (attested TLS, nodes must attest)");
    asterism_join_service::serve(
        listener,
        parts.atls,
        service,
        &LIMITS,
        stopped(parts.stop_rx),
    )
    .await
    .context("the gRPC server failed")?;
    for h in [http, admin].into_iter().flatten() {
        let _ = h.await;
    }
    tracing::info!("join service stopped");
    Ok(())
}

/// The largest init-node record read: the record names every component of the release.
const MAX_INIT_NODE_RECORD: u64 = 1024 * 1024;

/// The init node's record at `path`.
fn read_init_node(path: &Path) -> anyhow::Result<InitNode> {
    let bytes = read_capped(path, MAX_INIT_NODE_RECORD)?;
    InitNode::from_json(&bytes).with_context(|| path.display().to_string())
}

/// The cluster's release as the init node recorded it, checked once here: a bad hash or
/// version stops the service rather than reach a joining node in a ticket.
fn cluster_release(init: &InitNode) -> anyhow::Result<Option<ClusterRelease>> {
    let release = ClusterRelease::of_init_node(init).with_context(|| {
        format!(
            "the Kubernetes release recorded by the init node {}",
            init.name
        )
    })?;
    match &release {
        Some(r) => {
            tracing::info!(version = %r.version(), components = r.components().len(), "join tickets carry the cluster's Kubernetes version and components");
        }
        None => {
            tracing::warn!(node = %init.name, "the init node recorded no Kubernetes version or components: join tickets carry none");
        }
    }
    Ok(release)
}

/// Records the init node in `state`; a record the state contradicts (its disk or its name
/// held by another key) stops the service: one of the two is not what it claims.
async fn record_init_node<S: ClusterState>(init: &InitNode, state: &S) -> anyhow::Result<()> {
    state
        .record_init_node(init, std::time::SystemTime::now())
        .await
        .with_context(|| {
            format!(
                "recording the init node {} (disk {}) in the cluster state",
                init.name, init.disk
            )
        })?;
    tracing::info!(node = %init.name, disk = %init.disk, ak = %init.ak, "the init node's disk is bound to its attestation key");
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(e) = args.check() {
        e.exit();
    }
    args.log.init(&[
        "asterism_join_service",
        "asterism_atls",
        "asterism_attestation",
        "asterism_metadata",
        "asterism_kube_api",
    ]);
    // Blocking threads serve the store's listing of members, the control-plane files and
    // the measurements' reloads (the store's point reads run on the calling task, its
    // writes on its writer thread). A burst of work for them would otherwise start up to
    // tokio's default of 512 threads, each with its stack and, in glibc, its own malloc
    // arena (42 threads and 18 MiB of heap after a 256-joiner burst when the store's
    // writes ran there; docs/performance.md). Eight keep that work concurrent.
    asterism_binkit::service::Runtime::default()
        .with_max_blocking_threads(8)
        .main("join service", run(args))
}

#[cfg(test)]
mod tests {
    use super::*;
    use asterism_kube_api::{DeploymentSpec, Images, JOIN_SERVICE, JoinServiceTrust, Object};

    /// The join service container of the deployment `asterism init` applies: its command
    /// line and the paths its volumes provide.
    fn deployed() -> (Vec<String>, Vec<String>) {
        let spec = DeploymentSpec {
            images: Images::from_repository("registry.example", "v0"),
            attestation_config: r#"{"measurements":{}}"#.into(),
            measurement_salt: [7; 32],
            trust: JoinServiceTrust {
                args: vec!["--platform-ca=/var/trust/platform-ca.pem".into()],
                files: Default::default(),
            },
            metadata_url: Some("http://10.0.0.254:8080".into()),
        };
        let deployment = asterism_kube_api::deployment(&spec).unwrap();
        let container = deployment
            .objects()
            .find_map(|o| match o {
                Object::DaemonSet(ds) if ds.metadata.name.as_deref() == Some(JOIN_SERVICE) => {
                    Some(ds.spec.as_ref()?.template.spec.as_ref()?.containers[0].clone())
                }
                _ => None,
            })
            .expect("a join service DaemonSet");
        let mounts = container
            .volume_mounts
            .unwrap()
            .into_iter()
            .map(|m| m.mount_path)
            .collect();
        (container.args.unwrap(), mounts)
    }

    #[test]
    fn the_deployed_command_line_is_one_this_program_accepts_with_every_path_mounted() {
        let (args, mounts) = deployed();
        // The kubelet substitutes $(HOST_IP); the wrapper adds --init-node where the record
        // exists.
        let mut argv = vec!["asterism-join-service".to_owned()];
        argv.extend(args.iter().map(|a| a.replace("$(HOST_IP)", "10.0.0.1")));
        argv.push("--init-node=/var/run/asterism-init/init-node.json".into());
        let parsed = Args::try_parse_from(&argv).unwrap_or_else(|e| panic!("{e}"));
        // It attests with the node's TPM, and asks the given metadata service.
        assert_eq!(parsed.tpm.as_deref(), Some("device:/dev/tpmrm0"));
        assert!(parsed.ak_cert.is_some());
        assert_eq!(parsed.metadata_url, "http://10.0.0.254:8080");
        // Every file or socket a flag names is under a mounted volume.
        for arg in &args {
            let Some((_, value)) = arg.split_once('=') else {
                continue;
            };
            let path = value.strip_prefix("unix:").unwrap_or(value);
            if path.starts_with('/') && !path.starts_with("/dev/") {
                assert!(
                    mounts.iter().any(|m| path.starts_with(m.as_str())),
                    "{arg}: no volume provides {path} (mounts: {mounts:?})"
                );
            }
        }
    }
}

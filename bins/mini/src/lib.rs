//! `asterism-mini up | status | down` (also run as `asterism mini …`): a local confidential
//! cluster of real processes.
//!
//! One swtpm per node (provisioned with an AK certified by a local platform CA), a LUKS2
//! image file per node, a metadata service, the bootstrappers, `asterism init` against the
//! first node, then the key and join services on the control-plane node; the workers join.
//! See docs/mini.md and docs/design/local-cluster.md.
//!
//! A binary of its own because it drives the node side too (swtpm, LUKS2 images): the
//! operator's `asterism` CLI must link neither the TSS nor libcryptsetup, and runs this one
//! for `asterism mini`. The cluster steps are a library so that tests drive them one by one.
#![forbid(unsafe_code)]

pub mod timing;
pub mod vm;

use anyhow::{Context, Result, bail};
use asterism_cluster::{KubernetesHandover, NodeDir};
use asterism_swtpm::{SwtpmConfig, SwtpmProcess};
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Port of the metadata service (on `127.0.<net>.254`).
const METADATA_PORT: u16 = 8080;
/// Port of every node's InitServer.
const INIT_PORT: u16 = 9000;
/// Port of the join service.
const JOIN_PORT: u16 = 30090;
/// Port of the join service's metrics and health endpoint.
const METRICS_PORT: u16 = 9102;
/// Port of every node's verify service.
const VERIFY_PORT: u16 = 9090;
/// Port of every node's recovery server (open only while a rebooted node waits for its keys).
const RECOVER_PORT: u16 = 9999;
/// How long any one process may take to come up or finish.
const STEP_DEADLINE: Duration = Duration::from_secs(120);

/// Arguments of `asterism mini up`.
#[derive(clap::Args, Debug)]
pub struct UpArgs {
    /// Directory of the local cluster (created).
    #[arg(long, default_value = ".asterism/mini")]
    pub dir: PathBuf,
    /// Number of worker nodes (there is one control-plane node).
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Loopback network of the cluster: nodes get `127.0.<net>.<n>`, the metadata service
    /// `127.0.<net>.254`. Two clusters on one machine need different values.
    #[arg(long, default_value_t = 10)]
    pub net: u8,
    /// Directory holding the Asterism binaries (default: next to this executable).
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
    /// Boot every node as a QEMU VM from the node image (docs/mini.md, "VM mode").
    #[arg(long)]
    pub vm: bool,
    /// Settings of VM mode.
    #[command(flatten)]
    pub vm_args: vm::VmArgs,
}

/// Arguments of `asterism mini status` and `down`.
#[derive(clap::Args, Debug)]
pub struct DirArgs {
    /// Directory of the local cluster.
    #[arg(long, default_value = ".asterism/mini")]
    pub dir: PathBuf,
}

/// Arguments of `asterism mini status`.
#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// The cluster.
    #[command(flatten)]
    pub cluster: DirArgs,
    /// Print the record and the processes as JSON (every node's components in full).
    #[arg(long)]
    pub json: bool,
}

/// What `mini up` recorded about the cluster, in `<dir>/mini.json`.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct ClusterRecord {
    /// The cluster ID, hex.
    pub cluster_id: String,
    /// One entry per node.
    pub nodes: Vec<NodeRecord>,
}

/// The outcome for one node.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct NodeRecord {
    /// Node name.
    pub name: String,
    /// `ControlPlane` or `Worker`.
    pub role: String,
    /// Its address.
    pub ip: String,
    /// Who verified its evidence.
    pub attestation: String,
    /// Whether its disk opens with the derived key and not with the first-boot passphrase.
    pub disk_rekeyed: bool,
    /// Milliseconds from bootstrapper start to its exit.
    pub bootstrap_ms: u64,
    /// `ok` or the bootstrapper's exit status.
    pub exit: String,
    /// What its bootstrapper handed its Kubernetes driver (the node's
    /// `state/asterism/kubernetes.json`); `None` when the node recorded nothing (it did not
    /// get that far), and in a record of an older `mini`.
    #[serde(default)]
    pub kubernetes: Option<KubernetesHandover>,
}

/// The largest hand-over record read from a node directory.
const MAX_HANDOVER_LEN: u64 = 1 << 20;

/// The hand-over record of `node` (`state/asterism/kubernetes.json`, what its bootstrapper
/// handed its Kubernetes driver); `None` when it wrote none.
fn read_handover(node: &Node) -> Result<Option<KubernetesHandover>> {
    let path = NodeDir::new(&node.dir).kubernetes_handover();
    if !path.exists() {
        return Ok(None);
    }
    let bytes = asterism_binkit::fs::read_capped(&path, MAX_HANDOVER_LEN)?;
    let record =
        KubernetesHandover::from_json(&bytes).with_context(|| path.display().to_string())?;
    Ok(Some(record))
}

/// The table's KUBERNETES column: `v1.31.13, 9 components (none driver: not installed)`.
fn handover_summary(handover: &KubernetesHandover) -> String {
    let version = handover
        .kubernetes_version
        .map_or_else(|| "no version".to_owned(), |v| v.to_string());
    let count = handover.kubernetes_components.len();
    let noun = if count == 1 {
        "component"
    } else {
        "components"
    };
    let installed = if handover.driver == "none" {
        "none driver: not installed".to_owned()
    } else {
        format!("{} driver", handover.driver)
    };
    format!("{version}, {count} {noun} ({installed})")
}

/// One node of a local cluster: its "machine" directory, address and TPM.
#[derive(Debug, Clone)]
pub struct Node {
    /// Node name (`control-plane-0`, `worker-0`, …).
    pub name: String,
    /// Whether it is the control-plane node.
    pub control_plane: bool,
    /// Its loopback address (`127.0.<net>.<n>`).
    pub ip: String,
    /// Its directory.
    pub dir: PathBuf,
    /// TCTI of its swtpm.
    pub tcti: String,
}

impl Node {
    /// `ControlPlane` or `Worker`.
    pub fn role(&self) -> &'static str {
        if self.control_plane {
            "ControlPlane"
        } else {
            "Worker"
        }
    }

    /// `host:port` of its recovery server.
    pub fn recover_endpoint(&self) -> String {
        format!("{}:{RECOVER_PORT}", self.ip)
    }

    /// Resets its TPM as a power cycle does: the swtpm restarts, PCRs are cleared, keys
    /// and NV contents stay.
    pub fn reset_tpm(&mut self) -> Result<()> {
        let cfg = SwtpmConfig::new(self.dir.join("tpm"))?.with_run_dir(self.dir.join("run"))?;
        let mut swtpm = SwtpmProcess::attach(&cfg)
            .with_context(|| format!("finding the swtpm of {}", self.name))?;
        swtpm
            .restart()
            .with_context(|| format!("restarting the swtpm of {}", self.name))?;
        self.tcti = swtpm.tcti();
        Ok(())
    }

    /// Kills its bootstrapper if one runs (SIGKILL: as abrupt as a power cut).
    pub fn kill_bootstrapper(&self) -> Result<()> {
        kill_pid_file(&self.dir.join("run/bootstrapper.pid"))
    }
}

fn step(msg: impl std::fmt::Display) {
    eprintln!("▸ {msg}");
}

fn bin_dir(args: &UpArgs) -> Result<PathBuf> {
    match &args.bin_dir {
        Some(d) => Ok(d.clone()),
        None => std::env::current_exe()
            .context("locating this executable")?
            .parent()
            .map(Path::to_path_buf)
            .context("this executable has no parent directory"),
    }
}

fn abs(path: &Path) -> Result<PathBuf> {
    std::path::absolute(path).with_context(|| format!("resolving {}", path.display()))
}

/// Creates `path` (it must not exist) with mode 0600 and `contents`, synced.
fn write_private(path: &Path, contents: &[u8]) -> Result<()> {
    Ok(asterism_binkit::write_new(path, contents, 0o600)?)
}

/// Runs a program to completion, its output appended to `log`; fails with the log's tail.
fn run_logged(program: &Path, args: &[OsString], log: &Path) -> Result<()> {
    let out = log_file(log)?;
    let status = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .status()
        .with_context(|| format!("running {}", program.display()))?;
    if !status.success() {
        bail!(
            "{} failed ({status}); its log ends:\n{}",
            program.display(),
            tail(log)
        );
    }
    Ok(())
}

fn log_file(path: &Path) -> Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines
        .get(lines.len().saturating_sub(15)..)
        .unwrap_or_default()
        .join("\n")
}

/// Starts a long-running service in its own process group (so that ^C on the terminal
/// does not reach it), output to `log`, pid recorded in `pid_file` for `mini down`.
fn spawn_service(program: &Path, args: &[OsString], log: &Path, pid_file: &Path) -> Result<Child> {
    let out = log_file(log)?;
    let child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {}", program.display()))?;
    std::fs::write(pid_file, format!("{}\n", child.id()))
        .with_context(|| format!("writing {}", pid_file.display()))?;
    Ok(child)
}

fn wait_until(what: &str, log: &Path, mut ready: impl FnMut() -> bool) -> Result<()> {
    let start = Instant::now();
    while !ready() {
        if start.elapsed() > STEP_DEADLINE {
            bail!(
                "{what} did not come up within {STEP_DEADLINE:?}; its log ends:\n{}",
                tail(log)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn tcp_ready(addr: &str) -> bool {
    addr.parse::<SocketAddr>()
        .ok()
        .and_then(|a| TcpStream::connect_timeout(&a, Duration::from_millis(200)).ok())
        .is_some()
}

/// A minimal HTTP/1.0 GET for the local metrics endpoint (bounded to 1 MiB).
fn http_get(addr: &str, path: &str) -> Result<String> {
    let body = http_get_raw(addr, path)?;
    let text = String::from_utf8_lossy(&body).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("malformed HTTP answer")?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        bail!("GET {path}: {}", head.lines().next().unwrap_or_default());
    }
    Ok(body.to_string())
}

/// The body of `GET path` over the Unix socket at `socket` (the join service's admin
/// socket), bounded to 1 MiB.
fn unix_http_get(socket: &Path, path: &str) -> Result<String> {
    let mut s = std::os::unix::net::UnixStream::connect(socket)
        .with_context(|| format!("connecting to {}", socket.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n"
    )?;
    let answer = asterism_binkit::fs::read_capped_from(&mut s, 1 << 20)?
        .context("the HTTP answer is larger than 1 MiB")?;
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("malformed HTTP answer")?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!("GET {path}: {}", head.lines().next().unwrap_or_default());
    }
    Ok(body.to_string())
}

/// The whole answer (status line, headers, body) to an HTTP/1.0 GET, bounded to 1 MiB.
fn http_get_raw(addr: &str, path: &str) -> Result<Vec<u8>> {
    let addr: SocketAddr = addr.parse().context("address")?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    asterism_binkit::fs::read_capped_from(&mut s, 1 << 20)?
        .context("the HTTP answer is larger than 1 MiB")
}

fn os(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Vec<OsString> {
    args.iter().map(|a| a.as_ref().to_os_string()).collect()
}

fn random_init_secret() -> Result<String> {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 24];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| anyhow::anyhow!("the system random generator failed"))?;
    Ok(hex::encode(bytes))
}

/// Checks that the binaries `programs` are in `bins` and swtpm is installed, then creates
/// the cluster directory (it must not exist) with `run/` and `log/`. Returns it, absolute.
fn create_cluster_dir(dir: &Path, bins: &Path, programs: &[&str]) -> Result<PathBuf> {
    for name in programs {
        let path = bins.join(name);
        if !path.is_file() {
            bail!(
                "{} is missing; build everything first: cargo build --workspace (or pass --bin-dir)",
                path.display()
            );
        }
    }
    asterism_swtpm::check_swtpm_installed(true).context("swtpm is needed for local clusters")?;
    if dir.exists() {
        bail!(
            "{} already exists: run `asterism mini down --dir {0}` and remove it, or choose another --dir",
            dir.display()
        );
    }
    std::fs::create_dir_all(dir)?;
    let dir = abs(dir)?;
    std::fs::create_dir_all(dir.join("run"))?;
    std::fs::create_dir_all(dir.join("log"))?;
    Ok(dir)
}

/// The name of node `i` (`control-plane-0` first, then `worker-0`, …) and whether it is
/// the control plane.
fn node_name(i: usize) -> (String, bool) {
    match i.checked_sub(1) {
        None => ("control-plane-0".to_string(), true),
        Some(w) => (format!("worker-{w}"), false),
    }
}

/// Creates the local platform CA in `<dir>/platform-ca`: what a cloud provider uses to
/// vouch for its (v)TPMs.
fn create_platform_ca(provision: &Path, dir: &Path) -> Result<PathBuf> {
    step("creating the local platform CA");
    let ca_dir = dir.join("platform-ca");
    run_logged(
        provision,
        &os(&[&"platform-ca", &"init", &"--dir", &ca_dir]),
        &dir.join("log/provision.log"),
    )?;
    Ok(ca_dir)
}

/// Creates the directory of node `name` and provisions its TPM state: EK with its
/// certificate, an AK certified by the platform CA. Returns the directory.
fn provision_node(provision: &Path, ca_dir: &Path, dir: &Path, name: &str) -> Result<PathBuf> {
    let ndir = dir.join("nodes").join(name);
    for sub in ["tpm", "attestation", "state", "run", "log"] {
        std::fs::create_dir_all(ndir.join(sub))?;
    }
    step(format!(
        "provisioning {name}: swtpm with EK, AK certified by the platform CA"
    ));
    run_logged(
        provision,
        &os(&[
            &"node",
            &"--state-dir",
            &ndir.join("tpm"),
            &"--ca-dir",
            &ca_dir,
            &"--out",
            &ndir.join("attestation"),
        ]),
        &ndir.join("log/provision.log"),
    )?;
    Ok(ndir)
}

/// Picks a random init secret (`<dir>/init-secret`, 0600) and starts the metadata service
/// on `addr` with `instances` (each node with its VPC IP) and the secret's bcrypt hash.
/// Returns the init secret's file.
fn start_metadata_service(
    program: &Path,
    dir: &Path,
    addr: &str,
    instances: &[(&Node, &str)],
) -> Result<PathBuf> {
    step(format!("starting the metadata service on {addr}"));
    let init_secret = random_init_secret()?;
    let init_secret_file = dir.join("init-secret");
    write_private(&init_secret_file, init_secret.as_bytes())?;
    let hash = bcrypt::hash(&init_secret, 10).context("hashing the init secret")?;
    let instances: Vec<serde_json::Value> = instances
        .iter()
        .map(|(n, vpc_ip)| {
            serde_json::json!({
                "Name": n.name, "ProviderID": format!("asterism-local:///{}", n.name),
                "Role": n.role(), "VPCIP": vpc_ip, "SecondaryIPRange": "", "AliasIPRanges": [],
            })
        })
        .collect();
    let meta_cfg = dir.join("metadata.json");
    std::fs::write(
        &meta_cfg,
        serde_json::to_vec_pretty(
            &serde_json::json!({"instances": instances, "initSecretHash": hash}),
        )?,
    )?;
    let meta_log = dir.join("log/metadata.log");
    spawn_service(
        program,
        &os(&[&"--listen", &addr, &"--config", &meta_cfg]),
        &meta_log,
        &dir.join("run/metadata.pid"),
    )?;
    wait_until("the metadata service", &meta_log, || tcp_ready(addr))?;
    Ok(init_secret_file)
}

/// A local cluster under construction or running: what `mini up` builds step by step, and
/// what tests drive one step at a time.
#[derive(Debug)]
pub struct LocalCluster {
    /// The cluster directory (absolute).
    pub dir: PathBuf,
    bins: PathBuf,
    /// The nodes; the first is the control plane.
    pub nodes: Vec<Node>,
    /// The platform CA certificate (PEM).
    pub platform_ca: PathBuf,
    /// The expected measurements of a fresh node.
    pub measurements: PathBuf,
    /// What joining nodes expect of the join service.
    pub join_measurements: PathBuf,
    /// The init secret (mode 0600).
    pub init_secret_file: PathBuf,
    /// Where `asterism init` writes the workspace.
    pub workspace: PathBuf,
    /// The metadata service's address.
    pub metadata_addr: String,
}

impl LocalCluster {
    fn bin(&self, name: &str) -> PathBuf {
        self.bins.join(name)
    }

    /// Creates the cluster directory, the platform CA and every node's provisioned swtpm
    /// (started, detached), the init secret, the metadata service (started) and the join
    /// service's expected measurements.
    pub fn create(dir: &Path, workers: usize, net: u8, bins: PathBuf) -> Result<Self> {
        let metadata_addr = format!("127.0.{net}.254:{METADATA_PORT}");
        let bin = |name: &str| bins.join(name);
        let dir = create_cluster_dir(
            dir,
            &bins,
            &[
                "asterism-provision",
                "asterism-metadata",
                "asterism-bootstrapper",
                "asterism-key-service",
                "asterism-join-service",
                "asterism-verify-service",
            ],
        )?;
        let ca_dir = create_platform_ca(&bin("asterism-provision"), &dir)?;

        // Nodes: an swtpm each, provisioned with an AK certified by the platform CA.
        let mut nodes = Vec::new();
        for i in 0..=workers {
            let (name, control_plane) = node_name(i);
            let ndir = provision_node(&bin("asterism-provision"), &ca_dir, &dir, &name)?;
            let cfg = SwtpmConfig::new(ndir.join("tpm"))?.with_run_dir(ndir.join("run"))?;
            let swtpm = SwtpmProcess::start_detached(&cfg)
                .with_context(|| format!("starting swtpm for {name}"))?;
            nodes.push(Node {
                name,
                control_plane,
                ip: format!("127.0.{net}.{}", i + 1),
                dir: ndir,
                tcti: swtpm.tcti(),
            });
        }
        let cp = nodes.first().context("no nodes")?;
        let platform_ca = ca_dir.join("platform-ca.pem");
        let measurements = cp.dir.join("attestation/measurements.json");

        let instances: Vec<(&Node, &str)> = nodes.iter().map(|n| (n, n.ip.as_str())).collect();
        let init_secret_file =
            start_metadata_service(&bin("asterism-metadata"), &dir, &metadata_addr, &instances)?;

        // The join service's own evidence (mutual aTLS) comes from the control-plane TPM
        // after init, when PCR 15 holds the cluster marker. The file leaves PCR 15 out:
        // the bootstrappers are given the cluster ID after init (--cluster-id) and enforce
        // its marker in PCR 15 themselves, on top of every other measured PCR.
        let join_measurements = dir.join("join-service-measurements.json");
        write_join_service_measurements(&measurements, &join_measurements)?;

        Ok(Self {
            metadata_addr,
            workspace: dir.join("workspace"),
            dir,
            bins,
            nodes,
            platform_ca,
            measurements,
            join_measurements,
            init_secret_file,
        })
    }

    /// The control-plane node.
    pub fn control_plane(&self) -> Result<&Node> {
        self.nodes.first().context("no nodes")
    }

    /// The cluster ID once `asterism init` has written it to the workspace.
    pub fn cluster_id(&self) -> Option<String> {
        let text = std::fs::read_to_string(self.workspace.join("cluster-id")).ok()?;
        Some(text.trim().to_owned())
    }

    /// The control plane's public key once `asterism init` has written it to the workspace.
    pub fn control_plane_key(&self) -> Option<String> {
        let text = std::fs::read_to_string(self.workspace.join("control-plane-key")).ok()?;
        Some(text.trim().to_owned())
    }

    /// Starts the bootstrapper of `node`. After init it is told the cluster ID, so that it
    /// joins (or rejoins) only through a join service marked with this cluster; before
    /// init (the control plane's first boot) it has no cluster to join and waits for Init.
    pub fn start_bootstrapper(&self, node: &Node) -> Result<Booting> {
        start_bootstrapper(
            &self.bin("asterism-bootstrapper"),
            node,
            &self.metadata_addr,
            &self.platform_ca,
            &self.join_measurements,
            self.cluster_id().as_deref(),
            self.control_plane_key().as_deref(),
        )
    }

    /// Waits for a bootstrapper to exit: `(milliseconds since its start, "ok" or the exit
    /// status)`. Asynchronous, so that connections of this process (the CLI's to the
    /// control plane, say) keep being served meanwhile: a stopping InitServer waits for its
    /// client to acknowledge the connection's shutdown.
    pub async fn finish_bootstrapper(
        &self,
        booting: Booting,
        node: &Node,
    ) -> Result<(u64, String)> {
        finish_bootstrapper(booting, node).await
    }

    /// Boots the control-plane node and runs `asterism init` against it.
    pub async fn init(&self) -> Result<(asterism::init::Initialised, (u64, String))> {
        self.init_with(self.init_args()).await
    }

    /// [`Self::init`] with arguments of the caller's (from [`Self::init_args`], changed).
    pub async fn init_with(
        &self,
        args: asterism::init::Args,
    ) -> Result<(asterism::init::Initialised, (u64, String))> {
        let cp = self.control_plane()?;
        let booting = self.start_bootstrapper(cp)?;
        let cp_init = format!("{}:{INIT_PORT}", cp.ip);
        wait_until(
            "the control-plane bootstrapper",
            &cp.dir.join("log/bootstrapper.log"),
            || tcp_ready(&cp_init),
        )?;
        step(format!("asterism init → {cp_init}"));
        let done = asterism::init::run(args).await?;
        let result = self.finish_bootstrapper(booting, cp).await?;
        Ok((done, result))
    }

    /// The arguments `asterism init` gets against this cluster's control plane.
    pub fn init_args(&self) -> asterism::init::Args {
        let ip = self.nodes.first().map(|n| n.ip.clone()).unwrap_or_default();
        asterism::init::Args {
            endpoint: format!("{ip}:{INIT_PORT}"),
            init_secret_file: self.init_secret_file.clone(),
            workspace: self.workspace.clone(),
            cluster_name: "asterism-mini".into(),
            kubernetes_version: asterism::init::DEFAULT_REQUEST,
            apiserver_cert_sans: Vec::new(),
            timeout_secs: 120,
            trust: asterism::trust::TrustArgs::platform_ca(&self.platform_ca, &self.measurements),
            recovery_shares: None,
            recovery_recipients: Vec::new(),
            no_master_secret_file: false,
            host_cluster_services: false,
        }
    }

    /// Starts the key service on the control-plane node (after init).
    /// Its secrets are those [`Self::provide_key_service_secrets`] left on the node, or else
    /// the workspace's master-secret file.
    pub fn start_key_service(&self) -> Result<()> {
        let cp = self.control_plane()?;
        let secrets = cp.dir.join("run/secrets");
        if !secrets.exists() {
            self.provide_key_service_secrets(&workspace_kms(&self.workspace)?)?;
        }
        let ks_sock = cp.dir.join("run/key-service.sock");
        step("starting the key service (Unix socket on the control-plane node)");
        let ks_log = cp.dir.join("log/key-service.log");
        spawn_service(
            &self.bin("asterism-key-service"),
            &os(&[
                &"--master-secret-file",
                &secrets.join("mastersecret"),
                &"--salt-file",
                &secrets.join("salt"),
                &"--listen",
                &format!("unix:{}", ks_sock.display()),
            ]),
            &ks_log,
            &self.dir.join("run/key-service.pid"),
        )?;
        wait_until("the key service", &ks_log, || ks_sock.exists())
    }

    /// Leaves the key service's secrets on the control-plane node: the master secret and
    /// salt of `kms`, and the workspace's measurement salt. What the owner deploys with the
    /// key service after init; `start_key_service` takes them from the workspace's
    /// master-secret file when this was not called (a workspace that keeps only custodian
    /// shares has none).
    pub fn provide_key_service_secrets(&self, kms: &asterism_kms::ClusterKms) -> Result<()> {
        let cp = self.control_plane()?;
        let secrets = cp.dir.join("run/secrets");
        std::fs::create_dir_all(&secrets)?;
        std::fs::set_permissions(&secrets, std::fs::Permissions::from_mode(0o700))?;
        write_private(
            &secrets.join("mastersecret"),
            kms.master_secret().expose_secret(),
        )?;
        write_private(&secrets.join("salt"), kms.salt().expose_secret())?;
        write_private(
            &secrets.join("measurementSalt"),
            &read_measurement_salt(&self.workspace)?,
        )?;
        Ok(())
    }

    /// The join service's metrics address.
    pub fn metrics_addr(&self) -> String {
        let ip = self.nodes.first().map(|n| n.ip.clone()).unwrap_or_default();
        format!("{ip}:{METRICS_PORT}")
    }

    /// The join service's admin socket (`asterism readmit --admin-socket`).
    pub fn admin_socket(&self) -> PathBuf {
        self.dir.join("run/join-admin.sock")
    }

    /// Starts the join service on the control-plane node (after the key service).
    pub fn start_join_service(&self) -> Result<()> {
        let cp = self.control_plane()?;
        let secrets = cp.dir.join("run/secrets");
        step(format!(
            "starting the join service on {}:{JOIN_PORT}",
            cp.ip
        ));
        let js_log = cp.dir.join("log/join-service.log");
        let join_addr = format!("{}:{JOIN_PORT}", cp.ip);
        let metrics_addr = self.metrics_addr();
        spawn_service(
            &self.bin("asterism-join-service"),
            &os(&[
                &"--listen",
                &join_addr,
                &"--metrics-listen",
                &metrics_addr,
                &"--platform-ca",
                &self.platform_ca,
                &"--measurements",
                &self.measurements,
                &"--key-service",
                &format!("unix:{}", cp.dir.join("run/key-service.sock").display()),
                &"--pki-dir",
                &NodeDir::new(&cp.dir).kubernetes_pki(),
                &"--measurement-salt-file",
                &secrets.join("measurementSalt"),
                &"--state-dir",
                &cp.dir.join("run/join-service"),
                &"--init-node",
                &NodeDir::new(&cp.dir).init_node_record(),
                &"--admin-socket",
                &self.admin_socket(),
                &"--metadata-url",
                &format!("http://{}", self.metadata_addr),
                &"--tpm",
                &cp.tcti,
                &"--ak-cert",
                &cp.dir.join("attestation/ak-cert.der"),
            ]),
            &js_log,
            &self.dir.join("run/join-service.pid"),
        )?;
        wait_until("the join service", &js_log, || {
            http_get(&metrics_addr, "/healthz").is_ok()
        })
    }

    /// Stops the join service (SIGKILL: as abrupt as a crash).
    pub fn kill_join_service(&self) -> Result<()> {
        kill_pid_file(&self.dir.join("run/join-service.pid"))
    }

    /// A whole-cluster outage (a power cut): the key, join and verify services and every
    /// bootstrapper killed, every node's TPM reset. Disks, node directories and the
    /// workspace stay; the swtpm processes run on, as the TPMs of powered-on machines.
    pub fn outage(&mut self) -> Result<()> {
        step("outage: every service and bootstrapper killed, every TPM reset");
        kill_pid_file(&self.dir.join("run/join-service.pid"))?;
        kill_pid_file(&self.dir.join("run/key-service.pid"))?;
        let _ = std::fs::remove_file(self.control_plane()?.dir.join("run/key-service.sock"));
        for n in &mut self.nodes {
            kill_pid_file(&n.dir.join("run/verify-service.pid"))?;
            n.kill_bootstrapper()?;
            n.reset_tpm()?;
        }
        Ok(())
    }

    /// Starts every node's verify service.
    pub fn start_verify_services(&self) -> Result<()> {
        for n in &self.nodes {
            let log = n.dir.join("log/verify-service.log");
            let addr = format!("{}:{VERIFY_PORT}", n.ip);
            spawn_service(
                &self.bin("asterism-verify-service"),
                &os(&[
                    &"--listen",
                    &addr,
                    &"--tpm",
                    &n.tcti,
                    &"--ak-cert",
                    &n.dir.join("attestation/ak-cert.der"),
                ]),
                &log,
                &n.dir.join("run/verify-service.pid"),
            )?;
            wait_until("a verify service", &log, || tcp_ready(&addr))?;
        }
        Ok(())
    }

    /// The members the join service admitted (its `/v1/members`, on the admin socket: the
    /// loopback HTTP listener, which every node of mini reaches, does not serve it).
    pub fn members(&self) -> serde_json::Value {
        unix_http_get(&self.admin_socket(), "/v1/members")
            .ok()
            .and_then(|b| serde_json::from_str(&b).ok())
            .unwrap_or(serde_json::Value::Null)
    }

    /// The join service's signed list of control-plane members (`/v1/control-plane`, on the
    /// admin socket), as the owner's `asterism control-plane sync` takes it.
    pub fn signed_control_plane_list(&self) -> Result<String> {
        unix_http_get(&self.admin_socket(), "/v1/control-plane")
    }

    /// Checks every node independently and records the outcome in `<dir>/mini.json`.
    pub fn record(&self, cluster_id: &str, results: &[(u64, String)]) -> Result<ClusterRecord> {
        self.record_with_members(cluster_id, results, &self.members())
    }

    /// [`Self::record`] with the join service's member list (`[{"name", "ak"}]`) given.
    pub fn record_with_members(
        &self,
        cluster_id: &str,
        results: &[(u64, String)],
        members: &serde_json::Value,
    ) -> Result<ClusterRecord> {
        let kms = workspace_kms(&self.workspace)?;
        let mut record = ClusterRecord {
            cluster_id: cluster_id.to_string(),
            nodes: Vec::new(),
        };
        for (n, (ms, exit)) in self.nodes.iter().zip(results) {
            let disk_rekeyed = disk_rekeyed(&kms, n).unwrap_or_else(|e| {
                eprintln!("  {}: disk check failed: {e:#}", n.name);
                false
            });
            let attestation = if n.control_plane {
                "verified by asterism init (tpm-quote)".to_string()
            } else {
                member_verdict(members, &n.name)
            };
            record.nodes.push(NodeRecord {
                name: n.name.clone(),
                role: n.role().into(),
                ip: n.ip.clone(),
                attestation,
                disk_rekeyed,
                bootstrap_ms: *ms,
                exit: exit.clone(),
                kubernetes: read_handover(n).unwrap_or_else(|e| {
                    eprintln!("  {}: {e:#}", n.name);
                    None
                }),
            });
        }
        std::fs::write(
            self.dir.join("mini.json"),
            serde_json::to_vec_pretty(&record)?,
        )?;
        Ok(record)
    }

    /// The derived disk key of `node` (from the workspace's master secret).
    pub fn derived_disk_key(&self, node: &Node) -> Result<asterism_kms::DataKey> {
        let kms = workspace_kms(&self.workspace)?;
        let disk = asterism_disk::StateDisk::open(
            NodeDir::new(&node.dir).state_image(),
            asterism_disk::DiskConfig::local(),
        )?;
        let uuid = disk.uuid()?;
        Ok(kms.data_key(
            &asterism_kms::KeyId::Disk(uuid),
            asterism_kms::STATE_DISK_KEY_LEN,
        )?)
    }

    /// Stops every process of the cluster.
    pub fn down(&self) -> Result<()> {
        down(DirArgs {
            dir: self.dir.clone(),
        })
    }
}

/// `asterism mini up`.
pub async fn up(args: UpArgs) -> Result<()> {
    if args.vm {
        return vm::up(&args).await;
    }
    let started = Instant::now();
    let cluster = LocalCluster::create(&args.dir, args.workers, args.net, bin_dir(&args)?)?;
    let (done, cp_result) = cluster.init().await?;
    cluster.start_key_service()?;
    cluster.start_join_service()?;

    // Workers boot and join, all at once.
    step(format!("{} workers join", cluster.nodes.len() - 1));
    let mut booting = Vec::new();
    for n in cluster.nodes.iter().skip(1) {
        booting.push(cluster.start_bootstrapper(n)?);
    }
    let mut results = vec![cp_result];
    for (b, n) in booting.into_iter().zip(cluster.nodes.iter().skip(1)) {
        results.push(cluster.finish_bootstrapper(b, n).await?);
    }
    cluster.start_verify_services()?;

    // Check every node independently: the disk opens with the key derived from the master
    // secret (and no longer with its first-boot passphrase); the join service lists each
    // worker with its verified attestation key.
    let record = cluster.record(&done.cluster_id, &results)?;
    let checked = cluster.nodes.last().context("no nodes")?;
    finish(&cluster, &record, started, checked, "", "nodes/*/log")
}

/// The end of `up`, in either mode: the table, where the cluster's files are, how to check
/// `checked` and stop the cluster, and an error unless every node bootstrapped cleanly
/// (`logs`: where each node's log is, under the cluster's directory).
fn finish(
    cluster: &LocalCluster,
    record: &ClusterRecord,
    started: Instant,
    checked: &Node,
    more: &str,
    logs: &str,
) -> Result<()> {
    print_table(record);
    eprintln!(
        "local cluster up in {:.1} s; workspace {}\n{more}  check a node: asterism verify --endpoint {}:{VERIFY_PORT} --workspace {} --platform-ca {} --measurements {}\n  stop it:      asterism mini down --dir {}",
        started.elapsed().as_secs_f64(),
        cluster.workspace.display(),
        checked.ip,
        cluster.workspace.display(),
        cluster.platform_ca.display(),
        cluster.measurements.display(),
        cluster.dir.display()
    );
    if record
        .nodes
        .iter()
        .any(|n| !n.disk_rekeyed || n.exit != "ok")
    {
        bail!(
            "not every node bootstrapped cleanly (see the table and {}/{logs})",
            cluster.dir.display()
        );
    }
    Ok(())
}

/// A bootstrapper process that has been started.
#[derive(Debug)]
pub struct Booting {
    child: Child,
    started: Instant,
}

fn start_bootstrapper(
    program: &Path,
    n: &Node,
    metadata_addr: &str,
    platform_ca: &Path,
    join_measurements: &Path,
    cluster_id: Option<&str>,
    control_plane_key: Option<&str>,
) -> Result<Booting> {
    step(format!(
        "starting the bootstrapper of {} ({})",
        n.name, n.ip
    ));
    let log = n.dir.join("log/bootstrapper.log");
    let started = Instant::now();
    // The cluster ID and the control plane's key go together: a node joins only through a
    // join service of this cluster that signs as its control plane.
    let cluster: Vec<&dyn AsRef<std::ffi::OsStr>> = match (&cluster_id, &control_plane_key) {
        (Some(id), Some(key)) => vec![&"--cluster-id", id, &"--control-plane-key", key],
        (Some(_), None) => {
            bail!("the workspace has a cluster ID but no control-plane-key; re-create the cluster")
        }
        (None, _) => Vec::new(),
    };
    let child = spawn_service(
        program,
        &os(&[
            &"--node-dir",
            &n.dir,
            &"--node-ip",
            &n.ip,
            &"--tpm",
            &n.tcti,
            &"--ak-cert",
            &n.dir.join("attestation/ak-cert.der"),
            &"--metadata-url",
            &format!("http://{metadata_addr}"),
            &"--kubernetes-driver",
            &"none",
            &"--join-retry-interval",
            &"1s",
            &"--verify-join-service-measurements",
            &join_measurements,
            &"--platform-ca",
            &platform_ca,
            &"--insecure-fast-disk-kdf",
        ])
        .into_iter()
        .chain(os(&cluster))
        .collect::<Vec<_>>(),
        &log,
        &n.dir.join("run/bootstrapper.pid"),
    )?;
    Ok(Booting { child, started })
}

async fn finish_bootstrapper(mut b: Booting, n: &Node) -> Result<(u64, String)> {
    let log = n.dir.join("log/bootstrapper.log");
    loop {
        if let Some(status) = b.child.try_wait()? {
            let ms = u64::try_from(b.started.elapsed().as_millis()).unwrap_or(u64::MAX);
            let _ = std::fs::remove_file(n.dir.join("run/bootstrapper.pid"));
            let exit = if status.success() {
                "ok".to_string()
            } else {
                status.to_string()
            };
            if !status.success() {
                eprintln!(
                    "  {} bootstrapper failed ({status}); its log ends:\n{}",
                    n.name,
                    tail(&log)
                );
            }
            return Ok((ms, exit));
        }
        if b.started.elapsed() > STEP_DEADLINE {
            let _ = b.child.kill();
            let _ = b.child.wait();
            bail!(
                "the bootstrapper of {} did not finish within {STEP_DEADLINE:?}; its log ends:\n{}",
                n.name,
                tail(&log)
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The workspace's measurement salt (`cluster.json`), 32 bytes.
/// Writes what joining nodes expect of the join service: the control plane's measurements
/// in `measurements` without PCR 15, which holds the cluster's marker there. Nodes started
/// after init get `--cluster-id` and enforce the marker themselves.
fn write_join_service_measurements(measurements: &Path, dest: &Path) -> Result<()> {
    let m = asterism_attestation::Measurements::load(measurements)?;
    let without_marker = asterism_attestation::Measurements::new(
        m.iter()
            .filter(|(i, _)| i.get() != 15)
            .map(|(i, e)| (i, *e)),
    )?;
    std::fs::write(dest, without_marker.to_json())?;
    Ok(())
}

fn read_measurement_salt(ws: &Path) -> Result<Vec<u8>> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Cluster {
        measurement_salt: String,
    }
    let path = ws.join("cluster.json");
    let c: Cluster = serde_json::from_slice(
        &std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?,
    )
    .with_context(|| format!("{}", path.display()))?;
    hex::decode(c.measurement_salt).with_context(|| format!("{}: measurementSalt", path.display()))
}

/// The cluster's KMS from the workspace's master-secret file (checked as `asterism
/// recover` checks it: private, well-formed).
fn workspace_kms(ws: &Path) -> Result<asterism_kms::ClusterKms> {
    asterism::recover::read_master_secret(&ws.join("master-secret.json"))
}

/// The node's disk opens with the key derived from the master secret for its UUID, that
/// key is the only keyslot left (the first-boot passphrase's slot is gone), and the header
/// says the disk is initialised.
fn disk_rekeyed(kms: &asterism_kms::ClusterKms, n: &Node) -> Result<bool> {
    let img = NodeDir::new(&n.dir).state_image();
    let disk = asterism_disk::StateDisk::open(&img, asterism_disk::DiskConfig::local())?;
    let uuid = disk.uuid()?;
    let key = kms.data_key(
        &asterism_kms::KeyId::Disk(uuid),
        asterism_kms::STATE_DISK_KEY_LEN,
    )?;
    let header = disk.validated_header()?;
    Ok(disk.check_key(&key)? && header.keyslots().len() == 1 && disk.is_initialized()?)
}

fn member_verdict(members: &serde_json::Value, name: &str) -> String {
    let found = members
        .as_array()
        .or_else(|| members.get("members").and_then(|m| m.as_array()))
        .and_then(|list| {
            list.iter()
                .find(|m| m.get("name").and_then(|v| v.as_str()) == Some(name))
        });
    match found {
        Some(m) => {
            let ak = m.get("ak").and_then(|v| v.as_str()).unwrap_or("?");
            format!(
                "verified by join service (tpm-quote AK {})",
                ak.get(..12).unwrap_or(ak)
            )
        }
        None => "not admitted".to_string(),
    }
}

/// The node table: one line per node, its Kubernetes hand-over last.
#[must_use]
pub fn table(r: &ClusterRecord) -> String {
    let mut out = format!("cluster {}\n", r.cluster_id);
    out.push_str(&format!(
        "{:<16} {:<13} {:<52} {:<13} {:>9}  {:<6} KUBERNETES\n",
        "NODE", "ROLE", "ATTESTATION", "DISK RE-KEYED", "JOIN (ms)", "EXIT"
    ));
    for n in &r.nodes {
        let kubernetes = n
            .kubernetes
            .as_ref()
            .map_or_else(|| "- (nothing recorded)".to_owned(), handover_summary);
        out.push_str(&format!(
            "{:<16} {:<13} {:<52} {:<13} {:>9}  {:<6} {}\n",
            n.name,
            n.role,
            n.attestation,
            if n.disk_rekeyed { "yes" } else { "NO" },
            n.bootstrap_ms,
            n.exit,
            kubernetes
        ));
    }
    out
}

/// Prints the node table.
pub fn print_table(r: &ClusterRecord) {
    let _ = std::io::stdout().lock().write_all(table(r).as_bytes());
}

/// One process of the cluster, as `status --json` lists it.
#[derive(Serialize, Debug)]
struct ProcessStatus {
    /// Its pid file, relative to the cluster directory.
    pid_file: String,
    pid: u32,
    running: bool,
}

/// `asterism mini status`: the table (or, with `--json`, the record with every node's
/// components in full) and the cluster's processes.
pub fn status(args: StatusArgs) -> Result<()> {
    let dir = abs(&args.cluster.dir)?;
    let record: ClusterRecord = serde_json::from_slice(
        &std::fs::read(dir.join("mini.json"))
            .with_context(|| format!("no local cluster recorded in {}", dir.display()))?,
    )?;
    let processes: Vec<ProcessStatus> = pid_files(&dir)?
        .into_iter()
        .map(|(pid_file, pid)| ProcessStatus {
            pid_file,
            pid,
            running: alive(pid),
        })
        .collect();
    let mut out = std::io::stdout().lock();
    if args.json {
        let report = serde_json::json!({ "cluster": record, "processes": processes });
        writeln!(out, "{report:#}")?;
        return Ok(());
    }
    out.write_all(table(&record).as_bytes())?;
    for p in &processes {
        let state = if p.running { "running" } else { "stopped" };
        writeln!(out, "{:<40} pid {:<8} {state}", p.pid_file, p.pid)?;
    }
    Ok(())
}

/// Every pid file of the cluster: services under `run/`, swtpm and bootstrappers under
/// `nodes/*/run/`.
fn pid_files(dir: &Path) -> Result<Vec<(String, u32)>> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.join("run")];
    if let Ok(nodes) = std::fs::read_dir(dir.join("nodes")) {
        for n in nodes.flatten() {
            dirs.push(n.path().join("run"));
        }
    }
    for d in dirs {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            if path.extension().and_then(|x| x.to_str()) != Some("pid") {
                continue;
            }
            if let Some(pid) = std::fs::read_to_string(&path)
                .ok()
                .and_then(|t| t.trim().parse::<u32>().ok())
            {
                found.push((
                    path.strip_prefix(dir)
                        .unwrap_or(&path)
                        .display()
                        .to_string(),
                    pid,
                ));
            }
        }
    }
    found.sort();
    Ok(found)
}

/// Kills (SIGKILL) the process a pid file names, waits for it to be gone and removes the
/// file; nothing to do without the file.
fn kill_pid_file(path: &Path) -> Result<()> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(());
    };
    let pid: u32 = text
        .trim()
        .parse()
        .with_context(|| format!("{} holds no pid", path.display()))?;
    signal(pid, "KILL");
    let start = Instant::now();
    while alive(pid) {
        if start.elapsed() > Duration::from_secs(5) {
            bail!("pid {pid} ({}) survived SIGKILL", path.display());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = std::fs::remove_file(path);
    Ok(())
}

fn alive(pid: u32) -> bool {
    // A zombie has exited: only a process that is not in state Z counts.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit_once(") ")
                .is_some_and(|(_, rest)| !rest.starts_with('Z'))
        })
        .unwrap_or(false)
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("sh")
        .args([
            "-c",
            &format!("kill -{sig} \"$1\" 2>/dev/null"),
            "sh",
            &pid.to_string(),
        ])
        .status();
}

/// `asterism mini down`: stops every process the cluster started; nothing keeps running.
pub fn down(args: DirArgs) -> Result<()> {
    let dir = abs(&args.dir)?;
    if !dir.exists() {
        bail!("no local cluster at {}", dir.display());
    }
    let procs = pid_files(&dir)?;
    for (_, pid) in &procs {
        if alive(*pid) {
            signal(*pid, "TERM");
        }
    }
    let start = Instant::now();
    while procs.iter().any(|(_, p)| alive(*p)) && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
    }
    for (what, pid) in &procs {
        if alive(*pid) {
            eprintln!("{what} (pid {pid}) ignored SIGTERM; killing it");
            signal(*pid, "KILL");
        }
    }
    let start = Instant::now();
    while procs.iter().any(|(_, p)| alive(*p)) && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left: Vec<_> = procs.iter().filter(|(_, p)| alive(*p)).collect();
    if !left.is_empty() {
        bail!("still running: {left:?}");
    }
    for (what, _) in &procs {
        let _ = std::fs::remove_file(dir.join(what));
    }
    eprintln!(
        "stopped {} processes; the cluster's files stay in {} (remove the directory to start afresh)",
        procs.len(),
        dir.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    fn node(kubernetes: Option<KubernetesHandover>) -> NodeRecord {
        NodeRecord {
            name: "worker-0".into(),
            role: "Worker".into(),
            ip: "127.0.10.2".into(),
            attestation: "verified by join service (tpm-quote AK 3f0c)".into(),
            disk_rekeyed: true,
            bootstrap_ms: 1234,
            exit: "ok".into(),
            kubernetes,
        }
    }

    #[test]
    fn the_table_names_the_version_and_count_and_that_the_none_driver_installed_nothing() {
        let handed = KubernetesHandover {
            driver: "none".into(),
            kubernetes_version: Some(asterism_kubernetes_versions::KubernetesVersion::new(
                1, 31, 13,
            )),
            kubernetes_components: vec![asterism_kubernetes_versions::Component::default(); 9],
        };
        let record = ClusterRecord {
            cluster_id: "ab".into(),
            nodes: vec![node(Some(handed.clone())), node(None)],
        };
        let text = table(&record);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[1].ends_with("EXIT   KUBERNETES"), "{text}");
        assert!(
            lines[2].ends_with("ok     v1.31.13, 9 components (none driver: not installed)"),
            "{text}"
        );
        assert!(lines[3].ends_with("- (nothing recorded)"), "{text}");
        let kubeadm = KubernetesHandover {
            driver: "kubeadm".into(),
            kubernetes_version: None,
            kubernetes_components: vec![asterism_kubernetes_versions::Component::default()],
        };
        assert_eq!(
            handover_summary(&kubeadm),
            "no version, 1 component (kubeadm driver)"
        );
    }

    #[test]
    fn a_record_of_an_older_mini_still_reads() {
        let old = r#"{"cluster_id":"ab","nodes":[{"name":"worker-0","role":"Worker",
            "ip":"127.0.10.2","attestation":"x","disk_rekeyed":true,"bootstrap_ms":1,"exit":"ok"}]}"#;
        let record: ClusterRecord = serde_json::from_str(old).unwrap();
        assert!(record.nodes[0].kubernetes.is_none());
    }
}

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

mod args;
mod pids;
mod process;
mod provision;
mod status;
pub mod timing;
pub mod vm;

use anyhow::{Context, Result, bail};
use asterism_cluster::NodeDir;
use asterism_swtpm::{SwtpmConfig, SwtpmProcess};
use serde::Deserialize;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

pub use args::{DirArgs, StatusArgs, UpArgs};
pub use pids::down;
use pids::kill_pid_file;
use process::{
    http_get, http_get_raw, os, spawn_service, tail, tcp_ready, unix_http_get, wait_until,
};
use provision::{
    create_cluster_dir, create_platform_ca, node_name, provision_node, random_init_secret,
};
pub use status::{ClusterRecord, NodeRecord, print_table, status, table};
use status::{member_verdict, read_handover};

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
                &NodeDir::new(&cp.dir).ak_certificate(),
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
                    &NodeDir::new(&n.dir).ak_certificate(),
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
            &NodeDir::new(&n.dir).ak_certificate(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::handover_summary;
    use asterism_cluster::KubernetesHandover;

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

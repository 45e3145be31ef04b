//! `asterism-bootstrapper`: bootstraps one node (boot phase, then InitServer and JoinClient
//! until the node lock is taken and the node is initialised or joined).
//!
//! Exit status: 0 bootstrapped (or already was), 1 failed before the point of no return,
//! 2 usage error, 3 failed after the point of no return (state disk marked for reset;
//! reboot the node), 4 stopped by a signal before the node lock.
#![forbid(unsafe_code)]

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use asterism_attestation::tpm::CvmPlatform;
use asterism_binkit::{LogFormat, logging, shutdown_signal};
use asterism_bootstrapper::platform;
use asterism_bootstrapper::{
    Config, KubeadmDriver, KubeadmDriverConfig, KubernetesDriver, LogBuffer, LuksDisk, Node,
    NodeDir, Outcome, TpmMarker, UnlockMode,
};
use asterism_disk::{DiskConfig, FileSystemConfig, Integrity, Pbkdf, StateDisk, StateFileSystem};
use asterism_metadata::AnyMetadata;
use asterism_metadata::imds::Imds;
use asterism_tpm::{PcrSelection, Tpm, TpmConfig, TpmIssuer};
use clap::{Parser, ValueEnum};
use tracing::Level;
use tracing_subscriber::{EnvFilter, Layer as _};

/// Bootstraps this node into a cluster: serves Init on the node's address and, in parallel,
/// asks the cluster's join services for a join ticket; whichever comes first wins.
#[derive(Debug, Parser)]
#[command(name = "asterism-bootstrapper", version)]
struct Args {
    /// The node directory (`state.img`, `state/`, `attestation/`, …).
    #[arg(long, value_name = "DIR")]
    node_dir: PathBuf,

    /// The node's address: the InitServer listens on it, and connections to join services
    /// leave from it.
    #[arg(long, value_name = "IP")]
    node_ip: IpAddr,

    /// The TPM: `device:/dev/tpmrm0`, `swtpm:host=127.0.0.1,port=2321`, …
    #[arg(long, value_name = "TCTI", default_value = "device:/dev/tpmrm0")]
    tpm: TpmConfig,

    /// The TCG event log sent with every quote, so that verifiers can replay it and name the
    /// event behind a PCR that differs. Default: the kernel's securityfs file
    /// (`/sys/kernel/security/tpm0/binary_bios_measurements`) when --tpm is a device, skipped
    /// when it is not there; none for a software TPM, whose PCRs no firmware measured.
    #[arg(long, value_name = "PATH")]
    event_log: Option<PathBuf>,

    /// The AK certificate (DER) sent with the node's evidence; default
    /// `<node dir>/attestation/ak-cert.der` if it exists.
    #[arg(long, value_name = "PATH")]
    ak_cert: Option<PathBuf>,

    /// Where this node's record, the control plane and the init secret's hash come from:
    /// the metadata service (`http://HOST:PORT`), or on GCE `gce://PROJECT/CLUSTER`
    /// (docs/metadata.md).
    #[arg(long, value_name = "URL", default_value = "http://127.0.10.254:8080")]
    metadata_url: String,

    /// This node is a confidential VM (azure-sev-snp, azure-tdx or aws-sev-snp): its evidence
    /// carries the hardware report that vouches for its AK, gathered at start from the vTPM,
    /// the cloud's instance metadata service or configfs-tsm (docs/attestation.md, section 11).
    #[arg(long, value_name = "PLATFORM")]
    confidential_vm: Option<CvmPlatform>,

    /// This node's vTPM holds an AK the cloud made and certified (azure-trusted-launch: the
    /// persistent AK; gce: the AK made from Google's template in NV): quote with that AK and
    /// send the cloud's certificate for it from the vTPM's NV (unless --ak-cert names one);
    /// verifiers trust it with --cloud-ak-root. Not on a confidential VM, whose hardware
    /// report vouches for its AK.
    #[arg(long, value_name = "PLATFORM", conflicts_with = "confidential_vm")]
    cloud_vtpm: Option<asterism_bootstrapper::platform::CloudVtpm>,

    /// With --confidential-vm: the cloud's instance metadata service (plain http).
    #[arg(long, value_name = "URL", default_value = asterism_metadata::imds::DEFAULT_IMDS_URL)]
    imds_url: String,

    /// The InitServer port (0: any free port; the log names it).
    #[arg(long, value_name = "PORT", default_value_t = asterism_bootstrapper::DEFAULT_INIT_PORT)]
    init_port: u16,

    /// The recovery server port, served while a rebooted node waits for its keys (0: any
    /// free port; the log names it).
    #[arg(long, value_name = "PORT", default_value_t = asterism_bootstrapper::DEFAULT_RECOVER_PORT)]
    recover_port: u16,

    /// The join service port on control-plane nodes.
    #[arg(long, value_name = "PORT", default_value_t = asterism_bootstrapper::DEFAULT_JOIN_PORT)]
    join_port: u16,

    /// How Kubernetes is set up.
    #[arg(long, value_enum, default_value_t = Driver::None)]
    kubernetes_driver: Driver,

    /// kubeadm driver: a JSON list of components (`url`, `hash` = `sha256:<hex>`,
    /// `install_path`, `extract`) to install when the init request or join ticket names
    /// none; without either the image must hold kubeadm, the kubelet and the CNI plugins.
    #[arg(long, value_name = "PATH")]
    kubernetes_components: Option<PathBuf>,

    /// kubeadm driver: the kubeadm program.
    #[arg(long, value_name = "PATH", default_value = "/run/state/bin/kubeadm")]
    kubeadm: PathBuf,

    /// kubeadm driver: kubeadm's directory (`pki/`, `manifests/`, `admin.conf`).
    #[arg(long, value_name = "DIR", default_value = "/etc/kubernetes")]
    kubernetes_dir: PathBuf,

    /// kubeadm driver: `external` when a cloud controller manager runs in the cluster (the
    /// same setting on every node), `none` otherwise.
    #[arg(long, value_enum, default_value_t = CloudProviderArg::None)]
    cloud_provider: CloudProviderArg,

    /// kubeadm driver: who runs the kubelet. `systemd`: its `kubelet.service`, enabled and
    /// started with `--systemctl`. `supervisor`: the node image's supervisor, which has no
    /// systemd; the bootstrapper enables it by writing `--kubelet-enable-file`.
    #[arg(long, value_enum, default_value_t = KubeletServiceArg::Systemd)]
    kubelet_service: KubeletServiceArg,

    /// kubeadm driver, `--kubelet-service systemd`: the systemctl program.
    #[arg(long, value_name = "PATH", default_value = "systemctl")]
    systemctl: PathBuf,

    /// kubeadm driver, `--kubelet-service supervisor`: the file that lets the image's
    /// supervisor run the kubelet.
    #[arg(long, value_name = "PATH", default_value = asterism_kubeadm::runner::SUPERVISOR_ENABLE_FILE)]
    kubelet_enable_file: PathBuf,

    /// kubeadm driver: the ionice program (gives etcd the realtime I/O class on control-plane
    /// nodes after init, join and kubelet start).
    #[arg(long, value_name = "PATH", default_value = "ionice")]
    ionice: PathBuf,

    /// Pause between join (and rejoin) rounds: `30s`, `1s`, `500ms`.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    join_retry_interval: Duration,

    /// Deadline of one metadata call, aTLS connection or join RPC.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    rpc_timeout: Duration,

    /// The cluster this node joins (64 hex digits, as `asterism init` prints it): a join
    /// service must attest with this cluster's marker in PCR 15, and a ticket must be for
    /// this cluster. Without it (and without --insecure-skip-join-service-verification)
    /// the node does not join or rejoin; it waits to be initialised.
    #[arg(
        long,
        value_name = "HEX",
        value_parser = parse_cluster_id,
        requires = "verify_join_service_measurements"
    )]
    cluster_id: Option<asterism_kms::ClusterId>,

    /// The control plane's public key (64 hex digits, `<workspace>/control-plane-key`): a
    /// join or rejoin ticket is used only if the control plane signed it over this
    /// connection. Required with --cluster-id: the cluster marker in PCR 15 is carried by
    /// every joined worker too, so it cannot tell the control plane from a worker posing
    /// as the join service.
    #[arg(long, value_name = "HEX", requires = "cluster_id")]
    control_plane_key: Option<asterism_kms::ControlPlaneKey>,

    /// INSECURE: join with --cluster-id but without --control-plane-key; any joined worker
    /// of the cluster can then pose as the join service and choose this node's disk key
    /// and CAs. Warned at start and on every ticket.
    #[arg(long, requires = "cluster_id", conflicts_with = "control_plane_key")]
    insecure_skip_control_plane_identity: bool,

    /// The join service's expected measurements (JSON, docs/attestation.md; re-read when it
    /// changes); PCR 15 is always the marker of --cluster-id. Needs one way to trust the
    /// join service's attestation key: --platform-ca, --pinned-ak, --cloud-ak-root, or
    /// --confidential-vm (the join service runs on a confidential VM of the same platform).
    #[arg(long, value_name = "PATH")]
    verify_join_service_measurements: Option<PathBuf>,

    /// PEM file of the platform CA(s) that certify the join service's attestation key.
    #[arg(
        long,
        value_name = "PATH",
        requires = "verify_join_service_measurements",
        conflicts_with = "confidential_vm"
    )]
    platform_ca: Option<PathBuf>,

    /// Trust the join service's attestation key by its fingerprint (SHA-256 of its
    /// TPMT_PUBLIC, 64 hex digits, as the control-plane node logs it) instead of a platform
    /// CA: bare-metal control planes. Repeatable (one per control-plane node).
    #[arg(
        long,
        value_name = "HEX",
        requires = "verify_join_service_measurements",
        conflicts_with = "confidential_vm"
    )]
    pinned_ak: Vec<String>,

    /// Trust the join service's attestation key when its certificate chains to this cloud
    /// vTPM CA root (PEM or DER; GCE, Azure Trusted Launch; docs/provisioning.md).
    /// Repeatable.
    #[arg(
        long,
        value_name = "PATH",
        requires = "verify_join_service_measurements",
        conflicts_with = "confidential_vm"
    )]
    cloud_ak_root: Vec<PathBuf>,

    /// With --cloud-ak-root: an intermediate CA certificate (PEM or DER) the join service's
    /// AK certificate chains through. Repeatable.
    #[arg(long, value_name = "PATH", requires = "cloud_ak_root")]
    cloud_ak_intermediate: Vec<PathBuf>,

    /// With --confidential-vm: the policy for the join service's hardware report (JSON,
    /// docs/attestation.md section 7.1); without it the secure defaults.
    #[arg(long, value_name = "PATH", requires = "confidential_vm")]
    cvm_policy: Option<PathBuf>,

    /// With --confidential-vm azure-tdx: Intel PCS collateral to verify the join service's
    /// quote (a JSON file or a directory of them; repeatable).
    #[arg(long, value_name = "PATH", requires = "confidential_vm")]
    tdx_collateral: Vec<PathBuf>,

    /// INSECURE, with --confidential-vm: accept the join service's hardware report when
    /// --verify-join-service-measurements pins its launch with no reference value
    /// (docs/attestation.md). Without it the bootstrapper refuses to start while one is
    /// missing. Warned at start and on every verification.
    #[arg(long, requires = "confidential_vm")]
    insecure_no_launch_measurement: bool,

    /// INSECURE, development only: trust whichever join service answers; it chooses this
    /// node's disk key and cluster. Warned on every join and rejoin attempt.
    #[arg(long, conflicts_with_all = [
        "cluster_id",
        "verify_join_service_measurements",
        "platform_ca",
        "pinned_ak",
        "cloud_ak_root",
    ])]
    insecure_skip_join_service_verification: bool,

    /// INSECURE: let the recovery server accept the master-secret request form (`kms_uri`),
    /// which carries the cluster's whole master secret, instead of only this node's two keys
    /// (docs/recovery.md says which clients send it).
    /// Warned on every use.
    #[arg(long)]
    insecure_accept_master_secret: bool,

    /// As the first control plane, host the cluster's key and join services outside
    /// Kubernetes (a local VM cluster): the init request must then say what the join
    /// service trusts, and the services' secrets (the master secret among them) are kept in
    /// `state/asterism/services/`. Needs `--state-disk-unlock map`, so that they are on the
    /// encrypted disk.
    #[arg(long)]
    host_cluster_services: bool,

    /// A directory a join ticket's Kubernetes components may install into (repeatable;
    /// replaces the defaults: /run/state/bin, /opt/cni/bin, /opt/kubernetes/patches).
    #[arg(long = "components-dir", value_name = "DIR")]
    components_dirs: Vec<PathBuf>,

    /// The size of a new state disk image, in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 64)]
    state_disk_size_mib: u64,

    /// dm-integrity on the state disk: `required` (production), `if-available` (falls back
    /// with a warning where the kernel has no device-mapper), `none`.
    #[arg(long, value_enum, default_value_t = IntegrityArg::IfAvailable)]
    state_disk_integrity: IntegrityArg,

    /// How the state disk is opened: `key-check` (local mode: check the key, map nothing;
    /// `state/` is a plain directory that stands for the disk) or `map` (device-mapper: the
    /// first boot maps the new disk and makes an ext4 file system on it, every boot mounts
    /// it on `state/`, and the first-boot passphrase stays in `run/`).
    #[arg(long, value_enum, default_value_t = UnlockArg::KeyCheck)]
    state_disk_unlock: UnlockArg,

    /// With `--state-disk-unlock map`: e2fsprogs' mke2fs, which makes the state disk's file
    /// system.
    #[arg(long, value_name = "PATH", default_value = "mke2fs")]
    mkfs: PathBuf,

    /// With `--state-disk-unlock map`: the mount program.
    #[arg(long, value_name = "PATH", default_value = "mount")]
    mount: PathBuf,

    /// argon2id iterations of the disk keyslots (forced; no benchmark). Without it the
    /// keyslots are benchmarked for a 2 s unlock with 64 MiB and 4 threads (docs/disk.md).
    #[arg(long, value_name = "N", requires = "pbkdf_memory_kib")]
    pbkdf_iterations: Option<u32>,

    /// argon2id memory of the disk keyslots, KiB (with --pbkdf-iterations).
    #[arg(long, value_name = "KIB", requires = "pbkdf_iterations")]
    pbkdf_memory_kib: Option<u32>,

    /// argon2id threads of the disk keyslots (with --pbkdf-iterations).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pbkdf_parallel: u32,

    /// The cheapest argon2id parameters (4 iterations, 32 KiB, 1 thread). The disk keys are
    /// 32 random bytes, so this costs no security against guessing, only unlock time; for
    /// local clusters and tests.
    #[arg(long, conflicts_with = "pbkdf_iterations")]
    insecure_fast_disk_kdf: bool,

    /// The cryptsetup program.
    #[arg(long, value_name = "PATH", default_value = "cryptsetup")]
    cryptsetup: PathBuf,

    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Human)]
    log_format: LogFormat,

    /// How many KiB of this process's log lines a failed Init streams back (to a caller
    /// with the right init secret only).
    #[arg(long, value_name = "KIB", default_value_t = 256)]
    log_buffer_kib: usize,

    /// More log output: -v for debug.
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Driver {
    /// No Kubernetes: a cluster CA and an admin kubeconfig on init, nothing on join
    /// (docs/design/local-cluster.md).
    None,
    /// kubeadm on a real machine (docs/kubernetes.md).
    Kubeadm,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum KubeletServiceArg {
    Systemd,
    Supervisor,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum CloudProviderArg {
    External,
    None,
}

/// Who runs the kubelet, from the flags.
fn kubelet_service(args: &Args) -> asterism_kubeadm::runner::KubeletService {
    use asterism_kubeadm::runner::KubeletService;
    match args.kubelet_service {
        KubeletServiceArg::Systemd => KubeletService::Systemd {
            systemctl: args.systemctl.clone(),
        },
        KubeletServiceArg::Supervisor => KubeletService::Supervisor {
            enable_file: args.kubelet_enable_file.clone(),
        },
    }
}

/// The kubeadm driver from the flags.
fn kubeadm_driver(
    args: &Args,
    dir: &NodeDir,
    metadata: AnyMetadata,
) -> anyhow::Result<KubeadmDriver<AnyMetadata>> {
    use asterism_bootstrapper::PostInitApi;
    use asterism_kubeadm::config::{CloudProvider, NodePaths};
    use asterism_kubeadm::setup::SetupConfig;
    let components = match &args.kubernetes_components {
        Some(path) => {
            let bytes = asterism_binkit::read_capped(path, MAX_COMPONENTS_FILE)?;
            serde_json::from_slice(&bytes)
                .with_context(|| format!("{} is not a JSON list of components", path.display()))?
        }
        None => Vec::new(),
    };
    let setup = SetupConfig {
        paths: NodePaths {
            kubernetes_dir: args.kubernetes_dir.clone(),
            kubelet_cert: dir.kubelet_cert(),
            kubelet_key: dir.kubelet_key(),
            ..NodePaths::standard()
        },
        kubeadm: args.kubeadm.clone(),
        kubelet_service: kubelet_service(args),
        config_dir: std::env::temp_dir(),
    };
    let config = KubeadmDriverConfig {
        setup,
        node_ip: args.node_ip,
        cloud_provider: match args.cloud_provider {
            CloudProviderArg::External => CloudProvider::External,
            CloudProviderArg::None => CloudProvider::None,
        },
        fallback_components: components,
        download: asterism_components::DownloadPolicy::default(),
        api: PostInitApi::admin_conf(&args.kubernetes_dir),
    };
    let etcd_io =
        asterism_kubeadm::etcdio::EtcdIoPriority::standard(asterism_kubeadm::etcdio::Ionice::new(
            args.ionice.clone(),
            asterism_kubeadm::runner::ProcessCommands {
                timeout: Duration::from_secs(30),
                ..asterism_kubeadm::runner::ProcessCommands::default()
            },
        ));
    Ok(KubeadmDriver::new(config, metadata)?.with_etcd_io_priority(etcd_io))
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum IntegrityArg {
    Required,
    IfAvailable,
    None,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum UnlockArg {
    KeyCheck,
    Map,
}

/// `30s`, `1s`, `500ms`, `2m`.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (number, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map_or((s, ""), |i| s.split_at(i));
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 30s or 500ms"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" | "" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (ms, s, m)")),
    };
    if d.is_zero() {
        return Err("the duration must be longer than zero".into());
    }
    Ok(d)
}

/// The largest `--kubernetes-components` file read (a JSON list of URLs and hashes).
const MAX_COMPONENTS_FILE: u64 = 1 << 20;
/// The largest AK certificate file read (one DER certificate).
const MAX_AK_CERT_FILE: u64 = 64 << 10;

/// Where Linux exposes the firmware's TCG event log.
const DEFAULT_EVENT_LOG: &str = "/sys/kernel/security/tpm0/binary_bios_measurements";

/// The event log to send with every quote, if there is one that parses: a log the verifier
/// cannot parse would make it refuse the node, so such a log is left out with a warning.
fn event_log(args: &Args) -> Option<Vec<u8>> {
    use asterism_attestation::tpm::eventlog::{EventLog, MAX_EVENT_LOG_SIZE};
    let path = match (&args.event_log, &args.tpm) {
        (Some(path), _) => path.clone(),
        (None, TpmConfig::Device(_)) => PathBuf::from(DEFAULT_EVENT_LOG),
        (None, _) => return None,
    };
    if !path.exists() {
        tracing::debug!(path = %path.display(), "no TCG event log; quotes go without one");
        return None;
    }
    let cap = u64::try_from(MAX_EVENT_LOG_SIZE).unwrap_or(u64::MAX);
    let log = match asterism_binkit::read_capped(&path, cap) {
        Ok(log) => log,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot read the TCG event log; quotes go without one");
            return None;
        }
    };
    match EventLog::parse(&log) {
        Ok(parsed) => {
            tracing::info!(path = %path.display(), events = parsed.events().len(), "the TCG event log goes with every quote");
            Some(log)
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "the TCG event log does not parse; quotes go without one");
            None
        }
    }
}

/// The crates whose lines the log and the buffer keep at info (debug with `-v`); the rest
/// only at warn.
const LOGGED_CRATES: [&str; 9] = [
    "asterism_bootstrapper",
    "asterism_components",
    "asterism_kubeadm",
    "asterism_kube_api",
    "asterism_disk",
    "asterism_tpm",
    "asterism_atls",
    "asterism_attestation",
    "asterism_metadata",
];

/// The log: `ASTERISM_LOG` when set, else [`LOGGED_CRATES`] at info (debug with `-v`); and
/// the buffer a failed Init streams back, which keeps the same crates at info whatever the
/// log shows (never secrets: nothing logs them).
fn init_logging(format: LogFormat, verbose: u8, buffer: &LogBuffer) {
    let level = if verbose > 0 { "debug" } else { "info" };
    let buffer_filter = EnvFilter::new(logging::crate_directives("info", &LOGGED_CRATES));
    logging::init_with(
        format,
        &logging::directives(&logging::crate_directives(level, &LOGGED_CRATES)),
        buffer.layer(Level::INFO).with_filter(buffer_filter),
    );
}

fn disk_config(args: &Args, dir: &NodeDir) -> DiskConfig {
    let pbkdf = if args.insecure_fast_disk_kdf {
        tracing::warn!(
            "using the cheapest argon2id parameters for the state disk (--insecure-fast-disk-kdf)"
        );
        Pbkdf::FAST_FOR_TESTS
    } else if let (Some(iterations), Some(memory_kib)) =
        (args.pbkdf_iterations, args.pbkdf_memory_kib)
    {
        Pbkdf::Argon2idForced {
            iterations,
            memory_kib,
            parallel: args.pbkdf_parallel,
        }
    } else {
        Pbkdf::SPEC
    };
    DiskConfig {
        cryptsetup: args.cryptsetup.clone(),
        pbkdf,
        integrity: match args.state_disk_integrity {
            IntegrityArg::Required => Integrity::HmacSha256,
            IntegrityArg::IfAvailable => Integrity::HmacSha256IfAvailable,
            IntegrityArg::None => Integrity::None,
        },
        scratch_dir: dir.run(),
        ..DiskConfig::local()
    }
}

/// 64 hex digits.
fn parse_cluster_id(s: &str) -> Result<asterism_kms::ClusterId, String> {
    let bytes = hex::decode(s.trim()).map_err(|e| format!("not hex: {e}"))?;
    let id: [u8; 32] = bytes
        .try_into()
        .map_err(|_| "a cluster ID is 32 bytes (64 hex digits)".to_string())?;
    Ok(id.into())
}

fn join_service_trust(args: &Args) -> anyhow::Result<asterism_bootstrapper::JoinServiceTrust> {
    use asterism_bootstrapper::JoinServiceTrust;
    if args.insecure_skip_join_service_verification {
        return Ok(JoinServiceTrust::insecure_skip_verification());
    }
    let Some(cluster_id) = args.cluster_id else {
        tracing::info!(
            "no --cluster-id: this node does not join or rejoin a cluster; it waits to be initialised"
        );
        return Ok(JoinServiceTrust::init_only());
    };
    let Some(measurements) = &args.verify_join_service_measurements else {
        anyhow::bail!(
            "--cluster-id needs --verify-join-service-measurements to verify the join service"
        );
    };
    const NO_TRUST: &str = "--cluster-id needs exactly one way to trust the join service's attestation key: --platform-ca, --pinned-ak, --cloud-ak-root or, on a confidential VM, --confidential-vm";
    // The same policies as every verifier's (`AkTrustArgs`). On a confidential VM the join
    // service runs on one of the same platform: its AK is vouched for by its hardware
    // report, whose launch the measurements must pin. Elsewhere a platform CA, a pin or a
    // cloud's vTPM CA vouches for it.
    let ak_trust = asterism_binkit::AkTrustArgs {
        platform_ca: args.platform_ca.clone(),
        pinned_ak: args.pinned_ak.clone(),
        cloud_ak_root: args.cloud_ak_root.clone(),
        cloud_ak_intermediate: args.cloud_ak_intermediate.clone(),
        confidential_vm: args.confidential_vm,
        cvm_policy: args.cvm_policy.clone(),
        tdx_collateral: args.tdx_collateral.clone(),
        insecure_no_launch_measurement: args.insecure_no_launch_measurement,
        ..asterism_binkit::AkTrustArgs::default()
    };
    // Checked before the measurements are read, so that this is the error a user sees.
    if !ak_trust.is_given() {
        anyhow::bail!(NO_TRUST);
    }
    let measurements_path = measurements;
    let measurements = asterism_binkit::measurements::watch(measurements_path)
        .with_context(|| format!("loading measurements from {}", measurements_path.display()))?;
    let trust = ak_trust
        .ak_trust_for(&asterism_attestation::MeasurementsProvider::current(
            &measurements,
        ))
        .context("how the join service's attestation key is trusted")?;
    let identity = control_plane_identity(args)?;
    tracing::info!(cluster_id = %cluster_id, "the join service must attest as a member of this cluster (mutual aTLS, PCR 15)");
    JoinServiceTrust::cluster(trust, Arc::new(measurements), cluster_id, identity)
        .context("the join service's measurements")
}

/// How tickets are recognised as the control plane's: `--control-plane-key`, or, only when
/// asked for by name, not at all.
fn control_plane_identity(
    args: &Args,
) -> anyhow::Result<asterism_bootstrapper::ControlPlaneIdentity> {
    use asterism_bootstrapper::ControlPlaneIdentity;
    match (
        args.control_plane_key,
        args.insecure_skip_control_plane_identity,
    ) {
        (Some(key), _) => {
            tracing::info!(control_plane_key = %key, "tickets must be signed by the control plane");
            Ok(ControlPlaneIdentity::key(key))
        }
        (None, true) => Ok(ControlPlaneIdentity::insecure_unchecked()),
        (None, false) => anyhow::bail!(
            "--cluster-id needs --control-plane-key (the workspace's control-plane-key file): \
             without it any joined worker could pose as the join service \
             (--insecure-skip-control-plane-identity accepts that risk)"
        ),
    }
}

async fn run(args: Args, logs: LogBuffer) -> anyhow::Result<u8> {
    let shutdown = shutdown_signal()?;
    if args.host_cluster_services && !matches!(args.state_disk_unlock, UnlockArg::Map) {
        anyhow::bail!(
            "--host-cluster-services keeps the master secret on the state disk, so it needs \
             --state-disk-unlock map (an encrypted, mapped disk)"
        );
    }
    let dir = NodeDir::new(&args.node_dir);
    tracing::info!(node_dir = %dir.root().display(), node_ip = %args.node_ip, tpm = %args.tpm, "bootstrapper starting");

    let ak_cert = args.ak_cert.clone().or_else(|| {
        let default = dir.ak_certificate();
        default.exists().then_some(default)
    });
    let cloud = args.cloud_vtpm;
    let chain = match (&ak_cert, cloud) {
        (Some(path), _) => {
            vec![asterism_binkit::read_capped(path, MAX_AK_CERT_FILE)?]
        }
        // Read from the vTPM below.
        (None, Some(_)) => Vec::new(),
        (None, None) => {
            tracing::warn!("no AK certificate: verifiers must pin this node's AK");
            Vec::new()
        }
    };
    let tpm_config = args.tpm.clone();
    let log = event_log(&args);
    let cvm = args.confidential_vm;
    // Checked before the TPM is touched, so a bad URL fails the start at once.
    let imds = cvm
        .map(|_| Imds::new(&args.imds_url))
        .transpose()
        .context("--imds-url")?;
    let (issuer, hcl_report) = tokio::task::spawn_blocking(move || {
        let mut tpm = Tpm::open(&tpm_config).context("cannot open the TPM")?;
        let hcl_report = match cvm {
            Some(platform) => platform::read_from_tpm(platform, &mut tpm)?,
            None => None,
        };
        let issuer = match cloud {
            Some(cloud) => cloud.issuer(tpm, chain)?,
            None => TpmIssuer::new(tpm, &platform::ak_config(cvm)?, PcrSelection::all(), chain)
                .context("cannot load the attestation key from the TPM")?,
        };
        let issuer = match log {
            Some(log) => issuer.with_event_log(log),
            None => issuer,
        };
        anyhow::Ok((issuer, hcl_report))
    })
    .await
    .context("the TPM task failed")??;
    // A confidential VM that cannot prove it is one must not start as a plain node.
    let issuer = match (cvm, &imds) {
        (Some(platform), Some(imds)) => {
            let kind = platform::gather(
                platform,
                hcl_report,
                issuer.ak_public(),
                imds,
                asterism_tsm::ConfigfsTsm::default(),
            )
            .await
            .with_context(|| format!("cannot gather the {platform} hardware report for the AK"))?;
            platform::check_ak(&kind, issuer.ak_public())?;
            issuer.with_platform_report(kind)
        }
        _ => issuer,
    };
    let ak_identity =
        asterism_attestation::AkFingerprint::of_public_area(issuer.ak_public()).to_string();
    tracing::info!(ak = %ak_identity, "loaded the attestation key");

    let image = dir.state_image();
    asterism_bootstrapper::prepare_state_image(&image, args.state_disk_size_mib * 1024 * 1024)?;
    asterism_bootstrapper::files::create_dirs(&dir.run())?;
    let disk = StateDisk::open(&image, disk_config(&args, &dir))
        .with_context(|| format!("opening the state disk {}", image.display()))?;
    let unlock = match args.state_disk_unlock {
        UnlockArg::KeyCheck => UnlockMode::KeyCheck,
        UnlockArg::Map => UnlockMode::Map,
    };
    let file_system = StateFileSystem::new(&FileSystemConfig {
        mkfs: args.mkfs.clone(),
        mount: args.mount.clone(),
        ..FileSystemConfig::default()
    });

    let metadata = AnyMetadata::from_url(&args.metadata_url)
        .context("--metadata-url")?
        .with_local_address(args.node_ip)
        .with_timeout(args.rpc_timeout);
    // The kubeadm driver also starts the kubelet of a node that is already bootstrapped.
    let mut kubeadm = None;
    let driver: Arc<dyn KubernetesDriver> = match args.kubernetes_driver {
        Driver::None => Arc::new(asterism_bootstrapper::NoneDriver::new()),
        Driver::Kubeadm => {
            let driver = Arc::new(kubeadm_driver(&args, &dir, metadata.clone())?);
            kubeadm = Some(driver.clone());
            driver
        }
    };
    let mut config = Config::new(dir, args.node_ip);
    config.ak_identity = Some(ak_identity);
    config.join_port = args.join_port;
    config.retry_interval = args.join_retry_interval;
    config.rpc_timeout = args.rpc_timeout;
    config.state_disk_size = args.state_disk_size_mib * 1024 * 1024;
    config.join_service = join_service_trust(&args)?;
    config.insecure_accept_master_secret = args.insecure_accept_master_secret;
    config.host_cluster_services = args.host_cluster_services;
    if !args.components_dirs.is_empty() {
        config.components_dirs = args.components_dirs.clone();
    }

    let node = Arc::new(Node::new(
        config,
        Arc::new(TpmMarker::new(args.tpm.clone())),
        Arc::new(LuksDisk::new(disk, unlock)),
        Arc::new(file_system),
        Arc::new(issuer),
        metadata,
        driver,
        logs,
    ));
    // Bound here, before anything else can take the ports; the bootstrapper serves the
    // InitServer's only on a fresh boot, the recovery server's only on a reboot.
    let bind = |port: u16| async move {
        let addr = std::net::SocketAddr::new(args.node_ip, port);
        tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))
    };
    let listeners = asterism_bootstrapper::Listeners {
        init: bind(args.init_port).await?,
        recover: bind(args.recover_port).await?,
    };
    match asterism_bootstrapper::run(node, listeners, shutdown).await {
        Ok(outcome) => {
            tracing::info!(?outcome, "done");
            if let (
                Some(kubeadm),
                Outcome::AlreadyBootstrapped | Outcome::Rejoined(_) | Outcome::Recovered(_),
            ) = (&kubeadm, &outcome)
                && let Err(e) = kubeadm.start_kubelet().await
            {
                tracing::error!(error = %asterism_bootstrapper::error_chain(&e), "cannot start the kubelet; reboot the node");
                return Ok(asterism_bootstrapper::EXIT_FAILED);
            }
            Ok(outcome.exit_code())
        }
        Err(failure) => {
            tracing::error!(error = %asterism_bootstrapper::error_chain(&failure), "bootstrapping failed");
            Ok(failure.exit_code())
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let logs = LogBuffer::new(args.log_buffer_kib.saturating_mul(1024));
    init_logging(args.log_format, args.verbose, &logs);
    // A failure exits with 1: `EXIT_FAILED`.
    const _: () = assert!(asterism_bootstrapper::EXIT_FAILED == 1);
    let code = asterism_binkit::service::main("bootstrapper", run(args, logs));
    log_peak_memory();
    code
}

/// Logs the process's peak resident memory (`VmHWM`), for the performance figures.
fn log_peak_memory() {
    let peak = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .map(|v| v.trim().to_string())
        });
    if let Some(peak) = peak {
        tracing::info!(peak_rss = %peak, "exiting");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The flags with the required ones before `extra`.
    /// `base` followed by `more`.
    fn plus<'a>(base: &[&'a str], more: &[&'a str]) -> Vec<&'a str> {
        base.iter().chain(more).copied().collect()
    }

    /// The flags of a node told to join cluster `cluster_id` (hex) and to verify the join
    /// service's measurements, then `trust` (what vouches for the join service).
    fn cluster_to_join<'a>(cluster_id: &'a str, trust: &[&'a str]) -> Vec<&'a str> {
        plus(
            &[
                "--cluster-id",
                cluster_id,
                "--verify-join-service-measurements",
                "/m.json",
            ],
            trust,
        )
    }

    fn with(extra: &[&str]) -> Result<Args, clap::Error> {
        let base = [
            "asterism-bootstrapper",
            "--node-dir",
            "/n",
            "--node-ip",
            "127.0.0.1",
        ];
        Args::try_parse_from(base.iter().chain(extra))
    }

    #[test]
    fn the_kubelet_runs_under_systemd_unless_the_flags_name_the_images_supervisor() {
        use asterism_kubeadm::runner::KubeletService;
        use std::path::Path;
        let args = with(&["--systemctl", "/bin/sc"]).unwrap();
        assert!(matches!(
            kubelet_service(&args),
            KubeletService::Systemd { systemctl } if systemctl == Path::new("/bin/sc")
        ));
        let args = with(&["--kubelet-service", "supervisor"]).unwrap();
        assert!(matches!(
            kubelet_service(&args),
            KubeletService::Supervisor { enable_file }
                if enable_file == Path::new("/run/asterism/kubelet/enabled")
        ));
        let args = with(&[
            "--kubelet-service=supervisor",
            "--kubelet-enable-file",
            "/e",
        ])
        .unwrap();
        assert!(matches!(
            kubelet_service(&args),
            KubeletService::Supervisor { enable_file } if enable_file == Path::new("/e")
        ));
    }

    #[test]
    fn durations_parse_as_the_flags_document() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("1h").is_err());
        assert!(parse_duration("fast").is_err());
    }

    #[test]
    fn a_cluster_id_is_64_hex_digits() {
        let hex = "ab".repeat(32);
        assert_eq!(
            parse_cluster_id(&hex).map(|id| id.to_hex()),
            Ok(hex.clone())
        );
        assert!(parse_cluster_id(&hex[..62]).is_err());
        assert!(parse_cluster_id(&"zz".repeat(32)).is_err());
        assert!(parse_cluster_id("").is_err());
    }

    #[test]
    fn the_insecure_join_flag_excludes_the_verification_flags() {
        let hex = "ab".repeat(32);
        assert!(with(&["--insecure-skip-join-service-verification"]).is_ok());
        assert!(
            with(&[
                "--insecure-skip-join-service-verification",
                "--cluster-id",
                &hex,
                "--platform-ca",
                "/ca.pem",
                "--verify-join-service-measurements",
                "/m.json",
            ])
            .is_err()
        );
        // A cluster ID without the means to verify the join service is refused.
        assert!(with(&["--cluster-id", &hex]).is_err());
    }

    #[test]
    fn a_cluster_id_without_the_control_plane_key_is_refused_unless_insecure() {
        let hex = "ab".repeat(32);
        let base = cluster_to_join(&hex, &["--platform-ca", "/ca.pem"]);
        let args = with(&base).unwrap();
        let err = control_plane_identity(&args).unwrap_err().to_string();
        assert!(err.contains("--control-plane-key"), "{err}");
        let key = "cd".repeat(32);
        let keyed: Vec<&str> = plus(&base, &["--control-plane-key", &key]);
        assert!(control_plane_identity(&with(&keyed).unwrap()).is_ok());
        let insecure: Vec<&str> = plus(&base, &["--insecure-skip-control-plane-identity"]);
        assert!(control_plane_identity(&with(&insecure).unwrap()).is_ok());
        // Both, or either without a cluster ID, make no sense.
        let both: Vec<&str> = plus(&keyed, &["--insecure-skip-control-plane-identity"]);
        assert!(with(&both).is_err());
        assert!(with(&["--control-plane-key", &key]).is_err());
        assert!(with(&["--control-plane-key", "00"]).is_err());
    }

    #[test]
    fn on_a_confidential_vm_the_join_service_is_verified_by_its_hardware_report() {
        let hex = "ab".repeat(32);
        let cvm = cluster_to_join(&hex, &["--confidential-vm", "azure-sev-snp"]);
        let args = with(&cvm).unwrap();
        assert!(args.platform_ca.is_none());
        // Both at once: which one vouches for the join service would be ambiguous.
        let both: Vec<&str> = plus(&cvm, &["--platform-ca", "/ca.pem"]);
        assert!(with(&both).is_err());
        // The CVM policy and collateral only with --confidential-vm.
        assert!(with(&["--tdx-collateral", "/c.json"]).is_err());
        assert!(with(&["--cvm-policy", "/p.json"]).is_err());
        // Neither a platform CA nor a platform: nothing could verify the join service.
        let args = with(&cluster_to_join(&hex, &[])).unwrap();
        assert!(join_service_trust(&args).is_err());
    }

    // A runtime, as the measurements file is watched.
    #[tokio::test]
    async fn on_a_confidential_vm_the_join_services_launch_measurement_is_required() {
        let dir = tempfile::tempdir().unwrap();
        let bare = dir.path().join("bare.json");
        let pcr = format!(r#""measurements": {{"4": "{}"}}"#, "11".repeat(32));
        std::fs::write(&bare, format!("{{{pcr}}}")).unwrap();
        let pinned = dir.path().join("pinned.json");
        std::fs::write(
            &pinned,
            format!(
                r#"{{{pcr}, "snp": {{"launchMeasurement": "{}"}}}}"#,
                "22".repeat(48)
            ),
        )
        .unwrap();
        let hex = "ab".repeat(32);
        let key = "cd".repeat(32);
        let args = |measurements: &std::path::Path, extra: &[&str]| {
            let mut argv = vec![
                "--cluster-id",
                &hex,
                "--control-plane-key",
                &key,
                "--confidential-vm",
                "azure-sev-snp",
                "--verify-join-service-measurements",
                measurements.to_str().unwrap(),
            ];
            argv.extend_from_slice(extra);
            with(&argv).unwrap()
        };
        let err = join_service_trust(&args(&bare, &[])).unwrap_err();
        assert!(
            format!("{err:#}").contains("--insecure-no-launch-measurement"),
            "{err:#}"
        );
        assert!(join_service_trust(&args(&pinned, &[])).is_ok());
        assert!(join_service_trust(&args(&bare, &["--insecure-no-launch-measurement"])).is_ok());
        // The relaxation is for the hardware report; without a platform it means nothing.
        assert!(with(&["--insecure-no-launch-measurement"]).is_err());
    }

    #[test]
    fn a_pin_or_a_cloud_root_verifies_the_join_service_and_excludes_the_insecure_flag() {
        let hex = "ab".repeat(32);
        let pin = "cd".repeat(32);
        let base = cluster_to_join(&hex, &[]);
        let with_base = |extra: &[&str]| with(&plus(&base, extra));
        let pinned = with_base(&["--pinned-ak", &pin, "--pinned-ak", &"ef".repeat(32)]).unwrap();
        assert_eq!(pinned.pinned_ak.len(), 2);
        let cloud = with_base(&[
            "--cloud-ak-root",
            "/root.cer",
            "--cloud-ak-intermediate",
            "/inter.crt",
        ])
        .unwrap();
        assert_eq!(cloud.cloud_ak_root.len(), 1);
        assert_eq!(cloud.cloud_ak_intermediate.len(), 1);
        // Only with the join service's measurements, never with the insecure flag, and not
        // on a confidential VM (its hardware report vouches for the join service).
        assert!(with(&["--pinned-ak", &pin]).is_err());
        assert!(with(&["--cloud-ak-root", "/root.cer"]).is_err());
        assert!(with(&["--cloud-ak-intermediate", "/inter.crt"]).is_err());
        for flag in [["--pinned-ak", &pin], ["--cloud-ak-root", "/root.cer"]] {
            let mut insecure = vec!["--insecure-skip-join-service-verification"];
            insecure.extend(flag);
            assert!(with(&insecure).is_err(), "{flag:?}");
            assert!(
                with_base(&[flag[0], flag[1], "--confidential-vm", "azure-sev-snp"]).is_err(),
                "{flag:?}"
            );
        }
    }

    // A runtime, as the measurements file is watched.
    #[tokio::test]
    async fn the_join_services_ak_is_trusted_by_exactly_one_policy() {
        let dir = tempfile::tempdir().unwrap();
        let measurements = dir.path().join("m.json");
        std::fs::write(
            &measurements,
            format!(r#"{{"measurements": {{"4": "{}"}}}}"#, "11".repeat(32)),
        )
        .unwrap();
        let root = dir.path().join("root.cer");
        std::fs::write(
            &root,
            include_bytes!(
                "../../../crates/attestation/tests/data/tpm-ek-ca/gcp/tpm_ek_root_1.cer"
            ),
        )
        .unwrap();
        let hex = "ab".repeat(32);
        let key = "cd".repeat(32);
        let pin = "ef".repeat(32);
        let args = |extra: &[&str]| {
            let mut argv = vec![
                "--cluster-id",
                &hex,
                "--control-plane-key",
                &key,
                "--verify-join-service-measurements",
                measurements.to_str().unwrap(),
            ];
            argv.extend_from_slice(extra);
            with(&argv).unwrap()
        };
        assert!(join_service_trust(&args(&["--pinned-ak", &pin])).is_ok());
        assert!(join_service_trust(&args(&["--cloud-ak-root", root.to_str().unwrap()])).is_ok());
        // Two policies: which one vouches for the join service would be ambiguous.
        let err = join_service_trust(&args(&["--pinned-ak", &pin, "--platform-ca", "/ca.pem"]))
            .unwrap_err();
        assert!(format!("{err:#}").contains("exactly one"), "{err:#}");
        // A bad pin or root is refused at start, naming what is wrong.
        let err = join_service_trust(&args(&["--pinned-ak", "00"])).unwrap_err();
        assert!(format!("{err:#}").contains("--pinned-ak"), "{err:#}");
        let err = join_service_trust(&args(&["--cloud-ak-root", measurements.to_str().unwrap()]))
            .unwrap_err();
        assert!(format!("{err:#}").contains("--cloud-ak-root"), "{err:#}");
        // None: nothing could verify the join service.
        let err = join_service_trust(&args(&[])).unwrap_err();
        assert!(format!("{err:#}").contains("--pinned-ak"), "{err:#}");
    }

    #[test]
    fn the_cloud_vtpm_flag_names_a_cloud_and_excludes_a_confidential_vm() {
        use asterism_bootstrapper::platform::CloudVtpm;
        assert_eq!(with(&[]).unwrap().cloud_vtpm, None);
        let args = with(&["--cloud-vtpm", "azure-trusted-launch"]).unwrap();
        assert_eq!(args.cloud_vtpm, Some(CloudVtpm::AzureTrustedLaunch));
        let args = with(&["--cloud-vtpm", "gce"]).unwrap();
        assert_eq!(args.cloud_vtpm, Some(CloudVtpm::Gce));
        assert!(with(&["--cloud-vtpm", "gcp"]).is_err());
        assert!(
            with(&[
                "--cloud-vtpm",
                "azure-trusted-launch",
                "--confidential-vm",
                "azure-sev-snp"
            ])
            .is_err()
        );
    }

    #[test]
    fn the_confidential_vm_flag_names_a_platform_and_defaults_to_none() {
        let plain = with(&[]).unwrap();
        assert_eq!(plain.confidential_vm, None);
        assert_eq!(plain.imds_url, "http://169.254.169.254");
        for platform in CvmPlatform::ALL {
            let args = with(&["--confidential-vm", platform.name()]).unwrap();
            assert_eq!(args.confidential_vm, Some(platform));
        }
        assert!(with(&["--confidential-vm", "gcp-sev-snp"]).is_err());
    }
}

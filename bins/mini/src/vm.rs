//! VM mode (`mini up --vm`): every node is a QEMU VM booted from the node image
//! (docs/vm-image.md), which the firmware measures into the node's own TPM. By default the
//! firmware boots the image's disk, as a real machine's would: the unified kernel image on
//! its EFI system partition (with `--secure-boot`, only once its signature verifies); with
//! `--direct-kernel` QEMU hands the firmware the kernel, the initramfs and the command line.
//!
//! Per node: a swtpm on a Unix socket, a copy of the firmware variables, a copy of the
//! image's disk on virtio (its state partition becomes the LUKS2 state disk, which the node
//! maps with dm-crypt and mounts: the node's state lives there, encrypted), and two NICs. The first is QEMU's user-mode network: it forwards
//! the node's InitServer and verify ports to its loopback address on the host, as process
//! mode has them, and forwards the guest's metadata address to a relay on the host that
//! answers for this node (see [`metadata_relay`]). The second joins the cluster network, a
//! multicast hub on loopback shared by the cluster's VMs, where each node has its own
//! address. The per-node settings travel by fw_cfg (or, on request, as SMBIOS OEM strings,
//! as a bare-metal machine's BMC sets them, or as a file on the disk's EFI system
//! partition), none of which is measured, so every node boots with the same PCRs and the
//! reference boot's measurements apply to all of them.
//!
//! The control plane boots first and is initialised with `--host-cluster-services`: it then
//! runs the key and join services itself. The workers boot after init, told by fw_cfg the
//! cluster's ID and the join service to trust, and join it over the cluster network.

use crate::{
    ClusterRecord, INIT_PORT, LocalCluster, METADATA_PORT, Node, UpArgs, VERIFY_PORT, abs, bin_dir,
    create_cluster_dir, create_platform_ca, finish, http_get, http_get_raw, kill_pid_file,
    node_name, provision_node, spawn_service, start_metadata_service, step, tail,
    write_join_service_measurements,
};
use anyhow::{Context, Result, bail};
use asterism_cluster::NodeDir;
use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The firmware's code, mapped read-only into every VM (Debian's `ovmf` package).
const OVMF_CODE: &str = "/usr/share/OVMF/OVMF_CODE_4M.fd";
/// The firmware's variables: each VM gets a copy.
pub const OVMF_VARS: &str = "/usr/share/OVMF/OVMF_VARS_4M.fd";
/// The firmware that enforces Secure Boot (it needs SMM).
const OVMF_CODE_SECURE_BOOT: &str = "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd";
/// Variables with Debian's snakeoil test key enrolled as PK, KEK and db: the key the image
/// build signs the UKI with unless told another.
const OVMF_VARS_SECURE_BOOT: &str = "/usr/share/OVMF/OVMF_VARS_4M.snakeoil.fd";
/// What OVMF prints on the console when it refuses to start an image (Secure Boot: no
/// signature, or one db does not trust).
const FIRMWARE_REFUSED: &str = "Access Denied";
/// The GPT label of the node's state partition on the image's disk (scripts/build-node-image).
pub const STATE_PARTITION_LABEL: &str = "asterism-state";
/// The QEMU program.
const QEMU: &str = "qemu-system-x86_64";
/// The guest's address on the user-mode network, its gateway, and the address the guest
/// reaches the metadata service at (QEMU's defaults for that network: 10.0.2.0/24).
const GUEST_USER_IP: &str = "10.0.2.15/24";
const GUEST_USER_GW: &str = "10.0.2.2";
const GUEST_METADATA_IP: &str = "10.0.2.100";
/// A cloud-like VM's first network ([`SettingsChannel::CloudMetadata`]), as QEMU's options:
/// link-local, so that the metadata service's address is in it; the gateway; the first
/// address DHCP gives.
const CLOUD_USER_NET: &str = "net=169.254.0.0/16,host=169.254.0.2,dhcpstart=169.254.0.15";
/// The metadata service's address on GCE, Azure and AWS alike.
const CLOUD_METADATA_IP: &str = "169.254.169.254";
/// The MACs every VM has; the init sets a per-node MAC on the cluster network. The
/// firmware's boot options name the NICs' MACs and are measured, so they must not differ.
const MAC_USER: &str = "52:54:00:12:34:56";
const MAC_CLUSTER: &str = "52:54:00:12:34:57";
/// The cluster network's multicast group; the port is `MCAST_PORT_BASE + net`, so that
/// clusters with different `--net` do not share a network.
const MCAST_GROUP: &str = "230.0.0.1";
const MCAST_PORT_BASE: u16 = 47000;
/// How long a VM may take from QEMU's start to its InitServer listening (TCG on a busy
/// machine: a minute and more).
const BOOT_DEADLINE: Duration = Duration::from_secs(600);
/// How long the bootstrapper may take after `asterism init` returned.
const FINISH_DEADLINE: Duration = Duration::from_secs(120);
/// How long the control plane may take to start its key and join services after init.
const SERVICES_DEADLINE: Duration = Duration::from_secs(120);
/// The console line that says the control plane's join service is ready.
const JOIN_SERVICE_READY: &str = "asterism-init: join service ready";
/// The `target` prefix of the join service's log lines (JSON) on the control plane's
/// console.
const JOIN_SERVICE_TARGET: &str = "asterism_join_service";
/// How long one relayed metadata request may take.
const RELAY_DEADLINE: Duration = Duration::from_secs(30);
/// The largest request head the relay reads.
const MAX_REQUEST_HEAD: usize = 16 * 1024;

/// How a VM boots the node image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootMode {
    /// The firmware boots the disk image's UKI, as a real machine does.
    Uefi,
    /// The same, with Secure Boot enforced: the UKI must be signed by a key in db.
    SecureBoot,
    /// QEMU hands the firmware the kernel, initramfs and command line (`-kernel`): quicker
    /// to change while working on the image, but not how a real machine boots.
    DirectKernel,
}

impl BootMode {
    /// The name of the mode, as `scripts/boot-node-image --boot` and its reference
    /// directories have it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Uefi => "uefi",
            Self::SecureBoot => "secure-boot",
            Self::DirectKernel => "direct-kernel",
        }
    }

    fn firmware(self) -> (&'static str, &'static str) {
        match self {
            Self::SecureBoot => (OVMF_CODE_SECURE_BOOT, OVMF_VARS_SECURE_BOOT),
            Self::Uefi | Self::DirectKernel => (OVMF_CODE, OVMF_VARS),
        }
    }
}

/// How a VM is given its node settings (docs/node-settings.md); the image's init reads
/// whichever it finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SettingsChannel {
    /// QEMU's fw_cfg files under `opt/asterism/`.
    #[default]
    FwCfg,
    /// SMBIOS OEM strings (type 11), `asterism.<key>=<value>`, the AK certificate in
    /// base64: what a bare-metal machine's BMC or firmware setup sets.
    SmbiosOemStrings,
    /// The settings document `asterism/node-settings.json` on the EFI system partition of
    /// the node's disk (written with mtools' `mmd` and `mcopy`). It has no key for the
    /// init's flags: such a node powers off when its bootstrapper exits.
    EspFile,
    /// A cloud's metadata service, a stand-in at this address on the host: the VM's SMBIOS
    /// names it an instance of that cloud, and its first interface's network is
    /// 169.254.0.0/16 (by DHCP), where 169.254.169.254:80 reaches the stand-in. The node's
    /// settings are then what the stand-in serves, as on that cloud. That network has no
    /// way to the local cluster's metadata service, so the bootstrapper finds no identity:
    /// for testing the settings path, not for a cluster.
    CloudMetadata(Cloud, std::net::SocketAddr),
}

/// A cloud whose metadata service a VM may be given ([`SettingsChannel::CloudMetadata`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cloud {
    /// Google Compute Engine.
    Gce,
    /// Microsoft Azure.
    Azure,
    /// Amazon EC2.
    Aws,
}

impl Cloud {
    /// The SMBIOS system information (type 1) of the cloud's VMs, which the image's init
    /// detects the cloud by (`asterism-node-settings --detect`).
    fn smbios_system(self) -> &'static str {
        match self {
            Self::Gce => "type=1,manufacturer=Google,product=Google Compute Engine",
            Self::Azure => "type=1,manufacturer=Microsoft Corporation,product=Virtual Machine",
            Self::Aws => "type=1,manufacturer=Amazon EC2,product=m6a.large",
        }
    }
}

/// Settings of VM mode (`mini up --vm`).
#[derive(clap::Args, Debug, Clone)]
pub struct VmArgs {
    /// VM mode: the node image `scripts/build-node-image` wrote.
    #[arg(
        long,
        value_name = "DIR",
        env = "ASTERISM_NODE_IMAGE",
        default_value = "target/node-image"
    )]
    pub image: PathBuf,
    /// VM mode: the reference boots of the image (`scripts/boot-node-image`), one
    /// directory per boot mode, each with its `measurements.json`.
    #[arg(
        long,
        value_name = "DIR",
        env = "ASTERISM_NODE_REFERENCE",
        default_value = "target/node-reference"
    )]
    pub vm_reference: PathBuf,
    /// VM mode: the expected measurements of a node booted from the image (default: the
    /// boot mode's `measurements.json` in `--vm-reference`).
    #[arg(long, value_name = "PATH", env = "ASTERISM_NODE_MEASUREMENTS")]
    pub vm_measurements: Option<PathBuf>,
    /// VM mode: boot the UKI with Secure Boot enforced (OVMF's secboot build, with the
    /// snakeoil test key that signs the image enrolled in db).
    #[arg(long, conflicts_with = "direct_kernel")]
    pub secure_boot: bool,
    /// VM mode: QEMU hands the kernel, initramfs and command line to the firmware instead
    /// of the firmware booting the disk (quicker to iterate on; not like a real machine).
    #[arg(long)]
    pub direct_kernel: bool,
}

impl VmArgs {
    /// The boot mode the flags choose.
    pub fn boot_mode(&self) -> BootMode {
        if self.direct_kernel {
            BootMode::DirectKernel
        } else if self.secure_boot {
            BootMode::SecureBoot
        } else {
            BootMode::Uefi
        }
    }

    /// The measurements file: the one given, or the boot mode's reference.
    pub fn measurements(&self) -> PathBuf {
        self.vm_measurements.clone().unwrap_or_else(|| {
            self.vm_reference
                .join(self.boot_mode().name())
                .join("measurements.json")
        })
    }
}

/// Arguments of the metadata relay QEMU starts for each connection of a guest to its
/// metadata address (`asterism-mini vm-metadata-relay`, not for people).
#[derive(clap::Args, Debug)]
pub struct RelayArgs {
    /// The node's address in the cluster network (its VPC IP in the metadata).
    #[arg(long)]
    pub node_ip: std::net::IpAddr,
    /// The metadata service, IP:PORT.
    #[arg(long)]
    pub metadata: String,
}

/// Whether QEMU accelerates with KVM or emulates with TCG.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// Hardware virtualisation.
    Kvm,
    /// QEMU's emulator.
    Tcg,
}

impl Accel {
    fn name(self) -> &'static str {
        match self {
            Self::Kvm => "kvm",
            Self::Tcg => "tcg",
        }
    }

    /// `NODE_VM_ACCEL` (`kvm`, `tcg`, `auto`); `auto` (the default) uses KVM when a short
    /// firmware run with it works: on some hosts `/dev/kvm` opens and the guest then stops
    /// with "KVM internal error".
    pub fn detect() -> Result<Self> {
        match std::env::var("NODE_VM_ACCEL").as_deref() {
            Ok("kvm") => Ok(Self::Kvm),
            Ok("tcg") => Ok(Self::Tcg),
            Ok("auto") | Err(_) => Ok(if kvm_works() { Self::Kvm } else { Self::Tcg }),
            Ok(other) => bail!("NODE_VM_ACCEL must be kvm, tcg or auto, not {other:?}"),
        }
    }
}

fn kvm_works() -> bool {
    if std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_err()
    {
        return false;
    }
    let Ok(probe) = tempfile_dir() else {
        return false;
    };
    let vars = probe.join("vars.fd");
    if std::fs::copy(OVMF_VARS, &vars).is_err() {
        return false;
    }
    let stderr = probe.join("stderr");
    let Ok(err_file) = std::fs::File::create(&stderr) else {
        return false;
    };
    let child = asterism_children::spawn(
        Command::new(QEMU)
            .args([
                "-accel", "kvm", "-machine", "q35", "-m", "128", "-display", "none",
            ])
            .args([
                "-monitor",
                "none",
                "-serial",
                "none",
                "-no-reboot",
                "-nodefaults",
            ])
            .arg("-drive")
            .arg(format!(
                "if=pflash,format=raw,unit=0,readonly=on,file={OVMF_CODE}"
            ))
            .arg("-drive")
            .arg(format!(
                "if=pflash,format=raw,unit=1,file={}",
                vars.display()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err_file),
    );
    let works = match child {
        Ok(mut child) => {
            std::thread::sleep(Duration::from_secs(4));
            let running = matches!(child.try_wait(), Ok(None));
            let _ = child.kill();
            let _ = child.wait();
            let said = std::fs::read_to_string(&stderr).unwrap_or_default();
            running && !said.to_lowercase().contains("error")
        }
        Err(_) => false,
    };
    let _ = std::fs::remove_dir_all(&probe);
    works
}

/// A scratch directory under the system's temporary directory.
fn tempfile_dir() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("asterism-kvm-probe-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// The node image: kernel, initramfs, the measured command line, the disk image and the VM
/// memory the measurements assume.
#[derive(Debug, Clone)]
pub struct NodeImage {
    /// The GPT disk image: the EFI system partition with the UKI, the state partition.
    pub disk: PathBuf,
    /// The kernel.
    pub vmlinuz: PathBuf,
    /// The initramfs.
    pub initramfs: PathBuf,
    /// The kernel command line (measured into PCR 9).
    pub cmdline: String,
    /// The VM's memory in MiB (PCR 4 depends on it).
    pub memory_mib: u64,
}

impl NodeImage {
    /// Reads the image `scripts/build-node-image` wrote into `dir`.
    pub fn locate(dir: &Path) -> Result<Self> {
        let missing = |what: &Path| {
            anyhow::anyhow!(
                "{} is missing: build the node image with scripts/build-node-image --out {} (docs/vm-image.md), or pass --image",
                what.display(),
                dir.display()
            )
        };
        let file = |name: &str| -> Result<PathBuf> {
            let path = abs(&dir.join(name))?;
            if path.is_file() {
                Ok(path)
            } else {
                Err(missing(&path))
            }
        };
        let vmlinuz = file("vmlinuz")?;
        let disk = file("disk.raw")?;
        let initramfs = file("initramfs.cpio.zst")?;
        let cmdline = std::fs::read_to_string(file("cmdline")?)?
            .trim()
            .to_string();
        let image_json = file("image.json")?;
        let image: serde_json::Value = serde_json::from_slice(&std::fs::read(&image_json)?)
            .with_context(|| format!("{}", image_json.display()))?;
        let memory_mib = image
            .pointer("/vm/memory_mib")
            .and_then(serde_json::Value::as_u64)
            .with_context(|| format!("{}: no vm.memory_mib", image_json.display()))?;
        Ok(Self {
            disk,
            vmlinuz,
            initramfs,
            cmdline,
            memory_mib,
        })
    }
}

/// Checks that QEMU, OVMF and swtpm are installed: what VM mode needs of the machine.
pub fn check_host() -> Result<()> {
    let qemu = asterism_children::status(
        Command::new(QEMU)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    if !qemu.is_ok_and(|s| s.success()) {
        bail!("{QEMU} is missing: install the qemu-system-x86 package");
    }
    for f in [
        OVMF_CODE,
        OVMF_VARS,
        OVMF_CODE_SECURE_BOOT,
        OVMF_VARS_SECURE_BOOT,
    ] {
        if !Path::new(f).is_file() {
            bail!("{f} is missing: install the ovmf package");
        }
    }
    Ok(())
}

/// One node of a VM cluster.
#[derive(Debug, Clone)]
pub struct VmNode {
    /// The node as process mode has it: `ip` is its loopback address on the host, where its
    /// InitServer and verify ports are forwarded.
    pub node: Node,
    /// Its address in the cluster network, `10.42.<net>.<n>` (its VPC IP).
    pub cluster_ip: String,
}

impl VmNode {
    fn console(&self) -> PathBuf {
        self.node.dir.join("console.log")
    }
}

/// A booted VM: QEMU, and the wall-clock time it started.
#[derive(Debug)]
pub struct RunningVm {
    qemu: Child,
    started: Instant,
}

/// Where the time of one node's boot went, from the console's timestamps (the guest's
/// uptime at each init line) and the wall time since QEMU started.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct BootTiming {
    /// How the VM booted (`uefi`, `secure-boot`, `direct-kernel`).
    pub boot_mode: &'static str,
    /// Wall seconds from QEMU's start to the bootstrapper's exit.
    pub wall_seconds: f64,
    /// QEMU and the firmware: the wall time before the kernel's clock started.
    pub firmware_seconds: f64,
    /// The kernel until the init's first line.
    pub kernel_seconds: f64,
    /// The init until the bootstrapper starts (modules, network).
    pub init_seconds: f64,
    /// The bootstrapper, start to exit (for the control plane: including `asterism init`).
    pub bootstrapper_seconds: f64,
}

/// A VM cluster: the process-mode view of it (for init, the record and `down`) and its VMs.
#[derive(Debug)]
pub struct VmCluster {
    /// The cluster as process mode has it.
    pub cluster: LocalCluster,
    /// The VMs, the control plane first.
    pub vms: Vec<VmNode>,
    /// The image the VMs boot (a test may change its command line, to see it refused).
    pub image: NodeImage,
    /// How the VMs boot.
    pub boot_mode: BootMode,
    /// How the control plane is given its settings.
    pub control_plane_settings: SettingsChannel,
    /// How the workers are given their settings.
    pub worker_settings: SettingsChannel,
    /// Words added to every node's settings (`asterism.<key>=<value>`): a test's hostile
    /// ones.
    pub extra_settings: Vec<String>,
    accel: Accel,
    net: u8,
}

impl VmCluster {
    /// Creates the cluster directory, the platform CA, every node's provisioned TPM state,
    /// disk and firmware variables, and starts the metadata service. No VM runs yet.
    pub fn create(
        dir: &Path,
        workers: usize,
        net: u8,
        bins: PathBuf,
        args: &VmArgs,
    ) -> Result<Self> {
        check_host()?;
        let image = NodeImage::locate(&args.image)?;
        let boot_mode = args.boot_mode();
        let vm_measurements = args.measurements();
        if !vm_measurements.is_file() {
            bail!(
                "{} is missing: boot the node image once as a reference with scripts/boot-node-image --image {} --boot {} (docs/vm-image.md), or pass --vm-measurements",
                vm_measurements.display(),
                args.image.display(),
                boot_mode.name()
            );
        }
        let accel = Accel::detect()?;
        let dir = create_cluster_dir(
            dir,
            &bins,
            &["asterism-provision", "asterism-metadata", "asterism-mini"],
        )?;
        // The expected measurements: what the firmware and the kernel measure booting this
        // image, from its reference boot.
        let measurements = dir.join("measurements.json");
        std::fs::copy(&vm_measurements, &measurements)
            .with_context(|| format!("copying {}", vm_measurements.display()))?;
        // What the workers expect of the join service: the same, but PCR 15, which holds the
        // cluster's marker there; the workers enforce it themselves (--cluster-id).
        let join_measurements = dir.join("join-service-measurements.json");
        write_join_service_measurements(&measurements, &join_measurements)?;
        let ca_dir = create_platform_ca(&bins.join("asterism-provision"), &dir)?;
        let mut vms = Vec::new();
        for i in 0..=workers {
            let (name, control_plane) = node_name(i);
            let ndir = provision_node(&bins.join("asterism-provision"), &ca_dir, &dir, &name)?;
            let (_, vars) = boot_mode.firmware();
            std::fs::copy(vars, ndir.join("OVMF_VARS_4M.fd"))
                .with_context(|| format!("copying {vars}"))?;
            // Mode 0600: the LUKS2 header names the disk's UUID (docs/join-service.md).
            copy_sparse(&image.disk, &ndir.join(NODE_DISK))?;
            let host = i + 1;
            vms.push(VmNode {
                node: Node {
                    name,
                    control_plane,
                    ip: format!("127.0.{net}.{host}"),
                    dir: ndir,
                    tcti: "device:/dev/tpmrm0 (inside the VM)".into(),
                },
                cluster_ip: format!("10.42.{net}.{host}"),
            });
        }
        let metadata_addr = format!("127.0.{net}.254:{METADATA_PORT}");
        let instances: Vec<(&Node, &str)> = vms
            .iter()
            .map(|v| (&v.node, v.cluster_ip.as_str()))
            .collect();
        let init_secret_file = start_metadata_service(
            &bins.join("asterism-metadata"),
            &dir,
            &metadata_addr,
            &instances,
        )?;
        let cluster = LocalCluster {
            metadata_addr,
            workspace: dir.join("workspace"),
            platform_ca: ca_dir.join("platform-ca.pem"),
            join_measurements,
            measurements,
            init_secret_file,
            nodes: vms.iter().map(|v| v.node.clone()).collect(),
            dir,
            bins,
        };
        Ok(Self {
            cluster,
            vms,
            image,
            boot_mode,
            control_plane_settings: SettingsChannel::default(),
            worker_settings: SettingsChannel::default(),
            extra_settings: Vec::new(),
            accel,
            net,
        })
    }

    /// How QEMU runs the VMs.
    pub fn accel(&self) -> Accel {
        self.accel
    }

    /// Starts the swtpm and the VM of `vm`. After init (the workspace names the cluster),
    /// the VM is told the cluster to join and the join service to trust.
    pub fn boot(&self, vm: &VmNode) -> Result<RunningVm> {
        let ndir = &vm.node.dir;
        step(format!(
            "booting {} ({}, {} boot, QEMU {}; host address {}, cluster address {})",
            vm.node.name,
            self.image.disk.display(),
            self.boot_mode.name(),
            self.accel.name(),
            vm.node.ip,
            vm.cluster_ip
        ));
        let socket = start_swtpm(ndir)?;
        let args = self.qemu_args(vm, &socket)?;
        let started = Instant::now();
        let qemu = spawn_service(
            Path::new(QEMU),
            &args,
            &ndir.join("log/qemu.log"),
            &ndir.join("run/qemu.pid"),
        )?;
        Ok(RunningVm { qemu, started })
    }

    fn qemu_args(&self, vm: &VmNode, swtpm_socket: &Path) -> Result<Vec<OsString>> {
        let ndir = &vm.node.dir;
        let image = &self.image;
        let host = &vm.node.ip;
        let guest = &vm.cluster_ip;
        // QEMU splits the command into words as a shell would: the program is quoted.
        let mini = qemu_value(&self.cluster.bin("asterism-mini"))?;
        if mini.contains('\'') {
            bail!("the path of asterism-mini must not contain a quote: {mini}");
        }
        // The node's settings: words, and the join trust's two files after init.
        let mut words = vec![
            format!("asterism.ip={GUEST_USER_IP}"),
            format!("asterism.gw={GUEST_USER_GW}"),
            format!("asterism.node-ip={guest}/24"),
            format!("asterism.hostname={}", vm.node.name),
            "asterism.keep-running=1".to_string(),
        ];
        words.extend(self.extra_settings.iter().cloned());
        let mut join_trust = Vec::new();
        if let Some(cluster_id) = self.cluster.cluster_id() {
            words.push(format!("asterism.cluster-id={cluster_id}"));
            let key = self
                .cluster
                .control_plane_key()
                .context("the workspace has a cluster ID but no control-plane-key")?;
            words.push(format!("asterism.control-plane-key={key}"));
            join_trust.push(("platform-ca", &self.cluster.platform_ca));
            join_trust.push(("measurements", &self.cluster.join_measurements));
        }
        let ak_cert = NodeDir::new(ndir).ak_certificate();
        let channel = if vm.node.control_plane {
            self.control_plane_settings
        } else {
            self.worker_settings
        };
        let settings = match channel {
            SettingsChannel::FwCfg => fw_cfg_settings(&words, &ak_cert, &join_trust)?,
            SettingsChannel::SmbiosOemStrings => {
                smbios_settings(ndir, &words, &ak_cert, &join_trust)?
            }
            SettingsChannel::EspFile => {
                esp_settings(ndir, &words, &ak_cert, &join_trust)?;
                Vec::new()
            }
            SettingsChannel::CloudMetadata(cloud, _) => {
                vec!["-smbios".into(), cloud.smbios_system().into()]
            }
        };
        let forwards = format!(
            "hostfwd=tcp:{host}:{INIT_PORT}-{guest}:{INIT_PORT},hostfwd=tcp:{host}:{VERIFY_PORT}-{guest}:{VERIFY_PORT}"
        );
        let user_net = match channel {
            // QEMU forwards a guest's connections only to addresses of the guest's own
            // network, so the metadata server's network is the guest's.
            SettingsChannel::CloudMetadata(_, stand_in) => format!(
                "user,id=net0,restrict=on,{CLOUD_USER_NET},{forwards},guestfwd=tcp:{CLOUD_METADATA_IP}:80-cmd:'{mini}' vm-cloud-relay --to {stand_in}"
            ),
            _ => format!(
                "user,id=net0,restrict=on,{forwards},guestfwd=tcp:{GUEST_METADATA_IP}:{METADATA_PORT}-cmd:'{mini}' vm-metadata-relay --node-ip {guest} --metadata {}",
                self.cluster.metadata_addr
            ),
        };
        let cluster_net = format!(
            "socket,id=net1,mcast={MCAST_GROUP}:{},localaddr=127.0.0.1",
            MCAST_PORT_BASE + u16::from(self.net)
        );
        // Device for device the VM of the reference boot (scripts/boot-node-image): the
        // firmware measures the devices it finds.
        let (code, _) = self.boot_mode.firmware();
        let machine = match self.boot_mode {
            BootMode::SecureBoot => "q35,smm=on",
            BootMode::Uefi | BootMode::DirectKernel => "q35",
        };
        let boot: Vec<String> = match self.boot_mode {
            BootMode::DirectKernel => vec![
                "-kernel".into(),
                qemu_value(&image.vmlinuz)?,
                "-initrd".into(),
                qemu_value(&image.initramfs)?,
                "-append".into(),
                image.cmdline.clone(),
            ],
            // Only the firmware may write its variables, as on real hardware with SMM.
            BootMode::SecureBoot => vec![
                "-global".into(),
                "driver=cfi.pflash01,property=secure,value=on".into(),
            ],
            BootMode::Uefi => vec![],
        };
        // The firmware boots the disk first (not the NICs' network boot).
        let disk_device = match self.boot_mode {
            BootMode::DirectKernel => "virtio-blk-pci,drive=disk0",
            BootMode::Uefi | BootMode::SecureBoot => "virtio-blk-pci,drive=disk0,bootindex=0",
        };
        let mut args: Vec<String> = vec![
            "-accel".into(),
            self.accel.name().into(),
            "-cpu".into(),
            "max".into(),
            "-machine".into(),
            machine.into(),
            "-m".into(),
            image.memory_mib.to_string(),
            "-smp".into(),
            "1".into(),
            "-display".into(),
            "none".into(),
            "-monitor".into(),
            "none".into(),
            "-no-reboot".into(),
            "-serial".into(),
            format!("file:{}", qemu_value(&vm.console())?),
            "-drive".into(),
            format!("if=pflash,format=raw,unit=0,readonly=on,file={code}"),
            "-drive".into(),
            format!(
                "if=pflash,format=raw,unit=1,file={}",
                qemu_value(&ndir.join("OVMF_VARS_4M.fd"))?
            ),
        ];
        args.extend(boot);
        args.extend(settings);
        args.extend([
            "-chardev".into(),
            format!("socket,id=chrtpm,path={}", qemu_value(swtpm_socket)?),
            "-tpmdev".into(),
            "emulator,id=tpm0,chardev=chrtpm".into(),
            "-device".into(),
            "tpm-tis,tpmdev=tpm0".into(),
            // A write or read the host cannot do (a full disk) is an I/O error in the guest,
            // which the bootstrapper reports, rather than QEMU's default for a full disk: to
            // pause the VM without a word.
            "-drive".into(),
            format!(
                "if=none,id=disk0,format=raw,werror=report,rerror=report,file={}",
                qemu_value(&ndir.join(NODE_DISK))?
            ),
            "-device".into(),
            disk_device.into(),
            "-netdev".into(),
            user_net,
            "-device".into(),
            format!("virtio-net-pci,netdev=net0,mac={MAC_USER}"),
            "-netdev".into(),
            cluster_net,
            "-device".into(),
            format!("virtio-net-pci,netdev=net1,mac={MAC_CLUSTER}"),
            "-device".into(),
            "virtio-rng-pci".into(),
        ]);
        Ok(args.into_iter().map(OsString::from).collect())
    }

    /// Waits until the bootstrapper of `vm` serves Init (its console says so).
    pub async fn wait_for_init_server(&self, vm: &VmNode, running: &mut RunningVm) -> Result<()> {
        self.wait_for_console(vm, running, BOOT_DEADLINE, "InitServer listening")
            .await
            .map(|_| ())
    }

    /// Waits until the bootstrapper of `vm` exits, at most `deadline`: `("ok" or its exit
    /// status, timing)`. The timing is also written to the node's `boot-timing.json`.
    pub async fn wait_for_bootstrapper(
        &self,
        vm: &VmNode,
        running: &mut RunningVm,
        deadline: Duration,
    ) -> Result<(String, Option<BootTiming>)> {
        let line = self
            .wait_for_console(
                vm,
                running,
                deadline,
                "asterism-init: bootstrapper exited with status",
            )
            .await?;
        let wall = running.started.elapsed().as_secs_f64();
        let status = line
            .split("status ")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .unwrap_or("?")
            .to_string();
        let exit = if status == "0" {
            "ok".to_string()
        } else {
            format!("exit status: {status}")
        };
        // The host's checks read the state partition as the bootstrapper left it.
        copy_state_partition(
            &vm.node.dir.join(NODE_DISK),
            &NodeDir::new(&vm.node.dir).state_image(),
        )?;
        let timing = boot_timing(
            &std::fs::read_to_string(vm.console())?,
            wall,
            self.boot_mode,
        );
        if let Some(t) = &timing {
            std::fs::write(
                vm.node.dir.join("boot-timing.json"),
                serde_json::to_vec_pretty(t)?,
            )?;
        }
        Ok((exit, timing))
    }

    /// Waits until the control plane's join service is ready (its console says so).
    pub async fn wait_for_join_service(&self, cp: &VmNode, running: &mut RunningVm) -> Result<()> {
        self.wait_for_console(cp, running, SERVICES_DEADLINE, JOIN_SERVICE_READY)
            .await
            .map(|_| ())
    }

    /// Stops the VM of `vm` and its swtpm, as a power cut would: its disk, TPM state and
    /// firmware variables stay, and the next [`Self::boot`] is a reboot. The console of the
    /// boot that ends is kept as `console.<n>.log`.
    pub fn power_off(&self, vm: &VmNode, running: RunningVm) -> Result<PathBuf> {
        let RunningVm { mut qemu, .. } = running;
        let _ = qemu.kill();
        let _ = qemu.wait();
        kill_pid_file(&vm.node.dir.join("run/swtpm.pid"))?;
        let _ = std::fs::remove_file(vm.node.dir.join("run/swtpm.sock"));
        let kept = (1..)
            .map(|n| vm.node.dir.join(format!("console.{n}.log")))
            .find(|p| !p.exists())
            .context("no free console name")?;
        std::fs::rename(vm.console(), &kept)?;
        Ok(kept)
    }

    /// Polls the console of `vm` for a line containing `needle`; fails when QEMU exits or
    /// `deadline` passes, with the console's and QEMU's last lines. Asynchronous, so that
    /// this process's connections keep being served meanwhile: the CLI's to the InitServer
    /// must acknowledge its shutdown, or the bootstrapper waits out its 10 s grace period.
    pub async fn wait_for_console(
        &self,
        vm: &VmNode,
        running: &mut RunningVm,
        deadline: Duration,
        needle: &str,
    ) -> Result<String> {
        let start = Instant::now();
        let console = vm.console();
        loop {
            let text = std::fs::read(&console).unwrap_or_default();
            if let Some(line) = String::from_utf8_lossy(&text)
                .lines()
                .find(|l| l.contains(needle))
            {
                return Ok(line.to_string());
            }
            if self.boot_mode != BootMode::DirectKernel
                && String::from_utf8_lossy(&text).contains(FIRMWARE_REFUSED)
            {
                bail!(
                    "the firmware of {} refused to start the image's UKI ({FIRMWARE_REFUSED}{}); its console ({}) ends:\n{}",
                    vm.node.name,
                    if self.boot_mode == BootMode::SecureBoot {
                        ": Secure Boot, and db does not trust its signature"
                    } else {
                        ""
                    },
                    console.display(),
                    tail(&console)
                );
            }
            if let Some(status) = running.qemu.try_wait()? {
                bail!(
                    "the VM of {} stopped ({status}) before its console said {needle:?}; QEMU said:\n{}\nits console ({}) ends:\n{}",
                    vm.node.name,
                    tail(&vm.node.dir.join("log/qemu.log")),
                    console.display(),
                    tail(&console)
                );
            }
            if start.elapsed() > deadline {
                bail!(
                    "the console of {} did not say {needle:?} within {deadline:?}; {}; it ({}) ends:\n{}",
                    vm.node.name,
                    host_view(running, &vm.node.dir),
                    console.display(),
                    tail(&console)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// What the host sees of a VM whose console went quiet: whether QEMU still ran the guest
/// (its CPU time since it started; a paused or stuck QEMU uses none) and the free space where
/// the VM's disk and console are written (a full disk stops the console's file growing).
fn host_view(running: &RunningVm, dir: &Path) -> String {
    let wall = running.started.elapsed().as_secs_f64();
    let cpu = match qemu_cpu_seconds(running.qemu.id()) {
        Some(cpu) => format!(
            "QEMU (pid {}) runs and has used {cpu:.1} s of CPU in {wall:.1} s",
            running.qemu.id()
        ),
        None => format!("QEMU's (pid {}) CPU time is unknown", running.qemu.id()),
    };
    let space = match free_bytes(dir) {
        Some(free) => format!(
            "the filesystem of {} has {} MiB free",
            dir.display(),
            free / (1 << 20)
        ),
        None => format!("the free space of {} is unknown", dir.display()),
    };
    format!("{cpu}; {space}")
}

/// A process's CPU time from `/proc/<pid>/schedstat` (its first field, in nanoseconds).
fn qemu_cpu_seconds(pid: u32) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).ok()?;
    let nanos: u64 = text.split_whitespace().next()?.parse().ok()?;
    #[allow(clippy::cast_precision_loss)] // seconds for a message
    Some(nanos as f64 / 1e9)
}

/// The bytes free to an unprivileged writer on the filesystem of `dir`, as `df` reports them.
fn free_bytes(dir: &Path) -> Option<u64> {
    let out = asterism_children::output(Command::new("df").arg("-Pk").arg(dir)).ok()?;
    parse_df_available(&String::from_utf8_lossy(&out.stdout))
}

/// The available space of `df -Pk`'s one filesystem line (its fourth column, in KiB), in bytes.
fn parse_df_available(out: &str) -> Option<u64> {
    let kib: u64 = out
        .lines()
        .nth(1)?
        .split_whitespace()
        .nth(3)?
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// QEMU's options that give a node its settings by fw_cfg: the words in
/// `opt/asterism/params`, the AK certificate and the join trust as files.
fn fw_cfg_settings(
    words: &[String],
    ak_cert: &Path,
    join_trust: &[(&str, &PathBuf)],
) -> Result<Vec<String>> {
    let mut args = vec![
        "-fw_cfg".to_string(),
        format!("name=opt/asterism/params,string={}", words.join(" ")),
        "-fw_cfg".to_string(),
        format!("name=opt/asterism/ak-cert,file={}", qemu_value(ak_cert)?),
    ];
    for (name, file) in join_trust {
        args.push("-fw_cfg".into());
        args.push(format!(
            "name=opt/asterism/join-trust/{name},file={}",
            qemu_value(file)?
        ));
    }
    Ok(args)
}

/// QEMU's option that gives a node its settings as SMBIOS OEM strings: one string a word,
/// the AK certificate in base64, and the join trust's PEM bundle and JSON from files (in the
/// node directory) that hold the whole string, since a command line cannot carry their
/// newlines.
fn smbios_settings(
    ndir: &Path,
    words: &[String],
    ak_cert: &Path,
    join_trust: &[(&str, &PathBuf)],
) -> Result<Vec<String>> {
    use base64::Engine as _;
    let mut option = String::from("type=11");
    let cert = std::fs::read(ak_cert).with_context(|| format!("{}", ak_cert.display()))?;
    let cert = format!(
        "asterism.ak-cert={}",
        base64::engine::general_purpose::STANDARD.encode(cert)
    );
    for word in words.iter().chain([&cert]) {
        // QEMU's escape for a comma in an option's value.
        option.push_str(&format!(",value={}", word.replace(',', ",,")));
    }
    for (name, file) in join_trust {
        let string = ndir.join(format!("smbios-join-{name}"));
        let mut content = format!("asterism.join-{name}=").into_bytes();
        content.extend(std::fs::read(file).with_context(|| format!("{}", file.display()))?);
        std::fs::write(&string, content)?;
        option.push_str(&format!(",path={}", qemu_value(&string)?));
    }
    Ok(vec!["-smbios".into(), option])
}

/// Writes a node's settings as the settings document `asterism/node-settings.json` on the
/// EFI system partition of its disk: the words' keys and values (not the init's flags,
/// which a document has no key for), the AK certificate in base64, the join trust's PEM
/// bundle and measurements object.
fn esp_settings(
    ndir: &Path,
    words: &[String],
    ak_cert: &Path,
    join_trust: &[(&str, &PathBuf)],
) -> Result<()> {
    use base64::Engine as _;
    let mut doc = serde_json::Map::new();
    for word in words {
        let (key, value) = word
            .strip_prefix("asterism.")
            .and_then(|kv| kv.split_once('='))
            .with_context(|| format!("not a setting: {word}"))?;
        if !matches!(key, "reference" | "keep-running") {
            doc.insert(key.into(), value.into());
        }
    }
    let cert = std::fs::read(ak_cert).with_context(|| format!("{}", ak_cert.display()))?;
    doc.insert(
        "ak-cert".into(),
        base64::engine::general_purpose::STANDARD
            .encode(cert)
            .into(),
    );
    for (name, file) in join_trust {
        let bytes = std::fs::read(file).with_context(|| format!("{}", file.display()))?;
        let value = if *name == "measurements" {
            serde_json::from_slice(&bytes).with_context(|| format!("{}", file.display()))?
        } else {
            serde_json::Value::String(String::from_utf8(bytes)?)
        };
        doc.insert(format!("join-{name}"), value);
    }
    let document = ndir.join("node-settings.json");
    std::fs::write(&document, serde_json::to_vec(&doc)?)?;
    let disk = ndir.join(NODE_DISK);
    let mut head = vec![0u8; 34 * 512];
    std::fs::File::open(&disk)
        .with_context(|| format!("{}", disk.display()))?
        .read_exact(&mut head)?;
    let (esp, _) = gpt_partition(&head, "EFI system partition")?;
    let image = format!("{}@@{esp}", disk.display());
    // The directory exists from an earlier boot of this disk: mmd then fails, and mcopy
    // replaces the file.
    let _ = asterism_children::output(Command::new("mmd").args(["-i", &image, "::/asterism"]));
    let copied = asterism_children::output(
        Command::new("mcopy")
            .args(["-o", "-i", &image])
            .arg(&document)
            .arg("::/asterism/node-settings.json"),
    )
    .context("running mcopy (mtools)")?;
    if !copied.status.success() {
        bail!(
            "mcopy of the settings to {} failed: {}",
            disk.display(),
            String::from_utf8_lossy(&copied.stderr)
        );
    }
    Ok(())
}

/// The VM's disk in the node directory: a copy of the image's disk.
pub const NODE_DISK: &str = "disk.raw";
/// The logical block size of the image's disk, in which its GPT counts.
const SECTOR: u64 = 512;

/// Copies `from` to a new file `to` (mode 0600), leaving holes where `from` is zero (most of
/// the disk: the state partition is empty until the node formats it).
fn copy_sparse(from: &Path, to: &Path) -> Result<()> {
    use std::io::{Seek, SeekFrom};
    let mut src = std::fs::File::open(from).with_context(|| format!("{}", from.display()))?;
    let mut dst = std::os::unix::fs::OpenOptionsExt::mode(
        std::fs::OpenOptions::new().write(true).create_new(true),
        0o600,
    )
    .open(to)
    .with_context(|| format!("{}", to.display()))?;
    let len = src.metadata()?.len();
    let mut chunk = vec![0u8; 1 << 20];
    loop {
        let n = src.read(&mut chunk)?;
        let data = chunk.get(..n).unwrap_or_default();
        if data.is_empty() {
            break;
        }
        if data.iter().all(|&b| b == 0) {
            dst.seek(SeekFrom::Current(i64::try_from(n)?))?;
        } else {
            dst.write_all(data)?;
        }
    }
    dst.set_len(len)?;
    Ok(())
}

/// The byte range (offset, length) of the partition labelled `label` in a GPT disk whose
/// first `head` bytes (the protective MBR, the header and the entry array) are given.
pub fn gpt_partition(head: &[u8], label: &str) -> Result<(u64, u64)> {
    let at = |off: usize, len: usize| -> Result<&[u8]> {
        head.get(off..off + len).context("the GPT is cut short")
    };
    let u32_at = |off: usize| -> Result<u32> { Ok(u32::from_le_bytes(at(off, 4)?.try_into()?)) };
    let u64_at = |off: usize| -> Result<u64> { Ok(u64::from_le_bytes(at(off, 8)?.try_into()?)) };
    let header = usize::try_from(SECTOR)?;
    if at(header, 8)? != b"EFI PART" {
        bail!("no GPT header at LBA 1");
    }
    let entries = usize::try_from(u64_at(header + 72)? * SECTOR)?;
    let count = usize::try_from(u32_at(header + 80)?)?;
    let size = usize::try_from(u32_at(header + 84)?)?;
    if size < 128 {
        bail!("GPT entries of {size} bytes");
    }
    let want: Vec<u16> = label.encode_utf16().collect();
    for i in 0..count {
        let entry = entries + i * size;
        // The name: UTF-16LE, up to 36 code units, NUL-padded.
        let name: Vec<u16> = at(entry + 56, 72)?
            .chunks_exact(2)
            .filter_map(|c| <[u8; 2]>::try_from(c).ok())
            .map(u16::from_le_bytes)
            .take_while(|&c| c != 0)
            .collect();
        if at(entry, 16)? != [0u8; 16] && name == want {
            let first = u64_at(entry + 32)?;
            let last = u64_at(entry + 40)?;
            if last < first {
                bail!("the partition {label} ends before it starts");
            }
            return Ok((first * SECTOR, (last - first + 1) * SECTOR));
        }
    }
    bail!("no partition labelled {label}")
}

/// Copies the state partition of the VM's disk to `to` (mode 0600), where the host's checks
/// read its LUKS2 header as they read a process-mode node's image.
fn copy_state_partition(disk: &Path, to: &Path) -> Result<()> {
    use std::io::{Seek, SeekFrom};
    let mut src = std::fs::File::open(disk).with_context(|| format!("{}", disk.display()))?;
    // The protective MBR, the header and 128 entries of 128 bytes.
    let mut head = vec![0u8; 34 * 512];
    src.read_exact(&mut head)?;
    let (offset, len) = gpt_partition(&head, STATE_PARTITION_LABEL)
        .with_context(|| format!("{}", disk.display()))?;
    src.seek(SeekFrom::Start(offset))?;
    let mut dst = std::os::unix::fs::OpenOptionsExt::mode(
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true),
        0o600,
    )
    .open(to)
    .with_context(|| format!("{}", to.display()))?;
    std::io::copy(&mut src.take(len), &mut dst)?;
    Ok(())
}

/// A path as a QEMU option value: UTF-8, commas doubled (QEMU's escape).
fn qemu_value(path: &Path) -> Result<String> {
    let s = path
        .to_str()
        .with_context(|| format!("{} is not UTF-8", path.display()))?;
    Ok(s.replace(',', ",,"))
}

/// Starts the node's swtpm on a Unix control socket, detached, its pid in `run/swtpm.pid`.
/// Its state is the one `asterism-provision node` made (EK, AK). Returns the socket.
fn start_swtpm(ndir: &Path) -> Result<PathBuf> {
    let socket = ndir.join("run/swtpm.sock");
    let log = ndir.join("log/swtpm.log");
    let out = asterism_children::output(
        Command::new("swtpm")
            .arg("socket")
            .arg("--tpm2")
            // With --daemon, a relative state directory would be relative to `/`.
            .arg("--tpmstate")
            .arg(format!("dir={}", abs(&ndir.join("tpm"))?.display()))
            .arg("--ctrl")
            .arg(format!("type=unixio,path={}", socket.display()))
            .arg("--log")
            .arg(format!("file={}", log.display()))
            .arg("--pid")
            .arg(format!("file={}", ndir.join("run/swtpm.pid").display()))
            .arg("--daemon")
            .stdin(Stdio::null()),
    )
    .context("starting swtpm")?;
    if !out.status.success() {
        bail!(
            "swtpm failed to start ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            tail(&log)
        );
    }
    let start = Instant::now();
    while !socket.exists() {
        if start.elapsed() > Duration::from_secs(10) {
            bail!(
                "swtpm did not open {}; its log ends:\n{}",
                socket.display(),
                tail(&log)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(socket)
}

/// The guest's uptime on the first console line with `marker` (`… uptime=12.34`).
fn uptime_at(console: &str, marker: &str) -> Option<f64> {
    console
        .lines()
        .find(|l| l.contains(marker))?
        .split("uptime=")
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Splits a boot into firmware, kernel, init and bootstrapper from the console's uptimes
/// and the wall time from QEMU's start to the bootstrapper's exit.
fn boot_timing(console: &str, wall_seconds: f64, mode: BootMode) -> Option<BootTiming> {
    let init = uptime_at(console, "asterism-init: start ")?;
    let bootstrapper = uptime_at(console, "asterism-init: bootstrapper start ")?;
    let exited = uptime_at(console, "asterism-init: bootstrapper exited ")?;
    let round = |x: f64| (x * 100.0).round() / 100.0;
    Some(BootTiming {
        boot_mode: mode.name(),
        wall_seconds: round(wall_seconds),
        firmware_seconds: round(wall_seconds - exited),
        kernel_seconds: round(init),
        init_seconds: round(bootstrapper - init),
        bootstrapper_seconds: round(exited - bootstrapper),
    })
}

/// `asterism mini up --vm`.
pub async fn up(args: &UpArgs) -> Result<()> {
    let started = Instant::now();
    let vmc = VmCluster::create(
        &args.dir,
        args.workers,
        args.net,
        bin_dir(args)?,
        &args.vm_args,
    )?;
    let (record, _vms) = vmc.bring_up().await?;
    let cp = vmc.vms.first().context("no nodes")?;
    finish(
        &vmc.cluster,
        &record,
        started,
        &cp.node,
        &format!(
            "  consoles:     {}/nodes/*/console.log\n",
            vmc.cluster.dir.display()
        ),
        "nodes/*/console.log",
    )
}

impl VmCluster {
    /// Boots the control-plane VM, runs `asterism init` against it through its forwarded
    /// port (the node hosts the key and join services), waits for its bootstrapper and its
    /// join service, then boots the workers, which join over the cluster network. Records
    /// the outcome in `<dir>/mini.json`; returns it with the running VMs, the control plane
    /// first.
    pub async fn bring_up(&self) -> Result<(ClusterRecord, Vec<RunningVm>)> {
        let cp = self.vms.first().context("no nodes")?;
        let mut cp_vm = self.boot(cp)?;
        self.wait_for_init_server(cp, &mut cp_vm).await?;
        step(format!(
            "{} serves Init after {:.1} s; asterism init → {}:{INIT_PORT}",
            cp.node.name,
            cp_vm.started.elapsed().as_secs_f64(),
            cp.node.ip
        ));
        let mut init_args = self.cluster.init_args();
        init_args.host_cluster_services = true;
        let done = asterism::init::run(init_args).await?;
        let (exit, timing) = self
            .wait_for_bootstrapper(cp, &mut cp_vm, FINISH_DEADLINE)
            .await?;
        report_timing(cp, timing.as_ref(), "with asterism init");
        let workers = self.vms.get(1..).unwrap_or_default();
        if !workers.is_empty() {
            if exit != "ok" {
                bail!(
                    "the control plane's bootstrapper failed ({exit}); see {}",
                    cp.console().display()
                );
            }
            self.wait_for_join_service(cp, &mut cp_vm).await?;
        }
        let mut results = vec![(bootstrap_ms(timing.as_ref()), exit)];
        let mut running = vec![cp_vm];
        if !workers.is_empty() {
            step(format!(
                "the join service runs on {}:30090; {} worker(s) boot and join",
                cp.cluster_ip,
                workers.len()
            ));
            // All at once, as process mode starts them.
            for vm in workers {
                running.push(self.boot(vm)?);
            }
            for (vm, vm_running) in workers.iter().zip(running.iter_mut().skip(1)) {
                let (exit, timing) = self
                    .wait_for_bootstrapper(vm, vm_running, BOOT_DEADLINE)
                    .await?;
                report_timing(vm, timing.as_ref(), "until joined");
                results.push((bootstrap_ms(timing.as_ref()), exit));
            }
        }
        // The disk check reads the VMs' disk images from the host: the LUKS2 header is
        // written through, and the key check reads only the header. The members are those
        // the join service logged as admitted on the control plane's console.
        let members = self.members(cp)?;
        let record = self
            .cluster
            .record_with_members(&done.cluster_id, &results, &members)?;
        Ok((record, running))
    }

    /// The nodes the control plane's join service admitted, from its log on the console
    /// (one JSON object per line): `[{"name", "ak"}]`, as the join service's member list
    /// has them.
    pub fn members(&self, cp: &VmNode) -> Result<serde_json::Value> {
        let console = std::fs::read(cp.console())?;
        Ok(admitted_members(&String::from_utf8_lossy(&console)))
    }
}

/// The nodes a join service's JSON log admitted (`node joined: …`, `issued a rejoin ticket`).
fn admitted_members(console: &str) -> serde_json::Value {
    let field = |e: &serde_json::Value, name: &str| {
        e.get(name)
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned)
    };
    let members: Vec<serde_json::Value> = console
        .lines()
        .filter(|l| l.starts_with('{'))
        .filter_map(|json| serde_json::from_str::<serde_json::Value>(json).ok())
        .filter(|e| field(e, "target").is_some_and(|t| t.starts_with(JOIN_SERVICE_TARGET)))
        .filter(|e| {
            field(e, "message").is_some_and(|m| {
                m.starts_with("node joined") || m.starts_with("issued a rejoin ticket")
            })
        })
        .map(|e| serde_json::json!({ "name": field(&e, "node"), "ak": field(&e, "ak") }))
        .collect();
    serde_json::Value::Array(members)
}

fn bootstrap_ms(timing: Option<&BootTiming>) -> u64 {
    timing.map_or(0, |t| (t.bootstrapper_seconds * 1000.0).round() as u64)
}

/// Prints where the time of a boot went.
fn report_timing(vm: &VmNode, timing: Option<&BootTiming>, what: &str) {
    if let Some(t) = timing {
        step(format!(
            "{}: {:.1} s from QEMU's start to its bootstrapper's exit: firmware {:.1} s, kernel {:.1} s, init {:.1} s, bootstrapper {:.1} s ({what})",
            vm.node.name,
            t.wall_seconds,
            t.firmware_seconds,
            t.kernel_seconds,
            t.init_seconds,
            t.bootstrapper_seconds
        ));
    }
}

/// Arguments of the relay QEMU starts for each connection of a guest to its cloud metadata
/// address (`asterism-mini vm-cloud-relay`, not for people).
#[derive(clap::Args, Debug)]
pub struct CloudRelayArgs {
    /// The stand-in of the cloud's metadata service, IP:PORT.
    #[arg(long)]
    pub to: std::net::SocketAddr,
}

/// The cloud metadata relay (`asterism-mini vm-cloud-relay`): one guest connection, on
/// stdin and stdout, passed byte for byte to the stand-in at `--to` and back, for at most
/// [`RELAY_DEADLINE`]. Unlike [`metadata_relay`] it reads nothing: the stand-in sees the
/// guest's requests as they are, headers included.
pub fn cloud_relay(args: &CloudRelayArgs) -> Result<()> {
    std::thread::spawn(|| {
        std::thread::sleep(RELAY_DEADLINE);
        std::process::exit(1);
    });
    let mut upstream = std::net::TcpStream::connect(args.to)
        .with_context(|| format!("connecting to {}", args.to))?;
    let mut to_upstream = upstream.try_clone()?;
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut to_upstream);
        let _ = to_upstream.shutdown(std::net::Shutdown::Write);
    });
    // Each chunk is flushed as it comes: standard output buffers up to a newline, and an
    // answer's last bytes need not end with one.
    let mut out = std::io::stdout().lock();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let n = upstream.read(&mut chunk)?;
        if n == 0 {
            return Ok(());
        }
        out.write_all(chunk.get(..n).unwrap_or_default())?;
        out.flush()?;
    }
}

/// The metadata relay (`asterism-mini vm-metadata-relay`). QEMU starts it for each
/// connection of a guest to its metadata address, the connection on stdin and stdout
/// (stderr too: nothing may be written there). The metadata service answers `/self` by the
/// caller's source address, which the host cannot take for a guest: so the relay answers
/// `/self` from the service's `/peers` with the record of its node's address, and passes
/// every other GET through. One request per connection.
pub fn metadata_relay(args: &RelayArgs) -> Result<()> {
    // A guest that never finishes its request must not keep this process.
    std::thread::spawn(|| {
        std::thread::sleep(RELAY_DEADLINE);
        std::process::exit(1);
    });
    let head = read_request_head(&mut std::io::stdin().lock())?;
    let answer = relay_answer(args, &head);
    let mut out = std::io::stdout().lock();
    out.write_all(&answer)?;
    out.flush()?;
    Ok(())
}

/// Reads an HTTP request's head (up to the empty line), at most [`MAX_REQUEST_HEAD`] bytes.
fn read_request_head(input: &mut impl Read) -> Result<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() >= MAX_REQUEST_HEAD {
            bail!("the request head is larger than {MAX_REQUEST_HEAD} bytes");
        }
        if input.read(&mut byte)? == 0 {
            bail!("the connection closed within the request head");
        }
        head.extend_from_slice(&byte);
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

fn simple_answer(status: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The answer to one request head: `/self` from `/peers`, other GETs passed through.
fn relay_answer(args: &RelayArgs, head: &str) -> Vec<u8> {
    let mut words = head.lines().next().unwrap_or_default().split(' ');
    let (method, path) = (
        words.next().unwrap_or_default(),
        words.next().unwrap_or_default(),
    );
    let has_body = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:")
            || (l.starts_with("content-length:") && l.trim_end() != "content-length: 0")
    });
    if method != "GET" {
        return simple_answer("405 Method Not Allowed", "only GET is supported\n");
    }
    // The path goes into the request to the metadata service: no control characters.
    if has_body || !path.starts_with('/') || path.bytes().any(|b| b.is_ascii_control()) {
        return simple_answer("400 Bad Request", "bad request\n");
    }
    if path != "/self" {
        return http_get_raw(&args.metadata, path).unwrap_or_else(|_| {
            simple_answer("502 Bad Gateway", "metadata service unreachable\n")
        });
    }
    let Ok(peers) = http_get(&args.metadata, "/peers") else {
        return simple_answer("502 Bad Gateway", "metadata service unreachable\n");
    };
    let own = serde_json::from_str::<Vec<serde_json::Value>>(&peers)
        .ok()
        .and_then(|list| {
            list.into_iter().find(|i| {
                i.get("VPCIP")
                    .and_then(serde_json::Value::as_str)
                    .and_then(|ip| ip.parse::<std::net::IpAddr>().ok())
                    == Some(args.node_ip)
            })
        });
    match own {
        Some(instance) => {
            let body = instance.to_string();
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .into_bytes()
        }
        None => simple_answer("404 Not Found", "no instance has the caller's address\n"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn boot_timing_splits_the_console_uptimes() {
        let console = "\x1b[2J EFI stub: Loaded initrd\n\
            asterism-init: start uptime=3.50 kernel=6.1.0\n\
            asterism-init: bootstrapper start uptime=4.00\n\
            asterism-init: bootstrapper exited with status 0 uptime=9.00\n";
        let t = boot_timing(console, 21.0, BootMode::Uefi).unwrap();
        assert_eq!(t.boot_mode, "uefi");
        assert_eq!(t.firmware_seconds, 12.0);
        assert_eq!(t.kernel_seconds, 3.5);
        assert_eq!(t.init_seconds, 0.5);
        assert_eq!(t.bootstrapper_seconds, 5.0);
        assert!(boot_timing("asterism-init: start uptime=1\n", 5.0, BootMode::Uefi).is_none());
    }

    #[test]
    fn df_gives_the_available_space_of_its_one_filesystem() {
        let out = "Filesystem     1024-blocks      Used Available Capacity Mounted on\n\
                   /dev/sda1        263174212  77578356  18874368      81% /\n";
        assert_eq!(parse_df_available(out), Some(18_874_368 * 1024));
        assert_eq!(
            parse_df_available("Filesystem 1024-blocks Used Available\n"),
            None
        );
        assert_eq!(parse_df_available("header\n/dev/x 1 2 lots 3% /\n"), None);
    }

    #[test]
    fn a_running_qemu_is_seen_with_its_cpu_time_and_the_free_space() {
        // A `sleep` stands in for QEMU: a live process with a schedstat file.
        let child = asterism_children::spawn(Command::new("sleep").arg("30")).unwrap();
        let mut running = RunningVm {
            qemu: child,
            started: Instant::now(),
        };
        let dir = tempfile::tempdir().unwrap();
        let view = host_view(&running, dir.path());
        let _ = running.qemu.kill();
        let _ = running.qemu.wait();
        assert!(view.contains("runs and has used"), "{view}");
        assert!(view.contains(" MiB free"), "{view}");
        assert!(qemu_cpu_seconds(running.qemu.id()).is_none());
    }

    #[test]
    fn the_relay_refuses_other_methods_bodies_and_long_heads() {
        let args = RelayArgs {
            node_ip: "10.42.10.1".parse().unwrap(),
            metadata: "127.0.0.1:1".into(),
        };
        let answer = |head: &str| String::from_utf8(relay_answer(&args, head)).unwrap();
        assert!(answer("POST /self HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        assert!(
            answer("GET /self HTTP/1.1\r\nContent-Length: 3\r\n\r\n").starts_with("HTTP/1.1 400")
        );
        assert!(answer("GET /peers\rHost: x HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 400"));
        // Nothing listens on port 1: the service is unreachable, which the guest is told.
        assert!(answer("GET /self HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 502"));
        let long = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(MAX_REQUEST_HEAD));
        assert!(read_request_head(&mut long.as_bytes()).is_err());
        assert!(read_request_head(&mut "GET / HTTP/1.1\r\n".as_bytes()).is_err());
    }

    /// A metadata service that answers every request with `peers` and counts requests.
    fn fake_metadata(peers: &'static str) -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let mut stream = stream.unwrap();
                let _ = read_request_head(&mut stream);
                let _ = write!(
                    stream,
                    "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{peers}",
                    peers.len()
                );
            }
        });
        addr
    }

    #[test]
    fn the_relay_answers_self_with_its_own_nodes_record_only() {
        let peers = r#"[{"Name":"control-plane-0","VPCIP":"10.42.10.1"},{"Name":"worker-0","VPCIP":"10.42.10.2"}]"#;
        let metadata = fake_metadata(peers);
        let ask = |node_ip: &str| {
            let args = RelayArgs {
                node_ip: node_ip.parse().unwrap(),
                metadata: metadata.clone(),
            };
            String::from_utf8(relay_answer(&args, "GET /self HTTP/1.1\r\n\r\n")).unwrap()
        };
        let worker = ask("10.42.10.2");
        assert!(worker.starts_with("HTTP/1.1 200"), "{worker}");
        assert!(
            worker.ends_with(r#"{"Name":"worker-0","VPCIP":"10.42.10.2"}"#),
            "{worker}"
        );
        let stranger = ask("10.42.10.3");
        assert!(stranger.starts_with("HTTP/1.1 404"), "{stranger}");
        assert!(!stranger.contains("VPCIP"), "{stranger}");
    }

    #[test]
    fn the_members_are_the_nodes_the_join_service_logged_as_admitted() {
        let t = r#""target":"asterism_join_service::service""#;
        let console = [
            "asterism-init: join service ready on 10.42.7.1:30090 uptime=40.1".to_string(),
            format!(r#"{{"level":"INFO","message":"listening",{t}}}"#),
            format!(
                r#"{{"message":"node joined: issued a join ticket","node":"worker-1","ak":"ab12",{t}}}"#
            ),
            format!(r#"{{"message":"refused a join","node":"worker-2","ak":"cd34",{t}}}"#),
            // Another program's line, and a line that only says the words.
            r#"{"message":"node joined: issued a join ticket","node":"worker-3","ak":"ef56","target":"other"}"#.to_string(),
            "worker-4 node joined: issued a join ticket".to_string(),
            "{not JSON".to_string(),
            format!(r#"{{"message":"issued a rejoin ticket","node":"worker-1","ak":"ab12",{t}}}"#),
        ]
        .join("\n");
        let members = admitted_members(&console);
        assert_eq!(
            members,
            serde_json::json!([
                {"name": "worker-1", "ak": "ab12"},
                {"name": "worker-1", "ak": "ab12"},
            ])
        );
        assert_eq!(
            crate::member_verdict(&members, "worker-1"),
            "verified by join service (tpm-quote AK ab12)"
        );
        assert_eq!(crate::member_verdict(&members, "worker-2"), "not admitted");
    }

    #[test]
    fn qemu_values_escape_commas() {
        assert_eq!(qemu_value(Path::new("/a,b/c")).unwrap(), "/a,,b/c");
    }
}

//! End to end, VM mode: the control plane boots as a QEMU VM from the node image (OVMF,
//! its own swtpm, a copy of the image's disk), `asterism init` reaches it through the
//! forwarded port and verifies the PCRs the firmware and the kernel measured; it then runs
//! the key and join services, a worker VM joins it over the cluster network and rejoins
//! after a power cut; every node's state ends up on its disk's state partition (mapped,
//! mounted, encrypted), and `down` leaves no QEMU or swtpm running. The control plane gets
//! its settings by fw_cfg, the worker as SMBIOS OEM strings, as a bare-metal machine would.
//! That test boots from the disk with Secure Boot enforced, as a real machine would; the
//! firmware refuses an unsigned UKI and one signed by a key db does not hold, and the
//! verifier a node whose Secure Boot state (PCR 7) differs, naming the event. The
//! command-line test boots the kernel directly, which is quicker, as do the test of a node
//! whose settings are refused (it waits, and says why) and that of a node whose settings
//! are the file on its ESP. Every node that boots to its bootstrapper has containerd
//! answering on its socket first; a node with the kubeadm driver sets out to download the
//! components the version table pins (the download itself needs a network this machine
//! does not have).
//!
//! Needs QEMU, OVMF, the node image (`scripts/build-node-image`) and its reference
//! measurements (`scripts/boot-node-image`): `ASTERISM_NODE_IMAGE` and
//! `ASTERISM_NODE_REFERENCE` name them, by default `target/node-image` and
//! `target/node-reference` of the workspace (one `<boot mode>/measurements.json` each).
//! Without them the test says so on stderr and passes. Under TCG the boot alone takes 20 s
//! and more.

use crate::common::{TeardownAt, bins, runtime};
use asterism_mini::vm::{BootMode, Cloud, SettingsChannel, VmArgs, VmCluster, VmNode};
use asterism_testkit::cloud::{self, GceInstance};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Says on stderr, past the test harness's capture, why the test does not run.
fn skip(why: &str) {
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED bins/mini/tests/it/vm_mode.rs: {why} (docs/mini.md, \"VM mode\")"
    );
}

/// The image and measurements of a boot mode, or `None` (after saying why) when something
/// is missing.
fn vm_args(mode: BootMode) -> Option<VmArgs> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("the workspace holds bins/mini");
    let from_env = |var: &str, default: &str| {
        std::env::var_os(var).map_or_else(|| workspace.join(default), PathBuf::from)
    };
    if let Err(e) = asterism_mini::vm::check_host() {
        skip(&format!("{e:#}"));
        return None;
    }
    let image = from_env("ASTERISM_NODE_IMAGE", "target/node-image");
    if let Err(e) = asterism_mini::vm::NodeImage::locate(&image) {
        skip(&format!("{e:#}"));
        return None;
    }
    let args = VmArgs {
        image,
        vm_reference: from_env("ASTERISM_NODE_REFERENCE", "target/node-reference"),
        vm_measurements: None,
        secure_boot: mode == BootMode::SecureBoot,
        direct_kernel: mode == BootMode::DirectKernel,
    };
    if !args.measurements().is_file() {
        skip(&format!(
            "no reference measurements at {} (scripts/boot-node-image --boot {})",
            args.measurements().display(),
            mode.name()
        ));
        return None;
    }
    Some(args)
}

fn pid_in(path: &Path) -> u32 {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .parse()
        .unwrap()
}

/// Whether the process runs (a zombie has exited).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit_once(") ")
                .is_some_and(|(_, r)| !r.starts_with('Z'))
        })
        .unwrap_or(false)
}

/// One VM test at a time: each boots a VM, and the machine has few cores.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The node's state is on its encrypted disk, as its console shows it: mapped with dm-crypt
/// (and dm-integrity where the kernel has it), its file system mounted on state/, the node
/// state file on it and nowhere beneath the mount point, the first-boot passphrase gone.
fn assert_state_on_the_mapped_disk(console: &str, name: &str) {
    let dm = |what: &str| {
        console
            .lines()
            .any(|l| l.contains("asterism-init: dm dm-") && l.contains(what))
    };
    assert!(
        dm(" name=state uuid=CRYPT-LUKS2-"),
        "{name}: the disk is mapped with dm-crypt"
    );
    if console.contains("dm-integrity=yes") {
        assert!(dm(" name=state_dif "), "{name}: with dm-integrity beneath");
    }
    for line in [
        "asterism-init: mount /dev/mapper/state on /run/state type ext4 (rw,nosuid,nodev",
        "asterism-init: node state on the mounted disk: yes, beneath the mount point: no",
        "asterism-init: first-boot passphrase file left: no",
        "asterism-init: bootstrapper exited with status 0",
    ] {
        assert!(console.contains(line), "{name}: the console says {line:?}");
    }
}

/// What a node wrote is not on its disk image in plain text.
fn assert_encrypted(image: &Path, plain_texts: &[&[u8]]) {
    let image_bytes = std::fs::read(image).unwrap();
    for plain in plain_texts {
        assert!(
            !image_bytes.windows(plain.len()).any(|w| w == *plain),
            "{:?} is on {} in plain text",
            String::from_utf8_lossy(plain),
            image.display()
        );
    }
}

/// The image's init started containerd before the bootstrapper, and containerd answered on
/// its socket (ctr, containerd's own client, got the server's version over it) with the
/// version of the Debian package the image was built from, its CRI plugin loaded.
fn assert_containerd_answered_before_the_bootstrapper(console: &str, image: &Path, name: &str) {
    let image_json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(image.join("image.json")).unwrap()).unwrap();
    let package = image_json["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "containerd")
        .expect("image.json names the containerd package");
    // Debian's version (1.6.20~ds1-1+deb12u3) begins with containerd's own (1.6.20).
    let upstream = package["version"]
        .as_str()
        .unwrap()
        .split(['~', '-', '+'])
        .next()
        .unwrap();
    let answered = format!(
        "asterism-init: containerd answers on /run/containerd/containerd.sock: version {upstream}"
    );
    let at = |needle: &str| {
        console
            .find(needle)
            .unwrap_or_else(|| panic!("{name}: the console says {needle:?}:\n{console}"))
    };
    assert!(
        at(&answered) < at("asterism-init: bootstrapper start"),
        "{name}: containerd answered before the bootstrapper started"
    );
    at("asterism-init: containerd CRI plugin: ok");
}

#[test]
fn a_control_plane_and_a_worker_vm_boot_from_the_disk_with_secure_boot_and_the_worker_rejoins_after_a_power_cut()
 {
    let Some(args) = vm_args(BootMode::SecureBoot) else {
        return;
    };
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("c");
    let _teardown = TeardownAt(dir.clone());
    let mut vmc = VmCluster::create(&dir, 1, 71, bins(), &args).unwrap();
    // The worker's settings (addresses, name, AK certificate, the cluster to join and the
    // join service to trust) as SMBIOS OEM strings, with no fw_cfg entry of this project.
    vmc.worker_settings = SettingsChannel::SmbiosOemStrings;
    let (record, mut vms) = runtime().block_on(vmc.bring_up()).unwrap();

    // Both nodes bootstrapped, and their disks open with the keys derived from the
    // workspace's master secret (checked on the host, from the disk images).
    for node in &record.nodes {
        assert_eq!(node.exit, "ok", "{node:?}");
        assert!(
            node.disk_rekeyed,
            "the disk opens with the derived key: {node:?}"
        );
    }
    assert!(dir.join("workspace/master-secret.json").is_file());
    let cluster_id = std::fs::read_to_string(dir.join("workspace/cluster-id")).unwrap();

    // The control plane: initialised, its state on its disk, and it runs the key and join
    // services, whose secrets are on that disk too.
    let cp = &vmc.vms[0].node;
    let cp_console = std::fs::read_to_string(cp.dir.join("console.log")).unwrap();
    // Booted from the disk by the firmware: systemd-stub started the kernel, and the init
    // found the state partition by its label.
    assert!(
        cp_console.contains("BdsDxe: starting Boot0001 \"UEFI Misc Device\""),
        "the firmware booted the disk (virtio-blk is a misc device to OVMF)"
    );
    for line in [
        "asterism-init: settings from fw-cfg",
        "asterism-init: tpm0=yes tpmrm0=yes state=/dev/vda2",
        "asterism-init: eth1 10.42.71.1/24",
        "asterism-init: join service ready on 10.42.71.1:30090",
    ] {
        assert!(cp_console.contains(line), "the console says {line:?}");
    }
    assert_state_on_the_mapped_disk(&cp_console, "control plane");
    assert_containerd_answered_before_the_bootstrapper(&cp_console, &args.image, "control plane");
    assert_encrypted(
        &cp.dir.join("state.img"),
        &[
            b"MeasurementSalt",
            b"kubernetes_version",
            b"ssh-ed25519",
            b"BEGIN CERTIFICATE",
        ],
    );

    // The worker: told the cluster by SMBIOS OEM strings, admitted by the control plane's
    // join service over the cluster network after it verified the worker's quote (with the
    // AK certificate the strings carried), its state on its own mapped disk.
    let worker = &vmc.vms[1].node;
    let worker_record = &record.nodes[1];
    assert!(
        worker_record
            .attestation
            .starts_with("verified by join service (tpm-quote AK "),
        "{worker_record:?}"
    );
    let console = std::fs::read_to_string(worker.dir.join("console.log")).unwrap();
    assert!(
        console.contains("asterism-init: settings from smbios"),
        "the worker read SMBIOS OEM strings"
    );
    // The worker's QEMU, still running: SMBIOS OEM strings, no fw_cfg entry of this project.
    let worker_qemu = std::fs::read(format!(
        "/proc/{}/cmdline",
        pid_in(&worker.dir.join("run/qemu.pid"))
    ))
    .unwrap();
    let worker_qemu = String::from_utf8_lossy(&worker_qemu);
    assert!(
        worker_qemu.contains("type=11,value=asterism.") && !worker_qemu.contains("opt/asterism"),
        "{worker_qemu}"
    );
    assert!(
        console.contains(&format!(
            "asterism-init: joins cluster {}",
            cluster_id.trim()
        )),
        "the worker is told its cluster"
    );
    assert!(console.contains("asterism-init: eth1 10.42.71.2/24"));
    assert_state_on_the_mapped_disk(&console, "worker");
    assert_containerd_answered_before_the_bootstrapper(&console, &args.image, "worker");
    assert!(
        !console.contains("join service ready"),
        "only the first control plane runs the services"
    );
    assert_encrypted(
        &worker.dir.join("state.img"),
        &[b"MeasurementSalt", b"BEGIN CERTIFICATE"],
    );

    // A power cut of the worker: the VM and its TPM stop, the disk and TPM state stay. On
    // the next boot its bootstrapper finds its disk initialised, gets the disk key with a
    // rejoin ticket, and maps and mounts the disk again.
    let worker_vm = vms.pop().unwrap();
    let first_console = vmc.power_off(&vmc.vms[1], worker_vm).unwrap();
    assert!(first_console.is_file());
    let mut rebooted = vmc.boot(&vmc.vms[1]).unwrap();
    let (exit, _) = runtime()
        .block_on(vmc.wait_for_bootstrapper(
            &vmc.vms[1],
            &mut rebooted,
            std::time::Duration::from_secs(600),
        ))
        .unwrap();
    assert_eq!(exit, "ok");
    let console = std::fs::read_to_string(worker.dir.join("console.log")).unwrap();
    assert_state_on_the_mapped_disk(&console, "rebooted worker");
    let members = vmc.members(&vmc.vms[0]).unwrap();
    let admitted: Vec<&str> = members
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["name"].as_str())
        .collect();
    assert_eq!(
        admitted,
        ["worker-0", "worker-0"],
        "joined once, then rejoined: {members}"
    );
    let cp_console = std::fs::read_to_string(cp.dir.join("console.log")).unwrap();
    assert!(cp_console.contains("issued a rejoin ticket"));
    vms.push(rebooted);

    // `down` stops every VM and TPM, by their pid files.
    let pids: Vec<u32> = vmc
        .vms
        .iter()
        .flat_map(|v| {
            [
                pid_in(&v.node.dir.join("run/qemu.pid")),
                pid_in(&v.node.dir.join("run/swtpm.pid")),
            ]
        })
        .collect();
    assert!(pids.iter().all(|&p| running(p)), "the VMs keep running");
    asterism_mini::down(asterism_mini::DirArgs { dir: dir.clone() }).unwrap();
    for pid in pids {
        assert!(!running(pid), "pid {pid} stopped");
    }
    drop(vms);
}

#[test]
fn a_vm_booted_with_a_changed_command_line_is_refused_naming_pcr_9() {
    let Some(args) = vm_args(BootMode::DirectKernel) else {
        return;
    };
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("c");
    let _teardown = TeardownAt(dir.clone());
    let mut vmc = VmCluster::create(&dir, 0, 73, bins(), &args).unwrap();
    // The kernel's EFI stub measures the command line into PCR 9; the reference boot's
    // measurements were taken without this word.
    vmc.image.cmdline.push_str(" quiet");
    let cp = vmc.vms[0].clone();
    let mut vm = vmc.boot(&cp).unwrap();
    runtime()
        .block_on(vmc.wait_for_init_server(&cp, &mut vm))
        .unwrap();
    let refused = runtime()
        .block_on(asterism::init::run(vmc.cluster.init_args()))
        .expect_err("a node with another command line is refused");
    // The CLI keeps the verifier's refusal as text only (its connect error is formatted):
    // the variant and its index are asserted on as that text shows them.
    let reason = format!("{refused:#}");
    assert!(
        reason.contains("Rejected(Measurement { index: 9, expected: \""),
        "refused for PCR 9, the measured command line: {reason}"
    );
    for other in [0, 1, 2, 3, 4, 5, 6, 7, 8, 15] {
        assert!(
            !reason.contains(&format!("Measurement {{ index: {other},")),
            "refused for PCR 9 alone: {reason}"
        );
    }
    assert!(
        !dir.join("workspace/master-secret.json").exists(),
        "no master secret was written for a refused node"
    );
}

#[test]
fn a_node_whose_settings_are_refused_waits_and_says_why_with_nothing_applied() {
    let Some(args) = vm_args(BootMode::DirectKernel) else {
        return;
    };
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("c");
    let _teardown = TeardownAt(dir.clone());
    let mut vmc = VmCluster::create(&dir, 0, 77, bins(), &args).unwrap();
    // The bootstrapper's arguments are no setting: a source that names them is refused
    // whole, with the node's good settings beside them.
    vmc.extra_settings
        .push("asterism.args=--insecure-fast-disk-kdf".into());
    let cp = vmc.vms[0].clone();
    let mut vm = vmc.boot(&cp).unwrap();
    let waits = "asterism-init: settings from fw-cfg refused or unavailable, none applied";
    runtime()
        .block_on(vmc.wait_for_console(&cp, &mut vm, std::time::Duration::from_secs(600), waits))
        .unwrap();
    // It keeps waiting: the init tries again every 10 s, and is refused again.
    let console_path = cp.node.dir.join("console.log");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let console = loop {
        let console = std::fs::read_to_string(&console_path).unwrap_or_default();
        if console.matches(waits).count() >= 2 {
            break console;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the init did not try again: {console}"
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
    assert!(
        console.contains("node settings refused; nothing applied")
            && console.contains("unknown key")
            && console.contains("args"),
        "the program's log line names the source and the key: {console}"
    );
    for never in [
        "asterism-init: eth0 ",
        "asterism-init: eth1 ",
        "asterism-init: bootstrapper start",
    ] {
        assert!(!console.contains(never), "{never:?} in {console}");
    }
}

#[test]
fn a_node_reads_its_settings_from_the_file_on_its_esp() {
    let Some(args) = vm_args(BootMode::DirectKernel) else {
        return;
    };
    if !have("mcopy") {
        skip("mcopy (mtools) is missing");
        return;
    }
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("c");
    let _teardown = TeardownAt(dir.clone());
    let mut vmc = VmCluster::create(&dir, 0, 78, bins(), &args).unwrap();
    // Neither fw_cfg nor SMBIOS OEM strings: the init finds no source, mounts the ESP,
    // and finds the settings file there.
    vmc.control_plane_settings = SettingsChannel::EspFile;
    let cp = vmc.vms[0].clone();
    let mut vm = vmc.boot(&cp).unwrap();
    runtime()
        .block_on(vmc.wait_for_init_server(&cp, &mut vm))
        .unwrap();
    assert_settings_from_elsewhere(
        &cp,
        &[
            "asterism-init: ESP /dev/vda1 mounted read-only on /boot/efi",
            "asterism-init: settings from esp",
            "asterism-init: eth1 10.42.78.1/24",
        ],
    );
}

/// Asserts that QEMU gave `vm` no settings itself (no fw_cfg entry under `opt/asterism`, no
/// SMBIOS OEM strings), and that its console has each of `lines`.
fn assert_settings_from_elsewhere(vm: &VmNode, lines: &[&str]) {
    let qemu = std::fs::read(format!(
        "/proc/{}/cmdline",
        pid_in(&vm.node.dir.join("run/qemu.pid"))
    ))
    .unwrap();
    let qemu = String::from_utf8_lossy(&qemu);
    assert!(
        !qemu.contains("opt/asterism") && !qemu.contains("type=11"),
        "{qemu}"
    );
    let console = std::fs::read_to_string(vm.node.dir.join("console.log")).unwrap();
    for line in lines {
        assert!(console.contains(line), "{line:?} not in {console}");
    }
}

/// One request a cloud stand-in was asked: `METHOD path?query`, and its headers.
type Asked = (String, Vec<(String, String)>);

/// Boots a node whose settings come from `cloud`'s metadata service: the stand-in
/// `stand_in(host name, cluster address)` makes, recording each request. Waits until the
/// bootstrapper starts; checks that QEMU gave no settings itself, that the first interface
/// took a DHCP lease, that the settings came from `source`, and that the host name and the
/// cluster address (followed by `ip_suffix`) are the stand-in's. Returns the requests.
fn boot_with_cloud_settings(
    cloud: Cloud,
    net: u8,
    source: &str,
    ip_suffix: &str,
    stand_in: impl FnOnce(&str, &str) -> cloud::Handler,
) -> Vec<Asked> {
    let Some(args) = vm_args(BootMode::DirectKernel) else {
        return Vec::new();
    };
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("c");
    let _teardown = TeardownAt(dir.clone());
    // One runtime for the stand-in and the waits: it serves while the test waits.
    let rt = runtime();
    let mut vmc = VmCluster::create(&dir, 0, net, bins(), &args).unwrap();
    let cp = vmc.vms[0].clone();
    let hostname = format!("{}.internal", cp.node.name);
    let cluster_ip = cp.cluster_ip.to_string();
    let asked: Arc<Mutex<Vec<Asked>>> = Arc::default();
    let handler = stand_in(&hostname, &cluster_ip);
    let record = asked.clone();
    let addr = rt.block_on(cloud::serve(Arc::new(move |parts| {
        let headers = parts
            .headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("?").to_string()))
            .collect();
        record
            .lock()
            .unwrap()
            .push((format!("{} {}", parts.method, parts.uri), headers));
        handler(parts)
    })));
    vmc.control_plane_settings = SettingsChannel::CloudMetadata(cloud, addr);
    let mut vm = vmc.boot(&cp).unwrap();
    rt.block_on(vmc.wait_for_console(
        &cp,
        &mut vm,
        std::time::Duration::from_secs(600),
        "asterism-init: bootstrapper start",
    ))
    .unwrap();
    assert_settings_from_elsewhere(
        &cp,
        &[
            "asterism-init: eth0 by DHCP: 169.254.0.15/16",
            &format!("asterism-init: settings from {source}"),
            &format!("asterism-init: hostname {hostname}"),
            &format!("asterism-init: eth1 {cluster_ip}{ip_suffix} "),
        ],
    );
    asked.lock().unwrap().clone()
}

/// Whether `asked` holds `request` with header `name` set to `value`.
fn asked_with(asked: &[Asked], request: &str, name: &str, value: &str) -> bool {
    asked
        .iter()
        .any(|(r, headers)| r == request && headers.iter().any(|(k, v)| k == name && v == value))
}

#[test]
fn a_gce_node_gets_its_address_by_dhcp_then_its_settings_from_the_metadata_server() {
    let asked = boot_with_cloud_settings(Cloud::Gce, 80, "gce", "", |hostname, ip| {
        cloud::gce(
            GceInstance {
                // No asterism-* attribute: a node that waits to be initialised.
                attributes: serde_json::json!({"ssh-keys": "someone:ssh-ed25519 AAAA"}),
                hostname: hostname.into(),
                ip: ip.into(),
            },
            true,
        )
    });
    if asked.is_empty() {
        return;
    }
    for path in [
        "/computeMetadata/v1/instance/attributes/?recursive=true",
        "/computeMetadata/v1/instance/hostname",
        "/computeMetadata/v1/instance/network-interfaces/0/ip",
    ] {
        assert!(
            asked_with(&asked, &format!("GET {path}"), "metadata-flavor", "Google"),
            "{path} asked with Metadata-Flavor: {asked:?}"
        );
    }
}

#[test]
fn an_azure_node_gets_its_settings_from_imds_with_the_metadata_header() {
    let asked = boot_with_cloud_settings(Cloud::Azure, 81, "azure", "/24", |hostname, ip| {
        // No user data: a node that waits to be initialised.
        cloud::azure(String::new(), cloud::azure_instance(hostname, ip, 24))
    });
    if asked.is_empty() {
        return;
    }
    for request in [
        "GET /metadata/instance/compute/userData?api-version=2021-01-01&format=text",
        "GET /metadata/instance?api-version=2021-02-01",
    ] {
        assert!(
            asked_with(&asked, request, "metadata", "true"),
            "{request} asked with Metadata: true: {asked:?}"
        );
    }
}

#[test]
fn an_aws_node_gets_its_settings_from_imdsv2_with_a_session_token() {
    let state: Arc<Mutex<Option<Arc<cloud::Aws>>>> = Arc::default();
    let keep = state.clone();
    let asked = boot_with_cloud_settings(Cloud::Aws, 82, "aws", "", move |hostname, ip| {
        // No user data: a node that waits to be initialised.
        let aws = Arc::new(cloud::Aws::new(None, hostname, ip));
        *keep.lock().unwrap() = Some(aws.clone());
        cloud::aws(aws)
    });
    if asked.is_empty() {
        return;
    }
    let token = state.lock().unwrap().as_ref().unwrap().token;
    assert!(
        asked.iter().any(|(r, headers)| r == "PUT /latest/api/token"
            && headers
                .iter()
                .any(|(k, _)| k == "x-aws-ec2-metadata-token-ttl-seconds")),
        "a session token asked for: {asked:?}"
    );
    for path in ["/latest/meta-data/hostname", "/latest/meta-data/local-ipv4"] {
        assert!(
            asked_with(
                &asked,
                &format!("GET {path}"),
                "x-aws-ec2-metadata-token",
                token
            ),
            "{path} asked with the session token: {asked:?}"
        );
    }
}

/// The console without the terminal's colour sequences (`ESC [ … m`), which the
/// bootstrapper's log has on the console, a terminal.
fn without_colours(console: &str) -> String {
    let mut out = String::with_capacity(console.len());
    let mut rest = console;
    while let Some(at) = rest.find("\x1b[") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        rest = after.find('m').map_or("", |end| &after[end + 1..]);
    }
    out.push_str(rest);
    out
}

/// The bootstrapper's arguments of a node that runs Kubernetes with kubeadm: the image's
/// (scripts/node-image/args) with the kubeadm driver instead of none, on the command line
/// (`asterism.args`, commas between them).
const KUBEADM_ARGS: &str = "asterism.args=--node-dir=/run,--metadata-url=http://10.0.2.100:8080,\
--kubernetes-driver=kubeadm,--join-retry-interval=1s,--insecure-fast-disk-kdf,\
--state-disk-unlock=map,--mkfs=/usr/sbin/mke2fs";

#[test]
fn a_kubeadm_node_starts_containerd_then_fetches_the_components_the_version_table_pins() {
    let Some(mut args) = vm_args(BootMode::DirectKernel) else {
        return;
    };
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("c");
    let _teardown = TeardownAt(dir.clone());
    // The kernel's EFI stub measures the command line into PCR 9, and this one names the
    // kubeadm driver: PCR 9 is warn-only for this node (the verifier still checks every
    // other PCR; a_vm_booted_with_a_changed_command_line_is_refused_naming_pcr_9 shows that
    // it is enforced otherwise).
    let mut measurements: serde_json::Value =
        serde_json::from_slice(&std::fs::read(args.measurements()).unwrap()).unwrap();
    let pcr9 = &mut measurements["measurements"]["9"];
    let expected = pcr9
        .get("expected")
        .unwrap_or(pcr9)
        .as_str()
        .expect("the reference has PCR 9")
        .to_string();
    *pcr9 = serde_json::json!({"expected": expected, "warnOnly": true});
    let measurements_file = tmp.path().join("measurements.json");
    std::fs::write(&measurements_file, measurements.to_string()).unwrap();
    args.vm_measurements = Some(measurements_file);
    let mut vmc = VmCluster::create(&dir, 0, 79, bins(), &args).unwrap();
    vmc.image.cmdline.push(' ');
    vmc.image.cmdline.push_str(KUBEADM_ARGS);
    let cp = vmc.vms[0].clone();
    let mut vm = vmc.boot(&cp).unwrap();
    runtime()
        .block_on(vmc.wait_for_init_server(&cp, &mut vm))
        .unwrap();
    // `asterism init` sends the default Kubernetes version and its components; the node's
    // kubeadm driver installs them first, and here, without a way to the internet, its
    // first download fails and is retried. The init does not finish: the test stops the
    // VM once the console shows the download step, and the CLI's thread with it.
    let init_args = vmc.cluster.init_args();
    std::thread::spawn(move || {
        let _ = runtime().block_on(asterism::init::run(init_args));
    });
    runtime()
        .block_on(vmc.wait_for_console(
            &cp,
            &mut vm,
            std::time::Duration::from_secs(600),
            "download attempt failed",
        ))
        .unwrap();
    let console =
        without_colours(&std::fs::read_to_string(cp.node.dir.join("console.log")).unwrap());
    assert_containerd_answered_before_the_bootstrapper(&console, &args.image, "kubeadm node");
    assert_kubeadm_node_prepared(&console);

    // Every component of the default version, with the URL and the hash the version table
    // pins, is what the driver set out to install; the first is being downloaded.
    let release = asterism_kubernetes_versions::VersionTable::builtin()
        .unwrap()
        .resolve(asterism::init::DEFAULT_REQUEST)
        .unwrap();
    let lines: Vec<&str> = console.lines().collect();
    let said = |what: &str, url: &str, hash: &str| {
        lines.iter().any(|l| {
            l.contains(what)
                && l.contains(&format!("url={url} "))
                && l.contains(&format!("hash={hash}"))
        })
    };
    let components = release.components();
    assert!(
        components.iter().any(|c| c.url.ends_with("/kubelet"))
            && components.iter().any(|c| c.url.ends_with("/kubeadm")),
        "kubelet and kubeadm are among the components: {components:?}"
    );
    for c in components.iter().filter(|c| c.url.starts_with("https://")) {
        assert!(
            said("component to install", &c.url, &c.hash),
            "the driver names {} with {}:\n{console}",
            c.url,
            c.hash
        );
    }
    let first = &components[0];
    assert!(
        said("downloading component", &first.url, &first.hash),
        "the driver downloads {} first:\n{console}",
        first.url
    );
    assert!(
        !console.contains("kubeadm driver: kubeadm init finished"),
        "nothing was installed, so kubeadm did not run"
    );
}

/// What the init makes of a kubeadm node besides containerd (scripts/node-image/init,
/// `prepare_kubernetes_node`): the kernel settings kubeadm's preflight checks, its required
/// programs each run against the kernel, and the kubelet's supervisor, which has not been
/// enabled: the bootstrapper enables it only after the components are installed, and here
/// their download fails.
fn assert_kubeadm_node_prepared(console: &str) {
    let line = |prefix: &str| {
        console
            .lines()
            .find(|l| l.contains(prefix))
            .unwrap_or_else(|| panic!("{prefix:?} not on the console:\n{console}"))
            .to_string()
    };
    let settings = line("asterism-init: kubernetes kernel settings:");
    assert!(
        settings.ends_with(
            "net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1 \
             net.bridge.bridge-nf-call-ip6tables=1"
        ),
        "{settings}"
    );
    let programs = line("asterism-init: kubeadm preflight programs:");
    assert!(
        programs.contains("(nf_tables), nat table ok;"),
        "iptables reaches the NAT table: {programs}"
    );
    let count = programs
        .split(", count ")
        .nth(1)
        .and_then(|rest| rest.split(';').next())
        .unwrap_or_default();
    assert!(
        count.parse::<u64>().is_ok(),
        "conntrack reads the connection count: {programs}"
    );
    assert!(
        programs.ends_with("ip mount nsenter ionice ") && !programs.contains("(missing)"),
        "{programs}"
    );
    let config = line("asterism-init: kernel configuration for kubeadm's system verification:");
    assert!(
        config.contains(": /boot/config-") && !config.contains("missing"),
        "{config}"
    );
    let _ = line("asterism-init: kubelet supervisor started");
    assert!(
        !console.contains("kubelet-service: enabled"),
        "the supervisor ran before the bootstrapper enabled it:\n{console}"
    );
    let supervisor = console.find("kubelet supervisor started").unwrap_or(0);
    let bootstrapper = console
        .find("asterism-init: bootstrapper start")
        .unwrap_or(0);
    assert!(
        supervisor < bootstrapper,
        "the node is prepared before the bootstrapper starts"
    );
}

/// Whether `program` runs here (`--help` or `--version` answers).
fn have(program: &str) -> bool {
    asterism_children::status(
        std::process::Command::new(program)
            .arg("--version")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null()),
    )
    .is_ok()
}

/// Runs `program` with `args` and asserts that it succeeded.
fn run_ok(program: &str, args: &[&std::ffi::OsStr]) {
    let out = asterism_children::output(std::process::Command::new(program).args(args)).unwrap();
    assert!(out.status.success(), "{program}: {out:?}");
}

/// The image's UKI without its signature, written to `to`.
fn unsigned_uki(args: &VmArgs, to: &Path) {
    std::fs::copy(args.image.join("uki.efi"), to).unwrap();
    run_ok("sbattach", &["--remove".as_ref(), to.as_os_str()]);
}

/// Boots a Secure Boot VM whose disk's default boot entry is `uki` and asserts that the
/// firmware refuses to start it and nothing of the image runs.
fn assert_the_firmware_refuses(args: &VmArgs, net: u8, uki: &Path) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("c");
    let _teardown = TeardownAt(dir.clone());
    let vmc = VmCluster::create(&dir, 0, net, bins(), args).unwrap();
    let cp = vmc.vms[0].clone();
    // In the node's copy of the disk, where the firmware's default boot entry finds it.
    let disk = cp.node.dir.join(asterism_mini::vm::NODE_DISK);
    let head = {
        use std::io::Read as _;
        let mut head = vec![0u8; 34 * 512];
        std::fs::File::open(&disk)
            .unwrap()
            .read_exact(&mut head)
            .unwrap();
        head
    };
    let (esp, _) = asterism_mini::vm::gpt_partition(&head, "EFI system partition").unwrap();
    let image = format!("{}@@{esp}", disk.display());
    run_ok(
        "mcopy",
        &[
            "-o".as_ref(),
            "-i".as_ref(),
            image.as_ref(),
            uki.as_os_str(),
            "::/EFI/BOOT/BOOTX64.EFI".as_ref(),
        ],
    );

    let mut vm = vmc.boot(&cp).unwrap();
    let refused = runtime()
        .block_on(vmc.wait_for_init_server(&cp, &mut vm))
        .expect_err("the firmware does not start the UKI");
    let reason = format!("{refused:#}");
    assert!(
        reason.contains("refused to start the image's UKI (Access Denied: Secure Boot"),
        "{reason}"
    );
    let console = std::fs::read_to_string(cp.node.dir.join("console.log")).unwrap();
    assert!(
        !console.contains("asterism-init: start"),
        "nothing of the image ran"
    );
}

#[test]
fn secure_boot_firmware_refuses_an_unsigned_uki() {
    let Some(args) = vm_args(BootMode::SecureBoot) else {
        return;
    };
    if !have("sbattach") || !have("mcopy") {
        skip("sbattach (sbsigntool) or mcopy (mtools) is missing");
        return;
    }
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let unsigned = tmp.path().join("unsigned.efi");
    unsigned_uki(&args, &unsigned);
    assert_the_firmware_refuses(&args, 74, &unsigned);
}

#[test]
fn secure_boot_firmware_refuses_a_uki_signed_by_a_key_db_does_not_hold() {
    let Some(args) = vm_args(BootMode::SecureBoot) else {
        return;
    };
    if !have("sbattach") || !have("sbsign") || !have("mcopy") || !have("openssl") {
        skip("sbattach, sbsign (sbsigntool), mcopy (mtools) or openssl is missing");
        return;
    }
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let p = |name: &str| tmp.path().join(name);
    // A key and certificate made now, which no firmware variable enrols.
    run_ok(
        "openssl",
        &[
            "req",
            "-new",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=Not enrolled/",
        ]
        .map(std::ffi::OsStr::new)
        .into_iter()
        .chain([
            "-keyout".as_ref(),
            p("other.key").as_os_str(),
            "-out".as_ref(),
            p("other.pem").as_os_str(),
        ])
        .collect::<Vec<_>>(),
    );
    unsigned_uki(&args, &p("unsigned.efi"));
    run_ok(
        "sbsign",
        &[
            "--key".as_ref(),
            p("other.key").as_os_str(),
            "--cert".as_ref(),
            p("other.pem").as_os_str(),
            "--output".as_ref(),
            p("other.efi").as_os_str(),
            p("unsigned.efi").as_os_str(),
        ],
    );
    // A valid signature, by that key: what the firmware refuses is the key, not the form.
    run_ok(
        "sbverify",
        &[
            "--cert".as_ref(),
            p("other.pem").as_os_str(),
            p("other.efi").as_os_str(),
        ],
    );
    assert_the_firmware_refuses(&args, 76, &p("other.efi"));
}

/// Log lines of every event, from now until the guard is dropped (the tests' runtime runs
/// on this thread).
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_vm_booted_without_secure_boot_is_refused_naming_the_secure_boot_event_of_pcr_7() {
    let Some(args) = vm_args(BootMode::SecureBoot) else {
        return;
    };
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("c");
    let _teardown = TeardownAt(dir.clone());
    let vmc = VmCluster::create(&dir, 0, 75, bins(), &args).unwrap();
    let cp = vmc.vms[0].clone();
    // The same firmware, but with variables that enrol no keys: Secure Boot is off, and the
    // same UKI starts unverified. The firmware measures the Secure Boot variables, and the
    // db entry that verified the UKI, into PCR 7. Two more PCRs differ, each for its own
    // reason: PCR 0 (OVMF measures a firmware volume from memory whose contents differ with
    // these variables) and PCR 4 (without Secure Boot, systemd-stub starts the kernel with
    // LoadImage, which the firmware measures).
    std::fs::copy(
        asterism_mini::vm::OVMF_VARS,
        cp.node.dir.join("OVMF_VARS_4M.fd"),
    )
    .unwrap();
    let mut vm = vmc.boot(&cp).unwrap();
    runtime()
        .block_on(vmc.wait_for_init_server(&cp, &mut vm))
        .unwrap();
    let logs = Captured::default();
    let sink = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing_subscriber::filter::LevelFilter::INFO)
        .with_ansi(false)
        .with_writer(move || sink.clone())
        .finish();
    let refused = {
        let _guard = tracing_subscriber::util::SubscriberInitExt::set_default(subscriber);
        runtime()
            .block_on(asterism::init::run(vmc.cluster.init_args()))
            .expect_err("a node without Secure Boot is refused")
    };
    let reason = format!("{refused:#}");
    assert!(
        reason.contains("Rejected(Measurement { index: "),
        "refused for a measurement: {reason}"
    );
    // The verifier explains every PCR that differs by its first event that differs: PCR 7's
    // is the SecureBoot variable, off where the reference has it on.
    let logs = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let explained: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("PCR differs from its expected value at this event"))
        .collect();
    let pcr = |n: u8| {
        explained
            .iter()
            .find(|l| l.contains(&format!("pcr={n} ")))
            .copied()
    };
    let pcr7 = pcr(7).unwrap_or_else(|| panic!("the verifier explains PCR 7: {explained:#?}"));
    assert!(
        pcr7.contains("PCR 7 event 1 (EV_EFI_VARIABLE_DRIVER_CONFIG SecureBoot off)")
            && pcr7.contains("(EV_EFI_VARIABLE_DRIVER_CONFIG SecureBoot on)"),
        "{pcr7}"
    );
    let pcr4 = pcr(4).unwrap_or_else(|| panic!("PCR 4 differs too: {explained:#?}"));
    assert!(
        pcr4.contains("PCR 4 event 4 (EV_EFI_BOOT_SERVICES_APPLICATION")
            && pcr4.contains("expected no such event"),
        "only the kernel's own event is new in PCR 4: {pcr4}"
    );
    for n in [5, 9] {
        assert!(
            pcr(n).is_none(),
            "PCR {n} is the reference's: {explained:#?}"
        );
    }
    assert!(
        !dir.join("workspace/master-secret.json").exists(),
        "no master secret was written for a refused node"
    );
}

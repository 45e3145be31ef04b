//! End to end, VM mode: the control plane boots as a QEMU VM from the node image (OVMF,
//! its own swtpm, a virtio state disk), `asterism init` reaches it through the forwarded
//! port and verifies the PCRs the firmware and the kernel measured, the node's state ends up
//! on its disk (mapped, mounted, encrypted), and `down` leaves no QEMU or swtpm running.
//!
//! Needs QEMU, OVMF, the node image (`scripts/build-node-image`) and its reference
//! measurements (`scripts/boot-node-image`): `ASTERISM_NODE_IMAGE` and
//! `ASTERISM_NODE_MEASUREMENTS` name them, by default `target/node-image` and
//! `target/node-reference/measurements.json` of the workspace. Without them the test says
//! so on stderr and passes. Under TCG the boot alone takes 20 s and more.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use asterism_mini::vm::{VmArgs, VmCluster};
use common::{TeardownAt, bins, runtime};
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// Says on stderr, past the test harness's capture, why the test does not run.
fn skip(why: &str) {
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED bins/mini/tests/vm.rs: {why} (docs/mini.md, \"VM mode\")"
    );
}

/// The image and measurements, or `None` (after saying why) when something is missing.
fn vm_args() -> Option<VmArgs> {
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
    let measurements = from_env(
        "ASTERISM_NODE_MEASUREMENTS",
        "target/node-reference/measurements.json",
    );
    if !measurements.is_file() {
        skip(&format!(
            "no reference measurements at {} (scripts/boot-node-image)",
            measurements.display()
        ));
        return None;
    }
    Some(VmArgs {
        image,
        vm_measurements: measurements,
    })
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

#[test]
fn a_control_plane_vm_is_initialised_through_its_forwarded_port_and_down_stops_it() {
    let Some(args) = vm_args() else { return };
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("c");
    let _teardown = TeardownAt(dir.clone());
    let vmc = VmCluster::create(&dir, 0, 71, bins(), &args).unwrap();
    let record = runtime().block_on(vmc.init_control_plane()).unwrap();

    let cp = &record.nodes[0];
    assert_eq!(cp.exit, "ok", "{cp:?}");
    assert!(
        cp.disk_rekeyed,
        "the VM's disk opens with the derived key: {cp:?}"
    );
    let node = &vmc.vms[0].node;
    let console = std::fs::read_to_string(node.dir.join("console.log")).unwrap();
    for line in [
        "asterism-init: tpm0=yes tpmrm0=yes vda=yes",
        "asterism-init: eth1 10.42.71.1/24",
        "asterism-init: bootstrapper exited with status 0",
    ] {
        assert!(console.contains(line), "the console says {line:?}");
    }
    assert!(dir.join("workspace/master-secret.json").is_file());

    // The node's state is on the encrypted disk: mapped with dm-crypt (and dm-integrity
    // where the kernel has it), its file system mounted on state/, the node state file on
    // it and nowhere beneath the mount point.
    let dm = |name: &str| {
        console
            .lines()
            .any(|l| l.contains("asterism-init: dm dm-") && l.contains(name))
    };
    assert!(
        dm(" name=state uuid=CRYPT-LUKS2-"),
        "the disk is mapped with dm-crypt"
    );
    if console.contains("dm-integrity=yes") {
        assert!(dm(" name=state_dif "), "with dm-integrity beneath");
    }
    for line in [
        "asterism-init: mount /dev/mapper/state on /run/node/state type ext4 (rw,nosuid,nodev",
        "asterism-init: node state on the mounted disk: yes, beneath the mount point: no",
        "asterism-init: first-boot passphrase file left: no",
    ] {
        assert!(console.contains(line), "the console says {line:?}");
    }
    // And encrypted: what the node wrote is not on the disk image in plain text.
    let image = std::fs::read(node.dir.join("state.img")).unwrap();
    for plain in [
        &b"MeasurementSalt"[..],
        b"kubernetes_version",
        b"ssh-ed25519",
    ] {
        assert!(
            !image.windows(plain.len()).any(|w| w == plain),
            "{:?} is on the disk image in plain text",
            String::from_utf8_lossy(plain)
        );
    }

    // `down` stops the VM and its TPM, by their pid files.
    let qemu = pid_in(&node.dir.join("run/qemu.pid"));
    let swtpm = pid_in(&node.dir.join("run/swtpm.pid"));
    assert!(
        running(qemu) && running(swtpm),
        "the VM keeps running after init"
    );
    asterism_mini::down(asterism_mini::DirArgs { dir: dir.clone() }).unwrap();
    assert!(!running(qemu), "QEMU (pid {qemu}) stopped");
    assert!(!running(swtpm), "swtpm (pid {swtpm}) stopped");
}

#[test]
fn a_vm_booted_with_a_changed_command_line_is_refused_naming_pcr_9() {
    let Some(args) = vm_args() else { return };
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
    vmc.wait_for_init_server(&cp, &mut vm).unwrap();
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

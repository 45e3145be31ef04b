//! The node image's kubelet supervisor (`scripts/node-image/kubelet-service`), the real
//! script run by the system's `sh` with its paths in a temporary directory. The kubelet is a
//! recording stand-in: the real one comes as a download, which this machine cannot make, and
//! would need a container runtime and an API server besides. The stand-in writes each start's
//! arguments to a record file, one start a line, each argument followed by `|`.

use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use asterism_testkit::process::{Process, wait_for};

const WAIT: Duration = Duration::from_secs(20);

/// `mode`: `run` (stays up), `exit` (exits at once with status 3), `noisy` (writes 20,000
/// bytes, then stays up).
const STAND_IN: &str = r#"#!/bin/sh
for a in "$@"; do printf '%s|' "$a"; done >>"$RECORD"
echo >>"$RECORD"
echo "stand-in kubelet: started"
case "$(cat "$MODE_FILE" 2>/dev/null)" in
    exit) exit 3 ;;
    noisy) head -c 20000 /dev/zero | tr '\0' x ;;
esac
exec sleep 60
"#;

struct Node {
    dir: tempfile::TempDir,
    supervisor: Option<Process>,
}

impl Node {
    fn new(mode: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let kubelet = dir.path().join("bin/kubelet");
        fs::create_dir_all(kubelet.parent().unwrap()).unwrap();
        fs::write(&kubelet, STAND_IN).unwrap();
        fs::set_permissions(&kubelet, fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(dir.path().join("mode"), mode).unwrap();
        Self {
            dir,
            supervisor: None,
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn write(&self, rel: &str, content: &str) {
        let path = self.path(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        // As kubeadm writes its files: a new file renamed over the old one.
        let tmp = path.with_extension("tmp");
        fs::write(&tmp, content).unwrap();
        fs::rename(&tmp, &path).unwrap();
    }

    fn start(&mut self, log_max: u64) {
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/node-image/kubelet-service");
        let mut command = Command::new("sh");
        // The supervisor writes its lines to standard output (the console on a node).
        command
            .args(["-c", "exec sh \"$0\" >&2"])
            .arg(&script)
            .env("KUBELET_ENABLE_FILE", self.path("run/enabled"))
            .env("KUBELET", self.path("bin/kubelet"))
            .env("KUBELET_CONFIG", self.path("var/lib/kubelet/config.yaml"))
            .env(
                "KUBELET_FLAGS_ENV",
                self.path("var/lib/kubelet/kubeadm-flags.env"),
            )
            .env("KUBELET_EXTRA_ENV", self.path("etc/default/kubelet"))
            .env(
                "KUBELET_KUBECONFIG",
                self.path("etc/kubernetes/kubelet.conf"),
            )
            .env(
                "KUBELET_BOOTSTRAP_KUBECONFIG",
                self.path("etc/kubernetes/bootstrap-kubelet.conf"),
            )
            .env("KUBELET_LOG", self.path("run/kubelet.log"))
            .env("KUBELET_LOG_MAX_BYTES", log_max.to_string())
            .env("KUBELET_RESTART_SECONDS", "0.2")
            .env("KUBELET_POLL_SECONDS", "0.1")
            .env("RECORD", self.path("record"))
            .env("MODE_FILE", self.path("mode"))
            .current_dir(self.dir.path());
        self.supervisor = Some(Process::spawn(&mut command));
    }

    fn supervisor(&self) -> &Process {
        self.supervisor.as_ref().unwrap()
    }

    /// Each start's arguments, after the program name.
    fn starts(&self) -> Vec<Vec<String>> {
        fs::read_to_string(self.path("record"))
            .unwrap_or_default()
            .lines()
            .map(|l| {
                l.split_terminator('|')
                    .map(|a| a.replace(&self.dir.path().display().to_string(), ""))
                    .collect()
            })
            .collect()
    }

    fn wait_for_starts(&self, n: usize) -> Vec<Vec<String>> {
        wait_for(&format!("{n} kubelet starts"), WAIT, || {
            self.starts().len() >= n
        });
        self.starts()
    }

    /// The bootstrapper's go-ahead.
    fn enable(&self) {
        self.write("run/enabled", "enabled\n");
    }

    /// kubeadm's flags file, with `kubeadm_args` as `KUBELET_KUBEADM_ARGS`.
    fn kubeadm_flags(&self, kubeadm_args: &str) {
        self.write(
            "var/lib/kubelet/kubeadm-flags.env",
            &format!("KUBELET_KUBEADM_ARGS=\"{kubeadm_args}\"\n"),
        );
    }

    /// kubeadm's two settings files: the flags, then the kubelet's configuration.
    fn kubeadm_settings(&self, kubeadm_args: &str) {
        self.kubeadm_flags(kubeadm_args);
        self.write(
            "var/lib/kubelet/config.yaml",
            "kind: KubeletConfiguration\n",
        );
    }

    /// Waits until the supervisor has said `text`.
    fn wait_logged(&self, text: &str) {
        self.supervisor()
            .wait_for_line(text, WAIT, |l| l.contains(text).then_some(()));
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut p) = self.supervisor.take()
            && !p.has_exited()
        {
            // The supervisor stops its kubelet on SIGTERM.
            p.stop(WAIT);
        }
    }
}

fn drop_in_args(extra: &[&str]) -> Vec<String> {
    let mut args = vec![
        "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf".to_string(),
        "--kubeconfig=/etc/kubernetes/kubelet.conf".to_string(),
        "--config=/var/lib/kubelet/config.yaml".to_string(),
    ];
    args.extend(extra.iter().map(|a| (*a).to_string()));
    args
}

#[test]
fn the_kubelet_waits_for_the_go_ahead_and_kubeadms_settings_then_runs_with_the_drop_ins_arguments()
{
    let mut node = Node::new("run");
    node.start(1 << 20);
    // kubeadm's settings alone: the bootstrapper has not enabled the kubelet yet.
    node.kubeadm_settings(
        "--container-runtime-endpoint=unix:///run/containerd/containerd.sock --node-ip=10.0.0.5",
    );
    std::thread::sleep(Duration::from_millis(800));
    assert!(node.starts().is_empty(), "started before the go-ahead");
    node.enable();
    node.write("etc/default/kubelet", "KUBELET_EXTRA_ARGS='--v=2'\n");
    let starts = node.wait_for_starts(1);
    assert_eq!(
        starts[0],
        drop_in_args(&[
            "--container-runtime-endpoint=unix:///run/containerd/containerd.sock",
            "--node-ip=10.0.0.5",
            "--v=2",
        ])
    );
    node.wait_logged("kubelet started: pid");
    let log = fs::read_to_string(node.path("run/kubelet.log")).unwrap();
    assert!(log.contains("stand-in kubelet: started"), "{log}");
}

#[test]
fn without_kubeadms_flags_file_the_kubelet_is_not_started() {
    let mut node = Node::new("run");
    node.enable();
    // kubeadm join writes config.yaml before kubeadm-flags.env: a start between the two
    // would miss the container runtime's endpoint.
    node.write(
        "var/lib/kubelet/config.yaml",
        "kind: KubeletConfiguration\n",
    );
    node.start(1 << 20);
    node.wait_logged("enabled (");
    std::thread::sleep(Duration::from_millis(800));
    assert!(node.starts().is_empty(), "started without the flags file");
    node.kubeadm_flags("--a=1");
    assert_eq!(node.wait_for_starts(1)[0], drop_in_args(&["--a=1"]));
}

#[test]
fn a_kubelet_that_exits_is_started_again() {
    let mut node = Node::new("exit");
    node.enable();
    node.kubeadm_settings("--a=1");
    node.start(1 << 20);
    let starts = node.wait_for_starts(3);
    assert!(starts.iter().all(|s| *s == drop_in_args(&["--a=1"])));
    node.wait_logged("kubelet exited with status 3");
}

#[test]
fn a_settings_file_kubeadm_rewrites_restarts_the_kubelet_with_the_new_flags() {
    let mut node = Node::new("run");
    node.enable();
    node.kubeadm_settings("--a=1");
    node.start(1 << 20);
    assert_eq!(node.wait_for_starts(1)[0], drop_in_args(&["--a=1"]));
    node.kubeadm_flags("--a=2 --b=3");
    let starts = node.wait_for_starts(2);
    assert_eq!(starts[1], drop_in_args(&["--a=2", "--b=3"]));
    node.wait_logged("changed the kubelet's settings");
}

#[test]
fn the_settings_files_are_read_as_data_and_never_run() {
    let mut node = Node::new("run");
    node.enable();
    node.write(
        "var/lib/kubelet/kubeadm-flags.env",
        // `*` would match the files of the working directory if the words were globbed.
        "touch ran-a-line\nKUBELET_KUBEADM_ARGS=\"--x=$(touch ran-a-substitution) *\"\n",
    );
    node.write(
        "var/lib/kubelet/config.yaml",
        "kind: KubeletConfiguration\n",
    );
    node.start(1 << 20);
    let starts = node.wait_for_starts(1);
    assert_eq!(
        starts[0],
        drop_in_args(&["--x=$(touch", "ran-a-substitution)", "*"])
    );
    assert!(!node.path("ran-a-line").exists());
    assert!(!node.path("ran-a-substitution").exists());
}

#[test]
fn the_kubelets_log_is_kept_under_its_cap_with_one_older_copy() {
    let mut node = Node::new("noisy");
    node.enable();
    node.kubeadm_settings("--a=1");
    node.start(10_000);
    node.wait_for_starts(1);
    wait_for("the log rotated", WAIT, || {
        node.path("run/kubelet.log.1").exists()
    });
    let older = fs::metadata(node.path("run/kubelet.log.1")).unwrap().len();
    assert!(older > 10_000, "the older copy holds what was cut: {older}");
    wait_for("the log under its cap", WAIT, || {
        fs::metadata(node.path("run/kubelet.log")).unwrap().len() <= 10_000
    });
    // The kubelet keeps running through the rotation.
    assert_eq!(node.starts().len(), 1);
}

//! The kubeadm node setup end to end, as the bootstrapper's `kubeadm` driver runs it:
//! components from a local HTTP server, the recording stand-in as kubeadm and systemctl, a
//! temporary directory standing for `/etc/kubernetes` and `/run/state`.

use crate::kubeadm_support;

use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use asterism_components::{
    CheckedComponents, Component, ComponentError, DownloadPolicy, Installer,
};
use asterism_kubeadm::config::{
    AUDIT_POLICY, ApiVersion, BootstrapToken, CloudProvider, InitParams, JoinParams, NodePaths,
};
use asterism_kubeadm::etcdio::{EtcdIoPriority, Ionice};
use asterism_kubeadm::runner::{KubeadmError, KubeletService, ProcessCommands};
use asterism_kubeadm::setup::{
    CONTROL_PLANE_FILES, ControlPlaneFile, JOIN_ATTEMPTS, KubeadmNode, SetupConfig, SetupError,
};
use kubeadm_support::{Entry, Reply, StandIn, TestServer, sha256, tarball};
use zeroize::Zeroizing;

const TOKEN: &str = "abcdef.0123456789abcdef";

struct Node {
    root: tempfile::TempDir,
    tmp: tempfile::TempDir,
    stand_in: StandIn,
    setup: KubeadmNode<ProcessCommands>,
}

impl Node {
    fn new() -> Self {
        Self::with_kubelet(|stand_in, _| KubeletService::Systemd {
            systemctl: stand_in.systemctl(),
        })
    }

    /// A node whose kubelet runs as `service(stand-in, root)` says.
    fn with_kubelet(service: impl FnOnce(&StandIn, &Path) -> KubeletService) -> Self {
        let root = tempfile::tempdir().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let stand_in = StandIn::install();
        let r = root.path();
        let config = SetupConfig {
            paths: NodePaths {
                kubernetes_dir: r.join("etc/kubernetes"),
                kubelet_cert: r.join("run/state/kubelet/pki/kubelet-client-crt.pem"),
                kubelet_key: r.join("run/state/kubelet/pki/kubelet-client-key.pem"),
                patches_dir: r.join("opt/kubernetes/patches"),
            },
            kubeadm: stand_in.kubeadm(),
            kubelet_service: service(&stand_in, r),
            config_dir: tmp.path().to_path_buf(),
        };
        let installer = Installer::new(DownloadPolicy {
            initial_backoff: Duration::from_millis(20),
            ..DownloadPolicy::default()
        })
        .unwrap();
        let setup = KubeadmNode::new(config, ProcessCommands::default(), installer);
        Self {
            root,
            tmp,
            stand_in,
            setup,
        }
    }

    fn paths(&self) -> &NodePaths {
        &self.setup.config().paths
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.path().join(rel)
    }

    fn no_config_files_left(&self) {
        assert_eq!(
            fs::read_dir(self.tmp.path()).unwrap().count(),
            0,
            "a kubeadm configuration file was left behind"
        );
    }
}

/// Components like the original's list: a binary, an archive, a data: URL patch.
async fn components(node: &Node) -> (TestServer, Vec<Component>) {
    let kubelet = b"pretend kubelet".to_vec();
    let crictl = tarball(&[
        Entry::File("crictl", b"pretend crictl", 0o755),
        Entry::Symlink("crictl-link", "crictl"),
    ]);
    let server = TestServer::start(vec![
        (
            "/kubelet",
            vec![Reply::Status(503), Reply::Body(kubelet.clone())],
        ),
        ("/crictl.tgz", vec![Reply::Body(crictl.clone())]),
    ])
    .await;
    let patch = b"[]";
    let list = vec![
        Component {
            url: server.url("/kubelet"),
            hash: sha256(&kubelet),
            install_path: node.path("run/state/bin/kubelet").display().to_string(),
            extract: false,
        },
        Component {
            url: server.url("/crictl.tgz"),
            hash: sha256(&crictl),
            install_path: node.path("run/state/bin").display().to_string(),
            extract: true,
        },
        Component {
            url: "data:application/json,%5B%5D".into(),
            hash: sha256(patch),
            install_path: node
                .path("opt/kubernetes/patches/etcd+json.json")
                .display()
                .to_string(),
            extract: false,
        },
    ];
    (server, list)
}

/// `list`, checked (every list these tests install is well formed).
fn checked(list: Vec<Component>) -> CheckedComponents {
    CheckedComponents::new(list).unwrap()
}

fn init_params(node: &Node) -> InitParams {
    InitParams {
        kubernetes_version: "v1.31.2".parse().unwrap(),
        cluster_name: "asterism".into(),
        node_name: "cp-0".into(),
        node_ip: "10.9.0.2".parse().unwrap(),
        provider_id: "asterism-local:///cp-0".into(),
        control_plane_endpoint: "10.9.0.2".into(),
        service_cidr: String::new(),
        cert_sans: vec![],
        cloud_provider: CloudProvider::None,
        paths: node.paths().clone(),
    }
}

fn join_params(node: &Node, control_plane: bool) -> JoinParams {
    JoinParams {
        api_version: ApiVersion::V1Beta4,
        node_name: "worker-0".into(),
        node_ip: "10.9.0.3".parse().unwrap(),
        provider_id: String::new(),
        api_server_endpoint: "10.9.0.2:6443".into(),
        token: BootstrapToken::new(Zeroizing::new(TOKEN.into())).unwrap(),
        ca_cert_hashes: vec![format!("sha256:{}", "ab".repeat(32))],
        control_plane,
        cloud_provider: CloudProvider::None,
        paths: node.paths().clone(),
    }
}

fn mode(p: &Path) -> u32 {
    fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[tokio::test]
async fn init_installs_components_runs_kubeadm_and_returns_the_kubeconfig() {
    let node = Node::new();
    let (server, list) = components(&node).await;
    let kubeconfig = node
        .setup
        .init(&checked(list), &init_params(&node), false)
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&kubeconfig).contains("https://10.9.0.2:6443"));
    assert_eq!(server.hits("/kubelet"), 2, "503 then 200");
    assert_eq!(
        fs::read(node.path("run/state/bin/kubelet")).unwrap(),
        b"pretend kubelet"
    );
    assert_eq!(
        fs::read_link(node.path("run/state/bin/crictl-link")).unwrap(),
        Path::new("crictl")
    );
    assert_eq!(
        fs::read(node.path("opt/kubernetes/patches/etcd+json.json")).unwrap(),
        b"[]"
    );
    assert_eq!(
        fs::read_to_string(node.paths().audit_policy()).unwrap(),
        AUDIT_POLICY
    );
    assert_eq!(mode(&node.paths().kubelet_key), 0o600);
    let argv = node.stand_in.argv();
    let programs: Vec<String> = argv
        .iter()
        .map(|a| a.split(" --config").next().unwrap().to_owned())
        .collect();
    assert_eq!(
        programs,
        [
            "systemctl enable --runtime --force kubelet.service",
            "kubeadm init phase preflight -v=5",
            "kubeadm init phase certs all -v=5",
            "kubeadm init -v=5 --skip-phases=preflight,certs,addon/coredns,addon/kube-proxy",
            "kubeadm kubeconfig user --client-name asterism-admin",
        ]
    );
    node.no_config_files_left();
}

#[tokio::test]
async fn a_bad_component_hash_stops_init_before_anything_runs() {
    // A list with a bad hash cannot become the checked list that init takes, so nothing
    // is downloaded and kubeadm never runs.
    let node = Node::new();
    let (server, mut list) = components(&node).await;
    list[1].hash.clear();
    let err = CheckedComponents::new(list).unwrap_err();
    assert!(matches!(err, ComponentError::Hash { .. }), "{err:?}");
    assert_eq!(server.hits("/kubelet"), 0);
    assert!(node.stand_in.calls().is_empty());
    node.no_config_files_left();
}

#[tokio::test]
async fn a_worker_joins() {
    let node = Node::new();
    let (_server, list) = components(&node).await;
    node.setup
        .join(&checked(list), &join_params(&node, false), &[])
        .await
        .unwrap();
    let calls = node.stand_in.calls();
    let join = calls.iter().find(|c| c["args"][0] == "join").unwrap();
    let config = join["config"].as_str().unwrap();
    assert!(config.contains(&format!("token: {TOKEN}")));
    assert!(!config.contains("controlPlane"));
    assert_eq!(join["config_mode"], 0o600);
    assert_eq!(join["dir_mode"], 0o700);
    assert!(!node.paths().pki_dir().join("ca.key").exists());
    node.no_config_files_left();
}

fn control_plane_files() -> Vec<ControlPlaneFile> {
    CONTROL_PLANE_FILES
        .iter()
        .map(|name| ControlPlaneFile {
            name: (*name).to_owned(),
            data: Zeroizing::new(format!("pretend {name}\n").into_bytes()),
        })
        .collect()
}

#[tokio::test]
async fn a_control_plane_node_gets_its_files_where_kubeadm_expects_them_and_joins() {
    let node = Node::new();
    node.setup
        .join(
            &CheckedComponents::default(),
            &join_params(&node, true),
            &control_plane_files(),
        )
        .await
        .unwrap();
    let pki = node.paths().pki_dir();
    for name in CONTROL_PLANE_FILES {
        assert_eq!(
            fs::read_to_string(pki.join(name)).unwrap(),
            format!("pretend {name}\n")
        );
        let want = if name.ends_with(".key") { 0o600 } else { 0o644 };
        assert_eq!(mode(&pki.join(name)), want, "{name}");
    }
    let calls = node.stand_in.calls();
    let join = calls.iter().find(|c| c["args"][0] == "join").unwrap();
    assert!(
        join["config"]
            .as_str()
            .unwrap()
            .contains("control-plane-prepare/download-certs")
    );
    node.no_config_files_left();
}

#[tokio::test]
async fn a_control_plane_join_without_its_files_is_refused_by_kubeadm() {
    let node = Node::new();
    let err = node
        .setup
        .join(
            &CheckedComponents::default(),
            &join_params(&node, true),
            &[],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            SetupError::Kubeadm(KubeadmError::Failed { code: Some(2), .. })
        ),
        "{err:?}"
    );
    node.no_config_files_left();
}

#[tokio::test]
async fn a_failed_join_removes_the_token_file_and_reports_the_exit_code() {
    let node = Node::new();
    node.stand_in.settings(serde_json::json!({"fail": {"join": {"code": 1, "stderr": "couldn't validate the identity of the API Server\n"}}}));
    let err = node
        .setup
        .join(
            &CheckedComponents::default(),
            &join_params(&node, false),
            &[],
        )
        .await
        .unwrap_err();
    match &err {
        SetupError::Kubeadm(KubeadmError::Failed {
            code, output_tail, ..
        }) => {
            assert_eq!(*code, Some(1));
            assert!(output_tail.contains("couldn't validate the identity"));
        }
        other => panic!("{other:?}"),
    }
    node.no_config_files_left();
}

#[tokio::test]
async fn control_plane_file_names_that_leave_the_pki_directory_are_refused() {
    let node = Node::new();
    let files = vec![ControlPlaneFile {
        name: "../../escape".into(),
        data: Zeroizing::new(b"x".to_vec()),
    }];
    let err = node
        .setup
        .join(
            &CheckedComponents::default(),
            &join_params(&node, true),
            &files,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, SetupError::ControlPlaneFileName(_)),
        "{err:?}"
    );
    assert!(node.stand_in.calls().is_empty());
    assert!(!node.path("escape").exists() && !node.path("etc/escape").exists());
}

#[tokio::test]
async fn an_already_bootstrapped_node_starts_the_kubelet() {
    let node = Node::new();
    node.setup.start_kubelet().await.unwrap();
    assert_eq!(
        node.stand_in.argv(),
        [
            "systemctl enable --runtime --force kubelet.service",
            "systemctl start kubelet.service"
        ]
    );
}

/// The node image's supervisor instead of systemd.
fn supervised_node() -> Node {
    Node::with_kubelet(|_, root| KubeletService::Supervisor {
        enable_file: root.join("run/asterism/kubelet/enabled"),
    })
}

#[tokio::test]
async fn with_the_images_supervisor_its_go_ahead_comes_before_kubeadm_and_systemctl_never_runs() {
    let node = supervised_node();
    let (_server, list) = components(&node).await;
    // kubeadm fails at once: whatever exists afterwards was made before kubeadm ran.
    node.stand_in.settings(
        serde_json::json!({"fail": {"init phase preflight": {"code": 1, "stderr": "preflight failed\n"}}}),
    );
    node.setup
        .init(&checked(list), &init_params(&node), false)
        .await
        .unwrap_err();
    assert_eq!(
        fs::read_to_string(node.path("run/asterism/kubelet/enabled")).unwrap(),
        "enabled\n"
    );
    let argv = node.stand_in.argv();
    assert!(argv.iter().all(|a| !a.starts_with("systemctl")), "{argv:?}");
    assert!(argv[0].starts_with("kubeadm init"), "{argv:?}");
}

#[tokio::test]
async fn an_already_bootstrapped_node_starts_the_kubelet_through_the_images_supervisor() {
    let node = supervised_node();
    node.setup.start_kubelet().await.unwrap();
    assert!(node.path("run/asterism/kubelet/enabled").exists());
    assert!(node.stand_in.argv().is_empty());
}

#[tokio::test]
async fn a_kubelet_that_does_not_start_is_an_error() {
    let node = Node::new();
    node.stand_in.settings(serde_json::json!({"fail": {"systemctl start": {"code": 1, "stderr": "Job for kubelet.service failed\n"}}}));
    let err = node.setup.start_kubelet().await.unwrap_err();
    assert!(
        matches!(
            err,
            SetupError::Kubeadm(KubeadmError::Failed { code: Some(1), .. })
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_join_uses_the_configuration_version_of_the_installed_kubeadm() {
    let node = Node::new();
    node.stand_in
        .settings(serde_json::json!({"version": "v1.30.4"}));
    let (_server, list) = components(&node).await;
    let mut params = join_params(&node, false);
    params.api_version = ApiVersion::V1Beta4;
    node.setup
        .join_with_installed_kubeadm(&checked(list), params, &[])
        .await
        .unwrap();
    let calls = node.stand_in.calls();
    assert_eq!(
        calls[0]["args"],
        serde_json::json!(["version", "-o", "short"])
    );
    let join = calls.iter().find(|c| c["args"][0] == "join").unwrap();
    assert!(
        join["config"]
            .as_str()
            .unwrap()
            .starts_with("apiVersion: kubeadm.k8s.io/v1beta3\n")
    );
    node.no_config_files_left();
}

// --- Join retries ------------------------------------------------------------------------------

/// The kubeadm calls of the recorded calls (no systemctl).
fn kubeadm_words(node: &Node) -> Vec<String> {
    node.stand_in
        .argv()
        .into_iter()
        .filter(|a| a.starts_with("kubeadm "))
        .map(|a| a.split(" -").next().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_join_that_fails_twice_succeeds_on_the_third_attempt() {
    let node = Node::new();
    node.stand_in.settings(serde_json::json!({"fail": {"join": {"code": 1, "times": 2, "stderr": "connection refused\n"}}}));
    let (server, list) = components(&node).await;
    node.setup
        .join_with_installed_kubeadm(&checked(list), join_params(&node, false), &[])
        .await
        .unwrap();
    assert_eq!(JOIN_ATTEMPTS, 3);
    assert_eq!(
        kubeadm_words(&node),
        [
            "kubeadm version",
            "kubeadm join",
            "kubeadm version",
            "kubeadm join",
            "kubeadm version",
            "kubeadm join"
        ],
        "each attempt is the whole join"
    );
    // Every attempt installs the components again (the kubelet: 503 then 200 the first
    // time, 200 on the next two).
    assert_eq!(server.hits("/kubelet"), 4);
    node.no_config_files_left();
}

#[tokio::test]
async fn a_join_is_tried_three_times_then_fails_with_the_last_exit_code() {
    let node = Node::new();
    node.stand_in.settings(serde_json::json!({"fail": {"join": {"code": 7, "stderr": "couldn't validate the identity of the API Server\n"}}}));
    let err = node
        .setup
        .join_with_installed_kubeadm(
            &CheckedComponents::default(),
            join_params(&node, false),
            &[],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            SetupError::Kubeadm(KubeadmError::Failed { code: Some(7), .. })
        ),
        "{err:?}"
    );
    let joins = kubeadm_words(&node)
        .iter()
        .filter(|w| *w == "kubeadm join")
        .count();
    assert_eq!(joins, 3);
    node.no_config_files_left();
}

#[tokio::test]
async fn a_refused_join_configuration_is_not_retried() {
    let node = Node::new();
    let mut params = join_params(&node, false);
    params.ca_cert_hashes = vec!["sha256:not-hex".into()];
    let err = node
        .setup
        .join_with_installed_kubeadm(&CheckedComponents::default(), params, &[])
        .await
        .unwrap_err();
    assert!(matches!(err, SetupError::Config(_)), "{err:?}");
    assert!(node.stand_in.calls().is_empty());
}

// --- etcd I/O priority -------------------------------------------------------------------------

impl Node {
    /// This node with the etcd I/O step on a fake process table where etcd is pid 4242
    /// (`with_etcd`) or absent, the stand-in as `ionice`.
    fn with_etcd_io(mut self, with_etcd: bool) -> (Self, tempfile::TempDir) {
        let proc_root = tempfile::tempdir().unwrap();
        let add = |pid: &str, exe: &str| {
            let dir = proc_root.path().join(pid);
            fs::create_dir_all(&dir).unwrap();
            std::os::unix::fs::symlink(exe, dir.join("exe")).unwrap();
        };
        add("1", "/usr/lib/systemd/systemd");
        add("700", "/usr/bin/kubelet");
        if with_etcd {
            add("4242", "/usr/local/bin/etcd");
        }
        let step = EtcdIoPriority::new(
            proc_root.path(),
            Ionice::new(self.stand_in.ionice(), ProcessCommands::default()),
            Duration::from_millis(10),
            Duration::from_millis(50),
        );
        self.setup = self.setup.with_etcd_io_priority(step);
        (self, proc_root)
    }

    fn ionice_calls(&self) -> Vec<String> {
        self.stand_in
            .argv()
            .into_iter()
            .filter(|a| a.starts_with("ionice "))
            .collect()
    }
}

const ETCD_REALTIME_0: &str = "ionice -c 1 -n 0 -p 4242";

#[tokio::test]
async fn init_prioritises_etcd_io_after_kubeadm_init() {
    let (node, _proc) = Node::new().with_etcd_io(true);
    node.setup
        .init(&CheckedComponents::default(), &init_params(&node), false)
        .await
        .unwrap();
    let argv = node.stand_in.argv();
    assert_eq!(argv.last().unwrap(), ETCD_REALTIME_0, "{argv:?}");
    assert_eq!(node.ionice_calls().len(), 1);
}

#[tokio::test]
async fn a_control_plane_join_prioritises_etcd_io_and_a_worker_join_does_not() {
    let (node, _proc) = Node::new().with_etcd_io(true);
    node.setup
        .join(
            &CheckedComponents::default(),
            &join_params(&node, true),
            &control_plane_files(),
        )
        .await
        .unwrap();
    assert_eq!(node.ionice_calls(), [ETCD_REALTIME_0]);

    let (worker, _proc) = Node::new().with_etcd_io(true);
    worker
        .setup
        .join(
            &CheckedComponents::default(),
            &join_params(&worker, false),
            &[],
        )
        .await
        .unwrap();
    assert!(worker.ionice_calls().is_empty());
}

#[tokio::test]
async fn starting_the_kubelet_prioritises_etcd_io() {
    let (node, _proc) = Node::new().with_etcd_io(true);
    node.setup.start_kubelet().await.unwrap();
    assert_eq!(node.ionice_calls(), [ETCD_REALTIME_0]);
}

#[tokio::test]
async fn no_etcd_or_a_refused_priority_never_fails_the_caller() {
    // No etcd: the step waits its bounded time and gives up.
    let (node, _proc) = Node::new().with_etcd_io(false);
    node.setup.start_kubelet().await.unwrap();
    assert!(node.ionice_calls().is_empty());
    // ionice fails: still no error.
    let (node, _proc) = Node::new().with_etcd_io(true);
    node.stand_in.settings(
        serde_json::json!({"fail": {"ionice": {"code": 1, "stderr": "ionice: ioprio_set failed: Operation not permitted\n"}}}),
    );
    node.setup
        .init(&CheckedComponents::default(), &init_params(&node), false)
        .await
        .unwrap();
    assert_eq!(node.ionice_calls(), [ETCD_REALTIME_0]);
}

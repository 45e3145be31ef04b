//! The `kubeadm` driver's init end to end, short of a real cluster: the recording kubeadm
//! stand-in (asterism-kubeadm's test binary) as kubeadm and systemctl, a temporary
//! directory standing for `/etc/kubernetes` and `/run/state`, and the recording Kubernetes
//! API server (recorded responses in the real API format) as the API server the admin
//! kubeconfig names.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use asterism_bootstrapper::{
    ClusterInit, Components, KubeadmDriver, KubeadmDriverConfig, KubernetesDriver, PostInitApi,
};
use asterism_components::{Component, DownloadPolicy};
use asterism_kube_api::{ApiOptions, WaitPolicy};
use asterism_kubeadm::config::{CloudProvider, NodePaths};
use asterism_kubeadm::runner::KubeletService;
use asterism_kubeadm::setup::SetupConfig;
use asterism_metadata::{InstanceMetadata, Role, StaticMetadata};
use asterism_testkit::kube_api::paths::CONFIG_MAPS;
use asterism_testkit::kube_api::{RecordingServer, Reply};

const NODE: &str = "/api/v1/nodes/cp-0";
const ANNOTATION: &str = "constellation.edgeless.systems/kubernetes-components";

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, bytes))
}

/// The stand-in binary of asterism-kubeadm, built once (Cargo builds another package's
/// binaries only for that package's own tests). `ASTERISM_KUBEADM_STAND_IN` names one
/// already built: the test command sets it to the one its `cargo test --workspace` build
/// made, which is current, instead of building it again here.
fn stand_in_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        if let Some(path) = std::env::var_os("ASTERISM_KUBEADM_STAND_IN") {
            let path = PathBuf::from(path);
            assert!(
                path.is_file(),
                "ASTERISM_KUBEADM_STAND_IN names no file: {}",
                path.display()
            );
            return path;
        }
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut cargo = Command::new(env!("CARGO"));
        // Only the environment a plain `cargo build` sees: the variables Cargo sets for a
        // test would make it rebuild the stand-in every time. The profile settings a caller
        // gave (the test command's line tables, no incremental caches) are kept, or the
        // stand-in's whole dependency tree would be built again with other settings.
        cargo.env_clear();
        for (key, value) in std::env::vars_os() {
            let key_str = key.to_string_lossy();
            let keep = matches!(
                key_str.as_ref(),
                "PATH"
                    | "HOME"
                    | "CARGO_HOME"
                    | "RUSTUP_HOME"
                    | "RUSTUP_TOOLCHAIN"
                    | "TMPDIR"
                    | "CARGO_TARGET_DIR"
                    | "CARGO_INCREMENTAL"
            ) || key_str.starts_with("CARGO_PROFILE_");
            if keep {
                cargo.env(key, value);
            }
        }
        let out = asterism_children::output(cargo.current_dir(&workspace).args([
            "build",
            "--quiet",
            "--message-format=json",
            "-p",
            "asterism-kubeadm",
            "--bin",
            "asterism-kubeadm-stand-in",
        ]))
        .unwrap();
        assert!(
            out.status.success(),
            "building the kubeadm stand-in failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find_map(|m| {
                (m["target"]["name"] == "asterism-kubeadm-stand-in")
                    .then(|| m["executable"].as_str().map(PathBuf::from))
                    .flatten()
            })
            .expect("cargo named no stand-in executable")
    })
}

struct Setup {
    root: tempfile::TempDir,
    _tmp: tempfile::TempDir,
    bin: tempfile::TempDir,
    server: RecordingServer,
    driver: KubeadmDriver<StaticMetadata>,
}

impl Setup {
    async fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let bin = tempfile::tempdir().unwrap();
        for name in ["kubeadm", "systemctl"] {
            std::fs::copy(stand_in_binary(), bin.path().join(name)).unwrap();
        }
        let server = RecordingServer::start().await;
        // The API kubeconfig: the recording server's, where the driver is told to look for
        // kubeadm's admin.conf (the stand-in's own admin.conf names no reachable server).
        let api_kubeconfig = root.path().join("api-admin.conf");
        server.write_kubeconfig(&api_kubeconfig);
        let r = root.path();
        let setup = SetupConfig {
            paths: NodePaths {
                kubernetes_dir: r.join("etc/kubernetes"),
                kubelet_cert: r.join("run/state/kubelet/pki/kubelet-client-crt.pem"),
                kubelet_key: r.join("run/state/kubelet/pki/kubelet-client-key.pem"),
                patches_dir: r.join("opt/kubernetes/patches"),
            },
            kubeadm: bin.path().join("kubeadm"),
            kubelet_service: KubeletService::Systemd {
                systemctl: bin.path().join("systemctl"),
            },
            config_dir: tmp.path().to_path_buf(),
        };
        let metadata = StaticMetadata::new(vec![InstanceMetadata {
            name: "cp-0".into(),
            provider_id: "asterism-local:///cp-0".into(),
            role: Role::ControlPlane,
            vpc_ip: "10.9.0.2".into(),
            ..InstanceMetadata::default()
        }])
        .with_self("cp-0");
        let driver = KubeadmDriver::new(
            KubeadmDriverConfig {
                setup,
                node_ip: "10.9.0.2".parse().unwrap(),
                cloud_provider: CloudProvider::None,
                fallback_components: Vec::new(),
                download: DownloadPolicy::default(),
                api: PostInitApi {
                    kubeconfig: api_kubeconfig,
                    options: ApiOptions::default(),
                    wait: WaitPolicy {
                        interval: Duration::from_millis(50),
                        deadline: Duration::from_secs(5),
                    },
                },
            },
            metadata,
        )
        .unwrap();
        Self {
            root,
            _tmp: tmp,
            bin,
            server,
            driver,
        }
    }

    /// One component from a `data:` URL, installed under the temporary root.
    fn components(&self) -> Components {
        let content = b"pretend kubelet";
        Components::new(vec![Component {
            url: "data:,pretend%20kubelet".into(),
            hash: format!("sha256:{}", sha256_hex(content)),
            install_path: self
                .root
                .path()
                .join("run/state/bin/kubelet")
                .display()
                .to_string(),
            extract: false,
        }])
        .unwrap()
    }

    fn params(&self) -> ClusterInit {
        ClusterInit {
            cluster_name: "asterism".into(),
            kubernetes_version: "v1.31.2".parse().unwrap(),
            apiserver_cert_sans: vec![],
            service_cidr: String::new(),
            conformance_mode: false,
            node_ip: "10.9.0.2".parse().unwrap(),
            node_name: "cp-0".into(),
            pki_dir: self.root.path().join("state/kubernetes/pki"),
            components: self.components(),
        }
    }

    /// The stand-in's calls, `program args…` without the configuration file.
    fn kubeadm_calls(&self) -> Vec<String> {
        let text = std::fs::read_to_string(self.bin.path().join("calls.jsonl")).unwrap();
        text.lines()
            .map(|l| {
                let call: serde_json::Value = serde_json::from_str(l).unwrap();
                call["args"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|a| a.as_str().unwrap().to_owned())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect()
    }
}

#[tokio::test]
async fn init_runs_kubeadm_then_makes_exactly_the_post_init_api_requests_in_order() {
    let s = Setup::new().await;
    s.server.on(
        "GET",
        "/api/v1/namespaces",
        [
            Reply::recorded(503, "status-503-service-unavailable.json"),
            Reply::recorded(200, "namespace-list.json"),
        ],
    );
    s.server.on(
        "POST",
        CONFIG_MAPS,
        [
            Reply::recorded(201, "configmap-components-created.json"),
            Reply::recorded(201, "configmap-internal-config-created.json"),
        ],
    );
    s.server.on(
        "PATCH",
        NODE,
        [Reply::recorded(200, "node-cp-0-annotated.json")],
    );
    let params = s.params();

    let kubeconfig = s.driver.init(&params).await.unwrap();
    assert!(String::from_utf8_lossy(&kubeconfig).contains("kind: Config"));

    // The request's component was installed before kubeadm ran.
    assert_eq!(
        std::fs::read(s.root.path().join("run/state/bin/kubelet")).unwrap(),
        b"pretend kubelet"
    );
    let calls = s.kubeadm_calls();
    assert!(
        calls.iter().any(|c| c.starts_with("init -v=5")),
        "{calls:?}"
    );

    let expected_name = format!(
        "k8s-components-sha256-{}",
        sha256_hex(params.components.as_slice()[0].hash.as_bytes())
    );
    let requests = s.server.requests();
    let summary: Vec<(String, String)> = requests
        .iter()
        .map(|r| (r.method.clone(), r.path.clone()))
        .collect();
    let want = [
        ("GET", "/api/v1/namespaces"),
        ("GET", "/api/v1/namespaces"),
        ("POST", CONFIG_MAPS),
        ("PATCH", NODE),
        ("POST", CONFIG_MAPS),
    ];
    assert_eq!(
        summary,
        want.map(|(m, p)| (m.to_owned(), p.to_owned())),
        "{requests:?}"
    );
    // The wait lists one namespace.
    assert_eq!(requests[0].query_param("limit").as_deref(), Some("1"));
    // The components ConfigMap: immutable, named by the hashes, the list and the version.
    let cm = &requests[2].body;
    assert_eq!(cm["metadata"]["name"], expected_name.as_str());
    assert_eq!(cm["metadata"]["namespace"], "kube-system");
    assert_eq!(cm["immutable"], true);
    assert_eq!(cm["data"]["cluster-version"], "v1.31.2");
    let listed: serde_json::Value =
        serde_json::from_str(cm["data"]["components"].as_str().unwrap()).unwrap();
    assert_eq!(listed[0]["url"], "data:,pretend%20kubelet");
    assert_eq!(
        listed[0]["hash"],
        params.components.as_slice()[0].hash.as_str()
    );
    // The node annotation names it, as a merge patch.
    assert_eq!(requests[3].content_type, "application/merge-patch+json");
    assert_eq!(
        requests[3].body["metadata"]["annotations"][ANNOTATION],
        expected_name.as_str()
    );
    // internal-config, empty.
    assert_eq!(requests[4].body["metadata"]["name"], "internal-config");
    assert!(requests[4].body.get("data").is_none());
}

#[tokio::test]
async fn an_api_failure_after_kubeadm_init_fails_the_init() {
    let s = Setup::new().await;
    s.server.on(
        "GET",
        "/api/v1/namespaces",
        [Reply::recorded(200, "namespace-list.json")],
    );
    s.server.on(
        "POST",
        CONFIG_MAPS,
        [Reply::recorded(201, "configmap-components-created.json")],
    );
    s.server.on(
        "PATCH",
        NODE,
        [Reply::recorded(403, "status-403-node-patch-forbidden.json")],
    );
    let err = asterism_bootstrapper::error_chain(&s.driver.init(&s.params()).await.unwrap_err());
    assert!(
        err.contains("annotating the node with its components"),
        "{err}"
    );
    assert!(err.contains("forbidden"), "{err}");
    // Nothing after the failed step.
    let writes = s.server.writes();
    assert_eq!(writes.len(), 2, "{writes:?}");
    assert_eq!(writes[1].method, "PATCH");
}

#[tokio::test]
async fn an_api_server_that_never_answers_fails_the_init_at_the_deadline() {
    let s = Setup::new().await;
    s.server.on(
        "GET",
        "/api/v1/namespaces",
        [Reply::recorded(503, "status-503-service-unavailable.json")],
    );
    let err = asterism_bootstrapper::error_chain(&s.driver.init(&s.params()).await.unwrap_err());
    assert!(
        err.contains("waiting for the Kubernetes API server"),
        "{err}"
    );
    assert!(s.server.writes().is_empty());
}

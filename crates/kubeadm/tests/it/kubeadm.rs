//! kubeadm configuration (golden files, byte for byte; the token only where it belongs; one
//! cloud-provider setting for init and join; private configuration files) and the runner
//! against the recording stand-in (command sequences, typed failures, redacted output), and
//! the stand-in's own refusals (it is not an accept-anything mock).
//!
//! `ASTERISM_UPDATE_GOLDEN=1 cargo test -p asterism-kubeadm --test kubeadm` rewrites the
//! golden files.

use crate::kubeadm_support;

use std::fs;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use asterism_kubeadm::config::{
    ApiVersion, BootstrapToken, CloudProvider, InitParams, JoinParams, NodePaths,
    PrivateConfigFile, render_init, render_join,
};
use asterism_kubeadm::runner::{InitRun, Kubeadm, KubeadmError, LocalKubeletCert, ProcessCommands};
use kubeadm_support::StandIn;
use zeroize::Zeroizing;

const TOKEN: &str = "abcdef.0123456789abcdef";

fn hash() -> String {
    format!("sha256:{}", "3f".repeat(32))
}

fn init_params(version: &str) -> InitParams {
    InitParams {
        kubernetes_version: version.parse().unwrap(),
        cluster_name: "asterism".into(),
        node_name: "CP_0".into(),
        node_ip: "10.9.0.2".parse().unwrap(),
        provider_id: "asterism-local:///cp-0".into(),
        control_plane_endpoint: "10.9.0.100".into(),
        service_cidr: "10.96.0.0/12".into(),
        cert_sans: vec!["api.example".into(), String::new(), "10.9.0.100".into()],
        cloud_provider: CloudProvider::External,
        paths: NodePaths::standard(),
    }
}

fn join_params(api: ApiVersion, control_plane: bool) -> JoinParams {
    JoinParams {
        api_version: api,
        node_name: if control_plane { "cp-1" } else { "worker-0" }.into(),
        node_ip: "10.9.0.3".parse().unwrap(),
        provider_id: "asterism-local:///node".into(),
        api_server_endpoint: "10.9.0.100:6443".into(),
        token: BootstrapToken::new(Zeroizing::new(TOKEN.into())).unwrap(),
        ca_cert_hashes: vec![hash()],
        control_plane,
        cloud_provider: CloudProvider::External,
        paths: NodePaths::standard(),
    }
}

fn golden(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("ASTERISM_UPDATE_GOLDEN").is_some() {
        fs::write(&path, actual).unwrap();
    }
    let expected = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        expected == actual,
        "{name} differs from the golden file:\n{actual}"
    );
}

#[test]
fn init_configuration_v1beta4_matches_the_golden_file() {
    golden(
        "init-v1beta4.yaml",
        &render_init(&init_params("v1.31.2")).unwrap(),
    );
}

#[test]
fn init_configuration_v1beta3_below_kubernetes_1_31_matches_the_golden_file() {
    golden(
        "init-v1beta3.yaml",
        &render_init(&init_params("v1.30.14")).unwrap(),
    );
}

#[test]
fn the_kubelet_local_mode_gate_is_set_from_kubernetes_1_31_0() {
    let gate = "ControlPlaneKubeletLocalMode: true";
    for (version, set) in [("v1.30.14", false), ("v1.31.0", true), ("v1.32.9", true)] {
        let yaml = render_init(&init_params(version)).unwrap();
        assert_eq!(yaml.contains(gate), set, "{version}");
    }
}

#[test]
fn join_configurations_match_the_golden_files() {
    for (api, v) in [
        (ApiVersion::V1Beta4, "v1beta4"),
        (ApiVersion::V1Beta3, "v1beta3"),
    ] {
        golden(
            &format!("join-worker-{v}.yaml"),
            &render_join(&join_params(api, false)).unwrap(),
        );
        golden(
            &format!("join-control-plane-{v}.yaml"),
            &render_join(&join_params(api, true)).unwrap(),
        );
    }
}

#[test]
fn the_join_file_holds_the_token_only_at_the_discovery_token() {
    for api in [ApiVersion::V1Beta3, ApiVersion::V1Beta4] {
        for cp in [false, true] {
            let yaml = render_join(&join_params(api, cp)).unwrap();
            assert_eq!(yaml.matches(TOKEN).count(), 1, "{}", *yaml);
            assert_eq!(yaml.matches("0123456789abcdef").count(), 1);
            let docs: Vec<serde_norway::Value> = serde_norway::Deserializer::from_str(&yaml)
                .map(|d| serde::Deserialize::deserialize(d).unwrap())
                .collect();
            assert_eq!(docs.len(), 2);
            assert_eq!(
                docs[0]["discovery"]["bootstrapToken"]["token"].as_str(),
                Some(TOKEN)
            );
            assert!(docs[0]["discovery"].get("tlsBootstrapToken").is_none());
            assert!(!serde_norway::to_string(&docs[1]).unwrap().contains(TOKEN));
        }
    }
    // The init file holds none.
    assert!(
        !render_init(&init_params("v1.31.2"))
            .unwrap()
            .contains(TOKEN)
    );
}

#[test]
fn init_and_join_use_the_same_cloud_provider_setting() {
    for (cloud, expect) in [
        (CloudProvider::External, true),
        (CloudProvider::None, false),
    ] {
        let mut i = init_params("v1.31.2");
        i.cloud_provider = cloud;
        let mut j = join_params(ApiVersion::V1Beta4, false);
        j.cloud_provider = cloud;
        let init = docs(&render_init(&i).unwrap());
        let join = docs(&render_join(&j).unwrap());
        let want = expect.then_some("external");
        assert_eq!(
            arg(
                &init[0]["nodeRegistration"]["kubeletExtraArgs"],
                "cloud-provider"
            ),
            want
        );
        assert_eq!(
            arg(&init[1]["controllerManager"]["extraArgs"], "cloud-provider"),
            want
        );
        assert_eq!(
            arg(
                &join[0]["nodeRegistration"]["kubeletExtraArgs"],
                "cloud-provider"
            ),
            want
        );
    }
}

fn docs(yaml: &str) -> Vec<serde_norway::Value> {
    serde_norway::Deserializer::from_str(yaml)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect()
}

/// The value of `name` in a v1beta4 `{name, value}` list.
fn arg<'a>(list: &'a serde_norway::Value, name: &str) -> Option<&'a str> {
    list.as_sequence()
        .unwrap()
        .iter()
        .find(|a| a["name"].as_str() == Some(name))
        .map(|a| a["value"].as_str().unwrap())
}

#[test]
fn a_join_without_ca_pins_or_with_a_bad_endpoint_is_not_rendered() {
    let mut p = join_params(ApiVersion::V1Beta4, false);
    p.ca_cert_hashes.clear();
    assert!(render_join(&p).is_err());
    let mut p = join_params(ApiVersion::V1Beta4, false);
    p.ca_cert_hashes = vec!["md5:00".into()];
    assert!(render_join(&p).is_err());
    let mut p = join_params(ApiVersion::V1Beta4, false);
    p.api_server_endpoint = "10.9.0.100".into();
    assert!(render_join(&p).is_err());
}

#[test]
fn private_config_files_are_0600_in_a_0700_directory_and_removed_on_drop() {
    let base = tempfile::tempdir().unwrap();
    let file = PrivateConfigFile::write(base.path(), "kubeadm-join.yaml", b"token: x\n").unwrap();
    let path = file.path().to_path_buf();
    let dir = file.dir().to_path_buf();
    assert_eq!(
        fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(
        fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
        0o700
    );
    assert_eq!(fs::read(&path).unwrap(), b"token: x\n");
    drop(file);
    assert!(!path.exists() && !dir.exists());
    let file = PrivateConfigFile::write(base.path(), "kubeadm-init.yaml", b"x").unwrap();
    file.remove().unwrap();
    assert_eq!(fs::read_dir(base.path()).unwrap().count(), 0);
}

struct InitFixture {
    root: tempfile::TempDir,
    stand_in: StandIn,
}

impl InitFixture {
    fn new() -> Self {
        Self {
            root: tempfile::tempdir().unwrap(),
            stand_in: StandIn::install(),
        }
    }

    fn paths(&self) -> NodePaths {
        let r = self.root.path();
        NodePaths {
            kubernetes_dir: r.join("etc/kubernetes"),
            kubelet_cert: r.join("run/state/kubelet/pki/kubelet-client-crt.pem"),
            kubelet_key: r.join("run/state/kubelet/pki/kubelet-client-key.pem"),
            patches_dir: r.join("opt/kubernetes/patches"),
        }
    }

    fn kubeadm(&self) -> Kubeadm<ProcessCommands> {
        Kubeadm::new(self.stand_in.kubeadm(), ProcessCommands::default())
    }
}

#[tokio::test]
async fn init_runs_the_phases_in_order_and_returns_the_admin_kubeconfig() {
    let fx = InitFixture::new();
    let paths = fx.paths();
    let mut params = init_params("v1.31.2");
    params.paths = paths.clone();
    let yaml = render_init(&params).unwrap();
    let file =
        PrivateConfigFile::write(fx.root.path(), "kubeadm-init.yaml", yaml.as_bytes()).unwrap();
    fs::create_dir_all(paths.manifests_dir()).unwrap();
    fs::write(paths.manifests_dir().join("stale.yaml"), "old").unwrap();
    let kubelet = LocalKubeletCert {
        node_name: "cp-0".into(),
        ips: vec!["10.9.0.2".parse::<IpAddr>().unwrap()],
        cert_path: paths.kubelet_cert.clone(),
        key_path: paths.kubelet_key.clone(),
    };
    let kubeconfig = fx
        .kubeadm()
        .init(&InitRun {
            config: file.path(),
            cluster_name: "asterism",
            conformance_mode: false,
            certificates_dir: &paths.pki_dir(),
            manifests_dir: &paths.manifests_dir(),
            kubelet: &kubelet,
        })
        .await
        .unwrap();
    let text = String::from_utf8(kubeconfig.to_vec()).unwrap();
    assert!(text.contains("https://10.9.0.100:6443"), "{text}");
    assert!(text.contains("client-key-data"));
    let cfg = file.path().display().to_string();
    assert_eq!(
        fx.stand_in.argv(),
        [
            format!("kubeadm init phase preflight -v=5 --config {cfg}"),
            format!("kubeadm init phase certs all -v=5 --config {cfg}"),
            format!(
                "kubeadm init -v=5 --skip-phases=preflight,certs,addon/coredns,addon/kube-proxy --config {cfg}"
            ),
            format!(
                "kubeadm kubeconfig user --client-name asterism-admin --config {cfg} --org system:masters"
            ),
        ]
    );
    // Every call saw the private file.
    for call in fx.stand_in.calls() {
        assert_eq!(call["config_mode"], 0o600);
        assert_eq!(call["dir_mode"], 0o700);
    }
    // The node's kubelet certificate, signed by the CA the certs phase made.
    let key_mode = fs::metadata(&paths.kubelet_key)
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(key_mode, 0o600);
    let cert = fs::read_to_string(&paths.kubelet_cert).unwrap();
    assert!(cert.starts_with("-----BEGIN CERTIFICATE-----"));
    let ca = asterism_pki::x509::ClusterCa::from_pem(
        &fs::read_to_string(paths.pki_dir().join("ca.crt")).unwrap(),
        &fs::read_to_string(paths.pki_dir().join("ca.key")).unwrap(),
    )
    .unwrap();
    let _ = ca;
    // The stale manifest was removed before init (the stand-in refuses a non-empty dir).
    assert!(!paths.manifests_dir().join("stale.yaml").exists());
}

#[tokio::test]
async fn conformance_mode_keeps_kube_proxy() {
    let fx = InitFixture::new();
    let paths = fx.paths();
    let mut params = init_params("v1.30.14");
    params.paths = paths.clone();
    let file = PrivateConfigFile::write(
        fx.root.path(),
        "kubeadm-init.yaml",
        render_init(&params).unwrap().as_bytes(),
    )
    .unwrap();
    let kubelet = LocalKubeletCert {
        node_name: "cp-0".into(),
        ips: vec!["10.9.0.2".parse().unwrap()],
        cert_path: paths.kubelet_cert.clone(),
        key_path: paths.kubelet_key.clone(),
    };
    fx.kubeadm()
        .init(&InitRun {
            config: file.path(),
            cluster_name: "asterism",
            conformance_mode: true,
            certificates_dir: &paths.pki_dir(),
            manifests_dir: &paths.manifests_dir(),
            kubelet: &kubelet,
        })
        .await
        .unwrap();
    assert!(
        fx.stand_in
            .argv()
            .iter()
            .any(|a| a.contains("--skip-phases=preflight,certs,addon/coredns "))
    );
}

#[tokio::test]
async fn a_failing_kubeadm_becomes_a_typed_error_with_code_and_redacted_output() {
    let fx = InitFixture::new();
    fx.stand_in.settings(serde_json::json!({
        "fail": {"join": {"code": 7, "stderr": format!("error execution phase preflight: token {TOKEN} rejected\n")}}
    }));
    let paths = fx.paths();
    let mut p = join_params(ApiVersion::V1Beta4, false);
    p.paths = paths.clone();
    let file = PrivateConfigFile::write(
        fx.root.path(),
        "kubeadm-join.yaml",
        render_join(&p).unwrap().as_bytes(),
    )
    .unwrap();
    let err = fx
        .kubeadm()
        .join(file.path(), &paths.manifests_dir())
        .await
        .unwrap_err();
    match &err {
        KubeadmError::Failed {
            code,
            output_tail,
            command,
        } => {
            assert_eq!(*code, Some(7));
            assert!(
                output_tail.contains("error execution phase preflight"),
                "{output_tail}"
            );
            assert!(output_tail.contains("<redacted>"));
            assert!(command.contains(" join -v=5 --config "));
        }
        other => panic!("{other:?}"),
    }
    assert!(!format!("{err} {err:?}").contains(TOKEN));
}

#[tokio::test]
async fn a_missing_kubeadm_is_a_spawn_error() {
    let k = Kubeadm::new(
        PathBuf::from("/nonexistent/kubeadm"),
        ProcessCommands::default(),
    );
    assert!(matches!(k.version().await, Err(KubeadmError::Spawn { .. })));
}

#[tokio::test]
async fn the_installed_kubeadm_version_chooses_the_join_api() {
    let fx = InitFixture::new();
    fx.stand_in
        .settings(serde_json::json!({"version": "v1.30.4"}));
    let v = fx.kubeadm().version().await.unwrap();
    assert_eq!(ApiVersion::for_kubernetes(&v), ApiVersion::V1Beta3);
    // A pre-release kubeadm chooses by its major and minor.
    fx.stand_in
        .settings(serde_json::json!({"version": "v1.31.0-rc.1"}));
    let v = fx.kubeadm().version().await.unwrap();
    assert_eq!(ApiVersion::for_kubernetes(&v), ApiVersion::V1Beta4);
    fx.stand_in.settings(serde_json::json!({"version": "1.31"}));
    assert!(matches!(
        fx.kubeadm().version().await,
        Err(KubeadmError::Version(text)) if text == "1.31"
    ));
}

/// The stand-in refuses what real kubeadm would not accept (or Asterism must never send).
#[tokio::test]
async fn the_stand_in_refuses_bad_join_configurations() {
    let good = render_join(&join_params(ApiVersion::V1Beta4, false))
        .unwrap()
        .to_string();
    let cases: Vec<(&str, String, u32)> = vec![
        ("world-readable", good.clone(), 0o644),
        ("no token", good.replace(&format!("token: {TOKEN}\n"), ""), 0o600),
        ("bad token", good.replace(TOKEN, "short.token"), 0o600),
        ("no endpoint", good.replace("apiServerEndpoint: 10.9.0.100:6443\n", ""), 0o600),
        ("no CA pins", good.replace(&format!("    caCertHashes:\n    - {}\n", hash()), ""), 0o600),
        ("skip CA verification", good.replace("  bootstrapToken:\n", "  bootstrapToken:\n    unsafeSkipCAVerification: true\n"), 0o600),
        ("v1beta3 for a 1.31 kubeadm", good.replace("kubeadm.k8s.io/v1beta4", "kubeadm.k8s.io/v1beta3"), 0o600),
        (
            "map extra args in v1beta4",
            good.replace(
                "  kubeletExtraArgs:\n  - name: cloud-provider\n    value: external\n  - name: node-ip\n    value: 10.9.0.3\n  - name: provider-id\n    value: asterism-local:///node\n",
                "  kubeletExtraArgs:\n    cloud-provider: external\n    node-ip: 10.9.0.3\n    provider-id: asterism-local:///node\n",
            ),
            0o600,
        ),
    ];
    for (name, yaml, mode) in cases {
        assert!(
            mode != 0o600 || yaml != good,
            "{name}: the case changes nothing"
        );
        let fx = InitFixture::new();
        let paths = fx.paths();
        fs::create_dir_all(paths.pki_dir()).unwrap();
        let file =
            PrivateConfigFile::write(fx.root.path(), "kubeadm-join.yaml", yaml.as_bytes()).unwrap();
        fs::set_permissions(file.path(), fs::Permissions::from_mode(mode)).unwrap();
        // caCertPath points into the standard layout; run from a layout the stand-in can see.
        let yaml_here = yaml.replace(
            "/etc/kubernetes",
            &paths.kubernetes_dir.display().to_string(),
        );
        fs::write(file.path(), yaml_here).unwrap();
        let err = fx
            .kubeadm()
            .join(file.path(), &paths.manifests_dir())
            .await
            .unwrap_err();
        assert!(
            matches!(err, KubeadmError::Failed { code: Some(2), .. }),
            "{name}: {err:?}"
        );
    }
    // And accepts the good one.
    let fx = InitFixture::new();
    let paths = fx.paths();
    let file = PrivateConfigFile::write(
        fx.root.path(),
        "kubeadm-join.yaml",
        good.replace(
            "/etc/kubernetes",
            &paths.kubernetes_dir.display().to_string(),
        )
        .as_bytes(),
    )
    .unwrap();
    fx.kubeadm()
        .join(file.path(), &paths.manifests_dir())
        .await
        .unwrap();
}

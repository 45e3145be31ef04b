//! The post-init deployment: its manifests against golden files (`UPDATE_GOLDEN=1 cargo
//! test -p asterism-kube-api --test deploy` rewrites them), and its creation against the
//! recording API server: exactly which objects, where, with which RBAC verbs, and the wait
//! for the join service's pods.

use asterism_kube_api::{
    ApiError, ClusterApi, DeploymentSpec, Images, JoinServiceTrust, KeyServiceSecret, Object,
    RolloutStatus, WaitPolicy, deployment,
};
use asterism_testkit::kube_api::paths::{CONFIG_MAPS, DAEMON_SETS};
use asterism_testkit::kube_api::{RecordingServer, Reply, Request};
use base64::Engine as _;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

const MASTER_SECRET: [u8; 32] = [0x5a; 32];
const SALT: [u8; 32] = [0xa5; 32];
const MEASUREMENT_SALT: [u8; 32] = [7; 32];

fn spec() -> DeploymentSpec {
    DeploymentSpec {
        images: Images::from_repository("registry.example/asterism/", "v0.1.0"),
        attestation_config: "{\n  \"measurements\": {\n    \"4\": {\"expected\": \"1111111111111111111111111111111111111111111111111111111111111111\", \"warnOnly\": false}\n  }\n}\n".into(),
        measurement_salt: MEASUREMENT_SALT,
        trust: JoinServiceTrust {
            args: vec!["--platform-ca=/var/trust/platform-ca.pem".into()],
            files: BTreeMap::from([(
                "platform-ca.pem".into(),
                "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".into(),
            )]),
        },
        metadata_url: Some("http://10.0.0.254:8080".into()),
    }
}

fn secret() -> KeyServiceSecret {
    KeyServiceSecret::new(&MASTER_SECRET, &SALT).unwrap()
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

async fn setup() -> (RecordingServer, ClusterApi, tempfile::TempDir) {
    let server = RecordingServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let api = server.api(dir.path()).await;
    (server, api, dir)
}

/// Routes every write of the deployment: `join-config` does not exist yet, every apply is
/// answered with its object.
fn route_deployment(server: &RecordingServer) {
    server.route_new_join_config();
    for object in deployment(&spec()).unwrap().objects() {
        server.echo("PATCH", &object.api_path());
    }
}

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

#[test]
fn the_manifests_match_the_golden_files() {
    let deployment = deployment(&spec()).unwrap();
    let update = std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1");
    let mut files: Vec<&str> = Vec::new();
    for manifest in &deployment.manifests {
        let yaml = manifest.to_yaml().unwrap();
        let golden = golden_dir().join(manifest.file);
        if update {
            std::fs::create_dir_all(golden_dir()).unwrap();
            std::fs::write(&golden, &yaml).unwrap();
        }
        let expected = std::fs::read_to_string(&golden)
            .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", golden.display()));
        assert_eq!(
            yaml,
            expected,
            "{} differs from the generated manifest; if the change is meant, rerun with UPDATE_GOLDEN=1",
            golden.display()
        );
        files.push(manifest.file);
    }
    assert_eq!(
        files,
        [
            "join-config.yaml",
            "key-service-secret.yaml",
            "key-service.yaml",
            "join-service.yaml",
            "verify-service.yaml"
        ]
    );
}

#[test]
fn no_manifest_holds_the_key_service_secret() {
    let deployment = deployment(&spec()).unwrap();
    let secret = deployment
        .objects()
        .find_map(|o| match o {
            Object::Secret(s) => Some(s.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(secret.data, None);
    assert_eq!(secret.string_data, None);
    for manifest in &deployment.manifests {
        let yaml = manifest.to_yaml().unwrap();
        for value in [b64(&MASTER_SECRET), b64(&SALT), hex::encode(MASTER_SECRET)] {
            assert!(
                !yaml.contains(&value),
                "{} holds a secret value",
                manifest.file
            );
        }
    }
}

#[test]
fn an_attestation_config_that_is_no_json_is_refused() {
    let mut bad = spec();
    bad.attestation_config = "{not json".into();
    let err = deployment(&bad).unwrap_err();
    assert!(
        matches!(
            err,
            ApiError::InvalidInput {
                what: "attestation configuration",
                ..
            }
        ),
        "{err:?}"
    );
}

/// The write requests as `(method, path)`.
fn writes(requests: &[Request]) -> Vec<(String, String)> {
    requests
        .iter()
        .filter(|r| r.is_write())
        .map(|r| (r.method.clone(), r.path.clone()))
        .collect()
}

#[tokio::test]
async fn the_deployment_creates_exactly_these_objects() {
    let (server, api, _dir) = setup().await;
    route_deployment(&server);
    let spec = spec();
    let deployment = deployment(&spec).unwrap();
    let applied = api
        .apply_deployment(&spec, &deployment, &secret())
        .await
        .unwrap();
    assert_eq!(
        applied,
        [
            "ConfigMap kube-system/join-config",
            "Secret kube-system/asterism-mastersecret",
            "ServiceAccount kube-system/key-service",
            "DaemonSet kube-system/key-service",
            "ConfigMap kube-system/join-service-trust",
            "ServiceAccount kube-system/join-service",
            "Role kube-system/join-service",
            "RoleBinding kube-system/join-service",
            "ClusterRole join-service",
            "ClusterRoleBinding join-service",
            "DaemonSet kube-system/join-service",
            "ServiceAccount kube-system/verify-service",
            "DaemonSet kube-system/verify-service",
        ]
    );
    let requests = server.requests();
    let mut expected = vec![("POST".to_owned(), CONFIG_MAPS.to_owned())];
    expected.extend(
        deployment
            .objects()
            .skip(1)
            .map(|o| ("PATCH".to_owned(), o.api_path())),
    );
    assert_eq!(writes(&requests), expected);

    let writes: Vec<&Request> = requests.iter().filter(|r| r.is_write()).collect();
    // join-config: what the join service reads.
    let join_config = &writes[0].body;
    assert_eq!(join_config["metadata"]["name"], "join-config");
    assert_eq!(join_config["metadata"]["namespace"], "kube-system");
    assert_eq!(
        join_config["data"]["attestationConfig"],
        spec.attestation_config
    );
    assert_eq!(
        join_config["binaryData"]["measurementSalt"],
        b64(&MEASUREMENT_SALT)
    );
    // Every other object: server-side apply by the CLI's field manager.
    for w in &writes[1..] {
        assert_eq!(
            w.query_param("fieldManager").as_deref(),
            Some("asterism-cli")
        );
        assert_eq!(w.query_param("force").as_deref(), Some("true"));
        assert_eq!(w.content_type, "application/apply-patch+yaml");
        let namespaced = !w.path.contains("/clusterrole");
        assert_eq!(
            w.body["metadata"]["namespace"].as_str(),
            namespaced.then_some("kube-system"),
            "{}",
            w.path
        );
    }
    // The Secret, with the values the key service reads.
    let secret = writes[1];
    assert_eq!(secret.body["kind"], "Secret");
    assert_eq!(secret.body["immutable"], true);
    assert_eq!(secret.body["type"], "Opaque");
    assert_eq!(secret.body["data"]["mastersecret"], b64(&MASTER_SECRET));
    assert_eq!(secret.body["data"]["salt"], b64(&SALT));
    assert_eq!(
        secret.body["data"].as_object().unwrap().len(),
        2,
        "only the two keys the key service reads"
    );

    let body = |kind: &str, name: &str| {
        writes
            .iter()
            .find(|w| w.body["kind"] == kind && w.body["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name}"))
            .body
            .clone()
    };
    // RBAC: only the join service has any, exactly the verbs it uses, no delete.
    let rules = |kind: &str| -> Vec<(String, String, Vec<String>)> {
        body(kind, "join-service")["rules"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| {
                let group = r["apiGroups"][0].as_str().unwrap().to_owned();
                let verbs: Vec<String> = r["verbs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_str().unwrap().to_owned())
                    .collect();
                r["resources"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(move |res| {
                        (
                            group.clone(),
                            res.as_str().unwrap().to_owned(),
                            verbs.clone(),
                        )
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let v = |verbs: &[&str]| verbs.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        rules("Role"),
        [
            ("".into(), "secrets".into(), v(&["list", "create"])),
            (
                "".into(),
                "configmaps".into(),
                v(&["get", "list", "create", "update"])
            ),
        ]
    );
    assert_eq!(
        rules("ClusterRole"),
        [
            ("".into(), "namespaces".into(), v(&["list"])),
            (
                "update.edgeless.systems".into(),
                "nodeversions".into(),
                v(&["get"])
            ),
            (
                "update.edgeless.systems".into(),
                "joiningnodes".into(),
                v(&["get", "create", "patch"])
            ),
        ]
    );
    for kind in ["RoleBinding", "ClusterRoleBinding"] {
        let b = body(kind, "join-service");
        assert_eq!(b["subjects"][0]["kind"], "ServiceAccount");
        assert_eq!(b["subjects"][0]["name"], "join-service");
        assert_eq!(b["subjects"][0]["namespace"], "kube-system");
        assert_eq!(b["roleRef"]["name"], "join-service");
    }
    // The key and verify services get no API token; the join service does.
    assert_eq!(
        body("ServiceAccount", "key-service")["automountServiceAccountToken"],
        false
    );
    assert_eq!(
        body("ServiceAccount", "verify-service")["automountServiceAccountToken"],
        false
    );
    assert_eq!(
        body("ServiceAccount", "join-service")["automountServiceAccountToken"],
        true
    );

    // DaemonSets on control-plane nodes only.
    for name in ["key-service", "join-service", "verify-service"] {
        let ds = body("DaemonSet", name);
        let pod = &ds["spec"]["template"]["spec"];
        assert_eq!(
            pod["nodeSelector"],
            serde_json::json!({"node-role.kubernetes.io/control-plane": ""}),
            "{name}"
        );
        assert_eq!(
            pod["tolerations"],
            serde_json::json!([{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]),
            "{name}"
        );
        assert_eq!(pod["serviceAccountName"], name);
        assert_eq!(pod["hostNetwork"], true);
    }
    let join = body("DaemonSet", "join-service");
    let container = &join["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        container["image"],
        "registry.example/asterism/join-service:v0.1.0"
    );
    assert_eq!(container["ports"][0]["hostPort"], 30090);
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    for wanted in [
        "--listen=0.0.0.0:30090",
        "--measurements=/var/config/attestationConfig",
        "--measurement-salt-file=/var/config/measurementSalt",
        "--key-service=unix:/run/asterism/key-service/kms.sock",
        "--cluster-state=kubernetes",
        "--platform-ca=/var/trust/platform-ca.pem",
    ] {
        assert!(args.contains(&wanted), "{wanted} missing from {args:?}");
    }
    let key = body("DaemonSet", "key-service");
    let key_pod = &key["spec"]["template"]["spec"];
    assert_eq!(
        key_pod["volumes"][0]["secret"]["secretName"],
        "asterism-mastersecret"
    );
    assert_eq!(key_pod["volumes"][0]["secret"]["defaultMode"], 0o400);
    assert_eq!(
        key_pod["containers"][0]["args"],
        serde_json::json!([
            "--listen=unix:/run/asterism/key-service/kms.sock",
            "--master-secret-file=/var/config/mastersecret",
            "--salt-file=/var/config/salt"
        ])
    );
}

#[tokio::test]
async fn join_config_with_another_salt_stops_the_deployment_before_the_secret() {
    let (server, api, _dir) = setup().await;
    route_deployment(&server);
    server.on(
        "GET",
        &format!("{CONFIG_MAPS}/join-config"),
        [Reply::recorded(
            200,
            "configmap-join-config-other-salt.json",
        )],
    );
    let spec = spec();
    let err = api
        .apply_deployment(&spec, &deployment(&spec).unwrap(), &secret())
        .await
        .unwrap_err();
    assert!(matches!(err, ApiError::SaltMismatch), "{err:?}");
    assert!(server.writes().is_empty(), "{:?}", server.writes());
}

fn daemon_set(generation: i64, observed: i64, desired: i32, updated: i32, ready: i32) -> Reply {
    Reply::json(
        200,
        serde_json::json!({
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "join-service", "namespace": "kube-system", "generation": generation},
            "spec": {
                "selector": {"matchLabels": {"app.kubernetes.io/name": "join-service"}},
                "template": {"spec": {"containers": [{"name": "join-service"}]}}
            },
            "status": {
                "observedGeneration": observed,
                "desiredNumberScheduled": desired,
                "currentNumberScheduled": desired,
                "updatedNumberScheduled": updated,
                "numberReady": ready,
                "numberMisscheduled": 0
            }
        })
        .to_string(),
    )
}

fn fast(deadline_ms: u64) -> WaitPolicy {
    WaitPolicy {
        interval: Duration::from_millis(20),
        deadline: Duration::from_millis(deadline_ms),
    }
}

#[tokio::test]
async fn waiting_for_the_join_service_reports_progress_until_every_pod_is_ready() {
    let (server, api, _dir) = setup().await;
    server.on(
        "GET",
        &format!("{DAEMON_SETS}/join-service"),
        [
            Reply::recorded(500, "status-500-internal-error.json"),
            daemon_set(1, 0, 0, 0, 0),
            daemon_set(1, 1, 1, 1, 0),
            daemon_set(1, 1, 1, 1, 0),
            daemon_set(1, 1, 1, 1, 1),
        ],
    );
    let mut seen = Vec::new();
    let status = api
        .wait_for_daemon_set("join-service", fast(10_000), &mut |s: &RolloutStatus| {
            seen.push(s.to_string());
        })
        .await
        .unwrap();
    assert!(status.is_ready());
    assert_eq!(
        seen,
        [
            "0/0 pods ready, 0 up to date",
            "0/1 pods ready, 1 up to date",
            "1/1 pods ready, 1 up to date"
        ]
    );
    assert_eq!(server.requests().len(), 5);
}

#[tokio::test]
async fn waiting_for_the_join_service_gives_up_at_the_deadline() {
    let (server, api, _dir) = setup().await;
    server.on(
        "GET",
        &format!("{DAEMON_SETS}/join-service"),
        [daemon_set(2, 2, 3, 3, 2)],
    );
    let err = api
        .wait_for_daemon_set("join-service", fast(300), &mut |_: &RolloutStatus| {})
        .await
        .unwrap_err();
    let ApiError::DaemonSetNotReady { name, status, .. } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(name, "join-service");
    assert_eq!(status, "2/3 pods ready, 3 up to date");
    assert!(err.is_retryable());
}

//! The Kubernetes API module against a recording API server: HTTPS on loopback with a test CA
//! and a client certificate from an admin kubeconfig, answers recorded from the real API
//! (`crates/testkit/recorded/`), every request recorded so that each test checks what the client sent
//! as well as how it handled the answer.

use asterism_kube_api::{
    ApiError, ApiOptions, ClusterApi, JoinConfigChange, JoiningNode, TokenPolicy, WaitPolicy,
};
use asterism_proto::components::Component;
use asterism_testkit::kube_api::paths::{CONFIG_MAPS, JOINING_NODES, NAMESPACES, SECRETS};
use asterism_testkit::kube_api::{RecordingServer, Reply, recorded};
use base64::Engine as _;
use std::time::{Duration, Instant, SystemTime};

const DISK: &str = "aaaaaaaa-0000-4000-8000-00000000000a";
const AK: &str = "5e1b3d5f7a9c1e3b5d7f9a1c3e5b7d9f1a3c5e7b9d1f3a5c7e9b1d3f5a7c9e0b";
const SALT: [u8; 32] = [7; 32];
const CONFIG: &str = r#"{"measurements":{}}"#;
const OLD_CONFIG: &str = r#"{"measurements":{"4":{"expected":"1111111111111111111111111111111111111111111111111111111111111111","warnOnly":false}}}"#;

/// 2026-03-02T10:00:00Z, the "now" of the recordings.
fn t0() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_772_445_600)
}

async fn setup() -> (RecordingServer, ClusterApi, tempfile::TempDir) {
    let server = RecordingServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let api = server.api(dir.path()).await;
    (server, api, dir)
}

/// The object at `path` reads as `current`; the first replace of it loses a race (409,
/// `conflict`: another writer was first), the next is `updated`.
fn lose_one_race(
    server: &RecordingServer,
    path: &str,
    current: &str,
    conflict: &str,
    updated: &str,
) {
    server.on("GET", path, [Reply::recorded(200, current)]);
    server.on(
        "PUT",
        path,
        [
            Reply::recorded(409, conflict),
            Reply::recorded(200, updated),
        ],
    );
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn fast(deadline_ms: u64) -> WaitPolicy {
    WaitPolicy {
        interval: Duration::from_millis(50),
        deadline: Duration::from_millis(deadline_ms),
    }
}

// --- Waiting for the API server -------------------------------------------------------------

#[tokio::test]
async fn waiting_retries_until_the_api_server_lists_namespaces() {
    let (server, api, _dir) = setup().await;
    server.on(
        "GET",
        NAMESPACES,
        [
            Reply::recorded(503, "status-503-service-unavailable.json"),
            Reply::recorded(500, "status-500-internal-error.json"),
            Reply::recorded(200, "namespace-list.json"),
        ],
    );
    api.wait_until_ready(fast(10_000)).await.unwrap();
    let requests = server.requests();
    assert_eq!(requests.len(), 3, "{requests:?}");
    for r in &requests {
        assert_eq!((r.method.as_str(), r.path.as_str()), ("GET", NAMESPACES));
        assert_eq!(r.query_param("limit").as_deref(), Some("1"));
    }
}

#[tokio::test]
async fn waiting_gives_up_at_the_deadline_with_the_last_error() {
    let (server, api, _dir) = setup().await;
    server.on(
        "GET",
        NAMESPACES,
        [Reply::recorded(503, "status-503-service-unavailable.json")],
    );
    let started = Instant::now();
    let err = api.wait_until_ready(fast(1000)).await.unwrap_err();
    let took = started.elapsed();
    let ApiError::NotReady { attempts, last, .. } = &err else {
        panic!("{err:?}");
    };
    assert!(*attempts >= 2, "{err:?}");
    assert!(
        matches!(**last, ApiError::Server { code: 503, .. }),
        "{err:?}"
    );
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "{took:?}"
    );
    // Every attempt reached the server, except perhaps the last, when the deadline cut it
    // before its request arrived.
    let seen = server.requests().len() as u32;
    assert!(
        seen == *attempts || seen + 1 == *attempts,
        "{seen} requests for {attempts} attempts"
    );
    assert!(err.is_retryable());
}

#[tokio::test]
async fn an_api_server_with_a_certificate_from_another_ca_is_not_trusted() {
    let real = RecordingServer::start().await;
    let impostor = RecordingServer::start().await;
    impostor.on(
        "GET",
        NAMESPACES,
        [Reply::recorded(200, "namespace-list.json")],
    );
    // The real cluster's kubeconfig (CA, client certificate), pointed at the impostor.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("admin.conf");
    std::fs::write(
        &path,
        real.kubeconfig().replace(&real.url(), &impostor.url()),
    )
    .unwrap();
    let api = ClusterApi::from_kubeconfig(&path, ApiOptions::default())
        .await
        .unwrap();
    let err = api.wait_until_ready(fast(1500)).await.unwrap_err();
    let ApiError::NotReady { last, .. } = &err else {
        panic!("{err:?}");
    };
    assert!(matches!(**last, ApiError::Unreachable { .. }), "{err:?}");
    assert!(impostor.requests().is_empty(), "no request went through");
}

#[tokio::test]
async fn a_missing_kubeconfig_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = ClusterApi::from_kubeconfig(&dir.path().join("nope.conf"), ApiOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(err, ApiError::Kubeconfig { .. }), "{err:?}");
}

// --- After init: join-config, components, internal-config ------------------------------------

#[tokio::test]
async fn join_config_is_created_with_the_measurements_and_the_raw_salt() {
    let (server, api, _dir) = setup().await;
    server.on(
        "GET",
        &format!("{CONFIG_MAPS}/join-config"),
        [Reply::recorded(
            404,
            "status-404-configmap-join-config.json",
        )],
    );
    server.on(
        "POST",
        CONFIG_MAPS,
        [Reply::recorded(201, "configmap-join-config-created.json")],
    );
    let change = api.apply_join_config(CONFIG, &SALT).await.unwrap();
    assert_eq!(change, JoinConfigChange::Created);
    let writes = server.writes();
    assert_eq!(writes.len(), 1, "{writes:?}");
    let body = &writes[0].body;
    assert_eq!(writes[0].path, CONFIG_MAPS);
    assert_eq!(body["metadata"]["name"], "join-config");
    assert_eq!(body["metadata"]["namespace"], "kube-system");
    assert_eq!(body["data"]["attestationConfig"], CONFIG);
    assert_eq!(body["binaryData"]["measurementSalt"], b64(&SALT));
    assert!(body["data"].get("attestationConfig_backup").is_none());
}

#[tokio::test]
async fn updating_join_config_keeps_the_previous_one_and_survives_a_lost_race() {
    let (server, api, _dir) = setup().await;
    lose_one_race(
        &server,
        &format!("{CONFIG_MAPS}/join-config"),
        "configmap-join-config.json",
        "status-409-configmap-join-config-conflict.json",
        "configmap-join-config-updated.json",
    );
    let change = api.apply_join_config(CONFIG, &SALT).await.unwrap();
    assert_eq!(change, JoinConfigChange::Updated);
    let methods: Vec<_> = server.requests().iter().map(|r| r.method.clone()).collect();
    assert_eq!(methods, ["GET", "PUT", "GET", "PUT"]);
    let put = &server.writes()[1];
    assert_eq!(put.body["metadata"]["resourceVersion"], "1288");
    assert_eq!(put.body["data"]["attestationConfig"], CONFIG);
    assert_eq!(put.body["data"]["attestationConfig_backup"], OLD_CONFIG);
    assert_eq!(put.body["binaryData"]["measurementSalt"], b64(&SALT));
}

#[tokio::test]
async fn join_config_with_another_salt_is_never_overwritten() {
    let (server, api, _dir) = setup().await;
    server.on(
        "GET",
        &format!("{CONFIG_MAPS}/join-config"),
        [Reply::recorded(
            200,
            "configmap-join-config-other-salt.json",
        )],
    );
    let err = api.apply_join_config(CONFIG, &SALT).await.unwrap_err();
    assert!(matches!(err, ApiError::SaltMismatch), "{err:?}");
    assert!(server.writes().is_empty());
}

#[tokio::test]
async fn an_unchanged_join_config_is_not_written_and_bad_json_is_refused() {
    let (server, api, _dir) = setup().await;
    server.on(
        "GET",
        &format!("{CONFIG_MAPS}/join-config"),
        [Reply::recorded(200, "configmap-join-config.json")],
    );
    assert_eq!(
        api.apply_join_config(OLD_CONFIG, &SALT).await.unwrap(),
        JoinConfigChange::Unchanged
    );
    let err = api.apply_join_config("{not json", &SALT).await.unwrap_err();
    assert!(matches!(err, ApiError::InvalidInput { .. }), "{err:?}");
    assert!(server.writes().is_empty());
}

#[tokio::test]
async fn the_components_configmap_is_immutable_and_named_by_the_hashes() {
    let (server, api, _dir) = setup().await;
    server.on(
        "POST",
        CONFIG_MAPS,
        [Reply::recorded(201, "configmap-components-created.json")],
    );
    server.on(
        "PATCH",
        "/api/v1/nodes/cp-0",
        [Reply::recorded(200, "node-cp-0-annotated.json")],
    );
    let components = [Component {
        url: "https://dl.k8s.io/v1.33.4/bin/linux/amd64/kubelet".into(),
        hash: format!("sha256:{}", "1".repeat(64)),
        install_path: "/run/state/bin/kubelet".into(),
        extract: false,
    }];
    let name = api
        .create_components_config_map(&components, "v1.33.4")
        .await
        .unwrap();
    assert_eq!(
        name,
        "k8s-components-sha256-5d4cc820b37f3d1fd0c6e04ed50a56ead8d497ecfd3c25c749855ed9d852837d"
    );
    api.annotate_node_components("cp-0", &name).await.unwrap();

    let writes = server.writes();
    assert_eq!(writes.len(), 2, "{writes:?}");
    let cm = &writes[0].body;
    assert_eq!(cm["metadata"]["name"], name.as_str());
    assert_eq!(cm["immutable"], true);
    assert_eq!(cm["data"]["cluster-version"], "v1.33.4");
    let listed: serde_json::Value =
        serde_json::from_str(cm["data"]["components"].as_str().unwrap()).unwrap();
    assert_eq!(listed[0]["install_path"], "/run/state/bin/kubelet");
    assert!(
        listed[0].get("extract").is_none(),
        "zero values are omitted"
    );

    let patch = &writes[1];
    assert_eq!(patch.content_type, "application/merge-patch+json");
    assert_eq!(
        patch.body["metadata"]["annotations"]["constellation.edgeless.systems/kubernetes-components"],
        name.as_str()
    );
}

#[tokio::test]
async fn the_components_configmap_is_read_back_only_when_its_list_hashes_to_its_name() {
    let (server, api, _dir) = setup().await;
    let name =
        "k8s-components-sha256-5d4cc820b37f3d1fd0c6e04ed50a56ead8d497ecfd3c25c749855ed9d852837d";
    let recorded_cm: serde_json::Value =
        serde_json::from_str(&recorded("configmap-components-created.json")).unwrap();
    // The same object with another binary swapped in under the same name.
    let mut swapped = recorded_cm.clone();
    swapped["data"]["components"] = serde_json::json!([{
        "url": "https://example.com/kubelet",
        "hash": format!("sha256:{}", "2".repeat(64)),
        "install_path": "/run/state/bin/kubelet",
    }])
    .to_string()
    .into();
    let mut no_version = recorded_cm.clone();
    no_version["data"]
        .as_object_mut()
        .unwrap()
        .remove("cluster-version");
    server.on(
        "GET",
        &format!("{CONFIG_MAPS}/{name}"),
        [
            Reply::recorded(200, "configmap-components-created.json"),
            Reply::json(200, swapped.to_string()),
            Reply::json(200, no_version.to_string()),
        ],
    );

    let recorded = api.components_config_map(name).await.unwrap();
    assert_eq!(recorded.name, name);
    assert_eq!(recorded.cluster_version, "v1.33.4");
    assert_eq!(
        recorded.components,
        [Component {
            url: "https://dl.k8s.io/v1.33.4/bin/linux/amd64/kubelet".into(),
            hash: format!("sha256:{}", "1".repeat(64)),
            install_path: "/run/state/bin/kubelet".into(),
            extract: false,
        }]
    );

    let err = api.components_config_map(name).await.unwrap_err();
    match &err {
        ApiError::ComponentsMismatch {
            name: n,
            content_hash,
        } => {
            assert_eq!(n, name);
            assert_ne!(
                content_hash.replace(':', "-"),
                name["k8s-components-".len()..]
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(!err.is_retryable());

    let err = api.components_config_map(name).await.unwrap_err();
    assert!(
        matches!(&err, ApiError::Malformed { detail, .. } if detail.contains("cluster-version")),
        "{err:?}"
    );
    assert!(server.writes().is_empty());
}

#[tokio::test]
async fn internal_config_is_created_empty_and_an_existing_one_is_fine() {
    let (server, api, _dir) = setup().await;
    server.on(
        "POST",
        CONFIG_MAPS,
        [
            Reply::recorded(201, "configmap-internal-config-created.json"),
            Reply::json(
                409,
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"configmaps \"internal-config\" already exists","reason":"AlreadyExists","details":{"name":"internal-config","kind":"configmaps"},"code":409}"#,
            ),
        ],
    );
    api.create_internal_config().await.unwrap();
    api.create_internal_config().await.unwrap();
    let writes = server.writes();
    assert_eq!(writes[0].body["metadata"]["name"], "internal-config");
    assert!(writes[0].body.get("data").is_none());
}

// --- Bootstrap tokens -------------------------------------------------------------------------

fn is_token(s: &str) -> bool {
    let (id, secret) = s.split_once('.').unwrap_or_default();
    let ok = |p: &str, n: usize| {
        p.len() == n
            && p.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    ok(id, 6) && ok(secret, 16)
}

#[tokio::test]
async fn a_stored_token_with_enough_time_left_is_reused_without_a_write() {
    let (server, api, _dir) = setup().await;
    server.on(
        "GET",
        SECRETS,
        [Reply::recorded(
            200,
            "secret-list-bootstrap-tokens-valid.json",
        )],
    );
    let token = api
        .bootstrap_token(t0(), TokenPolicy::default())
        .await
        .unwrap();
    // Of the two stored tokens (12 and 14 min left), the one with more time left.
    assert_eq!(token.token.expose_secret(), "k3m9p2.z8y7x6w5v4u3t2s1");
    assert_eq!(token.expires, t0() + Duration::from_secs(14 * 60));
    assert!(server.writes().is_empty(), "{:?}", server.writes());
    let list = &server.requests()[0];
    assert_eq!(
        list.query_param("labelSelector").as_deref(),
        Some("asterism.dev/managed-by=join-service")
    );
    assert_eq!(
        list.query_param("fieldSelector").as_deref(),
        Some("type=bootstrap.kubernetes.io/token")
    );
}

async fn assert_mints_one(list_file: &str) {
    let (server, api, _dir) = setup().await;
    server.on("GET", SECRETS, [Reply::recorded(200, list_file)]);
    server.on(
        "POST",
        SECRETS,
        [Reply::recorded(201, "secret-bootstrap-token-created.json")],
    );
    let token = api
        .bootstrap_token(t0(), TokenPolicy::default())
        .await
        .unwrap();
    assert!(is_token(token.token.expose_secret()), "{token:?}");
    assert_eq!(token.expires, t0() + Duration::from_secs(15 * 60));

    let writes = server.writes();
    assert_eq!(writes.len(), 1, "{writes:?}");
    let create = &writes[0];
    assert_eq!(
        (create.method.as_str(), create.path.as_str()),
        ("POST", SECRETS)
    );
    let (id, secret) = token.token.expose_secret().split_once('.').unwrap();
    assert_eq!(
        create.body["metadata"]["name"],
        format!("bootstrap-token-{id}")
    );
    assert_eq!(create.body["metadata"]["namespace"], "kube-system");
    assert_eq!(
        create.body["metadata"]["labels"]["asterism.dev/managed-by"],
        "join-service"
    );
    assert_eq!(create.body["type"], "bootstrap.kubernetes.io/token");
    let data = |k: &str| create.secret_data(k).unwrap_or_else(|| panic!("no {k}"));
    assert_eq!(data("token-id"), id);
    assert_eq!(data("token-secret"), secret);
    assert_eq!(data("expiration"), "2026-03-02T10:15:00Z");
    assert_eq!(data("usage-bootstrap-signing"), "true");
    assert_eq!(data("usage-bootstrap-authentication"), "true");
    assert_eq!(
        data("auth-extra-groups"),
        "system:bootstrappers:kubeadm:default-node-token"
    );
    assert_eq!(
        data("description"),
        "Bootstrap token generated by Asterism's join service"
    );
}

#[tokio::test]
async fn a_token_is_minted_when_none_is_stored() {
    assert_mints_one("secret-list-empty.json").await;
}

#[tokio::test]
async fn a_token_is_minted_when_the_stored_ones_are_nearly_expired() {
    // 3 min left and 1 min past: neither has the 5 min a node needs.
    assert_mints_one("secret-list-bootstrap-tokens-expiring.json").await;
}

#[tokio::test]
async fn the_reuse_window_is_the_policy_minimum() {
    // At 10:08 the best stored token (10:14) has 6 min left: reused. At 10:09:01 it has
    // less than 5 min: a new one.
    let (server, api, _dir) = setup().await;
    server.on(
        "GET",
        SECRETS,
        [Reply::recorded(
            200,
            "secret-list-bootstrap-tokens-valid.json",
        )],
    );
    server.on(
        "POST",
        SECRETS,
        [Reply::recorded(201, "secret-bootstrap-token-created.json")],
    );
    let policy = TokenPolicy::default();
    let at = |s: u64| t0() + Duration::from_secs(s);
    let reused = api.bootstrap_token(at(8 * 60), policy).await.unwrap();
    assert_eq!(reused.token.id(), "k3m9p2");
    assert!(server.writes().is_empty());
    let minted = api.bootstrap_token(at(9 * 60 + 1), policy).await.unwrap();
    assert_ne!(minted.token.id(), "k3m9p2");
    assert_eq!(server.writes().len(), 1);
}

// --- Disk bindings ----------------------------------------------------------------------------

#[tokio::test]
async fn an_unbound_disk_is_bound_with_an_immutable_configmap() {
    let (server, api, _dir) = setup().await;
    let path = format!("{CONFIG_MAPS}/asterism-disk-{DISK}");
    server.on(
        "GET",
        &path,
        [Reply::recorded(404, "status-404-configmap-disk.json")],
    );
    server.on(
        "POST",
        CONFIG_MAPS,
        [Reply::recorded(201, "configmap-disk-binding-created.json")],
    );
    api.check_disk(DISK, AK).await.unwrap();
    api.bind_disk(DISK, AK, t0()).await.unwrap();
    let writes = server.writes();
    assert_eq!(writes.len(), 1, "{writes:?}");
    let body = &writes[0].body;
    assert_eq!(body["metadata"]["name"], format!("asterism-disk-{DISK}"));
    assert_eq!(body["immutable"], true);
    assert_eq!(body["data"]["ak"], AK);
    assert_eq!(body["data"]["disk"], DISK);
    assert_eq!(body["data"]["boundAt"], "2026-03-02T10:00:00Z");
}

#[tokio::test]
async fn a_disk_bound_to_another_key_is_refused_without_a_write() {
    let (server, api, _dir) = setup().await;
    server.on(
        "GET",
        &format!("{CONFIG_MAPS}/asterism-disk-{DISK}"),
        [Reply::recorded(200, "configmap-disk-binding-other-ak.json")],
    );
    let err = api.check_disk(DISK, AK).await.unwrap_err();
    assert!(
        matches!(err, ApiError::DiskBoundToOtherKey { .. }),
        "{err:?}"
    );
    let err = api.bind_disk(DISK, AK, t0()).await.unwrap_err();
    assert!(
        matches!(err, ApiError::DiskBoundToOtherKey { .. }),
        "{err:?}"
    );
    assert!(server.writes().is_empty());
}

#[tokio::test]
async fn a_create_that_loses_the_race_to_another_key_is_refused() {
    // Unbound when read; another replica binds it to another AK before our create.
    let (server, api, _dir) = setup().await;
    server.on(
        "GET",
        &format!("{CONFIG_MAPS}/asterism-disk-{DISK}"),
        [
            Reply::recorded(404, "status-404-configmap-disk.json"),
            Reply::recorded(200, "configmap-disk-binding-other-ak.json"),
        ],
    );
    server.on(
        "POST",
        CONFIG_MAPS,
        [Reply::recorded(
            409,
            "status-409-configmap-disk-already-exists.json",
        )],
    );
    let err = api.bind_disk(DISK, AK, t0()).await.unwrap_err();
    assert!(
        matches!(err, ApiError::DiskBoundToOtherKey { .. }),
        "{err:?}"
    );
    let methods: Vec<_> = server.requests().iter().map(|r| r.method.clone()).collect();
    assert_eq!(methods, ["GET", "POST", "GET"]);
}

// --- JoiningNode ------------------------------------------------------------------------------

#[tokio::test]
async fn a_control_plane_joining_node_is_created_and_serialises_control_plane_joins() {
    let (server, api, _dir) = setup().await;
    let reference =
        "k8s-components-sha256-6f0f1f3b7a0d4d4e4c5b8a9e2d1c0b9a8f7e6d5c4b3a29181716151413121110";
    server.on(
        "POST",
        JOINING_NODES,
        [Reply::recorded(
            201,
            "joiningnode-control-plane-created.json",
        )],
    );
    let cp1 = JoiningNode::new("cp-1", reference, true, t0());
    api.add_joining_node(&cp1).await.unwrap();
    let create = &server.writes()[0];
    assert_eq!(
        (create.method.as_str(), create.path.as_str()),
        ("POST", JOINING_NODES)
    );
    assert_eq!(
        create.body["apiVersion"],
        "update.edgeless.systems/v1alpha1"
    );
    assert_eq!(create.body["kind"], "JoiningNode");
    assert_eq!(create.body["metadata"]["name"], "control-plane");
    assert_eq!(create.body["spec"]["name"], "cp-1");
    assert_eq!(create.body["spec"]["iscontrolplane"], true);
    assert_eq!(create.body["spec"]["componentsreference"], reference);
    assert_eq!(create.body["spec"]["deadline"], "2026-03-02T10:10:00Z");

    // cp-2 holds the record: cp-1 must wait (retryable).
    server.on(
        "POST",
        JOINING_NODES,
        [Reply::recorded(
            409,
            "status-409-joiningnode-already-exists.json",
        )],
    );
    server.on(
        "GET",
        &format!("{JOINING_NODES}/control-plane"),
        [Reply::recorded(200, "joiningnode-control-plane-cp-2.json")],
    );
    let err = api.add_joining_node(&cp1).await.unwrap_err();
    assert!(
        matches!(&err, ApiError::ControlPlaneJoinInProgress { joining } if joining == "cp-2"),
        "{err:?}"
    );
    assert!(err.is_retryable());

    // cp-1's own record (a retry after a failed join) is fine.
    server.on(
        "GET",
        &format!("{JOINING_NODES}/control-plane"),
        [Reply::recorded(
            200,
            "joiningnode-control-plane-created.json",
        )],
    );
    api.add_joining_node(&cp1).await.unwrap();
}

#[tokio::test]
async fn a_worker_joining_node_is_applied_server_side() {
    let (server, api, _dir) = setup().await;
    let path = format!("{JOINING_NODES}/worker-0");
    server.on(
        "PATCH",
        &path,
        [Reply::recorded(200, "joiningnode-worker-0-applied.json")],
    );
    let w = JoiningNode::new("worker-0", "k8s-components-sha256-aa", false, t0());
    api.add_joining_node(&w).await.unwrap();
    let writes = server.writes();
    assert_eq!(writes.len(), 1, "{writes:?}");
    let apply = &writes[0];
    assert_eq!(
        (apply.method.as_str(), apply.path.as_str()),
        ("PATCH", path.as_str())
    );
    assert_eq!(apply.content_type, "application/apply-patch+yaml");
    assert_eq!(
        apply.query_param("fieldManager").as_deref(),
        Some("join-service")
    );
    assert_eq!(apply.query_param("force").as_deref(), Some("true"));
    assert_eq!(apply.body["metadata"]["name"], "worker-0");
    assert_eq!(apply.body["spec"]["iscontrolplane"], false);
    assert_eq!(apply.body["spec"]["deadline"], "2026-03-04T10:00:00Z");
}

#[tokio::test]
async fn a_missing_joining_node_crd_is_reported_as_not_installed() {
    let (server, api, _dir) = setup().await;
    server.on(
        "PATCH",
        &format!("{JOINING_NODES}/worker-0"),
        [Reply::recorded(404, "status-404-resource-not-found.json")],
    );
    server.on(
        "POST",
        JOINING_NODES,
        [Reply::recorded(404, "status-404-resource-not-found.json")],
    );
    for cp in [false, true] {
        let err = api
            .add_joining_node(&JoiningNode::new("worker-0", "x", cp, t0()))
            .await
            .unwrap_err();
        assert!(matches!(err, ApiError::NotInstalled { .. }), "{err:?}");
    }
}

#[tokio::test]
async fn the_components_reference_comes_from_the_node_version() {
    let (server, api, _dir) = setup().await;
    let path = "/apis/update.edgeless.systems/v1alpha1/nodeversions/constellation-version";
    server.on(
        "GET",
        path,
        [
            Reply::recorded(200, "nodeversion-constellation-version.json"),
            Reply::recorded(404, "status-404-nodeversion.json"),
        ],
    );
    assert_eq!(
        api.components_reference().await.unwrap(),
        "k8s-components-sha256-6f0f1f3b7a0d4d4e4c5b8a9e2d1c0b9a8f7e6d5c4b3a29181716151413121110"
    );
    let err = api.components_reference().await.unwrap_err();
    assert!(matches!(err, ApiError::NotFound { .. }), "{err:?}");
}

// --- Members ----------------------------------------------------------------------------------

#[tokio::test]
async fn a_member_is_updated_with_its_resource_version_and_retried_after_a_lost_race() {
    let (server, api, _dir) = setup().await;
    lose_one_race(
        &server,
        &format!("{CONFIG_MAPS}/asterism-member-worker-0"),
        "configmap-member-worker-0.json",
        "status-409-configmap-member-conflict.json",
        "configmap-member-updated.json",
    );
    let ak = "4d2a9f0e1b3c5d7e9f1a2b4c6d8e0f1a3b5c7d9e1f2a4b6c8d0e2f4a6b8c0d2e";
    let record = api
        .record_member("worker-0", "Worker", ak, DISK, t0())
        .await
        .unwrap();
    assert_eq!(record.tickets, 2);
    assert_eq!(record.admitted_at, t0() - Duration::from_secs(9 * 60 + 48));
    assert_eq!(record.last_ticket_at, t0());
    let writes = server.writes();
    assert_eq!(writes.len(), 2, "{writes:?}");
    for put in &writes {
        assert_eq!(put.body["metadata"]["resourceVersion"], "1932");
        assert_eq!(put.body["data"]["tickets"], "2");
        assert_eq!(put.body["data"]["lastTicketAt"], "2026-03-02T10:00:00Z");
        assert_eq!(put.body["data"]["admittedAt"], "2026-03-02T09:50:12Z");
        assert_eq!(put.body["data"]["disk"], DISK);
    }
}

#[tokio::test]
async fn a_new_member_is_created_and_members_are_listed_by_label() {
    let (server, api, _dir) = setup().await;
    server.on(
        "GET",
        &format!("{CONFIG_MAPS}/asterism-member-worker-0"),
        [Reply::recorded(404, "status-404-configmap-member.json")],
    );
    server.on(
        "POST",
        CONFIG_MAPS,
        [Reply::recorded(201, "configmap-member-created.json")],
    );
    server.on(
        "GET",
        CONFIG_MAPS,
        [Reply::recorded(200, "configmap-member-list.json")],
    );
    let record = api
        .record_member("worker-0", "Worker", AK, DISK, t0())
        .await
        .unwrap();
    assert_eq!((record.tickets, record.admitted_at), (1, t0()));
    assert_eq!(record.disk, DISK);
    let create = &server.writes()[0];
    assert_eq!(create.body["metadata"]["name"], "asterism-member-worker-0");
    assert_eq!(
        create.body["metadata"]["labels"]["asterism.dev/record"],
        "member"
    );
    assert_eq!(create.body["data"]["ak"], AK);
    assert_eq!(create.body["data"]["disk"], DISK);

    let members = api.members().await.unwrap();
    let names: Vec<_> = members.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["cp-0", "worker-0"]);
    assert_eq!(members[1].tickets, 2);
    // A record written before members carried their disk reads as none.
    assert_eq!(members[0].disk, "0e4b7c2a-91d3-4f6e-8a25-3c7d9e1b5f08");
    assert_eq!(members[1].disk, "");
    let list = server.requests().last().unwrap().clone();
    assert_eq!(
        list.query_param("labelSelector").as_deref(),
        Some("asterism.dev/managed-by=join-service,asterism.dev/record=member")
    );
    let err = api
        .record_member("Not A Name", "Worker", AK, DISK, t0())
        .await
        .unwrap_err();
    assert!(matches!(err, ApiError::InvalidInput { .. }), "{err:?}");
}

/// What names an object (an AK fingerprint, a disk UUID) is checked before any request:
/// only its one canonical spelling can reach an object name.
#[tokio::test]
async fn fingerprints_and_disk_uuids_that_cannot_name_an_object_are_refused_before_any_request() {
    let (server, api, _dir) = setup().await;
    let invalid = |err: &ApiError, input: &str| matches!(err, ApiError::InvalidInput { what, .. } if *what == input);
    let bad_aks = [
        AK[..63].to_owned(),
        format!("{AK}0"),
        AK.to_uppercase(),
        format!("{}g", &AK[..63]),
        format!("../{}", &AK[..61]),
    ];
    for ak in &bad_aks {
        let err = api.key_claim(ak).await.unwrap_err();
        assert!(
            invalid(&err, "attestation key fingerprint"),
            "{ak}: {err:?}"
        );
    }
    let bad_disks = [
        DISK[..35].to_owned(),
        format!("{DISK}0"),
        DISK.to_uppercase(),
        DISK.replace('-', "_"),
        DISK.replace('a', "g"),
    ];
    for disk in &bad_disks {
        let err = api.disk_binding(disk).await.unwrap_err();
        assert!(invalid(&err, "disk UUID"), "{disk}: {err:?}");
    }
    assert!(server.requests().is_empty());
}

// --- Error mapping ----------------------------------------------------------------------------

#[tokio::test]
async fn api_failures_become_typed_errors() {
    let (server, api, _dir) = setup().await;
    type Case = (&'static str, u16, fn(&ApiError) -> bool, bool);
    let cases: [Case; 5] = [
        (
            "status-403-secrets-forbidden.json",
            403,
            |e| matches!(e, ApiError::Forbidden { message, .. } if message.contains("cannot list resource \"secrets\"")),
            false,
        ),
        (
            "status-500-internal-error.json",
            500,
            |e| matches!(e, ApiError::Server { code: 500, reason, .. } if reason == "InternalError"),
            true,
        ),
        (
            "status-429-too-many-requests.json",
            429,
            |e| matches!(e, ApiError::Server { code: 429, .. }),
            true,
        ),
        (
            "status-401-unauthorized.json",
            401,
            |e| matches!(e, ApiError::Unauthorized { .. }),
            false,
        ),
        (
            "status-422-secret-invalid.json",
            422,
            |e| matches!(e, ApiError::Rejected { code: 422, reason, .. } if reason == "Invalid"),
            false,
        ),
    ];
    for (file, code, is, retryable) in cases {
        server.on("GET", SECRETS, [Reply::recorded(code, file)]);
        let err = api
            .bootstrap_token(t0(), TokenPolicy::default())
            .await
            .unwrap_err();
        assert!(is(&err), "{file}: {err:?}");
        assert_eq!(err.is_retryable(), retryable, "{file}: {err:?}");
        assert!(
            err.to_string().contains("list bootstrap token Secrets"),
            "{err}"
        );
    }
    // A body that is no Status (a proxy's page) still maps by code.
    server.on(
        "GET",
        SECRETS,
        [Reply::json(502, "<html>bad gateway</html>")],
    );
    let err = api
        .bootstrap_token(t0(), TokenPolicy::default())
        .await
        .unwrap_err();
    assert!(matches!(err, ApiError::Server { code: 502, .. }), "{err:?}");
    assert!(server.writes().is_empty());
}

#[tokio::test]
async fn the_recorded_responses_are_json() {
    for entry in std::fs::read_dir(asterism_testkit::kube_api::recorded_dir()).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&recorded(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            v["kind"].is_string() && v["apiVersion"].is_string(),
            "{name}"
        );
    }
}

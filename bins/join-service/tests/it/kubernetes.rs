//! The join service with its cluster state on the Kubernetes API (`KubeState`), against the
//! recording API server of asterism-testkit: HTTPS with a test CA and an admin
//! kubeconfig, answers recorded from a real API server, every request recorded. The rest is
//! real as in tests/join.rs: aTLS and gRPC on loopback, the key service, the metadata
//! service, swtpm or pinned software AKs.

use std::time::{Duration, SystemTime};

use crate::common::*;
use asterism_join_service::{JoiningNodes, KubeState};
use asterism_testkit::TpmNode;
use asterism_testkit::kube_api::paths::{CONFIG_MAPS, JOINING_NODES, NODE_VERSION, SECRETS};
use asterism_testkit::kube_api::{RecordingServer, Reply};
use asterism_testkit::process::Process;
use tonic::Code;

fn disk_path(disk: &str) -> String {
    format!("{CONFIG_MAPS}/asterism-disk-{disk}")
}

/// A cluster where nothing is stored yet: no disk binding, no member, no token.
fn empty_cluster(server: &RecordingServer) {
    server
        .route_first_admission("worker-0", DISK_A)
        .on(
            "GET",
            "/api/v1/namespaces",
            [Reply::recorded(200, "namespace-list.json")],
        )
        .on(
            "GET",
            CONFIG_MAPS,
            [Reply::recorded(200, "configmap-member-list.json")],
        )
        .on(
            "GET",
            NODE_VERSION,
            [Reply::recorded(
                200,
                "nodeversion-constellation-version.json",
            )],
        )
        .on(
            "PATCH",
            &format!("{JOINING_NODES}/worker-0"),
            [Reply::recorded(200, "joiningnode-worker-0-applied.json")],
        )
        .on(
            "GET",
            SECRETS,
            [Reply::recorded(200, "secret-list-empty.json")],
        )
        .on(
            "POST",
            SECRETS,
            [Reply::recorded(201, "secret-bootstrap-token-created.json")],
        );
}

async fn kube_state(server: &RecordingServer, dir: &std::path::Path) -> KubeState {
    KubeState::new(server.api(dir).await, JoiningNodes::Required)
}

fn parse_rfc3339(s: &str) -> SystemTime {
    // Only the `YYYY-MM-DDTHH:MM:SSZ` form the join service writes.
    let n = |r: std::ops::Range<usize>| s[r].parse::<i64>().unwrap();
    assert_eq!((s.len(), &s[19..]), (20, "Z"), "{s}");
    let (y, m, d) = (n(0..4), n(5..7), n(8..10));
    // Days from civil (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + n(11..13) * 3600 + n(14..16) * 60 + n(17..19);
    SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swtpm_node_gets_a_ticket_whose_token_is_a_bootstrap_token_stored_in_the_cluster() {
    let TpmNode {
        issuer,
        fingerprint: fp,
        swtpm: _swtpm,
    } = TpmNode::start().unwrap();
    let cluster = Cluster::start().await;
    let server = RecordingServer::start().await;
    empty_cluster(&server);
    let state = kube_state(&server, cluster.dir.path()).await;
    let js = start_join_service_with(&cluster, Options::pinning(vec![fp]), state).await;

    let before = SystemTime::now();
    let t = join_worker_0(js.addr, issuer).await.unwrap();
    let after = SystemTime::now();

    // The token has the kubeadm format and is the one stored as a bootstrap token Secret.
    let (id, secret) = t.token.split_once('.').unwrap();
    let token_char = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    assert!(id.len() == 6 && id.bytes().all(token_char), "{id}");
    assert!(secret.len() == 16 && secret.bytes().all(token_char));
    let writes = server.writes();
    let what: Vec<_> = writes
        .iter()
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert_eq!(
        what,
        [
            format!("POST {CONFIG_MAPS}"),
            format!("POST {CONFIG_MAPS}"),
            format!("PATCH {JOINING_NODES}/worker-0"),
            format!("POST {SECRETS}"),
            format!("POST {CONFIG_MAPS}"),
        ],
        "claim the key, bind the disk, the JoiningNode, one token, the member"
    );
    let claim = &writes[0].body;
    assert_eq!(
        claim["metadata"]["name"],
        format!("asterism-ak-{fp}"),
        "the key's claim names the key"
    );
    assert_eq!(
        (
            &claim["data"]["member"],
            &claim["data"]["disk"],
            claim["immutable"].as_bool()
        ),
        (
            &serde_json::json!("worker-0"),
            &serde_json::json!(DISK_A),
            Some(true)
        ),
        "the claim names the node and the disk of its first admission"
    );
    assert_eq!(
        (
            &claim["metadata"]["namespace"],
            &claim["metadata"]["labels"]["asterism.dev/record"],
            &claim["metadata"]["labels"]["asterism.dev/managed-by"],
        ),
        (
            &serde_json::json!("kube-system"),
            &serde_json::json!("key-claim"),
            &serde_json::json!("join-service"),
        ),
        "the claim is the join service's record in kube-system"
    );
    let binding = &writes[1].body;
    assert_eq!(
        binding["metadata"]["name"],
        format!("asterism-disk-{DISK_A}")
    );
    assert_eq!(binding["data"]["ak"], fp.to_string());
    let secret_write = &writes[3];
    assert_eq!(secret_write.body["type"], "bootstrap.kubernetes.io/token");
    assert_eq!(
        secret_write.body["metadata"]["name"],
        format!("bootstrap-token-{id}")
    );
    assert_eq!(secret_write.secret_data("token-id").unwrap(), id);
    assert_eq!(secret_write.secret_data("token-secret").unwrap(), secret);
    assert_eq!(
        secret_write
            .secret_data("usage-bootstrap-authentication")
            .unwrap(),
        "true"
    );
    assert_eq!(
        secret_write.secret_data("auth-extra-groups").unwrap(),
        "system:bootstrappers:kubeadm:default-node-token"
    );
    // Valid for 15 minutes from the join (whole seconds).
    let expires = parse_rfc3339(&secret_write.secret_data("expiration").unwrap());
    let fifteen = Duration::from_secs(15 * 60);
    assert!(
        expires + Duration::from_secs(1) >= before + fifteen,
        "{expires:?}"
    );
    assert!(expires <= after + fifteen, "{expires:?}");
    let joining = &writes[2];
    assert_eq!(
        joining.query_param("fieldManager").as_deref(),
        Some("join-service")
    );
    assert_eq!(joining.body["spec"]["name"], "worker-0");
    assert_eq!(
        joining.body["spec"]["componentsreference"],
        "k8s-components-sha256-6f0f1f3b7a0d4d4e4c5b8a9e2d1c0b9a8f7e6d5c4b3a29181716151413121110"
    );
    let member = &writes[4].body;
    assert_eq!(member["metadata"]["name"], "asterism-member-worker-0");
    assert_eq!(member["data"]["role"], "Worker");
    assert_eq!(
        member["data"]["disk"], DISK_A,
        "the member records its disk"
    );

    // /v1/members lists what the API holds.
    let members: serde_json::Value =
        serde_json::from_str(&js.admin_get("/v1/members").await).unwrap();
    let names: Vec<_> = members
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["cp-0", "worker-0"]);
    // The signed control-plane list names the control-plane member with the disk its
    // record carries (the owner's workspace pins exactly that disk for its AK).
    let envelope: serde_json::Value =
        serde_json::from_str(&js.admin_get("/v1/control-plane").await).unwrap();
    let payload = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD,
        envelope["payload"].as_str().unwrap(),
    )
    .unwrap();
    let list: serde_json::Value = serde_json::from_slice(&payload).unwrap();
    assert_eq!(
        list["members"],
        serde_json::json!([{
            "name": "cp-0",
            "ak": "77aa0c3e5f7a9c1e3b5d7f9a1c3e5b7d9f1a3c5e7b9d1f3a5c7e9b1d3f5a7c9e",
            "disk": "0e4b7c2a-91d3-4f6e-8a25-3c7d9e1b5f08"
        }]),
        "{list}"
    );
    js.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_node_creates_nothing_in_the_cluster() {
    let (node, fp) = soft_node();
    let cluster = Cluster::start().await;
    let server = RecordingServer::start().await;
    empty_cluster(&server);
    // The disk is bound to another AK.
    server.on(
        "GET",
        &disk_path(DISK_A),
        [Reply::recorded(200, "configmap-disk-binding-other-ak.json")],
    );
    let state = kube_state(&server, cluster.dir.path()).await;
    let js = start_join_service_with(&cluster, Options::pinning(vec![fp]), state).await;

    let err = join_worker_0(js.addr, node.clone()).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("another attestation key"), "{err:?}");
    let requests = server.requests();
    assert_eq!(requests.len(), 1, "only the binding was read: {requests:?}");
    assert!(server.writes().is_empty());

    // A worker claiming to be a control-plane node is refused before the cluster is asked.
    server.clear_requests();
    let err = join(
        js.addr,
        W0,
        node,
        join_request("worker-0", W0, DISK_B, true),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(server.requests().is_empty(), "{:?}", server.requests());
    js.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_node_waits_while_another_one_joins_and_gets_no_token() {
    let (cp, fp) = soft_node();
    let cluster = Cluster::start().await;
    let server = RecordingServer::start().await;
    empty_cluster(&server);
    server
        .on(
            "POST",
            JOINING_NODES,
            [Reply::recorded(
                409,
                "status-409-joiningnode-already-exists.json",
            )],
        )
        .on(
            "GET",
            &format!("{JOINING_NODES}/control-plane"),
            [Reply::recorded(200, "joiningnode-control-plane-cp-2.json")],
        );
    let state = kube_state(&server, cluster.dir.path()).await;
    let js = start_join_service_with(&cluster, Options::pinning(vec![fp]), state).await;
    let err = join(js.addr, CP, cp, join_request("cp-0", CP, DISK_A, true))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    let writes: Vec<_> = server
        .writes()
        .iter()
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert_eq!(
        writes,
        [
            format!("POST {CONFIG_MAPS}"),
            format!("POST {CONFIG_MAPS}"),
            format!("POST {JOINING_NODES}")
        ],
        "the key's claim, the disk binding and the refused JoiningNode; no token, no member"
    );
    let metrics = js.http_get("/metrics").await;
    assert!(
        metrics.contains(
            "asterism_join_rejections_total{kind=\"join\",reason=\"cluster_state_unavailable\"} 1"
        ),
        "{metrics}"
    );
    js.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_failure_is_unavailable_and_forbidden_is_internal() {
    let (node, fp) = soft_node();
    let cluster = Cluster::start().await;
    let server = RecordingServer::start().await;
    empty_cluster(&server);
    server.on(
        "GET",
        &disk_path(DISK_A),
        [Reply::recorded(500, "status-500-internal-error.json")],
    );
    let state = kube_state(&server, cluster.dir.path()).await;
    let js = start_join_service_with(&cluster, Options::pinning(vec![fp]), state).await;
    let err = join_worker_0(js.addr, node.clone()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");

    // Missing RBAC is the operator's to fix, not the node's to retry: INTERNAL, no detail.
    server
        .on(
            "GET",
            &disk_path(DISK_A),
            [Reply::recorded(404, "status-404-configmap-disk.json")],
        )
        .on(
            "GET",
            SECRETS,
            [Reply::recorded(403, "status-403-secrets-forbidden.json")],
        );
    let err = join_worker_0(js.addr, node).await.unwrap_err();
    assert_eq!(err.code(), Code::Internal, "{err:?}");
    assert_eq!(err.message(), "issuing the ticket failed");
    assert!(
        !server
            .writes()
            .iter()
            .any(|r| r.path == SECRETS || r.path.contains("asterism-member")),
        "no token, no member"
    );
    js.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_keeps_its_state_on_the_kubernetes_api_with_cluster_state_kubernetes() {
    let (node, fp) = soft_node();
    let cluster = Cluster::start().await;
    let server = RecordingServer::start().await;
    empty_cluster(&server);
    // The NodeVersion names the recorded components ConfigMap (one kubelet of v1.33.4).
    let components =
        "k8s-components-sha256-5d4cc820b37f3d1fd0c6e04ed50a56ead8d497ecfd3c25c749855ed9d852837d";
    let mut nv: serde_json::Value = serde_json::from_str(&asterism_testkit::kube_api::recorded(
        "nodeversion-constellation-version.json",
    ))
    .unwrap();
    nv["spec"]["kubernetesComponentsReference"] = components.into();
    server
        .on("GET", NODE_VERSION, [Reply::json(200, nv.to_string())])
        .on(
            "GET",
            &format!("{CONFIG_MAPS}/{components}"),
            [Reply::recorded(200, "configmap-components-created.json")],
        );
    let dir = cluster.dir.path();
    server.write_kubeconfig(&dir.join("admin.conf"));
    let (mut command, listen) = join_service_command(&cluster, &fp);
    command
        .args(["--cluster-state", "kubernetes", "--kubeconfig"])
        .arg(dir.join("admin.conf"));
    let child = Process::spawn(&mut command);

    let ticket = first_ticket(listen.parse().unwrap(), node.clone()).await;
    let (exit, logs) = stop(child).await;
    assert!(exit.success(), "{exit:?}\n{logs}");

    assert!(
        server.requests()[0].path == "/api/v1/namespaces",
        "it waits for the API server first"
    );
    let token_write = server
        .writes()
        .into_iter()
        .find(|r| r.path == SECRETS)
        .unwrap();
    let (id, secret) = ticket.token.split_once('.').unwrap();
    assert_eq!(token_write.secret_data("token-id").unwrap(), id);
    assert_eq!(token_write.secret_data("token-secret").unwrap(), secret);
    assert!(logs.contains("Kubernetes API"), "{logs}");
    assert!(!logs.contains(secret), "the token is never logged");
    // The ticket carries the components ConfigMap's version and list.
    assert_eq!(ticket.kubernetes_version, "v1.33.4");
    let paths: Vec<&str> = ticket
        .kubernetes_components
        .iter()
        .map(|c| c.install_path.as_str())
        .collect();
    assert_eq!(paths, ["/run/state/bin/kubelet"]);
    assert_eq!(
        ticket.kubernetes_components[0].hash,
        format!("sha256:{}", "1".repeat(64))
    );
}

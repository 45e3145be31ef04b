//! `asterism init`'s bring-up against the recording Kubernetes API server: the objects are
//! created, the join service is waited for, and neither the progress output nor any log
//! line (every target, every level) holds the master secret or the salt.

use asterism::bring_up::{self, Plan};
use asterism_kube_api::{DeploymentSpec, Images, JoinServiceTrust, KeyServiceSecret};
use asterism_testkit::kube_api::{RecordingServer, Reply};
// Every record of every crate at every level, until the guard is dropped. The tests run
// on one thread (current-thread runtime), so the subscriber sees every record.
use asterism_testkit::logs::capture_from_now as capture_logs;
use base64::Engine as _;

const MASTER_SECRET: &[u8; 32] = b"master-secret-never-printed-0001";
const SALT: &[u8; 32] = b"salt-value-never-in-any-output!!";

fn plan() -> Plan {
    Plan::new(DeploymentSpec {
        images: Images::from_repository("registry.example", "v0.1.0"),
        attestation_config: r#"{"measurements":{}}"#.into(),
        measurement_salt: [7; 32],
        trust: JoinServiceTrust {
            args: vec!["--pinned-ak=00".into()],
            files: Default::default(),
        },
        metadata_url: Some("http://10.0.0.254:8080".into()),
    })
    .unwrap()
}

fn ready_daemon_set() -> Reply {
    Reply::json(
        200,
        serde_json::json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "join-service", "namespace": "kube-system", "generation": 1},
            "spec": {"selector": {}, "template": {}},
            "status": {"observedGeneration": 1, "desiredNumberScheduled": 1,
                       "currentNumberScheduled": 1, "updatedNumberScheduled": 1,
                       "numberReady": 1, "numberMisscheduled": 0}
        })
        .to_string(),
    )
}

#[tokio::test]
async fn the_bring_up_never_prints_or_logs_the_master_secret_or_the_salt() {
    let (logs, _guard) = capture_logs();

    let server = RecordingServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("admin.conf");
    server.write_kubeconfig(&kubeconfig);
    server.on(
        "GET",
        "/api/v1/namespaces",
        [Reply::recorded(200, "namespace-list.json")],
    );
    server.route_new_join_config();
    let plan = plan();
    for object in plan.deployment.objects() {
        server.echo("PATCH", &object.api_path());
    }
    server.on(
        "GET",
        "/apis/apps/v1/namespaces/kube-system/daemonsets/join-service",
        [ready_daemon_set()],
    );

    let mut args = bring_up::Args::skipped("");
    args.skip_reason = None;
    args.skip_bring_up = false;
    args.bring_up_timeout_secs = 30;
    let secret = KeyServiceSecret::new(MASTER_SECRET, SALT).unwrap();
    let mut out = Vec::new();
    bring_up::run(&args, &kubeconfig, &plan, &secret, &mut out)
        .await
        .unwrap();

    let out = String::from_utf8(out).unwrap();
    let logs = logs.text();
    assert!(
        out.contains("applied Secret kube-system/asterism-mastersecret"),
        "{out}"
    );
    assert!(
        out.contains("the join service is ready on 1 control-plane node(s)"),
        "{out}"
    );
    assert!(logs.contains("applied"), "the logs were captured: {logs}");

    // The values did reach the API server…
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let sent = server
        .writes()
        .into_iter()
        .find(|w| w.path.ends_with("/secrets/asterism-mastersecret"))
        .unwrap();
    assert_eq!(sent.body["data"]["mastersecret"], b64(MASTER_SECRET));
    // …and appear in no output and no log line, in any encoding.
    for value in [&MASTER_SECRET[..], &SALT[..]] {
        for encoded in [
            String::from_utf8(value.to_vec()).unwrap(),
            b64(value),
            hex::encode(value),
            format!("{value:?}"),
        ] {
            assert!(!out.contains(&encoded), "the output holds {encoded}");
            assert!(!logs.contains(&encoded), "the logs hold {encoded}");
        }
    }
}

/// kube-rs logs (at warn) an answer it cannot parse as the type asked for. The Secret's
/// answer echoes its values, so it is never parsed: an odd answer stays out of the logs.
#[tokio::test]
async fn an_unparsable_answer_to_the_secret_is_not_logged() {
    let (logs, _guard) = capture_logs();

    let server = RecordingServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let api = server.api(dir.path()).await;
    let b64 = base64::engine::general_purpose::STANDARD.encode(MASTER_SECRET);
    server.on(
        "PATCH",
        "/api/v1/namespaces/kube-system/secrets/asterism-mastersecret",
        [Reply::json(
            200,
            format!(r#"{{"apiVersion":"v1","kind":"Secret","metadata":5,"data":{{"mastersecret":"{b64}"}}}}"#),
        )],
    );
    let secret = KeyServiceSecret::new(MASTER_SECRET, SALT).unwrap();
    let applied = api.apply_key_service_secret(&secret).await;
    let logs = logs.text();
    assert!(
        !logs.contains(&b64),
        "the logs hold the master secret: {logs}"
    );
    applied.unwrap();
    assert!(logs.contains("applied the key service's Secret"), "{logs}");
}

//! The InitServer end to end: a real swtpm, a real LUKS2 image, real aTLS on loopback, real
//! bcrypt, driven by a test client that verifies the node's TPM quote before it sends
//! anything secret.

use std::os::unix::fs::PermissionsExt as _;
use std::sync::Arc;
use std::time::Duration;

use crate::common::init_helpers::*;
use crate::common::*;
use asterism_bootstrapper::{NodeState, Outcome, Role};
use asterism_kms::KeyId;
use asterism_proto::init::init_response;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn init_happy_path_rekeys_the_disk_marks_pcr15_and_returns_kubeconfig_and_cluster_id() {
    let t = TestNode::new("127.0.11.1");
    let node = t.node(metadata(&t), TestNode::none_driver(), 1, None);
    let started = std::time::Instant::now();
    let run = tokio::spawn(t.run(node, std::future::pending()));

    let channel = t.init_channel().await;
    let responses = init(channel, request(INIT_SECRET)).await.unwrap();
    let outcome = run.await.unwrap().unwrap();
    eprintln!(
        "init: bootstrapper start to initialised in {:?}",
        started.elapsed()
    );

    let success = match responses.first().and_then(|r| r.kind.clone()) {
        Some(init_response::Kind::InitSuccess(s)) => s,
        other => panic!("expected success, got {other:?} ({responses:?})"),
    };
    assert_eq!(responses.len(), 1);
    let expected = expected_cluster_id();
    assert_eq!(success.cluster_id, expected);
    assert_eq!(outcome, Outcome::Initialized(expected.into()));
    let kubeconfig = String::from_utf8(success.kubeconfig).unwrap();
    assert!(kubeconfig.contains("kind: Config"), "{kubeconfig}");
    assert!(
        kubeconfig.contains(&format!("https://{}:6443", t.ip)),
        "{kubeconfig}"
    );

    // PCR 15 = SHA-256(0^32 || SHA-256(cluster ID)).
    assert_eq!(
        t.pcr15(),
        asterism_tpm::marker::expected_marker_pcr(&expected)
    );

    // The disk opens with the independently derived key, not with the first-boot key.
    let uuid = luks_uuid(&t.image());
    assert_eq!(uuid, uuid.to_lowercase());
    let disk_key = kms().data_key(&KeyId::disk(&uuid).unwrap(), 32).unwrap();
    assert!(opens(&t.image(), disk_key.expose_secret()));
    assert!(!t.node_dir.initial_key().exists());
    assert!(token0(&t.image()).contains("\"diskIsInitialized\":true"));

    // Node state, byte for byte.
    let state = std::fs::read_to_string(t.node_dir.node_state()).unwrap();
    assert_eq!(
        state,
        NodeState {
            role: Role::ControlPlane,
            measurement_salt: MEASUREMENT_SALT
        }
        .to_json()
    );
    // SSH files and the cluster CA.
    assert!(
        std::fs::read_to_string(t.node_dir.ssh_ca_pub())
            .unwrap()
            .starts_with("ssh-ed25519 ")
    );
    assert!(
        std::fs::read_to_string(t.node_dir.ssh_host_cert())
            .unwrap()
            .starts_with("ssh-ed25519-cert-v01@openssh.com ")
    );
    assert!(t.node_dir.kubernetes_pki().join("ca.crt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wrong_init_secret_is_refused_without_logs_and_a_corrected_init_then_works() {
    let t = TestNode::new("127.0.11.2");
    let node = t.node(metadata(&t), TestNode::none_driver(), 1, None);
    let run = tokio::spawn(t.run(node, std::future::pending()));

    let channel = t.init_channel().await;
    let refused = init(channel.clone(), request(b"wrong secret"))
        .await
        .unwrap();
    assert_eq!(failure_of(&refused).as_deref(), Some("invalid init secret"));
    assert!(logs_of(&refused).is_empty(), "no logs for a wrong secret");
    assert_eq!(refused.len(), 1);
    assert_eq!(t.pcr15(), [0; 32], "nothing happened");

    // The server is still up: the corrected Init works.
    let responses = init(t.init_channel().await, request(INIT_SECRET))
        .await
        .unwrap();
    assert_succeeded(&responses);
    assert!(matches!(run.await.unwrap(), Ok(Outcome::Initialized(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_init_after_the_lock_fails_with_failed_precondition() {
    let t = TestNode::new("127.0.11.3");
    let driver = Arc::new(GateDriver {
        gate: tokio::sync::Semaphore::new(0),
        fail: false,
    });
    let node = t.node(metadata(&t), driver.clone(), 1, None);
    let run = tokio::spawn(t.run(node, std::future::pending()));

    let channel = t.init_channel().await;
    let first = tokio::spawn(init(channel.clone(), request(INIT_SECRET)));
    // Wait until the first Init holds the lock (PCR 15 marked).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while t.pcr15() == [0; 32] {
        assert!(
            std::time::Instant::now() < deadline,
            "the first Init never took the lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let second = init(channel, request(INIT_SECRET)).await.unwrap_err();
    assert_eq!(second.code(), tonic::Code::FailedPrecondition);
    assert_eq!(second.message(), "node is already being activated");

    driver.gate.add_permits(1);
    let first = first.await.unwrap().unwrap();
    assert_succeeded(&first);
    assert!(matches!(run.await.unwrap(), Ok(Outcome::Initialized(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_already_bootstrapped_node_does_not_bootstrap_again() {
    let t = TestNode::new("127.0.11.5");
    // First run: initialise.
    let node = t.node(metadata(&t), TestNode::none_driver(), 1, None);
    let run = tokio::spawn(t.run(node, std::future::pending()));
    let responses = init(t.init_channel().await, request(INIT_SECRET))
        .await
        .unwrap();
    assert!(failure_of(&responses).is_none(), "{responses:?}");
    run.await.unwrap().unwrap();
    let pcr = t.pcr15();
    let state = std::fs::read(t.node_dir.node_state()).unwrap();

    // Second run, same boot (PCR 15 still marked): nothing happens, no server.
    let node = t.node(metadata(&t), TestNode::none_driver(), 1, None);
    let outcome =
        tokio::time::timeout(Duration::from_secs(60), t.run(node, std::future::pending()))
            .await
            .unwrap()
            .unwrap();
    assert_eq!(outcome, Outcome::AlreadyBootstrapped);
    assert_eq!(t.pcr15(), pcr, "not marked twice");
    assert_eq!(std::fs::read(t.node_dir.node_state()).unwrap(), state);
    assert!(
        std::net::TcpStream::connect((t.ip, t.init_port())).is_err(),
        "no InitServer"
    );
}

/// A driver that keeps the components it was given.
struct ComponentsDriver(std::sync::Mutex<Vec<asterism_components::Component>>);

impl asterism_bootstrapper::KubernetesDriver for ComponentsDriver {
    fn name(&self) -> &'static str {
        "components"
    }

    fn init<'a>(
        &'a self,
        params: &'a asterism_bootstrapper::ClusterInit,
    ) -> futures::future::BoxFuture<
        'a,
        Result<zeroize::Zeroizing<Vec<u8>>, asterism_bootstrapper::DriverError>,
    > {
        *self.0.lock().unwrap() = params.components.as_slice().to_vec();
        Box::pin(async {
            Ok(zeroize::Zeroizing::new(
                b"apiVersion: v1\nkind: Config\n".to_vec(),
            ))
        })
    }

    fn join(
        &self,
        _params: asterism_bootstrapper::ClusterJoin,
    ) -> futures::future::BoxFuture<'_, Result<(), asterism_bootstrapper::DriverError>> {
        Box::pin(async { Ok(()) })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bad_component_hash_or_version_is_refused_before_the_lock_and_good_components_reach_the_driver()
 {
    use asterism_proto::components::Component;
    let t = TestNode::new("127.0.11.6");
    let driver = Arc::new(ComponentsDriver(std::sync::Mutex::new(Vec::new())));
    let node = t.node(metadata(&t), driver.clone(), 1, None);
    let run = tokio::spawn(t.run(node, std::future::pending()));

    let good = Component {
        url: "https://example.com/kubelet".into(),
        hash: format!("sha256:{}", "ab".repeat(32)),
        install_path: "/run/state/bin/kubelet".into(),
        extract: false,
    };
    let mut bad_request = request(INIT_SECRET);
    bad_request.kubernetes_components = vec![
        good.clone(),
        Component {
            hash: "sha256:ABC".into(),
            ..good.clone()
        },
    ];
    let refused = init(t.init_channel().await, bad_request).await.unwrap();
    let failure = failure_of(&refused).unwrap();
    assert!(
        failure.starts_with("invalid init request: Kubernetes components"),
        "{failure}"
    );
    assert_eq!(t.pcr15(), [0; 32], "refused before the node lock");
    assert!(driver.0.lock().unwrap().is_empty());

    // A version that is not a patch version is refused the same way, before the lock.
    for version in ["v1.31", "1.31.13", "latest", ""] {
        let mut request = request(INIT_SECRET);
        request.kubernetes_version = version.into();
        let refused = init(t.init_channel().await, request).await.unwrap();
        let failure = failure_of(&refused).unwrap();
        assert!(
            failure.starts_with("invalid init request: Kubernetes version"),
            "{version:?}: {failure}"
        );
    }
    assert_eq!(t.pcr15(), [0; 32], "refused before the node lock");
    assert!(driver.0.lock().unwrap().is_empty());

    // The server is still up; the components of a good request reach the driver as sent.
    let mut good_request = request(INIT_SECRET);
    good_request.kubernetes_components = vec![good.clone()];
    let responses = init(t.init_channel().await, good_request).await.unwrap();
    assert_succeeded(&responses);
    assert!(matches!(run.await.unwrap(), Ok(Outcome::Initialized(_))));
    let got = driver.0.lock().unwrap().clone();
    assert_eq!(got.len(), 1);
    assert_eq!(
        (
            got[0].url.as_str(),
            got[0].hash.as_str(),
            got[0].install_path.as_str(),
            got[0].extract
        ),
        (
            good.url.as_str(),
            good.hash.as_str(),
            good.install_path.as_str(),
            false
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_init_node_record_holds_the_requested_version_and_components_for_the_join_service() {
    let t = TestNode::new("127.0.11.7");
    let ak = "5e1b3d5f7a9c1e3b5d7f9a1c3e5b7d9f1a3c5e7b9d1f3a5c7e9b1d3f5a7c9e0b";
    let node = t.node_configured(
        metadata(&t),
        TestNode::none_driver(),
        1,
        None,
        asterism_bootstrapper::LogBuffer::default(),
        |c| c.ak_identity = Some(ak.into()),
    );
    let run = tokio::spawn(t.run(node, std::future::pending()));
    let table = asterism_kubernetes_versions::VersionTable::builtin().unwrap();
    let release = table.select("v1.31.13").unwrap();
    let mut req = request(INIT_SECRET);
    req.kubernetes_version = release.version().to_string();
    req.kubernetes_components = release
        .components()
        .iter()
        .cloned()
        .map(Into::into)
        .collect();
    let responses = init(t.init_channel().await, req).await.unwrap();
    assert_succeeded(&responses);
    run.await.unwrap().unwrap();

    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(t.node_dir.init_node_record()).unwrap()).unwrap();
    assert_eq!(record["ak"], ak);
    assert_eq!(record["kubernetes_version"], "v1.31.13");
    let components: Vec<asterism_kubernetes_versions::Component> =
        serde_json::from_value(record["kubernetes_components"].clone()).unwrap();
    assert_eq!(
        components,
        release.components(),
        "the list as requested, in order"
    );
}

/// A self-signed CA certificate (PEM), as a platform CA.
fn platform_ca_pem() -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.self_signed(&key).unwrap().pem()
}

fn hosted_services(t: &TestNode, platform_ca: &str) -> asterism_proto::init::HostedServices {
    asterism_proto::init::HostedServices {
        join_measurements: t.measurements_with(|_| true).to_json().into_bytes(),
        platform_ca: platform_ca.as_bytes().to_vec(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hosted_services_are_refused_where_not_hosted_and_required_where_hosted() {
    // A node that does not host the services refuses a request that configures them.
    let t = TestNode::new("127.0.11.21");
    let node = t.node(metadata(&t), TestNode::none_driver(), 1, None);
    let run = tokio::spawn(t.run(node, std::future::pending()));
    let mut req = request(INIT_SECRET);
    req.hosted_services = Some(hosted_services(&t, &platform_ca_pem()));
    let refused = init(t.init_channel().await, req).await.unwrap();
    let failure = failure_of(&refused).unwrap();
    assert!(
        failure.contains("this node does not host the cluster's key and join services"),
        "{failure}"
    );
    assert_eq!(t.pcr15(), [0; 32], "refused before the node lock");
    assert!(!t.node_dir.hosted_services().exists());
    run.abort();

    // A node that hosts them refuses a request without their configuration, or with a
    // broken one, before the lock.
    let t = TestNode::new("127.0.11.22");
    let node = t.node_configured(
        metadata(&t),
        TestNode::none_driver(),
        1,
        None,
        asterism_bootstrapper::LogBuffer::default(),
        |c| c.host_cluster_services = true,
    );
    let run = tokio::spawn(t.run(node, std::future::pending()));
    let refused = init(t.init_channel().await, request(INIT_SECRET))
        .await
        .unwrap();
    let failure = failure_of(&refused).unwrap();
    assert!(
        failure.contains("the request must say what its join service trusts"),
        "{failure}"
    );
    let ca = platform_ca_pem();
    let mut bad_measurements = hosted_services(&t, &ca);
    bad_measurements.join_measurements = b"{\"measurements\": {\"0\": \"zz\"}}".to_vec();
    let mut bad_ca = hosted_services(&t, &ca);
    bad_ca.platform_ca = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".to_vec();
    let mut no_ca = hosted_services(&t, &ca);
    no_ca.platform_ca = Vec::new();
    for (services, reason) in [
        (bad_measurements, "the hosted join service's measurements"),
        (bad_ca, "the hosted join service's platform CA"),
        (no_ca, "the hosted join service's platform CA"),
    ] {
        let mut req = request(INIT_SECRET);
        req.hosted_services = Some(services);
        let refused = init(t.init_channel().await, req).await.unwrap();
        let failure = failure_of(&refused).unwrap();
        assert!(failure.contains(reason), "{reason}: {failure}");
    }
    assert_eq!(t.pcr15(), [0; 32], "refused before the node lock");
    assert!(!t.node_dir.hosted_services().exists());

    // A good configuration is kept, with the key service's secrets, 0600 in a 0700
    // directory.
    let services = hosted_services(&t, &ca);
    let mut req = request(INIT_SECRET);
    req.hosted_services = Some(services.clone());
    let responses = init(t.init_channel().await, req).await.unwrap();
    assert_succeeded(&responses);
    run.await.unwrap().unwrap();
    let dir = t.node_dir.hosted_services();
    let kms = kms();
    for (name, content) in [
        ("mastersecret", kms.master_secret().expose_secret().to_vec()),
        ("salt", kms.salt().expose_secret().to_vec()),
        ("measurementSalt", MEASUREMENT_SALT.to_vec()),
        ("join-measurements.json", services.join_measurements.clone()),
        ("platform-ca.pem", services.platform_ca.clone()),
    ] {
        let path = dir.join(name);
        assert_eq!(std::fs::read(&path).unwrap(), content, "{name}");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{name}");
    }
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
}

//! The join service end to end in one process: real aTLS and gRPC on loopback, the real
//! key service on a Unix socket, the real metadata service, clients bound to their node's
//! `127.0.10.x` address, and evidence from a real swtpm or from a pinned software AK.

use std::sync::Arc;

use crate::common::*;
use asterism_attestation::PcrIndex;
use asterism_kms::KeyId;
use asterism_proto::join::IssueRejoinTicketRequest;
use asterism_testkit::TpmNode;
use asterism_tpm::Tpm;
use tonic::Code;
use x509_parser::prelude::{FromDer, X509Certificate};

fn der_of(pem: &[u8]) -> Vec<u8> {
    x509_parser::pem::parse_x509_pem(pem).unwrap().1.contents
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_attesting_with_swtpm_gets_a_complete_ticket_and_a_rejoin_ticket_until_its_pcrs_change()
 {
    let TpmNode {
        issuer,
        fingerprint: fp,
        swtpm,
    } = TpmNode::start().unwrap();
    let cluster = Cluster::start().await;
    let js = start_join_service(&cluster, Options::pinning(vec![fp])).await;

    let t = join_worker_0(js.addr, issuer.clone()).await.unwrap();
    assert_eq!(
        t.state_disk_key,
        expected_key(KeyId::disk(DISK_A).unwrap()),
        "the disk key is the KMS derivation for the disk UUID"
    );
    assert_eq!(t.measurement_secret, expected_key(KeyId::MeasurementSecret));
    assert_eq!(t.measurement_salt, SALT);
    assert_eq!(t.api_server_endpoint, format!("{CP}:6443"));
    assert!(t.control_plane_files.is_empty());
    assert!(t.kubernetes_components.is_empty());
    let (id, secret) = t.token.split_once('.').unwrap();
    assert_eq!((id.len(), secret.len()), (6, 16));

    // Kubelet certificate: chains to the cluster CA, right subject and IP SANs.
    let ca = cluster.ca();
    assert_eq!(t.discovery_token_ca_cert_hash, ca.discovery_hash().unwrap());
    let der = der_of(&t.kubelet_cert);
    let (_, cert) = X509Certificate::from_der(&der).unwrap();
    let (_, ca_cert) = X509Certificate::from_der(ca.cert_der()).unwrap();
    cert.verify_signature(Some(ca_cert.public_key())).unwrap();
    let cn: Vec<_> = cert
        .subject()
        .iter_common_name()
        .map(|a| a.as_str().unwrap())
        .collect();
    let o: Vec<_> = cert
        .subject()
        .iter_organization()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(
        (cn, o),
        (vec!["system:node:worker-0"], vec!["system:nodes"])
    );
    let san = cert.subject_alternative_name().unwrap().unwrap().value;
    assert_eq!(
        san.general_names,
        vec![x509_parser::extensions::GeneralName::IPAddress(&[
            127, 0, 10, 2
        ])]
    );

    // SSH: the CA line is the KMS-derived CA, and the host certificate verifies against it.
    let seed = asterism_kms::DataKey::new(expected_key(KeyId::EmergencySshCa)).unwrap();
    let ssh_ca = asterism_pki::SshCa::from_seed(&seed).unwrap();
    assert_eq!(
        t.authorized_ca_public_key,
        ssh_ca.authorized_keys_line().into_bytes()
    );
    let cert = ssh_key::Certificate::from_openssh(
        std::str::from_utf8(&t.host_certificate).unwrap().trim_end(),
    )
    .unwrap();
    let ca_fp = ssh_ca.public_key().fingerprint(ssh_key::HashAlg::Sha256);
    cert.validate([&ca_fp]).unwrap();
    assert_eq!(
        cert.valid_principals(),
        [W0.to_owned(), "worker-0".to_owned()]
    );

    // Rejoin: disk key and measurement secret.
    let mut c = client(js.addr, W0, issuer.clone()).await.unwrap();
    let r = c
        .issue_rejoin_ticket(IssueRejoinTicketRequest {
            disk_uuid: DISK_A.into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.state_disk_key, expected_key(KeyId::disk(DISK_A).unwrap()));
    assert_eq!(r.measurement_secret, expected_key(KeyId::MeasurementSecret));

    // The node's software changes: PCR 4 moves. The connection is refused in aTLS and
    // no handler runs (no request is counted).
    let before = js.http_get("/metrics").await;
    {
        let mut tpm = Tpm::open(&swtpm.config()).unwrap();
        tpm.extend_pcr(4, &[0xab; 32]).unwrap();
    }
    let err = client(js.addr, W0, issuer.clone()).await.unwrap_err();
    assert!(format!("{err:?}").contains("index 4"), "{err:?}");
    assert_eq!(js.http_get("/metrics").await, before);
    js.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_claiming_control_plane_is_refused_and_a_control_plane_node_gets_the_files() {
    a_worker_cannot_claim_the_control_plane(Cluster::start().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_gce_the_role_is_the_owners_label_and_a_worker_cannot_claim_the_control_plane() {
    let cluster = Cluster::start_on_gce().await;
    let project = cluster.gce.clone().unwrap();
    a_worker_cannot_claim_the_control_plane(cluster).await;
    let calls = project.calls.lock().unwrap().clone();
    assert!(
        calls
            .iter()
            .all(|c| c.contains("labels.asterism-cluster%20%3D%20%22test%22")),
        "every decision came from the API's listing of this cluster: {calls:?}"
    );
    assert!(!calls.is_empty());
}

/// The insider of GCE: a joined worker whose service account may set labels labels itself
/// `control-plane`. The metadata now says control plane, and the worker asks as one with
/// its own key and disk: refused, since a member keeps the role it was admitted in until an
/// operator re-admits it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_gce_a_worker_that_relabels_itself_control_plane_is_refused() {
    let (worker, wfp) = soft_node();
    let cluster = Cluster::start_on_gce().await;
    let js = start_join_service(&cluster, Options::pinning(vec![wfp])).await;
    join_worker_0(js.addr, worker.clone()).await.unwrap();

    let project = cluster.gce.clone().unwrap();
    for i in project.instances.lock().unwrap().iter_mut() {
        if i["name"] == "worker-0" {
            i["labels"]["asterism-role"] = "control-plane".into();
        }
    }
    // Past the service's one-second reuse of a listing.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let err = join(
        js.addr,
        W0,
        worker.clone(),
        join_request("worker-0", W0, DISK_A, true),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(
        err.message().contains("is a member as Worker")
            && err.message().contains("asterism readmit worker-0"),
        "{err:?}"
    );
    assert!(js.http_get("/metrics").await.contains(
        "asterism_join_rejections_total{kind=\"join\",reason=\"member_role_changed\"} 1"
    ));
    js.stop().await;
}

async fn a_worker_cannot_claim_the_control_plane(cluster: Cluster) {
    let (worker, wfp) = soft_node();
    let (cp, cfp) = soft_node();
    let js = start_join_service(&cluster, Options::pinning(vec![wfp, cfp])).await;

    let err = join(
        js.addr,
        W0,
        worker.clone(),
        join_request("worker-0", W0, DISK_A, true),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("role"), "{err:?}");
    // And a control-plane node cannot ask to be a worker either.
    let err = join(
        js.addr,
        CP,
        cp.clone(),
        join_request("cp-0", CP, DISK_B, false),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");

    let t = join(js.addr, CP, cp, join_request("cp-0", CP, DISK_B, true))
        .await
        .unwrap();
    let names: Vec<_> = t
        .control_plane_files
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(names, ["ca.key", "ca.crt"]);
    let ca_crt = &t.control_plane_files[1].data;
    assert_eq!(
        ca_crt,
        &std::fs::read(cluster.pki_dir().join("ca.crt")).unwrap()
    );
    js.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_csr_naming_another_node_or_address_is_refused() {
    let (_cluster, js, [(node, _fp)]) = pinned_cluster().await;
    let err = join(
        js.addr,
        W0,
        node.clone(),
        join_request("worker-1", W0, DISK_A, false),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("worker-1"), "{err:?}");
    let err = join(
        js.addr,
        W0,
        node.clone(),
        join_request("worker-0", W1, DISK_A, false),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains(W1), "{err:?}");
    js.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_outside_the_metadata_is_refused() {
    let (_cluster, js, [(node, _fp)]) = pinned_cluster().await;
    let err = join(
        js.addr,
        "127.0.10.77",
        node.clone(),
        join_request("worker-0", W0, DISK_A, false),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    let mut c = client(js.addr, "127.0.10.77", node).await.unwrap();
    let err = c
        .issue_rejoin_ticket(IssueRejoinTicketRequest {
            disk_uuid: DISK_A.into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    js.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_belongs_to_the_first_attestation_key_and_retries_are_idempotent() {
    let (_cluster, js, [(a, afp), (b, _bfp)]) = pinned_cluster().await;

    let first = join_worker_0(js.addr, a.clone()).await.unwrap();
    // Another node (another AK) asks for the same disk: join and rejoin refused.
    let err = join(
        js.addr,
        W1,
        b.clone(),
        join_request("worker-1", W1, DISK_A, false),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("another attestation key"), "{err:?}");
    let mut c = client(js.addr, W1, b).await.unwrap();
    let err = c
        .issue_rejoin_ticket(IssueRejoinTicketRequest {
            disk_uuid: DISK_A.into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");

    // The first node retries (as after a crash): same disk key, same token, one member.
    let again = join(js.addr, W0, a, join_request("worker-0", W0, DISK_A, false))
        .await
        .unwrap();
    assert_eq!(again.state_disk_key, first.state_disk_key);
    assert_eq!(again.token, first.token);
    let members: serde_json::Value =
        serde_json::from_str(&js.admin_get("/v1/members").await).unwrap();
    let members = members.as_array().unwrap();
    assert_eq!(members.len(), 1, "{members:?}");
    assert_eq!(members[0]["name"], "worker-0");
    assert_eq!(members[0]["tickets"], 2);
    assert_eq!(members[0]["ak"], afp.to_string());
    js.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_and_the_token_survive_a_restart() {
    let (cluster, js, [(a, afp), (b, bfp)]) = pinned_cluster().await;
    let first = join(js.addr, W0, a, join_request("worker-0", W0, DISK_A, false))
        .await
        .unwrap();
    js.stop().await;

    let js = start_join_service(&cluster, Options::pinning(vec![afp, bfp])).await;
    let members = js.admin_get("/v1/members").await;
    assert!(members.contains("\"worker-0\""), "{members}");
    let second = join(js.addr, W1, b, join_request("worker-1", W1, DISK_B, false))
        .await
        .unwrap();
    assert_eq!(second.token, first.token, "a valid stored token is reused");
    js.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_over_its_rate_is_told_to_slow_down() {
    let (node, fp) = soft_node();
    let cluster = Cluster::start().await;
    let mut options = Options::pinning(vec![fp]);
    options.burst = 2;
    options.rate = 0.001;
    let js = start_join_service(&cluster, options).await;
    let mut c = client(js.addr, W0, node).await.unwrap();
    let mut codes = Vec::new();
    for _ in 0..3 {
        let r = c
            .issue_rejoin_ticket(IssueRejoinTicketRequest {
                disk_uuid: DISK_A.into(),
            })
            .await;
        codes.push(r.map(|_| Code::Ok).unwrap_or_else(|s| s.code()));
    }
    // The disk is unbound (refused), but the rate limit comes first and counts every request.
    assert_eq!(
        codes,
        [
            Code::PermissionDenied,
            Code::PermissionDenied,
            Code::ResourceExhausted
        ]
    );
    let metrics = js.http_get("/metrics").await;
    assert!(
        metrics
            .contains("asterism_join_rejections_total{kind=\"rejoin\",reason=\"rate_limited\"} 1"),
        "{metrics}"
    );
    js.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_tickets_and_rejections_by_reason() {
    let (_cluster, js, [(node, _fp)]) = pinned_cluster().await;
    join_worker_0(js.addr, node.clone()).await.unwrap();
    join(
        js.addr,
        W0,
        node.clone(),
        join_request("worker-0", W0, DISK_A, true),
    )
    .await
    .unwrap_err();
    let mut bad = join_request("worker-0", W0, "not-a-uuid", false);
    bad.host_certificate_principals.clear();
    let err = join(js.addr, W0, node, bad).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    let m = js.http_get("/metrics").await;
    for line in [
        "asterism_join_tickets_issued_total{kind=\"join\"} 1",
        "asterism_join_rejections_total{kind=\"join\",reason=\"role_mismatch\"} 1",
        "asterism_join_rejections_total{kind=\"join\",reason=\"disk_uuid\"} 1",
        "asterism_join_request_duration_seconds_count{kind=\"join\"} 3",
    ] {
        assert!(m.contains(line), "missing {line}:\n{m}");
    }
    assert_eq!(js.http_get("/healthz").await, "ok\n");
    js.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_key_service_is_unavailable_and_releases_nothing() {
    let (node, fp) = soft_node();
    let cluster = Cluster::start().await;
    let mut options = Options::pinning(vec![fp]);
    options.key_socket = Some(cluster.dir.path().join("nobody-listens.sock"));
    let js = start_join_service(&cluster, options).await;
    let err = join_worker_0(js.addr, node).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert_eq!(js.admin_get("/v1/members").await, "[]");
    js.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_service_that_starts_late_serves_the_next_request_with_the_cluster_keys() {
    // The cluster-wide keys are kept after the first fetch; a failed fetch is not kept.
    let (node, fp) = soft_node();
    let cluster = Cluster::start().await;
    let socket = cluster.dir.path().join("late-key-service.sock");
    let mut options = Options::pinning(vec![fp]);
    options.key_socket = Some(socket.clone());
    let js = start_join_service(&cluster, options).await;
    let err = join_worker_0(js.addr, node.clone()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");

    let ks = asterism_key_service::Listener::bind(&asterism_kms::KeyServiceAddress::Unix(socket))
        .await
        .unwrap();
    let serving = tokio::spawn(async move {
        ks.serve(
            asterism_key_service::KeyService::new(kms()),
            &asterism_key_service::LIMITS,
            std::future::pending(),
        )
        .await
    });
    for (name, ip, disk) in [("worker-0", W0, DISK_A), ("worker-0", W0, DISK_A)] {
        let t = join(
            js.addr,
            ip,
            node.clone(),
            join_request(name, ip, disk, false),
        )
        .await
        .unwrap();
        assert_eq!(t.measurement_secret, expected_key(KeyId::MeasurementSecret));
        assert_eq!(t.state_disk_key, expected_key(KeyId::disk(disk).unwrap()));
        let ssh_ca =
            asterism_pki::SshCa::from_seed(&kms().data_key(&KeyId::EmergencySshCa, 32).unwrap())
                .unwrap();
        assert_eq!(
            t.authorized_ca_public_key,
            ssh_ca.authorized_keys_line().into_bytes()
        );
    }
    serving.abort();
    js.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_key_requests_on_a_fresh_connection_is_not_refused() {
    // More calls at once than the key service takes per connection, before its HTTP/2
    // settings have arrived.
    use asterism_join_service::{KeyServiceAddress, KeyServiceClient};
    let cluster = Cluster::start().await;
    let client =
        KeyServiceClient::new(&KeyServiceAddress::Unix(cluster.key_socket.clone())).unwrap();
    let calls: Vec<_> = (0..200)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let disk = format!("{i:08x}-0000-4000-8000-000000000000");
                client.data_key(&KeyId::disk(&disk).unwrap(), 32).await
            })
        })
        .collect();
    for call in calls {
        call.await.unwrap().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_software_node_with_other_pcrs_gets_nothing() {
    use asterism_soft_tpm::{SoftAk, SoftTpm};
    let mut tpm = SoftTpm::new(SoftAk::generate_ecdsa_p256().unwrap());
    tpm.set_pcr(PcrIndex::new(7).unwrap(), [1; 32]);
    let fp = tpm.ak().fingerprint();
    let cluster = Cluster::start().await;
    let js = start_join_service(&cluster, Options::pinning(vec![fp])).await;
    let err = client(js.addr, W0, Arc::new(tpm)).await.unwrap_err();
    assert!(format!("{err:?}").contains("index 7"), "{err:?}");
    assert!(!js.http_get("/metrics").await.contains("kind=\"join\""));
    js.stop().await;
}

/// A joined worker attests as often as it likes, and each verified connection holds memory
/// and a file descriptor until its lifetime ends: one attestation key holds at most
/// `MAX_CONNECTIONS_PER_KEY` at once. The next is closed after its handshake, while another
/// key is served; once one closes, the key may connect again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_attestation_key_holds_a_bounded_number_of_verified_connections() {
    use asterism_join_service::MAX_CONNECTIONS_PER_KEY;
    let (_cluster, js, [(a, _afp), (b, _bfp)]) = pinned_cluster().await;
    /// Whether the service answered on `c`, or closed the connection; and what came back.
    async fn answered(
        c: &mut asterism_proto::join::api_client::ApiClient<tonic::transport::Channel>,
    ) -> (bool, String) {
        let asked = c
            .issue_rejoin_ticket(IssueRejoinTicketRequest {
                disk_uuid: DISK_A.into(),
            })
            .await;
        // The service's own answers to this request: the disk was never bound, or the
        // key's rate was spent. A closed connection surfaces as any transport error.
        match asked {
            Ok(_) => (true, "a ticket".into()),
            Err(status) => (
                matches!(
                    status.code(),
                    Code::PermissionDenied | Code::ResourceExhausted
                ),
                format!("{status:?}"),
            ),
        }
    }
    let mut held = Vec::new();
    for i in 0..MAX_CONNECTIONS_PER_KEY {
        let mut c = client(js.addr, W0, a.clone()).await.unwrap();
        let (served, what) = answered(&mut c).await;
        assert!(served, "connection {i} of the key was served: {what}");
        held.push(c);
    }
    let over = client(js.addr, W0, a.clone()).await;
    if let Ok(mut c) = over {
        let (served, what) = answered(&mut c).await;
        assert!(!served, "a connection beyond the cap was served: {what}");
    }
    // Another key, from the same address even, is served.
    let mut other = client(js.addr, W0, b).await.unwrap();
    let (served, what) = answered(&mut other).await;
    assert!(served, "another key was served: {what}");
    // One of the key's connections closes: the key may connect again.
    drop(held.pop());
    let mut again = None;
    for _ in 0..50 {
        let mut c = client(js.addr, W0, a.clone()).await.unwrap();
        if answered(&mut c).await.0 {
            again = Some(c);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        again.is_some(),
        "the key got its slot back after a connection closed"
    );
    js.stop().await;
}

//! SSH host certificates name only the attested peer: its metadata name and address (and,
//! for a control-plane node, the cluster's names); they expire; their serials differ.

use crate::common::*;
use ssh_key::Certificate;
use std::time::{SystemTime, UNIX_EPOCH};
use tonic::Code;

const SAN: &str = "api.cluster.example";

fn with_principals(
    mut req: asterism_proto::join::IssueJoinTicketRequest,
    principals: &[&str],
) -> asterism_proto::join::IssueJoinTicketRequest {
    req.host_certificate_principals = principals.iter().map(|p| (*p).to_owned()).collect();
    req
}

fn certificate(line: &[u8]) -> Certificate {
    Certificate::from_openssh(std::str::from_utf8(line).unwrap().trim_end()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_gets_a_certificate_for_its_own_name_and_address_only() {
    let (w, wfp) = soft_node();
    let cluster = Cluster::start().await;
    let mut options = Options::pinning(vec![wfp]);
    options.cluster_sans = vec![SAN.into()];
    let js = start_join_service(&cluster, options).await;

    for bad in [
        &["*"][..],
        &[W0, "worker-0", "*.cluster.example"],
        &["worker-?"],
        &["cp-0"],
        &[W0, "worker-1"],
        &[CP],
        &[W1],
        // The cluster's names are the control plane's.
        &[SAN],
    ] {
        let err = join(
            js.addr,
            W0,
            w.clone(),
            with_principals(join_request("worker-0", W0, DISK_A, false), bad),
        )
        .await
        .unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied, "{bad:?}: {err:?}");
        assert!(err.message().contains("host certificate"), "{err:?}");
    }
    let metrics = js.http_get("/metrics").await;
    assert!(
        metrics.contains(
            "asterism_join_rejections_total{kind=\"join\",reason=\"principal_not_allowed\"} 8"
        ),
        "{metrics}"
    );

    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut serials = Vec::new();
    for _ in 0..2 {
        let t = join_worker_0(js.addr, w.clone()).await.unwrap();
        let cert = certificate(&t.host_certificate);
        assert_eq!(
            cert.valid_principals(),
            [W0.to_owned(), "worker-0".to_owned()]
        );
        assert!(
            cert.valid_before() <= now + 366 * 24 * 3600,
            "{}",
            cert.valid_before()
        );
        assert!(cert.valid_before() >= now + 364 * 24 * 3600);
        assert_ne!(cert.serial(), 0);
        serials.push(cert.serial());
    }
    assert_ne!(serials[0], serials[1]);
    js.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_node_may_also_carry_the_cluster_names() {
    let (cp, cpfp) = soft_node();
    let cluster = Cluster::start().await;
    let mut options = Options::pinning(vec![cpfp]);
    options.cluster_sans = vec![SAN.into()];
    let js = start_join_service(&cluster, options).await;

    let err = join(
        js.addr,
        CP,
        cp.clone(),
        with_principals(join_request("cp-0", CP, DISK_A, true), &[CP, "worker-0"]),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    let t = join(
        js.addr,
        CP,
        cp,
        with_principals(join_request("cp-0", CP, DISK_A, true), &[CP, "cp-0", SAN]),
    )
    .await
    .unwrap();
    let cert = certificate(&t.host_certificate);
    assert_eq!(cert.valid_principals(), [CP, "cp-0", SAN]);
    js.stop().await;
}

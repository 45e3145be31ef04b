//! A disk key goes only to the attestation key the disk is bound to: a rejoin for an unbound
//! disk is refused, the init node's disk is its own, and a member that comes back with
//! another attestation key waits for an operator.

use crate::common::*;
use asterism_cluster::Role;
use asterism_join_service::{ClusterState, InitNode, RedbState};
use asterism_kms::KeyId;
use asterism_proto::join::IssueRejoinTicketRequest;
use std::time::SystemTime;
use tonic::Code;

async fn rejoin(
    js: &Running,
    from: &str,
    node: std::sync::Arc<dyn asterism_atls::Issuer>,
    disk: &str,
) -> Result<Vec<u8>, tonic::Status> {
    let mut c = client(js.addr, from, node).await.unwrap();
    c.issue_rejoin_ticket(IssueRejoinTicketRequest {
        disk_uuid: disk.into(),
    })
    .await
    .map(|r| r.into_inner().state_disk_key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejoin_for_an_unbound_disk_is_refused_and_claims_nothing() {
    let (_cluster, js, [(a, _afp), (b, _bfp)]) = pinned_cluster().await;

    let err = rejoin(&js, W0, a.clone(), DISK_A).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("never bound"), "{err:?}");
    // Asking claimed nothing: the node that joins with the disk gets it.
    join(js.addr, W1, b, join_request("worker-1", W1, DISK_A, false))
        .await
        .unwrap();
    let err = rejoin(&js, W0, a, DISK_A).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("another attestation key"), "{err:?}");
    let metrics = js.http_get("/metrics").await;
    assert!(
        metrics
            .contains("asterism_join_rejections_total{kind=\"rejoin\",reason=\"disk_unbound\"} 1"),
        "{metrics}"
    );
    js.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_init_nodes_disk_key_goes_to_the_init_node_only() {
    let (cp, cpfp) = soft_node();
    let (w, wfp) = soft_node();
    let cluster = Cluster::start().await;
    let state = RedbState::open(&cluster.state_dir()).unwrap();
    state
        .record_init_node(
            &InitNode {
                disk: DISK_A.into(),
                ak: cpfp.to_string(),
                name: "cp-0".into(),
                role: Role::ControlPlane,
                ..Default::default()
            },
            SystemTime::now(),
        )
        .await
        .unwrap();
    let js = start_join_service_with(&cluster, Options::pinning(vec![cpfp, wfp]), state).await;

    // A worker names the control plane's disk UUID (readable from its LUKS2 header).
    let err = rejoin(&js, W0, w.clone(), DISK_A).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    let err = join(js.addr, W0, w, join_request("worker-0", W0, DISK_A, false))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    // The control plane's own rejoin still works.
    let key = rejoin(&js, CP, cp, DISK_A).await.unwrap();
    assert_eq!(key, expected_key(KeyId::disk(DISK_A).unwrap()));
    let members = js.admin_get("/v1/members").await;
    assert!(members.contains("\"cp-0\""), "{members}");
    js.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_with_another_key_is_refused_until_an_operator_readmits_it() {
    let (_cluster, js, [(old, oldfp), (new, newfp)]) = pinned_cluster().await;
    join_worker_0(js.addr, old).await.unwrap();

    // worker-0's address, a fresh disk, another (trusted) TPM.
    let err = join_worker_0_with_disk(js.addr, new.clone(), DISK_B)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("readmit worker-0"), "{err:?}");
    // Nothing was written: the new disk stays unbound.
    let err = rejoin(&js, W0, new.clone(), DISK_B).await.unwrap_err();
    assert!(err.message().contains("never bound"), "{err:?}");

    let member = js.service.readmit("worker-0").await.unwrap();
    assert_eq!(member.ak, oldfp.to_string());
    join_worker_0_with_disk(js.addr, new.clone(), DISK_B)
        .await
        .unwrap();
    let members: serde_json::Value =
        serde_json::from_str(&js.admin_get("/v1/members").await).unwrap();
    assert_eq!(members[0]["ak"], newfp.to_string());
    assert_eq!(members[0]["readmit"], false);
    js.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joined_worker_cannot_squat_the_disk_of_a_node_that_has_not_joined() {
    let (_cluster, js, [(attacker, _afp), (victim, _vfp)]) = pinned_cluster().await;
    join_worker_0(js.addr, attacker.clone()).await.unwrap();

    // Under its own name, the victim's disk UUID (read from the disk's plaintext LUKS2
    // header): a second disk for a member, refused.
    let err = join_worker_0_with_disk(js.addr, attacker.clone(), DISK_B)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("second"), "{err:?}");
    assert!(err.message().contains("readmit"), "{err:?}");
    // Posing as the victim from its address, with its own key: a second disk for the key.
    let err = join(
        js.addr,
        W1,
        attacker.clone(),
        join_request("worker-1", W1, DISK_B, false),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("second"), "{err:?}");

    // Nothing was bound: the victim joins with its disk and gets its key.
    let ticket = join(
        js.addr,
        W1,
        victim.clone(),
        join_request("worker-1", W1, DISK_B, false),
    )
    .await
    .unwrap();
    assert_eq!(
        ticket.state_disk_key,
        expected_key(KeyId::disk(DISK_B).unwrap())
    );
    rejoin(&js, W1, victim, DISK_B).await.unwrap();
    let metrics = js.http_get("/metrics").await;
    assert!(
        metrics.contains("asterism_join_rejections_total{kind=\"join\",reason=\"second_disk\"} 2"),
        "{metrics}"
    );
    js.stop().await;
}

/// The control-plane list the owner's workspace takes (`asterism control-plane sync`):
/// control-plane members only, each with its AK and the disk of its ticket, signed by the
/// control plane's identity (the key derived from the master secret), and by nothing a
/// worker could hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_plane_list_names_control_plane_nodes_with_their_disks_signed_by_the_identity()
{
    use base64::Engine as _;
    let (_cluster, js, [(cp, cpfp), (worker, _wfp)]) = pinned_cluster().await;
    join(js.addr, CP, cp, join_request("cp-0", CP, DISK_A, true))
        .await
        .unwrap();
    join_worker_0_with_disk(js.addr, worker, DISK_B)
        .await
        .unwrap();
    let envelope: serde_json::Value =
        serde_json::from_str(&js.admin_get("/v1/control-plane").await).unwrap();
    let payload = base64::engine::general_purpose::STANDARD
        .decode(envelope["payload"].as_str().unwrap())
        .unwrap();
    let signature = hex::decode(envelope["signature"].as_str().unwrap()).unwrap();
    let key = kms().control_plane_seed().unwrap().public_key().unwrap();
    key.verify(
        asterism_kms::Purpose::MemberList,
        &asterism_kms::ChannelBinding::DOCUMENT,
        &payload,
        &signature,
    )
    .unwrap();
    let list: serde_json::Value = serde_json::from_slice(&payload).unwrap();
    let members = list["members"].as_array().unwrap();
    assert_eq!(members.len(), 1, "{list}");
    assert_eq!(members[0]["name"], "cp-0");
    assert_eq!(members[0]["ak"], cpfp.to_string());
    assert_eq!(members[0]["disk"], DISK_A);
    js.stop().await;
}

/// One attestation key is one node. A joined worker (genuine TPM, measurements and marker)
/// asks from the address of a node that has not joined, with its own bound disk: as the
/// control plane it would get the cluster CA's key, as another worker that node's name, and
/// after an operator re-admits another member, that member's name and a second disk. Each
/// is refused for the key, before anything is written, and the real nodes still join.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_members_key_cannot_take_another_node_name() {
    let (_cluster, js, [(a, _afp), (b, _bfp), (c, _cfp)]) = pinned_cluster().await;
    join_worker_0_with_disk(js.addr, a.clone(), DISK_A)
        .await
        .unwrap();

    for (what, from, request) in [
        (
            "the control plane",
            CP,
            join_request("cp-0", CP, DISK_A, true),
        ),
        (
            "a worker that has not joined",
            W1,
            join_request("worker-1", W1, DISK_A, false),
        ),
    ] {
        let err = join(js.addr, from, a.clone(), request).await.unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied, "{what}: {err:?}");
        assert!(err.message().contains("member worker-0"), "{what}: {err:?}");
    }
    // Nothing was claimed: the real nodes join with their own keys and disks.
    join(js.addr, W1, b, join_request("worker-1", W1, DISK_B, false))
        .await
        .unwrap();
    let cp = join(js.addr, CP, c, join_request("cp-0", CP, DISK_C, true))
        .await
        .unwrap();
    assert!(!cp.control_plane_files.is_empty());

    // An operator re-admits worker-1 (its machine was replaced): the re-admission is for a
    // new key, not for worker-0's.
    js.service.readmit("worker-1").await.unwrap();
    let err = join(
        js.addr,
        W1,
        a.clone(),
        join_request("worker-1", W1, DISK_D, false),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("member worker-0"), "{err:?}");
    let err = rejoin(&js, W0, a, DISK_D).await.unwrap_err();
    assert!(err.message().contains("never bound"), "{err:?}");

    let metrics = js.http_get("/metrics").await;
    assert!(
        metrics.contains(
            "asterism_join_rejections_total{kind=\"join\",reason=\"key_is_another_member\"} 3"
        ),
        "{metrics}"
    );
    js.stop().await;
}

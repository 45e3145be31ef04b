//! Disk bindings and member keys in the Kubernetes-API store (`KubeState`), against the
//! recording API server: a rejoin needs a disk bound to its key, a member with another key
//! is refused without a write until an operator re-admits it, and the init node's record
//! binds its disk; tickets carry the components ConfigMap the NodeVersion names, checked
//! against its name.

use asterism_attestation::AkFingerprint;
use asterism_join_service::{
    Admission, ClusterState, InitNode, JoiningNodes, KubeReleaseError, KubeState, StateError,
};
use asterism_kms::DiskUuid;
use asterism_kube_api::ApiError;
use asterism_metadata::Role;
use asterism_testkit::kube_api::paths::{CONFIG_MAPS, NODE_VERSION};
use asterism_testkit::kube_api::{RecordingServer, Reply, recorded};
use std::time::{Duration, SystemTime};

const DISK: &str = "aaaaaaaa-0000-4000-8000-00000000000a";
/// The AK of the recorded member `worker-0`.
const RECORDED_AK: &str = "4d2a9f0e1b3c5d7e9f1a2b4c6d8e0f1a3b5c7d9e1f2a4b6c8d0e2f4a6b8c0d2e";
const OTHER_AK: &str = "1111111111111111111111111111111111111111111111111111111111111111";

/// The AK identity `hex` names.
fn fingerprint(hex: &str) -> AkFingerprint {
    AkFingerprint::from_hex(hex).unwrap()
}

fn t0() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_772_445_600)
}

/// The admission of node `name` in `role` with the AK `ak_hex` names, of the disk `DISK`, at
/// [`t0`].
fn admission(name: &str, role: Role, ak_hex: &str) -> Admission {
    Admission {
        name: name.into(),
        role,
        ak: fingerprint(ak_hex),
        disk: DiskUuid::parse(DISK).unwrap(),
        now: t0(),
    }
}

fn member_path() -> String {
    format!("{CONFIG_MAPS}/asterism-member-worker-0")
}

async fn setup() -> (RecordingServer, KubeState, tempfile::TempDir) {
    let server = RecordingServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let state = KubeState::new(server.api(dir.path()).await, JoiningNodes::Required);
    // The member records: worker-0 with RECORDED_AK, cp-0 with another key.
    server.on(
        "GET",
        CONFIG_MAPS,
        [Reply::recorded(200, "configmap-member-list.json")],
    );
    (server, state, dir)
}

/// One key is one node: worker-0's key asking as cp-0 (a member with its own key) or as a
/// node that has not joined is refused for the key, before any write.
#[tokio::test]
async fn a_members_key_cannot_take_another_node_name() {
    let (server, state, _dir) = setup().await;
    server.on(
        "GET",
        &format!("{CONFIG_MAPS}/asterism-member-worker-9"),
        [
            Reply::recorded(404, "status-404-configmap-disk.json"),
            Reply::recorded(404, "status-404-configmap-disk.json"),
            Reply::recorded(404, "status-404-configmap-disk.json"),
        ],
    );
    server.on(
        "GET",
        &format!("{CONFIG_MAPS}/asterism-disk-{DISK}"),
        [Reply::recorded(404, "status-404-configmap-disk.json")],
    );
    let err = state
        .check_member("worker-9", &fingerprint(RECORDED_AK), Role::Worker)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StateError::KeyIsAnotherMember { member, .. } if member == "worker-0"),
        "{err:?}"
    );
    // The check before a ticket's signatures says so too (the disk is unbound).
    let err = state
        .check_admission(&admission("worker-9", Role::Worker, RECORDED_AK))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StateError::KeyIsAnotherMember { member, .. } if member == "worker-0"),
        "{err:?}"
    );
    // Its own name is its own.
    server.on(
        "GET",
        &member_path(),
        [Reply::recorded(200, "configmap-member-worker-0.json")],
    );
    state
        .check_member("worker-0", &fingerprint(RECORDED_AK), Role::Worker)
        .await
        .unwrap();
    assert!(server.writes().is_empty(), "{:?}", server.writes());
}

/// The recorded member `worker-0`, re-admitted by an operator.
fn readmitted_member() -> String {
    let mut cm: serde_json::Value =
        serde_json::from_str(&recorded("configmap-member-worker-0.json")).unwrap();
    cm["data"]["readmit"] = "true".into();
    cm.to_string()
}

#[tokio::test]
async fn a_rejoin_needs_a_disk_bound_to_its_own_key_and_writes_nothing() {
    let (server, state, _dir) = setup().await;
    let disk = DiskUuid::parse(DISK).unwrap();
    server.on(
        "GET",
        &format!("{CONFIG_MAPS}/asterism-disk-{DISK}"),
        [
            Reply::recorded(404, "status-404-configmap-disk.json"),
            Reply::recorded(200, "configmap-disk-binding-other-ak.json"),
        ],
    );
    let err = state
        .check_rejoin(&disk, &fingerprint(OTHER_AK))
        .await
        .unwrap_err();
    assert!(matches!(err, StateError::DiskUnbound { .. }), "{err:?}");
    let err = state
        .check_rejoin(&disk, &fingerprint(OTHER_AK))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StateError::DiskBoundToOtherKey { .. }),
        "{err:?}"
    );
    assert!(server.writes().is_empty(), "{:?}", server.writes());
}

#[tokio::test]
async fn a_member_with_another_key_is_refused_before_any_write() {
    let (server, state, _dir) = setup().await;
    server.on(
        "GET",
        &member_path(),
        [Reply::recorded(200, "configmap-member-worker-0.json")],
    );
    state
        .check_member("worker-0", &fingerprint(RECORDED_AK), Role::Worker)
        .await
        .unwrap();
    let err = state
        .admit(admission("worker-0", Role::Worker, OTHER_AK))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StateError::MemberKeyChanged { .. }),
        "{err:?}"
    );
    assert!(server.writes().is_empty(), "{:?}", server.writes());
}

/// The recorded worker-0, same key and disk, asking in the control plane's role (its
/// metadata changed, a label it could set): refused for the role, before any write.
#[tokio::test]
async fn a_member_asking_for_another_role_is_refused_before_any_write() {
    let (server, state, _dir) = setup().await;
    server.on(
        "GET",
        &member_path(),
        [Reply::recorded(200, "configmap-member-worker-0.json")],
    );
    let err = state
        .admit(admission("worker-0", Role::ControlPlane, RECORDED_AK))
        .await
        .unwrap_err();
    assert!(
        matches!(err, StateError::MemberRoleChanged { ref was, .. } if was == "Worker"),
        "{err:?}"
    );
    assert!(server.writes().is_empty(), "{:?}", server.writes());
}

#[tokio::test]
async fn a_member_asking_for_a_second_disk_is_refused_before_any_write() {
    // worker-0 is a member with its key (so it has its disk), and names an unbound disk:
    // the disk of a node that has not joined yet, say.
    let (server, state, _dir) = setup().await;
    server.on(
        "GET",
        &member_path(),
        [
            Reply::recorded(200, "configmap-member-worker-0.json"),
            Reply::recorded(200, "configmap-member-worker-0.json"),
            Reply::recorded(200, "configmap-member-worker-0.json"),
        ],
    );
    server.on(
        "GET",
        &format!("{CONFIG_MAPS}/asterism-disk-{DISK}"),
        [
            Reply::recorded(404, "status-404-configmap-disk.json"),
            Reply::recorded(404, "status-404-configmap-disk.json"),
            Reply::recorded(404, "status-404-configmap-disk.json"),
            Reply::recorded(404, "status-404-configmap-disk.json"),
        ],
    );
    let admission = admission("worker-0", Role::Worker, RECORDED_AK);
    // Refused before a ticket's signatures, and in the admission itself.
    let err = state.check_admission(&admission).await.unwrap_err();
    assert!(matches!(err, StateError::SecondDisk { .. }), "{err:?}");
    let err = state.admit(admission).await.unwrap_err();
    assert!(matches!(err, StateError::SecondDisk { .. }), "{err:?}");
    assert!(server.writes().is_empty(), "{:?}", server.writes());
}

#[tokio::test]
async fn an_operator_readmission_lets_the_next_ticket_replace_the_key_once() {
    let (server, state, _dir) = setup().await;
    server
        .on(
            "GET",
            &member_path(),
            [Reply::recorded(200, "configmap-member-worker-0.json")],
        )
        .on(
            "PUT",
            &member_path(),
            [Reply::json(200, readmitted_member())],
        );
    let m = state.allow_readmission("worker-0").await.unwrap();
    assert!(m.readmit);
    let put = &server.writes()[0];
    assert_eq!(put.body["data"]["readmit"], "true");
    assert_eq!(put.body["data"]["ak"], RECORDED_AK);
    assert_eq!(put.body["metadata"]["resourceVersion"], "1932");

    // The next ticket, with another key, replaces it and clears the mark.
    server.clear_requests();
    server
        .on(
            "GET",
            &member_path(),
            [Reply::json(200, readmitted_member())],
        )
        .on(
            "PUT",
            &member_path(),
            [Reply::recorded(200, "configmap-member-updated.json")],
        );
    state
        .check_member("worker-0", &fingerprint(OTHER_AK), Role::Worker)
        .await
        .unwrap();
    let api = server.api(_dir.path()).await;
    let record = api
        .record_member("worker-0", "Worker", OTHER_AK, DISK, t0())
        .await
        .unwrap();
    assert_eq!((record.ak.as_str(), record.readmit), (OTHER_AK, false));
    let put = &server.writes()[0];
    assert_eq!(put.body["data"]["ak"], OTHER_AK);
    assert!(put.body["data"].get("readmit").is_none(), "{:?}", put.body);

    // No such member: nothing to re-admit.
    server.on(
        "GET",
        &member_path(),
        [Reply::recorded(404, "status-404-configmap-member.json")],
    );
    let err = state.allow_readmission("worker-0").await.unwrap_err();
    assert!(matches!(err, StateError::NoSuchMember { .. }), "{err:?}");
}

/// A key that is no member's yet; the recorded key claims are of this key.
const FRESH_AK: &str = "8f3c1a5e7b9d2f4a6c8e0b1d3f5a7c9e2b4d6f8a0c1e3b5d7f9a2c4e6b8d0f1a";

fn claim_path() -> String {
    format!("{CONFIG_MAPS}/asterism-ak-{FRESH_AK}")
}

/// The admission of `FRESH_AK` as worker-9, a node that is no member, with an unbound disk.
fn fresh_admission() -> Admission {
    admission("worker-9", Role::Worker, FRESH_AK)
}

/// Routes what a fresh node's checks read: no member worker-9, an unbound disk.
fn route_fresh_node(server: &RecordingServer) {
    server.route_unknown_node("worker-9", DISK);
}

/// Routes a claim this request loses: no claim when it reads, its create answered `409`,
/// then `winner`'s claim.
fn route_lost_claim(server: &RecordingServer, winner: Reply) {
    server
        .on(
            "GET",
            &claim_path(),
            [
                Reply::recorded(404, "status-404-configmap-disk.json"),
                winner,
            ],
        )
        .on(
            "POST",
            CONFIG_MAPS,
            [Reply::recorded(
                409,
                "status-409-configmap-ak-claim-already-exists.json",
            )],
        );
}

/// One key is one node, also under concurrency: two requests of one key under two names
/// both pass the read-only checks (the key is no member's yet); the key's claim decides.
/// Here the other request's claim (worker-7) won the create: this one reads it and is
/// refused, with nothing written but its refused create.
#[tokio::test]
async fn of_two_requests_of_one_key_under_two_names_only_the_one_that_claimed_it_goes_on() {
    let (server, state, _dir) = setup().await;
    route_fresh_node(&server);
    route_lost_claim(
        &server,
        Reply::recorded(200, "configmap-ak-claim-other-node.json"),
    );
    let err = state.admit(fresh_admission()).await.unwrap_err();
    assert!(
        matches!(err, StateError::KeyIsAnotherMember { ref ak, ref member } if member == "worker-7" && ak == FRESH_AK),
        "{err:?}"
    );
    let writes = server.writes();
    assert_eq!(writes.len(), 1, "only the refused claim: {writes:?}");
    assert_eq!(
        writes[0].body["metadata"]["name"],
        format!("asterism-ak-{FRESH_AK}")
    );
}

/// A key another node claimed earlier is refused before any write, under any other name.
#[tokio::test]
async fn a_key_claimed_by_another_node_is_refused_before_any_write() {
    let (server, state, _dir) = setup().await;
    route_fresh_node(&server);
    server.on(
        "GET",
        &claim_path(),
        [Reply::recorded(200, "configmap-ak-claim-other-node.json")],
    );
    let err = state.admit(fresh_admission()).await.unwrap_err();
    assert!(
        matches!(err, StateError::KeyIsAnotherMember { ref ak, ref member } if member == "worker-7" && ak == FRESH_AK),
        "{err:?}"
    );
    assert!(server.writes().is_empty());
}

/// A node's own claim lets it on, without a second create; a claim object that is not a
/// claim of the key it names, or names no canonical disk UUID, is refused as malformed; a
/// name that is no fingerprint is refused before any request.
#[tokio::test]
async fn a_nodes_own_claim_holds_and_a_malformed_one_does_not() {
    let (server, _state, dir) = setup().await;
    let api = server.api(dir.path()).await;
    server.on(
        "GET",
        &claim_path(),
        [Reply::recorded(200, "configmap-ak-claim-other-node.json")],
    );
    let claim = api
        .claim_key(FRESH_AK, "worker-7", DISK, t0())
        .await
        .unwrap();
    assert_eq!(
        (claim.member.as_str(), claim.disk.as_deref()),
        ("worker-7", Some("cccccccc-0000-4000-8000-00000000000c"))
    );
    assert!(server.writes().is_empty(), "the claim exists: no create");
    let err = api
        .claim_key(FRESH_AK, "worker-9", DISK, t0())
        .await
        .unwrap_err();
    assert!(
        matches!(err, ApiError::KeyClaimedByOtherNode { ref member } if member == "worker-7"),
        "{err:?}"
    );

    let other = FRESH_AK.replace('8', "9");
    server.on(
        "GET",
        &format!("{CONFIG_MAPS}/asterism-ak-{other}"),
        [Reply::recorded(200, "configmap-ak-claim-other-node.json")],
    );
    let err = api
        .claim_key(&other, "worker-7", DISK, t0())
        .await
        .unwrap_err();
    assert!(matches!(err, ApiError::Malformed { .. }), "{err:?}");

    // A claim of this key whose disk is no canonical UUID.
    let mut cm: serde_json::Value =
        serde_json::from_str(&recorded("configmap-ak-claim-other-node.json")).unwrap();
    cm["data"]["disk"] = DISK.to_uppercase().into();
    server.on("GET", &claim_path(), [Reply::json(200, cm.to_string())]);
    let err = api
        .claim_key(FRESH_AK, "worker-7", DISK, t0())
        .await
        .unwrap_err();
    assert!(matches!(err, ApiError::Malformed { .. }), "{err:?}");

    server.clear_requests();
    for bad in [
        "",
        "8F3C",
        &FRESH_AK.to_uppercase(),
        &format!("{FRESH_AK}0"),
    ] {
        let err = api
            .claim_key(bad, "worker-7", DISK, t0())
            .await
            .unwrap_err();
        assert!(
            matches!(err, ApiError::InvalidInput { .. }),
            "{bad}: {err:?}"
        );
    }
    assert!(server.requests().is_empty(), "no request for a bad key");
}

/// A key whose claim names another disk: worker-9's claim of `bbbbbbbb-…`.
fn claim_of_another_disk() -> Reply {
    Reply::recorded(200, "configmap-ak-claim-other-disk.json")
}

/// One fresh key binds one disk, also under concurrency: two first requests of one key
/// under one name, for two disks, both pass the read-only checks (no member, both disks
/// unbound). The claim names the disk of the request whose create won (`bbbbbbbb-…`);
/// this one, for another disk, is refused before it binds anything, so a node cannot
/// squat another node's disk and keep its own.
#[tokio::test]
async fn of_two_first_requests_of_one_key_for_two_disks_only_the_claimed_disk_goes_on() {
    let (server, state, _dir) = setup().await;
    route_fresh_node(&server);
    route_lost_claim(&server, claim_of_another_disk());
    let err = state.admit(fresh_admission()).await.unwrap_err();
    assert!(
        matches!(err, StateError::SecondDisk { ref bound, ref requested, .. }
            if bound == "bbbbbbbb-0000-4000-8000-00000000000b" && requested == DISK),
        "{err:?}"
    );
    let writes = server.writes();
    assert_eq!(writes.len(), 1, "only the refused claim: {writes:?}");
    assert_eq!(
        writes[0].body["data"]["disk"], DISK,
        "the claim names its disk"
    );
    assert_eq!(writes[0].body["data"]["member"], "worker-9");
}

/// worker-9's record with `FRESH_AK` and `disk`, `readmit` if an operator re-admitted it.
fn fresh_member(disk: &str, readmit: bool) -> Reply {
    let mut cm: serde_json::Value =
        serde_json::from_str(&recorded("configmap-member-worker-0.json")).unwrap();
    cm["metadata"]["name"] = "asterism-member-worker-9".into();
    cm["data"]["name"] = "worker-9".into();
    cm["data"]["ak"] = FRESH_AK.into();
    cm["data"]["disk"] = disk.into();
    if readmit {
        cm["data"]["readmit"] = "true".into();
    }
    Reply::json(200, cm.to_string())
}

/// `DISK` bound to `FRESH_AK`.
fn disk_bound_to_fresh_key() -> Reply {
    let mut cm: serde_json::Value =
        serde_json::from_str(&recorded("configmap-disk-binding-created.json")).unwrap();
    cm["data"]["ak"] = FRESH_AK.into();
    Reply::json(200, cm.to_string())
}

/// A claim of another disk lets a request on only where the key's node moved: a member an
/// operator re-admitted now, or one whose record already names this disk. A disk bound to
/// the key that its record does not name (what a lost race would have left) is refused by
/// the claim, with nothing written.
#[tokio::test]
async fn a_claim_of_another_disk_holds_unless_the_member_moved_to_this_one() {
    const CLAIMED: &str = "bbbbbbbb-0000-4000-8000-00000000000b";
    let (server, state, _dir) = setup().await;
    let member = format!("{CONFIG_MAPS}/asterism-member-worker-9");
    let disk = format!("{CONFIG_MAPS}/asterism-disk-{DISK}");
    server
        .on("GET", &claim_path(), [claim_of_another_disk()])
        .on("GET", &member, [fresh_member(CLAIMED, false)])
        .on("GET", &disk, [disk_bound_to_fresh_key()]);
    let err = state.admit(fresh_admission()).await.unwrap_err();
    assert!(
        matches!(err, StateError::SecondDisk { ref bound, .. } if bound == CLAIMED),
        "{err:?}"
    );
    assert!(server.writes().is_empty(), "{:?}", server.writes());

    // Re-admitted by an operator: the new disk is bound (the first write).
    server.clear_requests();
    server
        .on("GET", &member, [fresh_member(CLAIMED, true)])
        .on(
            "GET",
            &disk,
            [Reply::recorded(404, "status-404-configmap-disk.json")],
        )
        .on(
            "POST",
            CONFIG_MAPS,
            [Reply::recorded(201, "configmap-disk-binding-created.json")],
        );
    // The JoiningNode step after the binding finds no NodeVersion here and fails.
    let err = state.admit(fresh_admission()).await.unwrap_err();
    assert!(matches!(err, StateError::Store { .. }), "{err:?}");
    let writes = server.writes();
    assert_eq!(
        writes.first().map(|w| w.body["metadata"]["name"].clone()),
        Some(format!("asterism-disk-{DISK}").into()),
        "{writes:?}"
    );

    // Moved there earlier (its record names this disk, bound to its key): past the binding.
    server.clear_requests();
    server.on("GET", &member, [fresh_member(DISK, false)]).on(
        "GET",
        &disk,
        [disk_bound_to_fresh_key()],
    );
    let err = state.admit(fresh_admission()).await.unwrap_err();
    assert!(matches!(err, StateError::Store { .. }), "{err:?}");
    assert!(
        server
            .requests()
            .iter()
            .any(|r| r.path.ends_with("/nodeversions/constellation-version")),
        "the JoiningNode step was reached: {:?}",
        server.requests()
    );
}

#[tokio::test]
async fn the_init_node_binds_its_disk_and_is_recorded_without_tickets() {
    let (server, state, _dir) = setup().await;
    server.route_first_admission("worker-0", DISK);
    let init = InitNode {
        disk: DISK.into(),
        ak: OTHER_AK.into(),
        name: "worker-0".into(),
        role: Role::ControlPlane,
        ..Default::default()
    };
    state.record_init_node(&init, t0()).await.unwrap();
    let writes = server.writes();
    assert_eq!(writes.len(), 3, "{writes:?}");
    assert_eq!(
        (
            &writes[0].body["data"]["ak"],
            &writes[0].body["data"]["member"]
        ),
        (&serde_json::json!(OTHER_AK), &serde_json::json!("worker-0")),
        "the init node claims its key first"
    );
    assert_eq!(writes[1].body["data"]["disk"], DISK);
    assert_eq!(writes[1].body["data"]["ak"], OTHER_AK);
    assert_eq!(writes[2].body["data"]["ak"], OTHER_AK);
    assert_eq!(writes[2].body["data"]["tickets"], "0");
    assert_eq!(writes[2].body["data"]["role"], "ControlPlane");
    assert_eq!(
        writes[2].body["data"]["disk"], DISK,
        "the init member records its disk"
    );

    // A record the state contradicts (the name is held by another key) writes nothing.
    server.clear_requests();
    server.on(
        "GET",
        &member_path(),
        [Reply::recorded(200, "configmap-member-worker-0.json")],
    );
    let err = state.record_init_node(&init, t0()).await.unwrap_err();
    assert!(
        matches!(err, StateError::MemberKeyChanged { .. }),
        "{err:?}"
    );
    assert!(server.writes().is_empty());
}

/// The recorded components ConfigMap: one kubelet of v1.33.4.
const COMPONENTS: &str =
    "k8s-components-sha256-5d4cc820b37f3d1fd0c6e04ed50a56ead8d497ecfd3c25c749855ed9d852837d";

/// The recorded NodeVersion, naming the recorded components ConfigMap.
fn node_version() -> String {
    let mut nv: serde_json::Value =
        serde_json::from_str(&recorded("nodeversion-constellation-version.json")).unwrap();
    nv["spec"]["kubernetesComponentsReference"] = COMPONENTS.into();
    nv.to_string()
}

#[tokio::test]
async fn tickets_carry_the_components_configmap_the_node_version_names() {
    let (server, state, _dir) = setup().await;
    let mut swapped: serde_json::Value =
        serde_json::from_str(&recorded("configmap-components-created.json")).unwrap();
    swapped["data"]["components"] = serde_json::json!([{
        "url": "https://example.com/kubelet",
        "hash": format!("sha256:{}", "2".repeat(64)),
        "install_path": "/run/state/bin/kubelet",
    }])
    .to_string()
    .into();
    server
        .on("GET", NODE_VERSION, [Reply::json(200, node_version())])
        .on(
            "GET",
            &format!("{CONFIG_MAPS}/{COMPONENTS}"),
            [
                Reply::recorded(200, "configmap-components-created.json"),
                Reply::json(200, swapped.to_string()),
            ],
        );
    let release = state.release().await.unwrap().unwrap();
    assert_eq!(release.version().to_string(), "v1.33.4");
    let hashes: Vec<&str> = release
        .components()
        .iter()
        .map(|c| c.hash.as_str())
        .collect();
    assert_eq!(hashes, [format!("sha256:{}", "1".repeat(64))]);
    assert_eq!(
        release.components()[0].install_path,
        "/run/state/bin/kubelet"
    );

    // Another list under the same name is refused, not handed to nodes.
    let err = state.release().await.unwrap_err();
    assert!(
        matches!(
            &err,
            KubeReleaseError::Api(ApiError::ComponentsMismatch { name, .. }) if name == COMPONENTS
        ),
        "{err:?}"
    );
    assert!(server.writes().is_empty(), "{:?}", server.writes());
}

#[tokio::test]
async fn without_a_node_version_tickets_carry_no_components_only_when_joining_nodes_are_optional() {
    let server = RecordingServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    server.on(
        "GET",
        NODE_VERSION,
        [
            Reply::recorded(404, "status-404-nodeversion.json"),
            Reply::recorded(404, "status-404-nodeversion.json"),
        ],
    );
    let optional = KubeState::new(server.api(dir.path()).await, JoiningNodes::WhenInstalled);
    assert_eq!(optional.release().await.unwrap(), None);
    let required = KubeState::new(server.api(dir.path()).await, JoiningNodes::Required);
    let err = required.release().await.unwrap_err();
    assert!(
        matches!(err, KubeReleaseError::Api(ApiError::NotFound { .. })),
        "{err:?}"
    );
}

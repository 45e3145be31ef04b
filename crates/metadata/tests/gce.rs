//! The cluster's metadata on GCE, against loopback stand-ins of the Compute Engine API
//! (HTTPS with a test CA; it refuses a call without the service account's bearer token) and
//! of the metadata server that hands out the token (it refuses a request without
//! `Metadata-Flavor: Google`). Roles come from the owner's labels, the listing is refused
//! whole when it is partial or ambiguous, and the token goes only to the API over TLS
//! checked against the given roots.

#![cfg(test)] // all of it test code: clippy.toml's test allowances cover its helpers too

use std::net::SocketAddr;
use std::sync::Arc;

use asterism_metadata::{AnyMetadata, Metadata, MetadataError, Role};
use asterism_testkit::cloud::{
    GceProject, Handler, answer, gce_api_instance, gce_compute, gce_identity, serve, serve_https,
};
use http::StatusCode;

const HASH: &str = "$2b$10$abcdefghijklmnopqrstuuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ012";

fn cp(name: &str, ip: &str) -> serde_json::Value {
    gce_api_instance(
        name,
        "europe-west3-a",
        ip,
        &[
            ("asterism-cluster", "prod"),
            ("asterism-role", "control-plane"),
        ],
    )
}

fn worker(name: &str, ip: &str) -> serde_json::Value {
    gce_api_instance(
        name,
        "europe-west3-b",
        ip,
        &[("asterism-cluster", "prod"), ("asterism-role", "worker")],
    )
}

struct Cloud {
    project: Arc<GceProject>,
    api: SocketAddr,
    metadata_server: SocketAddr,
    ca: tempfile::NamedTempFile,
}

impl Cloud {
    async fn start(project: GceProject, me: &str) -> Self {
        let project = Arc::new(project);
        let api = gce_compute(project.clone());
        Self::start_with(project, api, me).await
    }

    /// A cloud whose API answers with `api` (the metadata server is the stand-in's).
    async fn start_with(project: Arc<GceProject>, api: Handler, me: &str) -> Self {
        let (api, ca_pem) = serve_https(api).await;
        let metadata_server = serve(gce_identity(project.clone(), me, Some(HASH))).await;
        let ca = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(ca.path(), ca_pem).unwrap();
        Self {
            project,
            api,
            metadata_server,
            ca,
        }
    }

    fn url(&self, target: &str) -> String {
        format!(
            "gce://{target}?compute=https://{}&compute-ca={}&metadata-server=http://{}",
            self.api,
            self.ca.path().display(),
            self.metadata_server
        )
    }

    fn metadata(&self) -> AnyMetadata {
        AnyMetadata::from_url(&self.url("my-project/prod")).unwrap()
    }

    fn calls(&self) -> Vec<String> {
        self.project.calls.lock().unwrap().clone()
    }
}

fn refused(err: &MetadataError, what: &str) {
    let text = err.to_string();
    assert!(
        matches!(err, MetadataError::Malformed { .. }) && text.contains(what),
        "{text}"
    );
}

#[tokio::test]
async fn roles_and_addresses_come_from_the_owners_labels_through_the_api() {
    let mut unlabelled = worker("worker-1", "10.0.0.4");
    unlabelled["labels"]
        .as_object_mut()
        .unwrap()
        .remove("asterism-role");
    let mut odd = worker("worker-2", "10.0.0.5");
    // Only the two exact values name a role; anything else is Unknown, which matches none.
    odd["labels"]["asterism-role"] = "Control-Plane".into();
    let cloud = Cloud::start(
        GceProject::new(
            "my-project",
            vec![
                cp("cp-0", "10.0.0.2"),
                worker("worker-0", "10.0.0.3"),
                unlabelled,
                odd,
            ],
        ),
        "worker-0",
    )
    .await;
    let m = cloud.metadata();

    let list = m.list().await.unwrap();
    let roles: Vec<_> = list
        .iter()
        .map(|i| (i.name.as_str(), i.role, i.vpc_ip.as_str()))
        .collect();
    assert_eq!(
        roles,
        [
            ("cp-0", Role::ControlPlane, "10.0.0.2"),
            ("worker-0", Role::Worker, "10.0.0.3"),
            ("worker-1", Role::Unknown, "10.0.0.4"),
            ("worker-2", Role::Unknown, "10.0.0.5"),
        ]
    );
    assert_eq!(list[0].provider_id, "gce://my-project/europe-west3-a/cp-0");
    assert_eq!(list[0].alias_ip_ranges, ["10.64.0.0/24"]);

    let me = m.self_instance().await.unwrap();
    assert_eq!((me.name.as_str(), me.role), ("worker-0", Role::Worker));
    assert_eq!(m.control_plane_endpoint().await.unwrap(), "10.0.0.2");
    assert_eq!(m.init_secret_hash().await.unwrap(), HASH);

    // The API was asked for this cluster's label, with only the fields used.
    let calls = cloud.calls();
    assert!(
        calls[0].starts_with("/compute/v1/projects/my-project/aggregated/instances?filter=labels.asterism-cluster%20%3D%20%22prod%22&maxResults=500&fields="),
        "{calls:?}"
    );
    // One token, reused for every call while it is valid.
    assert_eq!(calls.len(), 3);
    assert_eq!(*cloud.project.tokens.lock().unwrap(), 1);
}

#[tokio::test]
async fn an_instance_of_another_cluster_is_never_listed_even_if_the_api_ignores_the_filter() {
    let mut project = GceProject::new(
        "my-project",
        vec![
            cp("cp-0", "10.0.0.2"),
            gce_api_instance(
                "intruder",
                "europe-west3-a",
                "10.0.0.9",
                &[
                    ("asterism-cluster", "other"),
                    ("asterism-role", "control-plane"),
                ],
            ),
            gce_api_instance("unlabelled", "europe-west3-a", "10.0.0.10", &[]),
        ],
    );
    project.filter = false;
    let cloud = Cloud::start(project, "cp-0").await;
    let names: Vec<_> = cloud
        .metadata()
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.name)
        .collect();
    assert_eq!(names, ["cp-0"]);
}

#[tokio::test]
async fn every_page_is_read() {
    let mut project = GceProject::new(
        "my-project",
        (0..5)
            .map(|n| worker(&format!("worker-{n}"), &format!("10.0.1.{n}")))
            .collect(),
    );
    project.page_size = 2;
    let cloud = Cloud::start(project, "worker-4").await;
    let m = cloud.metadata();
    assert_eq!(m.list().await.unwrap().len(), 5);
    let calls = cloud.calls();
    assert_eq!(calls.len(), 3, "{calls:?}");
    assert!(calls[2].ends_with("&pageToken=page-4"), "{calls:?}");
    assert_eq!(m.self_instance().await.unwrap().vpc_ip, "10.0.1.4");
}

#[tokio::test]
async fn a_partial_listing_is_refused_whole() {
    let mut project = GceProject::new("my-project", vec![cp("cp-0", "10.0.0.2")]);
    project.unreachables = vec!["zones/europe-west3-c".into()];
    let cloud = Cloud::start(project, "cp-0").await;
    refused(&cloud.metadata().list().await.unwrap_err(), "partial");
}

#[tokio::test]
async fn two_instances_with_one_name_or_one_address_refuse_the_listing() {
    // One name in two zones: the API allows it, a node name must not.
    let cases = [
        (worker("cp-0", "10.0.0.3"), "named \"cp-0\""),
        (worker("worker-0", "10.0.0.2"), "address 10.0.0.2"),
    ];
    for (second, why) in cases {
        let project = GceProject::new("my-project", vec![cp("cp-0", "10.0.0.2"), second]);
        let cloud = Cloud::start(project, "cp-0").await;
        refused(&cloud.metadata().list().await.unwrap_err(), why);
    }
}

#[tokio::test]
async fn the_token_goes_only_to_an_api_whose_certificate_chains_to_the_given_roots() {
    let cloud = Cloud::start(
        GceProject::new("my-project", vec![cp("cp-0", "10.0.0.2")]),
        "cp-0",
    )
    .await;
    // Another server's CA: the handshake fails, and the API never sees a call.
    let (_, other_ca) = serve_https(gce_compute(cloud.project.clone())).await;
    std::fs::write(cloud.ca.path(), other_ca).unwrap();
    let err = cloud.metadata().list().await.unwrap_err();
    assert!(matches!(err, MetadataError::Request { .. }), "{err}");
    assert!(cloud.calls().is_empty());
    // And by default, the public roots, which the test CA is not among.
    let public = AnyMetadata::from_url(&format!(
        "gce://my-project/prod?compute=https://{}&metadata-server=http://{}",
        cloud.api, cloud.metadata_server
    ))
    .unwrap();
    assert!(public.list().await.is_err());
    assert!(cloud.calls().is_empty());
}

#[tokio::test]
async fn another_project_is_another_owners_record_and_is_refused_by_the_api() {
    let cloud = Cloud::start(
        GceProject::new("my-project", vec![cp("cp-0", "10.0.0.2")]),
        "cp-0",
    )
    .await;
    let m = AnyMetadata::from_url(&cloud.url("their-project/prod")).unwrap();
    let err = m.list().await.unwrap_err();
    assert!(
        matches!(err, MetadataError::Status { status: 403, .. }),
        "{err}"
    );
}

#[tokio::test]
async fn an_answer_that_is_not_the_metadata_servers_or_not_a_bearer_token_is_refused() {
    let project = Arc::new(GceProject::new("my-project", vec![cp("cp-0", "10.0.0.2")]));
    let (api, ca_pem) = serve_https(gce_compute(project.clone())).await;
    let ca = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(ca.path(), ca_pem).unwrap();
    // (whether the answer says it is the metadata server's, the token document, why refused)
    let cases = [
        (
            false,
            r#"{"access_token":"ya29.c.test-access-token","expires_in":3599,"token_type":"Bearer"}"#,
            "Metadata-Flavor",
        ),
        (
            true,
            r#"{"access_token":"ya29 x","expires_in":3599,"token_type":"Bearer"}"#,
            "bearer token",
        ),
        (
            true,
            r#"{"access_token":"ya29.c.test-access-token","expires_in":3599,"token_type":"MAC"}"#,
            "bearer token",
        ),
    ];
    for (flavor, body, why) in cases {
        let server = serve(Arc::new(move |_| {
            let headers: &[(&str, &str)] = if flavor {
                &[("metadata-flavor", "Google")]
            } else {
                &[]
            };
            answer(StatusCode::OK, headers, body)
        }))
        .await;
        let m = AnyMetadata::from_url(&format!(
            "gce://my-project/prod?compute=https://{api}&compute-ca={}&metadata-server=http://{server}",
            ca.path().display()
        ))
        .unwrap();
        refused(&m.list().await.unwrap_err(), why);
    }
    assert!(project.calls.lock().unwrap().is_empty());
}

/// A compute API that answers every call with `body` (status 200, JSON).
fn answering(body: String) -> Handler {
    Arc::new(move |_| {
        answer(
            StatusCode::OK,
            &[("content-type", "application/json")],
            body.clone(),
        )
    })
}

fn page_of(instances: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"items": {"zones/europe-west3-a": {"instances": instances}}})
}

#[tokio::test]
async fn a_hostile_api_answer_is_refused_whole() {
    let project = Arc::new(GceProject::new("my-project", vec![]));
    let mut nameless = cp("", "10.0.0.2");
    nameless["name"] = "".into();
    let mut no_address = cp("cp-0", "10.0.0.2");
    no_address["networkInterfaces"] = serde_json::json!([]);
    let mut next_smuggles_a_filter = page_of(serde_json::json!([cp("cp-0", "10.0.0.2")]));
    next_smuggles_a_filter["nextPageToken"] = "x&filter=labels.asterism-cluster%3Dother".into();
    let mut next_too_long = page_of(serde_json::json!([cp("cp-0", "10.0.0.2")]));
    next_too_long["nextPageToken"] = "x".repeat(1025).into();
    let cases = [
        (page_of(serde_json::json!([nameless])), "without a name"),
        (page_of(serde_json::json!([no_address])), "no address"),
        (next_smuggles_a_filter, "next page's token"),
        (next_too_long, "next page's token"),
    ];
    for (body, why) in cases {
        let cloud = Cloud::start_with(project.clone(), answering(body.to_string()), "cp-0").await;
        refused(&cloud.metadata().list().await.unwrap_err(), why);
    }
    // A token of exactly 1 KiB is followed; an API that never stops paging is cut off.
    let mut endless = page_of(serde_json::json!([]));
    endless["nextPageToken"] = "x".repeat(1024).into();
    let cloud = Cloud::start_with(project.clone(), answering(endless.to_string()), "cp-0").await;
    refused(
        &cloud.metadata().list().await.unwrap_err(),
        "more than 16 pages",
    );
}

#[tokio::test]
async fn answers_larger_than_their_caps_are_refused() {
    use asterism_metadata::gce::{MAX_PAGE_LEN, MAX_TEXT_ANSWER};
    let project = Arc::new(GceProject::new("my-project", vec![]));
    // A page one byte over the cap (valid JSON, padded with spaces), and one at the cap.
    let page = page_of(serde_json::json!([cp("cp-0", "10.0.0.2")])).to_string();
    for (len, refused) in [(MAX_PAGE_LEN + 1, true), (MAX_PAGE_LEN, false)] {
        let body = format!("{page}{}", " ".repeat(len - page.len()));
        let cloud = Cloud::start_with(project.clone(), answering(body), "cp-0").await;
        let result = cloud.metadata().list().await;
        match result {
            Err(MetadataError::BodyTooLarge { cap, .. }) => {
                assert!(refused);
                assert_eq!(cap, MAX_PAGE_LEN);
            }
            Ok(list) => assert!(!refused && list.len() == 1),
            Err(e) => panic!("{e}"),
        }
    }
    // The metadata server's answers: a name one byte over its cap.
    let name = "n".repeat(MAX_TEXT_ANSWER + 1);
    let metadata_server = serve(gce_identity(project.clone(), &name, None)).await;
    let m = AnyMetadata::from_url(&format!(
        "gce://my-project/prod?metadata-server=http://{metadata_server}"
    ))
    .unwrap();
    let err = m.self_instance().await.unwrap_err();
    assert!(
        matches!(err, MetadataError::BodyTooLarge { cap, .. } if cap == MAX_TEXT_ANSWER),
        "{err}"
    );
}

#[test]
fn a_compute_ca_file_larger_than_its_cap_or_without_a_certificate_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.pem");
    std::fs::write(&big, vec![b'\n'; 1024 * 1024 + 1]).unwrap();
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, vec![b'\n'; 1024 * 1024]).unwrap();
    for (path, why) in [(&big, "larger than"), (&empty, "no certificate")] {
        let err = AnyMetadata::from_url(&format!(
            "gce://my-project/prod?compute-ca={}",
            path.display()
        ))
        .unwrap_err();
        assert!(
            err.to_string().contains(why) || format!("{err:?}").contains(why),
            "{err:?}"
        );
    }
}

#[tokio::test]
async fn a_zone_the_api_could_not_reach_makes_the_listing_partial_and_refused() {
    let project = Arc::new(GceProject::new("my-project", vec![]));
    let mut page = page_of(serde_json::json!([cp("cp-0", "10.0.0.2")]));
    page["items"]["zones/europe-west3-c"] = serde_json::json!({
        "warning": {"code": "UNREACHABLE", "message": "zone unreachable"}
    });
    // A zone with no instance of the cluster only says so: not partial.
    page["items"]["zones/europe-west3-b"] = serde_json::json!({
        "warning": {"code": "NO_RESULTS_ON_PAGE", "message": "no results"}
    });
    let cloud = Cloud::start_with(project.clone(), answering(page.to_string()), "cp-0").await;
    refused(&cloud.metadata().list().await.unwrap_err(), "partial");
    page["items"]
        .as_object_mut()
        .unwrap()
        .remove("zones/europe-west3-c");
    let cloud = Cloud::start_with(project, answering(page.to_string()), "cp-0").await;
    assert_eq!(cloud.metadata().list().await.unwrap().len(), 1);
}

#[tokio::test]
async fn an_address_on_any_interface_of_another_instance_is_ambiguous() {
    let mut worker = worker("worker-0", "10.0.0.3");
    worker["networkInterfaces"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"name": "nic1", "networkIP": "10.0.0.2"}));
    let cloud = Cloud::start(
        GceProject::new("my-project", vec![cp("cp-0", "10.0.0.2"), worker]),
        "cp-0",
    )
    .await;
    refused(
        &cloud.metadata().list().await.unwrap_err(),
        "address 10.0.0.2",
    );
}

#[tokio::test]
async fn a_token_the_api_refuses_is_forgotten_and_one_without_a_sane_lifetime_does_not_break() {
    // The metadata server's token is not the one this API takes: every call is refused,
    // and each one fetches a fresh token rather than reusing the refused one.
    let issuing = Arc::new(GceProject::new("my-project", vec![]));
    let mut other = GceProject::new("my-project", vec![cp("cp-0", "10.0.0.2")]);
    other.token = "ya29.c.another-token".into();
    let cloud = Cloud::start_with(issuing.clone(), gce_compute(Arc::new(other)), "cp-0").await;
    let m = cloud.metadata();
    for _ in 0..2 {
        let err = m.list().await.unwrap_err();
        assert!(
            matches!(err, MetadataError::Status { status: 401, .. }),
            "{err}"
        );
    }
    assert_eq!(*issuing.tokens.lock().unwrap(), 2);

    // A lifetime near u64::MAX seconds: kept for at most an hour, no overflow.
    let project = Arc::new(GceProject::new("my-project", vec![cp("cp-0", "10.0.0.2")]));
    let (api, ca_pem) = serve_https(gce_compute(project.clone())).await;
    let ca = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(ca.path(), ca_pem).unwrap();
    let token = format!(
        r#"{{"access_token":"{}","expires_in":{},"token_type":"Bearer"}}"#,
        project.token,
        u64::MAX
    );
    let server = serve(Arc::new(move |_| {
        answer(
            StatusCode::OK,
            &[("metadata-flavor", "Google")],
            token.clone(),
        )
    }))
    .await;
    let m = AnyMetadata::from_url(&format!(
        "gce://my-project/prod?compute=https://{api}&compute-ca={}&metadata-server=http://{server}",
        ca.path().display()
    ))
    .unwrap();
    assert_eq!(m.list().await.unwrap().len(), 1);
    assert_eq!(m.list().await.unwrap().len(), 1);
}

/// The GCE insider: a node whose token may change instances could label itself the control
/// plane. Such a token is refused before it is fetched, so no node runs with one.
#[tokio::test]
async fn a_service_account_whose_token_could_relabel_instances_is_refused() {
    for scope in asterism_metadata::gce::WRITE_SCOPES {
        let mut project = GceProject::new("my-project", vec![cp("cp-0", "10.0.0.2")]);
        project.scopes = vec![
            "https://www.googleapis.com/auth/devstorage.read_only".into(),
            scope.into(),
            "https://www.googleapis.com/auth/logging.write".into(),
        ];
        let cloud = Cloud::start(project, "cp-0").await;
        let m = cloud.metadata();
        refused(&m.list().await.unwrap_err(), "--scopes=compute-ro");
        refused(&m.self_instance().await.unwrap_err(), scope);
        assert_eq!(*cloud.project.tokens.lock().unwrap(), 0);
        assert!(cloud.calls().is_empty());
    }
}

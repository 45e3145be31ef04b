//! The owner's roster (`--metadata-url file:PATH`): the metadata service's configuration
//! format, read again for every question, refused whole when it is not a valid roster.

#![cfg(test)] // all of it test code: clippy.toml's test allowances cover its helpers too

use asterism_metadata::{AnyMetadata, Metadata, MetadataError, Role};
use asterism_testkit::metadata::instance;

fn roster(instances: &[(&str, Role, &str)]) -> String {
    serde_json::json!({
        "instances": instances
            .iter()
            .map(|(name, role, ip)| instance(name, *role, ip))
            .collect::<Vec<_>>(),
        "initSecretHash": "$2b$10$hash",
    })
    .to_string()
}

#[tokio::test]
async fn the_roster_is_read_again_for_every_question() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("roster.json");
    std::fs::write(
        &path,
        roster(&[
            ("cp-0", Role::ControlPlane, "10.0.0.2"),
            ("worker-0", Role::Worker, "10.0.0.3"),
        ]),
    )
    .unwrap();
    let m = AnyMetadata::from_url(&format!("file:{}", path.display())).unwrap();
    let roles: Vec<_> = m
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|i| (i.name, i.role))
        .collect();
    assert_eq!(
        roles,
        [
            ("cp-0".to_owned(), Role::ControlPlane),
            ("worker-0".to_owned(), Role::Worker)
        ]
    );
    assert_eq!(m.control_plane_endpoint().await.unwrap(), "10.0.0.2");
    assert_eq!(m.init_secret_hash().await.unwrap(), "$2b$10$hash");

    // The owner removes worker-0: the next question no longer finds it.
    std::fs::write(&path, roster(&[("cp-0", Role::ControlPlane, "10.0.0.2")])).unwrap();
    assert_eq!(m.list().await.unwrap().len(), 1);

    // A roster that is not valid (two instances at one address) is refused whole, not
    // replaced by the last good one.
    std::fs::write(
        &path,
        roster(&[
            ("cp-0", Role::ControlPlane, "10.0.0.2"),
            ("worker-0", Role::Worker, "10.0.0.2"),
        ]),
    )
    .unwrap();
    let err = m.list().await.unwrap_err();
    assert!(matches!(err, MetadataError::Roster { .. }), "{err}");
    assert!(
        format!("{:?}", err).contains("10.0.0.2"),
        "the reason names the address: {err:?}"
    );
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(
        m.list().await.unwrap_err(),
        MetadataError::Roster { .. }
    ));
}

#[tokio::test]
async fn a_roster_names_no_instance_as_this_node() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("roster.json");
    std::fs::write(&path, roster(&[("cp-0", Role::ControlPlane, "10.0.0.2")])).unwrap();
    let m = AnyMetadata::from_url(&format!("file:{}", path.display())).unwrap();
    let err = m.self_instance().await.unwrap_err();
    assert!(
        format!("{err:?}").contains("names no instance as this node"),
        "{err:?}"
    );
}

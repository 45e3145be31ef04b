//! The component installer against a scripted HTTP server on 127.0.0.1 and tarballs built
//! here: hashes are mandatory and checked, retries are bounded and back off, archives
//! cannot write outside their destination, symlinks point the right way.

#![cfg(test)] // all of it test code: clippy.toml's test allowances cover its helpers too

mod support;

use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::time::{Duration, Instant};

use asterism_components::{
    ArchiveError, Component, ComponentError, DownloadError, DownloadPolicy, HashFormatError,
    Installer,
};
use support::{Entry, Reply, TestServer, sha256, tarball, tree};

fn policy() -> DownloadPolicy {
    DownloadPolicy {
        max_attempts: 3,
        initial_backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(200),
        attempt_timeout: Duration::from_secs(5),
        ..DownloadPolicy::default()
    }
}

fn installer() -> Installer {
    Installer::new(policy()).unwrap()
}

fn component(url: String, hash: String, path: &Path, extract: bool) -> Component {
    Component {
        url,
        hash,
        install_path: path.display().to_string(),
        extract,
    }
}

/// Installs one plain file (no archive) from `url` to `dest`.
async fn install_file(url: String, hash: String, dest: &Path) -> Result<(), ComponentError> {
    installer()
        .install_all(&[component(url, hash, dest, false)])
        .await
}

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

fn good_archive() -> Vec<u8> {
    tarball(&[
        Entry::Dir("./", 0o755),
        Entry::Dir("./bin/", 0o755),
        Entry::File("./bin/tool", b"#!/bin/sh\necho tool\n", 0o4777),
        Entry::Symlink("./bin/tool-link", "tool"),
        Entry::Symlink("./top-link", "bin/tool"),
        Entry::Hardlink("./bin/tool-hard", "./bin/tool"),
        Entry::File("./README", b"readme", 0o644),
    ])
}

#[tokio::test]
async fn installs_a_binary_and_an_archive_with_symlinks() {
    let binary = b"\x7fELF pretend kubelet".to_vec();
    let archive = good_archive();
    let server = TestServer::start(vec![
        ("/kubelet", vec![Reply::Body(binary.clone())]),
        ("/cni.tgz", vec![Reply::Body(archive.clone())]),
    ])
    .await;
    let root = tempfile::tempdir().unwrap();
    let bin = root.path().join("run/state/bin/kubelet");
    let cni = root.path().join("opt/cni/bin");
    fs::create_dir_all(&cni).unwrap();
    fs::write(cni.join("existing-plugin"), b"kept").unwrap();
    installer()
        .install_all(&[
            component(server.url("/kubelet"), sha256(&binary), &bin, false),
            component(server.url("/cni.tgz"), sha256(&archive), &cni, true),
        ])
        .await
        .unwrap();

    assert_eq!(fs::read(&bin).unwrap(), binary);
    assert_eq!(mode(&bin), 0o544);
    assert_eq!(
        fs::read(cni.join("bin/tool")).unwrap(),
        b"#!/bin/sh\necho tool\n"
    );
    // setuid and world-write are masked off.
    assert_eq!(mode(&cni.join("bin/tool")), 0o755);
    assert_eq!(mode(&cni.join("README")), 0o644);
    // The link named tool-link points to tool (not the other way round).
    assert_eq!(
        fs::read_link(cni.join("bin/tool-link")).unwrap(),
        Path::new("tool")
    );
    assert_eq!(
        fs::read_link(cni.join("top-link")).unwrap(),
        Path::new("bin/tool")
    );
    assert_eq!(
        fs::read(cni.join("top-link")).unwrap(),
        b"#!/bin/sh\necho tool\n"
    );
    assert_eq!(
        fs::read(cni.join("bin/tool-hard")).unwrap(),
        b"#!/bin/sh\necho tool\n"
    );
    // What was there stays; no temporary files are left.
    assert_eq!(fs::read(cni.join("existing-plugin")).unwrap(), b"kept");
    assert_eq!(
        tree(root.path()),
        [
            "opt",
            "opt/cni",
            "opt/cni/bin",
            "opt/cni/bin/README",
            "opt/cni/bin/bin",
            "opt/cni/bin/bin/tool",
            "opt/cni/bin/bin/tool-hard",
            "opt/cni/bin/bin/tool-link",
            "opt/cni/bin/existing-plugin",
            "opt/cni/bin/top-link",
            "run",
            "run/state",
            "run/state/bin",
            "run/state/bin/kubelet",
        ]
    );
}

#[tokio::test]
async fn installing_again_replaces_the_files() {
    let archive = good_archive();
    let server = TestServer::start(vec![("/a.tgz", vec![Reply::Body(archive.clone())])]).await;
    let root = tempfile::tempdir().unwrap();
    let dest = root.path().join("bin");
    let c = component(server.url("/a.tgz"), sha256(&archive), &dest, true);
    installer()
        .install_all(std::slice::from_ref(&c))
        .await
        .unwrap();
    installer().install_all(&[c]).await.unwrap();
    assert_eq!(
        fs::read_link(dest.join("bin/tool-link")).unwrap(),
        Path::new("tool")
    );
}

#[tokio::test]
async fn data_urls_install_without_a_server() {
    let root = tempfile::tempdir().unwrap();
    let patch = br#"[{"op":"replace","path":"/spec/containers/0/image","value":"registry.k8s.io/etcd@sha256:00"}]"#;
    use base64::Engine as _;
    let url = format!(
        "data:application/json;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(patch)
    );
    let dest = root.path().join("opt/kubernetes/patches/etcd+json.json");
    installer()
        .install_all(&[component(url, sha256(patch), &dest, false)])
        .await
        .unwrap();
    assert_eq!(fs::read(&dest).unwrap(), patch);
    let dest2 = root.path().join("note");
    installer()
        .install_all(&[component(
            "data:,a%20b".into(),
            sha256(b"a b"),
            &dest2,
            false,
        )])
        .await
        .unwrap();
    assert_eq!(fs::read(&dest2).unwrap(), b"a b");
}

#[tokio::test]
async fn a_data_component_whose_bytes_differ_from_its_hash_installs_nothing() {
    let root = tempfile::tempdir().unwrap();
    let dest = root.path().join("opt/kubernetes/patches/etcd+json.json");
    let err = install_file("data:,tampered".into(), sha256(b"genuine"), &dest)
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            ComponentError::HashMismatch { expected, actual, .. }
                if expected.to_string() == sha256(b"genuine")
                    && actual.to_string() == sha256(b"tampered")
        ),
        "{err:?}"
    );
    assert!(!dest.exists());
    assert_eq!(
        tree(root.path()),
        ["opt", "opt/kubernetes", "opt/kubernetes/patches"]
    );
}

#[tokio::test]
async fn the_version_tables_data_components_install_under_their_computed_hashes() {
    let table = asterism_kubernetes_versions::VersionTable::builtin().unwrap();
    let root = tempfile::tempdir().unwrap();
    for version in table.versions() {
        let release = table
            .resolve(asterism_kubernetes_versions::VersionRequest::Exact(version))
            .unwrap();
        // Only the data: components: the others would need the network.
        let local: Vec<Component> = release
            .components()
            .iter()
            .filter(|c| asterism_components::is_data_url(&c.url))
            .map(|c| Component {
                install_path: format!("{}{}", root.path().display(), c.install_path),
                ..c.clone()
            })
            .collect();
        assert_eq!(local.len(), 4, "{version}");
        installer().install_all(&local).await.unwrap();
    }
    assert!(
        root.path()
            .join("opt/kubernetes/patches/kube-apiserver+json.json")
            .is_file()
    );
}

#[tokio::test]
async fn an_empty_hash_is_refused_before_anything_is_downloaded() {
    let server = TestServer::start(vec![("/kubelet", vec![Reply::Body(b"x".to_vec())])]).await;
    let root = tempfile::tempdir().unwrap();
    let err = installer()
        .install_all(&[component(
            server.url("/kubelet"),
            String::new(),
            &root.path().join("k"),
            false,
        )])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ComponentError::Hash {
                reason: HashFormatError::Empty,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(server.hits("/kubelet"), 0);
    assert!(tree(root.path()).is_empty());
}

#[tokio::test]
async fn one_malformed_hash_refuses_the_whole_list_before_downloading() {
    let server = TestServer::start(vec![("/a", vec![Reply::Body(b"a".to_vec())])]).await;
    let root = tempfile::tempdir().unwrap();
    let err = installer()
        .install_all(&[
            component(
                server.url("/a"),
                sha256(b"a"),
                &root.path().join("a"),
                false,
            ),
            component(
                server.url("/a"),
                "sha256:ABC".into(),
                &root.path().join("b"),
                false,
            ),
        ])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ComponentError::Hash {
                reason: HashFormatError::Digest,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(server.hits("/a"), 0);
    assert!(tree(root.path()).is_empty());
}

#[tokio::test]
async fn a_wrong_hash_installs_nothing() {
    let server =
        TestServer::start(vec![("/kubelet", vec![Reply::Body(b"tampered".to_vec())])]).await;
    let root = tempfile::tempdir().unwrap();
    let dest = root.path().join("bin/kubelet");
    let err = install_file(server.url("/kubelet"), sha256(b"genuine"), &dest)
        .await
        .unwrap_err();
    assert!(
        matches!(err, ComponentError::HashMismatch { .. }),
        "{err:?}"
    );
    assert_eq!(server.hits("/kubelet"), 1, "a mismatch is not retried");
    assert_eq!(tree(root.path()), ["bin"]);
}

#[tokio::test]
async fn a_corrupted_archive_installs_nothing() {
    let mut archive = good_archive();
    let mid = archive.len() / 2;
    archive[mid] ^= 0xff;
    archive.truncate(archive.len() - 8);
    let server = TestServer::start(vec![("/a.tgz", vec![Reply::Body(archive.clone())])]).await;
    let root = tempfile::tempdir().unwrap();
    let dest = root.path().join("cni");
    let err = installer()
        .install_all(&[component(
            server.url("/a.tgz"),
            sha256(&archive),
            &dest,
            true,
        )])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ComponentError::Archive {
                source: ArchiveError::Corrupt(_),
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(tree(root.path()), ["cni"]);
}

#[tokio::test]
async fn a_dropped_connection_is_retried() {
    let body = b"kubeadm".to_vec();
    let server = TestServer::start(vec![(
        "/kubeadm",
        vec![Reply::Drop, Reply::Body(body.clone())],
    )])
    .await;
    let root = tempfile::tempdir().unwrap();
    let dest = root.path().join("kubeadm");
    installer()
        .install_all(&[component(
            server.url("/kubeadm"),
            sha256(&body),
            &dest,
            false,
        )])
        .await
        .unwrap();
    assert_eq!(server.hits("/kubeadm"), 2);
    assert_eq!(fs::read(&dest).unwrap(), body);
}

#[tokio::test]
async fn a_server_that_always_drops_fails_after_bounded_attempts_with_backoff() {
    let server = TestServer::start(vec![("/kubeadm", vec![Reply::Drop])]).await;
    let root = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let err = installer()
        .install_all(&[component(
            server.url("/kubeadm"),
            sha256(b"x"),
            &root.path().join("k"),
            false,
        )])
        .await
        .unwrap_err();
    let elapsed = started.elapsed();
    match &err {
        ComponentError::Download {
            attempts,
            source: DownloadError::Transport(_),
            ..
        } => {
            assert_eq!(*attempts, 3)
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(server.hits("/kubeadm"), 3);
    // 50 ms + 100 ms of backoff between the three attempts: no hot loop.
    assert!(elapsed >= Duration::from_millis(150), "{elapsed:?}");
    assert!(tree(root.path()).is_empty());
}

#[tokio::test]
async fn service_unavailable_is_retried() {
    let server = TestServer::start(vec![(
        "/k",
        vec![
            Reply::Status(503),
            Reply::Status(429),
            Reply::Body(b"ok".to_vec()),
        ],
    )])
    .await;
    let root = tempfile::tempdir().unwrap();
    let dest = root.path().join("k");
    installer()
        .install_all(&[component(server.url("/k"), sha256(b"ok"), &dest, false)])
        .await
        .unwrap();
    assert_eq!(server.hits("/k"), 3);
    assert_eq!(fs::read(&dest).unwrap(), b"ok");
}

#[tokio::test]
async fn every_status_the_original_retries_is_retried_and_no_other() {
    for status in [408, 425, 429, 502, 503, 504] {
        let server = TestServer::start(vec![(
            "/k",
            vec![Reply::Status(status), Reply::Body(b"ok".to_vec())],
        )])
        .await;
        let root = tempfile::tempdir().unwrap();
        let dest = root.path().join("k");
        install_file(server.url("/k"), sha256(b"ok"), &dest)
            .await
            .unwrap_or_else(|e| panic!("{status}: {e:?}"));
        assert_eq!(server.hits("/k"), 2, "{status} is retried");
        assert_eq!(fs::read(&dest).unwrap(), b"ok");
    }
    for status in [400, 401, 403, 500, 501] {
        let server = TestServer::start(vec![(
            "/k",
            vec![Reply::Status(status), Reply::Body(b"ok".to_vec())],
        )])
        .await;
        let root = tempfile::tempdir().unwrap();
        let err = install_file(server.url("/k"), sha256(b"ok"), &root.path().join("k"))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ComponentError::Download { attempts: 1, source: DownloadError::Status(s), .. } if s.as_u16() == status),
            "{status}: {err:?}"
        );
        assert_eq!(server.hits("/k"), 1, "{status} is not retried");
        assert!(tree(root.path()).is_empty());
    }
}

#[tokio::test]
async fn a_partial_download_is_retried_and_one_that_always_ends_early_installs_nothing() {
    let body = b"the whole binary".to_vec();
    let server = TestServer::start(vec![
        (
            "/once",
            vec![
                Reply::Partial(body[..4].to_vec(), body.len() as u64),
                Reply::Body(body.clone()),
            ],
        ),
        (
            "/always",
            vec![Reply::Partial(body[..4].to_vec(), body.len() as u64)],
        ),
    ])
    .await;
    let root = tempfile::tempdir().unwrap();
    let dest = root.path().join("once");
    install_file(server.url("/once"), sha256(&body), &dest)
        .await
        .unwrap();
    assert_eq!(server.hits("/once"), 2);
    assert_eq!(fs::read(&dest).unwrap(), body);

    let root = tempfile::tempdir().unwrap();
    let err = install_file(server.url("/always"), sha256(&body), &root.path().join("a"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            ComponentError::Download {
                attempts: 3,
                source: DownloadError::Transport(_),
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(server.hits("/always"), 3);
    assert!(tree(root.path()).is_empty(), "no partial file is left");
}

#[tokio::test]
async fn an_unknown_host_fails_after_bounded_attempts_and_installs_nothing() {
    // `.invalid` never resolves (RFC 6761).
    let root = tempfile::tempdir().unwrap();
    let err = install_file(
        "http://unknown-host.invalid/kubelet".into(),
        sha256(b"x"),
        &root.path().join("k"),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(
            &err,
            ComponentError::Download {
                attempts: 3,
                source: DownloadError::Transport(_),
                ..
            }
        ),
        "{err:?}"
    );
    assert!(tree(root.path()).is_empty());
}

#[tokio::test]
async fn not_found_fails_at_once() {
    let server = TestServer::start(vec![("/k", vec![Reply::Status(404)])]).await;
    let root = tempfile::tempdir().unwrap();
    let err = installer()
        .install_all(&[component(
            server.url("/k"),
            sha256(b"ok"),
            &root.path().join("k"),
            false,
        )])
        .await
        .unwrap_err();
    match &err {
        ComponentError::Download {
            attempts,
            source: DownloadError::Status(s),
            ..
        } => {
            assert_eq!((*attempts, s.as_u16()), (1, 404))
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(server.hits("/k"), 1);
}

#[tokio::test]
async fn a_hanging_server_hits_the_attempt_timeout() {
    let server =
        TestServer::start(vec![("/k", vec![Reply::Hang, Reply::Body(b"ok".to_vec())])]).await;
    let root = tempfile::tempdir().unwrap();
    let dest = root.path().join("k");
    let inst = Installer::new(DownloadPolicy {
        attempt_timeout: Duration::from_millis(300),
        ..policy()
    })
    .unwrap();
    inst.install_all(&[component(server.url("/k"), sha256(b"ok"), &dest, false)])
        .await
        .unwrap();
    assert_eq!(server.hits("/k"), 2);
}

#[tokio::test]
async fn redirects_are_followed() {
    let server = TestServer::start(vec![
        ("/old", vec![Reply::Redirect("/new".into())]),
        ("/new", vec![Reply::Body(b"moved".to_vec())]),
    ])
    .await;
    let root = tempfile::tempdir().unwrap();
    let dest = root.path().join("k");
    installer()
        .install_all(&[component(
            server.url("/old"),
            sha256(b"moved"),
            &dest,
            false,
        )])
        .await
        .unwrap();
    assert_eq!(fs::read(&dest).unwrap(), b"moved");
}

#[tokio::test]
async fn a_resource_over_the_size_cap_is_refused() {
    let big = vec![7u8; 4096];
    let server = TestServer::start(vec![("/big", vec![Reply::Body(big.clone())])]).await;
    let root = tempfile::tempdir().unwrap();
    let inst = Installer::new(DownloadPolicy {
        max_size: 1024,
        ..policy()
    })
    .unwrap();
    let err = inst
        .install_all(&[component(
            server.url("/big"),
            sha256(&big),
            &root.path().join("k"),
            false,
        )])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ComponentError::Download {
                attempts: 1,
                source: DownloadError::TooLarge(1024),
                ..
            }
        ),
        "{err:?}"
    );
}

/// Each malicious archive is refused; nothing lands in the destination or beside it.
#[tokio::test]
async fn malicious_archives_write_nothing_outside_or_inside() {
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "parent",
            tarball(&[
                Entry::File("ok", b"ok", 0o644),
                Entry::File("../evil", b"evil", 0o644),
            ]),
        ),
        (
            "nested parent",
            tarball(&[Entry::File("a/../../evil", b"evil", 0o644)]),
        ),
        (
            "absolute",
            tarball(&[Entry::File("/abs-evil", b"evil", 0o644)]),
        ),
        (
            "symlink out",
            tarball(&[Entry::Symlink("link", "../outside")]),
        ),
        (
            "symlink absolute",
            tarball(&[Entry::Symlink("link", "/etc/passwd")]),
        ),
        (
            "through a symlink",
            tarball(&[
                Entry::Dir("d", 0o755),
                Entry::Symlink("d/up", ".."),
                Entry::File("d/up/evil", b"e", 0o644),
            ]),
        ),
        (
            "symlink chain out",
            tarball(&[
                Entry::Dir("d", 0o755),
                Entry::Symlink("d/l", ".."),
                Entry::Symlink("d/l/l2", ".."),
            ]),
        ),
        (
            "hardlink out",
            tarball(&[Entry::Hardlink("hl", "../outside")]),
        ),
        (
            "hardlink absolute",
            tarball(&[Entry::Hardlink("hl", "/etc/passwd")]),
        ),
        (
            "hardlink to a non-member",
            tarball(&[Entry::Hardlink("hl", "not-there")]),
        ),
        ("fifo", tarball(&[Entry::Fifo("pipe")])),
    ];
    for (name, archive) in cases {
        let root = tempfile::tempdir().unwrap();
        let dest = root.path().join("dest");
        fs::write(root.path().join("outside"), b"untouched").unwrap();
        let url = {
            use base64::Engine as _;
            format!(
                "data:;base64,{}",
                base64::engine::general_purpose::STANDARD.encode(&archive)
            )
        };
        let err = installer()
            .install_all(&[component(url, sha256(&archive), &dest, true)])
            .await
            .unwrap_err();
        assert!(
            matches!(err, ComponentError::Archive { .. }),
            "{name}: {err:?}"
        );
        assert_eq!(tree(root.path()), ["dest", "outside"], "{name}");
        assert_eq!(
            fs::read(root.path().join("outside")).unwrap(),
            b"untouched",
            "{name}"
        );
    }
}

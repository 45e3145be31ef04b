//! `asterism recover --share`: a master secret split to custodians with real age keys,
//! decrypted with `asterism recovery-share decrypt`, reconstructed into the keys the master
//! secret derives; and every wrong share, file or workspace refused with its own reason,
//! naming the file.

use age::secrecy::ExposeSecret as _;
use asterism::recover::{self, NodeKeys, check_cluster, cluster_kms, read_shares};
use asterism::recovery_share::{self, DecryptArgs};
use asterism_kms::{ClusterKms, DiskUuid, KeyId, MasterSecret, Salt};
use asterism_recovery_shares::Error;
use base64::Engine as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// A workspace made as `init --recovery-shares M-of-N --no-master-secret-file` makes it, and
/// every custodian's share decrypted with their own key.
struct Custody {
    _dir: tempfile::TempDir,
    dir: PathBuf,
    workspace: PathBuf,
    /// The master secret and salt, to derive the expected keys independently.
    secret: Vec<u8>,
    salt: Vec<u8>,
    /// Share `i + 1`, decrypted (mode 0600).
    decrypted: Vec<PathBuf>,
}

impl Custody {
    fn new(m: u8, n: u8) -> Self {
        let secret = MasterSecret::generate().unwrap();
        let salt = Salt::generate().unwrap();
        Self::of(
            m,
            n,
            secret.expose_secret().to_vec(),
            salt.expose_secret().to_vec(),
        )
    }

    /// Splits `secret` afresh: another share set for the same secret.
    fn of(m: u8, n: u8, secret: Vec<u8>, salt: Vec<u8>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_owned();
        let keys: Vec<age::x25519::Identity> =
            (0..n).map(|_| age::x25519::Identity::generate()).collect();
        let mut recipients = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            let path = root.join(format!("custodian-{i}.pub"));
            std::fs::write(&path, format!("{}\n", key.to_public())).unwrap();
            recipients.push(path);
        }
        let split = asterism_recovery_shares::split(
            &MasterSecret::new(secret.clone()).unwrap(),
            &Salt::new(salt.clone()).unwrap(),
            format!("{m}-of-{n}").parse().unwrap(),
            &recovery_share::read_custodians(&recipients).unwrap(),
        )
        .unwrap();

        let workspace = root.join("ws");
        std::fs::create_dir_all(workspace.join("recovery-shares")).unwrap();
        std::fs::write(workspace.join("recovery.json"), split.record.to_json()).unwrap();
        write_cluster_json(&workspace, &kms(&secret, &salt), &[0x5a; 32]);

        let mut decrypted = Vec::new();
        for (i, (share, key)) in split.shares.iter().zip(&keys).enumerate() {
            let share_path = workspace.join("recovery-shares").join(share.file_name());
            std::fs::write(&share_path, share.to_json()).unwrap();
            let key_path = root.join(format!("custodian-{i}.key"));
            std::fs::write(&key_path, key.to_string().expose_secret()).unwrap();
            let out = recovery_share::decrypt(&DecryptArgs {
                share: share_path,
                identity: key_path,
                out: Some(root.join(format!("share-{}.decrypted.json", i + 1))),
            })
            .unwrap();
            decrypted.push(out);
        }
        Self {
            _dir: dir,
            dir: root,
            workspace,
            secret,
            salt,
            decrypted,
        }
    }

    /// The shares numbered `indices` (1-based).
    fn shares(&self, indices: &[usize]) -> Vec<PathBuf> {
        indices
            .iter()
            .map(|i| self.decrypted[i - 1].clone())
            .collect()
    }

    /// The keys the original master secret derives.
    fn expected(&self) -> ClusterKms {
        kms(&self.secret, &self.salt)
    }
}

fn kms(secret: &[u8], salt: &[u8]) -> ClusterKms {
    ClusterKms::new(
        MasterSecret::new(secret.to_vec()).unwrap(),
        Salt::new(salt.to_vec()).unwrap(),
    )
}

/// `cluster.json` as `init` writes it, for the cluster that `kms` derives.
fn write_cluster_json(workspace: &Path, kms: &ClusterKms, measurement_salt: &[u8; 32]) {
    let secret = kms.data_key(&KeyId::MeasurementSecret, 32).unwrap();
    let id = asterism_kms::derive_cluster_id(&secret, measurement_salt).unwrap();
    std::fs::write(
        workspace.join("cluster.json"),
        format!(
            "{{\"clusterID\": \"{id}\", \"measurementSalt\": \"{}\", \"initEndpoint\": \"127.0.0.1:9000\"}}",
            hex::encode(measurement_salt)
        ),
    )
    .unwrap();
}

/// The crate's error under the CLI's context, if that is what failed.
fn share_error(err: &anyhow::Error) -> &Error {
    err.downcast_ref::<Error>()
        .unwrap_or_else(|| panic!("not a recovery-share error: {err:#}"))
}

fn write_private(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// Rewrites a decrypted share's JSON with `edit`.
fn edit_share(path: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    edit(&mut json);
    write_private(path, &serde_json::to_vec(&json).unwrap());
}

fn args(workspace: &Path, extra: &[&str]) -> Result<recover::Args, clap::Error> {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: recover::Args,
    }
    let workspace = workspace.display().to_string();
    let mut argv = vec![
        "recover",
        "--endpoint",
        "127.0.0.1",
        "--workspace",
        &workspace,
        "--measurements",
        "m.json",
        "--platform-ca",
        "ca.pem",
    ];
    argv.extend_from_slice(extra);
    <Cli as clap::Parser>::try_parse_from(argv).map(|cli| cli.args)
}

#[test]
fn m_decrypted_shares_derive_the_keys_the_master_secret_derives() {
    let custody = Custody::new(2, 3);
    let expected = custody.expected();
    let uuid = DiskUuid::parse("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0").unwrap();
    let want = NodeKeys::derive(&expected, &uuid).unwrap();
    // Any M of the N, in any order; all N too (the extra one is checked, then unused).
    for indices in [&[1, 2][..], &[3, 1], &[2, 3], &[1, 2, 3]] {
        let kms = read_shares(&custody.workspace, &custody.shares(indices)).unwrap();
        let got = NodeKeys::derive(&kms, &uuid).unwrap();
        assert_eq!(
            got.disk_key.expose_secret(),
            want.disk_key.expose_secret(),
            "{indices:?}"
        );
        assert_eq!(
            got.measurement_secret.expose_secret(),
            want.measurement_secret.expose_secret(),
            "{indices:?}"
        );
        check_cluster(&custody.workspace, &kms).unwrap();
    }

    // The same through the flags, as `asterism recover --share A --share B` reads them.
    let (a, b) = (
        custody.decrypted[0].display().to_string(),
        custody.decrypted[2].display().to_string(),
    );
    let kms =
        cluster_kms(&args(&custody.workspace, &["--share", &a, "--share", &b]).unwrap()).unwrap();
    assert_eq!(
        kms.data_key(&KeyId::Disk(uuid.clone()), 32)
            .unwrap()
            .expose_secret(),
        want.disk_key.expose_secret()
    );
}

#[test]
fn fewer_than_m_shares_are_refused_with_how_many_are_needed() {
    let custody = Custody::new(2, 3);
    let err = read_shares(&custody.workspace, &custody.shares(&[2])).unwrap_err();
    assert!(
        matches!(
            share_error(&err),
            Error::TooFewShares {
                needed: 2,
                total: 3,
                given: 1
            }
        ),
        "{err:#}"
    );
    assert!(
        format!("{err:#}").contains("2 of 3 shares needed, 1 given"),
        "{err:#}"
    );
}

#[test]
fn a_share_whose_value_or_threshold_was_changed_is_refused_naming_its_file() {
    let custody = Custody::new(2, 3);
    let tampered = custody.decrypted[0].clone();
    edit_share(&tampered, |json| {
        let mut value = B64.decode(json["value"].as_str().unwrap()).unwrap();
        value[7] ^= 0x01;
        json["value"] = B64.encode(value).into();
    });
    let err = read_shares(&custody.workspace, &custody.shares(&[1, 2])).unwrap_err();
    match share_error(&err) {
        Error::ShareDigest { origin, index: 1 } => {
            assert_eq!(origin, &tampered.display().to_string());
        }
        other => panic!("wrong reason: {other}"),
    }
    assert!(
        format!("{err:#}").contains(&tampered.display().to_string()),
        "{err:#}"
    );

    // M lowered from 3 to 2 in the share's own metadata: its digest no longer matches.
    let custody = Custody::new(3, 3);
    let tampered = custody.decrypted[2].clone();
    edit_share(&tampered, |json| json["threshold"] = 2.into());
    let err = read_shares(&custody.workspace, &custody.shares(&[1, 2, 3])).unwrap_err();
    match share_error(&err) {
        Error::ShareDigest { origin, index: 3 } => {
            assert_eq!(origin, &tampered.display().to_string());
        }
        other => panic!("wrong reason: {other}"),
    }
}

#[test]
fn a_share_of_another_split_of_the_same_secret_is_refused_naming_its_file() {
    let custody = Custody::new(2, 3);
    let other = Custody::of(2, 3, custody.secret.clone(), custody.salt.clone());
    let foreign = other.decrypted[1].clone();
    let err = read_shares(
        &custody.workspace,
        &[custody.decrypted[0].clone(), foreign.clone()],
    )
    .unwrap_err();
    match share_error(&err) {
        Error::OtherShareSet { origin, .. } => {
            assert_eq!(origin, &foreign.display().to_string());
        }
        other => panic!("wrong reason: {other}"),
    }
}

#[test]
fn a_share_given_twice_is_refused_naming_both_files() {
    let custody = Custody::new(2, 3);
    let share = custody.decrypted[1].clone();
    // The same file twice, and a copy of it under another name.
    let copy = custody.dir.join("copy.decrypted.json");
    write_private(&copy, &std::fs::read(&share).unwrap());
    for second in [share.clone(), copy] {
        let err = read_shares(&custody.workspace, &[share.clone(), second.clone()]).unwrap_err();
        match share_error(&err) {
            Error::DuplicateIndex {
                origin,
                first,
                index: 2,
                needed: 2,
            } => {
                assert_eq!(origin, &second.display().to_string());
                assert_eq!(first, &share.display().to_string());
            }
            other => panic!("wrong reason: {other}"),
        }
    }
}

#[test]
fn a_file_that_is_no_decrypted_share_is_refused_naming_it() {
    let custody = Custody::new(2, 3);
    // A master-secret file given as a share.
    let not_a_share = custody.dir.join("master-secret.json");
    write_private(
        &not_a_share,
        format!(
            "{{\"key\": \"{}\", \"salt\": \"{}\"}}",
            B64.encode(&custody.secret),
            B64.encode(&custody.salt)
        )
        .as_bytes(),
    );
    let err = read_shares(
        &custody.workspace,
        &[custody.decrypted[0].clone(), not_a_share.clone()],
    )
    .unwrap_err();
    match share_error(&err) {
        Error::Malformed { origin, what, .. } => {
            assert_eq!(origin, &not_a_share.display().to_string());
            assert_eq!(*what, "decrypted recovery share");
        }
        other => panic!("wrong reason: {other}"),
    }

    // A share still encrypted: named as such, with what to do.
    let encrypted = custody.workspace.join("recovery-shares/share-2-of-3.json");
    std::fs::set_permissions(&encrypted, std::fs::Permissions::from_mode(0o600)).unwrap();
    let err = read_shares(
        &custody.workspace,
        &[custody.decrypted[0].clone(), encrypted.clone()],
    )
    .unwrap_err();
    let text = format!("{err:#}");
    assert!(
        text.contains(&format!(
            "{} is a share still encrypted to its custodian",
            encrypted.display()
        )) && text.contains("asterism recovery-share decrypt"),
        "{text}"
    );
}

#[test]
fn a_share_file_that_the_group_or_others_can_read_is_refused() {
    let custody = Custody::new(2, 3);
    let share = custody.decrypted[1].clone();
    for mode in [0o640, 0o604] {
        std::fs::set_permissions(&share, std::fs::Permissions::from_mode(mode)).unwrap();
        let err = read_shares(&custody.workspace, &custody.shares(&[1, 2])).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{} has mode {mode:o}, readable by others; run `chmod 600 {}`",
                share.display(),
                share.display()
            )
        );
    }
    std::fs::set_permissions(&share, std::fs::Permissions::from_mode(0o400)).unwrap();
    read_shares(&custody.workspace, &custody.shares(&[1, 2])).unwrap();
}

#[test]
fn a_share_file_larger_than_its_cap_is_not_read() {
    let custody = Custody::new(2, 3);
    let big = custody.dir.join("big.decrypted.json");
    write_private(&big, &vec![b' '; 64 * 1024 + 1]);
    let err = read_shares(
        &custody.workspace,
        &[custody.decrypted[0].clone(), big.clone()],
    )
    .unwrap_err();
    match err.downcast_ref::<asterism_binkit::FileError>() {
        Some(asterism_binkit::FileError::TooLarge { path, .. }) => assert_eq!(path, &big),
        _ => panic!("wrong reason: {err:#}"),
    }
}

#[test]
fn a_salt_changed_in_the_record_derives_another_cluster_and_is_refused() {
    // The commitment covers the secret, not the salt; the cluster ID covers both.
    let custody = Custody::new(2, 3);
    let record = custody.workspace.join("recovery.json");
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
    json["salt"] = B64.encode([0x11; 32]).into();
    std::fs::write(&record, serde_json::to_vec(&json).unwrap()).unwrap();
    let kms = read_shares(&custody.workspace, &custody.shares(&[1, 2])).unwrap();
    assert_not_this_clusters(&custody.workspace, &kms);
}

#[test]
fn shares_of_another_clusters_workspace_are_refused_by_the_cluster_check() {
    // Another cluster's record and its shares, copied into this workspace: they agree with
    // each other, so only the cluster ID tells.
    let custody = Custody::new(2, 3);
    let other = Custody::new(2, 3);
    std::fs::copy(
        other.workspace.join("recovery.json"),
        custody.workspace.join("recovery.json"),
    )
    .unwrap();
    let kms = read_shares(&custody.workspace, &other.shares(&[1, 2])).unwrap();
    assert_not_this_clusters(&custody.workspace, &kms);
}

#[test]
fn a_workspace_that_keeps_only_shares_asks_for_m_of_them() {
    let custody = Custody::new(3, 5);
    let err = cluster_kms(&args(&custody.workspace, &[]).unwrap()).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{} keeps no master-secret.json, only the custodians' shares (3 of 5 needed): have 3 \
             custodians decrypt theirs with `asterism recovery-share decrypt` and give each with \
             --share FILE",
            custody.workspace.display()
        )
    );

    // Neither file: says which are missing and what to give.
    std::fs::remove_file(custody.workspace.join("recovery.json")).unwrap();
    let err = cluster_kms(&args(&custody.workspace, &[]).unwrap()).unwrap_err();
    assert!(
        err.to_string().contains(
            "has neither master-secret.json nor recovery.json: give the master secret with \
             --master-secret FILE, or custodians' decrypted shares with --share FILE"
        ),
        "{err:#}"
    );
}

#[test]
fn the_master_secret_file_is_still_read_when_the_workspace_has_one() {
    let custody = Custody::new(2, 3);
    write_private(
        &custody.workspace.join("master-secret.json"),
        format!(
            "{{\"key\": \"{}\", \"salt\": \"{}\"}}",
            B64.encode(&custody.secret),
            B64.encode(&custody.salt)
        )
        .as_bytes(),
    );
    let kms = cluster_kms(&args(&custody.workspace, &[]).unwrap()).unwrap();
    check_cluster(&custody.workspace, &kms).unwrap();
}

#[test]
fn shares_and_a_master_secret_file_are_not_given_together() {
    let err = match args(
        Path::new("ws"),
        &["--share", "a.json", "--master-secret", "m.json"],
    ) {
        Ok(_) => panic!("--share and --master-secret were accepted together"),
        Err(e) => e,
    };
    assert_eq!(err.kind(), clap::error::ErrorKind::ArgumentConflict);
}

/// The cluster check refuses `kms` for `workspace`: its master secret is another's.
fn assert_not_this_clusters(workspace: &Path, kms: &ClusterKms) {
    let err = check_cluster(workspace, kms).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("the master secret is not this workspace's"),
        "{err:#}"
    );
}

//! Split, encrypt, decrypt and reconstruct, with real age and SSH keys, and every way a
//! share can be wrong refused with its own reason.

#![cfg(test)] // all of it test code: clippy.toml's test allowances cover its helpers too

use age::secrecy::ExposeSecret as _;
use asterism_kms::{MasterSecret, Salt};
use asterism_recovery_shares::{
    Custodian, CustodianIdentity, DecryptedShareFile, EncryptedShareFile, Error, RecoveryRecord,
    Split, Threshold, decrypt_share, reconstruct, split,
};

/// An age X25519 key pair: (public recipient file text, identity file text).
fn age_keys() -> (String, String) {
    let identity = age::x25519::Identity::generate();
    (
        identity.to_public().to_string(),
        identity.to_string().expose_secret().to_owned(),
    )
}

/// An SSH Ed25519 key pair from a fixed seed: (public key line, OpenSSH private key).
fn ssh_keys(seed: u8) -> (String, String) {
    let keypair = ssh_key::private::Ed25519Keypair::from_seed(&[seed; 32]);
    let private = ssh_key::PrivateKey::from(keypair);
    (
        private.public_key().to_openssh().unwrap(),
        private
            .to_openssh(ssh_key::LineEnding::LF)
            .unwrap()
            .to_string(),
    )
}

struct Fixture {
    secret: MasterSecret,
    split: Split,
    identities: Vec<CustodianIdentity>,
}

/// Splits a fresh secret M-of-N to age custodians.
fn fixture(m: u8, n: u8) -> Fixture {
    let keys: Vec<(String, String)> = (0..n).map(|_| age_keys()).collect();
    let custodians: Vec<Custodian> = keys
        .iter()
        .enumerate()
        .map(|(i, (public, _))| Custodian::parse(public, &format!("custodian-{i}.pub")).unwrap())
        .collect();
    let identities = keys
        .iter()
        .enumerate()
        .map(|(i, (_, private))| {
            CustodianIdentity::from_bytes(private.as_bytes(), &format!("custodian-{i}.key"))
                .unwrap()
        })
        .collect();
    let secret = MasterSecret::generate().unwrap();
    let salt = Salt::generate().unwrap();
    let split = split(&secret, &salt, Threshold::new(m, n).unwrap(), &custodians).unwrap();
    Fixture {
        secret,
        split,
        identities,
    }
}

/// Share `index` (1-based) decrypted by its custodian, as read back from its file.
fn decrypted(f: &Fixture, index: u8) -> DecryptedShareFile {
    let i = usize::from(index - 1);
    let file =
        EncryptedShareFile::from_json(&f.split.shares[i].to_json(), &f.split.shares[i].file_name())
            .unwrap();
    let share = decrypt_share(&file, &f.identities[i]).unwrap();
    let name = format!("share-{index}.decrypted.json");
    DecryptedShareFile::from_json(&share.to_json(), &name).unwrap()
}

/// The workspace's record, as read back from `recovery.json`.
fn record(f: &Fixture) -> RecoveryRecord {
    RecoveryRecord::from_json(&f.split.record.to_json(), "recovery.json").unwrap()
}

/// Rewrites a decrypted share through its JSON.
fn edit(
    share: &DecryptedShareFile,
    change: impl FnOnce(&mut serde_json::Value),
) -> DecryptedShareFile {
    let mut json: serde_json::Value = serde_json::from_slice(&share.to_json()).unwrap();
    change(&mut json);
    DecryptedShareFile::from_json(&serde_json::to_vec(&json).unwrap(), share.origin()).unwrap()
}

/// Flips bit 0 of byte `at` of the share's value.
fn flip_value_bit(share: &DecryptedShareFile, at: usize) -> DecryptedShareFile {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    edit(share, |json| {
        let mut value = b64.decode(json["value"].as_str().unwrap()).unwrap();
        value[at] ^= 1;
        json["value"] = b64.encode(value).into();
    })
}

#[test]
fn any_m_of_n_shares_give_the_secret_back() {
    for (m, n) in [(2u8, 2u8), (2, 3), (3, 5), (5, 5)] {
        let f = fixture(m, n);
        let record = record(&f);
        let all: Vec<u8> = (1..=n).collect();
        // Every M-subset of the N shares, by bitmask.
        for mask in 0u32..(1 << n) {
            if mask.count_ones() != u32::from(m) {
                continue;
            }
            let shares: Vec<DecryptedShareFile> = all
                .iter()
                .filter(|&&i| mask >> (i - 1) & 1 == 1)
                .map(|&i| decrypted(&f, i))
                .collect();
            let secret = reconstruct(&shares, &record).unwrap();
            assert_eq!(secret, f.secret, "{m}-of-{n}, shares {mask:b}");
        }
    }
}

#[test]
fn two_hundred_fifty_five_shares_work_at_the_edge() {
    // N = 255, the largest x coordinate in GF(256); M = 255 uses every one of them.
    let secret = MasterSecret::generate().unwrap();
    let salt = Salt::generate().unwrap();
    let (public, private) = age_keys();
    let custodian = Custodian::parse(&public, "custodian.pub").unwrap();
    let identity = CustodianIdentity::from_bytes(private.as_bytes(), "custodian.key").unwrap();
    for m in [2u8, 255] {
        let custodians = vec![custodian.clone(); 255];
        let split = split(&secret, &salt, Threshold::new(m, 255).unwrap(), &custodians).unwrap();
        let shares: Vec<DecryptedShareFile> = split
            .shares
            .iter()
            .rev()
            .take(usize::from(m))
            .map(|s| decrypt_share(s, &identity).unwrap())
            .collect();
        assert_eq!(reconstruct(&shares, &split.record).unwrap(), secret);
    }
}

#[test]
fn m_minus_one_shares_are_refused_with_how_many_are_needed() {
    let f = fixture(2, 3);
    let err = reconstruct(&[decrypted(&f, 3)], &record(&f)).unwrap_err();
    assert!(
        matches!(
            err,
            Error::TooFewShares {
                needed: 2,
                total: 3,
                given: 1
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.to_string(), "2 of 3 shares needed, 1 given");
}

#[test]
fn a_flipped_bit_in_a_share_value_is_refused_naming_the_share() {
    let f = fixture(2, 3);
    for at in [0, 31] {
        let tampered = flip_value_bit(&decrypted(&f, 2), at);
        let err = reconstruct(&[decrypted(&f, 1), tampered], &record(&f)).unwrap_err();
        assert!(
            matches!(&err, Error::ShareDigest { origin, index: 2 } if origin == "share-2.decrypted.json"),
            "{err:?}"
        );
    }
}

#[test]
fn a_changed_index_threshold_or_total_is_refused_by_the_share_digest() {
    let f = fixture(2, 3);
    let record = record(&f);
    // Index 2 relabelled as 3: a valid index whose recorded digest is another share's.
    let relabelled = edit(&decrypted(&f, 2), |j| j["index"] = 3.into());
    let err = reconstruct(&[decrypted(&f, 1), relabelled], &record).unwrap_err();
    assert!(
        matches!(err, Error::ShareDigest { index: 3, .. }),
        "{err:?}"
    );
    // M and N changed in the share: its digest covers them.
    for (field, value) in [("threshold", 3), ("shares", 4)] {
        let changed = edit(&decrypted(&f, 2), |j| j[field] = value.into());
        let err = reconstruct(&[decrypted(&f, 1), changed], &record).unwrap_err();
        assert!(
            matches!(err, Error::ShareDigest { index: 2, .. }),
            "{field}: {err:?}"
        );
    }
}

#[test]
fn a_changed_share_set_is_refused_as_another_secret() {
    let f = fixture(2, 3);
    let changed = edit(&decrypted(&f, 2), |j| {
        let set = j["shareSet"].as_str().unwrap().to_owned();
        let flipped = format!(
            "{}{}",
            if set.starts_with('0') { "1" } else { "0" },
            &set[1..]
        );
        j["shareSet"] = flipped.into();
    });
    let err = reconstruct(&[decrypted(&f, 1), changed], &record(&f)).unwrap_err();
    assert!(
        matches!(&err, Error::OtherShareSet { origin, .. } if origin == "share-2.decrypted.json"),
        "{err:?}"
    );
}

#[test]
fn a_share_of_another_secret_is_refused() {
    let ours = fixture(2, 3);
    let theirs = fixture(2, 3);
    let err = reconstruct(
        &[decrypted(&ours, 1), decrypted(&theirs, 2)],
        &record(&ours),
    )
    .unwrap_err();
    assert!(matches!(err, Error::OtherShareSet { .. }), "{err:?}");
}

#[test]
fn a_duplicated_index_is_refused_naming_both_files() {
    let f = fixture(2, 3);
    let again = decrypted(&f, 1).with_origin("copy-of-share-1.json");
    let err = reconstruct(&[decrypted(&f, 1), again], &record(&f)).unwrap_err();
    assert!(
        matches!(&err, Error::DuplicateIndex { origin, first, index: 1, needed: 2 }
            if origin == "copy-of-share-1.json" && first == "share-1.decrypted.json"),
        "{err:?}"
    );
}

#[test]
fn an_index_outside_the_split_is_refused() {
    let f = fixture(2, 3);
    let out = edit(&decrypted(&f, 2), |j| j["index"] = 4.into());
    let err = reconstruct(&[decrypted(&f, 1), out], &record(&f)).unwrap_err();
    assert!(
        matches!(
            err,
            Error::IndexOutOfRange {
                index: 4,
                total: 3,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn a_changed_secret_commitment_in_the_workspace_is_detected_after_reconstruction() {
    let f = fixture(2, 3);
    let mut json: serde_json::Value = serde_json::from_slice(&f.split.record.to_json()).unwrap();
    json["secretCommitment"] = hex::encode([7u8; 32]).into();
    let record =
        RecoveryRecord::from_json(&serde_json::to_vec(&json).unwrap(), "recovery.json").unwrap();
    let err = reconstruct(&[decrypted(&f, 1), decrypted(&f, 2)], &record).unwrap_err();
    assert!(matches!(err, Error::SecretCommitment), "{err:?}");
}

#[test]
fn the_wrong_custodian_key_does_not_decrypt() {
    let f = fixture(2, 3);
    let err = decrypt_share(&f.split.shares[0], &f.identities[1]).unwrap_err();
    assert!(
        matches!(&err, Error::NotForThisIdentity { origin, identity }
            if origin == "share 1" && identity == "custodian-1.key"),
        "{err:?}"
    );
}

#[test]
fn an_envelope_relabelled_as_another_share_is_refused_on_decryption() {
    let f = fixture(2, 3);
    let mut json: serde_json::Value = serde_json::from_slice(&f.split.shares[0].to_json()).unwrap();
    json["index"] = 2.into();
    let file =
        EncryptedShareFile::from_json(&serde_json::to_vec(&json).unwrap(), "share-1-of-3.json")
            .unwrap();
    let err = decrypt_share(&file, &f.identities[0]).unwrap_err();
    assert!(matches!(err, Error::EnvelopeMismatch { .. }), "{err:?}");
}

#[test]
fn a_corrupted_ciphertext_is_refused() {
    let f = fixture(2, 3);
    let mut json: serde_json::Value = serde_json::from_slice(&f.split.shares[0].to_json()).unwrap();
    let ciphertext = json["ciphertext"].as_str().unwrap().to_owned();
    // Change one base64 character in the last line of the payload.
    let lines: Vec<&str> = ciphertext.lines().collect();
    let target = lines.len() - 2;
    let changed: Vec<String> = lines
        .iter()
        .enumerate()
        .map(|(i, l)| {
            if i == target {
                let first = if l.starts_with('A') { "B" } else { "A" };
                format!("{first}{}", &l[1..])
            } else {
                (*l).to_owned()
            }
        })
        .collect();
    json["ciphertext"] = (changed.join("\n") + "\n").into();
    let file =
        EncryptedShareFile::from_json(&serde_json::to_vec(&json).unwrap(), "share-1-of-3.json")
            .unwrap();
    let err = decrypt_share(&file, &f.identities[0]).unwrap_err();
    assert!(matches!(err, Error::Decrypt { .. }), "{err:?}");
}

#[test]
fn ssh_ed25519_custodians_round_trip() {
    let keys: Vec<(String, String)> = (1..=3).map(ssh_keys).collect();
    let custodians: Vec<Custodian> = keys
        .iter()
        .map(|(public, _)| Custodian::parse(public, "id_ed25519.pub").unwrap())
        .collect();
    let secret = MasterSecret::generate().unwrap();
    let salt = Salt::generate().unwrap();
    let split = split(&secret, &salt, Threshold::new(2, 3).unwrap(), &custodians).unwrap();
    let shares: Vec<DecryptedShareFile> = [0usize, 2]
        .iter()
        .map(|&i| {
            let identity =
                CustodianIdentity::from_bytes(keys[i].1.as_bytes(), "id_ed25519").unwrap();
            decrypt_share(&split.shares[i], &identity).unwrap()
        })
        .collect();
    assert_eq!(reconstruct(&shares, &split.record).unwrap(), secret);
    // Another SSH key does not open it.
    let other = CustodianIdentity::from_bytes(keys[1].1.as_bytes(), "other").unwrap();
    let err = decrypt_share(&split.shares[0], &other).unwrap_err();
    assert!(matches!(err, Error::NotForThisIdentity { .. }), "{err:?}");
}

#[test]
fn the_record_keeps_the_salt_and_the_custodians() {
    let f = fixture(2, 3);
    let record = record(&f);
    assert_eq!(record.threshold(), Threshold::new(2, 3).unwrap());
    assert_eq!(record.custodians().count(), 3);
    let salt = record.salt().unwrap();
    assert_eq!(salt.len(), 32);
    assert!(!format!("{record:?}").contains(&hex::encode(salt.expose_secret())));
    assert!(format!("{record:?}").contains("<redacted>"));
    // Nothing of the secret in it, nor in the encrypted shares.
    let text = String::from_utf8(f.split.record.to_json()).unwrap();
    assert!(!text.contains(&hex::encode(f.secret.expose_secret())));
}

#[test]
fn thresholds_parse_and_refuse_nonsense() {
    assert_eq!(
        "3-of-5".parse::<Threshold>().unwrap(),
        Threshold::new(3, 5).unwrap()
    );
    for bad in ["1-of-3", "4-of-3", "3of5", "0-of-0", "2-of-256", "x-of-3"] {
        assert!(
            matches!(bad.parse::<Threshold>(), Err(Error::Threshold { .. })),
            "{bad}"
        );
    }
}

#[test]
fn custodian_keys_of_other_kinds_are_refused() {
    for bad in [
        "",
        "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQ user@host",
        "age1notakey",
        "AGE-SECRET-KEY-1XYZ",
    ] {
        assert!(
            matches!(
                Custodian::parse(bad, "key.pub"),
                Err(Error::Custodian { .. })
            ),
            "{bad:?}"
        );
    }
    let (a, _) = age_keys();
    let (b, _) = age_keys();
    let two = format!("{a}\n{b}\n");
    assert!(matches!(
        Custodian::parse(&two, "key.pub"),
        Err(Error::Custodian { .. })
    ));
}

#[test]
fn the_wrong_number_of_custodians_is_refused() {
    let (public, _) = age_keys();
    let custodian = Custodian::parse(&public, "c.pub").unwrap();
    let err = split(
        &MasterSecret::generate().unwrap(),
        &Salt::generate().unwrap(),
        Threshold::new(2, 3).unwrap(),
        &[custodian.clone(), custodian],
    )
    .unwrap_err();
    assert!(
        matches!(err, Error::CustodianCount { given: 2, .. }),
        "{err:?}"
    );
}

#[test]
fn decrypted_shares_hide_their_value_in_debug() {
    let f = fixture(2, 3);
    let text = format!("{:?}", decrypted(&f, 1));
    assert!(text.contains("<redacted>"), "{text}");
}

/// A test-only OpenSSH Ed25519 key protected by the passphrase "test passphrase".
const PASSPHRASE_PROTECTED_SSH_KEY: &str = "-----BEGIN OPENSSH PRIVATE KEY-----
b3BlbnNzaC1rZXktdjEAAAAACmFlczI1Ni1jdHIAAAAGYmNyeXB0AAAAGAAAABBHzUp9y9
qPImtPuPr4z+/8AAAAEAAAAAEAAAAzAAAAC3NzaC1lZDI1NTE5AAAAIM/kgmjv+3oEZ9K5
6QQ3DW1Rgb2rqDCschI2HY6/yOQJAAAAwIWOT5ssKfvk1CpsDs9K2pAY3Jmt5I2iBDs+VG
6hRF+uNDv+Qgrjn00Ik0qs5VNAjZ35oSHNikzSso8oqdx24F5n5jeZgrus5kkZ3kNJ3n67
fUgJq7f3m5kKI1gnBMsxI4Np+YKa5oBdHjtr9LYGJMxxHpD+lLkl4vHVuPVDNSLI+kO2Dz
3FgYUCASNrP3lf2bOGoHD4wTj161RXNf1lvugN31mDLgKWp9mtK93vHVkfNugjjAHfuE3A
NNVWaTslmA==
-----END OPENSSH PRIVATE KEY-----
";

#[test]
fn a_passphrase_protected_ssh_key_is_refused_with_how_to_use_it() {
    let err = CustodianIdentity::from_bytes(PASSPHRASE_PROTECTED_SSH_KEY.as_bytes(), "id_ed25519")
        .unwrap_err();
    assert!(
        matches!(&err, Error::Identity { origin, reason }
            if origin == "id_ed25519" && reason.contains("passphrase") && reason.contains("ssh-keygen -p")),
        "{err:?}"
    );
}

#[test]
fn garbage_identities_are_refused() {
    for bad in [
        "",
        "AGE-SECRET-KEY-1NOTAKEY",
        "-----BEGIN OPENSSH PRIVATE KEY-----\nxx\n",
    ] {
        let err = CustodianIdentity::from_bytes(bad.as_bytes(), "key").unwrap_err();
        assert!(matches!(err, Error::Identity { .. }), "{bad:?}: {err:?}");
    }
}

#[test]
fn one_kind_of_file_is_never_taken_for_another() {
    let f = fixture(2, 3);
    let encrypted = f.split.shares[0].to_json();
    let err = DecryptedShareFile::from_json(&encrypted, "share-1-of-3.json").unwrap_err();
    assert!(matches!(err, Error::Malformed { .. }), "{err:?}");
    let decrypted = decrypted(&f, 1).to_json();
    let err = EncryptedShareFile::from_json(&decrypted, "d.json").unwrap_err();
    assert!(matches!(err, Error::Malformed { .. }), "{err:?}");
    let err = RecoveryRecord::from_json(&decrypted, "d.json").unwrap_err();
    assert!(matches!(err, Error::Malformed { .. }), "{err:?}");
    // Same fields, another kind or version.
    for (field, value) in [
        (
            "kind",
            serde_json::json!("asterism-recovery-share-encrypted"),
        ),
        ("version", serde_json::json!(2)),
    ] {
        let mut json: serde_json::Value = serde_json::from_slice(&decrypted).unwrap();
        json[field] = value;
        let err = DecryptedShareFile::from_json(&serde_json::to_vec(&json).unwrap(), "d.json")
            .unwrap_err();
        assert!(
            matches!(&err, Error::Malformed { reason, .. } if reason.contains(field) || reason.contains("version")),
            "{field}: {err:?}"
        );
    }
}

#[test]
fn a_record_with_an_absurd_secret_length_is_refused() {
    let f = fixture(2, 3);
    let mut json: serde_json::Value = serde_json::from_slice(&f.split.record.to_json()).unwrap();
    json["secretLength"] = (1usize << 40).into();
    let err = RecoveryRecord::from_json(&serde_json::to_vec(&json).unwrap(), "recovery.json")
        .unwrap_err();
    assert!(
        matches!(&err, Error::Malformed { reason, .. } if reason.contains("secretLength")),
        "{err:?}"
    );
}

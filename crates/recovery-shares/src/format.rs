//! The files: the workspace's `recovery.json`, a custodian's encrypted share, and a
//! decrypted share. All JSON, each with a `version` and a `kind` so that one is never taken
//! for another.

use crate::{Error, Threshold};
use asterism_kms::{MasterSecret, Salt, SecretError};
use base64::Engine as _;
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};
use std::fmt;
use zeroize::{Zeroize, Zeroizing};

/// The longest master secret a record may describe: reconstruction allocates this much, and
/// generated secrets are 32 bytes.
const MAX_SECRET_LEN: usize = 1024;

/// The version of every file format here.
const VERSION: u32 = 1;
const KIND_RECORD: &str = "asterism-recovery";
const KIND_ENCRYPTED: &str = "asterism-recovery-share-encrypted";
const KIND_DECRYPTED: &str = "asterism-recovery-share";

/// Domain separation of the share digests and of the secret commitment.
const SHARE_DIGEST_DOMAIN: &[u8] = b"asterism recovery share digest v1\0";
const SECRET_COMMITMENT_DOMAIN: &[u8] = b"asterism recovery secret commitment v1\0";

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Names one split of one secret: 32 random bytes chosen by [`crate::split`]. Every share
/// and the record carry it, so that a share of another secret (another cluster, or an
/// earlier split of the same one) is told apart from a corrupted one.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ShareSetId([u8; 32]);

impl ShareSetId {
    pub(crate) fn generate() -> Result<Self, Error> {
        let mut bytes = [0u8; 32];
        SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| Error::Random)?;
        Ok(Self(bytes))
    }

    fn parse(text: &str, origin: &str, what: &'static str) -> Result<Self, Error> {
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(text, &mut bytes).map_err(|e| Error::Malformed {
            origin: origin.to_owned(),
            what,
            reason: format!("shareSet is not 32 bytes of hex: {e}"),
        })?;
        Ok(Self(bytes))
    }
}

impl fmt::Display for ShareSetId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for ShareSetId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ShareSetId({self})")
    }
}

/// HMAC-SHA-256 keyed with the secret over the share set: a commitment that binds the
/// secret to this split. The secret is 32 random bytes, so even a bare SHA-256 of it could
/// not be inverted or guessed; the key and the domain keep this value unrelated to any other
/// hash of the secret and tie it to one share set.
pub(crate) fn commit_to_secret(secret: &[u8], set: &ShareSetId) -> [u8; 32] {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
    let mut ctx = hmac::Context::with_key(&key);
    ctx.update(SECRET_COMMITMENT_DOMAIN);
    ctx.update(&set.0);
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.sign().as_ref());
    out
}

fn malformed(origin: &str, what: &'static str, reason: impl fmt::Display) -> Error {
    Error::Malformed {
        origin: origin.to_owned(),
        what,
        reason: reason.to_string(),
    }
}

fn check_header(
    version: u32,
    kind: &str,
    want: &str,
    origin: &str,
    what: &'static str,
) -> Result<(), Error> {
    if kind != want {
        return Err(malformed(
            origin,
            what,
            format!("its kind is {kind:?}, want {want:?}"),
        ));
    }
    if version != VERSION {
        return Err(malformed(
            origin,
            what,
            format!("format version {version}, this tool reads {VERSION}"),
        ));
    }
    Ok(())
}

fn threshold_of(m: u8, n: u8, origin: &str, what: &'static str) -> Result<Threshold, Error> {
    Threshold::new(m, n).map_err(|e| malformed(origin, what, e))
}

/// One share in the clear, as a custodian decrypted it. Secret: not `Clone`, no `Serialize`
/// (only [`DecryptedShareFile::to_json`] into zeroizing memory), `Debug` hides the value.
pub struct DecryptedShareFile {
    origin: String,
    set: ShareSetId,
    index: u8,
    threshold: Threshold,
    value: Zeroizing<Vec<u8>>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct DecryptedJson {
    version: u32,
    kind: String,
    share_set: String,
    index: u8,
    threshold: u8,
    shares: u8,
    value: String,
}

impl DecryptedShareFile {
    pub(crate) fn new(
        set: ShareSetId,
        index: u8,
        threshold: Threshold,
        value: Zeroizing<Vec<u8>>,
    ) -> Self {
        Self {
            origin: format!("share {index}"),
            set,
            index,
            threshold,
            value,
        }
    }

    /// Parses a decrypted share; `origin` (its file name) is what errors will name.
    pub fn from_json(bytes: &[u8], origin: &str) -> Result<Self, Error> {
        const WHAT: &str = "decrypted recovery share";
        let mut json: DecryptedJson =
            serde_json::from_slice(bytes).map_err(|e| malformed(origin, WHAT, e))?;
        let value = B64.decode(json.value.as_bytes());
        json.value.zeroize();
        let value = Zeroizing::new(value.map_err(|e| malformed(origin, WHAT, e))?);
        check_header(json.version, &json.kind, KIND_DECRYPTED, origin, WHAT)?;
        Ok(Self {
            origin: origin.to_owned(),
            set: ShareSetId::parse(&json.share_set, origin, WHAT)?,
            index: json.index,
            threshold: threshold_of(json.threshold, json.shares, origin, WHAT)?,
            value,
        })
    }

    /// The share as JSON, in zeroizing memory, for a file of mode 0600.
    pub fn to_json(&self) -> Zeroizing<Vec<u8>> {
        let mut json = DecryptedJson {
            version: VERSION,
            kind: KIND_DECRYPTED.to_owned(),
            share_set: self.set.to_string(),
            index: self.index,
            threshold: self.threshold.needed(),
            shares: self.threshold.total(),
            value: B64.encode(self.value.as_slice()),
        };
        let mut out = serde_json::to_vec_pretty(&json).unwrap_or_default();
        json.value.zeroize();
        out.push(b'\n');
        Zeroizing::new(out)
    }

    /// Renames the origin that errors will name (for example, the file it was read from).
    #[must_use]
    pub fn with_origin(mut self, origin: &str) -> Self {
        origin.clone_into(&mut self.origin);
        self
    }

    /// Where the share came from, as errors name it.
    #[must_use]
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The split this share belongs to.
    #[must_use]
    pub fn share_set(&self) -> ShareSetId {
        self.set
    }

    /// Its index, 1..=N (the x coordinate).
    #[must_use]
    pub fn index(&self) -> u8 {
        self.index
    }

    /// M-of-N, as the share says.
    #[must_use]
    pub fn threshold(&self) -> Threshold {
        self.threshold
    }

    pub(crate) fn value(&self) -> &[u8] {
        &self.value
    }

    /// SHA-256 over the domain, the share set, the index, M, N and the value.
    pub(crate) fn digest(&self) -> [u8; 32] {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(SHARE_DIGEST_DOMAIN);
        ctx.update(&self.set.0);
        ctx.update(&[self.index, self.threshold.needed(), self.threshold.total()]);
        ctx.update(&(self.value.len() as u64).to_be_bytes());
        ctx.update(&self.value);
        let mut out = [0u8; 32];
        out.copy_from_slice(ctx.finish().as_ref());
        out
    }
}

impl fmt::Debug for DecryptedShareFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DecryptedShareFile")
            .field("origin", &self.origin)
            .field("share_set", &self.set)
            .field("index", &self.index)
            .field("threshold", &self.threshold)
            .field("value", &"<redacted>")
            .finish()
    }
}

/// One share encrypted to its custodian: public labels and an ASCII-armored age file whose
/// plaintext is the [`DecryptedShareFile`] JSON. The labels are for people; the decrypted
/// contents are what counts, and decryption checks that the two agree.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EncryptedShareFile {
    version: u32,
    kind: String,
    share_set: String,
    index: u8,
    threshold: u8,
    shares: u8,
    custodian: String,
    ciphertext: String,
    #[serde(skip)]
    origin: String,
}

impl EncryptedShareFile {
    pub(crate) fn new(share: &DecryptedShareFile, custodian: String, ciphertext: String) -> Self {
        Self {
            version: VERSION,
            kind: KIND_ENCRYPTED.to_owned(),
            share_set: share.set.to_string(),
            index: share.index,
            threshold: share.threshold.needed(),
            shares: share.threshold.total(),
            custodian,
            ciphertext,
            origin: format!("share {}", share.index),
        }
    }

    /// Parses an encrypted share; `origin` (its file name) is what errors will name.
    pub fn from_json(bytes: &[u8], origin: &str) -> Result<Self, Error> {
        const WHAT: &str = "encrypted recovery share";
        let mut file: Self =
            serde_json::from_slice(bytes).map_err(|e| malformed(origin, WHAT, e))?;
        check_header(file.version, &file.kind, KIND_ENCRYPTED, origin, WHAT)?;
        ShareSetId::parse(&file.share_set, origin, WHAT)?;
        origin.clone_into(&mut file.origin);
        Ok(file)
    }

    /// The file's JSON.
    #[must_use]
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(self).unwrap_or_default();
        out.push(b'\n');
        out
    }

    /// Where the share came from, as errors name it.
    #[must_use]
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Its index, 1..=N.
    #[must_use]
    pub fn index(&self) -> u8 {
        self.index
    }

    /// The custodian's public key it is encrypted to, as given at split time.
    #[must_use]
    pub fn custodian(&self) -> &str {
        &self.custodian
    }

    /// A file name for it: `share-<index>-of-<N>.json`.
    #[must_use]
    pub fn file_name(&self) -> String {
        format!("share-{}-of-{}.json", self.index, self.shares)
    }

    pub(crate) fn ciphertext(&self) -> &str {
        &self.ciphertext
    }

    /// What the labels say, for comparison with the decrypted contents.
    pub(crate) fn label(&self) -> String {
        format!(
            "share {} of {}-of-{} in set {}",
            self.index, self.threshold, self.shares, self.share_set
        )
    }
}

/// Describes a decrypted share the way [`EncryptedShareFile::label`] describes its envelope.
pub(crate) fn label_of(share: &DecryptedShareFile) -> String {
    format!(
        "share {} of {} in set {}",
        share.index, share.threshold, share.set
    )
}

/// The workspace's `recovery.json`: how the master secret was split, to whom, a digest of
/// every share and a commitment to the secret. Public: it gives nothing about the secret.
/// `Debug` leaves out the salt, which the key service treats as a secret too.
pub struct RecoveryRecord {
    set: ShareSetId,
    threshold: Threshold,
    secret_len: usize,
    secret_commitment: [u8; 32],
    salt: Zeroizing<Vec<u8>>,
    custodians: Vec<(String, [u8; 32])>,
}

impl fmt::Debug for RecoveryRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecoveryRecord")
            .field("share_set", &self.set)
            .field("threshold", &self.threshold)
            .field("secret_len", &self.secret_len)
            .field("salt", &"<redacted>")
            .field("custodians", &self.custodians().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RecordJson {
    version: u32,
    kind: String,
    share_set: String,
    threshold: u8,
    shares: u8,
    secret_length: usize,
    secret_commitment: String,
    salt: String,
    custodians: Vec<CustodianJson>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CustodianJson {
    index: u8,
    recipient: String,
    share_digest: String,
}

impl RecoveryRecord {
    pub(crate) fn new(
        set: ShareSetId,
        threshold: Threshold,
        secret_len: usize,
        secret_commitment: [u8; 32],
        salt: &Salt,
        custodians: Vec<(String, [u8; 32])>,
    ) -> Self {
        Self {
            set,
            threshold,
            secret_len,
            secret_commitment,
            salt: Zeroizing::new(salt.expose_secret().to_vec()),
            custodians,
        }
    }

    /// Parses `recovery.json`; `origin` (its file name) is what errors will name.
    pub fn from_json(bytes: &[u8], origin: &str) -> Result<Self, Error> {
        const WHAT: &str = "recovery record";
        let json: RecordJson =
            serde_json::from_slice(bytes).map_err(|e| malformed(origin, WHAT, e))?;
        check_header(json.version, &json.kind, KIND_RECORD, origin, WHAT)?;
        let threshold = threshold_of(json.threshold, json.shares, origin, WHAT)?;
        if !(MasterSecret::MIN_LEN..=MAX_SECRET_LEN).contains(&json.secret_length) {
            return Err(malformed(
                origin,
                WHAT,
                format!(
                    "secretLength {} is outside {}..={MAX_SECRET_LEN}",
                    json.secret_length,
                    MasterSecret::MIN_LEN
                ),
            ));
        }
        if json.custodians.len() != usize::from(threshold.total()) {
            return Err(malformed(
                origin,
                WHAT,
                format!(
                    "{} custodians listed for {} shares",
                    json.custodians.len(),
                    threshold.total()
                ),
            ));
        }
        let hex32 = |text: &str, field: &str| {
            let mut out = [0u8; 32];
            hex::decode_to_slice(text, &mut out)
                .map(|()| out)
                .map_err(|e| {
                    malformed(origin, WHAT, format!("{field} is not 32 bytes of hex: {e}"))
                })
        };
        let mut custodians = Vec::with_capacity(json.custodians.len());
        for (position, c) in (1u8..).zip(&json.custodians) {
            if c.index != position {
                return Err(malformed(
                    origin,
                    WHAT,
                    format!("custodian {position} has index {}", c.index),
                ));
            }
            custodians.push((c.recipient.clone(), hex32(&c.share_digest, "shareDigest")?));
        }
        Ok(Self {
            set: ShareSetId::parse(&json.share_set, origin, WHAT)?,
            threshold,
            secret_len: json.secret_length,
            secret_commitment: hex32(&json.secret_commitment, "secretCommitment")?,
            salt: Zeroizing::new(
                B64.decode(json.salt.as_bytes())
                    .map_err(|e| malformed(origin, WHAT, format!("salt: {e}")))?,
            ),
            custodians,
        })
    }

    /// The record's JSON.
    #[must_use]
    pub fn to_json(&self) -> Vec<u8> {
        let json = RecordJson {
            version: VERSION,
            kind: KIND_RECORD.to_owned(),
            share_set: self.set.to_string(),
            threshold: self.threshold.needed(),
            shares: self.threshold.total(),
            secret_length: self.secret_len,
            secret_commitment: hex::encode(self.secret_commitment),
            salt: B64.encode(self.salt.as_slice()),
            custodians: (1u8..)
                .zip(&self.custodians)
                .map(|(index, (recipient, digest))| CustodianJson {
                    index,
                    recipient: recipient.clone(),
                    share_digest: hex::encode(digest),
                })
                .collect(),
        };
        let mut out = serde_json::to_vec_pretty(&json).unwrap_or_default();
        out.push(b'\n');
        out
    }

    /// The split this record describes.
    #[must_use]
    pub fn share_set(&self) -> ShareSetId {
        self.set
    }

    /// M-of-N.
    #[must_use]
    pub fn threshold(&self) -> Threshold {
        self.threshold
    }

    /// The length of the master secret in bytes.
    #[must_use]
    pub fn secret_len(&self) -> usize {
        self.secret_len
    }

    /// The cluster's salt, which goes with the master secret into every key derivation.
    pub fn salt(&self) -> Result<Salt, SecretError> {
        Salt::new(self.salt.to_vec())
    }

    /// The custodians' public keys, share 1 first.
    pub fn custodians(&self) -> impl Iterator<Item = &str> {
        self.custodians.iter().map(|(c, _)| c.as_str())
    }

    pub(crate) fn secret_commitment(&self) -> &[u8; 32] {
        &self.secret_commitment
    }

    /// The digest recorded for share `index` (1..=N).
    pub(crate) fn share_digest(&self, index: u8) -> Option<&[u8; 32]> {
        let position = usize::from(index).checked_sub(1)?;
        self.custodians.get(position).map(|(_, d)| d)
    }
}

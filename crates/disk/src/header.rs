//! The LUKS2 header rules and the state-disk token, as pure
//! functions over the JSON metadata that `cryptsetup luksDump --dump-json-metadata` prints.
//!
//! [`validate_header`] parses the metadata with strict types (an unknown field anywhere is an
//! error) and checks every rule; only then does it return a [`ValidatedHeader`], which no
//! other code can construct. The rules are those of the reference, adapted to what this crate
//! formats and tightened where the reference leaves room:
//!
//! * keyslots: 1 to [`MAX_KEYSLOTS`]; each `luks2`, key size 64 bytes without integrity and
//!   96 with it (the reference allows either for any header: here it must match the segment),
//!   anti-forensic splitter `luks1` with 4000 stripes and `sha256`, area `raw` with
//!   `aes-xts-plain64` and a 64-byte key, KDF `argon2id` with non-zero time, memory and
//!   threads and a non-empty salt; no keyslot priority;
//! * segments: exactly one, id 0 (the reference allows several; more than one only appears
//!   during re-encryption, which this crate never does): `crypt`, sector size 4096, IV tweak
//!   `"0"`, `aes-xts-plain64`, integrity `hmac(sha256)` with journal encryption and integrity
//!   `none`, or no integrity where [`IntegrityRule::Optional`] allows it; no segment flags;
//! * digests: at least one; each `pbkdf2` with `sha256`, a non-zero iteration count and a
//!   non-empty salt and digest; exactly one covers segment 0 and it covers every keyslot (no
//!   unbound keyslot, no keyslot of another volume key);
//! * tokens: none, or only token 0 and exactly `{"type":"constellation-state-disk",
//!   "keyslots":[],"diskIsInitialized":<bool>}` (the reference does not check tokens; a token
//!   of another type could make cryptsetup try another way of unlocking);
//! * config: no `requirements` (they mark re-encryption and other states this crate does not
//!   handle) and no persistent flags other than the two workqueue flags.

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::Deserialize;

/// The token type of the state disk. Existing state disks carry it, so it must not change.
pub const TOKEN_TYPE: &str = "constellation-state-disk";

/// The most keyslots a valid state-disk header may have. A safe re-key holds at most three
/// at once (the old, an abandoned new one from an interrupted earlier attempt, and the
/// current new one); the bound also bounds how long a key check over all slots can take.
pub const MAX_KEYSLOTS: usize = 8;

/// How many keyslots LUKS2 has (0 to 31).
pub const LUKS2_KEYSLOTS: u8 = 32;

/// A LUKS2 keyslot number, 0 to 31.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeySlot(u8);

impl KeySlot {
    /// The slot a fresh disk's passphrase goes into.
    pub const FIRST: Self = Self(0);

    /// The slot `n`, if LUKS2 has one.
    #[must_use]
    pub fn new(n: u8) -> Option<Self> {
        (n < LUKS2_KEYSLOTS).then_some(Self(n))
    }

    /// The slot number.
    #[must_use]
    pub fn get(self) -> u8 {
        self.0
    }

    /// Parses a keyslot id as LUKS2 JSON writes it (decimal, no sign, no leading zero).
    fn parse(id: &str) -> Option<Self> {
        let canonical = !id.is_empty()
            && id.len() <= 2
            && id.bytes().all(|b| b.is_ascii_digit())
            && !(id.len() > 1 && id.starts_with('0'));
        if !canonical {
            return None;
        }
        id.parse::<u8>().ok().and_then(Self::new)
    }
}

impl fmt::Display for KeySlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Whether a header must authenticate its data segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntegrityRule {
    /// The segment must have `hmac(sha256)` integrity.
    Required,
    /// The segment may have `hmac(sha256)` integrity or none.
    Optional,
}

/// What token 0 says about the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenState {
    /// Token 0 is the state-disk token with `diskIsInitialized: true`.
    Initialized,
    /// Token 0 is the state-disk token with `diskIsInitialized: false`.
    NotInitialized,
    /// There is no token 0, or it is not exactly the state-disk token.
    Absent,
}

/// Identifies the volume key of a header without revealing it: the PBKDF2 digest (and its
/// salt) that cryptsetup checks a decrypted volume key against. If it changes, the disk's
/// volume key has changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeKeyDigest {
    salt: String,
    digest: String,
    iterations: u32,
}

/// A header that passed [`validate_header`]. Only this module can make one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidatedHeader {
    keyslots: Vec<KeySlot>,
    integrity: bool,
    token: TokenState,
    digest: VolumeKeyDigest,
}

impl ValidatedHeader {
    /// The keyslots in use, in ascending order (never empty).
    #[must_use]
    pub fn keyslots(&self) -> &[KeySlot] {
        &self.keyslots
    }

    /// Whether the data segment has dm-integrity.
    #[must_use]
    pub fn integrity(&self) -> bool {
        self.integrity
    }

    /// What the state-disk token says.
    #[must_use]
    pub fn token(&self) -> TokenState {
        self.token
    }

    /// The digest of the volume key.
    #[must_use]
    pub fn volume_key_digest(&self) -> &VolumeKeyDigest {
        &self.digest
    }

    /// The lowest keyslot not in use.
    #[must_use]
    pub fn free_keyslot(&self) -> Option<KeySlot> {
        (0..LUKS2_KEYSLOTS)
            .filter_map(KeySlot::new)
            .find(|s| !self.keyslots.contains(s))
    }
}

/// Why a header failed validation. Names the object and the rule; carries no key material
/// (headers hold none in the clear).
#[derive(Debug, thiserror::Error)]
pub enum HeaderError {
    /// The metadata is not JSON of the expected shape (including unknown fields).
    #[error("LUKS2 metadata does not parse: {0}")]
    Json(#[source] serde_json::Error),
    /// A keyslot breaks a rule.
    #[error("keyslot {id}: {problem}")]
    Keyslot {
        /// The keyslot id as written in the header.
        id: String,
        /// What is wrong.
        problem: String,
    },
    /// A segment breaks a rule.
    #[error("segment {id}: {problem}")]
    Segment {
        /// The segment id as written in the header.
        id: String,
        /// What is wrong.
        problem: String,
    },
    /// A digest breaks a rule.
    #[error("digest {id}: {problem}")]
    Digest {
        /// The digest id as written in the header.
        id: String,
        /// What is wrong.
        problem: String,
    },
    /// A token breaks a rule.
    #[error("token {id}: {problem}")]
    Token {
        /// The token id as written in the header.
        id: String,
        /// What is wrong.
        problem: String,
    },
    /// The header as a whole breaks a rule (counts, cross references, config).
    #[error("{0}")]
    Structure(String),
}

// The JSON shapes. `deny_unknown_fields` everywhere: a field this code does not know is a
// field whose effect it cannot judge. Fields that only some types carry are `Option`s and the
// rules below require or forbid them.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Metadata {
    keyslots: BTreeMap<String, Keyslot>,
    tokens: BTreeMap<String, serde_json::Value>,
    segments: BTreeMap<String, Segment>,
    digests: BTreeMap<String, Digest>,
    config: Config,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Keyslot {
    #[serde(rename = "type")]
    kind: String,
    key_size: u32,
    af: Af,
    area: Area,
    kdf: Kdf,
    priority: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Af {
    #[serde(rename = "type")]
    kind: String,
    stripes: u32,
    hash: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Area {
    #[serde(rename = "type")]
    kind: String,
    offset: String,
    size: String,
    encryption: Option<String>,
    key_size: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Kdf {
    #[serde(rename = "type")]
    kind: String,
    salt: String,
    time: Option<u32>,
    memory: Option<u32>,
    cpus: Option<u32>,
    hash: Option<String>,
    iterations: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Segment {
    #[serde(rename = "type")]
    kind: String,
    offset: String,
    size: String,
    iv_tweak: Option<String>,
    encryption: Option<String>,
    sector_size: Option<u32>,
    integrity: Option<SegmentIntegrity>,
    flags: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SegmentIntegrity {
    #[serde(rename = "type")]
    kind: String,
    journal_encryption: String,
    journal_integrity: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Digest {
    #[serde(rename = "type")]
    kind: String,
    keyslots: Vec<String>,
    segments: Vec<String>,
    hash: String,
    iterations: u32,
    salt: String,
    digest: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    json_size: String,
    keyslots_size: String,
    flags: Option<Vec<String>>,
    requirements: Option<serde_json::Value>,
}

/// Token 0 exactly as this crate writes it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(rename_all = "camelCase")]
struct StateDiskToken {
    #[serde(rename = "type")]
    kind: String,
    keyslots: Vec<String>,
    disk_is_initialized: bool,
}

/// The JSON of token 0 with the given `diskIsInitialized`.
#[must_use]
pub fn token_json(initialized: bool) -> String {
    format!(r#"{{"type":"{TOKEN_TYPE}","keyslots":[],"diskIsInitialized":{initialized}}}"#)
}

/// Reads the state-disk token from metadata JSON without validating anything else, for the
/// question "is this an initialized disk", which must be answerable for any
/// LUKS2 header.
#[must_use]
pub fn read_token_state(metadata_json: &str) -> TokenState {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(metadata_json) else {
        return TokenState::Absent;
    };
    value
        .get("tokens")
        .and_then(|tokens| tokens.get("0"))
        .map_or(TokenState::Absent, parse_token)
}

fn parse_token(value: &serde_json::Value) -> TokenState {
    match StateDiskToken::deserialize(value) {
        Ok(t) if t.kind == TOKEN_TYPE && t.keyslots.is_empty() => {
            if t.disk_is_initialized {
                TokenState::Initialized
            } else {
                TokenState::NotInitialized
            }
        }
        _ => TokenState::Absent,
    }
}

/// Checks LUKS2 metadata JSON against the rules in the module documentation.
pub fn validate_header(
    metadata_json: &str,
    integrity: IntegrityRule,
) -> Result<ValidatedHeader, HeaderError> {
    let meta: Metadata = serde_json::from_str(metadata_json).map_err(HeaderError::Json)?;

    // Segments first: the keyslot key size depends on whether there is integrity.
    if meta.segments.len() != 1 {
        return Err(HeaderError::Structure(format!(
            "{} segments, exactly one is allowed",
            meta.segments.len()
        )));
    }
    let mut segment_integrity = false;
    for (id, segment) in &meta.segments {
        segment_integrity =
            check_segment(segment, integrity).map_err(|problem| HeaderError::Segment {
                id: id.clone(),
                problem,
            })?;
        if id != "0" {
            return Err(HeaderError::Segment {
                id: id.clone(),
                problem: "the only segment must have id 0".to_owned(),
            });
        }
    }
    let volume_key_size = if segment_integrity { 96 } else { 64 };

    if meta.keyslots.is_empty() {
        return Err(HeaderError::Structure("no keyslot".to_owned()));
    }
    if meta.keyslots.len() > MAX_KEYSLOTS {
        return Err(HeaderError::Structure(format!(
            "{} keyslots, at most {MAX_KEYSLOTS} are allowed",
            meta.keyslots.len()
        )));
    }
    let mut keyslots = Vec::with_capacity(meta.keyslots.len());
    for (id, slot) in &meta.keyslots {
        let keyslot_error = |problem: String| HeaderError::Keyslot {
            id: id.clone(),
            problem,
        };
        let number = KeySlot::parse(id)
            .ok_or_else(|| keyslot_error("not a keyslot number from 0 to 31".to_owned()))?;
        check_keyslot(slot, volume_key_size).map_err(keyslot_error)?;
        keyslots.push(number);
    }
    keyslots.sort_unstable();

    if meta.digests.is_empty() {
        return Err(HeaderError::Structure("no digest".to_owned()));
    }
    let mut segment_digest = None;
    for (id, digest) in &meta.digests {
        check_digest(digest).map_err(|problem| HeaderError::Digest {
            id: id.clone(),
            problem,
        })?;
        for slot in &digest.keyslots {
            if !meta.keyslots.contains_key(slot) {
                return Err(HeaderError::Digest {
                    id: id.clone(),
                    problem: format!("refers to keyslot {slot}, which does not exist"),
                });
            }
        }
        for segment in &digest.segments {
            if !meta.segments.contains_key(segment) {
                return Err(HeaderError::Digest {
                    id: id.clone(),
                    problem: format!("refers to segment {segment}, which does not exist"),
                });
            }
        }
        if digest.segments.iter().any(|s| s == "0") {
            if segment_digest.is_some() {
                return Err(HeaderError::Structure(
                    "more than one digest covers segment 0".to_owned(),
                ));
            }
            segment_digest = Some(digest);
        }
    }
    let Some(segment_digest) = segment_digest else {
        return Err(HeaderError::Structure(
            "no digest covers segment 0".to_owned(),
        ));
    };
    for id in meta.keyslots.keys() {
        if !segment_digest.keyslots.contains(id) {
            return Err(HeaderError::Keyslot {
                id: id.clone(),
                problem: "does not hold the volume key of segment 0".to_owned(),
            });
        }
    }

    let mut token = TokenState::Absent;
    for (id, value) in &meta.tokens {
        if id != "0" {
            return Err(HeaderError::Token {
                id: id.clone(),
                problem: "only token 0 is allowed".to_owned(),
            });
        }
        token = parse_token(value);
        if token == TokenState::Absent {
            return Err(HeaderError::Token {
                id: id.clone(),
                problem: format!("is not exactly the {TOKEN_TYPE} token"),
            });
        }
    }

    check_config(&meta.config).map_err(HeaderError::Structure)?;

    Ok(ValidatedHeader {
        keyslots,
        integrity: segment_integrity,
        token,
        digest: VolumeKeyDigest {
            salt: segment_digest.salt.clone(),
            digest: segment_digest.digest.clone(),
            iterations: segment_digest.iterations,
        },
    })
}

fn expect(what: &str, found: &str, wanted: &str) -> Result<(), String> {
    if found == wanted {
        Ok(())
    } else {
        Err(format!("{what} is {found:?}, {wanted:?} is required"))
    }
}

fn expect_some<'a, T>(what: &str, value: &'a Option<T>) -> Result<&'a T, String> {
    value.as_ref().ok_or_else(|| format!("{what} is missing"))
}

fn expect_none<T>(what: &str, value: &Option<T>) -> Result<(), String> {
    match value {
        None => Ok(()),
        Some(_) => Err(format!("{what} is not allowed")),
    }
}

/// A base64 value that decodes to at least one byte.
fn expect_base64(what: &str, value: &str) -> Result<(), String> {
    match BASE64.decode(value) {
        Ok(bytes) if !bytes.is_empty() => Ok(()),
        Ok(_) => Err(format!("{what} is empty")),
        Err(_) => Err(format!("{what} is not base64")),
    }
}

/// A LUKS2 size or offset: a decimal string.
fn expect_decimal(what: &str, value: &str) -> Result<(), String> {
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        Ok(())
    } else {
        Err(format!("{what} {value:?} is not a decimal number"))
    }
}

fn check_keyslot(slot: &Keyslot, volume_key_size: u32) -> Result<(), String> {
    expect("type", &slot.kind, "luks2")?;
    if slot.key_size != volume_key_size {
        return Err(format!(
            "key size is {}, {volume_key_size} is required for this segment",
            slot.key_size
        ));
    }
    expect_none("priority", &slot.priority)?;

    expect("af type", &slot.af.kind, "luks1")?;
    if slot.af.stripes != 4000 {
        return Err(format!(
            "af stripes is {}, 4000 is required",
            slot.af.stripes
        ));
    }
    expect("af hash", &slot.af.hash, "sha256")?;

    expect("area type", &slot.area.kind, "raw")?;
    expect_decimal("area offset", &slot.area.offset)?;
    expect_decimal("area size", &slot.area.size)?;
    expect(
        "area encryption",
        expect_some("area encryption", &slot.area.encryption)?,
        "aes-xts-plain64",
    )?;
    let area_key = *expect_some("area key size", &slot.area.key_size)?;
    if area_key != 64 {
        return Err(format!("area key size is {area_key}, 64 is required"));
    }

    let kdf = &slot.kdf;
    expect("kdf type", &kdf.kind, "argon2id")?;
    for (what, value) in [
        ("kdf time", kdf.time),
        ("kdf memory", kdf.memory),
        ("kdf cpus", kdf.cpus),
    ] {
        match value {
            Some(v) if v > 0 => {}
            Some(_) => return Err(format!("{what} is 0")),
            None => return Err(format!("{what} is missing")),
        }
    }
    expect_none("kdf hash", &kdf.hash)?;
    expect_none("kdf iterations", &kdf.iterations)?;
    expect_base64("kdf salt", &kdf.salt)
}

/// Returns whether the segment has integrity.
fn check_segment(segment: &Segment, rule: IntegrityRule) -> Result<bool, String> {
    expect("type", &segment.kind, "crypt")?;
    expect_decimal("offset", &segment.offset)?;
    if segment.size != "dynamic" {
        expect_decimal("size", &segment.size)?;
    }
    expect("iv_tweak", expect_some("iv_tweak", &segment.iv_tweak)?, "0")?;
    expect(
        "encryption",
        expect_some("encryption", &segment.encryption)?,
        "aes-xts-plain64",
    )?;
    let sector = *expect_some("sector size", &segment.sector_size)?;
    if sector != 4096 {
        return Err(format!("sector size is {sector}, 4096 is required"));
    }
    expect_none("flags", &segment.flags)?;
    match (&segment.integrity, rule) {
        (Some(integrity), _) => {
            expect("integrity type", &integrity.kind, "hmac(sha256)")?;
            expect(
                "integrity journal encryption",
                &integrity.journal_encryption,
                "none",
            )?;
            expect(
                "integrity journal integrity",
                &integrity.journal_integrity,
                "none",
            )?;
            Ok(true)
        }
        (None, IntegrityRule::Required) => {
            Err("has no integrity, hmac(sha256) is required".to_owned())
        }
        (None, IntegrityRule::Optional) => Ok(false),
    }
}

fn check_digest(digest: &Digest) -> Result<(), String> {
    expect("type", &digest.kind, "pbkdf2")?;
    expect("hash", &digest.hash, "sha256")?;
    if digest.iterations == 0 {
        return Err("iterations is 0".to_owned());
    }
    expect_base64("salt", &digest.salt)?;
    expect_base64("digest", &digest.digest)
}

/// Persistent flags this crate tolerates: the two workqueue flags of the activation (no read
/// or write workqueue), which the headers of existing disks may carry.
const ALLOWED_CONFIG_FLAGS: [&str; 2] = ["no-read-workqueue", "no-write-workqueue"];

fn check_config(config: &Config) -> Result<(), String> {
    expect_decimal("config json_size", &config.json_size)?;
    expect_decimal("config keyslots_size", &config.keyslots_size)?;
    if config.requirements.is_some() {
        return Err("config requirements are not allowed".to_owned());
    }
    for flag in config.flags.iter().flatten() {
        if !ALLOWED_CONFIG_FLAGS.contains(&flag.as_str()) {
            return Err(format!("config flag {flag:?} is not allowed"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// Metadata as cryptsetup 2.6 writes it for this crate's format without integrity, with
    /// the state-disk token.
    fn plain() -> Value {
        json!({
          "keyslots": {
            "0": {
              "type": "luks2",
              "key_size": 64,
              "af": {"type": "luks1", "stripes": 4000, "hash": "sha256"},
              "area": {"type": "raw", "offset": "32768", "size": "258048",
                       "encryption": "aes-xts-plain64", "key_size": 64},
              "kdf": {"type": "argon2id", "time": 4, "memory": 32, "cpus": 1,
                      "salt": "CQG+hidVYb7fezWCjhHsfOBpBgJvV0Oauua/hqBjImI="}
            }
          },
          "tokens": {
            "0": {"type": "constellation-state-disk", "keyslots": [], "diskIsInitialized": false}
          },
          "segments": {
            "0": {"type": "crypt", "offset": "16777216", "size": "dynamic", "iv_tweak": "0",
                  "encryption": "aes-xts-plain64", "sector_size": 4096}
          },
          "digests": {
            "0": {"type": "pbkdf2", "keyslots": ["0"], "segments": ["0"], "hash": "sha256",
                  "iterations": 1000,
                  "salt": "q21h4JMkV9RdvzBR1JN3KSqw/A5uyP1VOc+7y0PV0Nc=",
                  "digest": "94/T7dRnrdNg2yCOIpMKmhmoXAg8EvMskcjsuIRPtZU="}
          },
          "config": {"json_size": "12288", "keyslots_size": "16744448"}
        })
    }

    /// The same with dm-integrity, as the original formats it.
    fn with_integrity() -> Value {
        let mut v = plain();
        v["keyslots"]["0"]["key_size"] = json!(96);
        v["segments"]["0"]["integrity"] = json!({
            "type": "hmac(sha256)", "journal_encryption": "none", "journal_integrity": "none"
        });
        v
    }

    fn check(v: &Value, rule: IntegrityRule) -> Result<ValidatedHeader, HeaderError> {
        validate_header(&v.to_string(), rule)
    }

    fn rejected(v: &Value, rule: IntegrityRule) -> String {
        match check(v, rule) {
            Ok(h) => panic!("accepted a header that breaks a rule: {h:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn accepts_what_this_crate_formats() {
        let h = check(&plain(), IntegrityRule::Optional).unwrap();
        assert_eq!(h.keyslots(), [KeySlot::FIRST]);
        assert!(!h.integrity());
        assert_eq!(h.token(), TokenState::NotInitialized);
        assert_eq!(h.free_keyslot(), KeySlot::new(1));

        let h = check(&with_integrity(), IntegrityRule::Required).unwrap();
        assert!(h.integrity());
        let h = check(&with_integrity(), IntegrityRule::Optional).unwrap();
        assert!(h.integrity());
    }

    #[test]
    fn rejects_a_header_without_integrity_when_integrity_is_required() {
        let e = rejected(&plain(), IntegrityRule::Required);
        assert!(e.contains("no integrity"), "{e}");
    }

    /// Every rule, one tampering each, on top of a header that passes: each case breaks one
    /// rule, so removing a check lets at least one case through and fails this test.
    #[test]
    fn rejects_every_tampered_field() {
        type Tamper = fn(&mut Value);
        let cases: &[(&str, IntegrityRule, Tamper)] = &[
            // Keyslots.
            ("no keyslot", IntegrityRule::Optional, |v| {
                v["keyslots"] = json!({});
                v["digests"]["0"]["keyslots"] = json!([]);
            }),
            ("keyslot type", IntegrityRule::Optional, |v| {
                v["keyslots"]["0"]["type"] = json!("luks1")
            }),
            ("key size", IntegrityRule::Optional, |v| {
                v["keyslots"]["0"]["key_size"] = json!(32)
            }),
            (
                "key size 96 without integrity",
                IntegrityRule::Optional,
                |v| v["keyslots"]["0"]["key_size"] = json!(96),
            ),
            ("priority", IntegrityRule::Optional, |v| {
                v["keyslots"]["0"]["priority"] = json!(2)
            }),
            ("af type", IntegrityRule::Optional, |v| {
                v["keyslots"]["0"]["af"]["type"] = json!("luks2")
            }),
            ("af stripes", IntegrityRule::Optional, |v| {
                v["keyslots"]["0"]["af"]["stripes"] = json!(1)
            }),
            ("af hash", IntegrityRule::Optional, |v| {
                v["keyslots"]["0"]["af"]["hash"] = json!("sha1")
            }),
            ("area type", IntegrityRule::Optional, |v| {
                v["keyslots"]["0"]["area"]["type"] = json!("checksum")
            }),
            ("area encryption", IntegrityRule::Optional, |v| {
                v["keyslots"]["0"]["area"]["encryption"] = json!("cipher_null-ecb")
            }),
            ("area encryption missing", IntegrityRule::Optional, |v| {
                v["keyslots"]["0"]["area"]
                    .as_object_mut()
                    .unwrap()
                    .remove("encryption");
            }),
            ("area key size", IntegrityRule::Optional, |v| {
                v["keyslots"]["0"]["area"]["key_size"] = json!(32)
            }),
            ("area offset", IntegrityRule::Optional, |v| {
                v["keyslots"]["0"]["area"]["offset"] = json!("-1")
            }),
            ("kdf type", IntegrityRule::Optional, |v| {
                v["keyslots"]["0"]["kdf"] = json!({"type": "pbkdf2", "hash": "sha256",
                    "iterations": 1, "salt": "CQG+hidVYb7fezWCjhHsfOBpBgJvV0Oauua/hqBjImI="})
            }),
            ("kdf argon2i", IntegrityRule::Optional, |v| {
                v["keyslots"]["0"]["kdf"]["type"] = json!("argon2i")
            }),
            ("kdf memory", IntegrityRule::Optional, |v| {
                v["keyslots"]["0"]["kdf"]["memory"] = json!(0)
            }),
            ("kdf time", IntegrityRule::Optional, |v| {
                v["keyslots"]["0"]["kdf"]["time"] = json!(0)
            }),
            ("kdf cpus", IntegrityRule::Optional, |v| {
                v["keyslots"]["0"]["kdf"]["cpus"] = json!(0)
            }),
            ("kdf salt", IntegrityRule::Optional, |v| {
                v["keyslots"]["0"]["kdf"]["salt"] = json!("")
            }),
            ("kdf salt not base64", IntegrityRule::Optional, |v| {
                v["keyslots"]["0"]["kdf"]["salt"] = json!("%%%")
            }),
            ("keyslot id", IntegrityRule::Optional, |v| {
                let slot = v["keyslots"]["0"].take();
                v["keyslots"] = json!({ "32": slot });
                v["digests"]["0"]["keyslots"] = json!(["32"]);
            }),
            ("too many keyslots", IntegrityRule::Optional, |v| {
                let slot = v["keyslots"]["0"].clone();
                let ids: Vec<String> = (0..=MAX_KEYSLOTS).map(|i| i.to_string()).collect();
                for id in &ids {
                    v["keyslots"][id] = slot.clone();
                }
                v["digests"]["0"]["keyslots"] = json!(ids);
            }),
            ("unbound keyslot", IntegrityRule::Optional, |v| {
                v["keyslots"]["1"] = v["keyslots"]["0"].clone();
            }),
            // Segments.
            ("no segment", IntegrityRule::Optional, |v| {
                v["segments"] = json!({});
                v["digests"]["0"]["segments"] = json!([]);
            }),
            ("two segments", IntegrityRule::Optional, |v| {
                v["segments"]["1"] = v["segments"]["0"].clone();
            }),
            ("segment id", IntegrityRule::Optional, |v| {
                let s = v["segments"]["0"].take();
                v["segments"] = json!({ "1": s });
                v["digests"]["0"]["segments"] = json!(["1"]);
            }),
            ("segment type", IntegrityRule::Optional, |v| {
                v["segments"]["0"]["type"] = json!("linear")
            }),
            ("segment encryption", IntegrityRule::Optional, |v| {
                v["segments"]["0"]["encryption"] = json!("cipher_null-ecb")
            }),
            ("segment encryption cbc", IntegrityRule::Optional, |v| {
                v["segments"]["0"]["encryption"] = json!("aes-cbc-essiv:sha256")
            }),
            ("sector size", IntegrityRule::Optional, |v| {
                v["segments"]["0"]["sector_size"] = json!(512)
            }),
            ("iv tweak", IntegrityRule::Optional, |v| {
                v["segments"]["0"]["iv_tweak"] = json!("1")
            }),
            ("segment flags", IntegrityRule::Optional, |v| {
                v["segments"]["0"]["flags"] = json!(["backup-previous"])
            }),
            ("segment offset", IntegrityRule::Optional, |v| {
                v["segments"]["0"]["offset"] = json!("0x10")
            }),
            ("integrity type", IntegrityRule::Optional, |v| {
                *v = with_integrity();
                v["segments"]["0"]["integrity"]["type"] = json!("crc32c");
            }),
            (
                "integrity journal encryption",
                IntegrityRule::Optional,
                |v| {
                    *v = with_integrity();
                    v["segments"]["0"]["integrity"]["journal_encryption"] = json!("aes");
                },
            ),
            (
                "integrity journal integrity",
                IntegrityRule::Optional,
                |v| {
                    *v = with_integrity();
                    v["segments"]["0"]["integrity"]["journal_integrity"] = json!("crc32");
                },
            ),
            ("key size 64 with integrity", IntegrityRule::Required, |v| {
                *v = with_integrity();
                v["keyslots"]["0"]["key_size"] = json!(64);
            }),
            // Digests.
            ("no digest", IntegrityRule::Optional, |v| {
                v["digests"] = json!({})
            }),
            ("digest type", IntegrityRule::Optional, |v| {
                v["digests"]["0"]["type"] = json!("argon2id")
            }),
            ("digest hash", IntegrityRule::Optional, |v| {
                v["digests"]["0"]["hash"] = json!("sha1")
            }),
            ("digest iterations", IntegrityRule::Optional, |v| {
                v["digests"]["0"]["iterations"] = json!(0)
            }),
            ("digest salt", IntegrityRule::Optional, |v| {
                v["digests"]["0"]["salt"] = json!("")
            }),
            ("digest digest", IntegrityRule::Optional, |v| {
                v["digests"]["0"]["digest"] = json!("")
            }),
            ("digest for no segment", IntegrityRule::Optional, |v| {
                v["digests"]["0"]["segments"] = json!([])
            }),
            (
                "two digests for the segment",
                IntegrityRule::Optional,
                |v| {
                    v["digests"]["1"] = v["digests"]["0"].clone();
                },
            ),
            (
                "digest of a missing keyslot",
                IntegrityRule::Optional,
                |v| v["digests"]["0"]["keyslots"] = json!(["0", "5"]),
            ),
            (
                "digest of a missing segment",
                IntegrityRule::Optional,
                |v| v["digests"]["0"]["segments"] = json!(["0", "3"]),
            ),
            // Tokens.
            ("foreign token", IntegrityRule::Optional, |v| {
                v["tokens"]["1"] = json!({"type": "luks2-keyring", "keyslots": ["0"],
                    "key_description": "x"})
            }),
            ("a second state-disk token", IntegrityRule::Optional, |v| {
                v["tokens"]["1"] = json!({"type": "constellation-state-disk", "keyslots": [],
                    "diskIsInitialized": true})
            }),
            ("token 0 of another type", IntegrityRule::Optional, |v| {
                v["tokens"]["0"]["type"] = json!("systemd-tpm2")
            }),
            ("token 0 bound to a keyslot", IntegrityRule::Optional, |v| {
                v["tokens"]["0"]["keyslots"] = json!(["0"])
            }),
            ("token 0 extra field", IntegrityRule::Optional, |v| {
                v["tokens"]["0"]["extra"] = json!(1)
            }),
            // Config and unknown fields.
            ("requirements", IntegrityRule::Optional, |v| {
                v["config"]["requirements"] = json!({"mandatory": ["online-reencrypt-v2"]})
            }),
            ("config flag", IntegrityRule::Optional, |v| {
                v["config"]["flags"] = json!(["allow-discards"])
            }),
            ("unknown top-level field", IntegrityRule::Optional, |v| {
                v["extra"] = json!({})
            }),
            ("unknown keyslot field", IntegrityRule::Optional, |v| {
                v["keyslots"]["0"]["extra"] = json!(1)
            }),
            ("unknown segment field", IntegrityRule::Optional, |v| {
                v["segments"]["0"]["extra"] = json!(1)
            }),
            ("unknown digest field", IntegrityRule::Optional, |v| {
                v["digests"]["0"]["extra"] = json!(1)
            }),
            ("wrong json type", IntegrityRule::Optional, |v| {
                v["keyslots"]["0"]["key_size"] = json!("64")
            }),
        ];
        for (name, rule, tamper) in cases {
            let mut v = plain();
            tamper(&mut v);
            let result = check(&v, *rule);
            assert!(result.is_err(), "{name}: accepted {result:?}");
        }
    }

    #[test]
    fn tolerates_the_workqueue_flags_and_a_header_without_token() {
        let mut v = plain();
        v["config"]["flags"] = json!(["no-read-workqueue", "no-write-workqueue"]);
        v["tokens"] = json!({});
        let h = check(&v, IntegrityRule::Optional).unwrap();
        assert_eq!(h.token(), TokenState::Absent);
    }

    #[test]
    fn reads_the_token_from_any_header() {
        let mut v = plain();
        assert_eq!(read_token_state(&v.to_string()), TokenState::NotInitialized);
        v["tokens"]["0"]["diskIsInitialized"] = json!(true);
        assert_eq!(read_token_state(&v.to_string()), TokenState::Initialized);
        // Anything not exactly the token counts as no token.
        v["tokens"]["0"]["diskIsInitialized"] = json!("true");
        assert_eq!(read_token_state(&v.to_string()), TokenState::Absent);
        v["tokens"]["0"] = json!({"type": "other", "keyslots": [], "diskIsInitialized": true});
        assert_eq!(read_token_state(&v.to_string()), TokenState::Absent);
        v["tokens"] = json!({});
        assert_eq!(read_token_state(&v.to_string()), TokenState::Absent);
        assert_eq!(read_token_state("not json"), TokenState::Absent);
    }

    #[test]
    fn token_json_is_exactly_the_reference_token() {
        assert_eq!(
            token_json(false),
            r#"{"type":"constellation-state-disk","keyslots":[],"diskIsInitialized":false}"#
        );
        assert_eq!(
            token_json(true),
            r#"{"type":"constellation-state-disk","keyslots":[],"diskIsInitialized":true}"#
        );
    }

    #[test]
    fn keyslot_ids_are_canonical_decimal() {
        assert_eq!(KeySlot::parse("0"), Some(KeySlot::FIRST));
        assert_eq!(KeySlot::parse("31"), KeySlot::new(31));
        for bad in ["", "32", "01", "+1", "-1", "1a", "100"] {
            assert_eq!(KeySlot::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_volume_key_digest_tells_volume_keys_apart() {
        let a = check(&plain(), IntegrityRule::Optional).unwrap();
        let mut v = plain();
        v["digests"]["0"]["digest"] = json!("AAAA7dRnrdNg2yCOIpMKmhmoXAg8EvMskcjsuIRPtZU=");
        let b = check(&v, IntegrityRule::Optional).unwrap();
        assert_ne!(a.volume_key_digest(), b.volume_key_digest());
    }
}

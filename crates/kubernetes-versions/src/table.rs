//! The built-in versions table: which Kubernetes patch versions are supported and which
//! components (release URL, SHA-256 hash, install path, extract flag) each installs.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::component::{
    Component, DataUrlError, HashFormatError, Sha256Hash, decode_data_url, is_data_url,
};

/// The versions table as built into the crate, byte for byte.
pub const BUILTIN_TABLE: &[u8] = include_bytes!("../data/kubernetes-versions.json");

/// The SHA-256 of [`BUILTIN_TABLE`], lowercase hex. A test compares the two, so replacing the
/// file means updating this constant too (docs/kubernetes.md).
pub const BUILTIN_TABLE_SHA256: &str =
    "c27149ac659e8db7bc709f263484fcfeb8da54d63e2d927a776aa7330c8fcd13";

/// What `asterism init` installs unless told otherwise: the latest patch of v1.31.
pub const DEFAULT_REQUEST: VersionRequest = VersionRequest::Minor {
    major: 1,
    minor: 31,
};

/// A Kubernetes patch version, `v<major>.<minor>.<patch>`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KubernetesVersion {
    major: u16,
    minor: u16,
    patch: u16,
}

impl KubernetesVersion {
    /// The version `v<major>.<minor>.<patch>`.
    #[must_use]
    pub const fn new(major: u16, minor: u16, patch: u16) -> Self {
        Self {
            major,
            minor,
            patch,
        }
    }

    /// The major version.
    #[must_use]
    pub const fn major(self) -> u16 {
        self.major
    }

    /// The minor version.
    #[must_use]
    pub const fn minor(self) -> u16 {
        self.minor
    }

    /// The patch version.
    #[must_use]
    pub const fn patch(self) -> u16 {
        self.patch
    }
}

impl fmt::Display for KubernetesVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl fmt::Debug for KubernetesVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for KubernetesVersion {
    type Err = VersionSyntaxError;

    /// Parses `v<major>.<minor>.<patch>` exactly.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.parse()? {
            VersionRequest::Exact(v) => Ok(v),
            VersionRequest::Minor { .. } => Err(VersionSyntaxError { text: s.to_owned() }),
        }
    }
}

impl KubernetesVersion {
    /// Parses the version an installed Kubernetes program reports of itself (`kubeadm
    /// version -o short`): `v<major>.<minor>.<patch>`, optionally followed by a semver
    /// pre-release (`-rc.1`) and build metadata (`+abc`), each a non-empty list of
    /// dot-separated alphanumeric identifiers. The suffix is checked and dropped: the
    /// result is the patch version the build leads to, so `v1.31.0-rc.1` reads as
    /// `v1.31.0`. Only for choices made by major and minor (which kubeadm configuration
    /// API to write); what a cluster installs is always an exact version ([`FromStr`]).
    pub fn parse_reported(text: &str) -> Result<Self, VersionSyntaxError> {
        let err = || VersionSyntaxError {
            text: text.to_owned(),
        };
        let (rest, build) = match text.split_once('+') {
            Some((rest, build)) => (rest, Some(build)),
            None => (text, None),
        };
        let (core, pre) = match rest.split_once('-') {
            Some((core, pre)) => (core, Some(pre)),
            None => (rest, None),
        };
        let identifiers = |t: &str| {
            t.split('.')
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
        };
        if pre.is_some_and(|p| !identifiers(p)) || build.is_some_and(|b| !identifiers(b)) {
            return Err(err());
        }
        core.parse().map_err(|_| err())
    }
}

impl Serialize for KubernetesVersion {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for KubernetesVersion {
    /// Reads `v<major>.<minor>.<patch>` exactly, as [`FromStr`] does.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// A version as an operator asks for it: `v1.31` (the latest patch of that minor the table
/// holds) or `v1.31.13` (exactly that one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VersionRequest {
    /// The latest supported patch of `v<major>.<minor>`.
    Minor {
        /// The major version.
        major: u16,
        /// The minor version.
        minor: u16,
    },
    /// Exactly this patch version.
    Exact(KubernetesVersion),
}

impl fmt::Display for VersionRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Minor { major, minor } => write!(f, "v{major}.{minor}"),
            Self::Exact(v) => fmt::Display::fmt(v, f),
        }
    }
}

/// A version string that is neither `v<major>.<minor>` nor `v<major>.<minor>.<patch>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a Kubernetes version (write v1.31 or v1.31.13)")]
pub struct VersionSyntaxError {
    /// The text refused.
    pub text: String,
}

impl FromStr for VersionRequest {
    type Err = VersionSyntaxError;

    /// Parses `v<major>.<minor>` or `v<major>.<minor>.<patch>`: decimal numbers without sign
    /// or leading zeros, nothing around them, so each version has one spelling.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || VersionSyntaxError { text: s.to_owned() };
        let number = |part: &str| -> Result<u16, VersionSyntaxError> {
            let canonical = !part.is_empty()
                && part.bytes().all(|b| b.is_ascii_digit())
                && (part == "0" || !part.starts_with('0'));
            if !canonical {
                return Err(err());
            }
            part.parse().map_err(|_| err())
        };
        let rest = s.strip_prefix('v').ok_or_else(err)?;
        let parts: Vec<&str> = rest.split('.').collect();
        match parts.as_slice() {
            [major, minor] => Ok(Self::Minor {
                major: number(major)?,
                minor: number(minor)?,
            }),
            [major, minor, patch] => Ok(Self::Exact(KubernetesVersion::new(
                number(major)?,
                number(minor)?,
                number(patch)?,
            ))),
            _ => Err(err()),
        }
    }
}

/// A supported version with the components it installs, in install order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    version: KubernetesVersion,
    components: Vec<Component>,
}

impl Release {
    /// The patch version.
    #[must_use]
    pub fn version(&self) -> KubernetesVersion {
        self.version
    }

    /// Its components, in install order; each has a well-formed SHA-256 hash.
    #[must_use]
    pub fn components(&self) -> &[Component] {
        &self.components
    }
}

/// Why a requested version is refused. Both say which versions are supported.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    /// Not a version at all.
    #[error("{source}; supported: {supported}")]
    Syntax {
        /// What is wrong.
        source: VersionSyntaxError,
        /// The supported versions, for the message.
        supported: String,
    },
    /// A version the table does not hold.
    #[error("Kubernetes {requested} is not supported; supported: {supported}")]
    Unsupported {
        /// The version asked for.
        requested: VersionRequest,
        /// The supported versions, for the message.
        supported: String,
    },
}

/// Why the versions table is refused.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// The file is not the expected JSON.
    #[error("the versions table is not valid JSON of the expected shape")]
    Json(#[source] serde_json::Error),
    /// A key of `versions`, or `default`, is not `v<major>.<minor>.<patch>`.
    #[error("the versions table names a malformed version")]
    Version(#[source] VersionSyntaxError),
    /// The table holds no version.
    #[error("the versions table holds no version")]
    Empty,
    /// `default` is not one of the versions.
    #[error("the versions table's default {0} is not one of its versions")]
    UnknownDefault(KubernetesVersion),
    /// A component's hash is missing or malformed.
    #[error("{version}: component for {install_path}: {reason}")]
    Hash {
        /// The version listing it.
        version: KubernetesVersion,
        /// Its install path.
        install_path: String,
        /// What is wrong.
        #[source]
        reason: HashFormatError,
    },
    /// A `data:` component's URL does not decode.
    #[error("{version}: component for {install_path}: the data: URL does not decode")]
    DataUrl {
        /// The version listing it.
        version: KubernetesVersion,
        /// Its install path.
        install_path: String,
        /// What is wrong.
        #[source]
        reason: DataUrlError,
    },
    /// A `data:` component carries a hash that its own bytes do not have.
    #[error(
        "{version}: component for {install_path}: the data: URL hashes to {actual}, the table says {expected}"
    )]
    DataHashMismatch {
        /// The version listing it.
        version: KubernetesVersion,
        /// Its install path.
        install_path: String,
        /// The hash the table gives.
        expected: Sha256Hash,
        /// The hash of the decoded bytes.
        actual: Sha256Hash,
    },
}

/// The file's shape: `{"source": …, "default": "v1.31.13", "versions": {"v1.31.13": [...]}}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTable {
    /// Where the facts come from; kept in the file for its reader.
    #[allow(dead_code)]
    source: String,
    default: String,
    versions: BTreeMap<String, Vec<RawComponent>>,
}

/// A component as the file writes it: every key present, no other (a misspelt key is an
/// error here, not an empty field found by the installer on a node).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawComponent {
    url: String,
    hash: String,
    install_path: String,
    extract: bool,
}

impl From<RawComponent> for Component {
    fn from(c: RawComponent) -> Self {
        Self {
            url: c.url,
            hash: c.hash,
            install_path: c.install_path,
            extract: c.extract,
        }
    }
}

/// The supported versions and their components, every component checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionTable {
    default: KubernetesVersion,
    releases: BTreeMap<KubernetesVersion, Vec<Component>>,
}

impl VersionTable {
    /// The table built into the crate ([`BUILTIN_TABLE`]). Parse it once and keep it.
    pub fn builtin() -> Result<Self, TableError> {
        Self::parse(BUILTIN_TABLE)
    }

    /// Parses a table in the built-in file's format. Every component must carry a
    /// well-formed SHA-256 hash, except `data:` components, whose hash, when the file leaves
    /// it empty, is that of their decoded bytes; when the file gives one, the bytes must
    /// have it.
    pub fn parse(json: &[u8]) -> Result<Self, TableError> {
        let raw: RawTable = serde_json::from_slice(json).map_err(TableError::Json)?;
        let mut releases = BTreeMap::new();
        for (key, components) in raw.versions {
            let version: KubernetesVersion = key.parse().map_err(TableError::Version)?;
            let components = components
                .into_iter()
                .map(|c| hashed(version, c.into()))
                .collect::<Result<Vec<_>, _>>()?;
            releases.insert(version, components);
        }
        if releases.is_empty() {
            return Err(TableError::Empty);
        }
        let default: KubernetesVersion = raw.default.parse().map_err(TableError::Version)?;
        if !releases.contains_key(&default) {
            return Err(TableError::UnknownDefault(default));
        }
        Ok(Self { default, releases })
    }

    /// The version the table names as its default.
    #[must_use]
    pub fn default_version(&self) -> KubernetesVersion {
        self.default
    }

    /// The supported versions, oldest first.
    pub fn versions(&self) -> impl Iterator<Item = KubernetesVersion> + '_ {
        self.releases.keys().copied()
    }

    /// The supported versions for a message: `v1.30.14, v1.31.13 (default), v1.32.9`.
    #[must_use]
    pub fn supported(&self) -> String {
        self.versions()
            .map(|v| {
                if v == self.default {
                    format!("{v} (default)")
                } else {
                    v.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The release a request names: the exact version, or the latest patch of the minor.
    pub fn resolve(&self, request: VersionRequest) -> Result<Release, SelectError> {
        let found = match request {
            VersionRequest::Exact(v) => self.releases.get_key_value(&v),
            VersionRequest::Minor { major, minor } => self
                .releases
                .range(KubernetesVersion::new(major, minor, 0)..)
                .take_while(|(v, _)| v.major == major && v.minor == minor)
                .last(),
        };
        let (version, components) = found.ok_or_else(|| SelectError::Unsupported {
            requested: request,
            supported: self.supported(),
        })?;
        Ok(Release {
            version: *version,
            components: components.clone(),
        })
    }

    /// Parses `text` (`v1.31` or `v1.31.13`) and resolves it.
    pub fn select(&self, text: &str) -> Result<Release, SelectError> {
        let request = text.parse().map_err(|source| SelectError::Syntax {
            source,
            supported: self.supported(),
        })?;
        self.resolve(request)
    }
}

/// Checks a component's hash; a `data:` component gets the hash of its decoded bytes.
fn hashed(version: KubernetesVersion, mut c: Component) -> Result<Component, TableError> {
    if is_data_url(&c.url) {
        let bytes = decode_data_url(&c.url).map_err(|reason| TableError::DataUrl {
            version,
            install_path: c.install_path.clone(),
            reason,
        })?;
        let actual = Sha256Hash::of(&bytes);
        if !c.hash.is_empty() {
            let expected = Sha256Hash::parse(&c.hash).map_err(|reason| TableError::Hash {
                version,
                install_path: c.install_path.clone(),
                reason,
            })?;
            if expected != actual {
                return Err(TableError::DataHashMismatch {
                    version,
                    install_path: c.install_path,
                    expected,
                    actual,
                });
            }
        }
        c.hash = actual.to_string();
    } else {
        Sha256Hash::parse(&c.hash).map_err(|reason| TableError::Hash {
            version,
            install_path: c.install_path.clone(),
            reason,
        })?;
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest as _, Sha256};

    fn table() -> VersionTable {
        VersionTable::builtin().unwrap()
    }

    #[test]
    fn the_built_in_table_is_the_recorded_one() {
        let digest = hex::encode(Sha256::digest(BUILTIN_TABLE));
        assert_eq!(
            digest, BUILTIN_TABLE_SHA256,
            "data/kubernetes-versions.json changed. If the change is deliberate, set \
             BUILTIN_TABLE_SHA256 in src/table.rs to {digest} (sha256sum of the file) and \
             describe the change in docs/kubernetes.md"
        );
    }

    #[test]
    fn the_built_in_table_holds_three_versions_with_v1_31_13_as_default() {
        let t = table();
        let versions: Vec<String> = t.versions().map(|v| v.to_string()).collect();
        assert_eq!(versions, ["v1.30.14", "v1.31.13", "v1.32.9"]);
        assert_eq!(t.default_version(), KubernetesVersion::new(1, 31, 13));
    }

    #[test]
    fn the_default_request_resolves_to_the_tables_default() {
        let t = table();
        assert_eq!(DEFAULT_REQUEST.to_string(), "v1.31");
        assert_eq!(
            t.resolve(DEFAULT_REQUEST).unwrap().version(),
            t.default_version()
        );
    }

    #[test]
    fn a_minor_version_selects_its_latest_patch() {
        let t = table();
        assert_eq!(
            t.select("v1.31").unwrap().version(),
            KubernetesVersion::new(1, 31, 13)
        );
        assert_eq!(
            t.select("v1.32").unwrap().version(),
            KubernetesVersion::new(1, 32, 9)
        );
    }

    #[test]
    fn a_minor_version_picks_the_highest_patch_among_several() {
        let json = br#"{"source":"test","default":"v1.31.2","versions":{
            "v1.31.2":[],"v1.31.10":[],"v1.31.9":[],"v1.32.0":[],"v1.30.99":[]}}"#;
        let t = VersionTable::parse(json).unwrap();
        assert_eq!(
            t.select("v1.31").unwrap().version(),
            KubernetesVersion::new(1, 31, 10)
        );
    }

    #[test]
    fn an_exact_version_selects_itself_with_its_components() {
        let r = table().select("v1.30.14").unwrap();
        assert_eq!(r.version(), KubernetesVersion::new(1, 30, 14));
        assert_eq!(r.components().len(), 9);
        assert_eq!(
            r.components()[2].url,
            "https://dl.k8s.io/v1.30.14/bin/linux/amd64/kubelet"
        );
        assert_eq!(r.components()[2].install_path, "/run/state/bin/kubelet");
        assert!(!r.components()[2].extract);
        assert!(r.components()[0].extract);
    }

    #[test]
    fn unknown_versions_are_refused_with_the_supported_list() {
        let t = table();
        let supported = "v1.30.14, v1.31.13 (default), v1.32.9";
        for unknown in ["v1.29", "v1.31.99", "v2.31"] {
            let err = t.select(unknown).unwrap_err();
            assert!(
                matches!(&err, SelectError::Unsupported { requested, supported: s }
                    if requested.to_string() == unknown && s == supported),
                "{unknown}: {err:?}"
            );
            assert!(err.to_string().contains(supported), "{err}");
        }
    }

    #[test]
    fn malformed_versions_are_refused_with_the_supported_list() {
        let t = table();
        for bad in [
            "1.31",
            "garbage",
            "",
            "v",
            "v1",
            "v1.",
            "v1.31.",
            "v1.31.13.1",
            "v01.31",
            "v1.031",
            "v1.31.013",
            "v+1.31",
            "v1.31 ",
            " v1.31",
            "V1.31",
            "v1.31-rc.1",
            "v1.99999",
        ] {
            let err = t.select(bad).unwrap_err();
            assert!(
                matches!(&err, SelectError::Syntax { source, supported }
                    if source.text == bad && supported.contains("v1.31.13")),
                "{bad:?}: {err:?}"
            );
            assert!(err.to_string().contains("v1.30.14, v1.31.13"), "{err}");
        }
    }

    #[test]
    fn a_reported_version_may_carry_a_pre_release_and_build_suffix() {
        let v = |s: &str| KubernetesVersion::parse_reported(s).unwrap();
        assert_eq!(v("v1.31.2"), KubernetesVersion::new(1, 31, 2));
        assert_eq!(v("v1.31.0-rc.1"), KubernetesVersion::new(1, 31, 0));
        assert_eq!(v("v1.32.0-alpha.1+abc.1"), KubernetesVersion::new(1, 32, 0));
        assert_eq!(v("v1.30.4+k3s-1"), KubernetesVersion::new(1, 30, 4));
        for bad in [
            "1.31.2",
            "v1.31",
            "v1.31.2.4",
            "v1.031.2",
            "v1.31.0-",
            "v1.31.0-rc..1",
            "v1.31.0+",
            "v1.31.0-rc_1",
            "",
        ] {
            let err = KubernetesVersion::parse_reported(bad).unwrap_err();
            assert_eq!(err.text, bad);
        }
        // An exact version alone has no suffix.
        assert!("v1.31.0-rc.1".parse::<KubernetesVersion>().is_err());
    }

    #[test]
    fn a_version_travels_in_json_as_its_text_and_is_read_exactly() {
        let v = KubernetesVersion::new(1, 31, 13);
        assert_eq!(serde_json::to_string(&v).unwrap(), r#""v1.31.13""#);
        assert_eq!(
            serde_json::from_str::<KubernetesVersion>(r#""v1.31.13""#).unwrap(),
            v
        );
        for bad in [r#""v1.31""#, r#""v1.31.13-rc.0""#, r#""""#, "131"] {
            assert!(
                serde_json::from_str::<KubernetesVersion>(bad).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn requests_print_as_they_parse() {
        for text in ["v1.31", "v1.31.13", "v0.0.0", "v10.0"] {
            assert_eq!(text.parse::<VersionRequest>().unwrap().to_string(), text);
        }
        assert!("v1.31".parse::<KubernetesVersion>().is_err());
        assert_eq!(
            "v1.31.13".parse::<KubernetesVersion>().unwrap(),
            KubernetesVersion::new(1, 31, 13)
        );
    }

    #[test]
    fn every_component_of_every_version_has_a_sha256_hash() {
        let t = table();
        let mut count = 0;
        for v in t.versions() {
            for c in t.resolve(VersionRequest::Exact(v)).unwrap().components() {
                let hash = Sha256Hash::parse(&c.hash)
                    .unwrap_or_else(|e| panic!("{v} {}: {e}", c.install_path));
                assert_eq!(hash.as_bytes().len(), 32);
                count += 1;
            }
        }
        assert_eq!(count, 27);
    }

    #[test]
    fn data_components_get_the_hash_of_their_decoded_bytes() {
        let raw: RawTable = serde_json::from_slice(BUILTIN_TABLE).unwrap();
        let t = table();
        let mut data = 0;
        for (key, raw_components) in raw.versions {
            let release = t.select(&key).unwrap();
            for (raw_c, c) in raw_components
                .into_iter()
                .map(Component::from)
                .zip(release.components())
            {
                if is_data_url(&raw_c.url) {
                    // The file leaves them unhashed; the table hashes what they decode to.
                    assert_eq!(raw_c.hash, "", "{key} {}", raw_c.install_path);
                    let bytes = decode_data_url(&raw_c.url).unwrap();
                    assert_eq!(c.hash, Sha256Hash::of(&bytes).to_string());
                    assert!(bytes.starts_with(br#"[{"op":"replace""#));
                    data += 1;
                } else {
                    assert_eq!(&raw_c, c, "other components are as in the file");
                }
            }
        }
        assert_eq!(data, 12);
    }

    fn one_component_table(url: &str, hash: &str) -> Vec<u8> {
        serde_json::json!({
            "source": "test",
            "default": "v1.31.1",
            "versions": {"v1.31.1": [{
                "url": url, "hash": hash, "install_path": "/opt/p.json", "extract": false
            }]}
        })
        .to_string()
        .into_bytes()
    }

    #[test]
    fn a_data_component_whose_bytes_differ_from_its_given_hash_is_refused() {
        let url = "data:,genuine";
        let right = Sha256Hash::of(b"genuine").to_string();
        let ok = VersionTable::parse(&one_component_table(url, &right)).unwrap();
        assert_eq!(ok.select("v1.31").unwrap().components()[0].hash, right);

        let wrong = Sha256Hash::of(b"tampered");
        let err = VersionTable::parse(&one_component_table(url, &wrong.to_string())).unwrap_err();
        assert!(
            matches!(&err, TableError::DataHashMismatch { expected, actual, install_path, .. }
                if *expected == wrong
                    && *actual == Sha256Hash::of(b"genuine")
                    && install_path == "/opt/p.json"),
            "{err:?}"
        );
    }

    #[test]
    fn a_data_component_with_a_malformed_hash_or_url_is_refused() {
        let err = VersionTable::parse(&one_component_table("data:,x", "md5:00")).unwrap_err();
        assert!(
            matches!(
                err,
                TableError::Hash {
                    reason: HashFormatError::Algorithm,
                    ..
                }
            ),
            "{err:?}"
        );
        let err = VersionTable::parse(&one_component_table("data:;base64,!!", "")).unwrap_err();
        assert!(
            matches!(
                err,
                TableError::DataUrl {
                    reason: DataUrlError::Base64,
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn a_downloaded_component_without_a_well_formed_hash_is_refused() {
        for (hash, reason) in [
            ("", HashFormatError::Empty),
            ("sha256:00", HashFormatError::Digest),
        ] {
            let err = VersionTable::parse(&one_component_table("https://dl.example/kubelet", hash))
                .unwrap_err();
            assert!(
                matches!(&err, TableError::Hash { reason: r, version, .. }
                    if *r == reason && *version == KubernetesVersion::new(1, 31, 1)),
                "{hash}: {err:?}"
            );
        }
    }

    #[test]
    fn a_table_with_an_unknown_default_a_bad_key_or_extra_fields_is_refused() {
        let err =
            VersionTable::parse(br#"{"source":"","default":"v1.31.2","versions":{"v1.31.1":[]}}"#)
                .unwrap_err();
        assert!(
            matches!(err, TableError::UnknownDefault(v) if v == KubernetesVersion::new(1, 31, 2))
        );
        let err =
            VersionTable::parse(br#"{"source":"","default":"v1.31","versions":{"v1.31":[]}}"#)
                .unwrap_err();
        assert!(matches!(err, TableError::Version(_)), "{err:?}");
        let err =
            VersionTable::parse(br#"{"source":"","default":"v1.31.1","versions":{}}"#).unwrap_err();
        assert!(matches!(err, TableError::Empty), "{err:?}");
        let err = VersionTable::parse(
            br#"{"source":"","default":"v1.31.1","versions":{"v1.31.1":[]},"extra":1}"#,
        )
        .unwrap_err();
        assert!(matches!(err, TableError::Json(_)), "{err:?}");
        for component in [
            r#"{"url":"data:,x","hash":"","install_path":"/p"}"#,
            r#"{"url":"data:,x","hash":"","install_path":"/p","extract":false,"mode":1}"#,
            r#"{"url":"data:,x","hash":"","instal_path":"/p","extract":false}"#,
        ] {
            let json = format!(
                r#"{{"source":"","default":"v1.31.1","versions":{{"v1.31.1":[{component}]}}}}"#
            );
            let err = VersionTable::parse(json.as_bytes()).unwrap_err();
            assert!(matches!(err, TableError::Json(_)), "{component}: {err:?}");
        }
    }
}

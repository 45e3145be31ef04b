//! KMS URIs (`kms://…`) and storage URIs (`storage://…`).
//!
//! A KMS URI names where data keys come from and carries the credentials for it, so it is a
//! secret: the parsed form redacts in `Debug`, formatting returns a wiped-on-drop string, and
//! no error repeats any part of the input.
//!
//! Only the cluster KMS (`kms://cluster-kms` with `storage://no-store`) exists. The cloud
//! backends (`aws`, `azure`, `gcp`), which clients may still name, are recognised by name so
//! that they are refused with a clear message ([`KmsUri::into_kms`]); their parameters, which
//! carry cloud credentials, are never read.
//!
//! Query values are percent-decoded twice, once as an `application/x-www-form-urlencoded`
//! query and once more as a query component, because existing clients encode them that
//! way. The
//! `cluster-kms` values are base64url with padding and are written unescaped (their
//! alphabet passes both decodings unchanged).

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE;
use zeroize::Zeroizing;

use crate::cluster::ClusterKms;
use crate::secret::{MasterSecret, Salt, SecretError, wipe};

/// Why a KMS or storage URI was rejected. Never holds any part of the URI.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UriError {
    /// The text is not of the form `scheme://host?query`.
    #[error("malformed URI: {reason}")]
    Malformed {
        /// What is wrong.
        reason: &'static str,
    },
    /// The scheme is not the expected one.
    #[error("URI scheme must be `{expected}`")]
    WrongScheme {
        /// The scheme that was expected.
        expected: &'static str,
    },
    /// The URI has a component this format never uses.
    #[error("URI must not have a {component}")]
    UnexpectedComponent {
        /// `user information`, `port`, `path` or `fragment`.
        component: &'static str,
    },
    /// The host does not name a known backend.
    #[error("unknown {kind} backend (expected one of: {expected})")]
    UnknownBackend {
        /// `KMS` or `storage`.
        kind: &'static str,
        /// The accepted hosts.
        expected: &'static str,
    },
    /// A mandatory query parameter is absent or empty.
    #[error("missing query parameter `{name}`")]
    MissingParameter {
        /// The parameter name.
        name: &'static str,
    },
    /// A query parameter appears more than once.
    #[error("query parameter `{name}` appears more than once")]
    DuplicateParameter {
        /// The parameter name.
        name: &'static str,
    },
    /// A query parameter is not correctly percent-encoded or not UTF-8.
    #[error("query parameter {} is not correctly percent-encoded UTF-8", .name.unwrap_or("name"))]
    BadEncoding {
        /// The parameter, if its name could be decoded and is known.
        name: Option<&'static str>,
    },
    /// A parameter that must be base64url (with padding) is not.
    #[error("query parameter `{name}` is not base64url with padding")]
    NotBase64 {
        /// The parameter name.
        name: &'static str,
    },
    /// The decoded master secret or salt is unacceptable.
    #[error("query parameter `{name}` holds an unacceptable value")]
    BadSecret {
        /// The parameter name.
        name: &'static str,
        /// Why (lengths only).
        #[source]
        source: SecretError,
    },
}

/// Why no KMS could be built from a pair of URIs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetupError {
    /// The KMS URI names a cloud KMS, which Asterism does not implement yet.
    #[error("KMS backend `{backend}` is not supported yet; use kms://cluster-kms")]
    BackendNotSupported {
        /// `aws`, `azure` or `gcp`.
        backend: &'static str,
    },
    /// The cluster KMS stores nothing, so only `storage://no-store` makes sense with it.
    #[error("the cluster KMS keeps no keys in storage; the storage URI must be storage://no-store")]
    StorageNotUsed,
}

/// A parsed KMS URI.
#[derive(Debug)]
pub enum KmsUri {
    /// `kms://cluster-kms?key=<b64url>&salt=<b64url>`: keys derived from a master secret.
    Cluster(ClusterKms),
    /// `kms://aws`, `kms://azure` or `kms://gcp`: a cloud KMS, which Asterism does not
    /// implement; [`KmsUri::into_kms`] refuses it.
    Cloud {
        /// `aws`, `azure` or `gcp`.
        backend: &'static str,
    },
}

/// A parsed storage URI.
#[derive(Debug, PartialEq, Eq)]
pub enum StorageUri {
    /// `storage://no-store`: nothing is stored (the only choice with the cluster KMS).
    NoStore,
    /// `storage://aws`, `storage://azure` or `storage://gcp`: cloud storage, which the
    /// cluster KMS does not use; [`KmsUri::into_kms`] refuses it.
    Cloud {
        /// `aws`, `azure` or `gcp`.
        backend: &'static str,
    },
}

/// Cloud backends a client may name, recognised only to be refused.
const CLOUD_BACKENDS: [&str; 3] = ["aws", "azure", "gcp"];

fn cloud_backend(host: &str) -> Option<&'static str> {
    CLOUD_BACKENDS.iter().copied().find(|b| *b == host)
}

const KMS_SCHEME: &str = "kms";
const STORAGE_SCHEME: &str = "storage";
const CLUSTER_KMS_HOST: &str = "cluster-kms";
const NO_STORE_HOST: &str = "no-store";

impl KmsUri {
    /// Parses a KMS URI. The cluster KMS's `key` and `salt` are mandatory and non-empty;
    /// unknown parameters are ignored. A cloud backend is recognised by its name alone.
    pub fn parse(uri: &str) -> Result<Self, UriError> {
        let (host, query) = split_uri(uri, KMS_SCHEME)?;
        if host == CLUSTER_KMS_HOST {
            let mut p = Params::parse(query, &["key", "salt"])?;
            let master_secret =
                MasterSecret::new(p.base64("key")?).map_err(|source| UriError::BadSecret {
                    name: "key",
                    source,
                })?;
            let salt = Salt::new(p.base64("salt")?).map_err(|source| UriError::BadSecret {
                name: "salt",
                source,
            })?;
            return Ok(Self::Cluster(ClusterKms::new(master_secret, salt)));
        }
        match cloud_backend(host) {
            Some(backend) => Ok(Self::Cloud { backend }),
            None => Err(UriError::UnknownBackend {
                kind: "KMS",
                expected: "cluster-kms, aws, azure, gcp",
            }),
        }
    }

    /// The URI of a cluster KMS over the given master secret and salt.
    #[must_use]
    pub fn cluster(master_secret: MasterSecret, salt: Salt) -> Self {
        Self::Cluster(ClusterKms::new(master_secret, salt))
    }

    /// The URI as text. It holds secrets: the returned string is wiped when dropped; keep it
    /// out of logs.
    #[must_use]
    pub fn to_uri_string(&self) -> Zeroizing<String> {
        match self {
            Self::Cluster(kms) => {
                let key = Zeroizing::new(URL_SAFE.encode(kms.master_secret().expose_secret()));
                let salt = Zeroizing::new(URL_SAFE.encode(kms.salt().expose_secret()));
                let prefix = "kms://cluster-kms?key=";
                let mut out = Zeroizing::new(String::with_capacity(
                    prefix.len() + key.len() + "&salt=".len() + salt.len(),
                ));
                out.push_str(prefix);
                out.push_str(&key);
                out.push_str("&salt=");
                out.push_str(&salt);
                out
            }
            Self::Cloud { backend } => Zeroizing::new(format!("{KMS_SCHEME}://{backend}")),
        }
    }

    /// The backend name (`cluster-kms`, `aws`, `azure` or `gcp`); not secret.
    #[must_use]
    pub fn backend(&self) -> &'static str {
        match self {
            Self::Cluster(_) => CLUSTER_KMS_HOST,
            Self::Cloud { backend } => backend,
        }
    }

    /// Builds the KMS this URI names, with the storage `storage` names.
    ///
    /// Only the cluster KMS (with `storage://no-store`) exists; cloud KMS backends are
    /// reported as not supported yet.
    pub fn into_kms(self, storage: &StorageUri) -> Result<ClusterKms, SetupError> {
        match self {
            Self::Cluster(kms) => match storage {
                StorageUri::NoStore => Ok(kms),
                _ => Err(SetupError::StorageNotUsed),
            },
            Self::Cloud { backend } => Err(SetupError::BackendNotSupported { backend }),
        }
    }
}

impl StorageUri {
    /// Parses a storage URI. A cloud backend is recognised by its name alone; its
    /// parameters are not read.
    pub fn parse(uri: &str) -> Result<Self, UriError> {
        let (host, _query) = split_uri(uri, STORAGE_SCHEME)?;
        if host == NO_STORE_HOST {
            return Ok(Self::NoStore);
        }
        match cloud_backend(host) {
            Some(backend) => Ok(Self::Cloud { backend }),
            None => Err(UriError::UnknownBackend {
                kind: "storage",
                expected: "no-store, aws, azure, gcp",
            }),
        }
    }

    /// The URI as text.
    #[must_use]
    pub fn to_uri_string(&self) -> Zeroizing<String> {
        match self {
            Self::NoStore => Zeroizing::new(format!("{STORAGE_SCHEME}://{NO_STORE_HOST}")),
            Self::Cloud { backend } => Zeroizing::new(format!("{STORAGE_SCHEME}://{backend}")),
        }
    }
}

/// Splits `scheme://host[/][?query]` into host and query, checking the scheme.
fn split_uri<'a>(uri: &'a str, scheme: &'static str) -> Result<(&'a str, &'a str), UriError> {
    let (found, rest) = uri.split_once("://").ok_or(UriError::Malformed {
        reason: "expected `scheme://host?query`",
    })?;
    if !found.eq_ignore_ascii_case(scheme) {
        return Err(UriError::WrongScheme { expected: scheme });
    }
    if rest.contains('#') {
        return Err(UriError::UnexpectedComponent {
            component: "fragment",
        });
    }
    let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (host, path) = match before_query.find('/') {
        Some(at) => before_query.split_at(at),
        None => (before_query, ""),
    };
    if !(path.is_empty() || path == "/") {
        return Err(UriError::UnexpectedComponent { component: "path" });
    }
    if host.contains('@') {
        return Err(UriError::UnexpectedComponent {
            component: "user information",
        });
    }
    if host.contains(':') {
        return Err(UriError::UnexpectedComponent { component: "port" });
    }
    Ok((host, query))
}

/// The known query parameters of one URI, decoded.
struct Params {
    values: Vec<(&'static str, Zeroizing<String>)>,
}

impl Params {
    /// Decodes `query`, keeping the parameters named in `known`.
    fn parse(query: &str, known: &[&'static str]) -> Result<Self, UriError> {
        let mut values: Vec<(&'static str, Zeroizing<String>)> = Vec::new();
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            if pair.contains(';') {
                return Err(UriError::Malformed {
                    reason: "`;` is not a query separator",
                });
            }
            let (raw_name, raw_value) = pair.split_once('=').unwrap_or((pair, ""));
            let decoded_name =
                unescape(raw_name).map_err(|()| UriError::BadEncoding { name: None })?;
            let Some(name) = known.iter().copied().find(|k| **k == **decoded_name) else {
                continue;
            };
            if values.iter().any(|(n, _)| *n == name) {
                return Err(UriError::DuplicateParameter { name });
            }
            let bad = UriError::BadEncoding { name: Some(name) };
            let once = unescape(raw_value).map_err(|()| bad.clone())?;
            let twice = unescape(&once).map_err(|()| bad)?;
            values.push((name, twice));
        }
        Ok(Self { values })
    }

    /// Removes and returns the non-empty value of `name`.
    fn take(&mut self, name: &'static str) -> Result<Zeroizing<String>, UriError> {
        let at = self
            .values
            .iter()
            .position(|(n, v)| *n == name && !v.is_empty())
            .ok_or(UriError::MissingParameter { name })?;
        Ok(self.values.swap_remove(at).1)
    }

    /// The value decoded from base64url with padding, into a buffer the caller wipes.
    fn base64(&mut self, name: &'static str) -> Result<Vec<u8>, UriError> {
        let text = self.take(name)?;
        let mut out = vec![0u8; base64::decoded_len_estimate(text.len())];
        match URL_SAFE.decode_slice(text.as_bytes(), &mut out) {
            Ok(len) => {
                out.truncate(len);
                Ok(out)
            }
            // The decoder's error names the offending byte, which is part of the secret:
            // it is dropped here, not passed on.
            Err(_) => {
                wipe(out);
                Err(UriError::NotBase64 { name })
            }
        }
    }
}

/// Percent-decodes one query component: `+` is a space, `%XY` a byte.
fn unescape(text: &str) -> Result<Zeroizing<String>, ()> {
    // Decoding never lengthens the text, so the buffer is never reallocated (which would
    // leave an unwiped copy behind).
    let mut out = Zeroizing::new(Vec::with_capacity(text.len()));
    let mut bytes = text.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'%' => {
                let hi = bytes.next().and_then(hex_value).ok_or(())?;
                let lo = bytes.next().and_then(hex_value).ok_or(())?;
                out.push((hi << 4) | lo);
            }
            b'+' => out.push(b' '),
            other => out.push(other),
        }
    }
    match String::from_utf8(std::mem::take(&mut *out)) {
        Ok(s) => Ok(Zeroizing::new(s)),
        Err(e) => {
            wipe(e.into_bytes());
            Err(())
        }
    }
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::KeyId;

    /// 32 zero bytes, base64url with padding.
    const ZEROS: &str = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";

    #[test]
    fn spec_example_uri_is_the_zero_master_secret_and_salt() {
        let uri = format!("kms://cluster-kms?key={ZEROS}&salt={ZEROS}");
        let parsed = KmsUri::parse(&uri).unwrap();
        let KmsUri::Cluster(kms) = &parsed else {
            panic!("not a cluster KMS: {parsed:?}");
        };
        assert_eq!(kms.master_secret().expose_secret(), &[0u8; 32]);
        assert_eq!(kms.salt().expose_secret(), &[0u8; 32]);
        assert_eq!(parsed.to_uri_string().as_str(), uri);

        let formatted = KmsUri::cluster(
            MasterSecret::new(vec![0; 32]).unwrap(),
            Salt::new(vec![0; 32]).unwrap(),
        )
        .to_uri_string();
        assert_eq!(formatted.as_str(), uri);
    }

    #[test]
    fn cluster_kms_uri_round_trips_random_secrets() {
        for _ in 0..16 {
            let uri = KmsUri::cluster(MasterSecret::generate().unwrap(), Salt::generate().unwrap());
            let text = uri.to_uri_string();
            let again = KmsUri::parse(&text).unwrap();
            assert_eq!(again.to_uri_string(), text);
            let (KmsUri::Cluster(a), KmsUri::Cluster(b)) = (&uri, &again) else {
                panic!("not cluster KMS");
            };
            assert_eq!(a.master_secret(), b.master_secret());
            assert_eq!(a.salt(), b.salt());
        }
    }

    #[test]
    fn cluster_kms_values_are_unescaped_twice() {
        // `%253D` → `%3D` → `=`; `%3D` alone → `=` after one pass, unchanged by the second.
        let once = ZEROS.replace('=', "%3D");
        let twice = ZEROS.replace('=', "%253D");
        let uri = format!("kms://cluster-kms?key={twice}&salt={once}");
        let KmsUri::Cluster(kms) = KmsUri::parse(&uri).unwrap() else {
            panic!("not cluster KMS");
        };
        assert_eq!(kms.master_secret().expose_secret(), &[0u8; 32]);
        assert_eq!(kms.salt().expose_secret(), &[0u8; 32]);
    }

    #[test]
    fn cluster_kms_uri_with_path_slash_and_unknown_parameters_is_accepted() {
        let uri = format!("KMS://cluster-kms/?key={ZEROS}&salt={ZEROS}&extra=1");
        assert!(KmsUri::parse(&uri).is_ok());
    }

    #[test]
    fn cluster_kms_derives_the_spec_measurement_secret() {
        let uri = format!("kms://cluster-kms?key={ZEROS}&salt={ZEROS}");
        let KmsUri::Cluster(kms) = KmsUri::parse(&uri).unwrap() else {
            panic!("not cluster KMS");
        };
        let key = kms.data_key(&KeyId::MeasurementSecret, 32).unwrap();
        assert_eq!(
            hex::encode(key.expose_secret()),
            "54d67b1d917d3464757d9b699f3ee416c209a2270e3876da90535e4108898cdd"
        );
    }

    #[test]
    fn missing_or_empty_parameters_are_rejected() {
        assert_eq!(
            KmsUri::parse(&format!("kms://cluster-kms?salt={ZEROS}")).err(),
            Some(UriError::MissingParameter { name: "key" })
        );
        assert_eq!(
            KmsUri::parse(&format!("kms://cluster-kms?key=&salt={ZEROS}")).err(),
            Some(UriError::MissingParameter { name: "key" })
        );
        assert_eq!(
            KmsUri::parse(&format!("kms://cluster-kms?key={ZEROS}")).err(),
            Some(UriError::MissingParameter { name: "salt" })
        );
    }

    #[test]
    fn duplicate_parameters_are_rejected() {
        assert_eq!(
            KmsUri::parse(&format!(
                "kms://cluster-kms?key={ZEROS}&key={ZEROS}&salt={ZEROS}"
            ))
            .err(),
            Some(UriError::DuplicateParameter { name: "key" })
        );
    }

    #[test]
    fn short_master_secret_and_salt_are_rejected() {
        let short = URL_SAFE.encode([7u8; 15]);
        let err =
            KmsUri::parse(&format!("kms://cluster-kms?key={short}&salt={ZEROS}")).unwrap_err();
        assert!(
            matches!(err, UriError::BadSecret { name: "key", .. }),
            "{err:?}"
        );
        let short = URL_SAFE.encode([7u8; 31]);
        let err =
            KmsUri::parse(&format!("kms://cluster-kms?key={ZEROS}&salt={short}")).unwrap_err();
        assert!(
            matches!(err, UriError::BadSecret { name: "salt", .. }),
            "{err:?}"
        );
    }

    #[test]
    fn malformed_key_is_not_echoed_in_the_error() {
        // Valid-looking secret material with one character outside the alphabet.
        let key = "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3I!";
        let err = KmsUri::parse(&format!("kms://cluster-kms?key={key}&salt={ZEROS}")).unwrap_err();
        assert_eq!(err, UriError::NotBase64 { name: "key" });
        let shown = format!("{err} {err:?}");
        assert!(!shown.contains("c2Vj"), "{shown}");
        assert!(!shown.contains('!'), "{shown}");
        assert!(!shown.contains("33"), "{shown}"); // the byte value of '!'

        // Unpadded base64url is not accepted either.
        let unpadded = ZEROS.trim_end_matches('=');
        assert_eq!(
            KmsUri::parse(&format!("kms://cluster-kms?key={unpadded}&salt={ZEROS}")).err(),
            Some(UriError::NotBase64 { name: "key" })
        );
    }

    #[test]
    fn structural_errors_do_not_echo_the_uri() {
        for (uri, want) in [
            ("kms:cluster-kms?key=SECRETSECRET", "malformed"),
            ("http://cluster-kms?key=SECRETSECRET", "scheme"),
            ("kms://SECRETSECRET?key=x", "unknown KMS backend"),
            ("kms://cluster-kms/SECRETSECRET?key=x", "path"),
            (
                "kms://user:SECRETSECRET@cluster-kms?key=x",
                "user information",
            ),
            ("kms://cluster-kms:9000?key=SECRETSECRET", "port"),
            ("kms://cluster-kms?key=SECRETSECRET#frag", "fragment"),
            ("kms://cluster-kms?key=SECRET%zzSECRET", "percent-encoded"),
            ("kms://cluster-kms?key=SECRET%25zzSECRET", "percent-encoded"),
            ("kms://cluster-kms?key=SECRETSECRET;salt=x", "`;`"),
        ] {
            let err = KmsUri::parse(uri).unwrap_err();
            let shown = format!("{err} {err:?}");
            assert!(shown.contains(want), "{uri}: {shown}");
            assert!(!shown.contains("SECRET"), "{uri}: {shown}");
        }
    }

    #[test]
    fn cloud_backends_are_recognised_by_name_and_keep_nothing_else() {
        for (uri, backend) in [
            (
                "kms://aws?region=eu-central-1&accessKeyID=AKIA123&accessKey=a%252Bb&keyName=k",
                "aws",
            ),
            ("kms://azure?tenantID=t", "azure"),
            ("kms://gcp", "gcp"),
        ] {
            let parsed = KmsUri::parse(uri).unwrap();
            assert_eq!(parsed.backend(), backend);
            assert_eq!(parsed.to_uri_string().as_str(), format!("kms://{backend}"));
        }
    }

    #[test]
    fn cloud_kms_backends_are_reported_as_not_supported() {
        for backend in ["aws", "azure", "gcp"] {
            let uri = KmsUri::parse(&format!("kms://{backend}?keyName=k")).unwrap();
            let err = uri.into_kms(&StorageUri::NoStore).unwrap_err();
            assert_eq!(err, SetupError::BackendNotSupported { backend });
            assert_eq!(
                err.to_string(),
                format!("KMS backend `{backend}` is not supported yet; use kms://cluster-kms")
            );
        }
        let cluster = KmsUri::cluster(MasterSecret::generate().unwrap(), Salt::generate().unwrap());
        assert!(cluster.into_kms(&StorageUri::NoStore).is_ok());
        for backend in ["aws", "azure", "gcp"] {
            let cluster =
                KmsUri::cluster(MasterSecret::generate().unwrap(), Salt::generate().unwrap());
            let storage = StorageUri::parse(&format!("storage://{backend}?bucket=b")).unwrap();
            let err = cluster.into_kms(&storage).unwrap_err();
            assert_eq!(err, SetupError::StorageNotUsed);
            assert_eq!(
                err.to_string(),
                "the cluster KMS keeps no keys in storage; the storage URI must be storage://no-store"
            );
        }
    }

    #[test]
    fn debug_of_uris_redacts_credentials() {
        let aws = KmsUri::parse("kms://aws?region=r&accessKeyID=i&accessKey=TOPSECRET&keyName=k")
            .unwrap();
        assert!(!format!("{aws:?}").contains("TOPSECRET"));
        let uri = format!("kms://cluster-kms?key={ZEROS}&salt={ZEROS}");
        let shown = format!("{:?}", KmsUri::parse(&uri).unwrap());
        assert!(!shown.contains("AAAA") && !shown.contains(", 0"), "{shown}");
        let storage = StorageUri::parse(
            "storage://azure?account=a&container=c&tenantID=t&clientID=i&clientSecret=TOPSECRET",
        )
        .unwrap();
        assert!(!format!("{storage:?}").contains("TOPSECRET"));
    }

    #[test]
    fn storage_uris_parse_and_round_trip() {
        assert_eq!(
            StorageUri::parse("storage://no-store").unwrap(),
            StorageUri::NoStore
        );
        assert_eq!(
            StorageUri::NoStore.to_uri_string().as_str(),
            "storage://no-store"
        );
        for backend in ["aws", "azure", "gcp"] {
            let uri = format!("storage://{backend}");
            assert_eq!(
                StorageUri::parse(&uri).unwrap().to_uri_string().as_str(),
                uri
            );
        }
    }

    #[test]
    fn storage_uri_errors() {
        assert_eq!(
            StorageUri::parse("storage://s3?bucket=b").err(),
            Some(UriError::UnknownBackend {
                kind: "storage",
                expected: "no-store, aws, azure, gcp"
            })
        );
        assert_eq!(
            StorageUri::parse("kms://no-store").err(),
            Some(UriError::WrongScheme {
                expected: "storage"
            })
        );
        assert_eq!(
            StorageUri::parse("storage://gcp/path").err(),
            Some(UriError::UnexpectedComponent { component: "path" })
        );
    }

    #[test]
    fn unescape_decodes_percent_escapes_and_plus() {
        for (escaped, text) in [
            ("", ""),
            ("a+b", "a b"),
            ("a%2Bb%2Fc%25d", "a+b/c%d"),
            ("%C3%BCn%C3%AF", "ünï"),
            ("~-_.", "~-_."),
            ("%26%3D%3F%23", "&=?#"),
        ] {
            assert_eq!(unescape(escaped).unwrap().as_str(), text, "{escaped}");
        }
        assert_eq!(
            unescape(&unescape("a%252Bb").unwrap()).unwrap().as_str(),
            "a+b"
        );
        assert!(unescape("%").is_err());
        assert!(unescape("%4").is_err());
        assert!(unescape("%ff").is_err()); // not UTF-8
    }
}

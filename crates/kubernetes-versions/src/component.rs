//! A component as it travels (init request, join ticket, components ConfigMap), its SHA-256
//! hash and `data:` URLs: pure values, shared by the versions table and the installer.

use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// A component as it travels in the init request, the join ticket and the components
/// ConfigMap (JSON keys `url`, `hash`, `install_path`, `extract`, zero values omitted;
/// docs/kubernetes.md).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Component {
    /// `https://…`, `http://…` or a `data:` URL (RFC 2397).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub url: String,
    /// `sha256:<64 lowercase hex>`; the installer refuses a component without one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hash: String,
    /// The destination file, or the destination directory when `extract` is set.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub install_path: String,
    /// The resource is a gzip-compressed tar to unpack under `install_path`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub extract: bool,
}

#[cfg(feature = "proto")]
impl From<Component> for asterism_proto::components::Component {
    fn from(c: Component) -> Self {
        Self {
            url: c.url,
            hash: c.hash,
            install_path: c.install_path,
            extract: c.extract,
        }
    }
}

#[cfg(feature = "proto")]
impl From<asterism_proto::components::Component> for Component {
    fn from(c: asterism_proto::components::Component) -> Self {
        Self {
            url: c.url,
            hash: c.hash,
            install_path: c.install_path,
            extract: c.extract,
        }
    }
}

/// The hash of a whole component list, which names the components ConfigMap after init:
/// `sha256:` + hex(SHA-256(concatenation of every component's hash string)). Existing
/// clusters' ConfigMaps carry names made this way, so the computation must not change.
#[must_use]
pub fn list_hash(components: &[Component]) -> String {
    let mut h = Sha256::new();
    for c in components {
        h.update(c.hash.as_bytes());
    }
    format!("sha256:{}", hex::encode(h.finalize()))
}

/// A SHA-256 digest parsed from `sha256:<64 lowercase hex>`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sha256Hash([u8; 32]);

impl Sha256Hash {
    /// Parses `sha256:<64 lowercase hex>`; anything else (empty, another algorithm, upper
    /// case, wrong length) is refused.
    pub fn parse(s: &str) -> Result<Self, HashFormatError> {
        if s.is_empty() {
            return Err(HashFormatError::Empty);
        }
        let hex_part = s
            .strip_prefix("sha256:")
            .ok_or(HashFormatError::Algorithm)?;
        if hex_part.len() != 64
            || !hex_part
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(HashFormatError::Digest);
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(hex_part, &mut out).map_err(|_| HashFormatError::Digest)?;
        Ok(Self(out))
    }

    /// The hash of `bytes`.
    #[must_use]
    pub fn of(bytes: &[u8]) -> Self {
        Self(Sha256::digest(bytes).into())
    }

    /// A digest computed elsewhere (a download hashed as it streams).
    #[must_use]
    pub const fn from_bytes(digest: [u8; 32]) -> Self {
        Self(digest)
    }

    /// The digest bytes.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Display for Sha256Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", hex::encode(self.0))
    }
}

impl fmt::Debug for Sha256Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Why a hash string is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HashFormatError {
    /// No hash at all: refused, since a component without one could not be checked.
    #[error("the hash is empty; every component needs a sha256 hash")]
    Empty,
    /// Not `sha256:`.
    #[error("the hash does not start with \"sha256:\"")]
    Algorithm,
    /// Not 64 lowercase hex digits.
    #[error("the sha256 digest is not 64 lowercase hex digits")]
    Digest,
}

/// Whether `url` is a `data:` URL (the scheme in any case).
#[must_use]
pub fn is_data_url(url: &str) -> bool {
    url.get(..5)
        .is_some_and(|s| s.eq_ignore_ascii_case("data:"))
}

/// Why a `data:` URL is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DataUrlError {
    /// No `,` between the media type and the data.
    #[error("no ',' separates the media type from the data")]
    NoComma,
    /// The base64 payload does not decode.
    #[error("the base64 data does not decode")]
    Base64,
    /// A `%` is not followed by two hex digits.
    #[error("a percent escape is malformed")]
    PercentEscape,
}

/// Decodes a `data:` URL (RFC 2397): `data:[<mediatype>][;base64],<data>`. The data is
/// percent-decoded; with `;base64` it is then base64-decoded (standard alphabet, padding
/// optional). `url` must start with `data:` (any case).
pub fn decode_data_url(url: &str) -> Result<Vec<u8>, DataUrlError> {
    let rest = url.get(5..).unwrap_or_default();
    let (header, data) = rest.split_once(',').ok_or(DataUrlError::NoComma)?;
    let is_base64 = header
        .rsplit_once(';')
        .is_some_and(|(_, p)| p.trim().eq_ignore_ascii_case("base64"));
    let raw = percent_decode_strict(data)?;
    if is_base64 {
        use base64::Engine as _;
        use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
        let engine = GeneralPurpose::new(
            &base64::alphabet::STANDARD,
            GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
        );
        let text: Vec<u8> = raw
            .into_iter()
            .filter(|b| !b.is_ascii_whitespace())
            .collect();
        engine.decode(text).map_err(|_| DataUrlError::Base64)
    } else {
        Ok(raw)
    }
}

fn percent_decode_strict(s: &str) -> Result<Vec<u8>, DataUrlError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let hi = bytes.get(i + 1).and_then(|c| (*c as char).to_digit(16));
            let lo = bytes.get(i + 2).and_then(|c| (*c as char).to_digit(16));
            match (hi, lo) {
                (Some(hi), Some(lo)) => {
                    out.push(u8::try_from(hi * 16 + lo).map_err(|_| DataUrlError::PercentEscape)?);
                    i += 3;
                }
                _ => return Err(DataUrlError::PercentEscape),
            }
        } else {
            out.push(b);
            i += 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn hash_must_be_sha256_with_64_lowercase_hex_digits() {
        let good = format!("sha256:{}", "ab".repeat(32));
        assert!(Sha256Hash::parse(&good).is_ok());
        assert_eq!(Sha256Hash::parse(""), Err(HashFormatError::Empty));
        assert_eq!(
            Sha256Hash::parse(&format!("sha512:{}", "ab".repeat(32))),
            Err(HashFormatError::Algorithm)
        );
        assert_eq!(
            Sha256Hash::parse(&format!("sha256:{}", "AB".repeat(32))),
            Err(HashFormatError::Digest)
        );
        assert_eq!(
            Sha256Hash::parse(&format!("sha256:{}", "ab".repeat(31))),
            Err(HashFormatError::Digest)
        );
        assert_eq!(Sha256Hash::parse(&good).unwrap().to_string(), good);
    }

    #[test]
    fn data_urls_decode_base64_and_percent_encoding() {
        assert_eq!(
            decode_data_url("data:application/json;base64,eyJhIjoxfQ==").unwrap(),
            br#"{"a":1}"#
        );
        assert_eq!(
            decode_data_url("data:application/json;base64,eyJhIjoxfQ").unwrap(),
            br#"{"a":1}"#
        );
        assert_eq!(
            decode_data_url("data:,A%20brief%20note").unwrap(),
            b"A brief note"
        );
        assert_eq!(
            decode_data_url("data:text/plain;charset=utf-8,%7B%7D").unwrap(),
            b"{}"
        );
        assert_eq!(decode_data_url("data:;base64,aGk=").unwrap(), b"hi");
        assert_eq!(
            decode_data_url("data:text/plain"),
            Err(DataUrlError::NoComma)
        );
        assert_eq!(
            decode_data_url("data:,%zz"),
            Err(DataUrlError::PercentEscape)
        );
        assert_eq!(
            decode_data_url("data:;base64,!!!"),
            Err(DataUrlError::Base64)
        );
    }

    #[test]
    fn list_hash_matches_the_original_naming() {
        let c = |h: &str| Component {
            hash: h.into(),
            ..Component::default()
        };
        let list = [c("sha256:aa"), c("sha256:bb")];
        assert_eq!(
            list_hash(&list),
            format!(
                "sha256:{}",
                hex::encode(Sha256::digest(b"sha256:aasha256:bb"))
            )
        );
    }

    #[cfg(feature = "proto")]
    #[test]
    fn components_convert_to_and_from_the_grpc_message_unchanged() {
        let c = Component {
            url: "https://dl.example/kubelet".into(),
            hash: Sha256Hash::of(b"x").to_string(),
            install_path: "/run/state/bin/kubelet".into(),
            extract: true,
        };
        let wire = asterism_proto::components::Component::from(c.clone());
        assert_eq!(
            (&wire.url, &wire.hash, &wire.install_path, wire.extract),
            (&c.url, &c.hash, &c.install_path, c.extract)
        );
        assert_eq!(Component::from(wire), c);
    }

    #[test]
    fn data_url_scheme_is_matched_in_any_case() {
        assert!(is_data_url("data:,x"));
        assert!(is_data_url("DATA:,x"));
        assert!(!is_data_url("https://x/data:"));
        assert!(!is_data_url("dat"));
    }
}

//! Checking a component before anything is downloaded: its hash, its URL (http, https or
//! `data:`) and its install path, for each component and for a whole list at once; and
//! URLs as they may be logged (no credentials, no query).

use std::fmt;
use std::path::{Component as PathPart, PathBuf};

use http::Uri;

use crate::{Component, ComponentError, Sha256Hash, decode_data_url, is_data_url};

/// Where a component's bytes come from.
#[derive(Clone, PartialEq, Eq)]
pub enum Source {
    /// An `http://` or `https://` URL.
    Http(Uri),
    /// The decoded payload of a `data:` URL.
    Data(Vec<u8>),
}

impl fmt::Debug for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Http(uri) => write!(f, "{}", redacted_uri(uri)),
            Self::Data(bytes) => write!(f, "data: URL ({} bytes)", bytes.len()),
        }
    }
}

/// A URL for logs and errors: scheme, host, port and path, never user info or query (which
/// may carry credentials).
pub(crate) fn redacted_uri(uri: &Uri) -> String {
    format!(
        "{}://{}{}",
        uri.scheme_str().unwrap_or("?"),
        uri.host().unwrap_or("?"),
        uri.port()
            .map(|p| format!(":{}", p.as_u16()))
            .unwrap_or_default()
            + uri.path()
    )
}

/// A component's URL for logs: `data:` URLs are shortened to their size.
#[must_use]
pub fn display_url(url: &str) -> String {
    if is_data_url(url) {
        return format!("data: URL ({} characters)", url.len());
    }
    match url.parse::<Uri>() {
        Ok(uri) if uri.host().is_some() => redacted_uri(&uri),
        _ => "<unparsable URL>".into(),
    }
}

/// A component whose every field has been checked: a supported URL, a well-formed hash, an
/// absolute install path without `..`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedComponent {
    /// Where the bytes come from.
    pub source: Source,
    /// The hash the bytes must have.
    pub hash: Sha256Hash,
    /// The destination file, or directory when `extract`.
    pub install_path: PathBuf,
    /// Unpack a `.tar.gz` under `install_path`.
    pub extract: bool,
}

impl TryFrom<&Component> for CheckedComponent {
    type Error = ComponentError;

    fn try_from(c: &Component) -> Result<Self, Self::Error> {
        let url = display_url(&c.url);
        let hash = Sha256Hash::parse(&c.hash).map_err(|reason| ComponentError::Hash {
            url: url.clone(),
            reason,
        })?;
        let source = if is_data_url(&c.url) {
            Source::Data(
                decode_data_url(&c.url).map_err(|reason| ComponentError::DataUrl {
                    url: url.clone(),
                    reason,
                })?,
            )
        } else {
            let uri: Uri = c.url.parse().map_err(|_| ComponentError::Url {
                url: url.clone(),
                reason: "not a URL",
            })?;
            match uri.scheme_str() {
                Some("http" | "https") if uri.host().is_some_and(|h| !h.is_empty()) => {}
                Some("http" | "https") => {
                    return Err(ComponentError::Url {
                        url,
                        reason: "no host",
                    });
                }
                _ => {
                    return Err(ComponentError::Url {
                        url,
                        reason: "only http, https and data URLs are supported",
                    });
                }
            }
            Source::Http(uri)
        };
        let install_path = PathBuf::from(&c.install_path);
        let plain = install_path.is_absolute()
            && install_path
                .components()
                .all(|p| matches!(p, PathPart::RootDir | PathPart::Normal(_)))
            && install_path.parent().is_some();
        if !plain {
            return Err(ComponentError::InstallPath {
                path: install_path,
                reason: "must be an absolute path without '.' or '..' and not '/'",
            });
        }
        Ok(Self {
            source,
            hash,
            install_path,
            extract: c.extract,
        })
    }
}

/// Checks a whole list; the first bad component refuses the list, before any download.
pub fn check_all(components: &[Component]) -> Result<Vec<CheckedComponent>, ComponentError> {
    components.iter().map(CheckedComponent::try_from).collect()
}

/// A list of components as received, every one checked. Only [`CheckedComponents::new`]
/// makes one, so whoever holds it (the bootstrapper, kubeadm's setup) installs without
/// checking again. The received strings are kept: the components ConfigMap records them and
/// is named by their hashes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckedComponents {
    received: Vec<Component>,
    checked: Vec<CheckedComponent>,
}

impl CheckedComponents {
    /// Checks `list`; the first bad component refuses the whole list.
    pub fn new(list: Vec<Component>) -> Result<Self, ComponentError> {
        let checked = check_all(&list)?;
        Ok(Self {
            received: list,
            checked,
        })
    }

    /// The components as received, in order.
    #[must_use]
    pub fn received(&self) -> &[Component] {
        &self.received
    }

    /// The checked components, in the same order.
    #[must_use]
    pub fn checked(&self) -> &[CheckedComponent] {
        &self.checked
    }

    /// How many there are.
    #[must_use]
    pub fn len(&self) -> usize {
        self.checked.len()
    }

    /// Whether there are none (the image holds what kubeadm needs).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.checked.is_empty()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::HashFormatError;

    #[test]
    fn components_with_an_empty_or_malformed_hash_are_refused() {
        let mut c = Component {
            url: "https://example.invalid/kubelet".into(),
            hash: String::new(),
            install_path: "/run/state/bin/kubelet".into(),
            extract: false,
        };
        assert!(matches!(
            CheckedComponent::try_from(&c),
            Err(ComponentError::Hash {
                reason: HashFormatError::Empty,
                ..
            })
        ));
        c.hash = "sha256:xyz".into();
        assert!(matches!(
            CheckedComponent::try_from(&c),
            Err(ComponentError::Hash {
                reason: HashFormatError::Digest,
                ..
            })
        ));
        c.hash = format!("sha256:{}", "0".repeat(64));
        assert!(CheckedComponent::try_from(&c).is_ok());
    }

    #[test]
    fn install_paths_must_be_absolute_and_plain() {
        let c = |p: &str| Component {
            url: "data:,x".into(),
            hash: Sha256Hash::of(b"x").to_string(),
            install_path: p.into(),
            extract: false,
        };
        assert!(CheckedComponent::try_from(&c("/opt/cni/bin")).is_ok());
        for bad in ["relative/kubelet", "/run/../etc/passwd", "/", ""] {
            assert!(
                matches!(
                    CheckedComponent::try_from(&c(bad)),
                    Err(ComponentError::InstallPath { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn only_http_https_and_data_urls_are_accepted() {
        let c = |u: &str| Component {
            url: u.into(),
            hash: Sha256Hash::of(b"x").to_string(),
            install_path: "/x".into(),
            extract: false,
        };
        assert!(CheckedComponent::try_from(&c("https://dl.example/x")).is_ok());
        assert!(CheckedComponent::try_from(&c("http://127.0.0.1:1/x")).is_ok());
        assert!(CheckedComponent::try_from(&c("DATA:,x")).is_ok());
        for bad in ["file:///etc/passwd", "ftp://h/x", "not a url", "https:///x"] {
            assert!(
                matches!(
                    CheckedComponent::try_from(&c(bad)),
                    Err(ComponentError::Url { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn urls_in_logs_lose_credentials_and_queries() {
        assert_eq!(
            display_url("https://user:pw@dl.example:8443/k/kubelet?sig=secret"),
            "https://dl.example:8443/k/kubelet"
        );
        assert_eq!(display_url("data:,hello"), "data: URL (11 characters)");
    }
}

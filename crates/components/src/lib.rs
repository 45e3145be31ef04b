//! The component installer: downloads the Kubernetes binaries and archives
//! an init request or join ticket names, checks each against its SHA-256 hash, and installs
//! it atomically.
//!
//! What it guarantees (docs/kubernetes.md compares it with the original installer):
//! * the hash is **mandatory**: a component without a well-formed `sha256:<64 lowercase hex>`
//!   is refused before anything is downloaded;
//! * retries back off exponentially, with bounded attempts and a timeout per attempt, so a
//!   failing mirror is not hammered;
//! * archives are unpacked into a temporary directory first; `..`, absolute paths, paths
//!   through symlinks, and symlinks or hard links pointing outside the destination are
//!   refused, and each symlink is created as link name → target;
//! * files appear at their final path only complete: temporary file, fsync, rename.
//!
//! The pure parts (URL parsing, archive path checks, retry decisions) take values and return
//! values; [`Installer`] is the I/O adapter. The component type, its hash and `data:`
//! decoding live in `asterism-kubernetes-versions` (re-exported here), which programs that
//! only read the versions table use without this crate's HTTP client and TLS.
//!
//! A crate of its own because it carries its own HTTP client and TLS (hyper with rustls and
//! Mozilla's root set): only the bootstrapper, which installs components, builds them
//! (docs/dependencies.md). It never installs a file whose hash it has not checked.
//!
//! One module per concern: `check` (a component's hash, URL and install path, before
//! anything is downloaded), `policy` (attempts, timeouts, backoff, caps), `download`
//! (HTTP(S) with retries, redirects and a size cap), `archive` (archive safety and
//! unpacking), `place` (directories and atomic placement). [`Installer`] runs them in order.
#![forbid(unsafe_code)]

use std::fmt;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use asterism_basics::PathError;

use bytes::Bytes;
use http_body_util::Empty;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tracing::{debug, info};

// The wire type and hashing, shared with the versions table.
pub use asterism_kubernetes_versions::{
    Component, DataUrlError, HashFormatError, Sha256Hash, decode_data_url, is_data_url, list_hash,
};

/// Mode of an installed (non-archive) component: read and execute for its owner, read for
/// everyone else; nothing but the owner (root) may change a binary the kubelet runs.
pub const BINARY_MODE: u32 = 0o544;
/// Mode bits an archive entry may keep: no setuid/setgid/sticky, no group or world write.
pub const ARCHIVE_MODE_MASK: u32 = 0o755;
/// Mode of directories the installer creates for an install path.
pub const DIR_MODE: u32 = 0o755;

mod archive;
mod check;
mod download;
mod place;
mod policy;

use archive::extract_archive;
pub use archive::{ArchiveError, check_entry_path, check_symlink_target};
pub use check::{CheckedComponent, CheckedComponents, Source, check_all, display_url};
pub use download::DownloadError;
use place::{create_dirs, place_file};
pub use policy::{DownloadPolicy, is_retriable_status};

/// A component could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum ComponentError {
    /// The hash is missing or malformed (checked before downloading).
    #[error("component {url}: {reason}")]
    Hash {
        /// The component's URL (shortened).
        url: String,
        /// What is wrong.
        #[source]
        reason: HashFormatError,
    },
    /// The URL is not supported.
    #[error("component {url}: {reason}")]
    Url {
        /// The URL (shortened).
        url: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// The `data:` URL does not decode.
    #[error("component {url}")]
    DataUrl {
        /// The URL (shortened).
        url: String,
        /// What is wrong.
        #[source]
        reason: DataUrlError,
    },
    /// The install path is refused.
    #[error("install path {path:?} {reason}")]
    InstallPath {
        /// The path.
        path: PathBuf,
        /// What is wrong.
        reason: &'static str,
    },
    /// The HTTPS client could not be set up.
    #[error("cannot set up the HTTPS client: {0}")]
    Tls(String),
    /// Every attempt failed (or one failed in a way that is not retried).
    #[error("downloading {url} failed after {attempts} attempt(s)")]
    Download {
        /// The URL (shortened).
        url: String,
        /// How many attempts were made.
        attempts: u32,
        /// The last failure.
        #[source]
        source: DownloadError,
    },
    /// The bytes do not have the expected hash.
    #[error("{url}: hash mismatch: expected {expected}, got {actual}")]
    HashMismatch {
        /// The URL (shortened).
        url: String,
        /// The component's hash.
        expected: Sha256Hash,
        /// The hash of what was received.
        actual: Sha256Hash,
    },
    /// The archive is refused; nothing was installed from it.
    #[error("archive for {path:?}")]
    Archive {
        /// The install path.
        path: PathBuf,
        /// What is wrong.
        #[source]
        source: ArchiveError,
    },
    /// A file operation failed.
    #[error(transparent)]
    Io(#[from] PathError),
}

pub(crate) fn io_err<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> ComponentError + 'a {
    move |source| PathError::at(what, path)(source).into()
}

pub(crate) type HttpsClient = Client<HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// Downloads, checks and installs components.
#[derive(Clone)]
pub struct Installer {
    client: HttpsClient,
    policy: Arc<DownloadPolicy>,
}

impl fmt::Debug for Installer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Installer")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl Installer {
    /// An installer trusting Mozilla's root CAs (compiled in) for HTTPS.
    pub fn new(policy: DownloadPolicy) -> Result<Self, ComponentError> {
        let roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        Self::with_roots(policy, roots)
    }

    /// An installer trusting the given roots for HTTPS (tests, private mirrors).
    pub fn with_roots(
        policy: DownloadPolicy,
        roots: rustls::RootCertStore,
    ) -> Result<Self, ComponentError> {
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| ComponentError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .build();
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Ok(Self {
            client,
            policy: Arc::new(policy),
        })
    }

    /// Checks every component first (a missing or malformed hash, URL or path refuses the
    /// whole list before anything is downloaded), then installs them in order.
    pub async fn install_all(&self, components: &[Component]) -> Result<(), ComponentError> {
        self.install_checked(&check_all(components)?).await
    }

    /// Installs components that were checked already ([`CheckedComponents::checked`]), in
    /// order.
    pub async fn install_checked(
        &self,
        checked: &[CheckedComponent],
    ) -> Result<(), ComponentError> {
        // The whole list first, as checked: what the node will fetch and the hash each must
        // have, logged even when the first download fails.
        for c in checked {
            info!(url = ?c.source, hash = %c.hash, path = %c.install_path.display(), extract = c.extract, "component to install");
        }
        for c in checked {
            self.install(c).await?;
        }
        if !checked.is_empty() {
            info!(count = checked.len(), "installed the Kubernetes components");
        }
        Ok(())
    }

    /// Downloads one component, checks its hash and installs it.
    pub async fn install(&self, c: &CheckedComponent) -> Result<(), ComponentError> {
        let parent = c
            .install_path
            .parent()
            .ok_or(ComponentError::InstallPath {
                path: c.install_path.clone(),
                reason: "has no parent directory",
            })?
            .to_path_buf();
        // The download lands next to its destination, so the final rename stays on one
        // file system.
        let staging_dir = if c.extract {
            c.install_path.clone()
        } else {
            parent.clone()
        };
        create_dirs(&staging_dir).map_err(io_err("cannot create directory", &staging_dir))?;
        let name = c
            .install_path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = tempfile::Builder::new()
            .prefix(&format!(".{name}.download-"))
            .tempfile_in(&staging_dir)
            .map_err(io_err("cannot create a temporary file in", &staging_dir))?;
        let label = format!("{:?}", c.source);
        let (tmp, actual) = match &c.source {
            Source::Data(bytes) => {
                let mut tmp = tmp;
                tmp.as_file_mut()
                    .write_all(bytes)
                    .map_err(io_err("cannot write", &c.install_path))?;
                (tmp, Sha256Hash::of(bytes))
            }
            Source::Http(uri) => {
                // What is fetched, and the hash it must have, before anything is: a node
                // that cannot reach the URL still shows what it was told to install.
                info!(url = %label, hash = %c.hash, path = %c.install_path.display(), "downloading component");
                self.download_with_retries(uri, tmp).await?
            }
        };
        if actual != c.hash {
            return Err(ComponentError::HashMismatch {
                url: label,
                expected: c.hash,
                actual,
            });
        }
        debug!(url = %label, hash = %actual, "hash verified");
        let c2 = c.clone();
        let policy = self.policy.clone();
        tokio::task::spawn_blocking(move || {
            if c2.extract {
                extract_archive(tmp.path(), &c2.install_path, &policy)
            } else {
                place_file(tmp, &c2.install_path)
            }
        })
        .await
        .map_err(|e| {
            PathError::at("the install task failed for", &c.install_path)(io::Error::other(
                e.to_string(),
            ))
        })??;
        info!(url = %label, path = %c.install_path.display(), extract = c.extract, "installed component");
        Ok(())
    }
}

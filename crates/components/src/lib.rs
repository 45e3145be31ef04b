//! The component installer: downloads the Kubernetes binaries and archives
//! an init request or join ticket names, checks each against its SHA-256 hash, and installs
//! it atomically.
//!
//! Changes from the original:
//! * the hash is **mandatory**: a component without a well-formed `sha256:<64 lowercase hex>`
//!   is refused before anything is downloaded;
//! * retries back off exponentially (bounded attempts, a timeout per attempt) instead of a
//!   10 ms hot loop;
//! * archives are unpacked into a temporary directory first; `..`, absolute paths, paths
//!   through symlinks, and symlinks or hard links pointing outside the destination are
//!   refused, and symlinks are created the right way round (link name → target);
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
#![forbid(unsafe_code)]

use std::collections::HashSet;
use std::fmt;
use std::fs::{self, File};
use std::io::{self, Read, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::path::{Component as PathPart, Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use asterism_basics::error_chain;
use bytes::Bytes;
use http::{StatusCode, Uri};
use http_body_util::{BodyExt as _, Empty};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use sha2::{Digest as _, Sha256};
use tracing::{debug, info, warn};

// The wire type and hashing, shared with the versions table.
pub use asterism_kubernetes_versions::{
    Component, DataUrlError, HashFormatError, Sha256Hash, decode_data_url, is_data_url, list_hash,
};

/// Mode of an installed (non-archive) component: read and execute for its owner, read for
/// everyone else, as the original installs them.
pub const BINARY_MODE: u32 = 0o544;
/// Mode bits an archive entry may keep: no setuid/setgid/sticky, no group or world write.
pub const ARCHIVE_MODE_MASK: u32 = 0o755;
/// Mode of directories the installer creates for an install path.
pub const DIR_MODE: u32 = 0o755;

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
fn redacted_uri(uri: &Uri) -> String {
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

/// Retries, timeouts and size limits of downloads and archives.
#[derive(Debug, Clone)]
pub struct DownloadPolicy {
    /// How many attempts at most (≥ 1).
    pub max_attempts: u32,
    /// The pause after the first failed attempt; it doubles after each further one.
    pub initial_backoff: Duration,
    /// The longest pause.
    pub max_backoff: Duration,
    /// The deadline of one attempt, body included.
    pub attempt_timeout: Duration,
    /// The largest resource accepted, bytes.
    pub max_size: u64,
    /// The most bytes an archive may unpack to.
    pub max_extracted_size: u64,
    /// The most entries an archive may hold.
    pub max_entries: u64,
    /// How many redirects are followed.
    pub max_redirects: u32,
    /// The shortest interval between two progress lines of one download.
    pub progress_interval: Duration,
}

impl Default for DownloadPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 8,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
            attempt_timeout: Duration::from_secs(10 * 60),
            max_size: 1 << 30,
            max_extracted_size: 4 << 30,
            max_entries: 100_000,
            max_redirects: 10,
            progress_interval: Duration::from_secs(5),
        }
    }
}

impl DownloadPolicy {
    /// The pause before attempt `attempt + 1` after `attempt` (1-based) failed:
    /// `initial · 2^(attempt−1)`, at most `max_backoff`.
    #[must_use]
    pub fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u32
            .checked_shl(attempt.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.initial_backoff
            .checked_mul(factor)
            .unwrap_or(self.max_backoff)
            .min(self.max_backoff)
    }
}

/// Whether an HTTP status is worth another attempt: 408, 425, 429, 502, 503 and 504, as in
/// the original.
#[must_use]
pub fn is_retriable_status(status: StatusCode) -> bool {
    matches!(status.as_u16(), 408 | 425 | 429 | 502 | 503 | 504)
}

/// Why an archive is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArchiveError {
    /// An entry path is absolute.
    #[error("entry {0:?} has an absolute path")]
    AbsolutePath(PathBuf),
    /// An entry path has a `..` element.
    #[error("entry {0:?} has a '..' element")]
    ParentElement(PathBuf),
    /// An entry path is empty.
    #[error("an entry has an empty path")]
    EmptyPath,
    /// A symlink's target leaves the destination.
    #[error("symlink {link:?} points outside the destination ({target:?})")]
    SymlinkEscapes {
        /// The link.
        link: PathBuf,
        /// Its target.
        target: PathBuf,
    },
    /// A hard link's target is not a file extracted before it.
    #[error("hard link {link:?} points to {target:?}, which is not a file of the archive")]
    HardlinkTarget {
        /// The link.
        link: PathBuf,
        /// Its target.
        target: PathBuf,
    },
    /// An entry path goes through a symlink of the archive.
    #[error("entry {0:?} goes through a symlink")]
    ThroughSymlink(PathBuf),
    /// An entry type other than file, directory, symlink and hard link.
    #[error("entry {path:?} has an unsupported type ({kind})")]
    EntryType {
        /// The entry.
        path: PathBuf,
        /// Its type.
        kind: String,
    },
    /// Too many entries or bytes.
    #[error("the archive unpacks to more than {0}")]
    TooLarge(String),
    /// The gzip or tar data is corrupt.
    #[error("the archive is corrupt: {0}")]
    Corrupt(String),
    /// A directory of the archive would replace a file of the destination or the reverse.
    #[error("entry {0:?} clashes with what is installed")]
    Clash(PathBuf),
}

/// Checks an archive entry path: relative, no `..`, not empty; `.` elements are dropped.
pub fn check_entry_path(path: &Path) -> Result<PathBuf, ArchiveError> {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            PathPart::Normal(p) => out.push(p),
            PathPart::CurDir => {}
            PathPart::ParentDir => return Err(ArchiveError::ParentElement(path.to_path_buf())),
            PathPart::RootDir | PathPart::Prefix(_) => {
                return Err(ArchiveError::AbsolutePath(path.to_path_buf()));
            }
        }
    }
    if out.as_os_str().is_empty() {
        return Err(ArchiveError::EmptyPath);
    }
    Ok(out)
}

/// Checks that a symlink at `link` (a checked entry path) pointing to `target` stays inside
/// the destination: the target is relative and, resolved from the link's directory, never
/// climbs above the destination root. (Symlinks among the link's parents are refused
/// separately when entries are written.)
pub fn check_symlink_target(link: &Path, target: &Path) -> Result<(), ArchiveError> {
    let escapes = || ArchiveError::SymlinkEscapes {
        link: link.to_path_buf(),
        target: target.to_path_buf(),
    };
    if target.as_os_str().is_empty() {
        return Err(escapes());
    }
    let mut depth: usize = link.components().count().saturating_sub(1);
    for part in target.components() {
        match part {
            PathPart::Normal(_) => depth += 1,
            PathPart::CurDir => {}
            PathPart::ParentDir => depth = depth.checked_sub(1).ok_or_else(escapes)?,
            PathPart::RootDir | PathPart::Prefix(_) => return Err(escapes()),
        }
    }
    Ok(())
}

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
    #[error("{what} {path:?}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// Why one download attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    /// Connecting or reading failed (retried).
    #[error("transport error: {0}")]
    Transport(String),
    /// The attempt took longer than the policy allows (retried).
    #[error("the attempt timed out after {0:?}")]
    Timeout(Duration),
    /// The server answered with a status (retried for 408, 425, 429, 502, 503, 504).
    #[error("the server answered {0}")]
    Status(StatusCode),
    /// The resource is larger than the policy allows (not retried).
    #[error("the resource is larger than {0} bytes")]
    TooLarge(u64),
    /// Too many redirects, or a redirect without a usable location (not retried).
    #[error("redirect: {0}")]
    Redirect(String),
    /// Writing the temporary file failed (not retried).
    #[error("writing the download to disk")]
    Write(#[source] io::Error),
}

impl DownloadError {
    /// Whether another attempt may succeed.
    #[must_use]
    pub fn is_retriable(&self) -> bool {
        match self {
            Self::Transport(_) | Self::Timeout(_) => true,
            Self::Status(s) => is_retriable_status(*s),
            Self::TooLarge(_) | Self::Redirect(_) | Self::Write(_) => false,
        }
    }
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> ComponentError + 'a {
    move |source| ComponentError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

type HttpsClient = Client<HttpsConnector<HttpConnector>, Empty<Bytes>>;

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
            Source::Http(uri) => self.download_with_retries(uri, tmp).await?,
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
        .map_err(|e| ComponentError::Io {
            what: "the install task failed for",
            path: c.install_path.clone(),
            source: io::Error::other(e.to_string()),
        })??;
        info!(url = %label, path = %c.install_path.display(), extract = c.extract, "installed component");
        Ok(())
    }

    async fn download_with_retries(
        &self,
        uri: &Uri,
        tmp: tempfile::NamedTempFile,
    ) -> Result<(tempfile::NamedTempFile, Sha256Hash), ComponentError> {
        let label = redacted_uri(uri);
        let max_attempts = self.policy.max_attempts.max(1);
        let mut attempt = 0;
        let std_file = tmp.reopen().map_err(io_err("cannot open", tmp.path()))?;
        let mut file = tokio::fs::File::from_std(std_file);
        loop {
            attempt += 1;
            let result = tokio::time::timeout(
                self.policy.attempt_timeout,
                self.download_once(uri, &mut file),
            )
            .await
            .unwrap_or(Err(DownloadError::Timeout(self.policy.attempt_timeout)));
            match result {
                Ok(hash) => {
                    file.sync_all()
                        .await
                        .map_err(io_err("cannot sync", tmp.path()))?;
                    return Ok((tmp, hash));
                }
                Err(e) if e.is_retriable() && attempt < max_attempts => {
                    let pause = self.policy.backoff(attempt);
                    warn!(url = %label, attempt, error = %e, retry_in = ?pause, "download attempt failed; retrying");
                    tokio::time::sleep(pause).await;
                }
                Err(source) => {
                    return Err(ComponentError::Download {
                        url: label,
                        attempts: attempt,
                        source,
                    });
                }
            }
        }
    }

    /// One attempt: follows redirects, streams the body into `file` (from its start),
    /// hashing as it goes.
    async fn download_once(
        &self,
        uri: &Uri,
        file: &mut tokio::fs::File,
    ) -> Result<Sha256Hash, DownloadError> {
        use tokio::io::AsyncWriteExt as _;
        let mut current = uri.clone();
        let mut redirects = 0;
        let response = loop {
            let request = http::Request::get(current.clone())
                .header(http::header::USER_AGENT, "asterism-component-installer")
                .body(Empty::<Bytes>::new())
                .map_err(|e| DownloadError::Transport(e.to_string()))?;
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| DownloadError::Transport(error_chain(&e)))?;
            let status = response.status();
            if status.is_redirection() && status != StatusCode::NOT_MODIFIED {
                redirects += 1;
                if redirects > self.policy.max_redirects {
                    return Err(DownloadError::Redirect(format!(
                        "more than {} redirects",
                        self.policy.max_redirects
                    )));
                }
                let next = response
                    .headers()
                    .get(http::header::LOCATION)
                    .and_then(|l| l.to_str().ok())
                    .and_then(|l| resolve_location(&current, l))
                    .ok_or_else(|| DownloadError::Redirect("no usable Location".into()))?;
                if current.scheme_str() == Some("https") && next.scheme_str() != Some("https") {
                    return Err(DownloadError::Redirect(
                        "refusing a redirect from https to http".into(),
                    ));
                }
                debug!(from = %redacted_uri(&current), to = %redacted_uri(&next), "following a redirect");
                current = next;
                continue;
            }
            if !status.is_success() {
                return Err(DownloadError::Status(status));
            }
            break response;
        };
        let expected_len = response
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if let Some(len) = expected_len
            && len > self.policy.max_size
        {
            return Err(DownloadError::TooLarge(self.policy.max_size));
        }
        file.set_len(0).await.map_err(DownloadError::Write)?;
        tokio::io::AsyncSeekExt::rewind(file)
            .await
            .map_err(DownloadError::Write)?;
        let mut hasher = Sha256::new();
        let mut received: u64 = 0;
        let mut progress = Progress::new(
            redacted_uri(&current),
            expected_len,
            self.policy.progress_interval,
        );
        let mut body = response.into_body();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| DownloadError::Transport(error_chain(&e)))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            received = received.saturating_add(data.len() as u64);
            if received > self.policy.max_size {
                return Err(DownloadError::TooLarge(self.policy.max_size));
            }
            hasher.update(&data);
            file.write_all(&data).await.map_err(DownloadError::Write)?;
            progress.update(received, Instant::now());
        }
        if let Some(len) = expected_len
            && received != len
        {
            return Err(DownloadError::Transport(format!(
                "the body ended after {received} of {len} bytes"
            )));
        }
        file.flush().await.map_err(DownloadError::Write)?;
        progress.done(received);
        Ok(Sha256Hash::from_bytes(hasher.finalize().into()))
    }
}

/// Resolves a `Location` header against the request URI (absolute, or an absolute path).
fn resolve_location(base: &Uri, location: &str) -> Option<Uri> {
    let loc: Uri = location.parse().ok()?;
    if loc.scheme().is_some() {
        return matches!(loc.scheme_str(), Some("http" | "https")).then_some(loc);
    }
    if !location.starts_with('/') || location.starts_with("//") {
        return None;
    }
    let mut parts = http::uri::Parts::default();
    parts.scheme = base.scheme().cloned();
    parts.authority = base.authority().cloned();
    parts.path_and_query = loc.path_and_query().cloned();
    Uri::from_parts(parts).ok()
}

/// Rate-limited progress lines for large downloads.
struct Progress {
    url: String,
    total: Option<u64>,
    interval: Duration,
    started: Instant,
    last: Instant,
    logged: bool,
}

/// Downloads smaller than this get no progress lines.
const PROGRESS_MIN_BYTES: u64 = 8 << 20;

impl Progress {
    fn new(url: String, total: Option<u64>, interval: Duration) -> Self {
        let now = Instant::now();
        Self {
            url,
            total,
            interval,
            started: now,
            last: now,
            logged: false,
        }
    }

    fn update(&mut self, received: u64, now: Instant) {
        if received < PROGRESS_MIN_BYTES || now.duration_since(self.last) < self.interval {
            return;
        }
        self.last = now;
        self.logged = true;
        match self.total {
            Some(total) if total > 0 => {
                info!(url = %self.url, received_mib = received >> 20, total_mib = total >> 20, percent = received.saturating_mul(100) / total, "downloading")
            }
            _ => info!(url = %self.url, received_mib = received >> 20, "downloading"),
        }
    }

    fn done(&self, received: u64) {
        if self.logged || received >= PROGRESS_MIN_BYTES {
            info!(url = %self.url, bytes = received, seconds = self.started.elapsed().as_secs_f32(), "download complete");
        }
    }
}

fn create_dirs(dir: &Path) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Gives the verified temporary file its mode and renames it over the destination.
fn place_file(tmp: tempfile::NamedTempFile, dest: &Path) -> Result<(), ComponentError> {
    let parent = dest.parent().unwrap_or(Path::new("/"));
    tmp.as_file()
        .set_permissions(fs::Permissions::from_mode(BINARY_MODE))
        .map_err(io_err("cannot set the mode of", dest))?;
    tmp.as_file()
        .sync_all()
        .map_err(io_err("cannot sync", dest))?;
    if fs::symlink_metadata(dest).is_ok_and(|m| m.is_dir()) {
        return Err(ComponentError::InstallPath {
            path: dest.to_path_buf(),
            reason: "is a directory",
        });
    }
    tmp.persist(dest).map_err(|e| ComponentError::Io {
        what: "cannot rename the download to",
        path: dest.to_path_buf(),
        source: e.error,
    })?;
    sync_dir(parent).map_err(io_err("cannot sync", parent))
}

/// Unpacks the verified archive at `archive` under `dest`: everything goes into a
/// temporary directory inside `dest` first; only a completely unpacked, checked tree is
/// moved into place (entry by entry, each a rename).
fn extract_archive(
    archive: &Path,
    dest: &Path,
    policy: &DownloadPolicy,
) -> Result<(), ComponentError> {
    let staging = tempfile::Builder::new()
        .prefix(".extract-")
        .tempdir_in(dest)
        .map_err(io_err("cannot create a temporary directory in", dest))?;
    let file = File::open(archive).map_err(io_err("cannot open", archive))?;
    let archive_err = |source| ComponentError::Archive {
        path: dest.to_path_buf(),
        source,
    };
    let dir_modes = unpack(file, staging.path(), policy).map_err(|e| match e {
        UnpackError::Archive(a) => archive_err(a),
        UnpackError::Io { what, path, source } => ComponentError::Io { what, path, source },
    })?;
    // Final directory modes, deepest first, once nothing more is written into them.
    let mut dirs: Vec<_> = dir_modes.into_iter().collect();
    dirs.sort_by_key(|(p, _)| std::cmp::Reverse(p.components().count()));
    for (rel, mode) in &dirs {
        let path = staging.path().join(rel);
        fs::set_permissions(&path, fs::Permissions::from_mode(*mode))
            .map_err(io_err("cannot set the mode of", &path))?;
    }
    merge_into(staging.path(), dest).map_err(|e| match e {
        UnpackError::Archive(a) => archive_err(a),
        UnpackError::Io { what, path, source } => ComponentError::Io { what, path, source },
    })?;
    sync_dir(dest).map_err(io_err("cannot sync", dest))?;
    Ok(())
}

#[derive(Debug)]
enum UnpackError {
    Archive(ArchiveError),
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

impl From<ArchiveError> for UnpackError {
    fn from(e: ArchiveError) -> Self {
        Self::Archive(e)
    }
}

fn uio<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> UnpackError + 'a {
    move |source| UnpackError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// Refuses `rel` when any of its parents inside `root` is a symlink (an entry must not be
/// written through a link the archive created), and creates missing parents.
fn prepare_parent(
    root: &Path,
    rel: &Path,
    dir_modes: &mut Vec<(PathBuf, u32)>,
) -> Result<(), UnpackError> {
    let mut cur = root.to_path_buf();
    let mut rel_cur = PathBuf::new();
    let parents: Vec<_> = rel
        .parent()
        .map(|p| p.components().collect())
        .unwrap_or_default();
    for part in parents {
        cur.push(part);
        rel_cur.push(part);
        match fs::symlink_metadata(&cur) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(ArchiveError::ThroughSymlink(rel.to_path_buf()).into());
            }
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(ArchiveError::Clash(rel.to_path_buf()).into()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::DirBuilder::new()
                    .mode(0o700)
                    .create(&cur)
                    .map_err(uio("cannot create directory", &cur))?;
                dir_modes.push((rel_cur.clone(), DIR_MODE));
            }
            Err(e) => return Err(uio("cannot inspect", &cur)(e)),
        }
    }
    Ok(())
}

/// Removes whatever an earlier entry left at `path` (a later entry replaces it, as tar
/// does), refusing to replace a directory by a non-directory.
fn clear_slot(path: &Path, rel: &Path) -> Result<(), UnpackError> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => Err(ArchiveError::Clash(rel.to_path_buf()).into()),
        Ok(_) => fs::remove_file(path).map_err(uio("cannot replace", path)),
        Err(_) => Ok(()),
    }
}

/// Unpacks a gzip-compressed tar under `root` (an empty private directory). Returns the
/// final modes of the directories it created.
fn unpack(
    file: File,
    root: &Path,
    policy: &DownloadPolicy,
) -> Result<Vec<(PathBuf, u32)>, UnpackError> {
    let corrupt = |e: io::Error| UnpackError::Archive(ArchiveError::Corrupt(e.to_string()));
    let gz = flate2::read::GzDecoder::new(io::BufReader::new(file));
    let mut archive = tar::Archive::new(gz);
    let mut dir_modes: Vec<(PathBuf, u32)> = Vec::new();
    let mut files: HashSet<PathBuf> = HashSet::new();
    let mut total: u64 = 0;
    let mut count: u64 = 0;
    for entry in archive.entries().map_err(corrupt)? {
        let mut entry = entry.map_err(corrupt)?;
        count += 1;
        if count > policy.max_entries {
            return Err(ArchiveError::TooLarge(format!("{} entries", policy.max_entries)).into());
        }
        let raw_path = entry.path().map_err(corrupt)?.into_owned();
        let kind = entry.header().entry_type();
        if matches!(
            kind,
            tar::EntryType::XGlobalHeader | tar::EntryType::XHeader
        ) {
            continue;
        }
        // `./` (the destination itself) is listed by many archives; nothing to create.
        if kind == tar::EntryType::Directory
            && raw_path.components().all(|p| matches!(p, PathPart::CurDir))
        {
            continue;
        }
        let rel = check_entry_path(&raw_path)?;
        let path = root.join(&rel);
        let mode = entry.header().mode().map_err(corrupt)? & ARCHIVE_MODE_MASK;
        prepare_parent(root, &rel, &mut dir_modes)?;
        match kind {
            tar::EntryType::Directory => {
                match fs::symlink_metadata(&path) {
                    Ok(m) if m.is_dir() => {}
                    Ok(_) => return Err(ArchiveError::Clash(rel).into()),
                    Err(_) => fs::DirBuilder::new()
                        .mode(0o700)
                        .create(&path)
                        .map_err(uio("cannot create directory", &path))?,
                }
                // Owners must be able to enter and write; the rest follows the header.
                dir_modes.retain(|(p, _)| *p != rel);
                dir_modes.push((rel, mode | 0o700));
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let size = entry.header().size().map_err(corrupt)?;
                total = total.saturating_add(size);
                if total > policy.max_extracted_size {
                    return Err(ArchiveError::TooLarge(format!(
                        "{} bytes",
                        policy.max_extracted_size
                    ))
                    .into());
                }
                clear_slot(&path, &rel)?;
                let mut out = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&path)
                    .map_err(uio("cannot create", &path))?;
                let copied = io::copy(&mut (&mut entry).take(size), &mut out).map_err(corrupt)?;
                if copied != size {
                    return Err(ArchiveError::Corrupt(format!("{rel:?} is truncated")).into());
                }
                out.set_permissions(fs::Permissions::from_mode(mode))
                    .map_err(uio("cannot set the mode of", &path))?;
                out.sync_all().map_err(uio("cannot sync", &path))?;
                files.insert(rel);
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name()
                    .map_err(corrupt)?
                    .ok_or_else(|| ArchiveError::Corrupt(format!("symlink {rel:?} has no target")))?
                    .into_owned();
                check_symlink_target(&rel, &target)?;
                clear_slot(&path, &rel)?;
                // symlink(original = target, link = path): the link named `path` points to
                // `target` (the original had these two swapped).
                std::os::unix::fs::symlink(&target, &path)
                    .map_err(uio("cannot create symlink", &path))?;
                files.remove(&rel);
            }
            tar::EntryType::Link => {
                let target_raw = entry
                    .link_name()
                    .map_err(corrupt)?
                    .ok_or_else(|| {
                        ArchiveError::Corrupt(format!("hard link {rel:?} has no target"))
                    })?
                    .into_owned();
                let hardlink_err = || ArchiveError::HardlinkTarget {
                    link: rel.clone(),
                    target: target_raw.clone(),
                };
                let target = check_entry_path(&target_raw).map_err(|_| hardlink_err())?;
                // Only a regular file this archive wrote, reached without symlinks.
                if !files.contains(&target) {
                    return Err(hardlink_err().into());
                }
                prepare_parent(root, &target, &mut dir_modes).map_err(|_| hardlink_err())?;
                let target_path = root.join(&target);
                if !fs::symlink_metadata(&target_path).is_ok_and(|m| m.is_file()) {
                    return Err(hardlink_err().into());
                }
                clear_slot(&path, &rel)?;
                fs::hard_link(&target_path, &path)
                    .map_err(uio("cannot create hard link", &path))?;
                files.insert(rel);
            }
            other => {
                return Err(ArchiveError::EntryType {
                    path: rel,
                    kind: format!("{other:?}"),
                }
                .into());
            }
        }
    }
    Ok(dir_modes)
}

/// Moves the unpacked tree at `src` into `dest`: a directory that exists in both is merged,
/// anything else is renamed over what is there.
fn merge_into(src: &Path, dest: &Path) -> Result<(), UnpackError> {
    let mut entries: Vec<_> = fs::read_dir(src)
        .map_err(uio("cannot read", src))?
        .collect::<Result<_, _>>()
        .map_err(uio("cannot read", src))?;
    entries.sort_by_key(fs::DirEntry::file_name);
    for entry in entries {
        let from = entry.path();
        let to = dest.join(entry.file_name());
        let from_is_dir = entry
            .file_type()
            .map_err(uio("cannot inspect", &from))?
            .is_dir();
        let existing = fs::symlink_metadata(&to).ok();
        match existing {
            Some(m) if m.is_dir() && from_is_dir => {
                // An existing directory keeps its mode; the archive's entries go into it.
                fs::set_permissions(&from, fs::Permissions::from_mode(0o700))
                    .map_err(uio("cannot set the mode of", &from))?;
                merge_into(&from, &to)?;
                fs::remove_dir(&from).map_err(uio("cannot remove", &from))?;
            }
            Some(m) if m.is_dir() => return Err(ArchiveError::Clash(to).into()),
            _ => fs::rename(&from, &to).map_err(uio("cannot move into place", &to))?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

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
    fn backoff_doubles_up_to_the_cap() {
        let p = DownloadPolicy {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(350),
            ..DownloadPolicy::default()
        };
        assert_eq!(p.backoff(1), Duration::from_millis(100));
        assert_eq!(p.backoff(2), Duration::from_millis(200));
        assert_eq!(p.backoff(3), Duration::from_millis(350));
        assert_eq!(p.backoff(40), Duration::from_millis(350));
    }

    #[test]
    fn only_the_listed_statuses_are_retried() {
        for s in [408, 425, 429, 502, 503, 504] {
            assert!(is_retriable_status(StatusCode::from_u16(s).unwrap()), "{s}");
        }
        for s in [400, 401, 403, 404, 410, 500, 501] {
            assert!(
                !is_retriable_status(StatusCode::from_u16(s).unwrap()),
                "{s}"
            );
        }
    }

    #[test]
    fn entry_paths_with_parent_elements_or_absolute_paths_are_refused() {
        assert_eq!(
            check_entry_path(Path::new("./bin/x")).unwrap(),
            Path::new("bin/x")
        );
        assert!(matches!(
            check_entry_path(Path::new("../evil")),
            Err(ArchiveError::ParentElement(_))
        ));
        assert!(matches!(
            check_entry_path(Path::new("a/../../evil")),
            Err(ArchiveError::ParentElement(_))
        ));
        assert!(matches!(
            check_entry_path(Path::new("/abs")),
            Err(ArchiveError::AbsolutePath(_))
        ));
        assert!(matches!(
            check_entry_path(Path::new("./")),
            Err(ArchiveError::EmptyPath)
        ));
    }

    #[test]
    fn symlink_targets_must_stay_inside() {
        assert!(check_symlink_target(Path::new("bin/x"), Path::new("y")).is_ok());
        assert!(check_symlink_target(Path::new("bin/x"), Path::new("../lib/y")).is_ok());
        assert!(check_symlink_target(Path::new("bin/x"), Path::new("../../y")).is_err());
        assert!(check_symlink_target(Path::new("x"), Path::new("..")).is_err());
        assert!(check_symlink_target(Path::new("x"), Path::new("/etc/passwd")).is_err());
        assert!(check_symlink_target(Path::new("a/b/x"), Path::new("../../c/../../d")).is_err());
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

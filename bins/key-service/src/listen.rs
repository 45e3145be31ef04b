//! Where the service listens, and binding it safely.
//!
//! The service speaks plaintext gRPC without authenticating its callers, so it may only
//! listen where the operating system decides who can connect: a Unix socket (mode 0600),
//! reachable by the service's user and root. A loopback TCP address, which
//! [`KeyServiceAddress`] (the one address type of the service and its clients) can name, is
//! refused: every local user, and every process in the pod's network namespace, could
//! connect to it and derive every key.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use asterism_kms::KeyServiceAddress;
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;

use crate::serve::{Limits, ServeError, serve_with_limits};
use crate::service::KeyService;

/// Why binding failed.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// The socket path has no parent directory or no file name.
    #[error("the socket path {} has no parent directory or file name", .0.display())]
    BadPath(PathBuf),
    /// Something other than a socket is at the socket path.
    #[error("refusing to replace {}: it exists and is not a socket", .0.display())]
    NotASocket(PathBuf),
    /// A running server answers on the socket path.
    #[error("{} is in use: a running server accepts connections on it", .0.display())]
    InUse(PathBuf),
    /// A file-system step failed.
    #[error("cannot {action} {}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// On which path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A TCP address: plaintext on TCP is open to every local user.
    #[error(
        "refusing plaintext gRPC on {addr}: any local user could connect to a TCP port and derive every key; listen on a Unix socket (unix:/path, created mode 0600) instead"
    )]
    PlaintextTcp {
        /// The address.
        addr: SocketAddr,
    },
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> BindError {
    let path = path.to_owned();
    move |source| BindError::Io {
        action,
        path,
        source,
    }
}

/// A bound listener, ready to serve.
#[derive(Debug)]
pub enum Listener {
    /// A Unix socket; the socket file is removed when this is dropped.
    Unix {
        /// The listener.
        listener: UnixListener,
        /// The socket file.
        socket: SocketFile,
    },
}

impl Listener {
    /// Binds `address`, which must be a Unix socket ([`BindError::PlaintextTcp`]
    /// otherwise). The socket is created with mode 0600 (it is bound inside a fresh 0700
    /// directory, restricted and then moved into place, so it is never reachable with
    /// wider permissions); a stale socket at the path is replaced, anything else there is
    /// left alone and reported.
    pub async fn bind(address: &KeyServiceAddress) -> Result<Listener, BindError> {
        match address {
            KeyServiceAddress::Unix(path) => bind_unix(path),
            KeyServiceAddress::Tcp(addr) => Err(BindError::PlaintextTcp { addr: *addr }),
        }
    }

    /// Where the listener listens, for logs and clients (`unix:/path` or `IP:PORT`, with
    /// the actual port when port 0 was asked for).
    pub fn local_addr(&self) -> io::Result<KeyServiceAddress> {
        match self {
            Self::Unix { socket, .. } => Ok(KeyServiceAddress::Unix(socket.path.clone())),
        }
    }

    /// Serves the key service on this listener until `shutdown` completes (see
    /// [`serve_with_limits`]). A Unix socket file is removed afterwards.
    pub async fn serve(
        self,
        service: KeyService,
        limits: &Limits,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), ServeError> {
        match self {
            Self::Unix { listener, socket } => {
                let result =
                    serve_with_limits(UnixListenerStream::new(listener), service, limits, shutdown)
                        .await;
                drop(socket);
                result
            }
        }
    }
}

/// The socket file of a bound Unix listener. Dropping it removes the file, if the file at
/// the path is still this socket.
#[derive(Debug)]
pub struct SocketFile {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl SocketFile {
    /// The socket path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let ours = std::fs::symlink_metadata(&self.path)
            .map(|m| m.file_type().is_socket() && m.dev() == self.dev && m.ino() == self.ino)
            .unwrap_or(false);
        if ours && let Err(err) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %err, "cannot remove the socket file");
        }
    }
}

fn bind_unix(path: &Path) -> Result<Listener, BindError> {
    let (Some(parent), Some(_)) = (path.parent(), path.file_name()) else {
        return Err(BindError::BadPath(path.to_owned()));
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };

    remove_stale_socket(path)?;

    // Bind inside a private directory so that nobody can connect before the mode is set.
    let nonce = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let private_dir = parent.join(format!(".{}.{:x}", std::process::id(), nonce));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&private_dir)
        .map_err(io_err("create the private directory", &private_dir))?;
    let staged = private_dir.join("s");
    let result = (|| {
        let listener = UnixListener::bind(&staged).map_err(io_err("bind", &staged))?;
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))
            .map_err(io_err("set mode 0600 on", &staged))?;
        std::fs::rename(&staged, path).map_err(io_err("move the socket to", path))?;
        Ok(listener)
    })();
    let cleanup = std::fs::remove_dir_all(&private_dir);
    let listener = result?;
    if let Err(err) = cleanup {
        tracing::warn!(path = %private_dir.display(), error = %err, "cannot remove the private directory");
    }

    let meta = std::fs::symlink_metadata(path).map_err(io_err("inspect", path))?;
    tracing::debug!(path = %path.display(), "bound unix socket with mode 0600");
    Ok(Listener::Unix {
        listener,
        socket: SocketFile {
            path: path.to_owned(),
            dev: meta.dev(),
            ino: meta.ino(),
        },
    })
}

/// Removes a socket left behind at `path` by a server that is gone. Refuses if anything
/// other than a socket is there, or if a server still answers on it.
fn remove_stale_socket(path: &Path) -> Result<(), BindError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(io_err("inspect", path)(err)),
    };
    if !meta.file_type().is_socket() {
        return Err(BindError::NotASocket(path.to_owned()));
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(BindError::InUse(path.to_owned()));
    }
    tracing::info!(path = %path.display(), "removing a stale socket");
    std::fs::remove_file(path).map_err(io_err("remove the stale socket", path))
}

//! A Unix socket that only its owner and root can reach, from its first moment.
//!
//! The key service's gRPC socket and the join service's admin socket serve whoever connects
//! (the admin socket checks its peer's user as well), so the file's mode is their first
//! gate. [`bind_private`] binds the socket inside a fresh directory of mode 0700, sets the
//! socket's mode to 0600 there, and only then links it to its path (a link never replaces
//! a file): at no moment can another user connect through a wider mode. The staged path
//! is about 20 bytes longer than the socket's, within the 107 bytes a socket path may have. A socket left at the path by a server that
//! is gone is replaced; a socket a running server still answers on, or anything that is not
//! a socket, is left alone and reported. The [`SocketFile`] removes the socket when dropped,
//! if the file at the path is still that socket.

use std::io;
use std::os::unix::fs::{
    DirBuilderExt as _, FileTypeExt as _, MetadataExt as _, PermissionsExt as _,
};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use asterism_basics::PathError;
use tokio::net::UnixListener;

use crate::fs::PRIVATE_MODE;

/// Why a private socket could not be bound.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
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
    #[error(transparent)]
    Io(#[from] PathError),
}

/// A bound private socket: the listener, and its file.
#[derive(Debug)]
pub struct PrivateSocket {
    /// The listener.
    pub listener: UnixListener,
    /// The socket file, removed when dropped.
    pub file: SocketFile,
}

/// The socket file of a [`PrivateSocket`]. Dropping it removes the file, if the file at
/// the path is still this socket (not one another server has bound there since).
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

    /// The user who owns the socket file, if the file at the path is still this socket
    /// (not a link, nor another file put there since).
    #[must_use]
    pub fn owner(&self) -> Option<u32> {
        std::fs::symlink_metadata(&self.path)
            .ok()
            .filter(|m| self.is(m))
            .map(|m| m.uid())
    }

    fn is(&self, meta: &std::fs::Metadata) -> bool {
        meta.file_type().is_socket() && meta.dev() == self.dev && meta.ino() == self.ino
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let ours = std::fs::symlink_metadata(&self.path)
            .map(|m| self.is(&m))
            .unwrap_or(false);
        if ours && let Err(err) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %err, "cannot remove the socket file");
        }
    }
}

/// Binds a Unix socket at `path` with mode 0600 from its first moment (see the module's
/// documentation). Needs a tokio runtime.
pub fn bind_private(path: &Path) -> Result<PrivateSocket, SocketError> {
    let (Some(parent), Some(_)) = (path.parent(), path.file_name()) else {
        return Err(SocketError::BadPath(path.to_owned()));
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
        .map_err(PathError::at(
            "cannot create the private directory",
            &private_dir,
        ))?;
    let staged = private_dir.join("s");
    let result = (|| -> Result<(UnixListener, std::fs::Metadata), SocketError> {
        let listener =
            UnixListener::bind(&staged).map_err(PathError::at("cannot bind", &staged))?;
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(PRIVATE_MODE))
            .map_err(PathError::at("cannot set mode 0600 on", &staged))?;
        // The inode, taken before the socket is reachable at `path`, where another file
        // could stand by the time it is looked at.
        let meta =
            std::fs::symlink_metadata(&staged).map_err(PathError::at("cannot inspect", &staged))?;
        place(&staged, path)?;
        Ok((listener, meta))
    })();
    let cleanup = std::fs::remove_dir_all(&private_dir);
    let (listener, meta) = result?;
    if let Err(err) = cleanup {
        tracing::warn!(path = %private_dir.display(), error = %err, "cannot remove the private directory");
    }
    tracing::debug!(path = %path.display(), "bound unix socket with mode 0600");
    Ok(PrivateSocket {
        listener,
        file: SocketFile {
            path: path.to_owned(),
            dev: meta.dev(),
            ino: meta.ino(),
        },
    })
}

/// Links the socket at `staged` to `path`. A link, unlike a rename, never replaces what
/// is there: a file or a live socket that appeared at `path` since it was checked is
/// left alone, and the check runs once more (a stale socket is then removed).
fn place(staged: &Path, path: &Path) -> Result<(), SocketError> {
    for _ in 0..2 {
        match std::fs::hard_link(staged, path) {
            Ok(()) => return Ok(()),
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => remove_stale_socket(path)?,
            Err(err) => return Err(PathError::at("cannot link the socket to", path)(err).into()),
        }
    }
    Err(SocketError::InUse(path.to_owned()))
}

/// Removes a socket left behind at `path` by a server that is gone. Refuses if anything
/// other than a socket is there, or if a server may still answer on it: only a refused
/// connection means that none does (another user's live socket that this one may not
/// connect to is not stale).
fn remove_stale_socket(path: &Path) -> Result<(), SocketError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(PathError::at("cannot inspect", path)(err).into()),
    };
    if !meta.file_type().is_socket() {
        return Err(SocketError::NotASocket(path.to_owned()));
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Err(err) if err.kind() == io::ErrorKind::ConnectionRefused => {}
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
        _ => return Err(SocketError::InUse(path.to_owned())),
    }
    tracing::info!(path = %path.display(), "removing a stale socket");
    std::fs::remove_file(path).map_err(PathError::at("cannot remove the stale socket", path))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode_owner(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).unwrap().uid()
    }

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path)
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    }

    #[tokio::test]
    async fn a_socket_is_private_replaces_a_stale_one_and_is_removed_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let socket = bind_private(&path).unwrap();
        assert_eq!(mode(&path), 0o600);
        assert_eq!(socket.file.path(), path);
        // Bound elsewhere (in the private directory), never at the path with another mode.
        let bound = socket.listener.local_addr().unwrap();
        assert_ne!(bound.as_pathname(), Some(path.as_path()));
        assert_eq!(socket.file.owner(), Some(mode_owner(&path)));
        // Only the socket is left: the private directory it was bound in is gone.
        let entries: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(entries.len(), 1);
        std::os::unix::net::UnixStream::connect(&path).unwrap();
        drop(socket);
        assert!(!path.exists(), "the socket file was left behind");
    }

    #[tokio::test]
    async fn a_live_socket_a_file_and_a_path_without_a_name_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let first = bind_private(&path).unwrap();
        let err = bind_private(&path).unwrap_err();
        assert!(matches!(err, SocketError::InUse(_)), "{err}");
        std::os::unix::net::UnixStream::connect(&path).expect("the first still answers");
        drop(first);

        let file = dir.path().join("file");
        std::fs::write(&file, b"precious").unwrap();
        let err = bind_private(&file).unwrap_err();
        assert!(matches!(err, SocketError::NotASocket(_)), "{err}");
        assert_eq!(std::fs::read(&file).unwrap(), b"precious");

        // A path that cannot be looked at is an error, not a free path.
        let err = bind_private(&file.join("s.sock")).unwrap_err();
        assert!(err.to_string().starts_with("cannot inspect"), "{err}");

        let err = bind_private(Path::new("/")).unwrap_err();
        assert!(matches!(err, SocketError::BadPath(_)), "{err}");
    }

    #[tokio::test]
    async fn a_socket_bound_over_ours_is_not_removed_when_ours_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let ours = bind_private(&path).unwrap();
        // Another server replaces the file (ours stays bound to the unlinked inode).
        std::fs::remove_file(&path).unwrap();
        let theirs = bind_private(&path).unwrap();
        assert_eq!(
            ours.file.owner(),
            None,
            "another file is not ours to vouch for"
        );
        drop(ours);
        assert!(path.exists(), "another server's socket was removed");
        drop(theirs);
        assert!(!path.exists());
    }

    #[tokio::test]
    async fn a_file_that_appears_before_the_socket_is_linked_is_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let staged = dir.path().join("staged");
        let _listener = UnixListener::bind(&staged).unwrap();
        let path = dir.path().join("s.sock");
        std::fs::write(&path, b"precious").unwrap();
        let err = place(&staged, &path).unwrap_err();
        assert!(matches!(err, SocketError::NotASocket(_)), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"precious");
        // A live socket there is not replaced either.
        std::fs::remove_file(&path).unwrap();
        let live = UnixListener::bind(&path).unwrap();
        let err = place(&staged, &path).unwrap_err();
        assert!(matches!(err, SocketError::InUse(_)), "{err}");
        drop(live);
        // Now stale: removed, and the socket is linked.
        place(&staged, &path).unwrap();
        std::os::unix::net::UnixStream::connect(&path).unwrap();
    }

    #[tokio::test]
    async fn a_socket_that_does_not_refuse_a_connection_is_not_stale() {
        let dir = tempfile::tempdir().unwrap();
        // A datagram socket: a stream connection fails, but not as refused.
        let path = dir.path().join("d.sock");
        let _datagram = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        let err = remove_stale_socket(&path).unwrap_err();
        assert!(matches!(err, SocketError::InUse(_)), "{err}");
        assert!(path.exists(), "a socket that may be live was removed");
    }

    #[tokio::test]
    async fn a_link_that_fails_for_another_reason_is_an_error_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let err = place(&dir.path().join("absent"), &dir.path().join("s.sock")).unwrap_err();
        assert!(err.to_string().starts_with("cannot link"), "{err}");
    }
}

//! Capped reads and private file writes.
//!
//! A binary reads only files of a size it expects (a CA bundle, a token, a measurements
//! file), so a wrong path (a device, a huge log) fails at once instead of filling memory.
//! Secrets are written so that no other user can read them at any moment, and so that a
//! crash leaves either the old file or the new one.

use asterism_basics::PathError;
use std::fs::{self, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

/// Mode of a private file: read and write for its owner only.
pub const PRIVATE_MODE: u32 = 0o600;

/// Why a file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The operating system refused an operation on a file (what was attempted, the path,
    /// the cause).
    #[error(transparent)]
    Io(#[from] PathError),
    /// The file is larger than its cap.
    #[error("{} is larger than {cap} bytes", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The largest size accepted.
        cap: u64,
    },
    /// The file exists and may not be overwritten.
    #[error("{} already exists; refusing to overwrite it", path.display())]
    Exists {
        /// The file.
        path: PathBuf,
    },
}

/// Reads `path` whole if it holds at most `cap` bytes; a larger file is an error, never
/// truncated.
pub fn read_capped(path: &Path, cap: u64) -> Result<Vec<u8>, FileError> {
    asterism_basics::read_file_capped(path, cap)
        .map_err(PathError::at("cannot read", path))?
        .ok_or_else(|| FileError::TooLarge {
            path: path.to_owned(),
            cap,
        })
}

pub use asterism_basics::read_capped_from;

/// Replaces `path` with `bytes`, mode 0600, atomically: a temporary file next to it
/// (created 0600, so the content is never readable by others), synced, then renamed over
/// `path`. The directory is not synced. On failure the temporary file is removed and
/// `path` is as it was.
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<(), FileError> {
    write_atomic(path, bytes, PRIVATE_MODE)
}

/// [`write_private`] with another mode (0644 for a certificate): the temporary file has
/// exactly `mode` from its creation on.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), FileError> {
    let tmp = temporary_name(path);
    let result = write_synced(&tmp, bytes, mode).and_then(|()| {
        fs::rename(&tmp, path).map_err(PathError::at("cannot rename a temporary file to", path))?;
        Ok(())
    });
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Creates `path` with exactly `mode` (whatever the umask), writes `bytes` and syncs; an
/// existing file is an error ([`FileError::Exists`]) and stays untouched.
pub fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), FileError> {
    write_synced(path, bytes, mode)
}

fn write_synced(path: &Path, bytes: &[u8], mode: u32) -> Result<(), FileError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|source| {
            if source.kind() == io::ErrorKind::AlreadyExists {
                FileError::Exists {
                    path: path.to_owned(),
                }
            } else {
                PathError::at("cannot create", path)(source).into()
            }
        })?;
    // The umask may have cleared bits; the mode is part of the contract.
    file.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(PathError::at("cannot set the mode of", path))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(PathError::at("cannot write", path))?;
    Ok(())
}

/// `.<name>.tmp-<pid>-<random>` next to `path`: unique among processes and among calls.
fn temporary_name(path: &Path) -> PathBuf {
    use std::hash::{BuildHasher as _, Hasher as _};
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // Randomly keyed per call; uniqueness, not secrecy, is what matters here.
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    path.with_file_name(format!(".{name}.tmp-{}-{random:016x}", std::process::id()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::fs::MetadataExt as _;

    #[test]
    fn a_capped_read_refuses_a_larger_file_instead_of_truncating_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        fs::write(&path, b"12345").unwrap();
        assert_eq!(read_capped(&path, 5).unwrap(), b"12345");
        assert!(matches!(
            read_capped(&path, 4),
            Err(FileError::TooLarge { cap: 4, .. })
        ));
        assert!(matches!(
            read_capped(&dir.path().join("missing"), 5),
            Err(FileError::Io(_))
        ));
        assert_eq!(read_capped_from(&b"abc"[..], 2).unwrap(), None);
        assert_eq!(
            read_capped_from(&b"ab"[..], 2).unwrap(),
            Some(b"ab".to_vec())
        );
    }

    #[test]
    fn a_private_write_replaces_the_file_with_mode_0600_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        fs::write(&path, b"old").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        write_private(&path, b"new").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new");
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        write_atomic(&path, b"public", 0o644).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o644);
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn a_failed_private_write_leaves_the_old_file_and_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        // A directory in the way of the rename.
        let path = dir.path().join("taken");
        fs::create_dir(&path).unwrap();
        fs::write(path.join("inside"), b"x").unwrap();
        assert!(write_private(&path, b"new").is_err());
        assert!(path.is_dir());
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn a_new_file_gets_exactly_its_mode_and_never_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        write_new(&path, b"k", 0o600).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        assert!(matches!(
            write_new(&path, b"other", 0o600),
            Err(FileError::Exists { .. })
        ));
        assert_eq!(fs::read(&path).unwrap(), b"k");
    }
}

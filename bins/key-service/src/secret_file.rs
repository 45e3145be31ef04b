//! Reading the master secret and salt files.
//!
//! A secret file must be a regular file (a symbolic link to one is followed, as on a
//! Kubernetes secret volume) that neither group nor others may read or write.

use std::fs::{File, Metadata};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use zeroize::Zeroizing;

/// The largest secret file read, in bytes. Master secrets and salts are 32 bytes.
pub const MAX_SECRET_FILE_LEN: u64 = 64 * 1024;

/// Why a secret file was refused. Names the path, never the contents.
#[derive(Debug, thiserror::Error)]
pub enum SecretFileError {
    /// The file could not be inspected, opened or read.
    #[error("cannot read secret file {}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The path names something other than a regular file.
    #[error("secret file {} is not a regular file but a {kind}", path.display())]
    NotRegular {
        /// The path.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// The file was replaced between inspection and opening.
    #[error("secret file {} changed while it was being opened", path.display())]
    Changed {
        /// The path.
        path: PathBuf,
    },
    /// Group or others may read or write the file.
    #[error(
        "secret file {} has mode {mode:04o}, so group or others may read or write it; \
         restrict it with `chmod 600 {}` (for a Kubernetes secret volume, set defaultMode \
         to 0400)",
        path.display(),
        path.display()
    )]
    Permissions {
        /// The path.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The file is implausibly large for a secret.
    #[error("secret file {} is larger than {max} bytes", path.display())]
    TooLarge {
        /// The path.
        path: PathBuf,
        /// [`MAX_SECRET_FILE_LEN`].
        max: u64,
    },
}

fn kind(meta: &Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_dir() {
        "directory"
    } else if t.is_fifo() {
        "named pipe"
    } else if t.is_socket() {
        "socket"
    } else if t.is_block_device() {
        "block device"
    } else if t.is_char_device() {
        "character device"
    } else {
        "special file"
    }
}

/// Reads a secret file's raw bytes after checking that it is a regular file with no
/// permissions for group or others (`mode & 0o077 == 0`).
pub fn read_secret_file(path: &Path) -> Result<Zeroizing<Vec<u8>>, SecretFileError> {
    let io = |source| SecretFileError::Io {
        path: path.to_owned(),
        source,
    };
    // Check the type before opening: opening a named pipe would block.
    let before = std::fs::metadata(path).map_err(io)?;
    if !before.is_file() {
        return Err(SecretFileError::NotRegular {
            path: path.to_owned(),
            kind: kind(&before),
        });
    }
    let mut file = File::open(path).map_err(io)?;
    // Decide on what was opened, not on what the path names now.
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() || meta.dev() != before.dev() || meta.ino() != before.ino() {
        return Err(SecretFileError::Changed {
            path: path.to_owned(),
        });
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(SecretFileError::Permissions {
            path: path.to_owned(),
            mode,
        });
    }
    if meta.len() > MAX_SECRET_FILE_LEN {
        return Err(SecretFileError::TooLarge {
            path: path.to_owned(),
            max: MAX_SECRET_FILE_LEN,
        });
    }
    // Room for the whole file plus one byte, so that reading never reallocates (which
    // would leave an unwiped copy behind) and a file that grew is noticed.
    let capacity = usize::try_from(meta.len()).unwrap_or(0).saturating_add(1);
    let mut bytes = Zeroizing::new(Vec::with_capacity(capacity));
    (&mut file)
        .take(MAX_SECRET_FILE_LEN + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > MAX_SECRET_FILE_LEN {
        return Err(SecretFileError::TooLarge {
            path: path.to_owned(),
            max: MAX_SECRET_FILE_LEN,
        });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::Permissions;

    fn write(dir: &Path, name: &str, contents: &[u8], mode: u32) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, contents).unwrap();
        std::fs::set_permissions(&path, Permissions::from_mode(mode)).unwrap();
        path
    }

    #[test]
    fn owner_only_files_are_read() {
        let dir = tempfile::tempdir().unwrap();
        for mode in [0o600, 0o400, 0o700] {
            let path = write(dir.path(), "s", b"secret bytes", mode);
            assert_eq!(read_secret_file(&path).unwrap().as_slice(), b"secret bytes");
            std::fs::remove_file(&path).unwrap();
        }
    }

    #[test]
    fn files_open_to_group_or_others_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        for mode in [0o644, 0o640, 0o604, 0o620, 0o602, 0o660, 0o610, 0o601] {
            let path = write(dir.path(), "s", b"secret", mode);
            let err = read_secret_file(&path).unwrap_err();
            assert!(
                matches!(err, SecretFileError::Permissions { mode: m, .. } if m == mode),
                "{mode:o}: {err}"
            );
            let text = err.to_string();
            assert!(text.contains(&format!("{mode:04o}")), "{text}");
            assert!(text.contains("chmod 600"), "{text}");
            assert!(text.contains(&path.display().to_string()), "{text}");
            assert!(!text.contains("secret\""), "{text}");
            std::fs::remove_file(&path).unwrap();
        }
    }

    #[test]
    fn non_regular_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let err = read_secret_file(dir.path()).unwrap_err();
        assert!(
            matches!(
                err,
                SecretFileError::NotRegular {
                    kind: "directory",
                    ..
                }
            ),
            "{err}"
        );
        let err = read_secret_file(Path::new("/dev/null")).unwrap_err();
        assert!(
            matches!(
                err,
                SecretFileError::NotRegular {
                    kind: "character device",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn symlinks_to_private_regular_files_are_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = write(dir.path(), "target", b"abc", 0o400);
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert_eq!(read_secret_file(&link).unwrap().as_slice(), b"abc");
    }

    #[test]
    fn oversized_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let big = vec![0u8; usize::try_from(MAX_SECRET_FILE_LEN).unwrap() + 1];
        let path = write(dir.path(), "big", &big, 0o600);
        assert!(matches!(
            read_secret_file(&path),
            Err(SecretFileError::TooLarge { .. })
        ));
    }

    #[test]
    fn missing_files_name_the_path() {
        let err = read_secret_file(Path::new("/nonexistent/asterism/secret")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/asterism/secret"));
    }
}

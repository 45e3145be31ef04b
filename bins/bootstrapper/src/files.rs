//! Crash-safe file writes: write a temporary file next to the target, fsync it, rename it
//! over the target, fsync the directory.
//!
//! Files created with `O_EXCL` would make a retry after a partial write fail. Here a write either leaves the old content or the complete new
//! content, and writing the same file again simply replaces it.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use ring::rand::{SecureRandom as _, SystemRandom};

/// Mode of secret files (keys, node state).
pub const SECRET_MODE: u32 = 0o600;
/// Mode of the first-boot passphrase file (read-only, as the original's key file).
pub const KEY_FILE_MODE: u32 = 0o400;
/// Mode of public files (certificates, public keys).
pub const PUBLIC_MODE: u32 = 0o644;
/// Mode of directories this crate creates.
pub const DIR_MODE: u32 = 0o700;

/// A file operation failed.
#[derive(Debug, thiserror::Error)]
#[error("{what} {path}")]
pub struct FileError {
    /// What was being done.
    pub what: &'static str,
    /// The file or directory.
    pub path: PathBuf,
    /// The cause.
    #[source]
    pub source: std::io::Error,
}

impl FileError {
    fn new(what: &'static str, path: &Path, source: std::io::Error) -> Self {
        Self {
            what,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Creates `dir` and its missing parents with mode 0700.
pub fn create_dirs(dir: &Path) -> Result<(), FileError> {
    DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)
        .map_err(|e| FileError::new("cannot create directory", dir, e))
}

/// Writes `bytes` to `path` atomically with file mode `mode`, creating missing parent
/// directories (0700). Readers see the old content or the new one, never a mix; a crash
/// leaves at most a stray temporary file (`.<name>.tmp-*`), which the next write of the same
/// file does not trip over.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), FileError> {
    let dir = parent_dir(path);
    create_dirs(dir)?;
    replace_file(path, bytes, mode)?;
    // Make the rename itself durable.
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// One file for [`write_all_atomic`]: path, content, mode.
pub type FileToWrite<'a> = (&'a Path, &'a [u8], u32);

/// Writes several files as [`write_atomic`] does, each on its own (a crash leaves every file
/// with its old or its new content), but with their syncs made together: all temporary
/// files are written and synced in parallel, renamed, and then each directory is synced
/// once. On a journalling file system the parallel syncs share journal commits, so a batch
/// costs about what one file costs.
pub fn write_all_atomic(files: &[FileToWrite<'_>]) -> Result<(), FileError> {
    let mut dirs: Vec<&Path> = Vec::new();
    for (path, _, _) in files {
        let dir = parent_dir(path);
        if !dirs.contains(&dir) {
            create_dirs(dir)?;
            dirs.push(dir);
        }
    }
    let results: Vec<Result<(), FileError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = files
            .iter()
            .map(|&(path, bytes, mode)| scope.spawn(move || replace_file(path, bytes, mode)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(FileError::new(
                        "a writer thread failed for",
                        Path::new("."),
                        std::io::Error::other("thread panicked"),
                    ))
                })
            })
            .collect()
    });
    results.into_iter().collect::<Result<(), _>>()?;
    // Make the renames durable, one sync per directory, in parallel too.
    std::thread::scope(|scope| {
        for dir in &dirs {
            scope.spawn(move || {
                if let Ok(d) = File::open(dir) {
                    let _ = d.sync_all();
                }
            });
        }
    });
    Ok(())
}

/// Writes and syncs a temporary file next to `path` and renames it over `path` (the
/// directory is not synced); removes the temporary file if that fails.
fn replace_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), FileError> {
    let tmp = temporary_name(path)?;
    let result = write_then_rename(&tmp, path, bytes, mode);
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// The directory `path` is in (`.` for a bare file name).
fn parent_dir(path: &Path) -> &Path {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// `.<name>.tmp-<random>` next to `path`.
fn temporary_name(path: &Path) -> Result<PathBuf, FileError> {
    let dir = parent_dir(path);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut suffix = [0u8; 8];
    SystemRandom::new().fill(&mut suffix).map_err(|_| {
        FileError::new(
            "no randomness for a temporary name next to",
            path,
            std::io::Error::other("system random number generator failed"),
        )
    })?;
    Ok(dir.join(format!(".{name}.tmp-{}", hex::encode(suffix))))
}

fn write_then_rename(tmp: &Path, path: &Path, bytes: &[u8], mode: u32) -> Result<(), FileError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(tmp)
        .map_err(|e| FileError::new("cannot create", tmp, e))?;
    // The umask may have removed bits; set the mode exactly.
    file.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(|e| FileError::new("cannot set the mode of", tmp, e))?;
    file.write_all(bytes)
        .map_err(|e| FileError::new("cannot write", tmp, e))?;
    file.sync_all()
        .map_err(|e| FileError::new("cannot sync", tmp, e))?;
    drop(file);
    fs::rename(tmp, path).map_err(|e| FileError::new("cannot rename a temporary file to", path, e))
}

/// Reads a file of at most `cap` bytes (a file larger than that is an error, not truncated).
pub fn read_capped(path: &Path, cap: u64) -> Result<Vec<u8>, FileError> {
    let meta = fs::metadata(path).map_err(|e| FileError::new("cannot read", path, e))?;
    if meta.len() > cap {
        return Err(FileError::new(
            "file is larger than expected:",
            path,
            std::io::Error::other(format!("{} bytes, at most {cap} expected", meta.len())),
        ));
    }
    fs::read(path).map_err(|e| FileError::new("cannot read", path, e))
}

/// Whether `path` exists (a missing file is `false`; any other error is `true` so that it
/// surfaces on the read).
pub(crate) fn exists(path: &Path) -> bool {
    !matches!(fs::metadata(path), Err(e) if e.kind() == std::io::ErrorKind::NotFound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_writes_every_file_with_its_mode_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("pki/kubelet.crt");
        let b = dir.path().join("pki/kubelet.key");
        let c = dir.path().join("ssh/ca.pub");
        write_atomic(&b, b"old key", SECRET_MODE).unwrap();
        write_all_atomic(&[
            (&a, b"cert", PUBLIC_MODE),
            (&b, b"new key", SECRET_MODE),
            (&c, b"ca", PUBLIC_MODE),
        ])
        .unwrap();
        for (path, bytes, mode) in [
            (&a, &b"cert"[..], PUBLIC_MODE),
            (&b, b"new key", SECRET_MODE),
            (&c, b"ca", PUBLIC_MODE),
        ] {
            assert_eq!(fs::read(path).unwrap(), bytes);
            assert_eq!(
                fs::metadata(path).unwrap().permissions().mode() & 0o777,
                mode
            );
        }
        for sub in ["pki", "ssh"] {
            let names: Vec<_> = fs::read_dir(dir.path().join(sub))
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            assert!(names.iter().all(|n| !n.contains(".tmp-")), "{names:?}");
        }
    }

    #[test]
    fn a_write_replaces_the_file_and_sets_the_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/node_state.json");
        write_atomic(&path, b"one", SECRET_MODE).unwrap();
        write_atomic(&path, b"two", SECRET_MODE).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let parent = fs::metadata(dir.path().join("a"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(parent, 0o700);
        // No temporary file is left behind.
        assert_eq!(fs::read_dir(dir.path().join("a/b")).unwrap().count(), 1);
    }

    #[test]
    fn a_read_only_file_can_be_replaced_and_a_leftover_temp_file_does_not_matter() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("initial.key");
        write_atomic(&path, b"first", KEY_FILE_MODE).unwrap();
        // A crash between create and rename leaves a temporary file: the retry still works.
        fs::write(
            dir.path().join(".initial.key.tmp-0000000000000000"),
            b"junk",
        )
        .unwrap();
        write_atomic(&path, b"second", KEY_FILE_MODE).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"second");
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o400);
    }

    #[test]
    fn reads_are_capped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        fs::write(&path, [0u8; 100]).unwrap();
        assert!(read_capped(&path, 99).is_err());
        assert_eq!(read_capped(&path, 100).unwrap().len(), 100);
    }
}

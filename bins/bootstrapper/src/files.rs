//! Crash-safe file writes: `asterism_binkit::write_atomic` (a temporary file next to the
//! target with its final mode, fsynced, renamed over the target), with the missing parent
//! directories created (0700) and the directory fsynced, so that the rename is durable.
//!
//! Files created with `O_EXCL` would make a retry after a partial write fail. Here a write either leaves the old content or the complete new
//! content, and writing the same file again simply replaces it.

use asterism_basics::PathError;
use std::fs::{self, DirBuilder, File};
use std::os::unix::fs::DirBuilderExt as _;
use std::path::Path;

/// Mode of secret files (keys, node state).
pub const SECRET_MODE: u32 = 0o600;
/// Mode of the first-boot passphrase file (read-only for its owner: nothing rewrites it).
pub const KEY_FILE_MODE: u32 = 0o400;
/// Mode of public files (certificates, public keys).
pub const PUBLIC_MODE: u32 = 0o644;
/// Mode of directories this crate creates.
pub const DIR_MODE: u32 = 0o700;

pub use asterism_binkit::fs::{FileError, read_capped};

/// Creates `dir` and its missing parents with mode 0700.
pub fn create_dirs(dir: &Path) -> Result<(), FileError> {
    DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)
        .map_err(PathError::at("cannot create directory", dir))?;
    Ok(())
}

/// Writes `bytes` to `path` atomically with file mode `mode`, creating missing parent
/// directories (0700). Readers see the old content or the new one, never a mix; a crash
/// leaves at most a stray temporary file (`.<name>.tmp-*`), which the next write of the same
/// file does not trip over.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), FileError> {
    let dir = parent_dir(path);
    create_dirs(dir)?;
    asterism_binkit::write_atomic(path, bytes, mode)?;
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
            .map(|&(path, bytes, mode)| {
                scope.spawn(move || asterism_binkit::write_atomic(path, bytes, mode))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(
                        PathError::at("cannot write (the writer thread failed)", Path::new("."))(
                            std::io::Error::other("thread panicked"),
                        )
                        .into(),
                    )
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

/// The directory `path` is in (`.` for a bare file name).
fn parent_dir(path: &Path) -> &Path {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Whether `path` exists (a missing file is `false`; any other error is `true` so that it
/// surfaces on the read).
pub(crate) fn exists(path: &Path) -> bool {
    !matches!(fs::metadata(path), Err(e) if e.kind() == std::io::ErrorKind::NotFound)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

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

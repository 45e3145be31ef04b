//! Files and directories with explicit modes, never overwritten.

use std::fs::{self, DirBuilder};
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// Creates `dir` with `mode` (and missing parents with the default mode) unless it exists.
/// Returns the topmost directory this call created, if any, so a failed run can remove it.
pub fn ensure_dir(dir: &Path, mode: u32) -> Result<Option<PathBuf>> {
    if dir.is_dir() {
        return Ok(None);
    }
    let topmost = dir
        .ancestors()
        .take_while(|a| !a.as_os_str().is_empty() && !a.exists())
        .last()
        .map(Path::to_owned);
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    match DirBuilder::new().mode(mode).create(dir) {
        Ok(()) => {
            // The umask may have cleared bits; the mode is part of the contract.
            fs::set_permissions(dir, fs::Permissions::from_mode(mode))
                .with_context(|| format!("setting the mode of {}", dir.display()))?;
            Ok(topmost)
        }
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(None),
        Err(error) => Err(error).with_context(|| format!("creating {}", dir.display())),
    }
}

/// Writes a new file with exactly `mode`, synced; fails if it exists.
pub fn write_new(path: &Path, contents: &[u8], mode: u32) -> Result<()> {
    Ok(asterism_binkit::write_new(path, contents, mode)?)
}

/// Refuses when any of `paths` exists, naming the first.
pub fn refuse_existing(paths: &[PathBuf]) -> Result<()> {
    if let Some(existing) = paths.iter().find(|p| p.exists()) {
        bail!(
            "{} already exists; refusing to overwrite it (remove it or choose another directory)",
            existing.display()
        );
    }
    Ok(())
}

/// Reads a secret file of at most `cap` bytes, refusing one that others may read.
pub fn read_private(path: &Path, cap: u64) -> Result<zeroize::Zeroizing<Vec<u8>>> {
    use std::os::unix::fs::MetadataExt;
    let meta = fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    if meta.mode() & 0o077 != 0 {
        bail!(
            "{} has mode {:o}, accessible to others; run `chmod 600 {}`",
            path.display(),
            meta.mode() & 0o777,
            path.display()
        );
    }
    Ok(zeroize::Zeroizing::new(asterism_binkit::read_capped(
        path, cap,
    )?))
}

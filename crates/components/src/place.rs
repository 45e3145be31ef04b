//! Placing a file: directories created with their mode, a complete temporary file synced
//! and renamed over its install path, the directory synced.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::path::Path;

use asterism_basics::PathError;

use crate::{BINARY_MODE, ComponentError, DIR_MODE, io_err};

pub(crate) fn create_dirs(dir: &Path) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)
}

pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Gives the verified temporary file its mode and renames it over the destination.
pub(crate) fn place_file(tmp: tempfile::NamedTempFile, dest: &Path) -> Result<(), ComponentError> {
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
    tmp.persist(dest)
        .map_err(|e| PathError::at("cannot rename the download to", dest)(e.error))?;
    sync_dir(parent).map_err(io_err("cannot sync", parent))
}

//! Archive safety: every entry path and symlink target is checked to stay inside the
//! destination, and an archive is unpacked into a temporary directory first, then moved
//! into place entry by entry.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::path::{Component as PathPart, Path, PathBuf};

use asterism_basics::PathError;

use crate::place::sync_dir;
use crate::{ARCHIVE_MODE_MASK, ComponentError, DIR_MODE, DownloadPolicy, io_err};

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

/// Unpacks the verified archive at `archive` under `dest`: everything goes into a
/// temporary directory inside `dest` first; only a completely unpacked, checked tree is
/// moved into place (entry by entry, each a rename).
pub(crate) fn extract_archive(
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
        UnpackError::Io(e) => ComponentError::Io(e),
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
        UnpackError::Io(e) => ComponentError::Io(e),
    })?;
    sync_dir(dest).map_err(io_err("cannot sync", dest))?;
    Ok(())
}

#[derive(Debug)]
pub(crate) enum UnpackError {
    Archive(ArchiveError),
    Io(PathError),
}

impl From<ArchiveError> for UnpackError {
    fn from(e: ArchiveError) -> Self {
        Self::Archive(e)
    }
}

pub(crate) fn uio<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> UnpackError + 'a {
    move |source| UnpackError::Io(PathError::at(what, path)(source))
}

/// Refuses `rel` when any of its parents inside `root` is a symlink (an entry must not be
/// written through a link the archive created), and creates missing parents.
pub(crate) fn prepare_parent(
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
pub(crate) fn clear_slot(path: &Path, rel: &Path) -> Result<(), UnpackError> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => Err(ArchiveError::Clash(rel.to_path_buf()).into()),
        Ok(_) => fs::remove_file(path).map_err(uio("cannot replace", path)),
        Err(_) => Ok(()),
    }
}

/// Unpacks a gzip-compressed tar under `root` (an empty private directory). Returns the
/// final modes of the directories it created.
pub(crate) fn unpack(
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
                // `target`, the archive's link name to its target.
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
pub(crate) fn merge_into(src: &Path, dest: &Path) -> Result<(), UnpackError> {
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
}

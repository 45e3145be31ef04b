//! The two file helpers the manufacturing and the process share: an atomic rewrite (for
//! swtpm_setup's configuration and the port file) and the tail of a log for an error.

use std::ffi::OsStr;
use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{SwtpmError, io_error};

/// Writes `contents` to `path` through a temporary file in the same directory and a rename,
/// so a concurrent reader sees the old or the new file, never a partial one.
pub(crate) fn write_atomically(path: &Path, contents: &[u8]) -> Result<(), SwtpmError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut name = path.file_name().unwrap_or(OsStr::new("file")).to_owned();
    name.push(format!(
        ".tmp.{}.{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let temp = path.with_file_name(name);
    fs::write(&temp, contents).map_err(io_error(format!("writing {}", temp.display())))?;
    fs::rename(&temp, path).map_err(|error| {
        let _ = fs::remove_file(&temp);
        io_error(format!("replacing {}", path.display()))(error)
    })
}

/// The last lines of a log file, for error messages.
pub(crate) fn tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let skip = lines.len().saturating_sub(20);
    lines.into_iter().skip(skip).collect::<Vec<_>>().join("\n")
}

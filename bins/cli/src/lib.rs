//! The `asterism` command-line tool as a library: every subcommand, so that tests (and the
//! `asterism-mini` orchestration) can drive them step by step. The binary only parses
//! arguments.
#![forbid(unsafe_code)]

pub mod bring_up;
pub mod control_plane;
pub mod data_key;
pub mod identity;
pub mod init;
pub mod readmit;
pub mod recover;
pub mod recovery_share;
mod retry;
pub mod trust;
pub mod verify;

use anyhow::{Context, Result, bail};

/// Refuses a secret file that the group or others can read, saying how to fix it.
pub(crate) fn refuse_readable_by_others(path: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    if meta.mode() & 0o077 != 0 {
        bail!(
            "{} has mode {:o}, readable by others; run `chmod 600 {}`",
            path.display(),
            meta.mode() & 0o777,
            path.display()
        );
    }
    Ok(())
}

/// Reads a 32-byte Ed25519 seed file, refusing one that others can read.
pub fn read_seed(path: &std::path::Path) -> Result<zeroize::Zeroizing<[u8; 32]>> {
    refuse_readable_by_others(path)?;
    let bytes = zeroize::Zeroizing::new(
        std::fs::read(path).with_context(|| format!("reading {}", path.display()))?,
    );
    let mut seed = zeroize::Zeroizing::new([0u8; 32]);
    if bytes.len() != 32 {
        bail!(
            "{} must hold exactly 32 bytes, it holds {}",
            path.display(),
            bytes.len()
        );
    }
    seed.copy_from_slice(&bytes);
    Ok(seed)
}

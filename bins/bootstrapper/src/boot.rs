//! The boot phase (a separate disk-mapper program in the original design, folded in here):
//! decide from PCR 15 and the state disk what this boot is, and format a new disk.

use std::fs::OpenOptions;
use std::path::Path;

use std::sync::Arc;

use asterism_disk::{DiskUuid, generate_initial_passphrase};
use tracing::{info, warn};

use crate::effects::{DiskOps, NodeMarker};
use crate::error::{StepError, blocking};
use crate::files::{self, FileError, exists};
use crate::node_state::NodeDir;

/// What kind of boot this is.
#[derive(Debug)]
pub(crate) enum Boot {
    /// PCR 15 is marked, the disk is initialized and the node state is there: nothing to do
    /// (the `none` driver has no kubelet to start).
    AlreadyBootstrapped,
    /// PCR 15 is marked but the node never finished bootstrapping (a crash after the node
    /// lock). Only a reboot can clear the marker.
    Interrupted,
    /// A reboot of an initialized node: rejoin.
    Rejoin,
    /// A new (or reset) disk, formatted now with a first-boot passphrase: initialise or
    /// join.
    Fresh(DiskUuid),
}

/// Creates the sparse state disk image of `size` bytes if it does not exist (the disk a
/// cloud provider would attach). An existing image is left alone.
pub fn prepare_state_image(path: &Path, size: u64) -> Result<(), FileError> {
    if let Some(parent) = path.parent() {
        files::create_dirs(parent)?;
    }
    match OpenOptions::new().write(true).create_new(true).open(path) {
        Ok(file) => {
            file.set_len(size).map_err(|source| FileError::Io {
                action: "size the state disk image",
                path: path.to_path_buf(),
                source,
            })?;
            info!(image = %path.display(), size, "created a new state disk image");
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(source) => Err(FileError::Io {
            action: "create the state disk image",
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Reads PCR 15 and the disk and, for a new disk, formats it.
pub(crate) async fn boot_phase(
    marker: &Arc<dyn NodeMarker>,
    disk: &Arc<dyn DiskOps>,
    dir: &NodeDir,
) -> Result<Boot, StepError> {
    let marker = marker.clone();
    let marked = blocking(move || marker.is_marked()).await?;
    let probe = disk.clone();
    let initialized = blocking(move || probe.is_initialized()).await?;
    info!(
        step = "boot",
        pcr15_marked = marked,
        disk_initialized = initialized,
        "inspected the node marker and the state disk"
    );
    if marked {
        if initialized && exists(&dir.node_state()) {
            return Ok(Boot::AlreadyBootstrapped);
        }
        return Ok(Boot::Interrupted);
    }
    if initialized {
        return Ok(Boot::Rejoin);
    }
    format_fresh(disk, dir).await.map(Boot::Fresh)
}

/// First boot (or a disk marked for reset): a fresh file system (the `state/` directory
/// emptied), a random first-boot passphrase in `state/initial.key` (0400), then the LUKS2
/// format.
async fn format_fresh(disk: &Arc<dyn DiskOps>, dir: &NodeDir) -> Result<DiskUuid, StepError> {
    let state = dir.state();
    if exists(&state) {
        // `state/` stands for the file system on the disk: a new disk has none of it.
        std::fs::remove_dir_all(&state).map_err(|source| FileError::Io {
            action: "empty the state directory",
            path: state.clone(),
            source,
        })?;
        warn!(dir = %state.display(), "emptied the state directory of the previous disk");
    }
    files::create_dirs(&state)?;
    let passphrase = generate_initial_passphrase()?;
    // Written before the format: a crash in between leaves a key for a disk that is
    // still "new", which the next boot formats again with a fresh key.
    files::write_atomic(
        &dir.initial_key(),
        passphrase.expose_secret(),
        files::KEY_FILE_MODE,
    )?;
    info!(step = "format", "formatting the state disk (first boot)");
    let disk = disk.clone();
    let uuid = blocking(move || disk.format_new(&passphrase)).await?;
    info!(step = "format", uuid = %uuid, "formatted the state disk with a first-boot passphrase");
    Ok(uuid)
}

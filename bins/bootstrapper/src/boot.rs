//! The boot phase, run in the same process before init or rejoin: decide from PCR 15 and the
//! state disk what this boot is, and format a new disk: where the disk is mapped, also make its
//! file system and mount it on `state/`.

use std::fs::OpenOptions;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use std::sync::Arc;

use asterism_disk::{DiskUuid, Unlocked, generate_initial_passphrase};
use tracing::{info, warn};

use crate::effects::{DiskOps, NodeMarker, StateMount};
use crate::error::{StepError, blocking};
use crate::files::{self, FileError, exists};
use asterism_basics::PathError;
use asterism_cluster::NodeDir;

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
/// cloud provider would attach), mode 0600: its LUKS2 header names the disk's UUID, which
/// no other local user should read. An existing image is left alone but for its mode,
/// which is restricted to 0600 as well.
pub fn prepare_state_image(path: &Path, size: u64) -> Result<(), FileError> {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    if let Some(parent) = path.parent() {
        files::create_dirs(parent)?;
    }
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(file) => {
            file.set_len(size)
                .map_err(PathError::at("cannot size the state disk image", path))?;
            info!(image = %path.display(), size, "created a new state disk image");
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(
                PathError::at("cannot restrict the state disk image to its owner", path),
            )?;
            Ok(())
        }
        Err(source) => {
            Err(PathError::at("cannot create the state disk image", path)(source).into())
        }
    }
}

/// Where the first-boot passphrase is kept: outside `state/` when the disk is mapped, since
/// `state/` is then the disk it protects.
pub(crate) fn initial_key_path(disk: &dyn DiskOps, dir: &NodeDir) -> PathBuf {
    if disk.maps() {
        dir.mapped_initial_key()
    } else {
        dir.initial_key()
    }
}

/// Reads PCR 15 and the disk and, for a new disk, formats it (and, mapped, makes its file
/// system and mounts it on `state/`).
pub(crate) async fn boot_phase(
    marker: &Arc<dyn NodeMarker>,
    disk: &Arc<dyn DiskOps>,
    mount: &Arc<dyn StateMount>,
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
    format_fresh(disk, mount, dir).await.map(Boot::Fresh)
}

/// First boot (or a disk marked for reset): an empty `state/`, a random first-boot
/// passphrase (0400; [`initial_key_path`]), the LUKS2 format, then, where the disk is
/// mapped, a new file system on the mapping, mounted on `state/` before anything is written
/// there. Nothing in this boot is irreversible: the disk's token still says "new", so a
/// failure here makes the next boot format it again.
async fn format_fresh(
    disk: &Arc<dyn DiskOps>,
    mount: &Arc<dyn StateMount>,
    dir: &NodeDir,
) -> Result<DiskUuid, StepError> {
    let state = dir.state();
    if exists(&state) {
        // `state/` stands for the file system on the disk: a new disk has none of it.
        std::fs::remove_dir_all(&state)
            .map_err(PathError::at("cannot empty the state directory", &state))?;
        warn!(dir = %state.display(), "emptied the state directory of the previous disk");
    }
    files::create_dirs(&state)?;
    let passphrase = generate_initial_passphrase()?;
    // Written before the format: a crash in between leaves a key for a disk that is
    // still "new", which the next boot formats again with a fresh key.
    files::write_atomic(
        &initial_key_path(disk.as_ref(), dir),
        passphrase.expose_secret(),
        files::KEY_FILE_MODE,
    )?;
    info!(step = "format", "formatting the state disk (first boot)");
    let ops = disk.clone();
    let (uuid, passphrase) =
        blocking(move || ops.format_new(&passphrase).map(|uuid| (uuid, passphrase))).await?;
    info!(step = "format", uuid = %uuid, "formatted the state disk with a first-boot passphrase");
    if !disk.maps() {
        return Ok(uuid);
    }
    let ops = disk.clone();
    match blocking(move || ops.unlock(&passphrase)).await? {
        Unlocked::Mapped(device) => mount_new(mount, device, state).await?,
        Unlocked::KeyChecked => warn!(
            step = "format",
            "no device-mapper: the state disk is not mapped, and state/ is a plain directory that stands for it"
        ),
    }
    Ok(uuid)
}

/// Makes the file system on the new disk's mapping and mounts it on `state/` (which the
/// caller left empty: a mount over files would hide them, beside the disk), readable by
/// root only.
async fn mount_new(
    mount: &Arc<dyn StateMount>,
    device: PathBuf,
    state: PathBuf,
) -> Result<(), StepError> {
    let fs = mount.clone();
    let target = state.clone();
    blocking(move || {
        fs.make_file_system(&device)?;
        fs.mount(&device, &target)?;
        info!(step = "format", device = %device.display(), state = %target.display(), "made the state disk's file system and mounted it on state/");
        Ok::<_, StepError>(())
    })
    .await?;
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(files::DIR_MODE)).map_err(
        PathError::at("cannot restrict the mounted state directory", &state),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    use asterism_disk::{DataKey, DiskError, Step};
    use asterism_kms::ClusterId;

    use crate::effects::MarkError;
    use crate::effects::fakes::RecordingMount;

    const UUID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
    const MAPPING: &str = "/dev/mapper/state";

    #[test]
    fn the_state_image_is_readable_by_its_owner_only() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("state.img");
        prepare_state_image(&image, 1 << 20).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&image), 0o600);
        // An image left readable by an older version is restricted too.
        std::fs::set_permissions(&image, std::fs::Permissions::from_mode(0o644)).unwrap();
        prepare_state_image(&image, 1 << 20).unwrap();
        assert_eq!(mode(&image), 0o600);
    }

    struct Unmarked;

    impl NodeMarker for Unmarked {
        fn is_marked(&self) -> Result<bool, MarkError> {
            Ok(false)
        }
        fn mark(&self, _: &ClusterId) -> Result<(), MarkError> {
            unreachable!("the boot phase never marks")
        }
    }

    /// A new disk. It logs its steps into the log it shares with the mount stand-in, with
    /// the passphrase each step was given. `maps`: what [`DiskOps::maps`] says; `mapping`:
    /// whether unlocking maps (device-mapper present) or falls back to a key check.
    struct NewDisk {
        maps: bool,
        mapping: bool,
        log: Arc<Mutex<Vec<String>>>,
        passphrases: Mutex<Vec<Vec<u8>>>,
    }

    impl NewDisk {
        fn step(&self, what: &str, passphrase: &DataKey) {
            self.log.lock().unwrap().push(what.to_owned());
            self.passphrases
                .lock()
                .unwrap()
                .push(passphrase.expose_secret().to_vec());
        }
    }

    impl DiskOps for NewDisk {
        fn is_initialized(&self) -> Result<bool, DiskError> {
            Ok(false)
        }
        fn format_new(&self, passphrase: &DataKey) -> Result<DiskUuid, DiskError> {
            self.step("format", passphrase);
            Ok(DiskUuid::parse(UUID).unwrap())
        }
        fn uuid(&self) -> Result<DiskUuid, DiskError> {
            Ok(DiskUuid::parse(UUID).unwrap())
        }
        fn replace_passphrase(&self, _: &DataKey, _: &DataKey) -> Result<(), DiskError> {
            unreachable!("the boot phase never re-keys")
        }
        fn mark_for_reset(&self) -> Result<(), DiskError> {
            unreachable!("the boot phase never resets")
        }
        fn unlock(&self, passphrase: &DataKey) -> Result<Unlocked, DiskError> {
            self.step("unlock", passphrase);
            Ok(if self.mapping {
                Unlocked::Mapped(MAPPING.into())
            } else {
                Unlocked::KeyChecked
            })
        }
        fn check_key(&self, _: &DataKey) -> Result<bool, DiskError> {
            unreachable!("the boot phase checks no key")
        }
        fn maps(&self) -> bool {
            self.maps
        }
    }

    struct FirstBoot {
        result: Result<Boot, StepError>,
        dir: NodeDir,
        disk: Arc<NewDisk>,
        log: Vec<String>,
        _tmp: tempfile::TempDir,
    }

    /// Boots a node on a new disk; `state/` holds a file of an earlier disk.
    async fn first_boot(maps: bool, mapping: bool, fail: Option<Step>) -> FirstBoot {
        let tmp = tempfile::tempdir().unwrap();
        let dir = NodeDir::new(tmp.path().join("node"));
        files::write_atomic(&dir.node_state(), b"of the previous disk", 0o600).unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let disk = Arc::new(NewDisk {
            maps,
            mapping,
            log: log.clone(),
            passphrases: Mutex::new(Vec::new()),
        });
        let mount = RecordingMount {
            log: log.clone(),
            fail,
            ..RecordingMount::default()
        };
        let marker: Arc<dyn NodeMarker> = Arc::new(Unmarked);
        let ops: Arc<dyn DiskOps> = disk.clone();
        let mount: Arc<dyn StateMount> = Arc::new(mount);
        let result = boot_phase(&marker, &ops, &mount, &dir).await;
        let log = log.lock().unwrap().clone();
        FirstBoot {
            result,
            dir,
            disk,
            log,
            _tmp: tmp,
        }
    }

    #[tokio::test]
    async fn a_mapped_first_boot_mounts_a_new_file_system_on_an_empty_state_before_anything_is_written()
     {
        let b = first_boot(true, true, None).await;
        assert!(matches!(b.result, Ok(Boot::Fresh(_))), "{:?}", b.result);
        let state = b.dir.state();
        assert_eq!(
            b.log,
            [
                "format".to_owned(),
                "unlock".to_owned(),
                format!("mkfs {MAPPING}"),
                format!("mount {MAPPING} on {} over 0 entries", state.display()),
            ]
        );
        // The first-boot passphrase is kept outside the disk it protects, and it is the
        // one the disk was formatted and mapped with.
        assert!(!b.dir.initial_key().exists());
        let kept = std::fs::read(b.dir.mapped_initial_key()).unwrap();
        let given = b.disk.passphrases.lock().unwrap().clone();
        assert_eq!(given, [kept.clone(), kept]);
        let mode = std::fs::metadata(&state).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "state/ is root's alone");
    }

    #[tokio::test]
    async fn without_a_mapping_state_is_a_plain_directory_holding_the_first_boot_key() {
        let b = first_boot(false, false, None).await;
        assert!(matches!(b.result, Ok(Boot::Fresh(_))), "{:?}", b.result);
        assert_eq!(b.log, ["format"], "nothing mapped, made or mounted");
        assert!(b.dir.initial_key().is_file());
        assert!(!b.dir.mapped_initial_key().exists());
        assert!(
            !b.dir.node_state().exists(),
            "the earlier disk's files are gone"
        );
    }

    #[tokio::test]
    async fn a_mapping_that_falls_back_to_a_key_check_mounts_nothing() {
        let b = first_boot(true, false, None).await;
        assert!(matches!(b.result, Ok(Boot::Fresh(_))), "{:?}", b.result);
        assert_eq!(b.log, ["format", "unlock"]);
        assert!(b.dir.mapped_initial_key().is_file());
        assert!(!b.dir.initial_key().exists());
    }

    #[tokio::test]
    async fn a_file_system_that_cannot_be_made_fails_the_boot_before_any_mount() {
        let b = first_boot(true, true, Some(Step::MakeFileSystem)).await;
        assert!(
            matches!(
                b.result,
                Err(StepError::FileSystem(
                    asterism_disk::FileSystemError::Failed {
                        step: Step::MakeFileSystem,
                        ..
                    }
                ))
            ),
            "{:?}",
            b.result
        );
        assert_eq!(
            b.log,
            [
                "format".to_owned(),
                "unlock".to_owned(),
                format!("mkfs {MAPPING}")
            ]
        );
    }
}

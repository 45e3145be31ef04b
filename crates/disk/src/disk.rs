//! [`StateDisk`]: the state disk's life cycle on top of cryptsetup.

use std::fs::{File, Permissions};
use std::io::{self, Read as _};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use asterism_cryptsetup::{Device, FormatParams as LibraryFormat};
use asterism_kms::{DataKey, DiskUuid};
use ring::rand::{SecureRandom, SystemRandom};
use tempfile::TempDir;
use tracing::{debug, info, warn};

use crate::command::{
    CommandOutput, CommandRunner, CryptsetupCli, FormatParams, Invocation, Step, SystemRunner,
    sanitize_stderr,
};
use crate::config::{Backend, DiskConfig, Integrity, MissingDeviceMapper};
use crate::error::DiskError;
use crate::header::{
    IntegrityRule, KeySlot, TokenState, ValidatedHeader, VolumeKeyDigest, read_token_state,
    token_json, validate_header,
};

/// The length of a generated initial passphrase: 32 random bytes, as long as a disk key.
pub const INITIAL_PASSPHRASE_LEN: usize = 32;

/// cryptsetup's exit status for "no key available with this passphrase".
const EXIT_WRONG_PASSPHRASE: i32 = 2;

/// How [`StateDisk::unlock`] unlocked the disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unlocked {
    /// The disk is mapped at this path (`/dev/mapper/<name>`).
    Mapped(PathBuf),
    /// The kernel has no device-mapper: the passphrase was checked against the validated
    /// header, but nothing was mapped. Only with [`MissingDeviceMapper::KeyCheckOnly`].
    KeyChecked,
}

/// What [`StateDisk::format_new`] produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Formatted {
    /// The new LUKS UUID.
    pub uuid: DiskUuid,
    /// Whether the data segment has dm-integrity.
    pub integrity: bool,
}

/// 32 fresh random bytes (raw binary, not text) for the first keyslot of a new disk.
pub fn generate_initial_passphrase() -> Result<DataKey, DiskError> {
    let mut bytes = vec![0u8; INITIAL_PASSPHRASE_LEN];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| DiskError::Random)?;
    // `DataKey::new` takes the vector without copying it and wipes it when dropped.
    DataKey::new(bytes).map_err(|_| DiskError::Random)
}

/// The magic and version that open a LUKS2 header (the binary header's first 8 bytes).
const LUKS2_MAGIC: [u8; 8] = *b"LUKS\xba\xbe\x00\x02";

/// The header an operation validated and then works with, and its JSON metadata.
struct HeaderCopy {
    json: String,
    source: CopySource,
}

enum CopySource {
    /// A copy of the header and keyslot areas in a private scratch directory, removed when
    /// this is dropped ([`Backend::Program`], and the mapping).
    File { _dir: TempDir, file: PathBuf },
    /// The header libcryptsetup loaded into memory ([`Backend::Library`]).
    Loaded(Device),
}

/// A validated header on which a passphrase was just shown to open `slot`.
struct Verified {
    copy: HeaderCopy,
    header: ValidatedHeader,
    slot: KeySlot,
}

/// The keyslot step 3 of the re-key keeps.
enum Keep {
    /// Proven to open with the new passphrase, on this header.
    Verified(Verified),
    /// To be checked first (the crash tests run step 3 on its own).
    #[cfg(test)]
    Slot(KeySlot),
}

impl HeaderCopy {
    fn loaded(&self) -> Option<&Device> {
        match &self.source {
            CopySource::Loaded(device) => Some(device),
            CopySource::File { .. } => None,
        }
    }
}

/// The LUKS2 state disk on one block device or image file.
///
/// Every operation first takes the header off the device and validates it
/// ([`crate::validate_header`]); it refuses a header that fails. With [`Backend::Library`]
/// the header is loaded once into libcryptsetup's memory, validated there (its JSON as the
/// library holds it), and the key checks and writes of the step use that loaded header. With
/// [`Backend::Program`] it is a detached copy in a scratch directory, and key checks and the
/// mapping use the copy (`--header`). Either way a header swapped on the device after the
/// check is not the one a key is checked against, and every write is followed by another
/// validated load that must have the same volume key.
///
/// Blocking: each call loads the header or runs cryptsetup one or more times, and a key
/// check costs a PBKDF run (about 2 s with the default parameters). Async callers run it on a
/// blocking thread.
pub struct StateDisk<R: CommandRunner = SystemRunner> {
    path: PathBuf,
    config: DiskConfig,
    cli: CryptsetupCli,
    runner: R,
}

impl StateDisk<SystemRunner> {
    /// The state disk at `path` (a block device or an image file; symbolic links are
    /// resolved, since clouds name the state disk by a link such as
    /// `/dev/disk/by-id/google-state-disk`).
    /// Nothing is read from the disk yet.
    pub fn open(path: impl AsRef<Path>, config: DiskConfig) -> Result<Self, DiskError> {
        let runner = SystemRunner::new(config.device_mapper_control.clone());
        Self::with_runner(path, config, runner)
    }
}

impl<R: CommandRunner> StateDisk<R> {
    /// Like [`StateDisk::open`], with another way of running cryptsetup.
    pub fn with_runner(
        path: impl AsRef<Path>,
        config: DiskConfig,
        runner: R,
    ) -> Result<Self, DiskError> {
        config.validate()?;
        let given = path.as_ref();
        let path = given.canonicalize().map_err(|source| DiskError::Device {
            path: given.to_path_buf(),
            source,
        })?;
        Ok(Self {
            cli: CryptsetupCli::new(config.cryptsetup.clone()),
            path,
            config,
            runner,
        })
    }

    /// The resolved device path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &DiskConfig {
        &self.config
    }

    /// Whether the disk holds an initialized state disk (docs/disk.md): its header is
    /// LUKS2 and token 0 is the state-disk token with `diskIsInitialized: true`. Anything
    /// else is a new disk (`false`).
    ///
    /// A header that claims to be initialized but fails validation is an error, not a new
    /// disk, so that tampering with a header cannot make a node format its state disk. An
    /// error running cryptsetup is an error too, never `false`.
    pub fn is_initialized(&self) -> Result<bool, DiskError> {
        let Some(copy) = self.copy_header()? else {
            return Ok(false);
        };
        match read_token_state(&copy.json) {
            TokenState::Initialized => {
                self.validate(&copy)?;
                Ok(true)
            }
            TokenState::NotInitialized | TokenState::Absent => Ok(false),
        }
    }

    /// First-boot format (docs/disk.md): LUKS2, aes-xts-plain64, 4096-byte sectors,
    /// `passphrase` in keyslot 0 with the configured argon2id parameters, dm-integrity as
    /// configured, then token 0 with `diskIsInitialized: false`.
    ///
    /// Destroys whatever the device held, so it refuses a disk whose token says it is
    /// initialized ([`StateDisk::mark_for_reset`] first).
    pub fn format_new(&self, passphrase: &DataKey) -> Result<Formatted, DiskError> {
        if self.is_initialized()? {
            return Err(DiskError::AlreadyInitialized {
                path: self.path.clone(),
            });
        }
        let mut integrity = self.integrity_for_format()?;
        info!(device = %self.path.display(), integrity, pbkdf = ?self.config.pbkdf, backend = ?self.config.backend, "formatting the state disk");
        if self.config.backend == Backend::Library && !integrity {
            // dm-integrity needs device-mapper to format; without it, all in process.
            self.library_format(passphrase)?;
            return self.check_formatted(integrity);
        }
        let out = self.run_format(passphrase, integrity)?;
        if !out.success() {
            if !(integrity && is_device_mapper_error(&out.stderr)) {
                return Err(self.failed(Step::Format, &out));
            }
            // The control node exists, but the kernel has no device-mapper after all.
            if self.config.integrity != Integrity::HmacSha256IfAvailable {
                return Err(DiskError::IntegrityUnavailable {
                    path: self.path.clone(),
                });
            }
            warn_no_integrity(&self.path, "cryptsetup cannot initialise device-mapper");
            integrity = false;
            let out = self.run_format(passphrase, integrity)?;
            if !out.success() {
                return Err(self.failed(Step::Format, &out));
            }
        }
        self.run_ok(
            &self.cli.import_token(&self.path, &token_json(false)),
            self.config.command_timeout,
        )?;
        self.check_formatted(integrity)
    }

    /// The in-process format: header, keyslot 0 and the token, on one handle.
    fn library_format(&self, passphrase: &DataKey) -> Result<(), DiskError> {
        let lib = |step| move |source| self.library_error(step, source);
        let device = Device::init(&self.path).map_err(lib(Step::Format))?;
        device
            .format_luks2(&LibraryFormat {
                cipher: "aes".to_owned(),
                cipher_mode: "xts-plain64".to_owned(),
                volume_key_bytes: 64,
                sector_size: 4096,
                pbkdf: self.config.pbkdf,
                keyslots_area_bytes: self.config.keyslots_area.bytes(64),
            })
            .map_err(lib(Step::Format))?;
        device
            .add_keyslot_by_volume_key(KeySlot::FIRST.get(), passphrase.expose_secret())
            .map_err(lib(Step::Format))?;
        device
            .set_token_json(0, &token_json(false))
            .map_err(lib(Step::ImportToken))
    }

    /// Checks a fresh format on a newly validated header, and reports it.
    fn check_formatted(&self, integrity: bool) -> Result<Formatted, DiskError> {
        let (copy, header) = self.validated_copy()?;
        if header.keyslots() != [KeySlot::FIRST]
            || header.token() != TokenState::NotInitialized
            || header.integrity() != integrity
        {
            return Err(DiskError::Unexpected {
                path: self.path.clone(),
                step: Step::Format,
                detail: format!(
                    "header has keyslots {:?}, token {:?}, integrity {}",
                    header.keyslots(),
                    header.token(),
                    header.integrity()
                ),
            });
        }
        let uuid = self.uuid_of(&copy)?;
        info!(device = %self.path.display(), uuid = uuid.as_str(), integrity, "formatted the state disk");
        Ok(Formatted { uuid, integrity })
    }

    /// The disk's LUKS UUID, lower case (the key service derives the disk key from it).
    pub fn uuid(&self) -> Result<DiskUuid, DiskError> {
        if self.config.backend == Backend::Program {
            return self.program_uuid();
        }
        let (copy, _) = self.validated_copy()?;
        self.uuid_of(&copy)
    }

    /// The UUID of a validated header (the library's, or the program's answer).
    fn uuid_of(&self, copy: &HeaderCopy) -> Result<DiskUuid, DiskError> {
        match copy.loaded() {
            Some(device) => parse_uuid(&self.path, &device.uuid().unwrap_or_default()),
            None => self.program_uuid(),
        }
    }

    /// `luksUUID` on the device.
    fn program_uuid(&self) -> Result<DiskUuid, DiskError> {
        let out = self.run_ok(&self.cli.uuid(&self.path), self.config.command_timeout)?;
        parse_uuid(&self.path, &String::from_utf8_lossy(&out.stdout))
    }

    /// Whether `passphrase` opens a keyslot of the (validated) header.
    pub fn check_key(&self, passphrase: &DataKey) -> Result<bool, DiskError> {
        let (copy, header) = self.validated_copy()?;
        Ok(self.find_slot(&copy, &header, passphrase)?.is_some())
    }

    /// Replaces `old` by `new` (docs/disk.md), safely, then sets token 0 to
    /// `diskIsInitialized: true`.
    ///
    /// The sequence never leaves the disk without a working passphrase:
    /// 1. add `new` in a free keyslot (authorised by `old`) and check that it opens exactly
    ///    that keyslot;
    /// 2. only if `old` opens nothing (or no keyslot is free): `new` must already open one
    ///    (an earlier run got past step 3), else the call fails with `WrongPassphrase`;
    /// 3. remove every other keyslot, each removal authorised by `new` (cryptsetup refuses to
    ///    remove a slot unless the given passphrase opens another one);
    /// 4. set the token.
    ///
    /// Until step 3 both passphrases work; after it only `new` does. Running it again after a
    /// crash at any point converges to the same end state. Throughout, the volume key digest
    /// must stay that of the header validated at the start.
    pub fn replace_passphrase(&self, old: &DataKey, new: &DataKey) -> Result<(), DiskError> {
        // Each step hands the header it validated (and, with the library, loaded) to the next,
        // so a key proven on a header is not proven again on a reload of the same header.
        let (copy, header) = self.validated_copy()?;
        let pin = header.volume_key_digest().clone();
        // The usual case first: `old` still opens its slot, so add `new` beside it. Only when
        // `old` opens nothing (or no slot is free) may an earlier run have got past step 3;
        // then `new` must already open a slot. (After a crash between steps 2 and 3 both
        // open, and this adds `new` once more; step 3 removes every other slot all the same.)
        let verified = match self.add_verified(old, new, &pin, Some((copy, header))) {
            Ok(verified) => verified,
            Err(DiskError::WrongPassphrase { .. } | DiskError::NoFreeKeyslot { .. }) => {
                let (copy, header) = self.validated_copy()?;
                self.ensure_volume_key(&pin, &header, Step::HeaderBackup)?;
                let Some(slot) = self.find_slot(&copy, &header, new)? else {
                    return Err(DiskError::WrongPassphrase {
                        path: self.path.clone(),
                    });
                };
                info!(device = %self.path.display(), %slot, "the new passphrase already opens a keyslot: finishing an interrupted re-key");
                Verified { copy, header, slot }
            }
            Err(e) => return Err(e),
        };
        let keep = verified.slot;
        let only_keep = self.remove_others(new, Keep::Verified(verified), &pin)?;
        self.write_token(true, &pin, Some(only_keep))?;
        info!(device = %self.path.display(), slot = %keep, "re-keyed the state disk");
        Ok(())
    }

    /// Sets token 0 to `diskIsInitialized: false`, so that the next boot treats the disk as
    /// new and formats it (docs/disk.md: a node whose initialization failed after the node
    /// lock must be reset, not left half-initialized).
    pub fn mark_for_reset(&self) -> Result<(), DiskError> {
        let (_, header) = self.validated_copy()?;
        self.set_token(false, header.volume_key_digest())?;
        info!(device = %self.path.display(), "marked the state disk for reset");
        Ok(())
    }

    /// Unlocks the disk with `passphrase`: maps it at `/dev/mapper/<mapper_name>` with the
    /// validated header copy. Without device-mapper (no control node, or cryptsetup says it
    /// cannot initialise device-mapper), [`MissingDeviceMapper::KeyCheckOnly`] checks the
    /// passphrase instead, returns [`Unlocked::KeyChecked`] and logs a warning;
    /// [`MissingDeviceMapper::Fail`] fails.
    pub fn unlock(&self, passphrase: &DataKey) -> Result<Unlocked, DiskError> {
        let (copy, header) = self.validated_copy()?;
        if !self.runner.device_mapper_available() {
            return self.key_check_instead(
                &copy,
                &header,
                passphrase,
                "no device-mapper control node",
            );
        }
        // The mapping runs the program against a detached copy, whatever the backend: it
        // needs device-mapper, and with it the program's bounded run.
        let (copy, header) = if copy.loaded().is_some() {
            drop(copy);
            self.validated_copy_with(Backend::Program)?
        } else {
            (copy, header)
        };
        let CopySource::File { file, .. } = &copy.source else {
            return Err(DiskError::Unexpected {
                path: self.path.clone(),
                step: Step::HeaderBackup,
                detail: "no detached header copy for the mapping".to_owned(),
            });
        };
        let name = &self.config.mapper_name;
        let inv = self.cli.open(&self.path, file, name, passphrase);
        let out = self.run(&inv, self.config.command_timeout)?;
        if out.success() {
            let mapped = Path::new("/dev/mapper").join(name);
            info!(device = %self.path.display(), mapped = %mapped.display(), "mapped the state disk");
            return Ok(Unlocked::Mapped(mapped));
        }
        if out.status == Some(EXIT_WRONG_PASSPHRASE) {
            return Err(DiskError::WrongPassphrase {
                path: self.path.clone(),
            });
        }
        if is_device_mapper_error(&out.stderr) {
            return self.key_check_instead(
                &copy,
                &header,
                passphrase,
                "cryptsetup cannot initialise device-mapper",
            );
        }
        Err(self.failed(inv.step(), &out))
    }

    /// Copies and validates the header, and returns what it says.
    pub fn validated_header(&self) -> Result<ValidatedHeader, DiskError> {
        self.validated_copy().map(|(_, header)| header)
    }

    // ---- steps (crate-visible so tests can stop between them, as a crash would) ----

    /// Step 2 of the re-key: adds `new` in the lowest free keyslot, authorised by `old`, and
    /// checks on a fresh validated copy (same volume key) that `new` opens that slot.
    #[cfg(test)]
    pub(crate) fn add_verified_keyslot(
        &self,
        old: &DataKey,
        new: &DataKey,
        pin: &VolumeKeyDigest,
    ) -> Result<KeySlot, DiskError> {
        self.add_verified(old, new, pin, None).map(|v| v.slot)
    }

    /// [`StateDisk::add_verified_keyslot`], on `held` (validated with `pin`) if given, and
    /// returning the fresh validated header on which `new` was proven.
    fn add_verified(
        &self,
        old: &DataKey,
        new: &DataKey,
        pin: &VolumeKeyDigest,
        held: Option<(HeaderCopy, ValidatedHeader)>,
    ) -> Result<Verified, DiskError> {
        let (copy, header) = match held {
            Some(held) => held,
            None => self.validated_copy()?,
        };
        self.ensure_volume_key(pin, &header, Step::HeaderBackup)?;
        let slot = header
            .free_keyslot()
            .ok_or_else(|| DiskError::NoFreeKeyslot {
                path: self.path.clone(),
            })?;
        if let Some(device) = copy.loaded() {
            let lib = |source| self.library_error(Step::AddKey, source);
            device.set_pbkdf(&self.config.pbkdf).map_err(lib)?;
            match device.add_keyslot(slot.get(), old.expose_secret(), new.expose_secret()) {
                Ok(added) if added == slot.get() => {}
                Ok(other) => {
                    return Err(DiskError::Unexpected {
                        path: self.path.clone(),
                        step: Step::AddKey,
                        detail: format!("asked for keyslot {slot}, got {other}"),
                    });
                }
                Err(e) if e.is_wrong_passphrase() => {
                    return Err(DiskError::WrongPassphrase {
                        path: self.path.clone(),
                    });
                }
                Err(e) => return Err(lib(e)),
            }
        } else {
            let inv = self
                .cli
                .add_key(&self.path, old, new, slot, &self.config.pbkdf);
            let out = self.run(&inv, self.config.command_timeout)?;
            if out.status == Some(EXIT_WRONG_PASSPHRASE) {
                return Err(DiskError::WrongPassphrase {
                    path: self.path.clone(),
                });
            }
            if !out.success() {
                return Err(self.failed(inv.step(), &out));
            }
        }
        drop(copy);
        debug!(device = %self.path.display(), %slot, "added a keyslot");

        let (copy, header) = self.validated_copy()?;
        self.ensure_volume_key(pin, &header, Step::AddKey)?;
        if self.test_slot(&copy, &header, Some(slot), new)? != Some(slot) {
            return Err(DiskError::NewKeyNotVerified {
                path: self.path.clone(),
                slot,
            });
        }
        info!(device = %self.path.display(), %slot, "added the new passphrase and checked that it opens its keyslot");
        Ok(Verified { copy, header, slot })
    }

    /// Step 3 of the re-key: removes every keyslot but `keep`, each removal authorised by
    /// `new`, then checks that only `keep` is left and the volume key is unchanged.
    #[cfg(test)]
    pub(crate) fn remove_other_keyslots(
        &self,
        new: &DataKey,
        keep: KeySlot,
        pin: &VolumeKeyDigest,
    ) -> Result<(), DiskError> {
        self.remove_others(new, Keep::Slot(keep), pin).map(drop)
    }

    /// [`StateDisk::remove_other_keyslots`]; returns the fresh validated header that has only
    /// the kept slot.
    fn remove_others(
        &self,
        new: &DataKey,
        keep: Keep,
        pin: &VolumeKeyDigest,
    ) -> Result<(HeaderCopy, ValidatedHeader), DiskError> {
        let (copy, header, keep, proven) = match keep {
            Keep::Verified(v) => (v.copy, v.header, v.slot, true),
            #[cfg(test)]
            Keep::Slot(slot) => {
                let (copy, header) = self.validated_copy()?;
                (copy, header, slot, false)
            }
        };
        self.ensure_volume_key(pin, &header, Step::HeaderBackup)?;
        if let Some(device) = copy.loaded() {
            // The library destroys a keyslot without asking for a passphrase, so the rule
            // the program enforces is checked here: `new` must open `keep` first (on this
            // very header, unless that was just proven on it).
            if !proven && self.test_slot(&copy, &header, Some(keep), new)? != Some(keep) {
                return Err(DiskError::WrongPassphrase {
                    path: self.path.clone(),
                });
            }
            for &slot in header.keyslots().iter().filter(|&&s| s != keep) {
                device
                    .destroy_keyslot(slot.get())
                    .map_err(|source| self.library_error(Step::KillSlot, source))?;
                info!(device = %self.path.display(), %slot, "removed a keyslot");
            }
        } else {
            for &slot in header.keyslots().iter().filter(|&&s| s != keep) {
                let inv = self.cli.kill_slot(&self.path, slot, new);
                self.run_ok(&inv, self.config.command_timeout)?;
                info!(device = %self.path.display(), %slot, "removed a keyslot");
            }
        }
        drop(copy);
        let (copy, header) = self.validated_copy()?;
        self.ensure_volume_key(pin, &header, Step::KillSlot)?;
        if header.keyslots() != [keep] {
            return Err(DiskError::Unexpected {
                path: self.path.clone(),
                step: Step::KillSlot,
                detail: format!(
                    "keyslots {:?} are left, only {keep} should be",
                    header.keyslots()
                ),
            });
        }
        Ok((copy, header))
    }

    /// Writes token 0 with `initialized` and checks the result on a fresh validated copy.
    pub(crate) fn set_token(
        &self,
        initialized: bool,
        pin: &VolumeKeyDigest,
    ) -> Result<(), DiskError> {
        self.write_token(initialized, pin, None)
    }

    /// [`StateDisk::set_token`], on `held` (validated) if given.
    fn write_token(
        &self,
        initialized: bool,
        pin: &VolumeKeyDigest,
        held: Option<(HeaderCopy, ValidatedHeader)>,
    ) -> Result<(), DiskError> {
        if self.config.backend == Backend::Library {
            let (copy, header) = match held {
                Some(held) => held,
                None => self.validated_copy()?,
            };
            self.ensure_volume_key(pin, &header, Step::HeaderBackup)?;
            if let Some(device) = copy.loaded() {
                device
                    .set_token_json(0, &token_json(initialized))
                    .map_err(|source| self.library_error(Step::ImportToken, source))?;
            }
        } else {
            let inv = self.cli.import_token(&self.path, &token_json(initialized));
            self.run_ok(&inv, self.config.command_timeout)?;
        }
        let (_, header) = self.validated_copy()?;
        self.ensure_volume_key(pin, &header, Step::ImportToken)?;
        let wanted = if initialized {
            TokenState::Initialized
        } else {
            TokenState::NotInitialized
        };
        if header.token() != wanted {
            return Err(DiskError::Unexpected {
                path: self.path.clone(),
                step: Step::ImportToken,
                detail: format!("token is {:?} after writing it", header.token()),
            });
        }
        debug!(device = %self.path.display(), initialized, "wrote the state-disk token");
        Ok(())
    }

    // ---- helpers ----

    fn integrity_rule(&self) -> IntegrityRule {
        match self.config.integrity {
            Integrity::HmacSha256 => IntegrityRule::Required,
            Integrity::HmacSha256IfAvailable | Integrity::None => IntegrityRule::Optional,
        }
    }

    fn integrity_for_format(&self) -> Result<bool, DiskError> {
        match self.config.integrity {
            Integrity::None => Ok(false),
            Integrity::HmacSha256 => {
                if self.runner.device_mapper_available() {
                    Ok(true)
                } else {
                    Err(DiskError::IntegrityUnavailable {
                        path: self.path.clone(),
                    })
                }
            }
            Integrity::HmacSha256IfAvailable => {
                if self.runner.device_mapper_available() {
                    Ok(true)
                } else {
                    warn_no_integrity(&self.path, "no device-mapper control node");
                    Ok(false)
                }
            }
        }
    }

    fn run_format(
        &self,
        passphrase: &DataKey,
        integrity: bool,
    ) -> Result<CommandOutput, DiskError> {
        let params = FormatParams {
            pbkdf: self.config.pbkdf,
            integrity,
            integrity_wipe: self.config.integrity_wipe,
            keyslots_area_bytes: self
                .config
                .keyslots_area
                .bytes(if integrity { 96 } else { 64 }),
        };
        // Wiping for integrity writes the whole device: that gets its own, longer bound.
        let timeout = if integrity && self.config.integrity_wipe {
            self.config.wipe_timeout
        } else {
            self.config.command_timeout
        };
        self.run(&self.cli.format(&self.path, &params, passphrase), timeout)
    }

    fn key_check_instead(
        &self,
        copy: &HeaderCopy,
        header: &ValidatedHeader,
        passphrase: &DataKey,
        why: &str,
    ) -> Result<Unlocked, DiskError> {
        match self.config.missing_device_mapper {
            MissingDeviceMapper::Fail => Err(DiskError::DeviceMapperUnavailable {
                path: self.path.clone(),
                detail: why.to_owned(),
            }),
            MissingDeviceMapper::KeyCheckOnly => match self.find_slot(copy, header, passphrase)? {
                Some(slot) => {
                    warn!(
                        device = %self.path.display(),
                        %slot,
                        reason = why,
                        "state disk KEY-CHECKED, NOT MAPPED: the passphrase opens the disk, but without device-mapper nothing is mapped"
                    );
                    Ok(Unlocked::KeyChecked)
                }
                None => Err(DiskError::WrongPassphrase {
                    path: self.path.clone(),
                }),
            },
        }
    }

    /// Which keyslot of the validated copy `passphrase` opens, if any.
    fn find_slot(
        &self,
        copy: &HeaderCopy,
        header: &ValidatedHeader,
        passphrase: &DataKey,
    ) -> Result<Option<KeySlot>, DiskError> {
        self.test_slot(copy, header, None, passphrase)
    }

    /// Which keyslot of the validated copy `passphrase` opens (only `slot`, if given).
    fn test_slot(
        &self,
        copy: &HeaderCopy,
        header: &ValidatedHeader,
        slot: Option<KeySlot>,
        passphrase: &DataKey,
    ) -> Result<Option<KeySlot>, DiskError> {
        let file = match &copy.source {
            CopySource::Loaded(device) => {
                let opened = device
                    .test_passphrase(slot.map(KeySlot::get), passphrase.expose_secret())
                    .map_err(|source| self.library_error(Step::TestPassphrase, source))?;
                return match opened.map(KeySlot::new) {
                    None => Ok(None),
                    Some(Some(opened)) if header.keyslots().contains(&opened) => Ok(Some(opened)),
                    Some(_) => Err(DiskError::Unexpected {
                        path: self.path.clone(),
                        step: Step::TestPassphrase,
                        detail: "the library opened a keyslot the header does not list".to_owned(),
                    }),
                };
            }
            CopySource::File { file, .. } => file,
        };
        let inv = self
            .cli
            .test_passphrase(&self.path, Some(file), slot, passphrase);
        let out = self.run(&inv, self.config.command_timeout)?;
        if out.status == Some(EXIT_WRONG_PASSPHRASE) {
            return Ok(None);
        }
        if !out.success() {
            return Err(self.failed(inv.step(), &out));
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let slot = stdout.lines().find_map(|line| {
            let n = line.strip_prefix("Key slot ")?.strip_suffix(" unlocked.")?;
            n.parse::<u8>().ok().and_then(KeySlot::new)
        });
        match slot {
            Some(slot) if header.keyslots().contains(&slot) => Ok(Some(slot)),
            _ => Err(DiskError::Unexpected {
                path: self.path.clone(),
                step: Step::TestPassphrase,
                detail: "success without naming a keyslot of the header".to_owned(),
            }),
        }
    }

    fn ensure_volume_key(
        &self,
        pin: &VolumeKeyDigest,
        header: &ValidatedHeader,
        step: Step,
    ) -> Result<(), DiskError> {
        if header.volume_key_digest() == pin {
            Ok(())
        } else {
            warn!(device = %self.path.display(), %step, "the state disk's volume key changed underneath");
            Err(DiskError::VolumeKeyChanged {
                path: self.path.clone(),
                step,
            })
        }
    }

    /// Takes the header off the device with the configured backend and reads its metadata;
    /// `None` if the device has no LUKS2 header.
    fn copy_header(&self) -> Result<Option<HeaderCopy>, DiskError> {
        self.copy_header_with(self.config.backend)
    }

    fn copy_header_with(&self, backend: Backend) -> Result<Option<HeaderCopy>, DiskError> {
        match backend {
            Backend::Library => self.load_header(),
            Backend::Program => self.copy_header_to_file(),
        }
    }

    /// Loads the header into libcryptsetup and dumps its metadata from there.
    fn load_header(&self) -> Result<Option<HeaderCopy>, DiskError> {
        let device =
            Device::init(&self.path).map_err(|source| self.library_error(Step::IsLuks2, source))?;
        if let Err(source) = device.load_luks2() {
            // No LUKS2 header is a new disk; a LUKS2 header the library cannot load is not.
            let magic = starts_with_luks2_magic(&self.path).map_err(|source| DiskError::Read {
                path: self.path.clone(),
                source,
            })?;
            if magic {
                warn!(device = %self.path.display(), error = %source, "the LUKS2 header cannot be loaded");
                return Err(DiskError::DamagedHeader {
                    path: self.path.clone(),
                    source,
                });
            }
            return Ok(None);
        }
        let json = device
            .metadata_json()
            .map_err(|source| self.library_error(Step::DumpHeader, source))?;
        Ok(Some(HeaderCopy {
            json,
            source: CopySource::Loaded(device),
        }))
    }

    /// Copies the header into a fresh private directory and dumps its metadata.
    fn copy_header_to_file(&self) -> Result<Option<HeaderCopy>, DiskError> {
        let timeout = self.config.command_timeout;
        let is_luks2 = self.cli.is_luks2(&self.path);
        let out = self.run(&is_luks2, timeout)?;
        match out.status {
            Some(0) => {}
            // 1: no LUKS header, or not LUKS2. Other codes (4: no such device, …) are errors.
            Some(1) => return Ok(None),
            _ => return Err(self.failed(is_luks2.step(), &out)),
        }
        let dir = tempfile::Builder::new()
            .prefix("asterism-luks-header-")
            .permissions(Permissions::from_mode(0o700))
            .tempdir_in(&self.config.scratch_dir)
            .map_err(|source| DiskError::Scratch {
                dir: self.config.scratch_dir.clone(),
                source,
            })?;
        let file = dir.path().join("header");
        self.run_ok(&self.cli.header_backup(&self.path, &file), timeout)?;
        let out = self.run_ok(&self.cli.dump_json(&file), timeout)?;
        let json = String::from_utf8(out.stdout).map_err(|_| DiskError::Unexpected {
            path: self.path.clone(),
            step: Step::DumpHeader,
            detail: "metadata is not UTF-8".to_owned(),
        })?;
        Ok(Some(HeaderCopy {
            json,
            source: CopySource::File { _dir: dir, file },
        }))
    }

    fn validate(&self, copy: &HeaderCopy) -> Result<ValidatedHeader, DiskError> {
        validate_header(&copy.json, self.integrity_rule()).map_err(|source| {
            warn!(device = %self.path.display(), error = %source, "refusing a LUKS2 header that fails validation");
            DiskError::InvalidHeader {
                path: self.path.clone(),
                source,
            }
        })
    }

    fn validated_copy(&self) -> Result<(HeaderCopy, ValidatedHeader), DiskError> {
        self.validated_copy_with(self.config.backend)
    }

    fn validated_copy_with(
        &self,
        backend: Backend,
    ) -> Result<(HeaderCopy, ValidatedHeader), DiskError> {
        let copy = self
            .copy_header_with(backend)?
            .ok_or_else(|| DiskError::NotLuks2 {
                path: self.path.clone(),
            })?;
        let header = self.validate(&copy)?;
        Ok((copy, header))
    }

    fn run(&self, inv: &Invocation, timeout: Duration) -> Result<CommandOutput, DiskError> {
        debug!(device = %self.path.display(), step = %inv.step(), "running cryptsetup");
        self.runner
            .run(inv, timeout)
            .map_err(|source| DiskError::Run {
                path: self.path.clone(),
                step: inv.step(),
                source,
            })
    }

    fn run_ok(&self, inv: &Invocation, timeout: Duration) -> Result<CommandOutput, DiskError> {
        let out = self.run(inv, timeout)?;
        if out.success() {
            Ok(out)
        } else {
            Err(self.failed(inv.step(), &out))
        }
    }

    fn library_error(&self, step: Step, source: asterism_cryptsetup::Error) -> DiskError {
        DiskError::Library {
            path: self.path.clone(),
            step,
            source,
        }
    }

    fn failed(&self, step: Step, out: &CommandOutput) -> DiskError {
        DiskError::Failed {
            path: self.path.clone(),
            step,
            status: out.status,
            stderr: sanitize_stderr(&out.stderr),
        }
    }
}

fn parse_uuid(path: &Path, text: &str) -> Result<DiskUuid, DiskError> {
    DiskUuid::parse(text.trim()).map_err(|_| DiskError::Unexpected {
        path: path.to_path_buf(),
        step: Step::Uuid,
        detail: "the header's UUID is not a UUID".to_owned(),
    })
}

/// Whether the device starts with the LUKS2 magic and version.
fn starts_with_luks2_magic(path: &Path) -> io::Result<bool> {
    let mut start = [0u8; LUKS2_MAGIC.len()];
    let mut file = File::open(path)?;
    match file.read_exact(&mut start) {
        Ok(()) => Ok(start == LUKS2_MAGIC),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether cryptsetup's standard error says the kernel has no device-mapper.
fn is_device_mapper_error(stderr: &[u8]) -> bool {
    let text = String::from_utf8_lossy(stderr);
    text.contains("Cannot initialize device-mapper") || text.contains("dm_mod")
}

fn warn_no_integrity(path: &Path, why: &str) {
    warn!(
        device = %path.display(),
        reason = why,
        "the kernel has no device-mapper: formatting the state disk WITHOUT dm-integrity (confidentiality only, the data is not authenticated)"
    );
}

#[cfg(test)]
mod tests {
    //! Crash safety of the re-key: these stop between the crate-internal steps of
    //! `replace_passphrase`, as a crash or power loss would, and run it again. Real
    //! cryptsetup on image files.

    use std::io::Write as _;
    use std::process::{Command, Stdio};

    use super::*;
    use crate::config::Pbkdf;

    struct Fixture {
        dir: TempDir,
        disk: StateDisk,
    }

    fn key(text: &str) -> DataKey {
        DataKey::new(text.as_bytes().to_vec()).unwrap()
    }

    const BACKENDS: [Backend; 2] = [Backend::Library, Backend::Program];

    fn fixture(backend: Backend) -> Fixture {
        let (dir, image) = asterism_testkit::luks::blank_image();
        let config = DiskConfig {
            backend,
            pbkdf: Pbkdf::FAST_FOR_TESTS,
            scratch_dir: dir.path().to_path_buf(),
            ..DiskConfig::local()
        };
        let disk = StateDisk::open(&image, config).unwrap();
        Fixture { dir, disk }
    }

    /// Asks the cryptsetup program directly, not through this crate.
    fn opens(disk: &StateDisk, passphrase: &DataKey) -> bool {
        let mut child = asterism_children::spawn(
            Command::new("cryptsetup")
                .args(["open", "--test-passphrase", "--key-file", "-"])
                .arg(disk.path())
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )
        .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(passphrase.expose_secret())
            .unwrap();
        child.wait().unwrap().success()
    }

    fn pin(disk: &StateDisk) -> VolumeKeyDigest {
        disk.validated_header().unwrap().volume_key_digest().clone()
    }

    /// A disk formatted with `old` whose re-key to `new` stopped after adding the new
    /// keyslot: the fixture, `old`, `new`, the volume key pin and the new slot.
    fn new_keyslot_added(
        backend: Backend,
    ) -> (Fixture, DataKey, DataKey, VolumeKeyDigest, KeySlot) {
        let f = fixture(backend);
        let (old, new) = (key("old passphrase"), key("new passphrase"));
        f.disk.format_new(&old).unwrap();
        let pin = pin(&f.disk);
        let slot = f.disk.add_verified_keyslot(&old, &new, &pin).unwrap();
        (f, old, new, pin, slot)
    }

    #[test]
    fn crash_after_adding_the_new_keyslot_converges() {
        for backend in BACKENDS {
            crash_after_adding_the_new_keyslot_converges_with(backend);
        }
    }

    fn crash_after_adding_the_new_keyslot_converges_with(backend: Backend) {
        // Crash right after step 2: both passphrases work, nothing is lost.
        let (f, old, new, _, slot) = new_keyslot_added(backend);
        assert_eq!(slot, KeySlot::new(1).unwrap());
        assert!(opens(&f.disk, &old));
        assert!(opens(&f.disk, &new));
        assert!(!f.disk.is_initialized().unwrap());

        // Running the whole re-key again finishes the job.
        f.disk.replace_passphrase(&old, &new).unwrap();
        assert!(!opens(&f.disk, &old));
        assert!(opens(&f.disk, &new));
        assert!(f.disk.is_initialized().unwrap());
        // Both keys opened, so the new one was added once more; only that slot is left.
        let left = f.disk.validated_header().unwrap();
        assert_eq!(left.keyslots().len(), 1);
        assert_ne!(left.keyslots(), [KeySlot::FIRST]);
        drop(f.dir);
    }

    #[test]
    fn crash_after_removing_the_old_keyslot_converges() {
        for backend in BACKENDS {
            crash_after_removing_the_old_keyslot_converges_with(backend);
        }
    }

    fn crash_after_removing_the_old_keyslot_converges_with(backend: Backend) {
        let (f, old, new, pin, slot) = new_keyslot_added(backend);
        f.disk.remove_other_keyslots(&new, slot, &pin).unwrap();

        // Crash before the token is written: only the new key works, the token says "new".
        assert!(!opens(&f.disk, &old));
        assert!(opens(&f.disk, &new));
        assert!(!f.disk.is_initialized().unwrap());

        // The old key no longer works but the new one does: that is success.
        f.disk.replace_passphrase(&old, &new).unwrap();
        assert!(f.disk.is_initialized().unwrap());
        assert!(opens(&f.disk, &new));
    }

    #[test]
    fn an_abandoned_key_from_an_interrupted_attempt_is_removed() {
        for backend in BACKENDS {
            an_abandoned_key_from_an_interrupted_attempt_is_removed_with(backend);
        }
    }

    fn an_abandoned_key_from_an_interrupted_attempt_is_removed_with(backend: Backend) {
        let f = fixture(backend);
        let (old, abandoned, new) = (key("old"), key("abandoned"), key("new"));
        f.disk.format_new(&old).unwrap();
        let pin = pin(&f.disk);
        f.disk.add_verified_keyslot(&old, &abandoned, &pin).unwrap();

        // A later re-key with another key must not leave the abandoned one working.
        f.disk.replace_passphrase(&old, &new).unwrap();
        assert!(opens(&f.disk, &new));
        assert!(!opens(&f.disk, &old));
        assert!(!opens(&f.disk, &abandoned));
        assert_eq!(f.disk.validated_header().unwrap().keyslots().len(), 1);
    }

    /// Removal is authorised by a passphrase that must open a remaining slot: with a key that
    /// opens nothing, no slot is removed.
    #[test]
    fn keyslots_are_only_removed_with_a_key_that_opens_another_slot() {
        for backend in BACKENDS {
            keyslots_are_only_removed_with_a_key_that_opens_another_slot_with(backend);
        }
    }

    fn keyslots_are_only_removed_with_a_key_that_opens_another_slot_with(backend: Backend) {
        let (f, old, new, pin, slot) = new_keyslot_added(backend);

        let result = f.disk.remove_other_keyslots(&key("stranger"), slot, &pin);
        let refused = match backend {
            // The library asks for no passphrase: this crate checks it first.
            Backend::Library => matches!(result, Err(DiskError::WrongPassphrase { .. })),
            // The program refuses by itself.
            Backend::Program => matches!(
                result,
                Err(DiskError::Failed {
                    step: Step::KillSlot,
                    status: Some(2),
                    ..
                })
            ),
        };
        assert!(refused, "{backend:?}: {result:?}");
        assert!(opens(&f.disk, &old));
        assert!(opens(&f.disk, &new));
        assert_eq!(f.disk.validated_header().unwrap().keyslots().len(), 2);
    }

    /// A runner that hands cryptsetup another new passphrase than the caller's, as a
    /// cryptsetup reading its two standard-input keys in the other order would.
    struct SwapsNewKey(SystemRunner);

    impl CommandRunner for SwapsNewKey {
        fn run(
            &self,
            inv: &Invocation,
            timeout: Duration,
        ) -> Result<CommandOutput, crate::command::RunError> {
            if inv.step() != Step::AddKey {
                return self.0.run(inv, timeout);
            }
            let mut stdin = inv.expose_stdin().to_vec();
            if let Some(last) = stdin.last_mut() {
                *last ^= 1;
            }
            let altered = Invocation {
                step: inv.step(),
                program: inv.program().to_path_buf(),
                args: inv.args().to_vec(),
                stdin: zeroize::Zeroizing::new(stdin),
            };
            self.0.run(&altered, timeout)
        }

        fn device_mapper_available(&self) -> bool {
            false
        }
    }

    #[test]
    fn a_new_keyslot_that_does_not_open_with_the_new_key_stops_the_re_key() {
        // The check after the add is shared by both backends; only the program's input can
        // be tampered with from a test.
        let f = fixture(Backend::Program);
        let (old, new) = (key("old"), key("new"));
        f.disk.format_new(&old).unwrap();
        let config = f.disk.config().clone();
        let disk = StateDisk::with_runner(
            f.disk.path(),
            config,
            SwapsNewKey(SystemRunner::new("/nonexistent")),
        )
        .unwrap();

        let result = disk.replace_passphrase(&old, &new);
        assert!(
            matches!(result, Err(DiskError::NewKeyNotVerified { .. })),
            "{result:?}"
        );
        // The old key still opens the disk: nothing was removed.
        assert!(opens(&f.disk, &old));
        assert!(!f.disk.is_initialized().unwrap());
    }
}

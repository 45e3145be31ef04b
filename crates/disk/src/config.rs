//! How the state disk is formatted and unlocked: one value, checked once by
//! [`DiskConfig::validate`] (which [`crate::StateDisk::open`] calls).

use std::path::PathBuf;
use std::time::Duration;

/// The mapper name of the state disk: it is mapped at `/dev/mapper/state`, where the
/// bootstrapper and the node image's init look for it.
pub const DEFAULT_MAPPER_NAME: &str = "state";

/// The bound on every cryptsetup invocation except a format that wipes integrity tags.
///
/// Generous on purpose: one argon2id key check costs about 2 s with the default parameters,
/// and a key check without a slot number tries every keyslot in turn.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// The bound on a format that wipes the whole device to initialise dm-integrity tags
/// (the wipe writes every sector of the disk).
pub const DEFAULT_WIPE_TIMEOUT: Duration = Duration::from_secs(2 * 60 * 60);

/// How keyslot passphrases are stretched: the one definition, cryptsetup's (every variant
/// is argon2id). The validator of the header only requires a well-formed argon2id keyslot.
pub use asterism_cryptsetup::Pbkdf;

/// The options of the cryptsetup program that select `pbkdf`.
pub(crate) fn pbkdf_args(pbkdf: &Pbkdf) -> Vec<String> {
    let mut args = vec!["--pbkdf".to_owned(), "argon2id".to_owned()];
    match *pbkdf {
        Pbkdf::Argon2idBenchmarked {
            time_ms,
            max_memory_kib,
            parallel,
        } => {
            args.extend([
                "--iter-time".to_owned(),
                time_ms.to_string(),
                "--pbkdf-memory".to_owned(),
                max_memory_kib.to_string(),
                "--pbkdf-parallel".to_owned(),
                parallel.to_string(),
            ]);
        }
        Pbkdf::Argon2idForced {
            iterations,
            memory_kib,
            parallel,
        } => {
            args.extend([
                "--pbkdf-force-iterations".to_owned(),
                iterations.to_string(),
                "--pbkdf-memory".to_owned(),
                memory_kib.to_string(),
                "--pbkdf-parallel".to_owned(),
                parallel.to_string(),
            ]);
        }
    }
    args
}

/// Whether the data segment is authenticated with dm-integrity (`hmac(sha256)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Integrity {
    /// Always `hmac-sha256` (docs/disk.md). Formatting fails where the
    /// kernel has no device-mapper, and every header must carry integrity.
    #[default]
    HmacSha256,
    /// `hmac-sha256` where the kernel has device-mapper; otherwise format without integrity
    /// and log a warning on every such format. Headers with or without integrity pass.
    /// Meant for local mode.
    HmacSha256IfAvailable,
    /// No integrity: confidentiality only. Headers with or without integrity pass.
    None,
}

/// How [`crate::StateDisk`] reaches cryptsetup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// libcryptsetup in process (through `asterism-cryptsetup`): one header load serves a
    /// whole step, and the key checks run against that loaded, validated header. A re-key
    /// takes tens of milliseconds instead of about a second. Two operations still run the
    /// program: a format with dm-integrity and the device-mapper mapping, both of which need
    /// device-mapper. Library calls have no timeout.
    #[default]
    Library,
    /// The `cryptsetup` program for everything, each run bounded by a timeout, with key
    /// checks and the mapping against a detached header copy in a private scratch directory.
    Program,
}

/// How large a fresh header's keyslots area is (the data segment starts right after it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyslotsArea {
    /// Room for exactly [`crate::MAX_KEYSLOTS`] keyslots (the most a valid header may have),
    /// with the data segment at the next MiB: 2 MiB without integrity, 4 MiB with it. A
    /// format writes random bytes over the whole keyslots area, so this makes it several
    /// times faster than [`KeyslotsArea::Standard`].
    #[default]
    Compact,
    /// cryptsetup's default: 16 MiB less the two 16 KiB metadata copies.
    Standard,
}

impl KeyslotsArea {
    /// The keyslots area in bytes for a volume key of `volume_key_bytes`, `None` for
    /// cryptsetup's default.
    #[must_use]
    pub fn bytes(self, volume_key_bytes: u64) -> Option<u64> {
        const METADATA: u64 = 2 * 16 * 1024;
        const MIB: u64 = 1024 * 1024;
        match self {
            Self::Standard => None,
            Self::Compact => {
                // Each keyslot holds the key split into 4000 anti-forensic stripes, in whole
                // 4 KiB blocks.
                let slot = (4000 * volume_key_bytes).div_ceil(4096) * 4096;
                let all = crate::MAX_KEYSLOTS as u64 * slot;
                Some((METADATA + all).div_ceil(MIB) * MIB - METADATA)
            }
        }
    }
}

/// What [`crate::StateDisk::unlock`] does when the kernel has no device-mapper.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MissingDeviceMapper {
    /// Fail: the disk cannot be used without a mapping.
    #[default]
    Fail,
    /// Check the passphrase against the (validated) header instead of mapping the disk,
    /// report [`crate::Unlocked::KeyChecked`] and log a warning. Meant for local mode on
    /// machines whose kernel lacks device-mapper.
    KeyCheckOnly,
}

/// Everything [`crate::StateDisk`] needs to know. Build it once, for instance from
/// command-line flags, starting from [`DiskConfig::default`] (production) or
/// [`DiskConfig::local`] (a local cluster on a development machine).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskConfig {
    /// Library or program.
    pub backend: Backend,
    /// The cryptsetup program: a path, or a bare name looked up in `PATH`.
    pub cryptsetup: PathBuf,
    /// The device-mapper name used by [`crate::StateDisk::unlock`].
    pub mapper_name: String,
    /// Keyslot PBKDF for the first keyslot and every new one.
    pub pbkdf: Pbkdf,
    /// The keyslots area of a fresh format.
    pub keyslots_area: KeyslotsArea,
    /// dm-integrity on the data segment.
    pub integrity: Integrity,
    /// Whether a format with integrity wipes the device to initialise the integrity tags
    /// (otherwise every sector reads as an I/O error until it is first written).
    pub integrity_wipe: bool,
    /// What unlocking does without device-mapper.
    pub missing_device_mapper: MissingDeviceMapper,
    /// The device-mapper control node whose presence means the kernel has device-mapper.
    pub device_mapper_control: PathBuf,
    /// Where detached header copies are made, each in a fresh private (0700) directory that
    /// is removed afterwards. A header copy is as large as the header and keyslot areas
    /// (16 MiB with cryptsetup's defaults); it holds no secret in the clear.
    pub scratch_dir: PathBuf,
    /// The bound on each run of the cryptsetup program.
    pub command_timeout: Duration,
    /// The bound on a format that wipes the device for integrity.
    pub wipe_timeout: Duration,
}

impl Default for DiskConfig {
    /// Production: the format parameters of docs/disk.md, integrity required, device-mapper
    /// required.
    fn default() -> Self {
        Self {
            backend: Backend::Library,
            cryptsetup: PathBuf::from("cryptsetup"),
            mapper_name: DEFAULT_MAPPER_NAME.to_owned(),
            pbkdf: Pbkdf::SPEC,
            keyslots_area: KeyslotsArea::Compact,
            integrity: Integrity::HmacSha256,
            integrity_wipe: true,
            missing_device_mapper: MissingDeviceMapper::Fail,
            device_mapper_control: PathBuf::from("/dev/mapper/control"),
            scratch_dir: PathBuf::from("/run"),
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            wipe_timeout: DEFAULT_WIPE_TIMEOUT,
        }
    }
}

impl DiskConfig {
    /// Local mode: like [`DiskConfig::default`], but integrity and the mapping fall back
    /// (with a warning in the log) where the kernel has no device-mapper.
    #[must_use]
    pub fn local() -> Self {
        Self {
            integrity: Integrity::HmacSha256IfAvailable,
            missing_device_mapper: MissingDeviceMapper::KeyCheckOnly,
            ..Self::default()
        }
    }

    /// Checks the values that cryptsetup or the kernel would reject later, or that would
    /// make a mapper path ambiguous.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.pbkdf
            .validate()
            .map_err(|e| ConfigError::Pbkdf(e.reason))?;
        let name_ok = !self.mapper_name.is_empty()
            && self.mapper_name.len() <= 127
            && self
                .mapper_name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            && !self.mapper_name.starts_with('.');
        if !name_ok {
            return Err(ConfigError::MapperName);
        }
        if self.cryptsetup.as_os_str().is_empty() {
            return Err(ConfigError::Program);
        }
        if self.command_timeout.is_zero() || self.wipe_timeout.is_zero() {
            return Err(ConfigError::Timeout);
        }
        Ok(())
    }
}

/// Why a [`DiskConfig`] was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The PBKDF parameters are outside what cryptsetup accepts.
    #[error("invalid PBKDF parameters: {0}")]
    Pbkdf(&'static str),
    /// The mapper name is empty, too long, or has characters other than `[A-Za-z0-9._-]`.
    #[error("the mapper name must be 1 to 127 characters of [A-Za-z0-9._-], not starting with '.'")]
    MapperName,
    /// The cryptsetup program path is empty.
    #[error("the cryptsetup program path is empty")]
    Program,
    /// A timeout is zero.
    #[error("timeouts must be longer than zero")]
    Timeout,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_reference_and_validate() {
        let config = DiskConfig::default();
        assert_eq!(config.validate(), Ok(()));
        assert_eq!(config.mapper_name, "state");
        assert_eq!(config.integrity, Integrity::HmacSha256);
        assert_eq!(config.missing_device_mapper, MissingDeviceMapper::Fail);
        assert_eq!(
            pbkdf_args(&Pbkdf::default()),
            [
                "--pbkdf",
                "argon2id",
                "--iter-time",
                "2000",
                "--pbkdf-memory",
                "65536",
                "--pbkdf-parallel",
                "4"
            ]
        );
        assert_eq!(DiskConfig::local().validate(), Ok(()));
    }

    #[test]
    fn a_compact_keyslots_area_holds_every_allowed_keyslot_and_ends_on_a_mib() {
        // Without integrity: 8 slots of 258,048 bytes fill 2 MiB exactly.
        assert_eq!(
            KeyslotsArea::Compact.bytes(64),
            Some(2 * 1024 * 1024 - 32 * 1024)
        );
        // With integrity (96-byte keys): 8 slots of 385,024 bytes, data at 4 MiB.
        let area = KeyslotsArea::Compact.bytes(96).unwrap();
        assert!(area >= 8 * 385_024);
        assert_eq!((area + 32 * 1024) % (1024 * 1024), 0);
        assert_eq!(KeyslotsArea::Standard.bytes(64), None);
    }

    #[test]
    fn rejects_mapper_names_that_could_escape_dev_mapper() {
        for name in ["", "../state", "a/b", ".hidden", "state name"] {
            let config = DiskConfig {
                mapper_name: name.to_owned(),
                ..DiskConfig::default()
            };
            assert_eq!(config.validate(), Err(ConfigError::MapperName), "{name:?}");
        }
    }

    #[test]
    fn rejects_pbkdf_costs_cryptsetup_would_refuse() {
        let bad = [
            Pbkdf::Argon2idForced {
                iterations: 0,
                memory_kib: 32,
                parallel: 1,
            },
            Pbkdf::Argon2idForced {
                iterations: 4,
                memory_kib: 16,
                parallel: 1,
            },
            Pbkdf::Argon2idBenchmarked {
                time_ms: 2000,
                max_memory_kib: 65536,
                parallel: 0,
            },
        ];
        for pbkdf in bad {
            let config = DiskConfig {
                pbkdf,
                ..DiskConfig::default()
            };
            assert!(config.validate().is_err(), "{pbkdf:?}");
        }
    }
}

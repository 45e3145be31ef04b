//! The LUKS2 state disk of an Asterism node, on a block device or an image
//! file, driven through libcryptsetup in process or through the `cryptsetup` program
//! ([`Backend`]).
//!
//! * [`StateDisk`] formats a new disk ([`StateDisk::format_new`] with a
//!   [`generate_initial_passphrase`]), tells a new disk from an initialized one
//!   ([`StateDisk::is_initialized`]), reports its [`StateDisk::uuid`], re-keys it safely
//!   ([`StateDisk::replace_passphrase`]: add, verify, then remove — never without a working
//!   key), marks it for reset, checks keys and unlocks it ([`StateDisk::unlock`]: a
//!   device-mapper mapping, or, where the kernel has none and the configuration allows it, a
//!   key check that says so).
//! * [`validate_header`] holds the header rules as a pure function over the LUKS2 JSON
//!   metadata; no operation uses a header that fails them.
//! * [`Backend::Library`] (the default) calls libcryptsetup through `asterism-cryptsetup`;
//!   [`Backend::Program`] runs the program. [`CryptsetupCli`] builds every command line as a
//!   value; [`CommandRunner`] is the edge that runs them ([`SystemRunner`] for real, with a
//!   timeout on every run).
//! * [`StateFileSystem`] makes the file system on a mapped disk (first boot) and mounts it
//!   (every boot), with `mke2fs` and `mount` run the same way.
//!
//! This is the only crate that runs cryptsetup. It must never put a passphrase on a command
//! line, in a file, in a log or in an error: passphrases reach the program on standard input
//! only and the library as borrowed bytes, and live in [`asterism_kms::DataKey`] values (no `Clone`, redacted `Debug`, wiped on
//! drop). It reads no environment. It is blocking: async callers run it on a blocking thread.
#![forbid(unsafe_code)]

mod command;
mod config;
mod disk;
mod error;
mod filesystem;
mod header;

pub use command::{
    CHILD_PATH, CommandOutput, CommandRunner, CryptsetupCli, FormatParams, Invocation,
    MAX_CAPTURED_OUTPUT, MAX_STDERR_CHARS, RunError, Step, SystemRunner, sanitize_stderr,
};
pub use config::{
    Backend, ConfigError, DEFAULT_COMMAND_TIMEOUT, DEFAULT_MAPPER_NAME, DEFAULT_WIPE_TIMEOUT,
    DiskConfig, Integrity, MissingDeviceMapper, Pbkdf,
};
pub use disk::{
    Formatted, INITIAL_PASSPHRASE_LEN, StateDisk, Unlocked, generate_initial_passphrase,
};
pub use error::DiskError;
pub use filesystem::{
    DEFAULT_FILE_SYSTEM_TIMEOUT, FILE_SYSTEM_LABEL, FILE_SYSTEM_TYPE, FileSystemCli,
    FileSystemConfig, FileSystemError, MOUNT_OPTIONS, StateFileSystem,
};
pub use header::{
    HeaderError, IntegrityRule, KeySlot, LUKS2_KEYSLOTS, MAX_KEYSLOTS, TOKEN_TYPE, TokenState,
    ValidatedHeader, VolumeKeyDigest, read_token_state, token_json, validate_header,
};

pub use asterism_kms::{DataKey, DiskUuid};

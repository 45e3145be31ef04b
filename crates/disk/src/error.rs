//! The error type of state-disk operations.

use std::io;
use std::path::PathBuf;

use crate::command::{RunError, Step};
use crate::config::ConfigError;
use crate::header::{HeaderError, KeySlot};

/// Why a state-disk operation failed. Every variant names the device; none carries a
/// passphrase, and cryptsetup's standard error is sanitized and bounded
/// ([`crate::sanitize_stderr`]) before it is stored here.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// The configuration is invalid.
    #[error("invalid state-disk configuration")]
    Config(#[from] ConfigError),
    /// The device path does not resolve to anything.
    #[error("{}: cannot resolve the device path", .path.display())]
    Device {
        /// The device path as given.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A private scratch directory for a header copy could not be made.
    #[error("{}: cannot create a scratch directory for a header copy", .dir.display())]
    Scratch {
        /// The configured scratch directory.
        dir: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// cryptsetup could not be run, or did not finish in time.
    #[error("{}: cryptsetup {step}", .path.display())]
    Run {
        /// The device.
        path: PathBuf,
        /// The step.
        step: Step,
        /// The cause (includes the timeout).
        #[source]
        source: RunError,
    },
    /// cryptsetup failed.
    #[error("{}: cryptsetup {step} failed ({}): {stderr}", .path.display(), exit_text(*.status))]
    Failed {
        /// The device.
        path: PathBuf,
        /// The step.
        step: Step,
        /// cryptsetup's exit status (`None`: ended by a signal).
        status: Option<i32>,
        /// cryptsetup's standard error, sanitized and bounded.
        stderr: String,
    },
    /// A libcryptsetup call failed ([`crate::Backend::Library`]).
    #[error("{}: {step}", .path.display())]
    Library {
        /// The device.
        path: PathBuf,
        /// The step.
        step: Step,
        /// The library's error (errno and its last message, which never holds key material).
        #[source]
        source: asterism_cryptsetup::Error,
    },
    /// The device could not be read (to tell a damaged LUKS2 header from no header).
    #[error("{}: cannot read the device", .path.display())]
    Read {
        /// The device.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The device starts with a LUKS2 header that libcryptsetup cannot load (damaged both
    /// copies, or an unsupported layout). Never treated as a new disk.
    #[error("{}: the LUKS2 header cannot be loaded; refusing to treat the disk as new", .path.display())]
    DamagedHeader {
        /// The device.
        path: PathBuf,
        /// The library's error.
        #[source]
        source: asterism_cryptsetup::Error,
    },
    /// cryptsetup succeeded but printed something this crate does not understand, or left
    /// the header in a state other than the one the step should produce.
    #[error("{}: cryptsetup {step}: unexpected result: {detail}", .path.display())]
    Unexpected {
        /// The device.
        path: PathBuf,
        /// The step.
        step: Step,
        /// What was unexpected.
        detail: String,
    },
    /// The device has no LUKS2 header.
    #[error("{}: not a LUKS2 device", .path.display())]
    NotLuks2 {
        /// The device.
        path: PathBuf,
    },
    /// The LUKS2 header breaks a rule: this crate refuses to use it.
    #[error("{}: refusing a LUKS2 header that fails validation", .path.display())]
    InvalidHeader {
        /// The device.
        path: PathBuf,
        /// The broken rule.
        #[source]
        source: HeaderError,
    },
    /// The passphrase opens no keyslot.
    #[error("{}: the passphrase opens no keyslot", .path.display())]
    WrongPassphrase {
        /// The device.
        path: PathBuf,
    },
    /// `format_new` was asked to format a disk whose token says it is initialized.
    #[error("{}: the disk is initialized; mark it for reset before formatting it", .path.display())]
    AlreadyInitialized {
        /// The device.
        path: PathBuf,
    },
    /// The header's volume key changed in the middle of an operation: someone else wrote a
    /// different header to the device.
    #[error("{}: the volume key changed during {step}; the header was replaced underneath", .path.display())]
    VolumeKeyChanged {
        /// The device.
        path: PathBuf,
        /// The step after which the change was seen.
        step: Step,
    },
    /// A freshly added passphrase did not open its keyslot.
    #[error("{}: the new passphrase does not open keyslot {slot} after it was added", .path.display())]
    NewKeyNotVerified {
        /// The device.
        path: PathBuf,
        /// The keyslot that was added.
        slot: KeySlot,
    },
    /// All keyslots are taken (a valid header has at most eight, so this means a bug).
    #[error("{}: no free keyslot", .path.display())]
    NoFreeKeyslot {
        /// The device.
        path: PathBuf,
    },
    /// Integrity was required but the kernel has no device-mapper to format it.
    #[error("{}: dm-integrity was required, but the kernel has no device-mapper", .path.display())]
    IntegrityUnavailable {
        /// The device.
        path: PathBuf,
    },
    /// The disk could not be mapped for lack of device-mapper, and the configuration does not
    /// allow a key check instead.
    #[error("{}: cannot map the disk without device-mapper ({detail})", .path.display())]
    DeviceMapperUnavailable {
        /// The device.
        path: PathBuf,
        /// How the absence showed.
        detail: String,
    },
    /// The operating system's random number generator failed.
    #[error("the system random number generator failed")]
    Random,
}

/// An exit status for a message.
pub(crate) fn exit_text(status: Option<i32>) -> String {
    match status {
        Some(code) => format!("exit status {code}"),
        None => "ended by a signal".to_owned(),
    }
}

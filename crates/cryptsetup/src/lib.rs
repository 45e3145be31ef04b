//! Safe, minimal bindings to libcryptsetup: the LUKS2 operations an Asterism state disk
//! needs, in process.
//!
//! The `cryptsetup` program costs a process start, a header read and a metadata lock per
//! operation (30–60 ms each on a small machine); a re-key takes several. Through the library
//! one header load serves a whole sequence, and a key check costs only its PBKDF run.
//!
//! * [`Device`] is one `struct crypt_device`: [`Device::init`] on a block device or an image
//!   file, then [`Device::load_luks2`] or [`Device::format_luks2`], then keyslot, token and
//!   metadata operations. The header stays in memory between calls; the library writes it
//!   back (both copies, checksummed) after each change.
//! * Passphrases go in as byte slices and are handed straight to the library, which copies
//!   them into its own locked memory and wipes them; this crate keeps no copy.
//! * The library's messages go to `tracing` (debug level), and the last error message of a
//!   call is kept in its [`Error`]. libcryptsetup never puts key material in a message.
//! * libcryptsetup is not thread-safe, so every call into it holds one process-wide lock.
//! * Token plugins (`libcryptsetup-token-*.so`, chosen by a header's token type) are
//!   disabled for the whole process before the first call: an untrusted disk must not be
//!   able to make this process load code.
//!
//! With `asterism-children`, this is one of two Asterism crates with `unsafe` code, all of it
//! here in calls into the library, each with its reason. Nothing here uses device-mapper:
//! mapping a disk is left to the `cryptsetup` program.

// The reason this crate exists: every `unsafe` block below is a call into the C library,
// documented with why it is sound (`clippy::undocumented_unsafe_blocks` is denied).
#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr::{self, NonNull};
use std::sync::{Mutex, MutexGuard, Once};

use tracing::{debug, trace};

/// The raw C interface, as declared by `libcryptsetup.h` (2.4 and later).
#[allow(non_camel_case_types, missing_docs)]
mod ffi {
    use std::ffi::{c_char, c_int, c_void};

    /// `struct crypt_device`, opaque.
    #[repr(C)]
    pub struct crypt_device {
        _private: [u8; 0],
    }

    /// `struct crypt_pbkdf_type`.
    #[repr(C)]
    pub struct crypt_pbkdf_type {
        pub type_: *const c_char,
        pub hash: *const c_char,
        pub time_ms: u32,
        pub iterations: u32,
        pub max_memory_kb: u32,
        pub parallel_threads: u32,
        pub flags: u32,
    }

    /// `struct crypt_params_luks2`.
    #[repr(C)]
    pub struct crypt_params_luks2 {
        pub pbkdf: *const crypt_pbkdf_type,
        pub integrity: *const c_char,
        pub integrity_params: *const c_void,
        pub data_alignment: usize,
        pub data_device: *const c_char,
        pub sector_size: u32,
        pub label: *const c_char,
        pub subsystem: *const c_char,
    }

    pub type log_fn = unsafe extern "C" fn(level: c_int, msg: *const c_char, usrptr: *mut c_void);

    pub const CRYPT_ANY_SLOT: c_int = -1;
    pub const CRYPT_LOG_ERROR: c_int = 1;
    pub const CRYPT_PBKDF_NO_BENCHMARK: u32 = 1 << 1;

    unsafe extern "C" {
        pub fn crypt_init(cd: *mut *mut crypt_device, device: *const c_char) -> c_int;
        pub fn crypt_free(cd: *mut crypt_device);
        pub fn crypt_load(
            cd: *mut crypt_device,
            requested_type: *const c_char,
            params: *mut c_void,
        ) -> c_int;
        pub fn crypt_format(
            cd: *mut crypt_device,
            type_: *const c_char,
            cipher: *const c_char,
            cipher_mode: *const c_char,
            uuid: *const c_char,
            volume_key: *const c_char,
            volume_key_size: usize,
            params: *mut c_void,
        ) -> c_int;
        pub fn crypt_set_metadata_size(
            cd: *mut crypt_device,
            metadata_size: u64,
            keyslots_size: u64,
        ) -> c_int;
        pub fn crypt_set_pbkdf_type(cd: *mut crypt_device, pbkdf: *const crypt_pbkdf_type)
        -> c_int;
        pub fn crypt_keyslot_add_by_volume_key(
            cd: *mut crypt_device,
            keyslot: c_int,
            volume_key: *const c_char,
            volume_key_size: usize,
            passphrase: *const c_char,
            passphrase_size: usize,
        ) -> c_int;
        pub fn crypt_keyslot_add_by_passphrase(
            cd: *mut crypt_device,
            keyslot: c_int,
            passphrase: *const c_char,
            passphrase_size: usize,
            new_passphrase: *const c_char,
            new_passphrase_size: usize,
        ) -> c_int;
        pub fn crypt_activate_by_passphrase(
            cd: *mut crypt_device,
            name: *const c_char,
            keyslot: c_int,
            passphrase: *const c_char,
            passphrase_size: usize,
            flags: u32,
        ) -> c_int;
        pub fn crypt_keyslot_destroy(cd: *mut crypt_device, keyslot: c_int) -> c_int;
        pub fn crypt_token_json_set(
            cd: *mut crypt_device,
            token: c_int,
            json: *const c_char,
        ) -> c_int;
        pub fn crypt_dump_json(
            cd: *mut crypt_device,
            json: *mut *const c_char,
            flags: u32,
        ) -> c_int;
        pub fn crypt_get_uuid(cd: *mut crypt_device) -> *const c_char;
        pub fn crypt_set_log_callback(
            cd: *mut crypt_device,
            log: Option<log_fn>,
            usrptr: *mut c_void,
        );
        pub fn crypt_token_external_disable();
    }
}

/// `-EPERM`: the passphrase opens no keyslot (the library's answer to a wrong key).
const EPERM: c_int = 1;
/// The longest library message kept in an [`Error`].
const MAX_MESSAGE_CHARS: usize = 300;

/// Serialises every call into the library (it keeps process-wide state without locks).
static LIBRARY: Mutex<()> = Mutex::new(());
static SETUP: Once = Once::new();

std::thread_local! {
    /// The last error message the library logged on this thread, during the current call.
    static LAST_ERROR: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// A failed library call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("libcryptsetup {operation} failed ({}){}", errno_text(.errno), message_text(.message))]
pub struct Error {
    /// The library function, without its `crypt_` prefix.
    pub operation: &'static str,
    /// The (positive) errno the library returned, negated.
    pub errno: i32,
    /// The last error message the library logged during the call, on one line and bounded.
    pub message: Option<String>,
}

impl Error {
    /// Whether the library said "no key available with this passphrase" (`EPERM`).
    #[must_use]
    pub fn is_wrong_passphrase(&self) -> bool {
        self.errno == EPERM
    }
}

fn errno_text(errno: &i32) -> String {
    let text = std::io::Error::from_raw_os_error(*errno).to_string();
    format!("errno {errno}: {text}")
}

fn message_text(message: &Option<String>) -> String {
    message
        .as_deref()
        .map(|m| format!(": {m}"))
        .unwrap_or_default()
}

/// How a keyslot's passphrase is stretched: argon2id with fixed or benchmarked costs, the
/// one definition for the library and the cryptsetup program alike.
///
/// The passphrases Asterism handles are 32 uniformly random bytes (a generated initial
/// passphrase or an HKDF-derived disk key), so the PBKDF is not what stops a guessing attack;
/// it only sets the cost of every unlock. Cheap forced parameters are therefore acceptable in
/// tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pbkdf {
    /// cryptsetup benchmarks the machine and picks the iteration count that takes
    /// `time_ms`, within the given memory and thread limits.
    Argon2idBenchmarked {
        /// Target unlock time in milliseconds (the program's `--iter-time`).
        time_ms: u32,
        /// Maximum memory in KiB (`--pbkdf-memory`).
        max_memory_kib: u32,
        /// Parallel threads (`--pbkdf-parallel`; cryptsetup caps it at the online CPUs).
        parallel: u32,
    },
    /// Fixed costs, no benchmark (`--pbkdf-force-iterations`).
    Argon2idForced {
        /// Iterations (argon2 time cost).
        iterations: u32,
        /// Memory in KiB.
        memory_kib: u32,
        /// Parallel threads.
        parallel: u32,
    },
}

/// PBKDF costs cryptsetup would refuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("invalid PBKDF parameters: {reason}")]
pub struct InvalidPbkdf {
    /// Which limit is broken.
    pub reason: &'static str,
}

impl Pbkdf {
    /// The production parameters: argon2id, target 2000 ms, at most 64 MiB, 4 threads
    /// (docs/disk.md): a guessed passphrase costs seconds, and a node's boot pays it once.
    pub const SPEC: Self = Self::Argon2idBenchmarked {
        time_ms: 2000,
        max_memory_kib: 65536,
        parallel: 4,
    };

    /// The cheapest parameters cryptsetup accepts (4 iterations, 32 KiB, 1 thread), for tests.
    pub const FAST_FOR_TESTS: Self = Self::Argon2idForced {
        iterations: 4,
        memory_kib: 32,
        parallel: 1,
    };

    /// Checks the costs against cryptsetup's own limits: argon2 needs a time cost of at
    /// least 1, at least 32 KiB and at most 4 GiB of memory, and 1 to 4 threads.
    pub fn validate(&self) -> Result<(), InvalidPbkdf> {
        let (time, memory, parallel) = match *self {
            Self::Argon2idBenchmarked {
                time_ms,
                max_memory_kib,
                parallel,
            } => (time_ms, max_memory_kib, parallel),
            Self::Argon2idForced {
                iterations,
                memory_kib,
                parallel,
            } => (iterations, memory_kib, parallel),
        };
        let refuse = |reason| Err(InvalidPbkdf { reason });
        if time == 0 {
            return refuse("the time cost must be at least 1");
        }
        if !(32..=4 * 1024 * 1024).contains(&memory) {
            return refuse("the memory cost must be between 32 KiB and 4 GiB");
        }
        if !(1..=4).contains(&parallel) {
            return refuse("the parallel cost must be between 1 and 4");
        }
        Ok(())
    }
}

impl Default for Pbkdf {
    fn default() -> Self {
        Self::SPEC
    }
}

impl Pbkdf {
    fn raw(&self) -> ffi::crypt_pbkdf_type {
        let (time_ms, iterations, max_memory_kb, parallel_threads, flags) = match *self {
            Self::Argon2idBenchmarked {
                time_ms,
                max_memory_kib,
                parallel,
            } => (time_ms, 0, max_memory_kib, parallel, 0),
            Self::Argon2idForced {
                iterations,
                memory_kib,
                parallel,
            } => (
                0,
                iterations,
                memory_kib,
                parallel,
                ffi::CRYPT_PBKDF_NO_BENCHMARK,
            ),
        };
        ffi::crypt_pbkdf_type {
            type_: c"argon2id".as_ptr(),
            hash: c"sha256".as_ptr(),
            time_ms,
            iterations,
            max_memory_kb,
            parallel_threads,
            flags,
        }
    }
}

/// What [`Device::format_luks2`] writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatParams {
    /// The cipher, e.g. `aes`.
    pub cipher: String,
    /// The cipher mode, e.g. `xts-plain64`.
    pub cipher_mode: String,
    /// The volume key size in bytes (64 for aes-xts with 256-bit keys each).
    pub volume_key_bytes: usize,
    /// The encryption sector size in bytes.
    pub sector_size: u32,
    /// The PBKDF of the keyslots added afterwards.
    pub pbkdf: Pbkdf,
    /// The size of the keyslots area in bytes (a multiple of 4096), or `None` for the
    /// library's default (16 MiB less the two metadata copies). The data segment starts
    /// right after it.
    pub keyslots_area_bytes: Option<u64>,
}

/// One LUKS device (`struct crypt_device`): a block device or an image file.
///
/// Neither `Send` nor `Sync`: the library's handle is used only from the thread that made it,
/// one call at a time.
pub struct Device {
    raw: NonNull<ffi::crypt_device>,
}

impl Device {
    /// Opens `path` (nothing is read yet).
    pub fn init(path: &Path) -> Result<Self, Error> {
        let path = CString::new(path.as_os_str().as_bytes()).map_err(|_| Error {
            operation: "init",
            errno: libc_einval(),
            message: Some("the path contains a NUL byte".to_owned()),
        })?;
        let _guard = enter();
        let mut raw: *mut ffi::crypt_device = ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer and `path` a NUL-terminated string that
        // outlives the call; the library copies the path.
        let rc = unsafe { ffi::crypt_init(&raw mut raw, path.as_ptr()) };
        check("init", rc)?;
        NonNull::new(raw).map(|raw| Self { raw }).ok_or(Error {
            operation: "init",
            errno: libc_einval(),
            message: Some("the library returned no device".to_owned()),
        })
    }

    /// Loads the LUKS2 header from the device (fails with `EINVAL` when there is none, or it
    /// is another version).
    pub fn load_luks2(&self) -> Result<(), Error> {
        let _guard = enter();
        // SAFETY: `self.raw` is a live handle; the type is a static C string; no params.
        let rc = unsafe { ffi::crypt_load(self.raw.as_ptr(), c"LUKS2".as_ptr(), ptr::null_mut()) };
        check("load", rc).map(drop)
    }

    /// Writes a new LUKS2 header with a fresh random volume key (the library draws it) and
    /// no keyslot. The volume key stays in this handle for
    /// [`Device::add_keyslot_by_volume_key`]. The old header is destroyed.
    pub fn format_luks2(&self, params: &FormatParams) -> Result<(), Error> {
        let cipher = c_string("format", &params.cipher)?;
        let mode = c_string("format", &params.cipher_mode)?;
        let pbkdf = params.pbkdf.raw();
        let mut luks2 = ffi::crypt_params_luks2 {
            pbkdf: &raw const pbkdf,
            integrity: ptr::null(),
            integrity_params: ptr::null(),
            data_alignment: 0,
            data_device: ptr::null(),
            sector_size: params.sector_size,
            label: ptr::null(),
            subsystem: ptr::null(),
        };
        let _guard = enter();
        if let Some(keyslots) = params.keyslots_area_bytes {
            // SAFETY: `self.raw` is a live handle; 0 keeps the default metadata size.
            let rc = unsafe { ffi::crypt_set_metadata_size(self.raw.as_ptr(), 0, keyslots) };
            check("set_metadata_size", rc)?;
        }
        // SAFETY: every pointer is valid for the call (locals that outlive it); a null
        // volume key makes the library generate one of `volume_key_bytes` bytes.
        let rc = unsafe {
            ffi::crypt_format(
                self.raw.as_ptr(),
                c"LUKS2".as_ptr(),
                cipher.as_ptr(),
                mode.as_ptr(),
                ptr::null(),
                ptr::null(),
                params.volume_key_bytes,
                (&raw mut luks2).cast::<c_void>(),
            )
        };
        check("format", rc).map(drop)
    }

    /// Sets the PBKDF for keyslots added from now on.
    pub fn set_pbkdf(&self, pbkdf: &Pbkdf) -> Result<(), Error> {
        let raw = pbkdf.raw();
        let _guard = enter();
        // SAFETY: `raw` and its static strings outlive the call; the library copies them.
        let rc = unsafe { ffi::crypt_set_pbkdf_type(self.raw.as_ptr(), &raw const raw) };
        check("set_pbkdf_type", rc).map(drop)
    }

    /// Adds `passphrase` in `slot`, protecting the volume key this handle holds after
    /// [`Device::format_luks2`]. Returns the slot.
    pub fn add_keyslot_by_volume_key(&self, slot: u8, passphrase: &[u8]) -> Result<u8, Error> {
        let _guard = enter();
        // SAFETY: a null volume key means "the one held by the handle"; the passphrase
        // pointer and length describe a live slice the library only reads.
        let rc = unsafe {
            ffi::crypt_keyslot_add_by_volume_key(
                self.raw.as_ptr(),
                c_int::from(slot),
                ptr::null(),
                0,
                passphrase.as_ptr().cast::<c_char>(),
                passphrase.len(),
            )
        };
        check_slot("keyslot_add_by_volume_key", rc)
    }

    /// Adds `new` in `slot`, authorised by `existing` (which must open a keyslot). Returns
    /// the slot.
    pub fn add_keyslot(&self, slot: u8, existing: &[u8], new: &[u8]) -> Result<u8, Error> {
        let _guard = enter();
        // SAFETY: both pointer/length pairs describe live slices the library only reads.
        let rc = unsafe {
            ffi::crypt_keyslot_add_by_passphrase(
                self.raw.as_ptr(),
                c_int::from(slot),
                existing.as_ptr().cast::<c_char>(),
                existing.len(),
                new.as_ptr().cast::<c_char>(),
                new.len(),
            )
        };
        check_slot("keyslot_add_by_passphrase", rc)
    }

    /// Which keyslot `passphrase` opens (only `slot` if given), without mapping anything:
    /// the keyslot is decrypted and the volume key checked against the header's digest.
    /// `Ok(None)` when it opens none.
    pub fn test_passphrase(
        &self,
        slot: Option<u8>,
        passphrase: &[u8],
    ) -> Result<Option<u8>, Error> {
        let slot = slot.map_or(ffi::CRYPT_ANY_SLOT, c_int::from);
        let _guard = enter();
        // SAFETY: a null name means "check only, map nothing"; the passphrase slice is live
        // and only read.
        let rc = unsafe {
            ffi::crypt_activate_by_passphrase(
                self.raw.as_ptr(),
                ptr::null(),
                slot,
                passphrase.as_ptr().cast::<c_char>(),
                passphrase.len(),
                0,
            )
        };
        match check_slot("activate_by_passphrase", rc) {
            Ok(slot) => Ok(Some(slot)),
            Err(error) if error.is_wrong_passphrase() => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Destroys `slot`: its key material is overwritten and it leaves the header. Asks for
    /// no passphrase, so callers check first that another slot still opens.
    pub fn destroy_keyslot(&self, slot: u8) -> Result<(), Error> {
        let _guard = enter();
        // SAFETY: `self.raw` is a live handle.
        let rc = unsafe { ffi::crypt_keyslot_destroy(self.raw.as_ptr(), c_int::from(slot)) };
        check("keyslot_destroy", rc).map(drop)
    }

    /// Writes `json` as token `token`, replacing what was there.
    pub fn set_token_json(&self, token: u8, json: &str) -> Result<(), Error> {
        let json = c_string("token_json_set", json)?;
        let _guard = enter();
        // SAFETY: `json` is a live C string; the library parses and copies it.
        let rc = unsafe {
            ffi::crypt_token_json_set(self.raw.as_ptr(), c_int::from(token), json.as_ptr())
        };
        check("token_json_set", rc).map(drop)
    }

    /// The LUKS2 JSON metadata of the header this handle holds.
    pub fn metadata_json(&self) -> Result<String, Error> {
        let _guard = enter();
        let mut json: *const c_char = ptr::null();
        // SAFETY: `json` is a valid out-pointer; on success it points at a string owned by
        // the handle, valid until the next call on it. No such call can come before the copy
        // below: the handle is neither `Send` nor `Sync`, and we hold the library lock.
        let rc = unsafe { ffi::crypt_dump_json(self.raw.as_ptr(), &raw mut json, 0) };
        check("dump_json", rc)?;
        if json.is_null() {
            return Err(Error {
                operation: "dump_json",
                errno: libc_einval(),
                message: Some("the library returned no metadata".to_owned()),
            });
        }
        // SAFETY: non-null and NUL-terminated, as the library documents; copied at once.
        let text = unsafe { CStr::from_ptr(json) };
        text.to_str().map(str::to_owned).map_err(|_| Error {
            operation: "dump_json",
            errno: libc_einval(),
            message: Some("the metadata is not UTF-8".to_owned()),
        })
    }

    /// The header's UUID, if a header is loaded or formatted.
    #[must_use]
    pub fn uuid(&self) -> Option<String> {
        let _guard = enter();
        // SAFETY: `self.raw` is a live handle; the result is null or a string owned by it.
        let uuid = unsafe { ffi::crypt_get_uuid(self.raw.as_ptr()) };
        if uuid.is_null() {
            return None;
        }
        // SAFETY: non-null, NUL-terminated, owned by the handle; copied at once.
        let text = unsafe { CStr::from_ptr(uuid) };
        text.to_str().ok().map(str::to_owned)
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        let _guard = enter();
        // SAFETY: the handle came from `crypt_init` and is freed exactly once; the library
        // wipes the volume key it may hold.
        unsafe { ffi::crypt_free(self.raw.as_ptr()) };
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device").finish_non_exhaustive()
    }
}

/// Takes the library lock (after the one-time setup) and clears this thread's last error.
fn enter() -> MutexGuard<'static, ()> {
    SETUP.call_once(|| {
        // SAFETY: both calls only set process-wide library settings; `log_message` has the
        // signature the library expects and never unwinds.
        unsafe {
            ffi::crypt_token_external_disable();
            ffi::crypt_set_log_callback(ptr::null_mut(), Some(log_message), ptr::null_mut());
        }
    });
    let guard = LIBRARY
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    LAST_ERROR.with(|last| last.borrow_mut().take());
    guard
}

/// The library's log callback: messages to `tracing`, errors also kept for the [`Error`].
unsafe extern "C" fn log_message(level: c_int, msg: *const c_char, _usrptr: *mut c_void) {
    if msg.is_null() {
        return;
    }
    // SAFETY: the library passes a NUL-terminated message valid for this call.
    let text = unsafe { CStr::from_ptr(msg) }.to_string_lossy();
    let line = one_line(&text);
    if level == ffi::CRYPT_LOG_ERROR {
        debug!(target: "libcryptsetup", message = %line, "error");
        LAST_ERROR.with(|last| *last.borrow_mut() = Some(line));
    } else if level >= 0 {
        debug!(target: "libcryptsetup", message = %line);
    } else {
        trace!(target: "libcryptsetup", message = %line);
    }
}

/// A message on one line of printable characters, at most [`MAX_MESSAGE_CHARS`] long.
fn one_line(text: &str) -> String {
    let mut line: String = text
        .trim()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX_MESSAGE_CHARS)
        .collect();
    if text.trim().chars().count() > MAX_MESSAGE_CHARS {
        line.push('…');
    }
    line
}

fn check(operation: &'static str, rc: c_int) -> Result<c_int, Error> {
    if rc >= 0 {
        return Ok(rc);
    }
    Err(Error {
        operation,
        errno: rc.saturating_neg(),
        message: LAST_ERROR.with(|last| last.borrow_mut().take()),
    })
}

fn check_slot(operation: &'static str, rc: c_int) -> Result<u8, Error> {
    let slot = check(operation, rc)?;
    u8::try_from(slot).map_err(|_| Error {
        operation,
        errno: libc_einval(),
        message: Some(format!("the library returned keyslot {slot}")),
    })
}

fn c_string(operation: &'static str, text: &str) -> Result<CString, Error> {
    CString::new(text).map_err(|_| Error {
        operation,
        errno: libc_einval(),
        message: Some("an argument contains a NUL byte".to_owned()),
    })
}

const fn libc_einval() -> i32 {
    22
}

#[cfg(test)]
mod tests {

    use super::*;

    const FAST: Pbkdf = Pbkdf::FAST_FOR_TESTS;

    fn image() -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.img");
        std::fs::File::create(&path)
            .unwrap()
            .set_len(32 << 20)
            .unwrap();
        (dir, path)
    }

    fn formatted(path: &Path, key: &[u8]) -> Device {
        let device = Device::init(path).unwrap();
        device
            .format_luks2(&FormatParams {
                cipher: "aes".to_owned(),
                cipher_mode: "xts-plain64".to_owned(),
                volume_key_bytes: 64,
                sector_size: 4096,
                pbkdf: FAST,
                keyslots_area_bytes: Some(2 * 1024 * 1024 - 32 * 1024),
            })
            .unwrap();
        assert_eq!(device.add_keyslot_by_volume_key(0, key).unwrap(), 0);
        device
    }

    #[test]
    fn keyslots_tokens_and_metadata_round_trip_through_a_fresh_load() {
        let (_dir, path) = image();
        let uuid = formatted(&path, b"first").uuid().unwrap();

        let device = Device::init(&path).unwrap();
        device.load_luks2().unwrap();
        assert_eq!(device.uuid().as_deref(), Some(uuid.as_str()));
        device.set_pbkdf(&FAST).unwrap();
        assert_eq!(device.add_keyslot(1, b"first", b"second").unwrap(), 1);
        assert_eq!(device.test_passphrase(None, b"second").unwrap(), Some(1));
        assert_eq!(device.test_passphrase(Some(0), b"second").unwrap(), None);
        device.destroy_keyslot(0).unwrap();
        assert_eq!(device.test_passphrase(None, b"first").unwrap(), None);
        device
            .set_token_json(0, r#"{"type":"t","keyslots":[],"x":true}"#)
            .unwrap();
        drop(device);

        let again = Device::init(&path).unwrap();
        again.load_luks2().unwrap();
        let json: String = again
            .metadata_json()
            .unwrap()
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        assert!(json.contains(r#""x":true"#), "{json}");
        assert!(json.contains(r#""keyslots_size":"2064384""#), "{json}");
        assert!(json.contains(r#""offset":"2097152""#), "{json}");
        assert!(json.contains(r#""1":{"type":"luks2""#), "{json}");
        assert!(!json.contains(r#""0":{"type":"luks2""#), "{json}");
        assert_eq!(again.test_passphrase(None, b"second").unwrap(), Some(1));
    }

    #[test]
    fn a_wrong_passphrase_cannot_add_a_keyslot() {
        let (_dir, path) = image();
        let device = formatted(&path, b"right");
        let error = device.add_keyslot(1, b"wrong", b"new").unwrap_err();
        assert!(error.is_wrong_passphrase(), "{error}");
        assert_eq!(device.test_passphrase(None, b"new").unwrap(), None);
    }

    #[test]
    fn a_device_without_a_header_does_not_load_and_says_why() {
        let (_dir, path) = image();
        let device = Device::init(&path).unwrap();
        let error = device.load_luks2().unwrap_err();
        assert_eq!(error.operation, "load");
        assert_eq!(error.errno, 22, "{error}");
        assert!(error.to_string().contains("libcryptsetup load failed"));
    }

    #[test]
    fn a_missing_device_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let error = Device::init(&dir.path().join("absent")).unwrap_err();
        assert_eq!(error.operation, "init");
    }

    #[test]
    fn messages_are_one_bounded_line() {
        assert_eq!(one_line("  a\nb\tc \n"), "a b c");
        let long = "x".repeat(1000);
        assert_eq!(one_line(&long).chars().count(), MAX_MESSAGE_CHARS + 1);
    }
}

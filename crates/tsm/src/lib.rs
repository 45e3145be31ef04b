//! Raw SEV-SNP and TDX reports from the Linux kernel's configfs-tsm interface
//! (`/sys/kernel/config/tsm/report`, Linux 6.7 and later), as its ABI document
//! (`Documentation/ABI/testing/configfs-tsm`) describes it:
//!
//! 1. make a report entry: a new directory under the root; the kernel fills it with
//!    attributes;
//! 2. write the privilege level (`privlevel`, SEV-SNP's VMPL) if one is configured, then
//!    the 64 bytes of report data (`inblob`);
//! 3. read the report (`outblob`), the certificates (`auxblob`, SEV-SNP: the table
//!    [`snp_certs`] parses), the format (`provider`: `sev_guest`, `tdx_guest`) and
//!    `generation`, which counts the writes to the entry: if it is not the number of
//!    writes made here, another writer changed the request and the report may answer
//!    theirs, so it is discarded and asked for again in a fresh entry;
//! 4. remove the entry.
//!
//! Every read is bounded and every error names the file. The root is a parameter, so the
//! steps run against any directory laid out like the kernel's; only a confidential VM
//! produces real reports.
//!
//! This crate issues evidence and never verifies it; it uses only std file I/O (no C, no
//! ioctl) and holds no secret.
#![forbid(unsafe_code)]

pub mod snp_certs;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::{debug, warn};

pub use snp_certs::{CertKind, CertTableError, parse_snp_cert_table};

/// Where the kernel mounts configfs-tsm's report directory.
pub const DEFAULT_ROOT: &str = "/sys/kernel/config/tsm/report";

/// Size of the report data written to `inblob` (SEV-SNP and TDX REPORT_DATA).
pub const INBLOB_SIZE: usize = 64;

/// Largest `outblob` read. An SNP report is 1184 bytes; a TDX quote with its PCK chain a
/// few kilobytes.
pub const MAX_OUTBLOB: usize = 32 * 1024;

/// Largest `auxblob` read: the SNP certificates (VCEK or VLEK, ASK, ARK, a few kilobytes).
pub const MAX_AUXBLOB: usize = 64 * 1024;

/// Highest privilege level the kernel accepts (`TSM_PRIVLEVEL_MAX`).
pub const MAX_PRIVLEVEL: u8 = 3;

/// How many fresh entries [`ConfigfsTsm::report`] tries when another writer races it.
pub const ATTEMPTS: u32 = 3;

/// Largest text attribute read (`provider`, `generation`).
const MAX_TEXT: usize = 256;

/// How many entry names are tried when one is taken.
const NAME_ATTEMPTS: u32 = 8;

/// The format of `outblob`, from `provider`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Provider {
    /// `sev_guest`: an SEV-SNP attestation report; `auxblob` is the certificate table.
    SevGuest,
    /// `tdx_guest`: a TDX quote.
    TdxGuest,
    /// Another provider, by name.
    Other(String),
}

impl Provider {
    fn from_name(name: &str) -> Self {
        match name {
            "sev_guest" => Provider::SevGuest,
            "tdx_guest" => Provider::TdxGuest,
            other => Provider::Other(other.to_owned()),
        }
    }
}

/// A report as the kernel returned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TsmReport {
    /// Who made it, and so the format of [`TsmReport::outblob`].
    pub provider: Provider,
    /// The report or quote.
    pub outblob: Vec<u8>,
    /// The supplemental data (SEV-SNP: the certificate table), when the provider has any.
    pub auxblob: Option<Vec<u8>>,
}

/// Why no report was obtained. Each I/O error names the file.
#[derive(Debug, thiserror::Error)]
pub enum TsmError {
    /// The root does not exist.
    #[error(
        "no configfs-tsm at {}: not a confidential VM, a kernel older than 6.7, or configfs \
         not mounted",
        root.display()
    )]
    NotAvailable {
        /// The root looked at.
        root: PathBuf,
    },
    /// A file operation failed.
    #[error("{}: {operation} failed: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was done (`mkdir`, `write`, `read`, `rmdir`).
        operation: &'static str,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// An attribute holds more than this crate reads.
    #[error("{}: more than {max} bytes", path.display())]
    TooLarge {
        /// The attribute.
        path: PathBuf,
        /// The limit.
        max: usize,
    },
    /// An attribute's content is not what the ABI says.
    #[error("{}: {detail}", path.display())]
    Invalid {
        /// The attribute.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// A privilege level above [`MAX_PRIVLEVEL`].
    #[error("privilege level {level} is above the maximum {MAX_PRIVLEVEL}")]
    PrivlevelOutOfRange {
        /// The level given.
        level: u8,
    },
    /// Another writer changed every request made.
    #[error("another writer changed the report request in each of {attempts} entries")]
    Raced {
        /// Entries tried.
        attempts: u32,
    },
}

fn io_error(path: &Path, operation: &'static str) -> impl FnOnce(io::Error) -> TsmError {
    let path = path.to_owned();
    move |source| TsmError::Io {
        path,
        operation,
        source,
    }
}

/// Reads at most `max` bytes of `path`; more is an error.
fn read_bounded(path: &Path, max: usize) -> Result<Vec<u8>, TsmError> {
    let file = fs::File::open(path).map_err(io_error(path, "open"))?;
    let cap = u64::try_from(max).unwrap_or(u64::MAX);
    asterism_basics::read_capped_from(file, cap)
        .map_err(io_error(path, "read"))?
        .ok_or_else(|| TsmError::TooLarge {
            path: path.to_owned(),
            max,
        })
}

/// A text attribute, without its trailing newline.
fn read_text(path: &Path) -> Result<String, TsmError> {
    let bytes = read_bounded(path, MAX_TEXT)?;
    let text = String::from_utf8(bytes).map_err(|_| TsmError::Invalid {
        path: path.to_owned(),
        detail: "not UTF-8".into(),
    })?;
    Ok(text.trim_end_matches('\n').to_owned())
}

fn write(path: &Path, data: &[u8]) -> Result<(), TsmError> {
    // configfs commits a binary attribute when the file is closed; `fs::write` closes it.
    fs::write(path, data).map_err(io_error(path, "write"))
}

/// What configfs does by itself when an entry directory is made and removed: create its
/// attributes, and remove them with it. Nothing to do on the kernel; the tests' stand-in
/// kernel does it in a plain directory.
trait Entries {
    fn created(&self, entry: &Path) -> io::Result<()>;
    fn removing(&self, entry: &Path) -> io::Result<()>;
}

struct Configfs;

impl Entries for Configfs {
    fn created(&self, _entry: &Path) -> io::Result<()> {
        Ok(())
    }
    fn removing(&self, _entry: &Path) -> io::Result<()> {
        Ok(())
    }
}

/// Asks the kernel's configfs-tsm for reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigfsTsm {
    root: PathBuf,
    privlevel: Option<u8>,
}

impl Default for ConfigfsTsm {
    fn default() -> Self {
        Self::new(DEFAULT_ROOT)
    }
}

impl ConfigfsTsm {
    /// Reports through the configfs-tsm report directory `root` ([`DEFAULT_ROOT`] on a
    /// confidential VM), at the provider's default privilege level.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            privlevel: None,
        }
    }

    /// Asks for reports at privilege level `level` (SEV-SNP: the VMPL), 0 to
    /// [`MAX_PRIVLEVEL`].
    pub fn with_privlevel(mut self, level: u8) -> Result<Self, TsmError> {
        if level > MAX_PRIVLEVEL {
            return Err(TsmError::PrivlevelOutOfRange { level });
        }
        self.privlevel = Some(level);
        Ok(self)
    }

    /// The report directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A report over `report_data`, made in a fresh entry that is removed afterwards.
    pub fn report(&self, report_data: &[u8; INBLOB_SIZE]) -> Result<TsmReport, TsmError> {
        self.report_with(report_data, &Configfs)
    }

    fn report_with(
        &self,
        report_data: &[u8; INBLOB_SIZE],
        entries: &dyn Entries,
    ) -> Result<TsmReport, TsmError> {
        match fs::metadata(&self.root) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(TsmError::NotAvailable {
                    root: self.root.clone(),
                });
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(TsmError::NotAvailable {
                    root: self.root.clone(),
                });
            }
            Err(e) => return Err(io_error(&self.root, "stat")(e)),
        }
        for attempt in 1..=ATTEMPTS {
            let entry = self.make_entry()?;
            let result = entries
                .created(&entry)
                .map_err(io_error(&entry, "create attributes"))
                .and_then(|()| self.request(&entry, report_data));
            let removed = entries
                .removing(&entry)
                .and_then(|()| fs::remove_dir(&entry));
            if let Err(error) = removed {
                // The report (or the error) stands; the kernel keeps a stale entry.
                warn!(entry = %entry.display(), %error, "cannot remove the configfs-tsm entry");
            }
            match result? {
                Some(report) => return Ok(report),
                None => warn!(
                    entry = %entry.display(),
                    attempt,
                    "another writer changed the configfs-tsm request; asking again"
                ),
            }
        }
        Err(TsmError::Raced { attempts: ATTEMPTS })
    }

    /// Makes an entry with a name no other request uses.
    fn make_entry(&self) -> Result<PathBuf, TsmError> {
        let pid = std::process::id();
        let mut last = None;
        for _ in 0..NAME_ATTEMPTS {
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            let entry = self.root.join(format!("asterism-{pid}-{nanos}"));
            match fs::create_dir(&entry) {
                Ok(()) => return Ok(entry),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some((entry, e)),
                Err(e) => return Err(io_error(&entry, "mkdir")(e)),
            }
        }
        let (entry, e) = last.unwrap_or_else(|| {
            (
                self.root.clone(),
                io::Error::from(io::ErrorKind::AlreadyExists),
            )
        });
        Err(io_error(&entry, "mkdir")(e))
    }

    /// One request in `entry`; `None` when another writer changed it meanwhile.
    fn request(
        &self,
        entry: &Path,
        report_data: &[u8; INBLOB_SIZE],
    ) -> Result<Option<TsmReport>, TsmError> {
        let mut writes = 0u64;
        if let Some(level) = self.privlevel {
            write(&entry.join("privlevel"), format!("{level}\n").as_bytes())?;
            writes += 1;
        }
        write(&entry.join("inblob"), report_data)?;
        writes += 1;

        let outblob_path = entry.join("outblob");
        let outblob = read_bounded(&outblob_path, MAX_OUTBLOB)?;
        if outblob.is_empty() {
            return Err(TsmError::Invalid {
                path: outblob_path,
                detail: "empty report".into(),
            });
        }
        let auxblob_path = entry.join("auxblob");
        let auxblob = match read_bounded(&auxblob_path, MAX_AUXBLOB) {
            Ok(bytes) if bytes.is_empty() => None,
            Ok(bytes) => Some(bytes),
            // Providers without supplemental data hide the attribute.
            Err(TsmError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => None,
            Err(other) => return Err(other),
        };
        let provider = Provider::from_name(&read_text(&entry.join("provider"))?);

        // Last: the count covers every read above.
        let generation_path = entry.join("generation");
        let text = read_text(&generation_path)?;
        let generation: u64 = text.parse().map_err(|_| TsmError::Invalid {
            path: generation_path,
            detail: format!("{text:?} is not a number"),
        })?;
        if generation != writes {
            debug!(generation, writes, "configfs-tsm generation moved");
            return Ok(None);
        }
        Ok(Some(TsmReport {
            provider,
            outblob,
            auxblob,
        }))
    }
}

#[cfg(test)]
mod tests;

//! Expected measurements: which SHA-256 PCR values a node must show, each enforced or
//! warn-only, parsed from a JSON document. A validator reads them from a
//! [`MeasurementsProvider`]: a fixed map, or a [`SharedMeasurements`] that a binary
//! replaces when the file changes (the binary watches the file; this crate reads files only
//! in [`Measurements::load`], never during validation).
//!
//! # File format
//!
//! ```json
//! {
//!   "measurements": {
//!     "4":  {"expected": "<64 hex digits>", "warnOnly": false},
//!     "14": {"expected": "<64 hex digits>", "warnOnly": true},
//!     "15": "<64 hex digits>"
//!   }
//! }
//! ```
//!
//! A file for nodes on confidential VMs may add the reference values of the hardware report
//! under the vTPM, per variant. Each entry has the same two forms as a PCR entry:
//!
//! ```json
//! {
//!   "measurements": { "4": "<64 hex digits>" },
//!   "snp": {
//!     "launchMeasurement": {"expected": "<96 hex digits>", "warnOnly": false},
//!     "hostData": "<64 hex digits>"
//!   },
//!   "tdx": {
//!     "mrtd": "<96 hex digits>",
//!     "rtmr0": "<96 hex digits>", "rtmr1": "…", "rtmr2": "…", "rtmr3": "…"
//!   }
//! }
//! ```
//!
//! SEV-SNP's launch measurement, TDX's MRTD and RTMRs are 48 bytes (SHA-384), SNP host data
//! 32 bytes. Every field is optional; a field that is absent is not compared. They are
//! reloaded with the file like the PCRs.
//!
//! A PCR entry in object form may also list the events the boot is expected to extend
//! into that PCR, in order, so that a node whose event log shows another event can be told
//! which one differs (docs/attestation.md):
//!
//! ```json
//! "9": {"expected": "<64 hex digits>", "events": [
//!   {"digest": "<64 hex digits>", "description": "Linux command line"},
//!   {"digest": "<64 hex digits>", "description": "Linux initrd"}
//! ]}
//! ```
//!
//! The events' SHA-256 digests, extended from the PCR's value after `TPM2_Startup`, must
//! give `expected`: a list that does not is refused on load, so a stale list cannot explain
//! a mismatch wrongly. At most [`MAX_REFERENCE_EVENTS`] per PCR; a description is optional.
//!
//! Every PCR starts at zero but PCR 0 on a platform whose firmware starts the TPM from
//! another locality (an H-CRTM, on many servers; its log records a `StartupLocality`
//! event): PCR 0 then starts at `00…0<locality>` ([`pcr_start`]). PCR 0's entry says so
//! with `startupLocality`, which is allowed only there and only beside `events`:
//!
//! ```json
//! "0": {"expected": "<64 hex digits>", "startupLocality": 3, "events": [
//!   {"digest": "<64 hex digits>", "description": "EV_S_CRTM_VERSION"}
//! ]}
//! ```
//!
//! Keys are decimal PCR indices `0..=23` (no sign, no leading zeros). A value is either an
//! object with `expected` (hex, exactly 32 bytes) and an optional `warnOnly` (default
//! `false`), or a bare hex string, which means enforced. Unknown keys, duplicate keys,
//! base64, a `0x` prefix and any other length are refused. At least one PCR must be
//! enforced: a map that gates nothing would be a silent skip.
//!
//! # Resettable PCRs
//!
//! In the TCG PC Client Platform TPM Profile, PCR 16 (debug) and PCR 23 (application
//! support) can be reset with `TPM2_PCR_Reset` from locality 0, that is by any software
//! with access to the TPM. Such a PCR can be driven to any value whose extend sequence is
//! known, and to all-zero by a plain reset, so an enforced expectation on it proves nothing
//! about the boot. An *enforced* value for one of [`RESETTABLE_PCRS`] is therefore refused
//! on load, **including all-zero** (zero is exactly what a reset produces); a warn-only
//! value is accepted. PCRs 17–22 can be reset only from localities 2–4 (dynamic launch), not
//! by ordinary software at locality 0, and are accepted.

use crate::ValidationError;
use crate::explain::{Reference, hex_array};
use serde::Deserialize;
use serde::de::{self, MapAccess, Visitor};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

/// PCRs that software at locality 0 can reset (PC Client profile): enforcing them is refused.
pub const RESETTABLE_PCRS: [PcrIndex; 2] = [PcrIndex(16), PcrIndex(23)];

/// Largest measurements file read (a full map is about 3 KiB).
pub const MAX_FILE_SIZE: u64 = 1024 * 1024;

/// Most reference events listed for one PCR.
pub const MAX_REFERENCE_EVENTS: usize = 256;

/// Longest description of a reference event, in characters.
pub const MAX_REFERENCE_DESCRIPTION: usize = 200;

/// One event the boot is expected to extend into a PCR: its SHA-256 digest and, for
/// people, what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReferenceEvent {
    /// The expected SHA-256 digest of the event.
    pub digest: [u8; 32],
    /// What the event is (`Linux initrd`), if the file says.
    pub description: Option<String>,
}

/// A PCR index of a PC-client TPM: `0..=23`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PcrIndex(u8);

impl PcrIndex {
    /// The highest PCR index.
    pub const MAX: u8 = 23;

    /// `Some` if `i <= 23`.
    pub const fn new(i: u8) -> Option<Self> {
        if i <= Self::MAX { Some(Self(i)) } else { None }
    }

    /// The index as a number.
    pub const fn get(self) -> u8 {
        self.0
    }

    /// All 24 indices, ascending.
    pub fn all() -> impl Iterator<Item = PcrIndex> {
        (0..=Self::MAX).map(PcrIndex)
    }

    /// Whether software can reset this PCR (see [`RESETTABLE_PCRS`]).
    pub fn is_resettable(self) -> bool {
        RESETTABLE_PCRS.contains(&self)
    }
}

/// `SHA-256(pcr || digest)`: a SHA-256 PCR extend, as the TPM computes it.
pub fn extend(pcr: &[u8; 32], digest: &[u8; 32]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(pcr);
    h.update(digest);
    h.finalize().into()
}

/// The SHA-256 value of PCR `index` right after `TPM2_Startup` from `startup_locality`:
/// zero, except PCR 0, whose last byte is the locality (PC Client profile). Firmware with
/// an H-CRTM starts the TPM from locality 3 (or 4) and records it in a `StartupLocality`
/// `EV_NO_ACTION` event; every other platform starts from locality 0, so PCR 0 starts at
/// zero too.
pub fn pcr_start(index: PcrIndex, startup_locality: u8) -> [u8; 32] {
    let mut start = [0u8; 32];
    if index.get() == 0
        && let Some(last) = start.last_mut()
    {
        *last = startup_locality;
    }
    start
}

/// The SHA-256 value of PCR `index` after `TPM2_Startup` from `startup_locality` and the
/// extends of `digests`, in order. This is the one computation of a PCR from its events:
/// the event log's replay ([`crate::tpm::eventlog::EventLog::replay_sha256`]), the check of
/// reference events against their expected value, and the explanation of a mismatch all
/// rest on it.
pub fn replay_pcr<'a>(
    index: PcrIndex,
    startup_locality: u8,
    digests: impl IntoIterator<Item = &'a [u8; 32]>,
) -> [u8; 32] {
    digests
        .into_iter()
        .fold(pcr_start(index, startup_locality), |pcr, d| extend(&pcr, d))
}

impl TryFrom<u32> for PcrIndex {
    type Error = MeasurementsError;

    fn try_from(i: u32) -> Result<Self, Self::Error> {
        u8::try_from(i)
            .ok()
            .and_then(PcrIndex::new)
            .ok_or_else(|| MeasurementsError::BadIndex(i.to_string()))
    }
}

impl std::str::FromStr for PcrIndex {
    type Err = MeasurementsError;

    /// Canonical decimal only: `"4"`, not `"04"`, `"+4"` or `" 4"`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || MeasurementsError::BadIndex(s.to_owned());
        let canonical = !s.is_empty()
            && s.len() <= 2
            && s.bytes().all(|b| b.is_ascii_digit())
            && (s == "0" || !s.starts_with('0'));
        if !canonical {
            return Err(bad());
        }
        s.parse::<u8>().ok().and_then(PcrIndex::new).ok_or_else(bad)
    }
}

impl fmt::Display for PcrIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Whether a mismatch rejects the evidence or is only reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MeasurementMode {
    /// A mismatch or a missing value rejects the evidence.
    Enforce,
    /// A mismatch is logged and returned as a warning; it never gates.
    WarnOnly,
}

/// The expected SHA-256 value of one PCR and what a mismatch means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpectedPcr {
    /// The expected PCR value.
    pub expected: [u8; 32],
    /// Enforce or warn only.
    pub mode: MeasurementMode,
}

impl ExpectedPcr {
    /// An enforced expectation.
    pub fn enforce(expected: [u8; 32]) -> Self {
        Self {
            expected,
            mode: MeasurementMode::Enforce,
        }
    }

    /// A warn-only expectation.
    pub fn warn_only(expected: [u8; 32]) -> Self {
        Self {
            expected,
            mode: MeasurementMode::WarnOnly,
        }
    }
}

/// Why a measurements map or file was refused.
#[derive(Debug, thiserror::Error)]
pub enum MeasurementsError {
    /// The file could not be read.
    #[error("reading measurements file {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is larger than any sensible measurements file.
    #[error("measurements file {path} is {size} bytes, at most {MAX_FILE_SIZE} allowed")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
    },
    /// The document is not valid JSON of the documented shape.
    #[error("measurements JSON: {0}")]
    Json(#[source] serde_json::Error),
    /// A key is not a canonical decimal PCR index `0..=23`.
    #[error("PCR index {0:?} is not a decimal number in 0..=23")]
    BadIndex(String),
    /// The same index appears twice.
    #[error("PCR {0} appears more than once")]
    DuplicateIndex(PcrIndex),
    /// An expected value is not hex.
    #[error("PCR {index}: expected value is not hex: {reason}")]
    BadHex {
        /// The PCR.
        index: PcrIndex,
        /// What is wrong.
        reason: String,
    },
    /// An expected value is not exactly 32 bytes.
    #[error("PCR {index}: expected value is {len} bytes, want 32 (SHA-256)")]
    BadLength {
        /// The PCR.
        index: PcrIndex,
        /// Its length in bytes.
        len: usize,
    },
    /// An enforced value for a PCR any software can reset.
    #[error(
        "PCR {0} is resettable by software (PC Client profile); an enforced value proves \
         nothing, use warnOnly"
    )]
    EnforcedResettable(PcrIndex),
    /// A confidential-VM reference value is not hex of the right length.
    #[error("{field}: {reason}")]
    BadReference {
        /// The field, as in the file (`snp.launchMeasurement`).
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// A PCR's reference events are not usable.
    #[error("PCR {index}: reference events: {reason}")]
    ReferenceEvents {
        /// The PCR.
        index: PcrIndex,
        /// What is wrong (bad digest, too many, they do not extend to the expected value).
        reason: String,
    },
    /// No PCR is enforced, so nothing would gate.
    #[error("no PCR is enforced; a measurements map must enforce at least one PCR")]
    NoEnforced,
}

/// Expected PCR values (SHA-256 bank), by index. Valid by construction: indices `0..=23`,
/// 32-byte values, no enforced resettable PCR, at least one enforced PCR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Measurements {
    pcrs: BTreeMap<PcrIndex, ExpectedPcr>,
    cvm: CvmReferences,
    events: BTreeMap<PcrIndex, References>,
}

/// The reference events of one PCR and the locality its replay starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
struct References {
    startup_locality: u8,
    events: Vec<ReferenceEvent>,
}

/// Reference values of a confidential VM's hardware report (the report the vTPM is bound
/// to), as the measurements file gives them. A verifier of a confidential-VM platform
/// requires the values that pin its launch (SEV-SNP: the launch measurement; TDX: MRTD and
/// the RTMRs, [`crate::tpm::CvmAkTrust::missing_references`]) and refuses evidence while
/// one is absent, unless it was built with [`InsecureNoLaunchMeasurement`]. The other
/// fields are compared only when present.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CvmReferences {
    /// SEV-SNP: the launch measurement (`MEASUREMENT`, SHA-384 of the launch digest).
    pub snp_launch_measurement: Option<Reference<48>>,
    /// SEV-SNP: the host data the hypervisor set at launch (`HOST_DATA`).
    pub snp_host_data: Option<Reference<32>>,
    /// TDX: the build-time measurement of the TD (`MRTD`).
    pub tdx_mrtd: Option<Reference<48>>,
    /// TDX: the run-time measurement registers `RTMR0`..`RTMR3`.
    pub tdx_rtmrs: [Option<Reference<48>>; 4],
}

impl CvmReferences {
    /// Whether no reference value is set.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// **Insecure**: permission to accept a confidential VM's hardware report whose launch is
/// pinned by no reference value (SEV-SNP: no launch measurement; TDX: no MRTD or RTMR 0–2,
/// or on Azure RTMR 3). Without it every SEV-SNP and TDX verifier refuses such a report,
/// and the binaries refuse to start. The report then proves only that *some* firmware and
/// kernel on genuine hardware asked for it, including one an attacker launched.
///
/// Made only by [`InsecureNoLaunchMeasurement::insecure_new`], which logs a warning; every
/// verification that relies on it logs another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InsecureNoLaunchMeasurement(());

impl InsecureNoLaunchMeasurement {
    /// The permission; logs a warning that launch measurements are not required.
    pub fn insecure_new() -> Self {
        tracing::warn!(
            "insecure_no_launch_measurement: confidential VMs whose launch measurement has no \
             reference value will be accepted; any firmware and kernel on genuine hardware \
             can then vouch for an attestation key"
        );
        Self(())
    }
}

impl Measurements {
    /// Builds a map; refuses duplicates, enforced resettable PCRs and maps that enforce
    /// nothing.
    pub fn new(
        entries: impl IntoIterator<Item = (PcrIndex, ExpectedPcr)>,
    ) -> Result<Self, MeasurementsError> {
        let mut map = BTreeMap::new();
        for (index, pcr) in entries {
            if pcr.mode == MeasurementMode::Enforce && index.is_resettable() {
                return Err(MeasurementsError::EnforcedResettable(index));
            }
            if map.insert(index, pcr).is_some() {
                return Err(MeasurementsError::DuplicateIndex(index));
            }
        }
        if !map.values().any(|p| p.mode == MeasurementMode::Enforce) {
            return Err(MeasurementsError::NoEnforced);
        }
        Ok(Self {
            pcrs: map,
            cvm: CvmReferences::default(),
            events: BTreeMap::new(),
        })
    }

    /// These expectations with `events` as the reference events of PCR `index`, on a
    /// platform that starts its TPM from locality 0 (every PCR starts at zero). Refused
    /// when `index` has no expectation, when there are more than [`MAX_REFERENCE_EVENTS`]
    /// or a description longer than [`MAX_REFERENCE_DESCRIPTION`], and when the digests,
    /// extended from zero, do not give the expected value.
    pub fn with_reference_events(
        self,
        index: PcrIndex,
        events: Vec<ReferenceEvent>,
    ) -> Result<Self, MeasurementsError> {
        self.with_reference_events_after_startup(index, 0, events)
    }

    /// Like [`Self::with_reference_events`], on a platform that starts its TPM from
    /// `startup_locality` (the locality of its event log's `StartupLocality` event): the
    /// digests are replayed from [`pcr_start`]. A locality other than 0 is refused for any
    /// PCR but 0, which is the only one it changes.
    pub fn with_reference_events_after_startup(
        mut self,
        index: PcrIndex,
        startup_locality: u8,
        events: Vec<ReferenceEvent>,
    ) -> Result<Self, MeasurementsError> {
        let bad = |reason: String| MeasurementsError::ReferenceEvents { index, reason };
        if startup_locality != 0 && index.get() != 0 {
            return Err(bad(format!(
                "a startup locality ({startup_locality}) sets where PCR 0 starts, not PCR {index}"
            )));
        }
        let want = self
            .pcrs
            .get(&index)
            .ok_or_else(|| bad("the PCR has no expected value".into()))?;
        if events.len() > MAX_REFERENCE_EVENTS {
            return Err(bad(format!(
                "{} events, at most {MAX_REFERENCE_EVENTS} allowed",
                events.len()
            )));
        }
        if events.iter().any(|e| {
            e.description
                .as_ref()
                .is_some_and(|d| d.chars().count() > MAX_REFERENCE_DESCRIPTION)
        }) {
            return Err(bad(format!(
                "a description is longer than {MAX_REFERENCE_DESCRIPTION} characters"
            )));
        }
        let replayed = replay_pcr(index, startup_locality, events.iter().map(|e| &e.digest));
        if replayed != want.expected {
            let start = match startup_locality {
                0 => String::new(),
                l => format!(" from startup locality {l}"),
            };
            return Err(bad(format!(
                "they extend{start} to {}, not to the expected value {}",
                hex::encode(replayed),
                hex::encode(want.expected)
            )));
        }
        if events.is_empty() {
            self.events.remove(&index);
        } else {
            self.events.insert(
                index,
                References {
                    startup_locality,
                    events,
                },
            );
        }
        Ok(self)
    }

    /// The reference events of PCR `index`, in order; empty when the file lists none.
    pub fn reference_events(&self, index: PcrIndex) -> &[ReferenceEvent] {
        self.events.get(&index).map_or(&[], |r| r.events.as_slice())
    }

    /// The startup locality the reference events of PCR `index` are replayed from: 0 but
    /// for a PCR 0 whose reference platform has an H-CRTM ([`pcr_start`]).
    pub fn reference_startup_locality(&self, index: PcrIndex) -> u8 {
        self.events.get(&index).map_or(0, |r| r.startup_locality)
    }

    /// These PCR expectations with `cvm` as the confidential-VM reference values.
    #[must_use]
    pub fn with_cvm(mut self, cvm: CvmReferences) -> Self {
        self.cvm = cvm;
        self
    }

    /// The confidential-VM reference values.
    pub fn cvm(&self) -> &CvmReferences {
        &self.cvm
    }

    /// Parses the JSON file format (module documentation).
    pub fn from_json(bytes: &[u8]) -> Result<Self, MeasurementsError> {
        let file: FileRepr = serde_json::from_slice(bytes).map_err(MeasurementsError::Json)?;
        let mut entries = Vec::with_capacity(file.measurements.0.len());
        let mut reference_events = Vec::new();
        for (key, entry) in file.measurements.0 {
            let index: PcrIndex = key.parse()?;
            let (hex_value, mode, references) = entry.into_parts();
            if let Some(references) = references {
                reference_events.push((index, references));
            }
            let bytes = hex::decode(&hex_value).map_err(|e| MeasurementsError::BadHex {
                index,
                reason: e.to_string(),
            })?;
            let expected: [u8; 32] =
                bytes
                    .as_slice()
                    .try_into()
                    .map_err(|_| MeasurementsError::BadLength {
                        index,
                        len: bytes.len(),
                    })?;
            entries.push((index, ExpectedPcr { expected, mode }));
        }
        let mut cvm = CvmReferences::default();
        if let Some(snp) = file.snp {
            cvm.snp_launch_measurement =
                reference("snp.launchMeasurement", snp.launch_measurement)?;
            cvm.snp_host_data = reference("snp.hostData", snp.host_data)?;
        }
        if let Some(tdx) = file.tdx {
            cvm.tdx_mrtd = reference("tdx.mrtd", tdx.mrtd)?;
            cvm.tdx_rtmrs = [
                reference("tdx.rtmr0", tdx.rtmr0)?,
                reference("tdx.rtmr1", tdx.rtmr1)?,
                reference("tdx.rtmr2", tdx.rtmr2)?,
                reference("tdx.rtmr3", tdx.rtmr3)?,
            ];
        }
        let mut measurements = Self::new(entries)?.with_cvm(cvm);
        for (index, (startup_locality, events)) in reference_events {
            let events = events
                .into_iter()
                .map(|e| {
                    let digest = hex_array(&e.digest).map_err(|reason| {
                        MeasurementsError::ReferenceEvents {
                            index,
                            reason: format!("digest: {reason}"),
                        }
                    })?;
                    Ok(ReferenceEvent {
                        digest,
                        description: e.description,
                    })
                })
                .collect::<Result<Vec<_>, MeasurementsError>>()?;
            measurements = measurements.with_reference_events_after_startup(
                index,
                startup_locality,
                events,
            )?;
        }
        Ok(measurements)
    }

    /// Reads and parses a measurements file.
    pub fn load(path: &Path) -> Result<Self, MeasurementsError> {
        Self::from_json(&read_bounded(path)?)
    }

    /// The JSON file format, indices ascending, every entry in object form.
    pub fn to_json(&self) -> String {
        let entries: Vec<String> = self
            .pcrs
            .iter()
            .map(|(i, p)| {
                format!(
                    "    \"{i}\": {{\"expected\": \"{}\", \"warnOnly\": {}{}}}",
                    hex::encode(p.expected),
                    p.mode == MeasurementMode::WarnOnly,
                    events_json(
                        self.reference_startup_locality(*i),
                        self.reference_events(*i)
                    )
                )
            })
            .collect();
        let mut sections = vec![format!(
            "  \"measurements\": {{\n{}\n  }}",
            entries.join(",\n")
        )];
        let c = &self.cvm;
        let snp = json_entries(&[
            (
                "launchMeasurement",
                c.snp_launch_measurement.as_ref().map(entry_json),
            ),
            ("hostData", c.snp_host_data.as_ref().map(entry_json)),
        ]);
        if !snp.is_empty() {
            sections.push(format!("  \"snp\": {{\n{snp}\n  }}"));
        }
        let [r0, r1, r2, r3] = &c.tdx_rtmrs;
        let tdx = json_entries(&[
            ("mrtd", c.tdx_mrtd.as_ref().map(entry_json)),
            ("rtmr0", r0.as_ref().map(entry_json)),
            ("rtmr1", r1.as_ref().map(entry_json)),
            ("rtmr2", r2.as_ref().map(entry_json)),
            ("rtmr3", r3.as_ref().map(entry_json)),
        ]);
        if !tdx.is_empty() {
            sections.push(format!("  \"tdx\": {{\n{tdx}\n  }}"));
        }
        format!("{{\n{}\n}}\n", sections.join(",\n"))
    }

    /// The expectation for one PCR.
    pub fn get(&self, index: PcrIndex) -> Option<&ExpectedPcr> {
        self.pcrs.get(&index)
    }

    /// All expectations, ascending by index.
    pub fn iter(&self) -> impl Iterator<Item = (PcrIndex, &ExpectedPcr)> {
        self.pcrs.iter().map(|(i, p)| (*i, p))
    }

    /// Number of PCRs with an expectation.
    pub fn len(&self) -> usize {
        self.pcrs.len()
    }

    /// Always `false`: a valid map enforces at least one PCR.
    pub fn is_empty(&self) -> bool {
        self.pcrs.is_empty()
    }

    /// Compares observed PCR values with the expectations, ascending by index. PCRs without
    /// an expectation are ignored.
    ///
    /// An enforced mismatch or missing value is an error naming index, expected and
    /// observed value (the lowest such index). A warn-only mismatch is logged at warn and
    /// returned as a warning; it never gates.
    pub fn compare(
        &self,
        observed: &BTreeMap<PcrIndex, [u8; 32]>,
    ) -> Result<Vec<String>, ValidationError> {
        let mut warnings = Vec::new();
        for (index, want) in &self.pcrs {
            let got = observed.get(index);
            if got == Some(&want.expected) {
                continue;
            }
            let expected = hex::encode(want.expected);
            let observed = got.map_or_else(|| "missing".to_owned(), hex::encode);
            match want.mode {
                MeasurementMode::Enforce => {
                    return Err(ValidationError::Measurement {
                        index: u32::from(index.get()),
                        expected,
                        observed,
                    });
                }
                MeasurementMode::WarnOnly => {
                    tracing::warn!(
                        pcr = index.get(),
                        %expected,
                        %observed,
                        "warn-only measurement mismatch (accepted)"
                    );
                    warnings.push(format!(
                        "warn-only measurement mismatch at index {index}: expected {expected}, \
                         observed {observed}"
                    ));
                }
            }
        }
        Ok(warnings)
    }

    /// This map as a fixed [`MeasurementsProvider`].
    pub fn into_provider(self) -> Arc<dyn MeasurementsProvider> {
        Arc::new(Fixed(Arc::new(self)))
    }
}

/// Where a validator gets its expected measurements on each validation, so a service can
/// change them without a restart.
///
/// It answers from memory: it is asked on every validation, so it must never read a file
/// or block. A binary that watches a measurements file reloads it at its edge and swaps
/// the new map into a [`SharedMeasurements`] (docs/attestation.md).
pub trait MeasurementsProvider: Send + Sync {
    /// The measurements in force now.
    fn current(&self) -> Arc<Measurements>;
}

struct Fixed(Arc<Measurements>);

impl MeasurementsProvider for Fixed {
    fn current(&self) -> Arc<Measurements> {
        Arc::clone(&self.0)
    }
}

/// Measurements that whoever holds a clone may replace: the validator reads the current map,
/// the binary's file watcher swaps in a new one. Clones share one slot; reading and
/// replacing are a lock and a pointer copy, no I/O.
#[derive(Clone)]
pub struct SharedMeasurements(Arc<RwLock<Arc<Measurements>>>);

impl SharedMeasurements {
    /// A slot holding `measurements`.
    pub fn new(measurements: Measurements) -> Self {
        Self(Arc::new(RwLock::new(Arc::new(measurements))))
    }

    /// Puts `measurements` in force for every validation that starts from now on.
    pub fn replace(&self, measurements: Measurements) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(measurements);
    }
}

impl fmt::Debug for SharedMeasurements {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("SharedMeasurements")
            .field(&self.current())
            .finish()
    }
}

impl MeasurementsProvider for SharedMeasurements {
    fn current(&self) -> Arc<Measurements> {
        Arc::clone(&self.0.read().unwrap_or_else(PoisonError::into_inner))
    }
}

fn read_bounded(path: &Path) -> Result<Vec<u8>, MeasurementsError> {
    let read = asterism_basics::read_file_capped(path, MAX_FILE_SIZE).map_err(|source| {
        MeasurementsError::Io {
            path: path.to_owned(),
            source,
        }
    })?;
    // One byte more than the cap was read, so the size reported is a lower bound.
    read.ok_or_else(|| MeasurementsError::TooLarge {
        path: path.to_owned(),
        size: MAX_FILE_SIZE + 1,
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileRepr {
    measurements: EntriesRepr,
    #[serde(default)]
    snp: Option<SnpRepr>,
    #[serde(default)]
    tdx: Option<TdxRepr>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SnpRepr {
    #[serde(default)]
    launch_measurement: Option<EntryRepr>,
    #[serde(default)]
    host_data: Option<EntryRepr>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TdxRepr {
    #[serde(default)]
    mrtd: Option<EntryRepr>,
    #[serde(default)]
    rtmr0: Option<EntryRepr>,
    #[serde(default)]
    rtmr1: Option<EntryRepr>,
    #[serde(default)]
    rtmr2: Option<EntryRepr>,
    #[serde(default)]
    rtmr3: Option<EntryRepr>,
}

impl EntryRepr {
    /// The value, the mode and, when the entry lists events, the startup locality and the
    /// events.
    fn into_parts(self) -> (String, MeasurementMode, Option<(u8, Vec<EventRepr>)>) {
        match self {
            EntryRepr::Bare(h) => (h, MeasurementMode::Enforce, None),
            EntryRepr::Full {
                expected,
                warn_only,
                startup_locality,
                events,
            } => (
                expected,
                if warn_only {
                    MeasurementMode::WarnOnly
                } else {
                    MeasurementMode::Enforce
                },
                events.map(|e| (startup_locality.unwrap_or(0), e)),
            ),
        }
    }
}

/// A reference event as written in the file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EventRepr {
    digest: String,
    #[serde(default)]
    description: Option<String>,
}

/// `, "events": [...]` for an entry with reference events (after `"startupLocality": n` when
/// it is not 0), nothing otherwise.
fn events_json(startup_locality: u8, events: &[ReferenceEvent]) -> String {
    if events.is_empty() {
        return String::new();
    }
    let locality = match startup_locality {
        0 => String::new(),
        l => format!(", \"startupLocality\": {l}"),
    };
    let items: Vec<String> = events
        .iter()
        .map(|e| {
            let description = e
                .description
                .as_ref()
                .map(|d| {
                    // serde_json quotes and escapes a string; it cannot fail.
                    let quoted = serde_json::to_string(d).unwrap_or_default();
                    format!(", \"description\": {quoted}")
                })
                .unwrap_or_default();
            format!("{{\"digest\": \"{}\"{description}}}", hex::encode(e.digest))
        })
        .collect();
    format!(
        "{locality},\n      \"events\": [\n        {}\n      ]",
        items.join(",\n        ")
    )
}

/// A confidential-VM reference value of `N` bytes from its file form.
fn reference<const N: usize>(
    field: &str,
    entry: Option<EntryRepr>,
) -> Result<Option<Reference<N>>, MeasurementsError> {
    let Some(entry) = entry else {
        return Ok(None);
    };
    let (hex_value, mode, events) = entry.into_parts();
    if events.is_some() {
        return Err(MeasurementsError::BadReference {
            field: field.to_owned(),
            reason: "reference events are for PCRs only".into(),
        });
    }
    let value = hex_array(&hex_value).map_err(|reason| MeasurementsError::BadReference {
        field: field.to_owned(),
        reason,
    })?;
    Ok(Some(Reference { value, mode }))
}

fn entry_json<const N: usize>(r: &Reference<N>) -> String {
    format!(
        "{{\"expected\": \"{}\", \"warnOnly\": {}}}",
        hex::encode(r.value),
        r.mode == MeasurementMode::WarnOnly
    )
}

/// `"name": value` lines of the entries that are set.
fn json_entries(entries: &[(&str, Option<String>)]) -> String {
    entries
        .iter()
        .filter_map(|(name, value)| value.as_ref().map(|v| format!("    \"{name}\": {v}")))
        .collect::<Vec<_>>()
        .join(",\n")
}

/// The measurement map as written, in order, duplicates kept (so they can be refused).
struct EntriesRepr(Vec<(String, EntryRepr)>);

impl<'de> Deserialize<'de> for EntriesRepr {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = EntriesRepr;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map from PCR index to expected value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, EntryRepr>()? {
                    if out.len() > usize::from(PcrIndex::MAX) {
                        return Err(de::Error::custom("more than 24 PCR entries"));
                    }
                    out.push((k, v));
                }
                Ok(EntriesRepr(out))
            }
        }
        d.deserialize_map(V)
    }
}

enum EntryRepr {
    Bare(String),
    Full {
        expected: String,
        warn_only: bool,
        startup_locality: Option<u8>,
        events: Option<Vec<EventRepr>>,
    },
}

impl<'de> Deserialize<'de> for EntryRepr {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = EntryRepr;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(r#"a hex string or {"expected": "<hex>", "warnOnly": <bool>}"#)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(EntryRepr::Bare(v.to_owned()))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                const FIELDS: &[&str] = &["expected", "warnOnly", "startupLocality", "events"];
                let mut expected: Option<String> = None;
                let mut warn_only: Option<bool> = None;
                let mut startup_locality: Option<u8> = None;
                let mut events: Option<Vec<EventRepr>> = None;
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "expected" if expected.is_some() => {
                            return Err(de::Error::duplicate_field("expected"));
                        }
                        "expected" => expected = Some(map.next_value()?),
                        "warnOnly" if warn_only.is_some() => {
                            return Err(de::Error::duplicate_field("warnOnly"));
                        }
                        "warnOnly" => warn_only = Some(map.next_value()?),
                        "startupLocality" if startup_locality.is_some() => {
                            return Err(de::Error::duplicate_field("startupLocality"));
                        }
                        "startupLocality" => startup_locality = Some(map.next_value()?),
                        "events" if events.is_some() => {
                            return Err(de::Error::duplicate_field("events"));
                        }
                        "events" => events = Some(map.next_value()?),
                        other => return Err(de::Error::unknown_field(other, FIELDS)),
                    }
                }
                let expected = expected.ok_or_else(|| de::Error::missing_field("expected"))?;
                if startup_locality.is_some() && events.is_none() {
                    return Err(de::Error::custom(
                        "startupLocality is where PCR 0's reference events start; it needs events",
                    ));
                }
                Ok(EntryRepr::Full {
                    expected,
                    warn_only: warn_only.unwrap_or(false),
                    startup_locality,
                    events,
                })
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idx(i: u8) -> PcrIndex {
        PcrIndex::new(i).unwrap()
    }

    #[test]
    fn index_parsing_is_canonical_decimal() {
        assert_eq!("0".parse::<PcrIndex>().unwrap(), idx(0));
        assert_eq!("23".parse::<PcrIndex>().unwrap(), idx(23));
        for bad in [
            "24", "04", "+4", " 4", "", "-1", "4.0", "0x4", "255", "1000",
        ] {
            assert!(bad.parse::<PcrIndex>().is_err(), "{bad:?}");
        }
        assert!(PcrIndex::try_from(24u32).is_err());
        assert!(PcrIndex::try_from(256u32).is_err());
    }

    #[test]
    fn json_round_trips() {
        let m = Measurements::new([
            (idx(4), ExpectedPcr::enforce([0xab; 32])),
            (idx(11), ExpectedPcr::warn_only([0; 32])),
            (idx(16), ExpectedPcr::warn_only([1; 32])),
        ])
        .unwrap();
        let json = m.to_json();
        assert!(json.find("\"4\"").unwrap() < json.find("\"11\"").unwrap());
        assert_eq!(Measurements::from_json(json.as_bytes()).unwrap(), m);
    }

    #[test]
    fn cvm_reference_values_round_trip_and_refuse_bad_lengths() {
        let cvm = CvmReferences {
            snp_launch_measurement: Some(Reference::enforce([0x11; 48])),
            snp_host_data: Some(Reference::warn_only([0x22; 32])),
            tdx_mrtd: Some(Reference::enforce([0x33; 48])),
            tdx_rtmrs: [None, Some(Reference::warn_only([0x44; 48])), None, None],
        };
        let m = Measurements::new([(idx(4), ExpectedPcr::enforce([0xab; 32]))])
            .unwrap()
            .with_cvm(cvm.clone());
        let parsed = Measurements::from_json(m.to_json().as_bytes()).unwrap();
        assert_eq!(parsed.cvm(), &cvm);
        assert_eq!(parsed, m);

        let pcr = format!(r#""measurements": {{"4": "{}"}}"#, hex::encode([1; 32]));
        // A 32-byte value where SNP's launch measurement is 48 bytes.
        let short = format!(
            r#"{{{pcr}, "snp": {{"launchMeasurement": "{}"}}}}"#,
            hex::encode([1; 32])
        );
        let err = Measurements::from_json(short.as_bytes()).unwrap_err();
        assert!(
            matches!(&err, MeasurementsError::BadReference { field, .. } if field == "snp.launchMeasurement"),
            "{err}"
        );
        let unknown = format!(
            r#"{{{pcr}, "tdx": {{"rtmr4": "{}"}}}}"#,
            hex::encode([1; 48])
        );
        assert!(Measurements::from_json(unknown.as_bytes()).is_err());
        let bare = format!(
            r#"{{{pcr}, "tdx": {{"mrtd": "{}"}}}}"#,
            hex::encode([7; 48])
        );
        let m = Measurements::from_json(bare.as_bytes()).unwrap();
        assert_eq!(m.cvm().tdx_mrtd, Some(Reference::enforce([7; 48])));
    }

    #[test]
    fn compare_reports_lowest_enforced_mismatch_and_warns_for_warn_only() {
        let m = Measurements::new([
            (idx(3), ExpectedPcr::warn_only([3; 32])),
            (idx(4), ExpectedPcr::enforce([4; 32])),
            (idx(9), ExpectedPcr::enforce([9; 32])),
        ])
        .unwrap();
        let mut obs = BTreeMap::from([(idx(3), [0; 32]), (idx(4), [4; 32]), (idx(9), [9; 32])]);
        let w = m.compare(&obs).unwrap();
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("index 3"));
        obs.remove(&idx(9));
        assert_eq!(
            m.compare(&obs).unwrap_err(),
            ValidationError::Measurement {
                index: 9,
                expected: hex::encode([9; 32]),
                observed: "missing".into()
            }
        );
    }
}

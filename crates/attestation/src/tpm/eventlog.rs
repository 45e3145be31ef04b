//! The TCG event log of a measured boot: what the firmware and the boot loader extended into
//! each PCR, one event at a time, as Linux exposes it in
//! `/sys/kernel/security/tpm0/binary_bios_measurements` (TCG PC Client Platform Firmware
//! Profile, crypto-agile format).
//!
//! The log is untrusted: it proves nothing by itself. It is worth something only once
//! [`EventLog::replay_sha256`] recomputes the PCRs a signed quote holds; then each event
//! explains a part of a PCR value, so a PCR that differs from its expected value can be
//! traced to the event that made it differ (an initrd, a command line, a boot application).
//!
//! # Format (all integers little-endian)
//!
//! 1. One `TCG_PCR_EVENT` in the old SHA-1 format: `pcrIndex` (0), `eventType`
//!    (`EV_NO_ACTION`), a 20-byte all-zero digest, `eventSize`, and the
//!    `TCG_EfiSpecIDEvent` ("Spec ID Event03"): platform class, spec version, `uintnSize`,
//!    the algorithms the log carries with their digest sizes, vendor information.
//! 2. Then `TCG_PCR_EVENT2` entries: `pcrIndex`, `eventType`, `TPML_DIGEST_VALUES` (a count,
//!    then per digest the algorithm and the digest of the size the Spec ID event declared),
//!    `eventSize` and the event data.
//!
//! Parsing is exact: at most [`MAX_EVENT_LOG_SIZE`] bytes, [`MAX_EVENTS`] events and
//! [`MAX_EVENT_DATA`] bytes of data per event; every event carries exactly the algorithms the
//! Spec ID event declares, each once; a known algorithm must be declared with its real
//! digest size; PCR indices are `0..=23`; the log ends exactly after its last event.

use crate::measurements::PcrIndex;
pub use crate::measurements::{extend, pcr_start, replay_pcr};
use std::collections::BTreeMap;
use std::fmt;

/// Largest log accepted, checked before anything is parsed. A firmware log is a few KiB
/// to a few tens of KiB.
pub const MAX_EVENT_LOG_SIZE: usize = 1024 * 1024;
/// Most events in one log (a server's firmware logs a few hundred).
pub const MAX_EVENTS: usize = 4096;
/// Largest data of one event (the largest are Secure Boot variables such as `dbx`).
pub const MAX_EVENT_DATA: usize = 128 * 1024;
/// Most algorithms the Spec ID event may declare.
pub const MAX_ALGORITHMS: usize = 8;

/// `TPM_ALG_SHA256`, the bank this crate replays.
pub const ALG_SHA256: u16 = 0x000b;

/// The Spec ID event's signature, NUL included.
const SPEC_ID_SIGNATURE: &[u8; 16] = b"Spec ID Event03\0";
/// The signature of the `EV_NO_ACTION` event that records the locality of `TPM2_Startup`.
const STARTUP_LOCALITY_SIGNATURE: &[u8; 16] = b"StartupLocality\0";

/// Digest sizes of the algorithms this crate knows; a log must declare these sizes for them.
const KNOWN_ALGORITHMS: [(u16, &str, u16); 6] = [
    (0x0004, "sha1", 20),
    (ALG_SHA256, "sha256", 32),
    (0x000c, "sha384", 48),
    (0x000d, "sha512", 64),
    (0x0012, "sm3_256", 32),
    (0x0027, "sha3_256", 32),
];

/// Why an event log was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventLogError {
    /// Larger than [`MAX_EVENT_LOG_SIZE`].
    #[error("the event log is {0} bytes, at most {MAX_EVENT_LOG_SIZE} allowed")]
    TooLarge(usize),
    /// The log ended inside an event.
    #[error("event {event} is truncated at {field}")]
    Truncated {
        /// The event's number in the log (0 is the Spec ID event).
        event: usize,
        /// The field that did not fit.
        field: &'static str,
    },
    /// The first event is not the Spec ID event of a crypto-agile log.
    #[error("the first event is not a valid Spec ID event: {0}")]
    SpecId(&'static str),
    /// The Spec ID event declares a known algorithm with another digest size.
    #[error("algorithm {alg:#06x} is declared with {declared}-byte digests, want {want}")]
    DigestSize {
        /// The algorithm.
        alg: u16,
        /// The size the log declares.
        declared: u16,
        /// The algorithm's digest size.
        want: u16,
    },
    /// The Spec ID event declares an algorithm twice.
    #[error("algorithm {0:#06x} is declared twice")]
    DuplicateAlgorithm(u16),
    /// More events than [`MAX_EVENTS`].
    #[error("the event log has more than {MAX_EVENTS} events")]
    TooManyEvents,
    /// An event's data is larger than [`MAX_EVENT_DATA`].
    #[error("event {event} carries {size} bytes of data, at most {MAX_EVENT_DATA} allowed")]
    EventTooLarge {
        /// The event's number.
        event: usize,
        /// Its data size.
        size: u32,
    },
    /// An event's PCR index is outside `0..=23`.
    #[error("event {event} names PCR {pcr}, outside 0..=23")]
    PcrIndex {
        /// The event's number.
        event: usize,
        /// The index found.
        pcr: u32,
    },
    /// An event does not carry exactly the declared algorithms.
    #[error("event {event} carries {count} digests, the Spec ID event declares {want}")]
    DigestCount {
        /// The event's number.
        event: usize,
        /// Digests found.
        count: u32,
        /// Algorithms declared.
        want: usize,
    },
    /// An event carries a digest of an algorithm the Spec ID event does not declare (its
    /// size is unknown, so the rest of the log cannot be read).
    #[error("event {event} carries a digest of undeclared algorithm {alg:#06x}")]
    UndeclaredAlgorithm {
        /// The event's number.
        event: usize,
        /// The algorithm.
        alg: u16,
    },
    /// An event carries two digests of one algorithm.
    #[error("event {event} carries two digests of algorithm {alg:#06x}")]
    RepeatedDigest {
        /// The event's number.
        event: usize,
        /// The algorithm.
        alg: u16,
    },
    /// Bytes after the last event that do not make an event header.
    #[error("{0} trailing bytes after the last event")]
    TrailingBytes(usize),
    /// The log does not carry the SHA-256 bank (a firmware that logs only SHA-1, say), so
    /// it cannot be replayed against a quote: quotes and expected measurements are of the
    /// SHA-256 bank only, and a PCR's SHA-1 value says nothing about its SHA-256 value.
    /// Carries the banks the log declares.
    #[error(
        "the event log has no SHA-256 digests (it carries {}); only the SHA-256 bank, the one \
         quotes sign and measurements expect, is replayed",
        algorithm_names(.0)
    )]
    NoSha256(Vec<u16>),
}

/// `sha1, 0x1234`: the names of the known algorithms, the others in hex.
fn algorithm_names(algs: &[u16]) -> String {
    let names: Vec<String> = algs
        .iter()
        .map(
            |alg| match KNOWN_ALGORITHMS.iter().find(|(id, _, _)| id == alg) {
                Some((_, name, _)) => (*name).to_owned(),
                None => format!("{alg:#06x}"),
            },
        )
        .collect();
    names.join(", ")
}

/// One algorithm of the log and its digest size, as the Spec ID event declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AlgorithmSize {
    /// `TPM_ALG_ID`.
    pub alg: u16,
    /// Digest size in bytes.
    pub size: u16,
}

/// The Spec ID event (`TCG_EfiSpecIDEvent`): what the rest of the log is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecId {
    /// The platform class (0: client, 1: server).
    pub platform_class: u32,
    /// `(major, minor, errata)` of the profile the firmware follows.
    pub spec_version: (u8, u8, u8),
    /// The size of `UINTN` in units of 4 bytes (1: 32-bit, 2: 64-bit firmware).
    pub uintn_size: u8,
    /// The algorithms every event carries, in declared order.
    pub algorithms: Vec<AlgorithmSize>,
    /// Vendor information, opaque.
    pub vendor_info: Vec<u8>,
}

/// The type of an event (`eventType`), with its name from the PC Client profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventType(pub u32);

impl EventType {
    /// Not extended into any PCR: information only (the Spec ID event, the startup
    /// locality).
    pub const NO_ACTION: EventType = EventType(0x3);
    /// The separator between pre-boot and OS-present measurements.
    pub const SEPARATOR: EventType = EventType(0x4);
    /// A tagged event (Linux's EFI stub logs the initrd and the command line with these).
    pub const EVENT_TAG: EventType = EventType(0x6);
    /// A boot loader's information string.
    pub const IPL: EventType = EventType(0xd);
    /// An action string of the UEFI firmware.
    pub const EFI_ACTION: EventType = EventType(0x8000_0007);

    /// The name of the type in the PC Client profile, if this crate knows it.
    pub fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0x0 => "EV_PREBOOT_CERT",
            0x1 => "EV_POST_CODE",
            0x2 => "EV_UNUSED",
            0x3 => "EV_NO_ACTION",
            0x4 => "EV_SEPARATOR",
            0x5 => "EV_ACTION",
            0x6 => "EV_EVENT_TAG",
            0x7 => "EV_S_CRTM_CONTENTS",
            0x8 => "EV_S_CRTM_VERSION",
            0x9 => "EV_CPU_MICROCODE",
            0xa => "EV_PLATFORM_CONFIG_FLAGS",
            0xb => "EV_TABLE_OF_DEVICES",
            0xc => "EV_COMPACT_HASH",
            0xd => "EV_IPL",
            0xe => "EV_IPL_PARTITION_DATA",
            0xf => "EV_NONHOST_CODE",
            0x10 => "EV_NONHOST_CONFIG",
            0x11 => "EV_NONHOST_INFO",
            0x12 => "EV_OMIT_BOOT_DEVICE_EVENTS",
            0x13 => "EV_POST_CODE2",
            0x8000_0001 => "EV_EFI_VARIABLE_DRIVER_CONFIG",
            0x8000_0002 => "EV_EFI_VARIABLE_BOOT",
            0x8000_0003 => "EV_EFI_BOOT_SERVICES_APPLICATION",
            0x8000_0004 => "EV_EFI_BOOT_SERVICES_DRIVER",
            0x8000_0005 => "EV_EFI_RUNTIME_SERVICES_DRIVER",
            0x8000_0006 => "EV_EFI_GPT_EVENT",
            0x8000_0007 => "EV_EFI_ACTION",
            0x8000_0008 => "EV_EFI_PLATFORM_FIRMWARE_BLOB",
            0x8000_0009 => "EV_EFI_HANDOFF_TABLES",
            0x8000_000a => "EV_EFI_PLATFORM_FIRMWARE_BLOB2",
            0x8000_000b => "EV_EFI_HANDOFF_TABLES2",
            0x8000_000c => "EV_EFI_VARIABLE_BOOT2",
            0x8000_000d => "EV_EFI_GPT_EVENT2",
            0x8000_0010 => "EV_EFI_HCRTM_EVENT",
            0x8000_00e0 => "EV_EFI_VARIABLE_AUTHORITY",
            0x8000_00e1 => "EV_EFI_SPDM_FIRMWARE_BLOB",
            0x8000_00e2 => "EV_EFI_SPDM_FIRMWARE_CONFIG",
            _ => return None,
        })
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "event type {:#010x}", self.0),
        }
    }
}

/// The tagged-event ID under which Linux's EFI stub measures the initrd into PCR 9.
pub const LINUX_INITRD_TAG: u32 = 0x8F3B_22EC;
/// The tagged-event ID under which Linux's EFI stub measures its load options (the kernel
/// command line) into PCR 9.
pub const LINUX_LOAD_OPTIONS_TAG: u32 = 0x8F3B_22ED;

/// One `TCG_PCR_EVENT2`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The event's number in the log; 0 is the Spec ID event, so the first of these is 1.
    pub number: usize,
    /// The PCR the event was extended into.
    pub pcr: PcrIndex,
    /// The event type.
    pub event_type: EventType,
    /// The digests, one per declared algorithm, in the order the log has them.
    pub digests: Vec<(u16, Vec<u8>)>,
    /// The event data (what was measured, or a description of it).
    pub data: Vec<u8>,
}

impl Event {
    /// The digest of `alg`, if the event carries one.
    pub fn digest(&self, alg: u16) -> Option<&[u8]> {
        self.digests
            .iter()
            .find(|(a, _)| *a == alg)
            .map(|(_, d)| d.as_slice())
    }

    /// The SHA-256 digest, if the log carries that bank.
    pub fn sha256(&self) -> Option<[u8; 32]> {
        self.digest(ALG_SHA256)?.try_into().ok()
    }

    /// Whether the event was extended into its PCR (every type but `EV_NO_ACTION`).
    pub fn is_extended(&self) -> bool {
        self.event_type != EventType::NO_ACTION
    }

    /// A short description for people, when the data allows one: the Linux tagged events
    /// (`Linux initrd`, `Linux command line`), strings of `EV_IPL`, `EV_EFI_ACTION` and the
    /// like, UEFI variable names, firmware blob addresses, separators.
    pub fn description(&self) -> Option<String> {
        describe(self.event_type, &self.data)
    }

    /// The event type and, when there is one, its description: `EV_EVENT_TAG Linux initrd`.
    pub fn label(&self) -> String {
        match self.description() {
            Some(d) => format!("{} {d}", self.event_type),
            None => self.event_type.to_string(),
        }
    }
}

/// A parsed event log: the Spec ID event and the events after it, in log order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventLog {
    spec_id: SpecId,
    events: Vec<Event>,
}

impl EventLog {
    /// Parses a crypto-agile log exactly (module documentation).
    pub fn parse(bytes: &[u8]) -> Result<Self, EventLogError> {
        if bytes.len() > MAX_EVENT_LOG_SIZE {
            return Err(EventLogError::TooLarge(bytes.len()));
        }
        let mut r = Reader { buf: bytes };
        let spec_id = parse_header(&mut r)?;
        let mut events = Vec::new();
        while !r.buf.is_empty() {
            let number = events.len() + 1;
            if number > MAX_EVENTS {
                return Err(EventLogError::TooManyEvents);
            }
            // Shorter than the fixed part of an event header: not an event at all.
            if r.buf.len() < 12 {
                return Err(EventLogError::TrailingBytes(r.buf.len()));
            }
            events.push(parse_event(&mut r, number, &spec_id)?);
        }
        Ok(Self { spec_id, events })
    }

    /// The Spec ID event.
    pub fn spec_id(&self) -> &SpecId {
        &self.spec_id
    }

    /// The events after the Spec ID event, in log order.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// The events extended into `pcr`, in order (`EV_NO_ACTION` events left out).
    pub fn extended(&self, pcr: PcrIndex) -> impl Iterator<Item = &Event> {
        self.events
            .iter()
            .filter(move |e| e.pcr == pcr && e.is_extended())
    }

    /// Recomputes the SHA-256 bank from the log with [`replay_pcr`]: every PCR starts at
    /// its value after `TPM2_Startup` ([`pcr_start`]: zero, PCR 0 at the
    /// [`startup locality`](Self::startup_locality)) and each event except `EV_NO_ACTION`
    /// extends its PCR: `PCR = SHA-256(PCR || digest)`.
    ///
    /// Returns the PCRs the log extends at least once; PCRs it never touches are not in the
    /// map (something after the firmware may have extended them). A log without the
    /// SHA-256 bank is refused ([`EventLogError::NoSha256`]).
    pub fn replay_sha256(&self) -> Result<BTreeMap<PcrIndex, [u8; 32]>, EventLogError> {
        let no_sha256 =
            || EventLogError::NoSha256(self.spec_id.algorithms.iter().map(|a| a.alg).collect());
        if !self.spec_id.algorithms.iter().any(|a| a.alg == ALG_SHA256) {
            return Err(no_sha256());
        }
        let mut digests: BTreeMap<PcrIndex, Vec<[u8; 32]>> = BTreeMap::new();
        for e in self.events.iter().filter(|e| e.is_extended()) {
            // Exactly the declared algorithms are in every event (checked when parsing).
            let digest = e.sha256().ok_or_else(no_sha256)?;
            digests.entry(e.pcr).or_default().push(digest);
        }
        let locality = self.startup_locality();
        Ok(digests
            .into_iter()
            .map(|(pcr, d)| (pcr, replay_pcr(pcr, locality, &d)))
            .collect())
    }

    /// The locality the firmware started the TPM from, as a `StartupLocality`
    /// `EV_NO_ACTION` event on PCR 0 records it (platforms with an H-CRTM start from
    /// locality 3 or 4); 0, the locality of every other platform, when the log has no such
    /// event. PCR 0 starts at this value ([`pcr_start`]).
    pub fn startup_locality(&self) -> u8 {
        self.events
            .iter()
            .find_map(|e| {
                if e.pcr.get() != 0 || e.event_type != EventType::NO_ACTION {
                    return None;
                }
                match e.data.split_first_chunk::<16>() {
                    Some((sig, [locality])) if sig == STARTUP_LOCALITY_SIGNATURE => Some(*locality),
                    _ => None,
                }
            })
            .unwrap_or(0)
    }
}

/// A little-endian cursor; every read is bounds-checked.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(
        &mut self,
        n: usize,
        event: usize,
        field: &'static str,
    ) -> Result<&'a [u8], EventLogError> {
        let (head, tail) = self
            .buf
            .split_at_checked(n)
            .ok_or(EventLogError::Truncated { event, field })?;
        self.buf = tail;
        Ok(head)
    }

    fn array<const N: usize>(
        &mut self,
        event: usize,
        field: &'static str,
    ) -> Result<[u8; N], EventLogError> {
        let (head, tail) = self
            .buf
            .split_first_chunk::<N>()
            .ok_or(EventLogError::Truncated { event, field })?;
        self.buf = tail;
        Ok(*head)
    }

    fn u8(&mut self, event: usize, field: &'static str) -> Result<u8, EventLogError> {
        Ok(u8::from_le_bytes(self.array(event, field)?))
    }

    fn u16(&mut self, event: usize, field: &'static str) -> Result<u16, EventLogError> {
        Ok(u16::from_le_bytes(self.array(event, field)?))
    }

    fn u32(&mut self, event: usize, field: &'static str) -> Result<u32, EventLogError> {
        Ok(u32::from_le_bytes(self.array(event, field)?))
    }

    /// A `u32` size, then that many bytes, at most `max`.
    fn sized(
        &mut self,
        event: usize,
        field: &'static str,
        max: usize,
    ) -> Result<&'a [u8], EventLogError> {
        let size = self.u32(event, field)?;
        let len = usize::try_from(size).unwrap_or(usize::MAX);
        if len > max {
            return Err(EventLogError::EventTooLarge { event, size });
        }
        self.take(len, event, field)
    }
}

/// The SHA-1-format first event and the Spec ID event inside it.
fn parse_header(r: &mut Reader<'_>) -> Result<SpecId, EventLogError> {
    let pcr = r.u32(0, "pcrIndex")?;
    let event_type = EventType(r.u32(0, "eventType")?);
    let digest: [u8; 20] = r.array(0, "digest")?;
    let data = r.sized(0, "event", MAX_EVENT_DATA)?;
    if pcr != 0 || event_type != EventType::NO_ACTION {
        return Err(EventLogError::SpecId("not an EV_NO_ACTION event on PCR 0"));
    }
    if digest != [0u8; 20] {
        return Err(EventLogError::SpecId("its digest is not zero"));
    }
    let mut s = Reader { buf: data };
    let signature: [u8; 16] = s.array(0, "signature")?;
    if &signature != SPEC_ID_SIGNATURE {
        return Err(EventLogError::SpecId(
            "no \"Spec ID Event03\" signature (not a crypto-agile log)",
        ));
    }
    let platform_class = s.u32(0, "platformClass")?;
    let minor = s.u8(0, "specVersionMinor")?;
    let major = s.u8(0, "specVersionMajor")?;
    let errata = s.u8(0, "specErrata")?;
    let uintn_size = s.u8(0, "uintnSize")?;
    let count = s.u32(0, "numberOfAlgorithms")?;
    if count == 0 {
        return Err(EventLogError::SpecId("it declares no algorithm"));
    }
    if usize::try_from(count).map_or(true, |c| c > MAX_ALGORITHMS) {
        return Err(EventLogError::SpecId("it declares more than 8 algorithms"));
    }
    let mut algorithms: Vec<AlgorithmSize> = Vec::new();
    for _ in 0..count {
        let alg = s.u16(0, "algorithmId")?;
        let size = s.u16(0, "digestSize")?;
        if algorithms.iter().any(|a| a.alg == alg) {
            return Err(EventLogError::DuplicateAlgorithm(alg));
        }
        match KNOWN_ALGORITHMS.iter().find(|(id, _, _)| *id == alg) {
            Some((_, _, want)) if *want != size => {
                return Err(EventLogError::DigestSize {
                    alg,
                    declared: size,
                    want: *want,
                });
            }
            _ if size == 0 || usize::from(size) > 64 => {
                return Err(EventLogError::SpecId(
                    "an algorithm is declared with a digest size outside 1..=64",
                ));
            }
            _ => {}
        }
        algorithms.push(AlgorithmSize { alg, size });
    }
    let vendor_size = s.u8(0, "vendorInfoSize")?;
    let vendor_info = s.take(usize::from(vendor_size), 0, "vendorInfo")?.to_vec();
    if !s.buf.is_empty() {
        return Err(EventLogError::SpecId("bytes follow its vendor information"));
    }
    Ok(SpecId {
        platform_class,
        spec_version: (major, minor, errata),
        uintn_size,
        algorithms,
        vendor_info,
    })
}

fn parse_event(r: &mut Reader<'_>, number: usize, spec: &SpecId) -> Result<Event, EventLogError> {
    let pcr_raw = r.u32(number, "pcrIndex")?;
    let pcr =
        u8::try_from(pcr_raw)
            .ok()
            .and_then(PcrIndex::new)
            .ok_or(EventLogError::PcrIndex {
                event: number,
                pcr: pcr_raw,
            })?;
    let event_type = EventType(r.u32(number, "eventType")?);
    let count = r.u32(number, "digests.count")?;
    if usize::try_from(count).ok() != Some(spec.algorithms.len()) {
        return Err(EventLogError::DigestCount {
            event: number,
            count,
            want: spec.algorithms.len(),
        });
    }
    let mut digests: Vec<(u16, Vec<u8>)> = Vec::with_capacity(spec.algorithms.len());
    for _ in 0..count {
        let alg = r.u16(number, "digests.hashAlg")?;
        let declared = spec
            .algorithms
            .iter()
            .find(|a| a.alg == alg)
            .ok_or(EventLogError::UndeclaredAlgorithm { event: number, alg })?;
        if digests.iter().any(|(a, _)| *a == alg) {
            return Err(EventLogError::RepeatedDigest { event: number, alg });
        }
        let digest = r.take(usize::from(declared.size), number, "digests.digest")?;
        digests.push((alg, digest.to_vec()));
    }
    let data = r.sized(number, "event", MAX_EVENT_DATA)?.to_vec();
    Ok(Event {
        number,
        pcr,
        event_type,
        digests,
        data,
    })
}

/// Longest description kept, in characters.
const MAX_DESCRIPTION: usize = 80;

/// `EFI_CERT_X509_GUID` (a5c059a1-94e4-4aa7-87b5-ab155c2bf072) as it is stored.
const CERT_X509_GUID: [u8; 16] = [
    0xa1, 0x59, 0xc0, 0xa5, 0xe4, 0x94, 0xa7, 0x4a, 0x87, 0xb5, 0xab, 0x15, 0x5c, 0x2b, 0xf0, 0x72,
];
/// `EFI_CERT_SHA256_GUID` (c1c41626-504c-4092-aca9-41f936934328) as it is stored.
const CERT_SHA256_GUID: [u8; 16] = [
    0x26, 0x16, 0xc4, 0xc1, 0x4c, 0x50, 0x92, 0x40, 0xac, 0xa9, 0x41, 0xf9, 0x36, 0x93, 0x43, 0x28,
];

/// The description of an event for people, from its type and data (see
/// [`Event::description`]). Never fails: data of an unexpected shape has no description.
fn describe(event_type: EventType, data: &[u8]) -> Option<String> {
    match event_type.0 {
        // EV_ACTION, EV_OMIT_BOOT_DEVICE_EVENTS, EV_NONHOST_INFO (a signature first),
        // EV_EFI_ACTION, EV_EFI_HCRTM_EVENT: an ASCII string.
        0x5 | 0x11 | 0x12 | 0x8000_0007 | 0x8000_0010 => ascii(data),
        // EV_POST_CODE, EV_S_CRTM_CONTENTS: a string, or the base and length of a blob.
        0x1 | 0x7 => ascii(data).or_else(|| blob(data)),
        // EV_IPL: a boot loader's string (GRUB's commands in ASCII, systemd-boot's UTF-16).
        0xd => match data {
            [c, 0, ..] if *c != 0 => utf16(data).filter(|s| !s.is_empty()),
            _ => ascii(data),
        },
        0x3 => no_action(data),
        0x4 => match data {
            [0, 0, 0, 0] => Some("separator".into()),
            [0xff, 0xff, 0xff, 0xff] => Some("error separator".into()),
            _ => None,
        },
        0x6 => tagged_event(data),
        // EV_S_CRTM_VERSION: a UTF-16 string.
        0x8 => utf16(data).filter(|s| !s.is_empty()),
        0x8000_0001 | 0x8000_0002 | 0x8000_000c | 0x8000_00e0 => {
            variable(event_type, data).map(|v| shorten(v.chars()))
        }
        // UEFI_IMAGE_LOAD_EVENT (boot application, boot or runtime driver).
        0x8000_0003..=0x8000_0005 => image(data),
        0x8000_0006 | 0x8000_000d => gpt(data).map(|g| shorten(g.chars())),
        // UEFI_PLATFORM_FIRMWARE_BLOB: base and length.
        0x8000_0008 => blob(data),
        // UEFI_HANDOFF_TABLE_POINTERS: a count of (GUID, address) pairs.
        0x8000_0009 => {
            let (count, rest) = data.split_first_chunk::<8>()?;
            let count = u64::from_le_bytes(*count);
            (usize::try_from(count).ok()?.checked_mul(24)? == rest.len()).then(|| match count {
                1 => "1 configuration table".to_owned(),
                n => format!("{n} configuration tables"),
            })
        }
        // UEFI_PLATFORM_FIRMWARE_BLOB2 and UEFI_HANDOFF_TABLE_POINTERS2: a sized ASCII
        // description first.
        0x8000_000a | 0x8000_000b => {
            let (len, rest) = data.split_first()?;
            ascii(rest.get(..usize::from(*len))?)
        }
        _ => None,
    }
}

/// `UEFI_PLATFORM_FIRMWARE_BLOB`: `0xe0000 bytes at 0x820000`.
fn blob(data: &[u8]) -> Option<String> {
    let (base, rest) = data.split_first_chunk::<8>()?;
    let len: [u8; 8] = rest.try_into().ok()?;
    Some(format!(
        "{:#x} bytes at {:#x}",
        u64::from_le_bytes(len),
        u64::from_le_bytes(*base)
    ))
}

/// `EV_NO_ACTION`: the signature of its structure (`Spec ID Event03`, `SP800-155 Event`),
/// and for `StartupLocality` the locality.
fn no_action(data: &[u8]) -> Option<String> {
    match data.split_first_chunk::<16>() {
        Some((sig, [locality])) if sig == STARTUP_LOCALITY_SIGNATURE => {
            Some(format!("StartupLocality {locality}"))
        }
        Some((sig, _)) => ascii(sig),
        None => None,
    }
}

/// `UEFI_VARIABLE_DATA`: the vendor GUID, the name length in characters, the data length,
/// the UTF-16 name, the data. The description is the name, and what the data says where
/// people read it: `SecureBoot on`, `db: 2 certificates`, `dbx: 77 SHA-256 hashes`,
/// `BootOrder 0001,0000`, `Boot0001 "UEFI Misc Device"`, and for `EV_EFI_VARIABLE_AUTHORITY`
/// the subject of the certificate that authorised an image (`db: Microsoft Windows
/// Production PCA 2011`).
fn variable(event_type: EventType, data: &[u8]) -> Option<String> {
    let (_guid, rest) = data.split_first_chunk::<16>()?;
    let (name_len, rest) = rest.split_first_chunk::<8>()?;
    let (data_len, rest) = rest.split_first_chunk::<8>()?;
    let chars = usize::try_from(u64::from_le_bytes(*name_len)).ok()?;
    let (name, value) = rest.split_at_checked(chars.checked_mul(2)?)?;
    let name = utf16(name)?;
    let detail = if event_type.0 == 0x8000_00e0 {
        // Shim logs the certificate with a data length that does not match; the
        // certificate's own encoding says where it ends.
        authority(value).map(|s| format!(": {s}"))
    } else if usize::try_from(u64::from_le_bytes(*data_len)).ok() == Some(value.len()) {
        variable_value(&name, value)
    } else {
        // A value cut short or padded: the name alone.
        None
    };
    Some(format!("{name}{}", detail.unwrap_or_default()))
}

/// What the value of a well-known variable says, after its name.
fn variable_value(name: &str, value: &[u8]) -> Option<String> {
    match name {
        "SecureBoot" | "DeployedMode" | "AuditMode" | "SetupMode" => match value {
            [0] => Some(" off".into()),
            [1] => Some(" on".into()),
            _ => None,
        },
        "PK" | "KEK" | "db" | "dbx" | "dbt" | "dbr" | "MokList" | "MokListX" | "SbatLevel" => {
            signature_lists(value).map(|s| format!(": {s}"))
        }
        "BootOrder" | "DriverOrder" => {
            let entries: Vec<String> = value
                .chunks_exact(2)
                .filter_map(|c| c.try_into().ok().map(u16::from_le_bytes))
                .map(|n| format!("{n:04X}"))
                .collect();
            let whole = value.len().is_multiple_of(2) && !entries.is_empty();
            whole.then(|| format!(" {}", entries.join(",")))
        }
        _ if is_load_option(name) => {
            // EFI_LOAD_OPTION: attributes, the device path's length, a UTF-16 description.
            let (_attributes, rest) = value.split_first_chunk::<6>()?;
            let text = utf16(rest)?;
            (!text.is_empty()).then(|| format!(" \"{text}\""))
        }
        _ => None,
    }
}

/// `Boot0001`, `Driver000A`, `SysPrep0002`: a load option.
fn is_load_option(name: &str) -> bool {
    ["Boot", "Driver", "SysPrep", "PlatformRecovery"]
        .iter()
        .any(|prefix| {
            name.strip_prefix(prefix).is_some_and(|n| {
                n.len() == 4
                    && n.chars()
                        .all(|c| c.is_ascii_hexdigit() && !c.is_lowercase())
            })
        })
}

/// A sequence of `EFI_SIGNATURE_LIST`s: `2 certificates`, `77 SHA-256 hashes`, `empty`.
fn signature_lists(mut value: &[u8]) -> Option<String> {
    if value.is_empty() {
        return Some("empty".into());
    }
    let (mut certificates, mut hashes, mut other) = (0u64, 0u64, 0u64);
    while !value.is_empty() {
        let (kind, rest) = value.split_first_chunk::<16>()?;
        let (list_size, rest) = rest.split_first_chunk::<4>()?;
        let (header_size, rest) = rest.split_first_chunk::<4>()?;
        let (entry_size, _) = rest.split_first_chunk::<4>()?;
        let list_size = usize::try_from(u32::from_le_bytes(*list_size)).ok()?;
        let header_size = usize::try_from(u32::from_le_bytes(*header_size)).ok()?;
        let entry_size = usize::try_from(u32::from_le_bytes(*entry_size)).ok()?;
        let entries = list_size.checked_sub(28)?.checked_sub(header_size)?;
        if entry_size == 0 || !entries.is_multiple_of(entry_size) {
            return None;
        }
        let n = u64::try_from(entries / entry_size).ok()?;
        match *kind {
            CERT_X509_GUID => certificates += n,
            CERT_SHA256_GUID => hashes += n,
            _ => other += n,
        }
        value = value.get(list_size..)?;
    }
    let parts: Vec<String> = [
        (certificates, "certificate", "certificates"),
        (hashes, "SHA-256 hash", "SHA-256 hashes"),
        (other, "other entry", "other entries"),
    ]
    .iter()
    .filter(|(n, _, _)| *n > 0)
    .map(|(n, one, many)| format!("{n} {}", if *n == 1 { one } else { many }))
    .collect();
    Some(if parts.is_empty() {
        "empty".into()
    } else {
        parts.join(", ")
    })
}

/// `EV_EFI_VARIABLE_AUTHORITY` data: the `EFI_SIGNATURE_DATA` (owner GUID, then the
/// certificate) that authorised an image, or the bare certificate (as shim logs it). The
/// description is the certificate's subject common name.
fn authority(value: &[u8]) -> Option<String> {
    use x509_parser::prelude::FromDer;
    let cert = [value.get(16..), Some(value)]
        .into_iter()
        .flatten()
        .find_map(|der| {
            x509_parser::certificate::X509Certificate::from_der(der)
                .ok()
                .map(|(_, c)| c)
        })?;
    let subject = cert.subject();
    let cn = subject.iter_common_name().next()?.as_str().ok()?;
    (!cn.is_empty() && !cn.chars().any(char::is_control)).then(|| cn.to_owned())
}

/// `UEFI_IMAGE_LOAD_EVENT`: the image's location and length in memory, its link-time
/// address, the length of its device path and the path. The description is the file path
/// the path ends in, if any, and the image's size: `\EFI\BOOT\BOOTX64.EFI, image of
/// 0x120af8 bytes`.
fn image(data: &[u8]) -> Option<String> {
    let (_location, rest) = data.split_first_chunk::<8>()?;
    let (len, rest) = rest.split_first_chunk::<8>()?;
    let size = format!("image of {:#x} bytes", u64::from_le_bytes(*len));
    let path = rest
        .split_first_chunk::<16>()
        .and_then(|(link_and_len, path)| {
            let (_, path_len) = link_and_len.split_first_chunk::<8>()?;
            let path_len = usize::try_from(u64::from_le_bytes(path_len.try_into().ok()?)).ok()?;
            file_path(path.get(..path_len)?)
        });
    Some(match path {
        Some(p) => format!("{p}, {size}"),
        None => size,
    })
}

/// The file path nodes (media, file path) of a UEFI device path, joined: `\EFI\BOOT\X.EFI`.
fn file_path(mut path: &[u8]) -> Option<String> {
    let mut out = String::new();
    while let Some((&[kind, subtype, l0, l1], rest)) = path.split_first_chunk::<4>() {
        let len = usize::from(u16::from_le_bytes([l0, l1]));
        // The end node, or a malformed one: stop.
        if kind == 0x7f || len < 4 {
            break;
        }
        let body = rest.get(..len - 4)?;
        if (kind, subtype) == (4, 4) {
            out.push_str(&utf16(body)?);
        }
        path = rest.get(len - 4..)?;
    }
    (!out.is_empty()).then_some(out)
}

/// `UEFI_GPT_DATA`: the partition table header (92 bytes), the number of partitions and
/// the partition entries. The description counts them and names those with a name:
/// `GPT, 3 partitions: EFI System, root, home`.
fn gpt(data: &[u8]) -> Option<String> {
    let (header, rest) = data.split_first_chunk::<92>()?;
    if !header.starts_with(b"EFI PART") {
        return None;
    }
    let entry_size: [u8; 4] = header.get(84..88)?.try_into().ok()?;
    let entry_size = usize::try_from(u32::from_le_bytes(entry_size)).ok()?;
    let (count, entries) = rest.split_first_chunk::<8>()?;
    let count = u64::from_le_bytes(*count);
    if entry_size < 128
        || Some(entries.len()) != usize::try_from(count).ok()?.checked_mul(entry_size)
    {
        return None;
    }
    let names: Vec<String> = entries
        .chunks_exact(entry_size)
        .filter_map(|e| utf16(e.get(56..128)?))
        .filter(|n| !n.is_empty())
        .collect();
    let plural = if count == 1 { "" } else { "s" };
    Some(if names.is_empty() {
        format!("GPT, {count} partition{plural}")
    } else {
        format!("GPT, {count} partition{plural}: {}", names.join(", "))
    })
}

/// `TCG_PCClientTaggedEvent`: an ID, a size and that much data.
fn tagged_event(data: &[u8]) -> Option<String> {
    let (id, rest) = data.split_first_chunk::<4>()?;
    let (size, tag_data) = rest.split_first_chunk::<4>()?;
    let id = u32::from_le_bytes(*id);
    if usize::try_from(u32::from_le_bytes(*size)).ok() != Some(tag_data.len()) {
        return None;
    }
    match id {
        LINUX_INITRD_TAG => Some("Linux initrd".into()),
        LINUX_LOAD_OPTIONS_TAG => Some("Linux command line".into()),
        _ => Some(ascii(tag_data).unwrap_or_else(|| format!("tag {id:#010x}"))),
    }
}

/// Printable ASCII up to the first NUL, each run of white space (a GRUB command's newlines)
/// made one space, shortened; `None` when empty or not printable.
fn ascii(data: &[u8]) -> Option<String> {
    let text = data.split(|b| *b == 0).next()?;
    if text.is_empty()
        || !text
            .iter()
            .all(|b| b.is_ascii_graphic() || b.is_ascii_whitespace())
    {
        return None;
    }
    let words: Vec<&[u8]> = text
        .split(u8::is_ascii_whitespace)
        .filter(|w| !w.is_empty())
        .collect();
    let joined = words.join(&b' ');
    if joined.is_empty() {
        return None;
    }
    Some(shorten(joined.iter().map(|b| char::from(*b))))
}

/// UTF-16LE up to the first NUL, shortened; `None` when not valid or not printable.
fn utf16(data: &[u8]) -> Option<String> {
    let units: Vec<u16> = data
        .chunks_exact(2)
        .filter_map(|c| c.try_into().ok().map(u16::from_le_bytes))
        .take_while(|u| *u != 0)
        .collect();
    let text = String::from_utf16(&units).ok()?;
    if text.chars().any(char::is_control) {
        return None;
    }
    Some(shorten(text.chars()))
}

fn shorten(chars: impl Iterator<Item = char>) -> String {
    let mut s: String = chars.take(MAX_DESCRIPTION + 1).collect();
    if s.chars().count() > MAX_DESCRIPTION {
        s = s.chars().take(MAX_DESCRIPTION).collect();
        s.push('…');
    }
    s
}

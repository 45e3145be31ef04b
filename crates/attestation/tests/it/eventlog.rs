//! The TCG event log: exact parsing of a real log captured from a measured boot (and of
//! logs built here), its replay against the quoted PCRs, and the naming of the event that
//! makes a PCR differ. Every refusal is asserted on its own reason.

use crate::common::*;
use asterism_attestation::explain::Outcome;
use asterism_attestation::tpm::eventlog::{
    ALG_SHA256, EventLog, EventLogError, EventType, MAX_EVENT_DATA, MAX_EVENT_LOG_SIZE, MAX_EVENTS,
    extend,
};
use asterism_attestation::tpm::{AkTrust, TpmQuoteValidator};
use asterism_attestation::{
    ExpectedPcr, Issuer, Measurements, MeasurementsError, PcrIndex, ReferenceEvent, ReportData,
    Role, ValidationError, Validator,
};
use asterism_soft_tpm::SoftTpm;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// The log of a QEMU/OVMF boot of the Debian cloud kernel (tests/data/eventlog/README.md).
const OVMF_LOG: &[u8] = include_bytes!("../data/eventlog/ovmf-q35-linux-6.1.bin");
/// The SHA-256 PCRs that guest read after that boot.
const OVMF_PCRS: &str = include_str!("../data/eventlog/ovmf-q35-linux-6.1.pcrs");
/// The log of a Google Compute Engine VM booting Container-Optimized OS with Secure Boot
/// (tests/data/eventlog/README.md).
const GCE_LOG: &[u8] = include_bytes!("../data/eventlog/gce-cos-85-amd-sev.bin");

fn recorded_pcrs() -> BTreeMap<PcrIndex, [u8; 32]> {
    OVMF_PCRS
        .lines()
        .map(|l| {
            let (i, v) = l.split_once(' ').unwrap();
            let v: [u8; 32] = hex::decode(v).unwrap().try_into().unwrap();
            (idx(i.parse().unwrap()), v)
        })
        .collect()
}

fn rd() -> ReportData {
    ReportData::atls(Role::Client, &[0x33; 32])
}

// ---------------------------------------------------------------- logs built here

const SHA1: u16 = 0x0004;

/// The SHA-1-format first event with a Spec ID event declaring `algs`.
fn header(algs: &[(u16, u16)]) -> Vec<u8> {
    let mut spec = b"Spec ID Event03\0".to_vec();
    spec.extend_from_slice(&0u32.to_le_bytes()); // platform class
    spec.extend_from_slice(&[0, 2, 0, 2]); // version 2.0, errata 0, 64-bit UINTN
    spec.extend_from_slice(&u32::try_from(algs.len()).unwrap().to_le_bytes());
    for (alg, size) in algs {
        spec.extend_from_slice(&alg.to_le_bytes());
        spec.extend_from_slice(&size.to_le_bytes());
    }
    spec.push(0); // no vendor information
    let mut out = 0u32.to_le_bytes().to_vec();
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&[0; 20]);
    out.extend_from_slice(&u32::try_from(spec.len()).unwrap().to_le_bytes());
    out.extend_from_slice(&spec);
    out
}

/// A `TCG_PCR_EVENT2` with the given digests.
fn event(pcr: u32, event_type: u32, digests: &[(u16, Vec<u8>)], data: &[u8]) -> Vec<u8> {
    let mut out = pcr.to_le_bytes().to_vec();
    out.extend_from_slice(&event_type.to_le_bytes());
    out.extend_from_slice(&u32::try_from(digests.len()).unwrap().to_le_bytes());
    for (alg, d) in digests {
        out.extend_from_slice(&alg.to_le_bytes());
        out.extend_from_slice(d);
    }
    out.extend_from_slice(&u32::try_from(data.len()).unwrap().to_le_bytes());
    out.extend_from_slice(data);
    out
}

/// A SHA-256-only event whose digest is the SHA-256 of its data.
fn sha256_event(pcr: u32, event_type: u32, data: &[u8]) -> Vec<u8> {
    event(
        pcr,
        event_type,
        &[(ALG_SHA256, Sha256::digest(data).to_vec())],
        data,
    )
}

fn sha256_log(events: &[Vec<u8>]) -> Vec<u8> {
    let mut log = header(&[(ALG_SHA256, 32)]);
    for e in events {
        log.extend_from_slice(e);
    }
    log
}

// ---------------------------------------------------------------- the real log

#[test]
fn a_real_log_parses_and_replays_to_the_pcrs_its_boot_recorded() {
    let log = EventLog::parse(OVMF_LOG).unwrap();
    let algs: Vec<(u16, u16)> = log
        .spec_id()
        .algorithms
        .iter()
        .map(|a| (a.alg, a.size))
        .collect();
    assert_eq!(
        algs,
        [(SHA1, 20), (ALG_SHA256, 32), (0x000c, 48), (0x000d, 64)]
    );
    assert_eq!(log.events().len(), 24);

    let replayed = log.replay_sha256().unwrap();
    let recorded = recorded_pcrs();
    let covered: Vec<u8> = replayed.keys().map(|i| i.get()).collect();
    // PCR 8 is untouched and PCR 10 is IMA's: neither is in the firmware's log.
    assert_eq!(covered, [0, 1, 2, 3, 4, 5, 6, 7, 9]);
    for (i, v) in &replayed {
        assert_eq!(v, &recorded[i], "PCR {i}");
    }
}

#[test]
fn the_events_of_a_real_log_have_names_for_people() {
    let log = EventLog::parse(OVMF_LOG).unwrap();
    let pcr9: Vec<String> = log.extended(idx(9)).map(|e| e.label()).collect();
    assert_eq!(
        pcr9,
        [
            "EV_EVENT_TAG Linux command line",
            "EV_EVENT_TAG Linux initrd"
        ]
    );
    let labels: Vec<String> = log.events().iter().map(|e| e.label()).collect();
    for want in [
        "EV_S_CRTM_VERSION",
        "EV_EFI_PLATFORM_FIRMWARE_BLOB 0xe0000 bytes at 0x820000",
        "EV_EFI_VARIABLE_DRIVER_CONFIG SecureBoot off",
        "EV_EFI_VARIABLE_DRIVER_CONFIG PK: empty",
        "EV_EFI_VARIABLE_DRIVER_CONFIG dbx: empty",
        "EV_EFI_VARIABLE_BOOT BootOrder 0000",
        "EV_EFI_VARIABLE_BOOT Boot0000 \"UiApp\"",
        // The kernel, booted with QEMU's -kernel: 0xd877c0 is the size of its vmlinuz.
        "EV_EFI_BOOT_SERVICES_APPLICATION kernel, image of 0xd877c0 bytes",
        "EV_EFI_ACTION Calling EFI Application from Boot Option",
        "EV_EFI_ACTION Exit Boot Services Invocation",
        "EV_SEPARATOR separator",
    ] {
        assert!(
            labels.iter().any(|l| l == want),
            "{want:?} not in {labels:#?}"
        );
    }
    assert_eq!(
        EventType(0x8000_00e0).to_string(),
        "EV_EFI_VARIABLE_AUTHORITY"
    );
    assert_eq!(EventType(0x1234).to_string(), "event type 0x00001234");
}

#[test]
fn the_events_of_a_real_secure_boot_log_have_names_for_people() {
    let log = EventLog::parse(GCE_LOG).unwrap();
    // SHA-1, SHA-256 and SHA-384 banks; the largest event is its 4499-byte dbx.
    assert_eq!(log.spec_id().algorithms.len(), 3);
    assert_eq!(log.events().len(), 45);
    assert!(log.events().iter().any(|e| e.data.len() == 4499));
    assert_eq!(log.startup_locality(), 0);
    let replayed = log.replay_sha256().unwrap();
    let covered: Vec<u8> = replayed.keys().map(|i| i.get()).collect();
    assert_eq!(covered, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);

    let labels: Vec<String> = log.events().iter().map(|e| e.label()).collect();
    for want in [
        "EV_S_CRTM_VERSION GCE Virtual Firmware v1",
        "EV_NONHOST_INFO GCE NonHostInfo",
        "EV_EFI_VARIABLE_DRIVER_CONFIG SecureBoot on",
        "EV_EFI_VARIABLE_DRIVER_CONFIG PK: 1 certificate",
        "EV_EFI_VARIABLE_DRIVER_CONFIG KEK: 1 certificate",
        "EV_EFI_VARIABLE_DRIVER_CONFIG db: 1 certificate",
        "EV_EFI_VARIABLE_DRIVER_CONFIG dbx: 4 certificates",
        "EV_EFI_VARIABLE_BOOT BootOrder 0000,0001",
        "EV_EFI_VARIABLE_BOOT Boot0001 \"UEFI nvme_card-pd\"",
        // The certificate in db that let the firmware run shim.
        "EV_EFI_VARIABLE_AUTHORITY db: UEFI DB Key v10",
        "EV_EFI_GPT_EVENT GPT, 12 partitions: STATE, KERN-A, ROOT-A, KERN-B, ROOT-B, KERN-C, \
         ROOT-C, OEM, …",
        "EV_EFI_BOOT_SERVICES_APPLICATION \\EFI\\BOOT\\BOOTX64.EFI, image of 0x120af8 bytes",
        "EV_EFI_ACTION Calling EFI Application from Boot Option",
        "EV_SEPARATOR separator",
        "EV_IPL grub_cmd: set default=2",
        // GRUB's multi-line commands on one line.
        "EV_IPL grub_cmd: menuentry local image A { linux /syslinux/vmlinuz.A \
         init=/usr/lib/syst…",
        "EV_EFI_ACTION Exit Boot Services Returned with Success",
    ] {
        assert!(
            labels.iter().any(|l| l == want),
            "{want:?} not in {labels:#?}"
        );
    }
    // Shim logs its certificate with a data length that does not match; still named.
    assert_eq!(
        labels
            .iter()
            .filter(|l| *l == "EV_EFI_VARIABLE_AUTHORITY db: UEFI DB Key v10")
            .count(),
        3
    );
}

/// `UEFI_VARIABLE_DATA` of `name` holding `value`.
fn variable_data(name: &str, value: &[u8]) -> Vec<u8> {
    let name: Vec<u8> = name.encode_utf16().flat_map(u16::to_le_bytes).collect();
    let mut out = vec![0x61; 16];
    out.extend_from_slice(&u64::try_from(name.len() / 2).unwrap().to_le_bytes());
    out.extend_from_slice(&u64::try_from(value.len()).unwrap().to_le_bytes());
    out.extend_from_slice(&name);
    out.extend_from_slice(value);
    out
}

#[test]
fn events_real_logs_carry_are_named_from_their_data() {
    let label = |event_type: u32, data: &[u8]| {
        let log = sha256_log(&[sha256_event(1, event_type, data)]);
        EventLog::parse(&log).unwrap().events()[0].label()
    };
    // A dbx of SHA-256 hashes: one EFI_SIGNATURE_LIST of three 48-byte entries.
    let mut dbx = vec![
        0x26, 0x16, 0xc4, 0xc1, 0x4c, 0x50, 0x92, 0x40, 0xac, 0xa9, 0x41, 0xf9, 0x36, 0x93, 0x43,
        0x28,
    ];
    dbx.extend_from_slice(&(28u32 + 3 * 48).to_le_bytes());
    dbx.extend_from_slice(&0u32.to_le_bytes());
    dbx.extend_from_slice(&48u32.to_le_bytes());
    dbx.extend_from_slice(&[0; 3 * 48]);
    assert_eq!(
        label(0x8000_0001, &variable_data("dbx", &dbx)),
        "EV_EFI_VARIABLE_DRIVER_CONFIG dbx: 3 SHA-256 hashes"
    );
    // A list whose size does not add up: the name alone.
    dbx[16] += 1;
    assert_eq!(
        label(0x8000_0001, &variable_data("dbx", &dbx)),
        "EV_EFI_VARIABLE_DRIVER_CONFIG dbx"
    );
    let mut boot = 1u32.to_le_bytes().to_vec();
    boot.extend_from_slice(&0u16.to_le_bytes());
    boot.extend("debian\0".encode_utf16().flat_map(u16::to_le_bytes));
    assert_eq!(
        label(0x8000_0002, &variable_data("Boot0003", &boot)),
        "EV_EFI_VARIABLE_BOOT Boot0003 \"debian\""
    );
    assert_eq!(
        label(3, &startup_locality_data(3)),
        "EV_NO_ACTION StartupLocality 3"
    );
    let mut other = b"StartupLocalitx\0".to_vec();
    other.push(3);
    assert_eq!(label(3, &other), "EV_NO_ACTION StartupLocalitx");
    assert_eq!(label(4, &[0xff; 4]), "EV_SEPARATOR error separator");
    assert_eq!(
        label(5, b"Start Option ROM Scan"),
        "EV_ACTION Start Option ROM Scan"
    );
    // systemd-boot logs UTF-16 strings as EV_IPL.
    let utf16: Vec<u8> = "initrd=\\initrd.img\0"
        .encode_utf16()
        .flat_map(u16::to_le_bytes)
        .collect();
    assert_eq!(label(0xd, &utf16), "EV_IPL initrd=\\initrd.img");
    let mut tables = 1u64.to_le_bytes().to_vec();
    tables.extend_from_slice(&[0; 24]);
    assert_eq!(
        label(0x8000_0009, &tables),
        "EV_EFI_HANDOFF_TABLES 1 configuration table"
    );
    // Data of an unexpected shape has no description, only its type.
    assert_eq!(label(0x8000_0006, b"not a GPT"), "EV_EFI_GPT_EVENT");
    assert_eq!(
        label(0x8000_0001, &[0; 10]),
        "EV_EFI_VARIABLE_DRIVER_CONFIG"
    );
}

#[test]
fn a_truncated_real_log_is_refused_at_the_event_it_cuts() {
    let last = EventLog::parse(OVMF_LOG).unwrap().events().len();
    assert_eq!(
        EventLog::parse(&OVMF_LOG[..OVMF_LOG.len() - 1]),
        Err(EventLogError::Truncated {
            event: last,
            field: "event"
        })
    );
    // Every cut either ends on an event boundary (a shorter, valid log) or is refused.
    let mut refused = 0;
    for n in 0..OVMF_LOG.len() {
        if EventLog::parse(&OVMF_LOG[..n]).is_err() {
            refused += 1;
        }
    }
    assert!(refused > OVMF_LOG.len() - 30, "{refused}");
    assert!(matches!(
        EventLog::parse(&OVMF_LOG[..10]),
        Err(EventLogError::Truncated { event: 0, .. })
    ));
}

#[test]
fn trailing_bytes_after_the_last_event_are_refused() {
    let mut log = OVMF_LOG.to_vec();
    log.extend_from_slice(&[0, 0, 0]);
    assert_eq!(EventLog::parse(&log), Err(EventLogError::TrailingBytes(3)));
}

// ---------------------------------------------------------------- limits and shapes

#[test]
fn an_oversized_log_is_refused_before_parsing() {
    let mut log = sha256_log(&[sha256_event(0, 8, b"v")]);
    log.resize(MAX_EVENT_LOG_SIZE + 1, 0);
    assert_eq!(
        EventLog::parse(&log),
        Err(EventLogError::TooLarge(MAX_EVENT_LOG_SIZE + 1))
    );
}

#[test]
fn too_many_events_and_too_much_event_data_are_refused() {
    let one = sha256_event(4, 0x8000_0003, b"");
    let at_limit = sha256_log(&vec![one.clone(); MAX_EVENTS]);
    assert_eq!(
        EventLog::parse(&at_limit).unwrap().events().len(),
        MAX_EVENTS
    );
    let over = sha256_log(&vec![one; MAX_EVENTS + 1]);
    assert_eq!(EventLog::parse(&over), Err(EventLogError::TooManyEvents));

    let big = sha256_log(&[sha256_event(4, 0x8000_0003, &vec![0; MAX_EVENT_DATA])]);
    assert!(EventLog::parse(&big).is_ok());
    let bigger = sha256_log(&[sha256_event(4, 0x8000_0003, &vec![0; MAX_EVENT_DATA + 1])]);
    assert_eq!(
        EventLog::parse(&bigger),
        Err(EventLogError::EventTooLarge {
            event: 1,
            size: u32::try_from(MAX_EVENT_DATA + 1).unwrap()
        })
    );
}

// The caps at their exact boundaries, written as numbers rather than the crate's constants,
// so that a cap computed wrongly (`128 + 1024` for `128 * 1024`) or compared with `>=` for
// `>` fails here.

/// A SHA-256 log of exactly `size` bytes: events of the largest data allowed, the last one
/// shortened to fit.
fn log_of_size(size: usize) -> Vec<u8> {
    const OVERHEAD: usize = 4 + 4 + 4 + 2 + 32 + 4; // an event's header and one digest
    let mut log = sha256_log(&[]);
    while size - log.len() - OVERHEAD > 131_072 {
        log.extend_from_slice(&sha256_event(4, 0x8000_0003, &[0x5a; 131_072]));
    }
    let rest = size - log.len() - OVERHEAD;
    log.extend_from_slice(&sha256_event(4, 0x8000_0003, &vec![0x5a; rest]));
    assert_eq!(log.len(), size);
    log
}

#[test]
fn a_log_of_exactly_one_mib_parses_and_one_byte_more_is_refused() {
    assert_eq!(MAX_EVENT_LOG_SIZE, 1_048_576);
    let at_cap = log_of_size(1_048_576);
    assert_eq!(EventLog::parse(&at_cap).unwrap().events().len(), 8);
    let over = log_of_size(1_048_577);
    assert_eq!(
        EventLog::parse(&over),
        Err(EventLogError::TooLarge(1_048_577))
    );
}

#[test]
fn an_event_of_exactly_128_kib_of_data_parses_and_one_byte_more_is_refused() {
    assert_eq!(MAX_EVENT_DATA, 131_072);
    let at_cap = sha256_log(&[sha256_event(7, 0x8000_0001, &[1; 131_072])]);
    assert_eq!(
        EventLog::parse(&at_cap).unwrap().events()[0].data.len(),
        131_072
    );
    let over = sha256_log(&[sha256_event(7, 0x8000_0001, &[1; 131_073])]);
    assert_eq!(
        EventLog::parse(&over),
        Err(EventLogError::EventTooLarge {
            event: 1,
            size: 131_073
        })
    );
    // The Spec ID event is held to the same cap.
    let mut header = header(&[(ALG_SHA256, 32)]);
    header[28..32].copy_from_slice(&131_073u32.to_le_bytes());
    assert_eq!(
        EventLog::parse(&header),
        Err(EventLogError::EventTooLarge {
            event: 0,
            size: 131_073
        })
    );
}

#[test]
fn fewer_than_twelve_trailing_bytes_are_not_an_event_and_twelve_are_a_truncated_one() {
    let one = sha256_event(4, 0x8000_0003, b"x");
    // 11 bytes cannot hold an event's PCR index, type and digest count.
    let mut eleven = sha256_log(std::slice::from_ref(&one));
    eleven.extend_from_slice(&one[..11]);
    assert_eq!(
        EventLog::parse(&eleven),
        Err(EventLogError::TrailingBytes(11))
    );
    // 12 bytes can: they are read as the start of an event, cut before its first digest.
    let mut twelve = sha256_log(std::slice::from_ref(&one));
    twelve.extend_from_slice(&one[..12]);
    assert_eq!(
        EventLog::parse(&twelve),
        Err(EventLogError::Truncated {
            event: 2,
            field: "digests.hashAlg"
        })
    );
}

#[test]
fn the_spec_id_event_declares_one_to_eight_algorithms_of_one_to_64_bytes() {
    const SHA384: u16 = 0x000c;
    let eight = [
        (SHA1, 20),
        (ALG_SHA256, 32),
        (SHA384, 48),
        (0x000d, 64),
        (0x0012, 32),
        (0x0027, 32),
        (0x1234, 1),
        (0x1235, 64),
    ];
    let parsed = EventLog::parse(&header(&eight)).unwrap();
    assert_eq!(parsed.spec_id().algorithms.len(), 8);
    let mut nine = eight.to_vec();
    nine.push((0x1236, 16));
    assert_eq!(
        EventLog::parse(&header(&nine)),
        Err(EventLogError::SpecId("it declares more than 8 algorithms"))
    );
    assert_eq!(
        EventLog::parse(&header(&[])),
        Err(EventLogError::SpecId("it declares no algorithm"))
    );
    let size = |s: u16| EventLog::parse(&header(&[(ALG_SHA256, 32), (0x1234, s)])).map(|_| ());
    assert_eq!(size(64), Ok(()));
    assert_eq!(size(1), Ok(()));
    for bad in [0, 65] {
        assert_eq!(
            size(bad),
            Err(EventLogError::SpecId(
                "an algorithm is declared with a digest size outside 1..=64"
            )),
            "{bad}"
        );
    }
}

#[test]
fn a_known_algorithm_declared_with_another_digest_size_is_refused() {
    let mut log = header(&[(ALG_SHA256, 20)]);
    log.extend_from_slice(&event(0, 8, &[(ALG_SHA256, vec![0; 20])], b""));
    assert_eq!(
        EventLog::parse(&log),
        Err(EventLogError::DigestSize {
            alg: ALG_SHA256,
            declared: 20,
            want: 32
        })
    );
    let twice = header(&[(ALG_SHA256, 32), (ALG_SHA256, 32)]);
    assert_eq!(
        EventLog::parse(&twice),
        Err(EventLogError::DuplicateAlgorithm(ALG_SHA256))
    );
}

#[test]
fn an_unknown_algorithm_is_read_only_when_declared_with_a_size() {
    const VENDOR: u16 = 0x1234;
    let digests = vec![
        (ALG_SHA256, Sha256::digest(b"x").to_vec()),
        (VENDOR, vec![7; 16]),
    ];
    let mut log = header(&[(ALG_SHA256, 32), (VENDOR, 16)]);
    log.extend_from_slice(&event(4, 0x8000_0003, &digests, b"x"));
    let parsed = EventLog::parse(&log).unwrap();
    assert_eq!(parsed.events()[0].digest(VENDOR), Some(&[7u8; 16][..]));

    // The same event in a log that declares only SHA-256: the vendor digest's size is
    // unknown, so it is refused rather than guessed.
    let mut undeclared = header(&[(ALG_SHA256, 32)]);
    undeclared.extend_from_slice(&event(4, 0x8000_0003, &[(VENDOR, vec![7; 16])], b"x"));
    assert_eq!(
        EventLog::parse(&undeclared),
        Err(EventLogError::UndeclaredAlgorithm {
            event: 1,
            alg: VENDOR
        })
    );
}

#[test]
fn events_must_carry_each_declared_algorithm_once() {
    let mut log = header(&[(SHA1, 20), (ALG_SHA256, 32)]);
    log.extend_from_slice(&event(4, 3, &[(ALG_SHA256, vec![0; 32])], b""));
    assert_eq!(
        EventLog::parse(&log),
        Err(EventLogError::DigestCount {
            event: 1,
            count: 1,
            want: 2
        })
    );
    let mut log = header(&[(SHA1, 20), (ALG_SHA256, 32)]);
    log.extend_from_slice(&event(
        4,
        3,
        &[(ALG_SHA256, vec![0; 32]), (ALG_SHA256, vec![0; 32])],
        b"",
    ));
    assert_eq!(
        EventLog::parse(&log),
        Err(EventLogError::RepeatedDigest {
            event: 1,
            alg: ALG_SHA256
        })
    );
}

#[test]
fn a_pcr_index_outside_the_pc_client_range_is_refused() {
    let log = sha256_log(&[sha256_event(24, 8, b"v")]);
    assert_eq!(
        EventLog::parse(&log),
        Err(EventLogError::PcrIndex { event: 1, pcr: 24 })
    );
}

#[test]
fn a_log_without_the_spec_id_event_is_refused() {
    // A SHA-1-only (pre crypto-agile) log starts with an ordinary event.
    let mut old = header(&[(ALG_SHA256, 32)]);
    old[4] = 8; // EV_S_CRTM_VERSION instead of EV_NO_ACTION
    assert!(matches!(
        EventLog::parse(&old),
        Err(EventLogError::SpecId(_))
    ));
    let mut unsigned = header(&[(ALG_SHA256, 32)]);
    unsigned[32] = b'X'; // the signature's first byte
    assert!(matches!(
        EventLog::parse(&unsigned),
        Err(EventLogError::SpecId(m)) if m.contains("Spec ID Event03")
    ));
    // A log without SHA-256 parses, but cannot be replayed against a SHA-256 quote.
    let mut sha1_only = header(&[(SHA1, 20)]);
    sha1_only.extend_from_slice(&event(0, 8, &[(SHA1, vec![1; 20])], b""));
    let parsed = EventLog::parse(&sha1_only).unwrap();
    assert_eq!(
        parsed.replay_sha256(),
        Err(EventLogError::NoSha256(vec![SHA1]))
    );
}

#[test]
fn replay_starts_pcr0_at_the_startup_locality_and_skips_no_action_events() {
    let mut locality = b"StartupLocality\0".to_vec();
    locality.push(3);
    let log = sha256_log(&[
        event(0, 3, &[(ALG_SHA256, vec![0; 32])], &locality),
        sha256_event(0, 8, b"crtm"),
        // EV_NO_ACTION with a non-zero digest: still not extended.
        event(1, 3, &[(ALG_SHA256, vec![9; 32])], b"note"),
        sha256_event(1, 0x8000_0002, b"boot"),
    ]);
    let replayed = EventLog::parse(&log).unwrap().replay_sha256().unwrap();
    let mut start = [0u8; 32];
    start[31] = 3;
    let crtm: [u8; 32] = Sha256::digest(b"crtm").into();
    let boot: [u8; 32] = Sha256::digest(b"boot").into();
    assert_eq!(replayed[&idx(0)], extend(&start, &crtm));
    assert_eq!(replayed[&idx(1)], extend(&[0; 32], &boot));
}

// ---------------------------------------------------------------- H-CRTM: PCR 0 at the locality

/// The data of a `StartupLocality` `EV_NO_ACTION` event.
fn startup_locality_data(locality: u8) -> Vec<u8> {
    let mut data = b"StartupLocality\0".to_vec();
    data.push(locality);
    data
}

/// An event carrying the SHA-1 and the SHA-256 digest of its data, as firmware that keeps
/// both banks logs it.
fn dual_event(pcr: u32, event_type: u32, data: &[u8]) -> Vec<u8> {
    let sha1 = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, data);
    event(
        pcr,
        event_type,
        &[
            (SHA1, sha1.as_ref().to_vec()),
            (ALG_SHA256, Sha256::digest(data).to_vec()),
        ],
        data,
    )
}

/// The log of a server whose H-CRTM starts the TPM from locality 3 (when `locality` is
/// `Some(3)`): SHA-1 and SHA-256 banks, the `StartupLocality` event first, then the CRTM
/// version, a firmware volume and the separator in PCR 0, and Secure Boot in PCR 7. With
/// `None` the same boot without the event (a platform that starts from locality 0).
fn h_crtm_log(locality: Option<u8>) -> Vec<u8> {
    let mut log = header(&[(SHA1, 20), (ALG_SHA256, 32)]);
    if let Some(l) = locality {
        log.extend_from_slice(&event(
            0,
            3,
            &[(SHA1, vec![0; 20]), (ALG_SHA256, vec![0; 32])],
            &startup_locality_data(l),
        ));
    }
    let mut blob = 0xffc0_0000u64.to_le_bytes().to_vec();
    blob.extend_from_slice(&0x40_0000u64.to_le_bytes());
    for e in [
        dual_event(
            0,
            0x8,
            "Server Firmware 1.0\0"
                .encode_utf16()
                .flat_map(u16::to_le_bytes)
                .collect::<Vec<u8>>()
                .as_slice(),
        ),
        dual_event(0, 0x8000_0008, &blob),
        dual_event(0, 0x4, &[0; 4]),
        dual_event(7, 0x8000_0001, b"secure boot"),
    ] {
        log.extend_from_slice(&e);
    }
    log
}

#[test]
fn an_h_crtm_log_replays_pcr0_from_its_startup_locality() {
    let log = EventLog::parse(&h_crtm_log(Some(3))).unwrap();
    assert_eq!(log.startup_locality(), 3);
    let digests: Vec<[u8; 32]> = log.extended(idx(0)).map(|e| e.sha256().unwrap()).collect();
    assert_eq!(digests.len(), 3);
    let mut start = [0u8; 32];
    start[31] = 3;
    let by_hand = digests.iter().fold(start, |pcr, d| extend(&pcr, d));
    let replayed = log.replay_sha256().unwrap();
    assert_eq!(replayed[&idx(0)], by_hand);
    // Only PCR 0 starts at the locality.
    let seven: [u8; 32] = Sha256::digest(b"secure boot").into();
    assert_eq!(replayed[&idx(7)], extend(&[0; 32], &seven));
    // The same events from locality 0 give another PCR 0.
    let plain = EventLog::parse(&h_crtm_log(None)).unwrap();
    assert_eq!(plain.startup_locality(), 0);
    assert_ne!(plain.replay_sha256().unwrap()[&idx(0)], by_hand);
    assert_eq!(plain.replay_sha256().unwrap()[&idx(7)], replayed[&idx(7)]);
}

#[test]
fn only_a_startup_locality_event_on_pcr0_moves_the_start_of_pcr0() {
    // The signature decides: 17 bytes of another EV_NO_ACTION event on PCR 0 are not a
    // locality (guards the signature comparison).
    let mut other = b"StartupLocalitx\0".to_vec();
    other.push(3);
    // The event must be on PCR 0 (guards the PCR test), of type EV_NO_ACTION (an
    // extended event with that data is just an event), and carry exactly one byte after
    // the signature.
    let mut long = startup_locality_data(3);
    long.push(0);
    for (pcr, event_type, data) in [
        (0, 3, other),
        (1, 3, startup_locality_data(3)),
        (0, 0x8, startup_locality_data(3)),
        (0, 3, long),
        (0, 3, b"StartupLocality\0".to_vec()),
    ] {
        let log = sha256_log(&[
            event(pcr, event_type, &[(ALG_SHA256, vec![0; 32])], &data),
            sha256_event(0, 0x8, b"crtm"),
        ]);
        let log = EventLog::parse(&log).unwrap();
        assert_eq!(
            log.startup_locality(),
            0,
            "PCR {pcr}, type {event_type:#x}, {data:?}"
        );
    }
    let log = sha256_log(&[
        event(
            0,
            3,
            &[(ALG_SHA256, vec![0; 32])],
            &startup_locality_data(4),
        ),
        sha256_event(0, 0x8, b"crtm"),
    ]);
    assert_eq!(EventLog::parse(&log).unwrap().startup_locality(), 4);
}

/// The reference events of PCR `i` of `log` as `boot-measurements` makes them: PCR 0's
/// replayed from the log's startup locality.
fn measurements_of_log(log: &[u8], pcrs: &[u8]) -> Result<Measurements, MeasurementsError> {
    let parsed = EventLog::parse(log).unwrap();
    let replayed = parsed.replay_sha256().unwrap();
    let mut m = Measurements::new(
        pcrs.iter()
            .map(|i| (idx(*i), ExpectedPcr::enforce(replayed[&idx(*i)]))),
    )
    .unwrap();
    for i in pcrs {
        let start = if *i == 0 {
            parsed.startup_locality()
        } else {
            0
        };
        m = m.with_reference_events_after_startup(idx(*i), start, references_of(log, *i))?;
    }
    Ok(m)
}

#[test]
fn reference_events_of_an_h_crtm_boot_are_replayed_from_its_startup_locality() {
    let log = h_crtm_log(Some(3));
    let m = measurements_of_log(&log, &[0, 7]).unwrap();
    assert_eq!(m.reference_startup_locality(idx(0)), 3);
    assert_eq!(m.reference_startup_locality(idx(7)), 0);
    // The file says so, and reads back the same.
    let json = m.to_json();
    assert!(json.contains("\"startupLocality\": 3"), "{json}");
    assert_eq!(json.matches("startupLocality").count(), 1, "{json}");
    assert_eq!(Measurements::from_json(json.as_bytes()).unwrap(), m);

    // The same events replayed from zero do not give the value the TPM held: this is the
    // refusal a real server's log met before PCR 0 started at its locality.
    let expected = EventLog::parse(&log).unwrap().replay_sha256().unwrap()[&idx(0)];
    let from_zero = Measurements::new([(idx(0), ExpectedPcr::enforce(expected))])
        .unwrap()
        .with_reference_events(idx(0), references_of(&log, 0))
        .unwrap_err();
    assert!(
        matches!(&from_zero, MeasurementsError::ReferenceEvents { index, reason }
            if index.get() == 0 && reason.contains("not to the expected value")),
        "{from_zero}"
    );
    let without = json.replace(", \"startupLocality\": 3", "");
    assert!(matches!(
        Measurements::from_json(without.as_bytes()),
        Err(MeasurementsError::ReferenceEvents { .. })
    ));
}

#[test]
fn a_startup_locality_is_refused_off_pcr0_and_without_events() {
    let m = Measurements::new([(idx(7), ExpectedPcr::enforce([0; 32]))]).unwrap();
    let err = m
        .with_reference_events_after_startup(idx(7), 3, Vec::new())
        .unwrap_err();
    assert!(
        matches!(&err, MeasurementsError::ReferenceEvents { index, reason }
            if index.get() == 7 && reason.contains("startup locality")),
        "{err}"
    );
    let pcr = hex::encode([1u8; 32]);
    let no_events =
        format!(r#"{{"measurements": {{"0": {{"expected": "{pcr}", "startupLocality": 3}}}}}}"#);
    let err = Measurements::from_json(no_events.as_bytes()).unwrap_err();
    assert!(err.to_string().contains("needs events"), "{err}");
    let snp = format!(
        r#"{{"measurements": {{"4": "{pcr}"}}, "snp": {{"hostData": {{"expected": "{pcr}", "startupLocality": 3, "events": []}}}}}}"#
    );
    assert!(matches!(
        Measurements::from_json(snp.as_bytes()),
        Err(MeasurementsError::BadReference { .. })
    ));
}

#[test]
fn evidence_of_an_h_crtm_boot_validates_and_names_a_changed_startup_locality() {
    let log = h_crtm_log(Some(3));
    let tpm = tpm_booted_with(&log);
    let m = measurements_of_log(&log, &[0, 7]).unwrap();
    let v = validator(&tpm, m.clone());
    v.validate(&tpm.issue(&rd()).unwrap(), &rd()).unwrap();

    // The same events on a platform that started the TPM from locality 0: every event
    // matches its reference, PCR 0 still differs, and the check says where it started.
    let other = tpm_booted_with(&h_crtm_log(None));
    let v = validator(&other, m);
    let (checks, result) = v.validate_explained(&other.issue(&rd()).unwrap(), &rd());
    assert!(matches!(
        result,
        Err(ValidationError::Measurement { index: 0, .. })
    ));
    let mut three = [0u8; 32];
    three[31] = 3;
    assert_eq!(checks.len(), 1, "{checks:#?}");
    assert_eq!(checks[0].field, "PCR 0 start (StartupLocality)");
    assert_eq!(
        checks[0].expected,
        format!("{} (startup locality 3)", hex::encode(three))
    );
    assert_eq!(
        checks[0].observed,
        format!("{} (startup locality 0)", hex::encode([0u8; 32]))
    );
}

#[test]
fn without_reference_events_an_h_crtm_pcr0_lists_its_start_before_its_events() {
    let log = h_crtm_log(Some(3));
    let tpm = tpm_booted_with(&log);
    let m = Measurements::new([(idx(0), ExpectedPcr::enforce([0x42; 32]))]).unwrap();
    let v = validator(&tpm, m);
    let (checks, _) = v.validate_explained(&tpm.issue(&rd()).unwrap(), &rd());
    let fields: Vec<&str> = checks.iter().map(|c| &*c.field).collect();
    assert_eq!(
        fields,
        [
            "PCR 0 start (StartupLocality)",
            "PCR 0 event 1 (EV_S_CRTM_VERSION Server Firmware 1.0)",
            "PCR 0 event 2 (EV_EFI_PLATFORM_FIRMWARE_BLOB 0x400000 bytes at 0xffc00000)",
            "PCR 0 event 3 (EV_SEPARATOR separator)",
        ]
    );
}

// ---------------------------------------------------------------- validation

/// A software TPM whose SHA-256 PCRs are those the log replays to, carrying the log.
fn tpm_booted_with(log: &[u8]) -> SoftTpm {
    let mut tpm = booted_tpm(ecdsa_ak());
    for (i, v) in EventLog::parse(log).unwrap().replay_sha256().unwrap() {
        tpm.set_pcr(i, v);
    }
    tpm.set_event_log(Some(log.to_vec()));
    tpm
}

/// Enforces PCRs 0–7 and 9 at `values`, with `references` as reference events.
fn firmware_measurements(
    values: &BTreeMap<PcrIndex, [u8; 32]>,
    references: &[(u8, Vec<ReferenceEvent>)],
) -> Measurements {
    let mut m = Measurements::new(
        [0u8, 1, 2, 3, 4, 5, 6, 7, 9].map(|i| (idx(i), ExpectedPcr::enforce(values[&idx(i)]))),
    )
    .unwrap();
    for (i, events) in references {
        m = m.with_reference_events(idx(*i), events.clone()).unwrap();
    }
    m
}

fn validator(tpm: &SoftTpm, m: Measurements) -> TpmQuoteValidator {
    TpmQuoteValidator::new(AkTrust::pinned([tpm.ak().fingerprint()]), m.into_provider())
}

/// The reference events of PCR `i` as the real log has them.
fn references_of(log: &[u8], i: u8) -> Vec<ReferenceEvent> {
    EventLog::parse(log)
        .unwrap()
        .extended(idx(i))
        .map(|e| ReferenceEvent {
            digest: e.sha256().unwrap(),
            description: e.description(),
        })
        .collect()
}

/// The real log with the SHA-256 digest of the initrd event replaced: the log of a boot
/// with another initrd.
fn log_with_other_initrd() -> (Vec<u8>, [u8; 32]) {
    let log = EventLog::parse(OVMF_LOG).unwrap();
    let initrd = log.extended(idx(9)).nth(1).unwrap().sha256().unwrap();
    let at = OVMF_LOG
        .windows(32)
        .position(|w| w == initrd)
        .expect("the digest is in the log");
    let other: [u8; 32] = Sha256::digest(b"another initrd").into();
    let mut bytes = OVMF_LOG.to_vec();
    bytes[at..at + 32].copy_from_slice(&other);
    (bytes, other)
}

#[test]
fn evidence_whose_log_replays_to_the_quote_is_accepted() {
    let tpm = tpm_booted_with(OVMF_LOG);
    let v = validator(&tpm, firmware_measurements(&recorded_pcrs(), &[]));
    let verified = v.validate(&tpm.issue(&rd()).unwrap(), &rd()).unwrap();
    assert!(verified.warnings().is_empty(), "{:?}", verified.warnings());
}

#[test]
fn evidence_without_a_log_still_validates() {
    let mut tpm = tpm_booted_with(OVMF_LOG);
    tpm.set_event_log(None);
    let v = validator(&tpm, firmware_measurements(&recorded_pcrs(), &[]));
    v.validate(&tpm.issue(&rd()).unwrap(), &rd()).unwrap();
}

#[test]
fn a_log_that_does_not_replay_to_the_quote_is_refused_naming_the_pcr() {
    // The quote is of the real boot; the log claims another initrd.
    let mut tpm = tpm_booted_with(OVMF_LOG);
    let (edited, _) = log_with_other_initrd();
    tpm.set_event_log(Some(edited.clone()));
    let v = validator(&tpm, firmware_measurements(&recorded_pcrs(), &[]));
    let replayed = EventLog::parse(&edited).unwrap().replay_sha256().unwrap()[&idx(9)];
    assert_eq!(
        v.validate(&tpm.issue(&rd()).unwrap(), &rd()).unwrap_err(),
        ValidationError::EventLogReplay {
            index: 9,
            replayed: hex::encode(replayed),
            quoted: hex::encode(recorded_pcrs()[&idx(9)]),
        }
    );
}

#[test]
fn a_malformed_log_in_evidence_is_refused_with_its_reason() {
    let mut tpm = tpm_booted_with(OVMF_LOG);
    let mut log = OVMF_LOG.to_vec();
    log.push(0);
    tpm.set_event_log(Some(log));
    let v = validator(&tpm, firmware_measurements(&recorded_pcrs(), &[]));
    assert_eq!(
        v.validate(&tpm.issue(&rd()).unwrap(), &rd()).unwrap_err(),
        ValidationError::EventLog(EventLogError::TrailingBytes(1))
    );
}

#[test]
fn a_log_with_only_the_sha1_bank_is_refused_naming_its_banks() {
    // Firmware that logs SHA-1 only: its digests say nothing of the SHA-256 bank the quote
    // signs and the measurements expect, so it is refused, never skipped or half-replayed.
    let mut sha1_only = header(&[(SHA1, 20)]);
    sha1_only.extend_from_slice(&event(0, 8, &[(SHA1, vec![1; 20])], b""));
    let mut tpm = booted_tpm(ecdsa_ak());
    tpm.set_event_log(Some(sha1_only));
    let v = validator(&tpm, measurements_of(&tpm));
    let err = v.validate(&tpm.issue(&rd()).unwrap(), &rd()).unwrap_err();
    assert_eq!(
        err,
        ValidationError::EventLog(EventLogError::NoSha256(vec![SHA1]))
    );
    assert_eq!(
        err.to_string(),
        "event log: the event log has no SHA-256 digests (it carries sha1); only the SHA-256 \
         bank, the one quotes sign and measurements expect, is replayed"
    );
}

#[test]
fn a_pcr_mismatch_names_the_first_event_that_differs_from_the_reference() {
    // A node booted with another initrd: its log and quote agree, the measurements do not.
    let (other_log, other_digest) = log_with_other_initrd();
    let tpm = tpm_booted_with(&other_log);
    let references = references_of(OVMF_LOG, 9);
    let v = validator(
        &tpm,
        firmware_measurements(&recorded_pcrs(), &[(9, references.clone())]),
    );
    let explained = v.validate_with_pcrs(&tpm.issue(&rd()).unwrap(), &rd());
    assert!(matches!(
        explained.result,
        Err(ValidationError::Measurement { index: 9, .. })
    ));
    assert_eq!(explained.checks.len(), 1, "{:#?}", explained.checks);
    let c = &explained.checks[0];
    assert_eq!(c.field, "PCR 9 event 2 (EV_EVENT_TAG Linux initrd)");
    assert_eq!(
        c.expected,
        format!("{} (Linux initrd)", hex::encode(references[1].digest))
    );
    assert_eq!(c.observed, hex::encode(other_digest));
    assert_eq!(c.outcome, Outcome::Fail);
}

#[test]
fn without_reference_events_a_pcr_mismatch_lists_the_events_of_that_pcr() {
    let (other_log, other_digest) = log_with_other_initrd();
    let tpm = tpm_booted_with(&other_log);
    let mut expected = recorded_pcrs();
    // PCR 9 warn-only: the node is accepted, and the warning names the events.
    let mut m = Measurements::new(
        [0u8, 1, 2, 3, 4, 5, 6, 7].map(|i| (idx(i), ExpectedPcr::enforce(expected[&idx(i)]))),
    )
    .unwrap();
    let nine = expected.remove(&idx(9)).unwrap();
    m = Measurements::new(
        m.iter()
            .map(|(i, p)| (i, *p))
            .chain([(idx(9), ExpectedPcr::warn_only(nine))]),
    )
    .unwrap();
    let v = validator(&tpm, m);
    let (checks, result) = v.validate_explained(&tpm.issue(&rd()).unwrap(), &rd());
    let fields: Vec<&str> = checks.iter().map(|c| &*c.field).collect();
    assert_eq!(
        fields,
        [
            "PCR 9 event 1 (EV_EVENT_TAG Linux command line)",
            "PCR 9 event 2 (EV_EVENT_TAG Linux initrd)"
        ]
    );
    assert_eq!(checks[1].observed, hex::encode(other_digest));
    assert!(checks.iter().all(|c| c.outcome == Outcome::Warn));
    let verified = result.unwrap();
    assert!(
        verified
            .warnings()
            .iter()
            .any(|w| w.contains("PCR 9 event 2 (EV_EVENT_TAG Linux initrd)")),
        "{:?}",
        verified.warnings()
    );
}

#[test]
fn a_pcr_the_log_does_not_cover_is_neither_replayed_nor_explained() {
    // PCR 15 is extended after boot (the node marker); the firmware's log knows nothing
    // of it, so a mismatch there is the plain measurement error with no event checks.
    let mut tpm = tpm_booted_with(OVMF_LOG);
    let m = firmware_measurements(&recorded_pcrs(), &[]);
    let m = Measurements::new(
        m.iter()
            .map(|(i, p)| (i, *p))
            .chain([(idx(15), ExpectedPcr::enforce([0; 32]))]),
    )
    .unwrap();
    tpm.extend_pcr(idx(15), &[0x15; 32]);
    let v = validator(&tpm, m);
    let (checks, result) = v.validate_explained(&tpm.issue(&rd()).unwrap(), &rd());
    assert!(matches!(
        result,
        Err(ValidationError::Measurement { index: 15, .. })
    ));
    assert!(checks.is_empty(), "{checks:#?}");
}

// ---------------------------------------------------------------- the measurements file

#[test]
fn reference_events_round_trip_through_the_measurements_file() {
    let m = firmware_measurements(&recorded_pcrs(), &[(9, references_of(OVMF_LOG, 9))]);
    let json = m.to_json();
    assert!(json.contains("\"description\": \"Linux initrd\""), "{json}");
    let parsed = Measurements::from_json(json.as_bytes()).unwrap();
    assert_eq!(parsed, m);
    assert_eq!(parsed.reference_events(idx(9)).len(), 2);
    assert!(parsed.reference_events(idx(4)).is_empty());
}

#[test]
fn reference_events_that_do_not_extend_to_the_expected_value_are_refused() {
    let mut references = references_of(OVMF_LOG, 9);
    references.swap(0, 1);
    let m = firmware_measurements(&recorded_pcrs(), &[]);
    let err = m.with_reference_events(idx(9), references).unwrap_err();
    assert!(
        matches!(&err, MeasurementsError::ReferenceEvents { index, reason }
            if index.get() == 9 && reason.contains("not to the expected value")),
        "{err}"
    );

    let pcr = hex::encode([1u8; 32]);
    let json = format!(
        r#"{{"measurements": {{"4": {{"expected": "{pcr}", "events": [{{"digest": "{}"}}]}}}}}}"#,
        hex::encode([2u8; 32])
    );
    assert!(matches!(
        Measurements::from_json(json.as_bytes()),
        Err(MeasurementsError::ReferenceEvents { .. })
    ));
    // Reference events belong to PCRs, not to confidential-VM fields.
    let json = format!(
        r#"{{"measurements": {{"4": "{pcr}"}}, "snp": {{"hostData": {{"expected": "{pcr}", "events": []}}}}}}"#
    );
    assert!(matches!(
        Measurements::from_json(json.as_bytes()),
        Err(MeasurementsError::BadReference { .. })
    ));
}

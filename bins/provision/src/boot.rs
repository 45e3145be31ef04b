//! `boot-measurements`: the expected measurements of a VM image, from one reference boot.
//!
//! A VM's PCRs 0–9 are what its firmware and its kernel's EFI stub measured. The image build
//! predicts some of them; the rest depend on the firmware build and the VM's configuration,
//! so they come from a reference boot: the TCG event log and the PCR values the guest read
//! from its TPM. The log must replay to those values (else the boot's record is not
//! trustworthy), and every PCR's events become its reference events, so that a verifier
//! names the event that differs when a node's PCR does (docs/attestation.md).

use anyhow::{Context, Result, bail};
use asterism_attestation::measurements::ReferenceEvent;
use asterism_attestation::tpm::eventlog::EventLog;
use asterism_attestation::{ExpectedPcr, Measurements, PcrIndex};
use std::collections::BTreeMap;
use std::path::Path;

/// The PCRs a measured boot sets: firmware, its configuration, the boot loader (the kernel),
/// Secure Boot, and the kernel's command line and initramfs.
pub const BOOT_PCRS: std::ops::RangeInclusive<u8> = 0..=9;
/// The largest event log or PCR file read.
const MAX_INPUT: u64 = 1024 * 1024;

/// Reads `pcrs_file`: either `{"sha256": {"0": "<hex>", …}}`, as the VM image's reference
/// boot writes it, or the text `tpm2_pcrread sha256` prints on the machine itself
/// (`  sha256:` then one `    <index> : 0x<hex>` line per PCR; other banks are skipped).
pub fn read_pcrs(pcrs_file: &Path) -> Result<BTreeMap<PcrIndex, [u8; 32]>> {
    let text = asterism_binkit::read_capped(pcrs_file, MAX_INPUT)
        .with_context(|| format!("reading {}", pcrs_file.display()))?;
    let name = pcrs_file.display();
    let entries = if text.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{') {
        #[derive(serde::Deserialize)]
        struct File {
            sha256: BTreeMap<String, String>,
        }
        let file: File = serde_json::from_slice(&text).with_context(|| {
            format!("{name}: not a PCR file ({{\"sha256\": {{\"0\": hex, …}}}})")
        })?;
        file.sha256.into_iter().collect()
    } else {
        pcrread_sha256(&text).with_context(|| {
            format!("{name}: neither a PCR file (JSON) nor `tpm2_pcrread sha256` output")
        })?
    };
    let mut pcrs = BTreeMap::new();
    for (index, value) in entries {
        let i = index
            .parse::<u8>()
            .ok()
            .and_then(PcrIndex::new)
            .with_context(|| format!("{name}: {index:?} is not a PCR index"))?;
        let v: [u8; 32] = hex::decode(&value)
            .ok()
            .and_then(|v| v.try_into().ok())
            .with_context(|| format!("{name}: PCR {index} is not 32 hex bytes"))?;
        if pcrs.insert(i, v).is_some() {
            bail!("{name}: PCR {index} is given twice");
        }
    }
    Ok(pcrs)
}

/// The SHA-256 bank of `tpm2_pcrread` output, as (index, hex) pairs.
fn pcrread_sha256(text: &[u8]) -> Result<Vec<(String, String)>> {
    let text = std::str::from_utf8(text).context("not UTF-8 text")?;
    let mut out = Vec::new();
    let mut bank: Option<&str> = None;
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if trimmed.is_empty() {
            continue;
        }
        if let Some(name) = trimmed.strip_suffix(':') {
            bank = Some(name);
            continue;
        }
        let (index, value) = trimmed
            .split_once(':')
            .with_context(|| format!("line {}: not `<index> : 0x<hex>`", n + 1))?;
        match bank {
            Some("sha256") => {}
            Some(_) => continue,
            None => bail!("line {}: a PCR value before any bank name", n + 1),
        }
        let value = value.trim();
        let hex = value
            .strip_prefix("0x")
            .with_context(|| format!("line {}: the value does not start with 0x", n + 1))?;
        out.push((index.trim().to_owned(), hex.to_ascii_lowercase()));
    }
    if out.is_empty() {
        bail!("no sha256 bank");
    }
    Ok(out)
}

/// Why an event makes its PCR differ between machines of one model, or between firmware
/// versions, when it does.
fn varies(event: &asterism_attestation::tpm::eventlog::Event) -> Option<&'static str> {
    Some(match event.event_type.0 {
        // SMBIOS and ACPI tables: serial numbers, UUIDs, asset tags.
        0x8000_0009 | 0x8000_000b => "hand-off tables (SMBIOS, ACPI): serial numbers and UUIDs",
        // Boot options: device paths name disks and network cards.
        0x8000_0002 | 0x8000_000c => {
            "the boot order or a boot option, whose device path names this machine's disk or network card"
        }
        // The disk's partition table, with the disk's GUID.
        0x8000_0006 | 0x8000_000d => "the boot disk's GPT header: its GUID is this disk's",
        0xa | 0xb | 0x10 | 0x11 => "platform configuration: differs with the installed hardware",
        0x9 => "CPU microcode: differs with the CPU's stepping and the installed update",
        0x1 | 0x8 | 0x13 => "firmware version: the same only on machines with the same firmware",
        _ => return None,
    })
}

/// The events that make their PCR differ between machines (or firmware versions), in log
/// order: `(PCR, event number, event label, why)`.
pub fn machine_specific(log: &EventLog) -> Vec<(u8, usize, String, &'static str)> {
    log.events()
        .iter()
        .filter(|e| e.is_extended() && BOOT_PCRS.contains(&e.pcr.get()))
        .filter_map(|e| varies(e).map(|why| (e.pcr.get(), e.number, e.label(), why)))
        .collect()
}

/// The expected measurements of nodes booted like the reference: PCRs 0–9 enforced at the
/// values read, each with the events the log gives it (PCR 0's with the startup locality
/// the log records); PCR 15 (the node marker) enforced zero. Refuses a log that does not
/// replay to the values read.
pub fn measurements(log: &EventLog, pcrs: &BTreeMap<PcrIndex, [u8; 32]>) -> Result<Measurements> {
    let replayed = log.replay_sha256().context("replaying the event log")?;
    for (index, value) in &replayed {
        match pcrs.get(index) {
            Some(read) if read == value => {}
            Some(read) => bail!(
                "PCR {}: the event log replays to {}, the TPM held {}: the log and the PCR values are not of the same boot",
                index.get(),
                hex::encode(value),
                hex::encode(read)
            ),
            None => {}
        }
    }
    let mut entries = Vec::new();
    for i in BOOT_PCRS {
        let index = PcrIndex::new(i).context("PCR index")?;
        let value = pcrs
            .get(&index)
            .with_context(|| format!("the PCR values lack PCR {i}"))?;
        entries.push((index, ExpectedPcr::enforce(*value)));
    }
    let marker = PcrIndex::new(15).context("PCR index")?;
    entries.push((marker, ExpectedPcr::enforce([0; 32])));
    let mut measurements = Measurements::new(entries)?;
    // PCR 0 of a platform with an H-CRTM starts at its startup locality, not at zero.
    let locality = log.startup_locality();
    for i in BOOT_PCRS {
        let index = PcrIndex::new(i).context("PCR index")?;
        let events: Vec<ReferenceEvent> = log
            .extended(index)
            .filter_map(|e| {
                e.sha256().map(|digest| ReferenceEvent {
                    digest,
                    description: Some(e.label()),
                })
            })
            .collect();
        if !events.is_empty() {
            let start = if i == 0 { locality } else { 0 };
            measurements =
                measurements.with_reference_events_after_startup(index, start, events)?;
        }
    }
    Ok(measurements)
}

/// `asterism-provision boot-measurements`: reads the reference boot's event log and PCR
/// values, writes the measurements file.
pub fn run(event_log: &Path, pcrs_file: &Path, out: &Path) -> Result<()> {
    let bytes = asterism_binkit::read_capped(event_log, MAX_INPUT)
        .with_context(|| format!("reading {}", event_log.display()))?;
    let log =
        EventLog::parse(&bytes).with_context(|| format!("parsing {}", event_log.display()))?;
    let m = measurements(&log, &read_pcrs(pcrs_file)?)?;
    crate::files::write_new(out, m.to_json().as_bytes(), 0o644)?;
    crate::progress!(
        "wrote {}: PCRs 0-9 from the reference boot ({} events), PCR 15 zero",
        out.display(),
        log.events().len()
    );
    let varying = machine_specific(&log);
    let pcrs: std::collections::BTreeSet<u8> = varying.iter().map(|v| v.0).collect();
    for pcr in pcrs {
        crate::progress!(
            "PCR {pcr} may differ on another machine; take its reference from each machine, or drop it from the file:"
        );
        for (_, number, label, why) in varying.iter().filter(|v| v.0 == pcr) {
            crate::progress!("  event {number} {label}: {why}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &[u8] =
        include_bytes!("../../../crates/attestation/tests/data/eventlog/ovmf-q35-linux-6.1.bin");
    const PCRS: &str =
        include_str!("../../../crates/attestation/tests/data/eventlog/ovmf-q35-linux-6.1.pcrs");

    fn pcrs() -> BTreeMap<PcrIndex, [u8; 32]> {
        PCRS.lines()
            .map(|l| {
                let (i, v) = l.split_once(' ').unwrap();
                (
                    PcrIndex::new(i.parse().unwrap()).unwrap(),
                    hex::decode(v.trim()).unwrap().try_into().unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn a_reference_boot_gives_pcrs_0_to_9_with_their_events_and_an_unmarked_pcr_15() {
        let log = EventLog::parse(LOG).unwrap();
        let m = measurements(&log, &pcrs()).unwrap();
        let p = pcrs();
        for i in 0..=9 {
            let index = PcrIndex::new(i).unwrap();
            assert_eq!(
                m.get(index).unwrap(),
                &ExpectedPcr::enforce(p[&index]),
                "PCR {i}"
            );
        }
        assert_eq!(
            m.get(PcrIndex::new(15).unwrap()).unwrap(),
            &ExpectedPcr::enforce([0; 32])
        );
        // PCR 9: the kernel's command line, then its initramfs, named.
        let nine = m.reference_events(PcrIndex::new(9).unwrap());
        assert_eq!(nine.len(), 2);
        assert!(
            nine[1]
                .description
                .as_deref()
                .unwrap()
                .contains("Linux initrd"),
            "{nine:?}"
        );
        // PCR 8 is in no event: enforced at its value, with no events.
        assert!(m.reference_events(PcrIndex::new(8).unwrap()).is_empty());
        // The file round-trips.
        assert_eq!(Measurements::from_json(m.to_json().as_bytes()).unwrap(), m);
    }

    #[test]
    fn the_node_images_reference_boot_gives_its_measurements_file() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../scripts/node-image/reference");
        let out = tempfile::tempdir()
            .unwrap()
            .keep()
            .join("measurements.json");
        run(&dir.join("eventlog.bin"), &dir.join("pcrs.json"), &out).unwrap();
        let m = Measurements::load(&out).unwrap();
        let pcrs = read_pcrs(&dir.join("pcrs.json")).unwrap();
        let nine = PcrIndex::new(9).unwrap();
        assert_eq!(m.get(nine).unwrap(), &ExpectedPcr::enforce(pcrs[&nine]));
        let labels: Vec<_> = m
            .reference_events(nine)
            .iter()
            .map(|e| e.description.clone().unwrap())
            .collect();
        assert!(
            labels.iter().any(|l| l.contains("Linux initrd")),
            "{labels:?}"
        );
        // Never overwrites.
        assert!(run(&dir.join("eventlog.bin"), &dir.join("pcrs.json"), &out).is_err());
    }

    /// A crypto-agile log (SHA-256 bank) of a server whose H-CRTM starts the TPM from
    /// locality 3: the Spec ID event, the `StartupLocality` event, three PCR 0 events and
    /// one event in each of PCRs 1–9.
    fn h_crtm_log() -> Vec<u8> {
        use sha2::{Digest, Sha256};
        fn event(pcr: u32, event_type: u32, digest: [u8; 32], data: &[u8]) -> Vec<u8> {
            let mut out = pcr.to_le_bytes().to_vec();
            out.extend_from_slice(&event_type.to_le_bytes());
            out.extend_from_slice(&1u32.to_le_bytes());
            out.extend_from_slice(&0x000bu16.to_le_bytes());
            out.extend_from_slice(&digest);
            out.extend_from_slice(&u32::try_from(data.len()).unwrap().to_le_bytes());
            out.extend_from_slice(data);
            out
        }
        let mut spec = b"Spec ID Event03\0".to_vec();
        spec.extend_from_slice(&0u32.to_le_bytes());
        spec.extend_from_slice(&[0, 2, 0, 2]);
        spec.extend_from_slice(&1u32.to_le_bytes());
        spec.extend_from_slice(&0x000bu16.to_le_bytes());
        spec.extend_from_slice(&32u16.to_le_bytes());
        spec.push(0);
        let mut log = 0u32.to_le_bytes().to_vec();
        log.extend_from_slice(&3u32.to_le_bytes());
        log.extend_from_slice(&[0; 20]);
        log.extend_from_slice(&u32::try_from(spec.len()).unwrap().to_le_bytes());
        log.extend_from_slice(&spec);
        log.extend_from_slice(&event(0, 3, [0; 32], b"StartupLocality\0\x03"));
        for (pcr, event_type, data) in [
            (0, 0x8, &b"v\0"[..]),
            (0, 0x8000_0008, &[7; 16][..]),
            (0, 0x4, &[0; 4][..]),
        ] {
            log.extend_from_slice(&event(pcr, event_type, Sha256::digest(data).into(), data));
        }
        for pcr in 1..=9 {
            let data = [u8::try_from(pcr).unwrap(); 4];
            log.extend_from_slice(&event(pcr, 0x4, Sha256::digest(data).into(), &data));
        }
        log
    }

    #[test]
    fn a_reference_boot_on_an_h_crtm_server_gives_pcr_0_from_its_startup_locality() {
        let bytes = h_crtm_log();
        let log = EventLog::parse(&bytes).unwrap();
        let pcrs = log.replay_sha256().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (log_file, pcrs_file, out) = (
            dir.path().join("eventlog.bin"),
            dir.path().join("pcrs.json"),
            dir.path().join("measurements.json"),
        );
        std::fs::write(&log_file, &bytes).unwrap();
        let values: BTreeMap<String, String> = pcrs
            .iter()
            .map(|(i, v)| (i.to_string(), hex::encode(v)))
            .collect();
        std::fs::write(
            &pcrs_file,
            serde_json::json!({ "sha256": values }).to_string(),
        )
        .unwrap();
        run(&log_file, &pcrs_file, &out).unwrap();
        let m = Measurements::load(&out).unwrap();
        let zero = PcrIndex::new(0).unwrap();
        assert_eq!(m.get(zero).unwrap(), &ExpectedPcr::enforce(pcrs[&zero]));
        assert_eq!(m.reference_startup_locality(zero), 3);
        assert_eq!(m.reference_events(zero).len(), 3);
        assert_eq!(
            m.reference_events(zero)[0].description.as_deref(),
            Some("EV_S_CRTM_VERSION v")
        );
        assert_eq!(m.reference_startup_locality(PcrIndex::new(1).unwrap()), 0);
    }

    #[test]
    fn a_log_of_another_boot_is_refused_naming_the_pcr() {
        let log = EventLog::parse(LOG).unwrap();
        let mut p = pcrs();
        p.insert(PcrIndex::new(4).unwrap(), [0x44; 32]);
        let err = measurements(&log, &p).unwrap_err().to_string();
        assert!(err.starts_with("PCR 4: the event log replays to"), "{err}");
    }

    #[test]
    fn missing_pcr_values_are_refused() {
        let log = EventLog::parse(LOG).unwrap();
        let mut p = pcrs();
        p.remove(&PcrIndex::new(8).unwrap());
        let err = measurements(&log, &p).unwrap_err().to_string();
        assert_eq!(err, "the PCR values lack PCR 8");
    }

    fn log_file(name: &str) -> EventLog {
        let path = format!(
            "{}/../../crates/attestation/tests/data/eventlog/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        EventLog::parse(&std::fs::read(path).unwrap()).unwrap()
    }

    #[test]
    fn the_events_that_differ_between_machines_are_named_with_their_pcr() {
        // The real GCE log: firmware version and platform information in PCR 0, the boot
        // options in PCR 1, the disk's GPT in PCR 5.
        let flagged: Vec<(u8, usize)> = machine_specific(&log_file("gce-cos-85-amd-sev.bin"))
            .iter()
            .map(|(pcr, number, _, _)| (*pcr, *number))
            .collect();
        assert_eq!(flagged, [(0, 1), (0, 2), (1, 9), (1, 10), (1, 11), (5, 21)]);
        let gpt = &machine_specific(&log_file("gce-cos-85-amd-sev.bin"))[5];
        assert!(gpt.2.starts_with("EV_EFI_GPT_EVENT"), "{gpt:?}");
        assert!(gpt.3.contains("GUID"), "{gpt:?}");
        // OVMF under QEMU: its version in PCR 0, its boot options in PCR 1; nothing in the
        // kernel's PCRs 4 and 9.
        let ovmf: Vec<u8> = machine_specific(&log_file("ovmf-q35-linux-6.1.bin"))
            .iter()
            .map(|v| v.0)
            .collect();
        assert_eq!(ovmf, [0, 1, 1]);
    }

    #[test]
    fn pcr_values_are_read_as_tpm2_pcrread_prints_them() {
        let dir = tempfile::tempdir().unwrap();
        let p = pcrs();
        // `tpm2_pcrread sha1:0,1+sha256:0,1,…` on the machine: the SHA-1 bank is skipped.
        let mut text = String::from("  sha1:\n    0 : 0x");
        text.push_str(&"AB".repeat(20));
        text.push_str("\n  sha256:\n");
        for (i, v) in &p {
            text.push_str(&format!("    {:<2}: 0x{}\n", i.get(), hex::encode_upper(v)));
        }
        let file = dir.path().join("pcrs.txt");
        std::fs::write(&file, &text).unwrap();
        assert_eq!(read_pcrs(&file).unwrap(), p);
        // With the reference boot's log they give its measurements.
        let out = dir.path().join("m.json");
        let log = dir.path().join("log.bin");
        std::fs::write(&log, LOG).unwrap();
        run(&log, &file, &out).unwrap();
        // A PCR twice, a value without 0x, no SHA-256 bank, a value before any bank.
        for bad in [
            format!("{text}    0 : 0x{}\n", "00".repeat(32)),
            text.replace(": 0x", ": "),
            text.replace("sha256:", "sha384:"),
            format!("    0 : 0x{}\n", "00".repeat(32)),
        ] {
            std::fs::write(&file, &bad).unwrap();
            let err = read_pcrs(&file).unwrap_err();
            assert!(format!("{err:#}").contains("pcrs.txt"), "{err:#}");
        }
    }
}

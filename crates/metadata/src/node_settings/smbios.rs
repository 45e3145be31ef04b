//! SMBIOS OEM strings (structure type 11), as Linux shows each structure in sysfs
//! (`/sys/firmware/dmi/entries/11-<n>/raw`): the bare-metal source a BMC or a hypervisor
//! sets (`qemu-system-x86_64 -smbios type=11,value=asterism.hostname=worker-7`, or
//! `path=FILE` for a value with newlines).
//!
//! The structure (DMTF DSP0134, "OEM Strings (Type 11)"): a header of type (1 byte),
//! length of the formatted area (1), handle (2); then `Count` (1 byte) at offset 4; then the
//! string set: `Count` NUL-terminated strings, and one more NUL. Strings of the form
//! `asterism.<key>=<value>` are settings (the AK certificate in base64), or the init's own
//! flags `asterism.reference=1` and `asterism.keep-running=1` ([`super::InitFlags`]); other
//! strings belong to others and are ignored.

use super::{MAX_BLOB_LEN, NodeSettings, Raw, SettingsError, Source, Value};
use std::path::Path;

/// The sysfs directory of the SMBIOS structures.
pub const DEFAULT_DMI_ENTRIES: &str = "/sys/firmware/dmi/entries";
/// Largest type 11 structure read (a base64 certificate and PEM bundle fit).
pub const MAX_ENTRY_LEN: usize = 4 * MAX_BLOB_LEN;
/// Most type 11 structures read.
pub const MAX_ENTRIES: usize = 16;

/// The SMBIOS structure type of OEM strings.
const OEM_STRINGS: u8 = 11;
/// The prefix of this project's strings.
const PREFIX: &str = "asterism.";

/// The strings of one OEM strings structure, checked against its header: the type, the
/// formatted area's length, `Count`, and a string set that ends exactly at the end.
pub fn oem_strings(structure: &[u8]) -> Result<Vec<&[u8]>, String> {
    let (&kind, rest) = structure.split_first().ok_or("empty structure")?;
    if kind != OEM_STRINGS {
        return Err(format!(
            "structure type {kind}, not {OEM_STRINGS} (OEM strings)"
        ));
    }
    let length = usize::from(*rest.first().ok_or("truncated header")?);
    if length < 5 {
        return Err(format!("formatted area of {length} bytes, fewer than 5"));
    }
    let formatted = structure.get(..length).ok_or_else(|| {
        format!(
            "formatted area of {length} bytes in {} bytes",
            structure.len()
        )
    })?;
    let count = usize::from(*formatted.get(4).ok_or("truncated header")?);
    let set = structure.get(length..).unwrap_or_default();
    let body = set
        .strip_suffix(&[0, 0])
        .ok_or("the string set does not end with two NULs")?;
    if count == 0 {
        return if body.is_empty() {
            Ok(Vec::new())
        } else {
            Err("strings after an empty string set".into())
        };
    }
    let strings: Vec<&[u8]> = body.split(|&b| b == 0).collect();
    if strings.iter().any(|s| s.is_empty()) {
        return Err("an empty string inside the string set".into());
    }
    if strings.len() != count {
        return Err(format!(
            "Count says {count} strings, the string set has {}",
            strings.len()
        ));
    }
    Ok(strings)
}

/// Parses the settings from OEM strings structures (`(name, bytes)` pairs, the name for
/// errors).
pub fn parse<'a>(
    structures: impl IntoIterator<Item = (&'a str, &'a [u8])>,
) -> Result<NodeSettings, SettingsError> {
    let origin = Source::Smbios;
    let mut raw = Raw::new(origin);
    for (name, bytes) in structures {
        let strings = oem_strings(bytes).map_err(|reason| SettingsError::Malformed {
            origin,
            what: name.to_owned(),
            reason,
        })?;
        for string in strings {
            if !string.starts_with(PREFIX.as_bytes()) {
                continue;
            }
            let text = std::str::from_utf8(string).map_err(|_| SettingsError::Malformed {
                origin,
                what: name.to_owned(),
                reason: "an asterism string is not UTF-8".into(),
            })?;
            let kv = text.get(PREFIX.len()..).unwrap_or_default();
            let (key, value) = kv
                .split_once('=')
                .ok_or_else(|| super::unknown_key(origin, kv))?;
            if raw.init_flags.set(origin, key, value)? {
                continue;
            }
            raw.set_key(key, Value::Text(value.to_owned()))?;
        }
    }
    raw.into_settings()
}

/// Reads every OEM strings structure under `entries` ([`DEFAULT_DMI_ENTRIES`]).
pub fn read(entries: &Path) -> Result<NodeSettings, SettingsError> {
    let origin = Source::Smbios;
    let list = std::fs::read_dir(entries).map_err(|source| SettingsError::Read {
        origin,
        path: entries.to_owned(),
        source,
    })?;
    let mut names: Vec<String> = list
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("11-"))
        .collect();
    names.sort();
    if names.len() > MAX_ENTRIES {
        return Err(SettingsError::Malformed {
            origin,
            what: entries.display().to_string(),
            reason: format!("more than {MAX_ENTRIES} OEM strings structures"),
        });
    }
    let mut structures = Vec::new();
    for name in names {
        let path = entries.join(&name).join("raw");
        let bytes = super::fw_cfg::read_file(origin, &path, MAX_ENTRY_LEN)?.ok_or_else(|| {
            SettingsError::Absent {
                origin,
                what: path.display().to_string(),
            }
        })?;
        structures.push((path.display().to_string(), bytes));
    }
    parse(structures.iter().map(|(n, b)| (n.as_str(), b.as_slice())))
}

/// Builds an OEM strings structure (for tests and for describing the form).
pub fn build(handle: u16, strings: &[&[u8]]) -> Vec<u8> {
    let mut out = vec![OEM_STRINGS, 5];
    out.extend_from_slice(&handle.to_le_bytes());
    out.push(u8::try_from(strings.len()).unwrap_or(u8::MAX));
    for s in strings {
        out.extend_from_slice(s);
        out.push(0);
    }
    if strings.is_empty() {
        out.push(0);
    }
    out.push(0);
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::super::Field;
    use super::super::tests::{CA, CLUSTER_ID, CP_KEY};
    use super::*;

    fn strings() -> Vec<String> {
        vec![
            "vendor-thing=1".into(),
            format!("asterism.cluster-id={CLUSTER_ID}"),
            format!("asterism.control-plane-key={CP_KEY}"),
            format!("asterism.join-platform-ca={CA}"),
            r#"asterism.join-measurements={"pcrs":{}}"#.into(),
            "asterism.ak-cert=MAMCAQc=".into(),
            "asterism.hostname=rack1-node4".into(),
        ]
    }

    fn structure(strings: &[String]) -> Vec<u8> {
        let s: Vec<&[u8]> = strings.iter().map(|s| s.as_bytes()).collect();
        build(0x0b00, &s)
    }

    #[test]
    fn oem_strings_with_the_prefix_give_the_settings_and_others_are_ignored() {
        let bytes = structure(&strings());
        let s = parse([("11-0", bytes.as_slice())]).unwrap();
        assert_eq!(s.hostname.unwrap().as_str(), "rack1-node4");
        assert_eq!(s.join.unwrap().platform_ca, CA);
        assert_eq!(s.ak_cert.unwrap(), [0x30, 0x03, 0x02, 0x01, 0x07]);
    }

    #[test]
    fn settings_may_be_spread_over_several_structures_read_from_sysfs() {
        let dir = tempfile::tempdir().unwrap();
        let all = strings();
        for (i, part) in all.chunks(3).enumerate() {
            let entry = dir.path().join(format!("11-{i}"));
            std::fs::create_dir(&entry).unwrap();
            std::fs::write(entry.join("raw"), structure(part)).unwrap();
        }
        std::fs::create_dir(dir.path().join("1-0")).unwrap();
        assert!(read(dir.path()).unwrap().join.is_some());
    }

    #[test]
    fn a_structure_whose_header_and_string_set_disagree_is_refused() {
        let good = structure(&strings());
        let mut wrong_type = good.clone();
        wrong_type[0] = 1;
        let mut wrong_count = good.clone();
        wrong_count[4] = 6;
        let mut long_area = good.clone();
        long_area[1] = 200;
        let mut short_area = good.clone();
        short_area[1] = 4;
        let unterminated = good[..good.len() - 1].to_vec();
        let mut trailing = good.clone();
        trailing.push(b'x');
        let mut inner_empty = structure(&["a".into(), "b".into()]);
        inner_empty[4] = 3;
        inner_empty.splice(7..7, [0u8]);
        for (what, bytes) in [
            ("type", wrong_type),
            ("count", wrong_count),
            ("long formatted area", long_area),
            ("short formatted area", short_area),
            ("unterminated", unterminated),
            ("trailing", trailing),
            ("empty string", inner_empty),
            ("empty", vec![]),
        ] {
            let err = parse([("11-0", bytes.as_slice())]).unwrap_err();
            assert!(
                matches!(err, SettingsError::Malformed { .. }),
                "{what}: {err}"
            );
        }
        assert!(oem_strings(&build(1, &[])).unwrap().is_empty());
    }

    #[test]
    fn the_inits_flags_travel_beside_the_settings_with_the_value_1_only() {
        let mut all = strings();
        all.push("asterism.keep-running=1".into());
        let bytes = structure(&all);
        let s = parse([("11-0", bytes.as_slice())]).unwrap();
        assert!(s.init_flags.keep_running && !s.init_flags.reference);
        assert!(s.join.is_some(), "the settings are read as well");
        for flags in [
            ["asterism.keep-running=yes", "x=1"],
            ["asterism.reference=0", "x=1"],
            ["asterism.reference=1", "asterism.reference=1"],
        ] {
            let mut all = strings();
            all.extend(flags.iter().map(|f| f.to_string()));
            let bytes = structure(&all);
            let err = parse([("11-0", bytes.as_slice())]).unwrap_err();
            assert!(
                matches!(err, SettingsError::Malformed { ref what, .. } if what.starts_with("asterism.")),
                "{flags:?}: {err}"
            );
        }
    }

    #[test]
    fn an_unknown_repeated_or_invalid_asterism_string_is_refused() {
        for (extra, want) in [
            ("asterism.shell=1", "unknown"),
            ("asterism.noequals", "unknown"),
            ("asterism.hostname=other", "duplicate"),
            ("asterism.ak-cert=MAMC", "duplicate"),
        ] {
            let mut all = strings();
            all.push(extra.into());
            let bytes = structure(&all);
            let err = parse([("11-0", bytes.as_slice())]).unwrap_err();
            let ok = match want {
                "unknown" => matches!(err, SettingsError::UnknownKey { .. }),
                _ => matches!(err, SettingsError::Duplicate { .. }),
            };
            assert!(ok, "{extra}: {err}");
        }
        let mut all = strings();
        all[1] = format!("asterism.cluster-id={}", &CLUSTER_ID[1..]);
        let bytes = structure(&all);
        assert!(matches!(
            parse([("11-0", bytes.as_slice())]),
            Err(SettingsError::Invalid {
                field: Field::ClusterId,
                ..
            })
        ));
    }
}

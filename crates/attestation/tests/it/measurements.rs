//! The expected-measurements file: strict loading, and the shared map a watcher replaces.

use asterism_attestation::{
    ExpectedPcr, MeasurementMode, Measurements, MeasurementsError, MeasurementsProvider,
    SharedMeasurements,
};
use asterism_testkit::measurements::{
    HEX_AA as A, HEX_ZERO as Z, measurements_file as doc, pcr as idx,
};

#[test]
fn loads_the_documented_format_including_bare_hex_strings() {
    let json = doc(&format!(
        r#""4": {{"expected": "{A}", "warnOnly": false}},
           "14": {{"expected": "{Z}", "warnOnly": true}},
           "15": "{Z}",
           "9": {{"expected": "{}"}}"#,
        A.to_uppercase()
    ));
    let m = Measurements::from_json(json.as_bytes()).unwrap();
    assert_eq!(m.len(), 4);
    assert_eq!(m.get(idx(4)).unwrap(), &ExpectedPcr::enforce([0xaa; 32]));
    assert_eq!(m.get(idx(14)).unwrap().mode, MeasurementMode::WarnOnly);
    assert_eq!(m.get(idx(15)).unwrap(), &ExpectedPcr::enforce([0; 32]));
    // warnOnly defaults to enforce; upper-case hex is hex.
    assert_eq!(m.get(idx(9)).unwrap(), &ExpectedPcr::enforce([0xaa; 32]));
    let order: Vec<u8> = m.iter().map(|(i, _)| i.get()).collect();
    assert_eq!(order, vec![4, 9, 14, 15]);
}

fn refused(entries: &str) -> MeasurementsError {
    Measurements::from_json(doc(entries).as_bytes()).unwrap_err()
}

#[test]
fn rejects_values_that_are_not_hex() {
    let b64 = "qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqo=";
    assert!(matches!(
        refused(&format!(r#""4": "{b64}""#)),
        MeasurementsError::BadHex { .. }
    ));
    assert!(matches!(
        refused(&format!(r#""4": "0x{}""#, &A[2..])),
        MeasurementsError::BadHex { .. }
    ));
    assert!(matches!(
        refused(&format!(r#""4": "{}g""#, &A[1..])),
        MeasurementsError::BadHex { .. }
    ));
    assert!(matches!(refused(r#""4": 5"#), MeasurementsError::Json(_)));
}

#[test]
fn rejects_values_that_are_not_32_bytes() {
    let short = &A[2..];
    let long = format!("{A}aa");
    let tdx = format!("{A}{}", &A[..32]); // 48 bytes: a TDX RTMR, not a TPM PCR
    for v in [short, long.as_str(), tdx.as_str(), ""] {
        let e = refused(&format!(r#""4": "{v}""#));
        assert!(
            matches!(e, MeasurementsError::BadLength { index, len } if index == idx(4) && len == v.len() / 2),
            "{v}: {e}"
        );
    }
}

#[test]
fn rejects_indices_outside_0_to_23_and_non_canonical_keys() {
    for k in ["24", "100", "-1", "04", "x", ""] {
        let e = refused(&format!(r#""{k}": "{A}""#));
        assert!(matches!(e, MeasurementsError::BadIndex(_)), "{k}: {e}");
    }
}

#[test]
fn rejects_an_enforced_value_for_a_resettable_pcr_even_all_zero() {
    for i in ["16", "23"] {
        for v in [A, Z] {
            let e = refused(&format!(r#""4": "{A}", "{i}": "{v}""#));
            assert!(matches!(e, MeasurementsError::EnforcedResettable(_)), "{e}");
        }
        // Warn-only is fine.
        let ok = doc(&format!(
            r#""4": "{A}", "{i}": {{"expected": "{Z}", "warnOnly": true}}"#
        ));
        Measurements::from_json(ok.as_bytes()).unwrap();
    }
    // Measurements::new applies the same rule.
    assert!(Measurements::new([(idx(16), ExpectedPcr::enforce([0; 32]))]).is_err());
}

#[test]
fn rejects_duplicates_unknown_fields_and_maps_that_enforce_nothing() {
    assert!(matches!(
        refused(&format!(r#""4": "{A}", "4": "{Z}""#)),
        MeasurementsError::DuplicateIndex(_)
    ));
    assert!(matches!(
        refused(&format!(r#""4": {{"expected": "{A}", "expected": "{Z}"}}"#)),
        MeasurementsError::Json(_)
    ));
    assert!(matches!(
        refused(&format!(r#""4": {{"expected": "{A}", "warnonly": true}}"#)),
        MeasurementsError::Json(_)
    ));
    assert!(matches!(
        refused(r#""4": {"warnOnly": true}"#),
        MeasurementsError::Json(_)
    ));
    assert!(matches!(refused(""), MeasurementsError::NoEnforced));
    assert!(matches!(
        refused(&format!(r#""4": {{"expected": "{A}", "warnOnly": true}}"#)),
        MeasurementsError::NoEnforced
    ));
    let extra = format!(r#"{{"measurements": {{"4": "{A}"}}, "other": 1}}"#);
    assert!(Measurements::from_json(extra.as_bytes()).is_err());
    assert!(Measurements::from_json(b"{}").is_err());
    assert!(Measurements::from_json(b"not json").is_err());
}

#[test]
fn loading_refuses_a_missing_an_empty_and_an_oversized_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.json");
    assert!(matches!(
        Measurements::load(&path),
        Err(MeasurementsError::Io { .. })
    ));
    std::fs::write(&path, r#"{"measurements": {}}"#).unwrap();
    assert!(matches!(
        Measurements::load(&path),
        Err(MeasurementsError::NoEnforced)
    ));
    std::fs::write(&path, " ".repeat(1024 * 1024 + 1)).unwrap();
    assert!(matches!(
        Measurements::load(&path),
        Err(MeasurementsError::TooLarge { .. })
    ));
}

#[test]
fn a_shared_map_hands_every_holder_the_replacement() {
    let one = Measurements::new([(idx(4), ExpectedPcr::enforce([1; 32]))]).unwrap();
    let two = Measurements::new([(idx(4), ExpectedPcr::enforce([2; 32]))]).unwrap();
    let shared = SharedMeasurements::new(one);
    let validator_side = shared.clone();
    let before = validator_side.current();
    shared.replace(two);
    assert_eq!(
        validator_side.current().get(idx(4)).unwrap().expected,
        [2; 32]
    );
    // A validation that started before the swap keeps the map it started with.
    assert_eq!(before.get(idx(4)).unwrap().expected, [1; 32]);
}

//! The node marker in PCR 15 on a real TPM (swtpm): the upstream worked example,
//! marking, what survives a reconnection and what a TPM reset clears, and a TPM without the
//! SHA-256 bank.

use crate::common::swtpm_and_tpm;
use asterism_swtpm::{ManufactureOptions, PcrBank, SwtpmConfig, SwtpmProcess, manufacture};
use asterism_testkit::Swtpm;
use asterism_tpm::Tpm;
use asterism_tpm::marker::{
    MARKER_PCR, MarkerError, expected_marker_pcr, is_node_bootstrapped, mark_node_bootstrapped,
    read_marker_pcr,
};

/// The upstream `HKDFClusterID` test vector's output: a cluster ID.
const CLUSTER_ID: &str = "128c164378fe8767f998fbdfe4b4d6463ec5ae1b664ea5999bc27417607ae9b6";
/// PCR 15 after marking a reset TPM with [`CLUSTER_ID`]: `SHA-256(0^32 || SHA-256(cluster ID))`.
const MARKED_PCR15: &str = "23400370357e846478cce7cc0c76cdfe4da077cc57b36dee0f665ede2c8b3f2f";

fn cluster_id() -> [u8; 32] {
    hex::decode(CLUSTER_ID).unwrap().try_into().unwrap()
}

#[test]
fn the_marker_pcr_is_pcr_15() {
    assert_eq!(MARKER_PCR, 15);
}

#[test]
fn marking_a_reset_tpm_gives_the_reference_worked_example() {
    let (_swtpm, mut tpm) = swtpm_and_tpm(true);
    assert_eq!(
        hex::encode(expected_marker_pcr(&cluster_id())),
        MARKED_PCR15
    );
    mark_node_bootstrapped(&mut tpm, &cluster_id()).unwrap();
    assert_eq!(
        hex::encode(read_marker_pcr(&mut tpm).unwrap()),
        MARKED_PCR15
    );
}

#[test]
fn a_fresh_tpm_is_not_bootstrapped_and_a_marked_one_is() {
    let (_swtpm, mut tpm) = swtpm_and_tpm(true);
    assert_eq!(read_marker_pcr(&mut tpm).unwrap(), [0; 32]);
    assert!(!is_node_bootstrapped(&mut tpm).unwrap());
    mark_node_bootstrapped(&mut tpm, &cluster_id()).unwrap();
    assert!(is_node_bootstrapped(&mut tpm).unwrap());
}

#[test]
fn marking_twice_gives_a_value_no_cluster_expects() {
    let (_swtpm, mut tpm) = swtpm_and_tpm(true);
    mark_node_bootstrapped(&mut tpm, &cluster_id()).unwrap();
    mark_node_bootstrapped(&mut tpm, &cluster_id()).unwrap();
    let value = read_marker_pcr(&mut tpm).unwrap();
    assert_ne!(value, expected_marker_pcr(&cluster_id()));
    assert!(is_node_bootstrapped(&mut tpm).unwrap());
}

#[test]
fn the_marker_survives_a_new_connection_and_clears_only_on_a_tpm_reset() {
    let (mut swtpm, mut tpm) = swtpm_and_tpm(true);
    mark_node_bootstrapped(&mut tpm, &cluster_id()).unwrap();
    drop(tpm);

    // Another connection, as another program of the same boot would open.
    let mut tpm = Tpm::open(&swtpm.config()).unwrap();
    assert!(is_node_bootstrapped(&mut tpm).unwrap());
    assert_eq!(
        hex::encode(read_marker_pcr(&mut tpm).unwrap()),
        MARKED_PCR15
    );
    drop(tpm);

    // A restart of swtpm is a TPM reset (a reboot): the marker is gone.
    swtpm.restart().unwrap();
    let mut tpm = Tpm::open(&swtpm.config()).unwrap();
    assert!(!is_node_bootstrapped(&mut tpm).unwrap());
}

#[test]
fn a_tpm_without_a_sha256_bank_is_an_error_not_a_fresh_node() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let options = ManufactureOptions::new(dir.path().join("ek-ca"))
        .unwrap()
        .with_pcr_banks([PcrBank::Sha1])
        .unwrap();
    manufacture(&state, &options).unwrap();
    let swtpm = SwtpmProcess::start(&SwtpmConfig::new(&state).unwrap()).unwrap();
    let mut tpm = Tpm::open(&swtpm.tcti().parse().unwrap()).unwrap();
    match is_node_bootstrapped(&mut tpm) {
        Err(MarkerError::Read(_) | MarkerError::Absent) => {}
        other => panic!("expected an error for a missing SHA-256 bank, got {other:?}"),
    }
}

#[test]
fn the_testkit_swtpm_is_the_production_launcher() {
    // The testkit keeps its API on top of `asterism_swtpm`: a fresh TPM is unmarked.
    let swtpm = Swtpm::start().unwrap();
    let mut tpm = Tpm::open(&swtpm.config()).unwrap();
    assert!(!is_node_bootstrapped(&mut tpm).unwrap());
}

//! PCR read, extend and event against a real TPM (swtpm), checked against SHA-256 computed
//! here.

use crate::common::{sha256, swtpm_and_tpm};
use asterism_tpm::pcr::{self, PCR_CLUSTER_ID};
use asterism_tpm::{MAX_EVENT_DATA, PcrSelection, Tpm, TpmError};

fn pcr_value(tpm: &mut Tpm, index: u32) -> [u8; 32] {
    let values = tpm.read_pcrs(&PcrSelection::new([index]).unwrap()).unwrap();
    assert_eq!(values.len(), 1);
    assert_eq!(values[0].0, index);
    values[0].1
}

#[test]
fn reads_all_24_sha256_pcrs_in_index_order() {
    let (_swtpm, mut tpm) = swtpm_and_tpm(true);
    let values = tpm.read_pcrs(&PcrSelection::all()).unwrap();
    assert_eq!(values.len(), 24);
    let indices: Vec<u32> = values.iter().map(|(i, _)| *i).collect();
    assert_eq!(indices, (0..24).collect::<Vec<_>>());
    // After TPM2_Startup(CLEAR) the static PCRs are zero; 17..=22 (dynamic, locality
    // resettable) start as all ones on a PC-client TPM.
    for (index, value) in &values {
        if (17..=22).contains(index) {
            assert_eq!(value, &[0xff; 32], "PCR {index}");
        } else {
            assert_eq!(value, &[0; 32], "PCR {index}");
        }
    }
}

#[test]
fn reading_a_subset_returns_exactly_that_subset() {
    let (_swtpm, mut tpm) = swtpm_and_tpm(false);
    let selection = PcrSelection::new([23, 0, 9, 1, 2, 3, 4, 5, 6, 7, 8, 16]).unwrap();
    let values = tpm.read_pcrs(&selection).unwrap();
    let indices: Vec<u32> = values.iter().map(|(i, _)| *i).collect();
    assert_eq!(indices, vec![0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 23]);
}

#[test]
fn extend_sets_the_pcr_to_sha256_of_old_value_and_digest() {
    let (_swtpm, mut tpm) = swtpm_and_tpm(false);
    let digest = sha256(b"asterism test measurement");
    let old = pcr_value(&mut tpm, 10);
    tpm.extend_pcr(10, &digest).unwrap();
    let mut expected = [0u8; 64];
    expected[..32].copy_from_slice(&old);
    expected[32..].copy_from_slice(&digest);
    let once = pcr_value(&mut tpm, 10);
    assert_eq!(once, sha256(&expected));
    assert_eq!(once, pcr::extended(&old, &digest));

    // A second extension chains on the new value.
    tpm.extend_pcr(10, &digest).unwrap();
    assert_eq!(pcr_value(&mut tpm, 10), pcr::extended(&once, &digest));
    // Other PCRs are untouched.
    assert_eq!(pcr_value(&mut tpm, 11), [0; 32]);
}

#[test]
fn pcr_event_on_pcr_15_matches_the_reference_worked_example() {
    // The original's worked example: PCR_Event(15, clusterID) from zero.
    let cluster_id =
        hex::decode("128c164378fe8767f998fbdfe4b4d6463ec5ae1b664ea5999bc27417607ae9b6").unwrap();
    let expected =
        hex::decode("23400370357e846478cce7cc0c76cdfe4da077cc57b36dee0f665ede2c8b3f2f").unwrap();
    let (_swtpm, mut tpm) = swtpm_and_tpm(true);
    assert_eq!(pcr_value(&mut tpm, PCR_CLUSTER_ID), [0; 32]);
    tpm.pcr_event(PCR_CLUSTER_ID, &cluster_id).unwrap();
    let value = pcr_value(&mut tpm, PCR_CLUSTER_ID);
    assert_eq!(value.as_slice(), expected.as_slice());

    let mut preimage = [0u8; 64];
    preimage[32..].copy_from_slice(&sha256(&cluster_id));
    assert_eq!(value, sha256(&preimage));
}

#[test]
fn pcr_event_works_with_several_banks_allocated() {
    // A TPM not manufactured by swtpm_setup keeps libtpms's default banks (SHA-1 and
    // SHA-256 at least); the event must extend them all and still give the SHA-256 value.
    let (_swtpm, mut tpm) = swtpm_and_tpm(false);
    let data = b"event data";
    tpm.pcr_event(16, data).unwrap();
    assert_eq!(pcr_value(&mut tpm, 16), pcr::event_extended(&[0; 32], data));
}

#[test]
fn invalid_indices_and_oversized_events_are_rejected_before_reaching_the_tpm() {
    let (_swtpm, mut tpm) = swtpm_and_tpm(false);
    assert!(matches!(
        tpm.extend_pcr(24, &[0; 32]),
        Err(TpmError::InvalidPcrIndex { index: 24 })
    ));
    assert!(matches!(
        tpm.pcr_event(99, b"x"),
        Err(TpmError::InvalidPcrIndex { index: 99 })
    ));
    assert!(matches!(
        tpm.pcr_event(15, &vec![0u8; MAX_EVENT_DATA + 1]),
        Err(TpmError::EventDataTooLong { .. })
    ));
    tpm.pcr_event(15, &vec![0u8; MAX_EVENT_DATA]).unwrap();
}

#[test]
fn pcrs_survive_reopening_the_connection_but_not_a_tpm_reset() {
    let (mut swtpm, mut tpm) = swtpm_and_tpm(false);
    let digest = sha256(b"boot component");
    tpm.extend_pcr(14, &digest).unwrap();
    let extended = pcr_value(&mut tpm, 14);
    assert_ne!(extended, [0; 32]);

    // Same swtpm process, new TSS connection: the PCR keeps its value.
    drop(tpm);
    let mut tpm = Tpm::open(&swtpm.config()).unwrap();
    assert_eq!(pcr_value(&mut tpm, 14), extended);

    // New swtpm process on the same state, started with TPM2_Startup(CLEAR): a reset.
    drop(tpm);
    swtpm.restart().unwrap();
    let mut tpm = Tpm::open(&swtpm.config()).unwrap();
    assert_eq!(pcr_value(&mut tpm, 14), [0; 32]);
}

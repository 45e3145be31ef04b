//! Quotes: the TPMS_ATTEST and TPMT_SIGNATURE bytes are what a verifier expects, carry the
//! qualifying data and the PCR digest, and the signature verifies in software.

use crate::common::{ALG_SHA256, parse_attest, sha256, swtpm_and_tpm, verify_quote_signature};
use asterism_tpm::pcr;
use asterism_tpm::{AkAlgorithm, AkConfig, MAX_QUALIFYING_DATA, PcrSelection, Tpm, TpmError};

const TPM_GENERATED_VALUE: u32 = 0xff54_4347;
const TPM_ST_ATTEST_QUOTE: u16 = 0x8018;

#[test]
fn quote_attest_has_magic_type_qualifying_data_and_pcr_digest() {
    let (_swtpm, mut tpm) = swtpm_and_tpm(false);
    let ak = tpm.load_attestation_key(&AkConfig::default()).unwrap();
    let nonce = sha256(b"asterism/verify/v1 nonce");
    let quote = tpm.quote(&ak, &nonce, &PcrSelection::all()).unwrap();

    assert_eq!(&quote.attest[..4], &[0xff, 0x54, 0x43, 0x47]);
    assert_eq!(&quote.attest[4..6], &[0x80, 0x18]);
    let attest = parse_attest(&quote.attest);
    assert_eq!(attest.magic, TPM_GENERATED_VALUE);
    assert_eq!(attest.kind, TPM_ST_ATTEST_QUOTE);
    assert_eq!(attest.extra_data, nonce);

    assert_eq!(quote.selection, (0..24).collect::<Vec<_>>());
    assert_eq!(
        attest.selections,
        vec![(ALG_SHA256, quote.selection.clone())]
    );
    assert_eq!(quote.pcrs.len(), 24);
    let mut concatenated = Vec::new();
    for (_, value) in &quote.pcrs {
        concatenated.extend_from_slice(value);
    }
    assert_eq!(attest.pcr_digest, sha256(&concatenated));
}

#[test]
fn ecc_quote_signature_verifies_in_software() {
    let (_swtpm, mut tpm) = swtpm_and_tpm(false);
    let ak = tpm.load_attestation_key(&AkConfig::default()).unwrap();
    let quote = tpm.quote(&ak, &[0x5a; 32], &PcrSelection::all()).unwrap();
    verify_quote_signature(ak.public_area(), &quote.attest, &quote.signature);

    // A flipped bit in the attestation must break the signature: the check is real.
    let mut tampered = quote.attest.clone();
    let last = tampered.len() - 1;
    tampered[last] ^= 1;
    let verified = std::panic::catch_unwind(|| {
        verify_quote_signature(ak.public_area(), &tampered, &quote.signature)
    });
    assert!(verified.is_err(), "a tampered attestation verified");
}

#[test]
fn rsa_quote_signature_verifies_in_software() {
    let (_swtpm, mut tpm) = swtpm_and_tpm(false);
    let ak = tpm
        .load_attestation_key(&AkConfig::new(AkAlgorithm::Rsa2048))
        .unwrap();
    let quote = tpm
        .quote(&ak, b"short nonce", &PcrSelection::all())
        .unwrap();
    assert_eq!(parse_attest(&quote.attest).extra_data, b"short nonce");
    verify_quote_signature(ak.public_area(), &quote.attest, &quote.signature);
}

#[test]
fn quote_covers_the_current_pcr_values_of_a_subset() {
    let (_swtpm, mut tpm) = swtpm_and_tpm(false);
    let ak = tpm.load_attestation_key(&AkConfig::default()).unwrap();
    tpm.pcr_event(15, b"cluster id").unwrap();
    let selection = PcrSelection::new([15, 4, 23]).unwrap();
    let quote = tpm.quote(&ak, &[], &selection).unwrap();

    assert_eq!(quote.selection, vec![4, 15, 23]);
    assert_eq!(
        quote.pcrs[1],
        (15, pcr::event_extended(&[0; 32], b"cluster id"))
    );
    let attest = parse_attest(&quote.attest);
    assert!(attest.extra_data.is_empty());
    assert_eq!(attest.selections, vec![(ALG_SHA256, vec![4, 15, 23])]);
    assert_eq!(attest.pcr_digest, pcr::quote_digest(&quote.pcrs));
    verify_quote_signature(ak.public_area(), &quote.attest, &quote.signature);
}

#[test]
fn qualifying_data_longer_than_32_bytes_is_rejected() {
    let (_swtpm, mut tpm) = swtpm_and_tpm(false);
    let ak = tpm.load_attestation_key(&AkConfig::default()).unwrap();
    let too_long = vec![1u8; MAX_QUALIFYING_DATA + 1];
    assert!(matches!(
        tpm.quote(&ak, &too_long, &PcrSelection::all()),
        Err(TpmError::QualifyingDataTooLong { len: 33, max: 32 })
    ));
}

#[test]
fn quoting_with_an_ak_that_was_replaced_at_its_handle_is_refused() {
    let (swtpm, mut tpm) = swtpm_and_tpm(false);
    let ak = tpm.load_attestation_key(&AkConfig::default()).unwrap();
    // Another key takes the AK's handle.
    let rsa_here = AkConfig::new(AkAlgorithm::Rsa2048).with_handle(ak.handle().unwrap());
    assert!(tpm.load_attestation_key(&rsa_here).unwrap().was_created());

    // Both on this connection and on a fresh one, the stale AK is not used to sign.
    assert!(matches!(
        tpm.quote(&ak, &[0; 32], &PcrSelection::all()),
        Err(TpmError::AkReplaced { .. })
    ));
    drop(tpm);
    let mut tpm = Tpm::open(&swtpm.config()).unwrap();
    assert!(matches!(
        tpm.quote(&ak, &[0; 32], &PcrSelection::all()),
        Err(TpmError::AkReplaced { .. })
    ));
}

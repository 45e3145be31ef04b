//! Evidence decoder and the whole validator on arbitrary bytes: must never panic, and the
//! decoder must judge every input as decode-then-re-encode does.
#![no_main]

use asterism_attestation::tpm::{
    AkFingerprint, AkTrust, QuoteEvidence, TpmQuoteEvidence, TpmQuoteValidator,
};
use asterism_attestation::{ExpectedPcr, Measurements, PcrIndex, ReportData, Validator};
use libfuzzer_sys::fuzz_target;
use prost::Message;
use std::sync::OnceLock;

fn validator() -> &'static TpmQuoteValidator {
    static V: OnceLock<TpmQuoteValidator> = OnceLock::new();
    V.get_or_init(|| {
        let m = PcrIndex::new(15)
            .and_then(|i| Measurements::new([(i, ExpectedPcr::enforce([0; 32]))]).ok());
        let Some(m) = m else {
            std::process::abort();
        };
        // A pinned AK: fuzzing runs optimised, where the insecure any-AK policy does not
        // exist. The decoder and the AK policy run before the trust check.
        TpmQuoteValidator::new(
            AkTrust::pinned([AkFingerprint::from([0u8; 32])]),
            m.into_provider(),
        )
    })
}

fuzz_target!(|data: &[u8]| {
    // The one-pass decoder accepts exactly what decode-then-re-encode accepts, with the same
    // evidence: prost's wire message re-encodes to the input, and builds the same evidence.
    let ours = QuoteEvidence::decode(data);
    let oracle = TpmQuoteEvidence::decode(data)
        .ok()
        .filter(|w| w.encode_to_vec() == data && data.len() <= 64 * 1024)
        .map(QuoteEvidence::try_from);
    match (&ours, oracle) {
        (Ok(ev), Some(Ok(want))) => {
            assert_eq!(ev, &want);
            assert!(ev.pcrs.len() <= 24);
        }
        (Ok(_), _) => panic!("accepted what decode-then-re-encode refuses"),
        (Err(_), Some(Ok(_))) => panic!("refused what decode-then-re-encode accepts"),
        (Err(_), _) => {}
    }
    let _ = validator().validate(data, &ReportData::verify(b"fuzz"));
});

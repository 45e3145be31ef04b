//! Evidence decoder and the whole validator on arbitrary bytes: must never panic, and
//! decoded evidence must re-encode canonically.
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
    if let Ok(ev) = QuoteEvidence::decode(data) {
        // Accepted input is canonical: the wire message re-encodes to the same bytes.
        let wire = TpmQuoteEvidence::decode(data).ok();
        assert_eq!(wire.map(|w| w.encode_to_vec()).as_deref(), Some(data));
        assert!(ev.pcrs.len() <= 24);
    }
    let _ = validator().validate(data, &ReportData::verify(b"fuzz"));
});

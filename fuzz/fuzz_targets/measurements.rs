//! Measurements JSON loader on arbitrary bytes: must never panic, and whatever loads must
//! survive a round trip through its own JSON output.
#![no_main]

use asterism_attestation::Measurements;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Measurements::from_json(data) {
        let again = Measurements::from_json(m.to_json().as_bytes()).ok();
        assert_eq!(again.as_ref(), Some(&m));
    }
});

//! `TpmtPublic` parser on arbitrary bytes: must never panic, and whatever parses must marshal
//! back to exactly the input (no padding, no truncation, nothing ignored).
#![no_main]

use asterism_attestation::tpm::TpmtPublic;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(parsed) = TpmtPublic::parse(data) {
        assert_eq!(parsed.to_bytes().ok().as_deref(), Some(data));
    }
});

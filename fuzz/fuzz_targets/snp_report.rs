//! `SnpReport` parser on arbitrary bytes: must never panic; whatever parses is exactly one
//! report's size, and its bytes, signed region and signature read back as given.
#![no_main]

use asterism_attestation::snp::{REPORT_SIZE, SIGNED_LEN, SnpReport};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(report) = SnpReport::parse(data) {
        assert_eq!(data.len(), REPORT_SIZE);
        assert_eq!(report.as_bytes().as_slice(), data);
        assert_eq!(report.signed_bytes(), &data[..SIGNED_LEN]);
        let sig = report.signature_fixed();
        let r: Vec<u8> = data[SIGNED_LEN..SIGNED_LEN + 48].iter().rev().copied().collect();
        assert_eq!(&sig[..48], r.as_slice());
    }
});

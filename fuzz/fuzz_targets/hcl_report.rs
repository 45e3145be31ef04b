//! `HclReport` and `RuntimeData` parsers on arbitrary bytes: must never panic; a report that
//! parses has a hardware report of its kind's exact size, and its runtime data goes on to
//! the JSON parser as a verifier would pass it.
#![no_main]

use asterism_attestation::hcl::{
    HardwareReport, HclReport, RuntimeData, SNP_REPORT_SIZE, TD_REPORT_SIZE,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(report) = HclReport::parse(data) {
        match report.hardware_report() {
            HardwareReport::Snp(b) => assert_eq!(b.len(), SNP_REPORT_SIZE),
            HardwareReport::Tdx(b) => assert_eq!(b.len(), TD_REPORT_SIZE),
        }
        let _ = report.hardware_report().unverified_report_data();
        let _ = RuntimeData::parse(report.runtime_data());
    }
    let _ = RuntimeData::parse(data);
});

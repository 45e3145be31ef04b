//! TDX quote parser on arbitrary bytes: must never panic, and whatever parses must have
//! consumed every byte with the sizes its version and body type require.
#![no_main]

use asterism_attestation::tdx::{TdQuote, TdReportKind};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(quote) = TdQuote::parse(data) {
        let report = quote.report();
        assert!(matches!(quote.version(), 4 | 5));
        assert_eq!(
            report.kind == TdReportKind::Td10,
            report.tee_tcb_svn2.is_none() && report.mr_service_td.is_none()
        );
        // A parsed quote holds at least a header, a body and the fixed signature data.
        assert!(data.len() >= 48 + 584 + 4 + 128 + 6 + 384 + 64 + 2 + 6);
        assert!(!data.ends_with(&[0]) || quote.pck_chain_pem().ends_with(&[0]));
    }
});

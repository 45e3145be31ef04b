//! The frame decoders on arbitrary payloads: must never panic, and whatever decodes must
//! re-encode to the same payload.
#![no_main]

use asterism_atls::session::SessionKeyEvidence;
use asterism_atls::wire::{self, EvidenceFrame, Hello, Verdict};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = Hello::decode(data) {
        let mut out = Vec::new();
        let _ = wire::encode_hello(&mut out, h);
        assert_eq!(out.get(wire::HEADER_LEN..), Some(data));
        let _ = h.check_flags();
    }
    if let Ok(e) = EvidenceFrame::decode(data) {
        let mut out = Vec::new();
        if wire::encode_evidence(&mut out, &e.variant, &e.evidence).is_ok() {
            assert_eq!(out.get(wire::HEADER_LEN..), Some(data));
        }
    }
    if let Ok(v) = Verdict::decode(data) {
        assert!(v.reason.len() <= wire::MAX_REASON_LEN);
    }
    if let Ok(s) = SessionKeyEvidence::decode(data) {
        assert_eq!(s.encode(), data);
    }
});

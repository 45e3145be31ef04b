//! The sans-I/O exchange, as client and as server, fed arbitrary peer bytes in arbitrary
//! chunks: must never panic, never ask for zero bytes, never ask for more than it may
//! buffer, and never report success with a peer it did not verify.
#![no_main]

use asterism_atls::machine::{Exchange, Step};
use asterism_atls::{AtlsConfig, Role};
use asterism_attestation::tpm::{AkTrust, TpmQuoteValidator};
use asterism_attestation::{ExpectedPcr, Measurements, PcrIndex};
use libfuzzer_sys::fuzz_target;
use std::sync::{Arc, OnceLock};

/// A verifying side: a real TPM-quote validator that trusts no AK, so every evidence is
/// rejected after the frame and session-key layers have parsed it.
fn config(small_cap: bool) -> Arc<AtlsConfig> {
    static V: OnceLock<Arc<TpmQuoteValidator>> = OnceLock::new();
    let v = V.get_or_init(|| {
        let m = PcrIndex::new(15)
            .and_then(|i| Measurements::new([(i, ExpectedPcr::enforce([0; 32]))]).ok());
        let Some(m) = m else {
            std::process::abort();
        };
        Arc::new(TpmQuoteValidator::new(
            AkTrust::pinned([]),
            m.into_provider(),
        ))
    });
    let cfg = AtlsConfig::verifying(v.clone());
    Arc::new(if small_cap {
        cfg.with_max_frame_len(4096)
    } else {
        cfg
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&ctl, mut input)) = data.split_first() else {
        return;
    };
    let role = if ctl & 1 == 0 { Role::Client } else { Role::Server };
    let cfg = config(ctl & 2 != 0);
    let mut x = Exchange::new(role, cfg, [ctl; 32], None, 1_700_000_000);
    let chunk = usize::from(ctl >> 2).max(1);
    for _ in 0..10_000 {
        let _ = x.take_output();
        match x.step() {
            Ok(Step::Read(n)) => {
                assert!(n >= 1 && n <= asterism_atls::MAX_EVIDENCE_FRAME_LEN + 5);
                if input.is_empty() {
                    return;
                }
                let take = n.min(chunk).min(input.len());
                let (now, rest) = input.split_at(take);
                input = rest;
                if x.feed(now).is_err() {
                    let _ = x.take_output();
                    return;
                }
            }
            Ok(Step::Issue(_)) => {
                // This configuration never attests.
                std::process::abort();
            }
            Ok(Step::Done) => {
                // The validator trusts no AK: a verifying side can never succeed.
                std::process::abort();
            }
            Err(_) => return,
        }
    }
});

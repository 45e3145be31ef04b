//! TDX collateral JSON on arbitrary bytes: parsing, the unverified FMSPC and freshness, the
//! set's selection and the verification of a real quote against it must never panic, and
//! the quote must never verify against collateral Intel did not sign.
#![no_main]

use asterism_attestation::InsecureNoLaunchMeasurement;
use asterism_attestation::tdx::{TdQuote, TdxCollateral, TdxPolicy, TdxVerifier};
use asterism_attestation::tpm::TdxCollateralSet;
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;
use std::time::{Duration, UNIX_EPOCH};

const QUOTE: &[u8] = include_bytes!("../../crates/attestation/tests/data/cvm/tdx-dcap/tdx_quote");
const COLLATERAL: &[u8] = include_bytes!("../../crates/attestation/tests/data/cvm/tdx-dcap/tdx_quote_collateral.json");

fn verifier() -> &'static TdxVerifier {
    static V: OnceLock<TdxVerifier> = OnceLock::new();
    V.get_or_init(|| {
        TdxVerifier::new(TdxPolicy {
            insecure_no_launch_measurement: Some(InsecureNoLaunchMeasurement::insecure_new()),
            ..TdxPolicy::default()
        })
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(collateral) = TdxCollateral::from_json(data) else {
        return;
    };
    let _ = collateral.fmspc();
    let _ = collateral.freshness();
    let _ = TdxCollateralSet::new(vec![collateral.clone(), collateral.clone()]);
    // The published quote is followed by zero padding; the verifier is given it as is.
    let Ok(parsed) = TdQuote::parse(QUOTE) else {
        return;
    };
    let report_data = parsed.report().report_data;
    let now = UNIX_EPOCH + Duration::from_secs(1_751_328_000);
    if verifier()
        .verify(QUOTE, &collateral, &report_data, now)
        .is_ok()
    {
        // Intel's signatures cover every part that decides; only the real bytes pass.
        let real = TdxCollateral::from_json(COLLATERAL).ok();
        assert_eq!(real.and_then(|r| r.fmspc()), collateral.fmspc());
    }
});

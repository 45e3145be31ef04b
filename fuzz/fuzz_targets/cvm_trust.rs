//! The whole confidential-VM trust path on arbitrary evidence: for each platform, the
//! quote validator with the hardware-report AK trust must never panic and never accept
//! (no real cloud vTPM key signs fuzzed quotes).
#![no_main]

use asterism_attestation::explain::Reference;
use asterism_attestation::snp::SnpPolicy;
use asterism_attestation::tdx::{TdxCollateral, TdxPolicy};
use asterism_attestation::tpm::{
    AkTrust, CvmAkTrust, CvmPlatform, TdxCollateralSet, TpmQuoteValidator,
};
use asterism_attestation::{
    CvmReferences, ExpectedPcr, Measurements, PcrIndex, ReportData, Validator,
};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

const COLLATERAL: &[u8] = include_bytes!("../../crates/attestation/tests/data/cvm/tdx-dcap/tdx_quote_collateral.json");

fn validators() -> &'static [TpmQuoteValidator] {
    static V: OnceLock<Vec<TpmQuoteValidator>> = OnceLock::new();
    V.get_or_init(|| {
        let references = CvmReferences {
            snp_launch_measurement: Some(Reference::enforce([0; 48])),
            snp_host_data: None,
            tdx_mrtd: Some(Reference::enforce([0; 48])),
            tdx_rtmrs: [Some(Reference::enforce([0; 48])); 4],
        };
        let m = PcrIndex::new(15)
            .and_then(|i| Measurements::new([(i, ExpectedPcr::enforce([0; 32]))]).ok());
        let Some(m) = m else {
            std::process::abort();
        };
        let m = m.with_cvm(references);
        let mut trusts = Vec::new();
        for platform in [CvmPlatform::AzureSevSnp, CvmPlatform::AwsSevSnp] {
            if let Ok(t) = CvmAkTrust::sev_snp(platform, SnpPolicy::default()) {
                trusts.push(t);
            }
        }
        let collateral = TdxCollateral::from_json(COLLATERAL)
            .ok()
            .and_then(|c| TdxCollateralSet::new(vec![c]).ok())
            .unwrap_or_default();
        trusts.push(CvmAkTrust::azure_tdx(TdxPolicy::default(), collateral));
        trusts
            .into_iter()
            .map(|t| TpmQuoteValidator::new(AkTrust::confidential_vm(t), m.clone().into_provider()))
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let expected = ReportData::verify(b"fuzz");
    for validator in validators() {
        assert!(validator.validate(data, &expected).is_err());
    }
});

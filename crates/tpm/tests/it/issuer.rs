//! The `tpm-quote` issuer on swtpm, checked by the pure-Rust validator.

use asterism_attestation::{
    ExpectedPcr, Issuer, Measurements, PcrIndex, ReportData, Role, TpmQuoteValidator, Validator,
};
use asterism_testkit::{Swtpm, pin};
use asterism_tpm::{AkConfig, PcrSelection, Tpm, TpmIssuer};

fn validator_for(ak_public: &[u8], pcr0: [u8; 32]) -> TpmQuoteValidator {
    let m = Measurements::new([(PcrIndex::new(0).unwrap(), ExpectedPcr::enforce(pcr0))]).unwrap();
    TpmQuoteValidator::new(pin(ak_public), m.into_provider())
}

#[test]
fn per_use_issuers_share_one_swtpm_and_their_evidence_verifies() {
    let swtpm = Swtpm::start().unwrap();
    let pcr0 = {
        let mut tpm = Tpm::open(&swtpm.config()).unwrap();
        tpm.read_pcrs(&PcrSelection::new([0]).unwrap()).unwrap()[0].1
    };
    let a = swtpm.issuer().unwrap();
    let b = swtpm.issuer().unwrap();
    assert_eq!(a.ak_public(), b.ak_public(), "both load the persisted AK");
    let validator = validator_for(a.ak_public(), pcr0);
    for i in 0..3u8 {
        let rd = ReportData::atls(Role::Client, &[i; 32]);
        for issuer in [&a, &b] {
            let evidence = issuer.issue(&rd).unwrap();
            validator.validate(&evidence, &rd).unwrap();
        }
    }
}

#[test]
fn a_held_issuer_binds_its_quotes_to_the_report_data() {
    let swtpm = Swtpm::start().unwrap();
    let mut tpm = Tpm::open(&swtpm.config()).unwrap();
    let pcr0 = tpm.read_pcrs(&PcrSelection::new([0]).unwrap()).unwrap()[0].1;
    let issuer =
        TpmIssuer::new(tpm, &AkConfig::default(), PcrSelection::all(), Vec::new()).unwrap();
    let validator = validator_for(issuer.ak_public(), pcr0);
    let rd = ReportData::atls(Role::Server, &[1; 32]);
    let evidence = issuer.issue(&rd).unwrap();
    validator.validate(&evidence, &rd).unwrap();
    let other = ReportData::atls(Role::Server, &[2; 32]);
    assert!(validator.validate(&evidence, &other).is_err());
}

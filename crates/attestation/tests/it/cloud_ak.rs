//! AK trust by a cloud's vTPM CA, with software AKs certified by a software "cloud" CA:
//! what the real GCE attestation (the crate's `tpm::cloud` tests) cannot show, because
//! nobody can have Google sign a certificate with another key usage or another key type.

use crate::common::*;
use asterism_attestation::tpm::structures::ObjectAttributes;
use asterism_attestation::tpm::{AK_ATTRIBUTES, AkTrust, CloudAkCa, TpmQuoteValidator};
use asterism_attestation::{Issuer, ReportData, Role, ValidationError, Validator};
use asterism_soft_tpm::{SoftAk, SoftTpm};
use rcgen::{ExtendedKeyUsagePurpose, KeyUsagePurpose};
use std::time::{Duration, SystemTime};

fn rd() -> ReportData {
    ReportData::atls(Role::Client, &[0x22; 32])
}

/// The cloud's template: an AK without noDA, as GCE and Azure make them.
fn cloud_ak(ak: SoftAk) -> SoftAk {
    ak.with_public(|p| p.attributes.0 &= !ObjectAttributes::NO_DA)
        .unwrap()
}

fn tpm_with(ak: SoftAk, chain: impl FnOnce(&SoftAk) -> Vec<Vec<u8>>) -> SoftTpm {
    let mut tpm = booted_tpm(ak);
    let c = chain(tpm.ak());
    tpm.set_ak_cert_chain(c);
    tpm
}

fn validator(root: &TestCa, intermediates: &[&TestCa], tpm: &SoftTpm) -> TpmQuoteValidator {
    let ca = CloudAkCa::from_der(
        [&root.cert_der],
        intermediates.iter().map(|i| i.cert_der.as_slice()),
    )
    .unwrap();
    TpmQuoteValidator::new(AkTrust::cloud_ak(ca), measurements_of(tpm).into_provider())
}

fn untrusted(r: Result<impl std::fmt::Debug, ValidationError>, needle: &str) {
    match r {
        Err(ValidationError::UntrustedKey(m)) => assert!(m.contains(needle), "{m}"),
        other => panic!("want untrusted key containing {needle:?}, got {other:?}"),
    }
}

#[test]
fn accepts_ecc_and_rsa_aks_in_the_clouds_template_through_a_configured_intermediate() {
    let root = TestCa::new("cloud root");
    let inter = root.intermediate("cloud intermediate");
    for ak in [ecdsa_ak(), rsa_ak()] {
        let tpm = tpm_with(cloud_ak(ak), |ak| vec![inter.certify(ak)]);
        let v = validator(&root, &[&inter], &tpm);
        let ok = v.validate(&tpm.issue(&rd()).unwrap(), &rd()).unwrap();
        assert_eq!(ok.measurements().len(), 24);
    }
}

#[test]
fn accepts_an_intermediate_the_evidence_carries() {
    let root = TestCa::new("cloud root");
    let inter = root.intermediate("cloud intermediate");
    let tpm = tpm_with(cloud_ak(ecdsa_ak()), |ak| {
        vec![inter.certify(ak), inter.cert_der.clone()]
    });
    validator(&root, &[], &tpm)
        .validate(&tpm.issue(&rd()).unwrap(), &rd())
        .unwrap();
}

#[test]
fn accepts_the_aik_extended_key_usage() {
    let root = TestCa::new("cloud root");
    let tpm = tpm_with(cloud_ak(ecdsa_ak()), |ak| {
        vec![root.certify_with(ak, |p| p.extended_key_usages = vec![aik_eku()])]
    });
    validator(&root, &[], &tpm)
        .validate(&tpm.issue(&rd()).unwrap(), &rd())
        .unwrap();
}

#[test]
fn rejects_an_ak_certificate_for_another_purpose() {
    let root = TestCa::new("cloud root");
    let tpm = tpm_with(cloud_ak(ecdsa_ak()), |ak| {
        vec![root.certify_with(ak, |p| {
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth]
        })]
    });
    untrusted(
        validator(&root, &[], &tpm).validate(&tpm.issue(&rd()).unwrap(), &rd()),
        "extended key usage names neither",
    );
}

#[test]
fn rejects_an_ak_certificate_without_digital_signature() {
    let root = TestCa::new("cloud root");
    let tpm = tpm_with(cloud_ak(ecdsa_ak()), |ak| {
        vec![root.certify_with(ak, |p| {
            p.key_usages = vec![KeyUsagePurpose::KeyEncipherment]
        })]
    });
    untrusted(
        validator(&root, &[], &tpm).validate(&tpm.issue(&rd()).unwrap(), &rd()),
        "lacks digitalSignature",
    );
}

#[test]
fn rejects_an_ak_certificate_without_key_usage() {
    let root = TestCa::new("cloud root");
    let tpm = tpm_with(cloud_ak(ecdsa_ak()), |ak| {
        vec![root.certify_with(ak, |p| p.key_usages = Vec::new())]
    });
    untrusted(
        validator(&root, &[], &tpm).validate(&tpm.issue(&rd()).unwrap(), &rd()),
        "has no keyUsage",
    );
}

#[test]
fn rejects_a_chain_to_a_root_past_its_validity() {
    // webpki does not look at a trust anchor's validity; the cloud policy does.
    let root = TestCa::new_with("cloud root", |p| {
        p.not_before = rcgen::date_time_ymd(2000, 1, 1);
        p.not_after = rcgen::date_time_ymd(2001, 1, 1);
    });
    let tpm = tpm_with(cloud_ak(ecdsa_ak()), |ak| vec![root.certify(ak)]);
    untrusted(
        validator(&root, &[], &tpm).validate(&tpm.issue(&rd()).unwrap(), &rd()),
        "is not valid at",
    );
}

#[test]
fn rejects_a_certificate_of_another_cloud_key() {
    let root = TestCa::new("cloud root");
    let other = cloud_ak(ecdsa_ak());
    let tpm = tpm_with(cloud_ak(ecdsa_ak()), |_| vec![root.certify(&other)]);
    untrusted(
        validator(&root, &[], &tpm).validate(&tpm.issue(&rd()).unwrap(), &rd()),
        "not the key in ak_public",
    );
}

#[test]
fn rejects_an_expired_ak_certificate() {
    let root = TestCa::new("cloud root");
    let tpm = tpm_with(cloud_ak(ecdsa_ak()), |ak| vec![root.certify(ak)]);
    let v = validator(&root, &[], &tpm)
        .with_clock(|| SystemTime::UNIX_EPOCH + Duration::from_secs(5000 * 365 * 86400));
    untrusted(v.validate(&tpm.issue(&rd()).unwrap(), &rd()), "CertExpired");
}

#[test]
fn the_cloud_template_is_accepted_and_an_ak_that_can_decrypt_is_not() {
    let root = TestCa::new("cloud root");
    // Asterism's own template (with noDA) is an AK too.
    let tpm = tpm_with(ecdsa_ak(), |ak| vec![root.certify(ak)]);
    assert_eq!(tpm.ak().public_area().attributes.0, AK_ATTRIBUTES);
    validator(&root, &[], &tpm)
        .validate(&tpm.issue(&rd()).unwrap(), &rd())
        .unwrap();
    let decrypt = cloud_ak(ecdsa_ak())
        .with_public(|p| p.attributes.0 |= ObjectAttributes::DECRYPT)
        .unwrap();
    let tpm = tpm_with(decrypt, |ak| vec![root.certify(ak)]);
    assert!(matches!(
        validator(&root, &[], &tpm).validate(&tpm.issue(&rd()).unwrap(), &rd()),
        Err(ValidationError::Policy(m)) if m.contains("decrypt")
    ));
}

#[test]
fn a_platform_ca_still_requires_the_exact_template() {
    // The relaxed attribute rule is the cloud policy's only: a platform CA certifies keys
    // made by our own template.
    let root = TestCa::new("platform root");
    let tpm = tpm_with(cloud_ak(ecdsa_ak()), |ak| vec![root.certify(ak)]);
    let v = TpmQuoteValidator::new(
        AkTrust::platform_ca(asterism_attestation::PlatformCa::from_der([&root.cert_der]).unwrap()),
        measurements_of(&tpm).into_provider(),
    );
    assert!(matches!(
        v.validate(&tpm.issue(&rd()).unwrap(), &rd()),
        Err(ValidationError::Policy(m)) if m.contains("not the AK template's")
    ));
}

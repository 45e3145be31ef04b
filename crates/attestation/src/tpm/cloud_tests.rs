//! A real Google Compute Engine vTPM attestation (`tests/data/gce-vtpm/`) verified end to
//! end with the cloud-AK trust policy, then refused after every single-field tamper, each
//! with its own reason.
//!
//! In the crate, not in `tests/`: the quote's qualifying data is another verifier's nonce
//! (`0x90 0x09`), not a [`crate::ReportData`], and only the crate's own tests may ask the
//! validator for a raw binding.

use super::*;
use crate::measurements::{ExpectedPcr, Measurements, PcrIndex};
use crate::tpm::{AkTrust, TpmQuoteEvidence, TpmQuoteValidator};
use crate::{ValidationError, VerifiedEvidence};
use prost::Message;
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

const ATTESTATION: &[u8] = include_bytes!("../../tests/data/gce-vtpm/gce-cos-85-nonce9009.pb");
const GCP_ROOT: &[u8] = include_bytes!("../../tests/data/tpm-ek-ca/gcp/tpm_ek_root_1.cer");
const GCP_INTERMEDIATE: &[u8] =
    include_bytes!("../../tests/data/tpm-ek-ca/gcp/tpm_ek_intermediate_2.crt");
const GCP_OTHER_INTERMEDIATE: &[u8] =
    include_bytes!("../../tests/data/tpm-ek-ca/gcp/tpm_ek_intermediate_3.crt");
const GCP_NEWER_ROOT: &[u8] =
    include_bytes!("../../tests/data/tpm-ek-ca/gcp/gcp_ek_ak_ca_root.crt");
const GCP_NEWER_INTERMEDIATE: &[u8] =
    include_bytes!("../../tests/data/tpm-ek-ca/gcp/gcp_ek_ak_ca_intermediate_v3.crt");
const AZURE_ROOT: &[u8] =
    include_bytes!("../../tests/data/cloud-ak-ca/azure/azure-virtual-tpm-root-2023.pem");
const AZURE_INTERMEDIATE: &[u8] =
    include_bytes!("../../tests/data/cloud-ak-ca/azure/global-virtual-tpm-ca-03.pem");

/// The nonce the attestation was taken with.
const NONCE: [u8; 2] = [0x90, 0x09];
/// `TPM_ALG_SHA256`, go-tpm-tools' `HashAlgo` SHA256.
const SHA256: i32 = 0x000b;

// The few fields of go-tpm-tools' `attest.Attestation` (proto/attest.proto) and
// `tpm.Quote`/`tpm.PCRs` (proto/tpm.proto) that the test reads; prost skips the rest.
#[derive(Clone, PartialEq, Message)]
struct Attestation {
    #[prost(bytes = "vec", tag = "1")]
    ak_pub: Vec<u8>,
    #[prost(message, repeated, tag = "2")]
    quotes: Vec<Quote>,
    #[prost(bytes = "vec", tag = "3")]
    event_log: Vec<u8>,
    #[prost(bytes = "vec", tag = "6")]
    ak_cert: Vec<u8>,
    #[prost(bytes = "vec", repeated, tag = "7")]
    intermediate_certs: Vec<Vec<u8>>,
}

#[derive(Clone, PartialEq, Message)]
struct Quote {
    #[prost(bytes = "vec", tag = "1")]
    quote: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    raw_sig: Vec<u8>,
    #[prost(message, optional, tag = "3")]
    pcrs: Option<Pcrs>,
}

#[derive(Clone, PartialEq, Message)]
struct Pcrs {
    #[prost(int32, tag = "1")]
    hash: i32,
    #[prost(btree_map = "uint32, bytes", tag = "2")]
    pcrs: BTreeMap<u32, Vec<u8>>,
}

/// The attestation's pieces, as a node would put them into `tpm-quote` evidence.
#[derive(Clone)]
struct Parts {
    attest: Vec<u8>,
    signature: Vec<u8>,
    pcrs: BTreeMap<PcrIndex, [u8; 32]>,
    ak_public: Vec<u8>,
    chain: Vec<Vec<u8>>,
    event_log: Vec<u8>,
}

impl Parts {
    fn real() -> Self {
        let a = Attestation::decode(ATTESTATION).unwrap();
        assert!(a.intermediate_certs.is_empty());
        let quote = a
            .quotes
            .iter()
            .find(|q| q.pcrs.as_ref().is_some_and(|p| p.hash == SHA256))
            .expect("a SHA-256 quote");
        let pcrs = quote
            .pcrs
            .as_ref()
            .unwrap()
            .pcrs
            .iter()
            .map(|(i, v)| {
                let index = PcrIndex::new(u8::try_from(*i).unwrap()).unwrap();
                (index, <[u8; 32]>::try_from(v.as_slice()).unwrap())
            })
            .collect();
        Self {
            attest: quote.quote.clone(),
            signature: quote.raw_sig.clone(),
            pcrs,
            ak_public: a.ak_pub,
            chain: vec![a.ak_cert],
            event_log: a.event_log,
        }
    }

    fn evidence(&self) -> Vec<u8> {
        TpmQuoteEvidence::new(
            self.attest.clone(),
            self.signature.clone(),
            &self.pcrs,
            self.ak_public.clone(),
            self.chain.clone(),
            Some(self.event_log.clone()),
        )
        .encode_to_vec()
    }
}

fn idx(i: u8) -> PcrIndex {
    PcrIndex::new(i).unwrap()
}

/// 2026-01-01, inside every validity period of the chain.
fn in_validity() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_225_600)
}

fn gcp() -> CloudAkCa {
    CloudAkCa::from_der([GCP_ROOT], [GCP_INTERMEDIATE]).unwrap()
}

/// Measurements that enforce the boot's own PCR 0, 4 and 7 values.
fn measurements(parts: &Parts) -> Measurements {
    Measurements::new(
        [0u8, 4, 7]
            .map(|i| (idx(i), ExpectedPcr::enforce(parts.pcrs[&idx(i)])))
            .to_vec(),
    )
    .unwrap()
}

fn validate_with(
    ca: CloudAkCa,
    at: SystemTime,
    parts: &Parts,
    nonce: &[u8],
) -> Result<VerifiedEvidence, ValidationError> {
    TpmQuoteValidator::new(AkTrust::cloud_ak(ca), measurements(parts).into_provider())
        .with_clock(move || at)
        .validate_raw_binding(&parts.evidence(), nonce)
}

fn validate(parts: &Parts) -> Result<VerifiedEvidence, ValidationError> {
    validate_with(gcp(), in_validity(), parts, &NONCE)
}

fn untrusted(r: Result<impl std::fmt::Debug, ValidationError>, needle: &str) {
    match r {
        Err(ValidationError::UntrustedKey(m)) => assert!(m.contains(needle), "{m}"),
        other => panic!("want untrusted key containing {needle:?}, got {other:?}"),
    }
}

#[test]
fn the_real_gce_attestation_verifies_to_googles_vtpm_root() {
    let parts = Parts::real();
    let ok = validate(&parts).unwrap();
    assert_eq!(ok.measurements().len(), 24);
    assert!(ok.warnings().is_empty(), "{:?}", ok.warnings());
    // The log was replayed: it covers the firmware PCRs, and PCR 0 is not zero.
    assert_ne!(parts.pcrs[&idx(0)], [0; 32]);
}

#[test]
fn a_certificate_for_another_key_is_refused() {
    let mut parts = Parts::real();
    // Another RSA-2048 key in the same template: one modulus byte changed (not its top
    // bit), so the AK policy passes and only the certificate can tell.
    let last = parts.ak_public.len() - 1;
    parts.ak_public[last] ^= 0x02;
    untrusted(
        validate(&parts),
        "the AK certificate's public key is not the key in ak_public",
    );
}

#[test]
fn another_certificate_of_the_vtpm_ca_is_refused_as_the_ak_certificate() {
    let mut parts = Parts::real();
    parts.chain = vec![GCP_OTHER_INTERMEDIATE.to_vec()];
    untrusted(validate(&parts), "CaUsedAsEndEntity");
}

#[test]
fn evidence_without_an_ak_certificate_is_refused() {
    let mut parts = Parts::real();
    parts.chain.clear();
    untrusted(validate(&parts), "carries no AK certificate");
}

#[test]
fn a_chain_without_its_intermediate_is_refused() {
    let parts = Parts::real();
    let ca = CloudAkCa::from_der([GCP_ROOT], [] as [&[u8]; 0]).unwrap();
    untrusted(
        validate_with(ca, in_validity(), &parts, &NONCE),
        "UnknownIssuer",
    );
}

#[test]
fn a_chain_to_another_root_is_refused() {
    let parts = Parts::real();
    let ca = CloudAkCa::from_der([GCP_NEWER_ROOT], [GCP_NEWER_INTERMEDIATE]).unwrap();
    untrusted(
        validate_with(ca, in_validity(), &parts, &NONCE),
        "UnknownIssuer",
    );
    let azure = CloudAkCa::from_files([AZURE_ROOT], [AZURE_INTERMEDIATE]).unwrap();
    untrusted(
        validate_with(azure, in_validity(), &parts, &NONCE),
        "UnknownIssuer",
    );
}

#[test]
fn an_ak_certificate_with_a_broken_signature_is_refused() {
    let mut parts = Parts::real();
    // The last byte of the certificate is the last byte of its signature.
    let cert = &mut parts.chain[0];
    let last = cert.len() - 1;
    cert[last] ^= 0x01;
    untrusted(validate(&parts), "InvalidSignatureForPublicKey");
}

#[test]
fn an_ak_certificate_past_its_validity_is_refused() {
    let parts = Parts::real();
    // 2052-01-01: the AK certificate expired on 2051-08-24.
    let later = SystemTime::UNIX_EPOCH + Duration::from_secs(2_587_679_999);
    untrusted(validate_with(gcp(), later, &parts, &NONCE), "CertExpired");
}

#[test]
fn another_nonce_is_refused() {
    let parts = Parts::real();
    assert!(matches!(
        validate_with(gcp(), in_validity(), &parts, &[0x90, 0x0a]),
        Err(ValidationError::BindingMismatch)
    ));
    assert!(matches!(
        validate_with(gcp(), in_validity(), &parts, &[0x90]),
        Err(ValidationError::BindingMismatch)
    ));
}

#[test]
fn a_quote_with_another_nonce_fails_its_signature() {
    let mut parts = Parts::real();
    let at = parts
        .attest
        .windows(4)
        .position(|w| w == [0x00, 0x02, 0x90, 0x09])
        .expect("extraData in the quote");
    parts.attest[at + 3] = 0x0a;
    assert!(matches!(
        validate_with(gcp(), in_validity(), &parts, &[0x90, 0x0a]),
        Err(ValidationError::BadSignature(_))
    ));
}

#[test]
fn a_tampered_quote_signature_is_refused() {
    let mut parts = Parts::real();
    let last = parts.signature.len() - 1;
    parts.signature[last] ^= 0x01;
    assert!(matches!(
        validate(&parts),
        Err(ValidationError::BadSignature(m)) if m.contains("RSASSA-SHA256")
    ));
}

#[test]
fn a_tampered_pcr_value_is_refused() {
    let mut parts = Parts::real();
    parts.pcrs.get_mut(&idx(9)).unwrap()[0] ^= 0x01;
    assert!(matches!(
        validate(&parts),
        Err(ValidationError::Policy(m)) if m.contains("do not hash to the signed pcrDigest")
    ));
}

#[test]
fn a_tampered_event_log_byte_is_refused() {
    let mut parts = Parts::real();
    // The SHA-256 digest of the separator (four zero bytes) in the first separator event.
    let separator =
        hex::decode("df3f619804a92fdb4057192dc43dd748ea778adc52bc498ce80524c014b81119").unwrap();
    let at = parts
        .event_log
        .windows(32)
        .position(|w| w == separator.as_slice())
        .expect("a separator event");
    parts.event_log[at] ^= 0x01;
    assert!(matches!(
        validate(&parts),
        Err(ValidationError::EventLogReplay { .. })
    ));
}

#[test]
fn the_quoted_pcrs_are_compared_with_the_measurements() {
    let parts = Parts::real();
    let other = Measurements::new(vec![(idx(4), ExpectedPcr::enforce([0x11; 32]))]).unwrap();
    let r = TpmQuoteValidator::new(AkTrust::cloud_ak(gcp()), other.into_provider())
        .with_clock(in_validity)
        .validate_raw_binding(&parts.evidence(), &NONCE);
    assert!(r.is_err(), "{r:?}");
}

#[test]
fn a_collected_ak_certificate_is_checked_on_its_own() {
    let parts = Parts::real();
    let fp = gcp()
        .check_ak_certificate(&parts.chain, &parts.ak_public, in_validity())
        .unwrap();
    assert_eq!(
        fp,
        AkKey::from_public(
            &TpmtPublic::parse(&parts.ak_public).unwrap(),
            AttributeRule::Required
        )
        .unwrap()
        .fingerprint()
        .unwrap()
    );
    let mut other = parts.ak_public.clone();
    let last = other.len() - 1;
    other[last] ^= 0x02;
    untrusted(
        gcp().check_ak_certificate(&parts.chain, &other, in_validity()),
        "not the key in ak_public",
    );
}

#[test]
fn the_azure_root_and_intermediate_load_as_a_cloud_ca() {
    CloudAkCa::from_files([AZURE_ROOT], [AZURE_INTERMEDIATE]).unwrap();
}

#[test]
fn a_leaf_certificate_is_refused_as_a_root_or_an_intermediate() {
    let leaf = Parts::real().chain.remove(0);
    assert!(matches!(
        CloudAkCa::from_der([leaf.as_slice()], [] as [&[u8]; 0]),
        Err(AkTrustError::CloudCertificate {
            role: "root",
            index: 0,
            ..
        })
    ));
    assert!(matches!(
        CloudAkCa::from_der([GCP_ROOT], [leaf.as_slice()]),
        Err(AkTrustError::CloudCertificate {
            role: "intermediate",
            index: 0,
            ..
        })
    ));
    assert!(matches!(
        CloudAkCa::from_der([] as [&[u8]; 0], [] as [&[u8]; 0]),
        Err(AkTrustError::NoRoots)
    ));
}

//! Shared test helpers: a software platform CA, log capture, measurement fixtures.
#![allow(dead_code, missing_docs)]

use asterism_attestation::{ExpectedPcr, Measurements, PcrIndex};
use asterism_soft_tpm::{SoftAk, SoftTpm};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PublicKeyData, SignatureAlgorithm,
};

pub const RSA_AK_PEM: &[u8] = include_bytes!("../data/test-ak-rsa2048.pk8.pem");

pub fn idx(i: u8) -> PcrIndex {
    PcrIndex::new(i).unwrap()
}

pub fn ecdsa_ak() -> SoftAk {
    SoftAk::generate_ecdsa_p256().unwrap()
}

pub fn rsa_ak() -> SoftAk {
    use rustls_pki_types::PrivatePkcs8KeyDer;
    use rustls_pki_types::pem::PemObject;
    let der = PrivatePkcs8KeyDer::from_pem_slice(RSA_AK_PEM).unwrap();
    SoftAk::from_rsa_pkcs8(der.secret_pkcs8_der()).unwrap()
}

/// A software TPM whose PCRs 4, 8, 9, 11, 12, 13, 15 look like a booted node
/// (15 stays zero: not yet bootstrapped).
pub fn booted_tpm(ak: SoftAk) -> SoftTpm {
    let mut tpm = SoftTpm::new(ak);
    for i in [4u8, 8, 9, 11, 12, 13] {
        tpm.extend_pcr(idx(i), &[i; 32]);
    }
    tpm
}

/// Enforces 4, 8, 9, 11, 12, 13, 15 at the TPM's current values; 14 warn-only.
pub fn measurements_of(tpm: &SoftTpm) -> Measurements {
    let mut entries: Vec<_> = [4u8, 8, 9, 11, 12, 13, 15]
        .into_iter()
        .map(|i| (idx(i), ExpectedPcr::enforce(tpm.pcr(idx(i)))))
        .collect();
    entries.push((idx(14), ExpectedPcr::warn_only(tpm.pcr(idx(14)))));
    Measurements::new(entries).unwrap()
}

/// The AK's public key as rcgen needs it to certify it.
struct AkPublicKey {
    der: Vec<u8>,
    alg: &'static SignatureAlgorithm,
}

impl PublicKeyData for AkPublicKey {
    fn der_bytes(&self) -> &[u8] {
        &self.der
    }
    fn algorithm(&self) -> &'static SignatureAlgorithm {
        self.alg
    }
}

/// A tiny platform CA in software.
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    pub cert_der: Vec<u8>,
}

/// A CA certificate's parameters: `name` as its common name, any path length, signing
/// certificates and CRLs.
pub fn ca_params(name: &str) -> CertificateParams {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params
}

impl TestCa {
    pub fn new(name: &str) -> Self {
        Self::new_with(name, |_| {})
    }

    /// A root CA whose parameters `edit` changed.
    pub fn new_with(name: &str, edit: impl FnOnce(&mut CertificateParams)) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = ca_params(name);
        edit(&mut params);
        let cert = params.self_signed(&key).unwrap();
        Self {
            issuer: Issuer::new(params, key),
            cert_der: cert.der().to_vec(),
        }
    }

    /// An intermediate CA signed by this one.
    pub fn intermediate(&self, name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let params = ca_params(name);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Self {
            issuer: Issuer::new(params, key),
            cert_der: cert.der().to_vec(),
        }
    }

    /// An AK certificate (leaf) for `ak`, after `edit` has changed its parameters.
    pub fn certify_with(&self, ak: &SoftAk, edit: impl FnOnce(&mut CertificateParams)) -> Vec<u8> {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "test attestation key");
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        edit(&mut params);
        let key = AkPublicKey {
            der: ak.subject_public_key(),
            alg: if ak.is_rsa() {
                &rcgen::PKCS_RSA_SHA256
            } else {
                &rcgen::PKCS_ECDSA_P256_SHA256
            },
        };
        params.signed_by(&key, &self.issuer).unwrap().der().to_vec()
    }

    pub fn certify(&self, ak: &SoftAk) -> Vec<u8> {
        self.certify_with(ak, |_| {})
    }
}

pub const TCG_KP_AIK_CERTIFICATE: [u64; 5] = [2, 23, 133, 8, 3];

pub fn aik_eku() -> ExtendedKeyUsagePurpose {
    ExtendedKeyUsagePurpose::Other(TCG_KP_AIK_CERTIFICATE.to_vec())
}

pub use asterism_testkit::logs::capture as capture_logs;

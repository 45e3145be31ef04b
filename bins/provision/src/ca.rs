//! The local platform CA: what a cloud provider uses to certify its vTPMs' attestation keys.
//!
//! Files in the CA directory (mode 0700):
//!
//! | file | content | mode |
//! | --- | --- | --- |
//! | `platform-ca.key` | ECDSA P-256 private key, PKCS#8 PEM | 0600 |
//! | `platform-ca.pem` | self-signed CA certificate (basicConstraints CA, path length 0; keyCertSign, cRLSign) | 0644 |
//! | `ek-ca/` | the TPM manufacturer CA that signs EK certificates (`swtpm_localca`), made by `node` | 0700 |
//!
//! The CA's subject name is a function of its key (`CN=Asterism local platform CA <first 16
//! hex digits of SHA-256(SubjectPublicKeyInfo)>, O=Asterism local provider`), so the issuer
//! of AK certificates can be rebuilt from the key file alone and two local CAs never share
//! a name.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use asterism_attestation::AkFingerprint;
use asterism_attestation::tpm::ak_spki_der;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PublicKeyData, SerialNumber, SubjectPublicKeyInfo,
};
use ring::rand::{SecureRandom, SystemRandom};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use sha2::{Digest, Sha256};
use time::{Duration, OffsetDateTime};

use crate::files;
use crate::progress;

/// The CA private key file.
pub const KEY_FILE: &str = "platform-ca.key";
/// The CA certificate file.
pub const CERT_FILE: &str = "platform-ca.pem";
/// The manufacturer CA directory (EK certificates).
pub const EK_CA_DIR: &str = "ek-ca";

/// The largest key file read: a PEM P-256 key is about 250 bytes.
const MAX_KEY_FILE: u64 = 64 * 1024;
/// How long the platform CA certificate is valid.
const CA_VALIDITY_DAYS: i64 = 20 * 365;
/// How far back certificates are dated, for clocks that run a little behind.
const BACKDATE_MINUTES: i64 = 5;
/// `tcg-kp-AIKCertificate`: the extended key usage of AK certificates.
const TCG_KP_AIK_CERTIFICATE: [u64; 5] = [2, 23, 133, 8, 3];
/// The organisation in the names this CA writes.
const ORGANIZATION: &str = "Asterism local provider";

/// `platform-ca init --dir DIR`.
pub fn init(dir: &Path) -> Result<()> {
    let key_path = dir.join(KEY_FILE);
    let cert_path = dir.join(CERT_FILE);
    files::ensure_dir(dir, 0o700)?;
    files::refuse_existing(&[key_path.clone(), cert_path.clone()])?;

    let key =
        KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).context("generating the CA key")?;
    let now = OffsetDateTime::now_utc();
    let mut params = ca_params(&key);
    params.not_before = now - Duration::minutes(BACKDATE_MINUTES);
    params.not_after = now + Duration::days(CA_VALIDITY_DAYS);
    params.serial_number = Some(random_serial()?);
    let cert = params
        .self_signed(&key)
        .context("signing the CA certificate")?;

    let key_pem = zeroize::Zeroizing::new(key.serialize_pem());
    files::write_new(&key_path, key_pem.as_bytes(), 0o600)?;
    if let Err(error) = files::write_new(&cert_path, cert.pem().as_bytes(), 0o644) {
        // Do not leave a key without its certificate behind.
        let _ = std::fs::remove_file(&key_path);
        return Err(error);
    }
    progress!(
        "created platform CA \"{}\" in {}",
        common_name(&key),
        dir.display()
    );
    progress!("  {} (private key, mode 0600)", key_path.display());
    progress!("  {} (CA certificate)", cert_path.display());
    Ok(())
}

/// The subject name and CA attributes, a function of the key.
fn ca_params(key: &KeyPair) -> CertificateParams {
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name(key));
    params
        .distinguished_name
        .push(DnType::OrganizationName, ORGANIZATION);
    // Only AK certificates below it: no intermediate CAs.
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params
}

fn common_name(key: &KeyPair) -> String {
    let digest = Sha256::digest(key.subject_public_key_info());
    let short = hex::encode(digest.get(..8).unwrap_or_default());
    format!("Asterism local platform CA {short}")
}

fn random_serial() -> Result<SerialNumber> {
    let mut serial = [0u8; 16];
    SystemRandom::new()
        .fill(&mut serial)
        .map_err(|_| anyhow::anyhow!("the system random generator failed"))?;
    // A positive INTEGER that keeps its 16 bytes.
    serial[0] = (serial[0] & 0x7f) | 0x40;
    Ok(SerialNumber::from_slice(&serial))
}

/// A loaded platform CA, ready to certify AKs.
pub struct PlatformCa {
    dir: PathBuf,
    cert_der: Vec<u8>,
    cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl PlatformCa {
    /// Loads the CA of `dir`: the key file must be private to its owner, the certificate
    /// file must hold exactly one certificate, and it must be the key's.
    pub fn load(dir: &Path) -> Result<Self> {
        let key_path = dir.join(KEY_FILE);
        let cert_path = dir.join(CERT_FILE);
        if !key_path.exists() && !cert_path.exists() {
            bail!(
                "no platform CA in {} (missing {KEY_FILE} and {CERT_FILE}); create one with \
                 `asterism-provision platform-ca init --dir {}`",
                dir.display(),
                dir.display()
            );
        }
        let key_pem = files::read_private(&key_path, MAX_KEY_FILE)?;
        let key_pem = std::str::from_utf8(&key_pem)
            .with_context(|| format!("{} is not PEM", key_path.display()))?;
        let key = KeyPair::from_pem(key_pem)
            .with_context(|| format!("{} is not a PKCS#8 private key", key_path.display()))?;

        let cert_pem = std::fs::read_to_string(&cert_path)
            .with_context(|| format!("reading {}", cert_path.display()))?;
        let certs = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| anyhow::anyhow!("{} is not PEM: {e}", cert_path.display()))?;
        let [cert] = certs.as_slice() else {
            bail!(
                "{} holds {} certificates; expected exactly one",
                cert_path.display(),
                certs.len()
            );
        };
        let parsed = webpki::EndEntityCert::try_from(cert)
            .map_err(|e| anyhow::anyhow!("{} does not parse: {e}", cert_path.display()))?;
        if parsed.subject_public_key_info().as_ref() != key.subject_public_key_info().as_slice() {
            bail!(
                "{} is not the certificate of {}",
                cert_path.display(),
                key_path.display()
            );
        }
        // What verifiers will do with it.
        asterism_attestation::PlatformCa::from_der([cert.as_ref()])
            .with_context(|| format!("{} cannot be a trust anchor", cert_path.display()))?;

        let params = ca_params(&key);
        Ok(Self {
            dir: dir.to_owned(),
            cert_der: cert.as_ref().to_vec(),
            cert_pem,
            issuer: Issuer::new(params, key),
        })
    }

    /// The CA directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CA certificate, DER.
    pub fn cert_der(&self) -> &[u8] {
        &self.cert_der
    }

    /// The CA certificate file as read (PEM).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// Certifies the AK whose TPMT_PUBLIC is `public_area`: an X.509 v3 leaf over its public
    /// key, not a CA, key usage digitalSignature, extended key usage
    /// `tcg-kp-AIKCertificate`, valid from a few minutes ago for `validity_days`. The key
    /// is written exactly as the verifier derives it from the evidence
    /// ([`ak_spki_der`]), which refuses a key outside the AK template.
    pub fn certify_ak(&self, public_area: &[u8], validity_days: u32) -> Result<Vec<u8>> {
        let key = ak_subject_key(public_area)?;
        let fingerprint = AkFingerprint::of_public_area(public_area).to_string();
        let mut params = CertificateParams::default();
        params.distinguished_name.push(
            DnType::CommonName,
            format!(
                "Asterism attestation key {}",
                fingerprint.get(..16).unwrap_or_default()
            ),
        );
        params
            .distinguished_name
            .push(DnType::OrganizationName, ORGANIZATION);
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::Other(
            TCG_KP_AIK_CERTIFICATE.to_vec(),
        )];
        params.use_authority_key_identifier_extension = true;
        let now = OffsetDateTime::now_utc();
        params.not_before = now - Duration::minutes(BACKDATE_MINUTES);
        params.not_after = now + Duration::days(i64::from(validity_days));
        params.serial_number = Some(random_serial()?);
        let cert = params
            .signed_by(&key, &self.issuer)
            .context("signing the AK certificate")?;
        Ok(cert.der().to_vec())
    }
}

/// The AK's key as rcgen takes it: the verifier's SubjectPublicKeyInfo, split by rcgen into
/// its algorithm and key bits (rcgen writes the two back as the same DER).
fn ak_subject_key(public_area: &[u8]) -> Result<SubjectPublicKeyInfo> {
    let spki = ak_spki_der(public_area).context("the AK cannot be certified")?;
    SubjectPublicKeyInfo::from_der(&spki)
        .map_err(|e| anyhow::anyhow!("rcgen does not take the AK's SubjectPublicKeyInfo: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use asterism_attestation::tpm::TpmtPublic;
    use asterism_attestation::tpm::structures::{ObjectAttributes, PublicParams};

    fn ak_public(params: PublicParams) -> Vec<u8> {
        TpmtPublic::ak(params).to_bytes().unwrap()
    }

    fn ecc_ak() -> Vec<u8> {
        ak_public(PublicParams::ecdsa_p256(vec![0x11; 32], vec![0x22; 32]))
    }

    fn rsa_ak() -> Vec<u8> {
        let mut modulus = vec![0x5a; 256];
        modulus[0] = 0xc3;
        ak_public(PublicParams::rsassa_sha256(modulus, 0))
    }

    #[test]
    fn rcgen_writes_the_ak_spki_back_byte_for_byte() {
        for public in [ecc_ak(), rsa_ak()] {
            let spki = ak_spki_der(&public).unwrap();
            assert_eq!(
                ak_subject_key(&public).unwrap().subject_public_key_info(),
                spki
            );
        }
    }

    #[test]
    fn an_ak_outside_the_template_is_not_certified() {
        let mut public = TpmtPublic::parse(&ecc_ak()).unwrap();
        public.attributes =
            ObjectAttributes(asterism_attestation::tpm::AK_ATTRIBUTES ^ ObjectAttributes::NO_DA);
        let error = ak_subject_key(&public.to_bytes().unwrap()).unwrap_err();
        assert!(
            format!("{error:#}").contains("cannot be certified"),
            "{error:#}"
        );
    }
}

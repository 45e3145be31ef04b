//! Endorsement-key (EK) certificates: is this TPM a genuine TPM of a manufacturer the
//! operator trusts?
//!
//! A TPM manufacturer certifies each TPM's EK when it makes the TPM and stores the
//! certificate in the TPM's NV memory (RSA EK at `0x01C00002`, ECC EK at `0x01C0000A`, the
//! high-range slots above them), sometimes with the certificates of its intermediate CAs in
//! the EK certificate chain indices [`EK_CHAIN_NV_FIRST`]..=[`EK_CHAIN_NV_LAST`]. The operator
//! collects the manufacturers' CA certificates into an [`EkCaBundle`]; [`EkCaBundle::verify`]
//! checks one TPM's EK certificate against it and returns a [`VerifiedEk`], which only this
//! module constructs.
//!
//! What is checked (TCG EK Credential Profile for TPM Family 2.0):
//!
//! * the chain, with `rustls-webpki` as for AK certificates ([`crate::PlatformCa`]):
//!   signatures (no SHA-1, RSA of at least 2048 bits), validity at the given time,
//!   basicConstraints CA and path length on every issuer, and the extended key usage
//!   `tcg-kp-EKCertificate` (2.23.133.8.1) *if* a certificate of the path lists extended key
//!   usages. A chain that does not reach the bundle is refused naming the issuer that is
//!   missing ([`EkError::UntrustedIssuer`]);
//! * on every issuer of the path, the bundle's own included: keyUsage present with
//!   keyCertSign, and validity at the given time (webpki does not look at either for the
//!   trust anchor);
//! * on the EK certificate: keyUsage present with keyEncipherment (RSA EK) or keyAgreement
//!   (ECC EK); the TPM's manufacturer, model and version (2.23.133.2.1, .2, .3) in a
//!   directoryName of the subjectAltName; the TPM specification (2.23.133.2.16: family,
//!   level, revision) in subjectDirectoryAttributes;
//! * the certificate's public key is the EK the TPM holds (its `TPMT_PUBLIC`).
//!
//! Where real certificates deviate from the profile and nothing is lost by accepting it,
//! the check is tolerant (and [`VerifiedEk`] still reports what was found):
//!
//! * the subject may be non-empty (swtpm writes `CN=unknown`) and the subjectAltName need
//!   not be critical;
//! * the three TPM attributes may be one multi-valued RDN or one RDN each, in any order, as
//!   UTF8String, PrintableString or IA5String; the `id:` hex digits in either case;
//! * extended key usage may be absent (many EK certificates carry none);
//! * keyUsage may carry more bits than the one the profile names;
//! * NV contents may be padded after the DER certificate with `0x00` or `0xFF` bytes.
//!
//! Revocation (CRLs) is not checked. What the check proves: the key is an EK of a TPM that
//! a trusted manufacturer made. It says nothing about which machine the TPM sits in.

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use rustls_pki_types::{CertificateDer, TrustAnchor, UnixTime};
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;
use x509_parser::oid_registry::{OID_KEY_TYPE_EC_PUBLIC_KEY, OID_PKCS1_RSAENCRYPTION};
use x509_parser::pem::Pem;
use x509_parser::prelude::FromDer;
use x509_parser::public_key::RSAPublicKey;
use x509_parser::time::ASN1Time;
use x509_parser::x509::X509Name;

use super::ak::CHAIN_ALGS;
use super::structures::{PublicParams, TpmtPublic};

/// First NV index of the TCG EK certificate chain (intermediate CA certificates).
pub const EK_CHAIN_NV_FIRST: u32 = 0x01C0_0100;
/// Last NV index of the TCG EK certificate chain.
pub const EK_CHAIN_NV_LAST: u32 = 0x01C0_01FF;

/// The largest file an [`EkCaBundle`] directory may hold; CA certificates are a few KiB.
pub const MAX_BUNDLE_FILE: u64 = 1024 * 1024;

/// How many issuers a chain may have before the bundle; real EK chains have one or two.
const MAX_CHAIN_DEPTH: usize = 8;

/// `tcg-kp-EKCertificate` (2.23.133.8.1), DER value of the OID.
const TCG_KP_EK_CERTIFICATE: &[u8] = &[0x67, 0x81, 0x05, 0x08, 0x01];
/// `tcg-at-tpmManufacturer` (2.23.133.2.1).
const TCG_AT_TPM_MANUFACTURER: &str = "2.23.133.2.1";
/// `tcg-at-tpmModel` (2.23.133.2.2).
const TCG_AT_TPM_MODEL: &str = "2.23.133.2.2";
/// `tcg-at-tpmVersion` (2.23.133.2.3).
const TCG_AT_TPM_VERSION: &str = "2.23.133.2.3";
/// `tcg-at-tpmSpecification` (2.23.133.2.16), DER value of the OID.
const TCG_AT_TPM_SPECIFICATION: &[u8] = &[0x67, 0x81, 0x05, 0x02, 0x10];
/// `id-ce-subjectDirectoryAttributes` (2.5.29.9).
const SUBJECT_DIRECTORY_ATTRIBUTES: &str = "2.5.29.9";
/// `id-RSAES-OAEP` (1.2.840.113549.1.1.7): some RSA EK certificates name their key so.
const RSAES_OAEP: &str = "1.2.840.113549.1.1.7";

/// TPM curve IDs and the OIDs of the same curves.
const CURVES: &[(u16, &str, usize)] = &[
    (0x0003, "1.2.840.10045.3.1.7", 32), // NIST P-256
    (0x0004, "1.3.132.0.34", 48),        // NIST P-384
    (0x0005, "1.3.132.0.35", 66),        // NIST P-521
];

/// Why an [`EkCaBundle`] could not be loaded. Each names the file.
#[derive(Debug, thiserror::Error)]
pub enum EkCaBundleError {
    /// The directory or a file in it could not be read.
    #[error("EK CA bundle: reading {path}: {source}", path = path.display())]
    Io {
        /// The directory or file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A file holds something else than certificates (PEM `CERTIFICATE` blocks or one DER
    /// certificate).
    #[error("EK CA bundle file {file}: not a certificate: {reason}")]
    NotACertificate {
        /// The file's name.
        file: String,
        /// What is wrong.
        reason: String,
    },
    /// A certificate may not sign certificates.
    #[error("EK CA bundle file {file}: {subject} is not a CA: {reason}")]
    NotACa {
        /// The file's name.
        file: String,
        /// The certificate's subject.
        subject: String,
        /// What is missing.
        reason: String,
    },
    /// A certificate is expired or not yet valid.
    #[error(
        "EK CA bundle file {file}: {subject} is not valid at {at} (valid from {not_before} to \
         {not_after})"
    )]
    NotValid {
        /// The file's name.
        file: String,
        /// The certificate's subject.
        subject: String,
        /// The time of the check.
        at: String,
        /// Start of validity.
        not_before: String,
        /// End of validity.
        not_after: String,
    },
    /// The time to check validity at cannot be represented.
    #[error("EK CA bundle: time of the check: {0}")]
    Time(String),
    /// The directory holds no certificate.
    #[error("EK CA bundle {dir} holds no certificate", dir = dir.display())]
    Empty {
        /// The directory.
        dir: PathBuf,
    },
}

/// Why an EK certificate was refused. The messages name what failed and hold nothing
/// secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EkError {
    /// The certificate, a chain certificate or the EK public area does not parse.
    #[error("{what} is malformed: {reason}")]
    Malformed {
        /// Which input.
        what: String,
        /// What is wrong.
        reason: String,
    },
    /// The chain does not reach a certificate of the bundle.
    #[error(
        "untrusted EK certificate: no certificate of the trust bundle or the TPM's chain is \
         its issuer {issuer}"
    )]
    UntrustedIssuer {
        /// The distinguished name of the issuer that is missing.
        issuer: String,
    },
    /// The chain reaches the bundle by name but does not verify (signature, validity, CA
    /// flag, path length, extended key usage).
    #[error("EK certificate chain does not verify: {0}")]
    Chain(String),
    /// An issuer of the path may not sign certificates now.
    #[error("EK certificate issuer {subject}: {reason}")]
    Issuer {
        /// The issuer's subject.
        subject: String,
        /// What is wrong.
        reason: String,
    },
    /// The EK certificate's keyUsage does not allow what an EK does.
    #[error("EK certificate key usage: {0}")]
    KeyUsage(String),
    /// The TPM manufacturer, model or version attributes are missing or unreadable.
    #[error("EK certificate TPM attributes (subjectAltName): {0}")]
    TpmAttributes(String),
    /// The TPM specification attribute is missing or unreadable.
    #[error("EK certificate TPM specification (subjectDirectoryAttributes): {0}")]
    TpmSpecification(String),
    /// The certificate certifies another key than the TPM's EK.
    #[error("the EK certificate's public key is not the TPM's EK: {0}")]
    KeyMismatch(String),
}

fn malformed(what: &str, reason: impl fmt::Display) -> EkError {
    EkError::Malformed {
        what: what.to_owned(),
        reason: reason.to_string(),
    }
}

/// One certificate of the bundle and the file it came from.
#[derive(Debug, Clone)]
struct BundleCert {
    file: String,
    subject: String,
    /// The DER subject name, to find issuers by name.
    subject_raw: Vec<u8>,
    der: Vec<u8>,
    anchor: TrustAnchor<'static>,
}

/// The TPM manufacturers' CA certificates (roots and intermediates) an operator trusts to
/// vouch for EKs. Every certificate is a trust anchor: an EK chain ends at the first one
/// it reaches.
#[derive(Debug, Clone)]
pub struct EkCaBundle {
    certs: Vec<BundleCert>,
}

impl EkCaBundle {
    /// Loads every file of `dir` (not its subdirectories' files: a subdirectory is refused,
    /// as any other entry that is not a certificate file). A file is PEM (one or more
    /// `CERTIFICATE` blocks, nothing else) or one DER certificate. Every certificate must be
    /// a CA (basicConstraints CA, keyUsage keyCertSign) valid at `now`.
    pub fn load_dir(dir: &Path, now: SystemTime) -> Result<Self, EkCaBundleError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| EkCaBundleError::Io { path, source }
        };
        let mut names = Vec::new();
        for entry in fs::read_dir(dir).map_err(io(dir))? {
            names.push(entry.map_err(io(dir))?.path());
        }
        names.sort();
        let mut files = Vec::with_capacity(names.len());
        for path in names {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| path.display().to_string());
            let meta = fs::metadata(&path).map_err(io(&path))?;
            if !meta.is_file() {
                return Err(EkCaBundleError::NotACertificate {
                    file: name,
                    reason: "not a regular file".into(),
                });
            }
            if meta.len() > MAX_BUNDLE_FILE {
                return Err(EkCaBundleError::NotACertificate {
                    file: name,
                    reason: format!("{} bytes, at most {MAX_BUNDLE_FILE}", meta.len()),
                });
            }
            files.push((name, fs::read(&path).map_err(io(&path))?));
        }
        let bundle = Self::from_files(files, now)?;
        if bundle.certs.is_empty() {
            return Err(EkCaBundleError::Empty {
                dir: dir.to_path_buf(),
            });
        }
        Ok(bundle)
    }

    /// As [`EkCaBundle::load_dir`], from `(file name, contents)` pairs. Without any file the
    /// bundle is empty and trusts nothing.
    pub fn from_files(
        files: impl IntoIterator<Item = (String, Vec<u8>)>,
        now: SystemTime,
    ) -> Result<Self, EkCaBundleError> {
        let at = asn1_time(now).map_err(EkCaBundleError::Time)?;
        let mut certs = Vec::new();
        for (file, bytes) in files {
            let not_cert = |reason: String| EkCaBundleError::NotACertificate {
                file: file.clone(),
                reason,
            };
            for der in certificates_in_file(&bytes).map_err(not_cert)? {
                let cert = parse_exact(&der).map_err(not_cert)?;
                let subject = cert.subject().to_string();
                let subject_raw = cert.subject().as_raw().to_vec();
                check_ca(&cert).map_err(|reason| EkCaBundleError::NotACa {
                    file: file.clone(),
                    subject: subject.clone(),
                    reason,
                })?;
                if !cert.validity().is_valid_at(at) {
                    return Err(EkCaBundleError::NotValid {
                        file: file.clone(),
                        subject,
                        at: at.to_string(),
                        not_before: cert.validity().not_before.to_string(),
                        not_after: cert.validity().not_after.to_string(),
                    });
                }
                let anchor =
                    webpki::anchor_from_trusted_cert(&CertificateDer::from(der.as_slice()))
                        .map_err(|e| not_cert(format!("not usable as a trust anchor: {e}")))?
                        .to_owned();
                drop(cert);
                certs.push(BundleCert {
                    file: file.clone(),
                    subject,
                    subject_raw,
                    der,
                    anchor,
                });
            }
        }
        Ok(Self { certs })
    }

    /// How many certificates the bundle holds.
    pub fn len(&self) -> usize {
        self.certs.len()
    }

    /// Whether the bundle holds no certificate (and trusts nothing).
    pub fn is_empty(&self) -> bool {
        self.certs.is_empty()
    }

    /// Verifies the EK certificate `certificate` (DER, as read from the TPM's NV index;
    /// `0x00`/`0xFF` padding after it is ignored) with the intermediate certificates
    /// `chain` (from the TPM's EK chain indices, see [`certificates_from_nv`]; may be
    /// empty) against this bundle at `now`, and checks that it certifies `ek_public`, the
    /// EK's `TPMT_PUBLIC` as the TPM returns it.
    pub fn verify(
        &self,
        certificate: &[u8],
        chain: &[Vec<u8>],
        ek_public: &[u8],
        now: SystemTime,
    ) -> Result<VerifiedEk, EkError> {
        let ek = TpmtPublic::parse(ek_public).map_err(|e| malformed("EK public area", e))?;
        let leaf_der = strip_padding(certificate).map_err(|e| malformed("EK certificate", e))?;
        let leaf = parse_exact(leaf_der).map_err(|e| malformed("EK certificate", e))?;
        let at = asn1_time(now).map_err(|e| malformed("verification time", e))?;

        let (anchor, intermediates) = self.verify_path(&leaf, leaf_der, chain, now)?;
        // webpki checked the CA flag of every issuer and the validity of the intermediates;
        // the profile also wants keyCertSign, and the anchor's validity is nobody's yet.
        for der in intermediates
            .iter()
            .map(Vec::as_slice)
            .chain([anchor.der.as_slice()])
        {
            let cert = parse_exact(der).map_err(|e| malformed("EK chain certificate", e))?;
            let issuer_error = |reason: String| EkError::Issuer {
                subject: cert.subject().to_string(),
                reason,
            };
            check_ca(&cert).map_err(issuer_error)?;
            if !cert.validity().is_valid_at(at) {
                return Err(issuer_error(format!(
                    "not valid at {at} (valid from {} to {})",
                    cert.validity().not_before,
                    cert.validity().not_after
                )));
            }
        }

        let key = CertKey::of(&leaf)?;
        check_key_usage(&leaf, &key)?;
        let (manufacturer, model, version) = tpm_attributes(&leaf)?;
        let specification = tpm_specification(&leaf)?;
        key.matches(&ek)?;

        tracing::debug!(
            %manufacturer, %model, %version, anchor = %anchor.subject, file = %anchor.file,
            "EK certificate verified"
        );
        Ok(VerifiedEk {
            ek_public: ek,
            ek_public_bytes: ek_public.to_vec(),
            certificate: leaf_der.to_vec(),
            tpm: TpmDescription {
                manufacturer,
                model,
                version,
                specification,
            },
            anchor_subject: anchor.subject.clone(),
            anchor_file: anchor.file.clone(),
        })
    }

    /// Builds and verifies the path with webpki; returns the anchor and the intermediates
    /// the path went through.
    fn verify_path(
        &self,
        leaf: &X509Certificate<'_>,
        leaf_der: &[u8],
        chain: &[Vec<u8>],
        now: SystemTime,
    ) -> Result<(&BundleCert, Vec<Vec<u8>>), EkError> {
        let leaf_cert_der = CertificateDer::from(leaf_der);
        let end_entity = webpki::EndEntityCert::try_from(&leaf_cert_der)
            .map_err(|e| malformed("EK certificate", e))?;
        let intermediates: Vec<CertificateDer<'_>> = chain
            .iter()
            .map(|c| CertificateDer::from(c.as_slice()))
            .collect();
        let anchors: Vec<TrustAnchor<'_>> = self.certs.iter().map(|c| c.anchor.clone()).collect();
        let secs = now
            .duration_since(UNIX_EPOCH)
            .map_err(|_| malformed("verification time", "before 1970"))?;
        let path = end_entity
            .verify_for_usage(
                CHAIN_ALGS,
                &anchors,
                &intermediates,
                UnixTime::since_unix_epoch(secs),
                webpki::KeyUsage::required_if_present(TCG_KP_EK_CERTIFICATE),
                None,
                None,
            )
            .map_err(|e| match e {
                webpki::Error::UnknownIssuer => match self.missing_issuer(leaf, chain) {
                    Some(issuer) => EkError::UntrustedIssuer { issuer },
                    None => EkError::Chain(
                        "no issuer of the EK certificate's chain both has the right name and \
                         verifies"
                            .into(),
                    ),
                },
                other => EkError::Chain(other.to_string()),
            })?;
        let used = path.anchor();
        let anchor = self
            .certs
            .iter()
            .find(|c| {
                c.anchor.subject == used.subject
                    && c.anchor.subject_public_key_info == used.subject_public_key_info
            })
            .ok_or_else(|| EkError::Chain("the path ends at an unknown trust anchor".into()))?;
        let intermediates = path
            .intermediate_certificates()
            .map(|c| c.der().as_ref().to_vec())
            .collect();
        Ok((anchor, intermediates))
    }

    /// Follows issuer names from `leaf` through `chain` and returns the first issuer name
    /// that neither the chain nor the bundle has a certificate for.
    fn missing_issuer(&self, leaf: &X509Certificate<'_>, chain: &[Vec<u8>]) -> Option<String> {
        let chain: Vec<X509Certificate<'_>> = chain
            .iter()
            .filter_map(|der| parse_exact(der).ok())
            .collect();
        let in_bundle =
            |name: &X509Name<'_>| self.certs.iter().any(|c| c.subject_raw == name.as_raw());
        let mut issuer = leaf.issuer();
        for _ in 0..MAX_CHAIN_DEPTH {
            if in_bundle(issuer) {
                return None;
            }
            match chain
                .iter()
                .find(|c| c.subject().as_raw() == issuer.as_raw())
            {
                Some(next) if next.issuer().as_raw() != next.subject().as_raw() => {
                    issuer = next.issuer();
                }
                Some(_) => return None,
                None => return Some(issuer.to_string()),
            }
        }
        None
    }
}

/// The TPM that an EK certificate describes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TpmDescription {
    /// `tcg-at-tpmManufacturer`, e.g. `id:49465800` (Infineon).
    pub manufacturer: String,
    /// `tcg-at-tpmModel`, free text.
    pub model: String,
    /// `tcg-at-tpmVersion`, e.g. `id:00070002`.
    pub version: String,
    /// `tcg-at-tpmSpecification`.
    pub specification: TpmSpecification,
}

impl TpmDescription {
    /// The manufacturer's four-byte TCG vendor ID when the attribute has the profile's
    /// form `id:` and eight hex digits.
    pub fn manufacturer_id(&self) -> Option<u32> {
        let hex = self.manufacturer.strip_prefix("id:")?;
        if hex.len() != 8 {
            return None;
        }
        u32::from_str_radix(hex, 16).ok()
    }
}

/// `TPMSpecification ::= SEQUENCE { family UTF8String, level INTEGER, revision INTEGER }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TpmSpecification {
    /// `2.0` for TPM 2.0.
    pub family: String,
    /// The specification level.
    pub level: u32,
    /// The specification revision (e.g. 116, 138, 164).
    pub revision: u32,
}

/// An EK certificate that [`EkCaBundle::verify`] accepted for the TPM's EK. Only that
/// function makes one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedEk {
    ek_public: TpmtPublic,
    ek_public_bytes: Vec<u8>,
    certificate: Vec<u8>,
    tpm: TpmDescription,
    anchor_subject: String,
    anchor_file: String,
}

impl VerifiedEk {
    /// The EK's public area.
    pub fn ek_public(&self) -> &TpmtPublic {
        &self.ek_public
    }

    /// The EK's `TPMT_PUBLIC` exactly as it was verified.
    pub fn ek_public_bytes(&self) -> &[u8] {
        &self.ek_public_bytes
    }

    /// The EK certificate (DER, without NV padding).
    pub fn certificate(&self) -> &[u8] {
        &self.certificate
    }

    /// What the certificate says about the TPM.
    pub fn tpm(&self) -> &TpmDescription {
        &self.tpm
    }

    /// The subject of the bundle certificate the chain ended at.
    pub fn anchor_subject(&self) -> &str {
        &self.anchor_subject
    }

    /// The bundle file that certificate came from.
    pub fn anchor_file(&self) -> &str {
        &self.anchor_file
    }
}

/// Splits the contents of one EK chain NV index into its certificates: one or more DER
/// certificates back to back, optionally padded with `0x00` or `0xFF` bytes.
pub fn certificates_from_nv(contents: &[u8]) -> Result<Vec<Vec<u8>>, EkError> {
    let mut out = Vec::new();
    let mut rest = contents;
    while !rest.is_empty() && !is_padding(rest) {
        let len = der_len(rest).map_err(|e| malformed("EK chain NV index", e))?;
        let (one, tail) = rest
            .split_at_checked(len)
            .ok_or_else(|| malformed("EK chain NV index", "truncated certificate"))?;
        parse_exact(one).map_err(|e| malformed("EK chain certificate", e))?;
        out.push(one.to_vec());
        rest = tail;
    }
    Ok(out)
}

fn is_padding(bytes: &[u8]) -> bool {
    bytes.iter().all(|b| *b == 0) || bytes.iter().all(|b| *b == 0xFF)
}

/// The one DER certificate at the start of `bytes`, when what follows it is padding.
fn strip_padding(bytes: &[u8]) -> Result<&[u8], String> {
    let len = der_len(bytes)?;
    let (der, rest) = bytes.split_at_checked(len).ok_or("truncated certificate")?;
    if is_padding(rest) {
        Ok(der)
    } else {
        Err(format!(
            "{} bytes after the certificate that are not padding",
            rest.len()
        ))
    }
}

/// The length, header included, of the DER SEQUENCE at the start of `bytes`.
fn der_len(bytes: &[u8]) -> Result<usize, String> {
    let (tag, _, rest) = tlv(bytes)?;
    if tag != 0x30 {
        return Err("not a DER SEQUENCE".into());
    }
    Ok(bytes.len() - rest.len())
}

/// One DER TLV with a one-byte tag: `(tag, content, rest)`.
fn tlv(bytes: &[u8]) -> Result<(u8, &[u8], &[u8]), String> {
    let (&tag, rest) = bytes.split_first().ok_or("empty DER")?;
    let (&first, rest) = rest.split_first().ok_or("DER without a length")?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7F);
        if n == 0 || n > 4 {
            return Err(format!("DER length form {first:#04x} not supported"));
        }
        let (len_bytes, rest) = rest.split_at_checked(n).ok_or("truncated DER length")?;
        let len = len_bytes
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, rest)
    };
    let (content, rest) = rest.split_at_checked(len).ok_or("truncated DER value")?;
    Ok((tag, content, rest))
}

pub(super) fn parse_exact(der: &[u8]) -> Result<X509Certificate<'_>, String> {
    match X509Certificate::from_der(der) {
        Ok(([], cert)) => Ok(cert),
        Ok((rest, _)) => Err(format!("{} bytes after the certificate", rest.len())),
        Err(e) => Err(format!("not an X.509 certificate: {e}")),
    }
}

/// The certificates of one bundle file: PEM with only `CERTIFICATE` blocks, or one DER
/// certificate.
pub(super) fn certificates_in_file(bytes: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    if bytes.first() == Some(&0x30) {
        parse_exact(bytes)?;
        return Ok(vec![bytes.to_vec()]);
    }
    let mut out = Vec::new();
    for pem in Pem::iter_from_buffer(bytes) {
        let pem = match pem {
            Ok(pem) => pem,
            // The end of the input after at least one block.
            Err(x509_parser::error::PEMError::MissingHeader) if !out.is_empty() => break,
            Err(e) => return Err(format!("neither DER nor PEM: {e}")),
        };
        if pem.label != "CERTIFICATE" {
            return Err(format!("a PEM {} block", pem.label));
        }
        out.push(pem.contents);
    }
    if out.is_empty() {
        return Err("no PEM CERTIFICATE block".into());
    }
    Ok(out)
}

/// A CA that may sign certificates: basicConstraints CA and keyUsage keyCertSign.
pub(super) fn check_ca(cert: &X509Certificate<'_>) -> Result<(), String> {
    let bc = cert
        .basic_constraints()
        .map_err(|e| format!("basicConstraints: {e}"))?;
    if !bc.is_some_and(|bc| bc.value.ca) {
        return Err("basicConstraints does not say CA".into());
    }
    let ku = cert.key_usage().map_err(|e| format!("keyUsage: {e}"))?;
    match ku {
        Some(ku) if ku.value.key_cert_sign() => Ok(()),
        Some(_) => Err("keyUsage lacks keyCertSign".into()),
        None => Err("no keyUsage (keyCertSign required)".into()),
    }
}

pub(super) fn asn1_time(now: SystemTime) -> Result<ASN1Time, String> {
    let secs = now
        .duration_since(UNIX_EPOCH)
        .map_err(|_| "time before 1970".to_owned())?
        .as_secs();
    let secs = i64::try_from(secs).map_err(|_| "time out of range".to_owned())?;
    ASN1Time::from_timestamp(secs).map_err(|e| e.to_string())
}

/// The public key an EK certificate certifies.
enum CertKey {
    /// Modulus and exponent, without leading zeros.
    Rsa { n: Vec<u8>, e: Vec<u8> },
    /// Curve OID (dotted) and the uncompressed point.
    Ecc { curve: String, point: Vec<u8> },
}

fn trim_zeros(v: &[u8]) -> Vec<u8> {
    let skip = v.iter().take_while(|b| **b == 0).count();
    v.get(skip..).unwrap_or_default().to_vec()
}

impl CertKey {
    fn of(cert: &X509Certificate<'_>) -> Result<Self, EkError> {
        let spki = cert.public_key();
        let alg = &spki.algorithm.algorithm;
        let bad = |e: String| malformed("EK certificate public key", e);
        if *alg == OID_PKCS1_RSAENCRYPTION || alg.to_id_string() == RSAES_OAEP {
            let (_, key) = RSAPublicKey::from_der(&spki.subject_public_key.data)
                .map_err(|e| bad(format!("RSA key: {e}")))?;
            Ok(Self::Rsa {
                n: trim_zeros(key.modulus),
                e: trim_zeros(key.exponent),
            })
        } else if *alg == OID_KEY_TYPE_EC_PUBLIC_KEY {
            let curve = spki
                .algorithm
                .parameters
                .as_ref()
                .and_then(|p| p.as_oid().ok())
                .map(|oid| oid.to_id_string())
                .ok_or_else(|| bad("ECC key without a named curve".into()))?;
            Ok(Self::Ecc {
                curve,
                point: spki.subject_public_key.data.to_vec(),
            })
        } else {
            Err(bad(format!("key algorithm {alg} is neither RSA nor ECC")))
        }
    }

    /// The certificate's key is the EK's.
    fn matches(&self, ek: &TpmtPublic) -> Result<(), EkError> {
        let mismatch = |m: String| EkError::KeyMismatch(m);
        match (self, &ek.params) {
            (
                Self::Rsa { n, e },
                PublicParams::Rsa {
                    exponent, modulus, ..
                },
            ) => {
                let tpm_e = if *exponent == 0 { 65537 } else { *exponent };
                if trim_zeros(modulus) != *n {
                    return Err(mismatch("the RSA moduli differ".into()));
                }
                if trim_zeros(&tpm_e.to_be_bytes()) != *e {
                    return Err(mismatch("the RSA exponents differ".into()));
                }
                Ok(())
            }
            (
                Self::Ecc { curve, point },
                PublicParams::Ecc {
                    curve: id, x, y, ..
                },
            ) => {
                let (_, oid, size) = CURVES
                    .iter()
                    .find(|(c, _, _)| c == id)
                    .ok_or_else(|| mismatch(format!("TPM curve {id:#06x} is not supported")))?;
                if curve != oid {
                    return Err(mismatch(format!(
                        "the certificate's curve is {curve}, the EK's {oid}"
                    )));
                }
                let mut expected = vec![0x04];
                for coordinate in [x, y] {
                    let c = trim_zeros(coordinate);
                    let pad = size
                        .checked_sub(c.len())
                        .ok_or_else(|| mismatch("an EK coordinate is too long".into()))?;
                    expected.extend(std::iter::repeat_n(0, pad));
                    expected.extend_from_slice(&c);
                }
                if *point != expected {
                    return Err(mismatch("the ECC points differ".into()));
                }
                Ok(())
            }
            (Self::Rsa { .. }, PublicParams::Ecc { .. }) => Err(mismatch(
                "the certificate certifies an RSA key, the EK is an ECC key".into(),
            )),
            (Self::Ecc { .. }, PublicParams::Rsa { .. }) => Err(mismatch(
                "the certificate certifies an ECC key, the EK is an RSA key".into(),
            )),
        }
    }
}

/// keyEncipherment for an RSA EK, keyAgreement for an ECC EK.
fn check_key_usage(cert: &X509Certificate<'_>, key: &CertKey) -> Result<(), EkError> {
    let ku = cert
        .key_usage()
        .map_err(|e| EkError::KeyUsage(e.to_string()))?
        .ok_or_else(|| EkError::KeyUsage("the certificate has no keyUsage extension".into()))?;
    let (ok, want) = match key {
        CertKey::Rsa { .. } => (ku.value.key_encipherment(), "keyEncipherment (RSA EK)"),
        CertKey::Ecc { .. } => (ku.value.key_agreement(), "keyAgreement (ECC EK)"),
    };
    if ok {
        Ok(())
    } else {
        Err(EkError::KeyUsage(format!("{} lacks {want}", ku.value)))
    }
}

/// Manufacturer, model and version from the subjectAltName's directoryName.
fn tpm_attributes(cert: &X509Certificate<'_>) -> Result<(String, String, String), EkError> {
    let err = |m: String| EkError::TpmAttributes(m);
    let san = cert
        .subject_alternative_name()
        .map_err(|e| err(e.to_string()))?
        .ok_or_else(|| err("the certificate has no subjectAltName".into()))?;
    let (mut manufacturer, mut model, mut version) = (None, None, None);
    for name in &san.value.general_names {
        let GeneralName::DirectoryName(dn) = name else {
            continue;
        };
        for attr in dn.iter_attributes() {
            let slot = match attr.attr_type().to_id_string().as_str() {
                TCG_AT_TPM_MANUFACTURER => &mut manufacturer,
                TCG_AT_TPM_MODEL => &mut model,
                TCG_AT_TPM_VERSION => &mut version,
                _ => continue,
            };
            let value = attr
                .as_str()
                .map_err(|e| err(format!("{}: {e}", attr.attr_type())))?;
            if slot.replace(value.to_owned()).is_some() {
                return Err(err(format!("{} appears twice", attr.attr_type())));
            }
        }
    }
    let missing = |what: &str| err(format!("no {what} attribute"));
    let manufacturer = manufacturer.ok_or_else(|| missing("tpmManufacturer (2.23.133.2.1)"))?;
    let model = model.ok_or_else(|| missing("tpmModel (2.23.133.2.2)"))?;
    let version = version.ok_or_else(|| missing("tpmVersion (2.23.133.2.3)"))?;
    // The hex digits of `id:` values in either case; the profile's form is upper case.
    let normalise = |v: String| match v.strip_prefix("id:") {
        Some(hex) => format!("id:{}", hex.to_ascii_uppercase()),
        None => v,
    };
    Ok((normalise(manufacturer), model, normalise(version)))
}

/// `tcg-at-tpmSpecification` from subjectDirectoryAttributes.
fn tpm_specification(cert: &X509Certificate<'_>) -> Result<TpmSpecification, EkError> {
    let err = |m: &str| EkError::TpmSpecification(m.to_owned());
    let ext = cert
        .extensions()
        .iter()
        .find(|e| e.oid.to_id_string() == SUBJECT_DIRECTORY_ATTRIBUTES)
        .ok_or_else(|| err("the certificate has no subjectDirectoryAttributes extension"))?;
    // SubjectDirectoryAttributes ::= SEQUENCE OF Attribute
    // Attribute ::= SEQUENCE { type OID, values SET OF value }
    let (tag, mut attrs, rest) = tlv(ext.value).map_err(|e| err(&e))?;
    if tag != 0x30 || !rest.is_empty() {
        return Err(err("subjectDirectoryAttributes is not one SEQUENCE"));
    }
    while !attrs.is_empty() {
        let (tag, attr, next) = tlv(attrs).map_err(|e| err(&e))?;
        attrs = next;
        let (oid_tag, oid, values) = tlv(attr).map_err(|e| err(&e))?;
        if tag != 0x30 || oid_tag != 0x06 || oid != TCG_AT_TPM_SPECIFICATION {
            continue;
        }
        let (set_tag, set, after) = tlv(values).map_err(|e| err(&e))?;
        let (seq_tag, spec, _) = tlv(set).map_err(|e| err(&e))?;
        if set_tag != 0x31 || seq_tag != 0x30 || !after.is_empty() {
            return Err(err("tpmSpecification is not a SET holding a SEQUENCE"));
        }
        let (family_tag, family, spec) = tlv(spec).map_err(|e| err(&e))?;
        let (level_tag, level, spec) = tlv(spec).map_err(|e| err(&e))?;
        let (revision_tag, revision, _) = tlv(spec).map_err(|e| err(&e))?;
        // UTF8String per the profile; PrintableString and IA5String tolerated.
        if !matches!(family_tag, 0x0C | 0x13 | 0x16) || level_tag != 0x02 || revision_tag != 0x02 {
            return Err(err(
                "tpmSpecification is not { family string, level INTEGER, revision INTEGER }",
            ));
        }
        let family = std::str::from_utf8(family)
            .map_err(|_| err("the family is not UTF-8"))?
            .to_owned();
        let uint = |v: &[u8], what: &str| -> Result<u32, EkError> {
            if v.is_empty() || v.len() > 5 || v.first().is_some_and(|b| b & 0x80 != 0) {
                return Err(err(&format!("{what} is not a small non-negative INTEGER")));
            }
            let n = v.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b));
            u32::try_from(n).map_err(|_| err(&format!("{what} is too large")))
        };
        return Ok(TpmSpecification {
            family,
            level: uint(level, "level")?,
            revision: uint(revision, "revision")?,
        });
    }
    Err(err("no tpmSpecification (2.23.133.2.16) attribute"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nv_contents_split_into_certificates_and_padding_is_ignored() {
        assert_eq!(certificates_from_nv(&[]).unwrap(), Vec::<Vec<u8>>::new());
        assert_eq!(
            certificates_from_nv(&[0xFF; 8]).unwrap(),
            Vec::<Vec<u8>>::new()
        );
        assert!(certificates_from_nv(&[0x30, 0x05, 0x00]).is_err());
        assert!(strip_padding(&[0x30, 0x00, 0x01]).is_err());
        assert_eq!(
            strip_padding(&[0x30, 0x00, 0x00, 0x00]).unwrap(),
            &[0x30, 0x00]
        );
    }
}

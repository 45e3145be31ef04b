//! Certificate revocation lists (CRLs) from an offline bundle the operator passes in: AMD's
//! (signed by each product's ARK, listing revoked ASKs and ASVKs) and Intel's (the SGX Root
//! CA's, listing revoked PCK CAs, and each PCK CA's, listing revoked PCK certificates).
//! Nothing here fetches or reads files; the bundle comes in as bytes.
//!
//! With a bundle, a checked certificate needs a CRL of its issuer: one whose issuer name is
//! the issuer certificate's subject, whose signature verifies under the issuer's key, and
//! that is current at `now` (`thisUpdate` ≤ `now` ≤ `nextUpdate`). Every such CRL in the
//! bundle is consulted, and a certificate whose serial any of them lists is refused with
//! [`ValidationError::Revoked`]. A missing, unsigned or expired CRL refuses the evidence
//! too: a bundle that cannot vouch for a link must not pass as one that did. Without a
//! bundle the verifiers check no revocation (the binaries warn at start).

use std::collections::HashSet;
use std::sync::Mutex;

use ring::signature::{self, UnparsedPublicKey};
use sha2::{Digest, Sha256};
use x509_parser::certificate::X509Certificate;
use x509_parser::oid_registry::{
    OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_NIST_EC_P384, OID_PKCS1_RSASSAPSS,
    OID_SIG_ECDSA_WITH_SHA256, OID_SIG_ECDSA_WITH_SHA384,
};
use x509_parser::pem::Pem;
use x509_parser::prelude::FromDer;
use x509_parser::revocation_list::CertificateRevocationList;
use x509_parser::time::ASN1Time;
use x509_parser::x509::{AlgorithmIdentifier, SubjectPublicKeyInfo};

use crate::ValidationError;
use crate::explain::{Check, Explanation};

/// Largest CRL file accepted. AMD's and Intel's are a few KiB; the PCK CRLs grow with
/// revocations, hence the headroom.
pub const MAX_CRL_LEN: usize = 4 * 1024 * 1024;

/// Why a CRL bundle was refused.
#[derive(Debug, thiserror::Error)]
pub enum CrlError {
    /// A file is larger than [`MAX_CRL_LEN`].
    #[error("{file}: {size} bytes, at most {MAX_CRL_LEN}")]
    TooLarge {
        /// The file, as the caller named it.
        file: String,
        /// Its size.
        size: usize,
    },
    /// A file is not a DER CRL, nor PEM holding only `X509 CRL` blocks.
    #[error("{file}: not an X.509 CRL (DER, or PEM `X509 CRL`): {reason}")]
    Parse {
        /// The file, as the caller named it.
        file: String,
        /// What is wrong.
        reason: String,
    },
}

/// One CRL of the bundle, decoded once.
struct Crl {
    file: String,
    der: Vec<u8>,
    issuer_raw: Vec<u8>,
    issuer: String,
    this_update: i64,
    next_update: Option<i64>,
    /// The revoked serial numbers, without leading zero bytes.
    revoked: HashSet<Vec<u8>>,
}

/// What a bundle holds, for the log at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrlSummary {
    /// The file it came from.
    pub file: String,
    /// The issuer's name.
    pub issuer: String,
    /// `thisUpdate`, unix seconds.
    pub this_update: i64,
    /// `nextUpdate`, unix seconds, when present.
    pub next_update: Option<i64>,
    /// How many certificates it revokes.
    pub revoked: usize,
}

/// The CRLs of an offline bundle. Signatures are checked when a certificate is checked
/// (the issuer of a PCK CRL is a PCK CA that only a quote's chain carries), and remembered
/// per CRL and issuer key.
pub struct CrlBundle {
    crls: Vec<Crl>,
    verified: Mutex<HashSet<[u8; 32]>>,
}

impl std::fmt::Debug for CrlBundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CrlBundle")
            .field("crls", &self.crls.len())
            .finish_non_exhaustive()
    }
}

fn parse_crl(file: &str, der: &[u8]) -> Result<Crl, CrlError> {
    let bad = |reason: String| CrlError::Parse {
        file: file.to_owned(),
        reason,
    };
    let crl = match CertificateRevocationList::from_der(der) {
        Ok(([], crl)) => crl,
        Ok((rest, _)) => return Err(bad(format!("{} bytes after the CRL", rest.len()))),
        Err(e) => return Err(bad(e.to_string())),
    };
    Ok(Crl {
        file: file.to_owned(),
        der: der.to_vec(),
        issuer_raw: crl.issuer().as_raw().to_vec(),
        issuer: crl.issuer().to_string(),
        this_update: crl.last_update().timestamp(),
        next_update: crl.next_update().map(|t| t.timestamp()),
        revoked: crl
            .iter_revoked_certificates()
            .map(|r| serial_key(r.raw_serial()))
            .collect(),
    })
}

/// A serial number compared by value: DER may pad it with a zero byte to keep it positive.
fn serial_key(raw: &[u8]) -> Vec<u8> {
    let start = raw.iter().position(|b| *b != 0).unwrap_or(raw.len());
    raw.get(start..).unwrap_or_default().to_vec()
}

fn show_time(t: i64) -> String {
    ASN1Time::from_timestamp(t)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| format!("unix {t}"))
}

fn parse_cert<'a>(which: &str, der: &'a [u8]) -> Result<X509Certificate<'a>, ValidationError> {
    match X509Certificate::from_der(der) {
        Ok(([], cert)) => Ok(cert),
        _ => Err(ValidationError::Certificate {
            which: which.to_owned(),
            reason: "does not parse as one X.509 certificate".into(),
        }),
    }
}

impl CrlBundle {
    /// Decodes a bundle: each file (named for messages) is one DER CRL, or PEM holding one
    /// or more `X509 CRL` blocks. An empty bundle is valid and vouches for nothing, so
    /// every certificate checked against it is refused.
    pub fn from_files<N, B>(files: impl IntoIterator<Item = (N, B)>) -> Result<Self, CrlError>
    where
        N: Into<String>,
        B: AsRef<[u8]>,
    {
        let mut crls = Vec::new();
        for (name, bytes) in files {
            let (name, bytes) = (name.into(), bytes.as_ref());
            if bytes.len() > MAX_CRL_LEN {
                return Err(CrlError::TooLarge {
                    file: name,
                    size: bytes.len(),
                });
            }
            if bytes.trim_ascii_start().starts_with(b"-----BEGIN") {
                let mut found = 0;
                for pem in Pem::iter_from_buffer(bytes) {
                    let pem = pem.map_err(|e| CrlError::Parse {
                        file: name.clone(),
                        reason: format!("not PEM: {e}"),
                    })?;
                    if pem.label != "X509 CRL" {
                        return Err(CrlError::Parse {
                            file: name,
                            reason: format!("unexpected PEM block {:?}", pem.label),
                        });
                    }
                    crls.push(parse_crl(&name, &pem.contents)?);
                    found += 1;
                }
                if found == 0 {
                    return Err(CrlError::Parse {
                        file: name,
                        reason: "no PEM block".into(),
                    });
                }
            } else {
                crls.push(parse_crl(&name, bytes)?);
            }
        }
        Ok(Self {
            crls,
            verified: Mutex::new(HashSet::new()),
        })
    }

    /// How many CRLs the bundle holds.
    pub fn len(&self) -> usize {
        self.crls.len()
    }

    /// Whether the bundle holds no CRL.
    pub fn is_empty(&self) -> bool {
        self.crls.is_empty()
    }

    /// What each CRL is, in bundle order (for the log at start).
    pub fn summaries(&self) -> Vec<CrlSummary> {
        self.crls
            .iter()
            .map(|c| CrlSummary {
                file: c.file.clone(),
                issuer: c.issuer.clone(),
                this_update: c.this_update,
                next_update: c.next_update,
                revoked: c.revoked.len(),
            })
            .collect()
    }

    /// Checks that the certificate `which` (DER `subject`), issued by the certificate
    /// `issuer` (DER; its signature over `subject` already verified by the caller), is
    /// revoked by no CRL of that issuer, at `now` (unix seconds). Records the check.
    pub(crate) fn check(
        &self,
        which: &str,
        subject: &[u8],
        issuer: &[u8],
        now: i64,
        explanation: &mut Explanation,
    ) -> Result<(), ValidationError> {
        let result = self.run_check(which, subject, issuer, now);
        let field = format!("{which}.revocation");
        match &result {
            Ok(observed) => explanation.push(Check::pass_if(
                true,
                field,
                "listed by no CRL of its issuer",
                observed.clone(),
            )),
            Err(e) => explanation.push(Check::pass_if(
                false,
                field,
                "listed by no CRL of its issuer",
                e.to_string(),
            )),
        }
        result.map(|_| ())
    }

    fn run_check(
        &self,
        which: &str,
        subject: &[u8],
        issuer: &[u8],
        now: i64,
    ) -> Result<String, ValidationError> {
        let subject = parse_cert(which, subject)?;
        let issuer = parse_cert(&format!("issuer of the {which}"), issuer)?;
        let issuer_name = issuer.subject().to_string();
        let serial = hex::encode(subject.raw_serial());
        let crls: Vec<&Crl> = self
            .crls
            .iter()
            .filter(|c| c.issuer_raw == issuer.subject().as_raw())
            .collect();
        if crls.is_empty() {
            return Err(ValidationError::Certificate {
                which: format!("CRL of {issuer_name}"),
                reason: format!(
                    "none in the CRL bundle, so the {which} (serial {serial}) cannot be checked \
                     for revocation (add the issuer's CRL to the bundle)"
                ),
            });
        }
        let key = serial_key(subject.raw_serial());
        let mut until = i64::MAX;
        for crl in crls {
            let crl_error = |reason: String| ValidationError::Certificate {
                which: format!("CRL {} of {issuer_name}", crl.file),
                reason,
            };
            self.verify_signature(crl, issuer.public_key())
                .map_err(|r| crl_error(format!("not signed by its issuer: {r}")))?;
            if now < crl.this_update {
                return Err(crl_error(format!(
                    "issued at {}, after the verification time {}",
                    show_time(crl.this_update),
                    show_time(now)
                )));
            }
            let Some(next) = crl.next_update else {
                return Err(crl_error(
                    "has no nextUpdate, so whether it is current cannot be told".into(),
                ));
            };
            if now > next {
                return Err(crl_error(format!(
                    "expired at {} (nextUpdate), checked at {}: refresh the CRL bundle",
                    show_time(next),
                    show_time(now)
                )));
            }
            until = until.min(next);
            if crl.revoked.contains(&key) {
                return Err(ValidationError::Revoked {
                    which: which.to_owned(),
                    serial,
                    issuer: issuer_name,
                });
            }
        }
        Ok(format!(
            "serial {serial} not listed by {issuer_name} (CRLs current until {})",
            show_time(until)
        ))
    }

    fn verify_signature(&self, crl: &Crl, key: &SubjectPublicKeyInfo<'_>) -> Result<(), String> {
        let memo: [u8; 32] = Sha256::new()
            .chain_update((crl.der.len() as u64).to_be_bytes())
            .chain_update(&crl.der)
            .chain_update(key.raw)
            .finalize()
            .into();
        let done = |set: &HashSet<[u8; 32]>| set.contains(&memo);
        if done(&self.verified.lock().unwrap_or_else(|e| e.into_inner())) {
            return Ok(());
        }
        let parsed = match CertificateRevocationList::from_der(&crl.der) {
            Ok((_, parsed)) => parsed,
            Err(e) => return Err(e.to_string()),
        };
        verify_signed(
            key,
            &parsed.signature_algorithm,
            parsed.tbs_cert_list.as_ref(),
            &parsed.signature_value.data,
        )?;
        self.verified
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(memo);
        Ok(())
    }
}

/// Checks a signature by `key` over `signed` with the schemes AMD and Intel sign CRLs
/// with: RSASSA-PSS with SHA-384 (AMD), ECDSA P-256 with SHA-256 (Intel), and ECDSA P-384
/// with SHA-384. Anything else is refused.
fn verify_signed(
    key: &SubjectPublicKeyInfo<'_>,
    algorithm: &AlgorithmIdentifier<'_>,
    signed: &[u8],
    signature_value: &[u8],
) -> Result<(), String> {
    if algorithm.algorithm == OID_PKCS1_RSASSAPSS {
        return crate::snp::verify_pss_raw(key, algorithm, signed, signature_value)
            .map_err(|e| e.replace("{issuer}", "the issuer's key"));
    }
    let curve = key
        .algorithm
        .parameters
        .as_ref()
        .and_then(|p| p.as_oid().ok());
    let is_ec = key.algorithm.algorithm == OID_KEY_TYPE_EC_PUBLIC_KEY;
    let scheme: &'static dyn signature::VerificationAlgorithm =
        if algorithm.algorithm == OID_SIG_ECDSA_WITH_SHA256 {
            if !(is_ec && curve.as_ref() == Some(&OID_EC_P256)) {
                return Err("ecdsa-with-SHA256 by a key that is not a P-256 key".into());
            }
            &signature::ECDSA_P256_SHA256_ASN1
        } else if algorithm.algorithm == OID_SIG_ECDSA_WITH_SHA384 {
            if !(is_ec && curve.as_ref() == Some(&OID_NIST_EC_P384)) {
                return Err("ecdsa-with-SHA384 by a key that is not a P-384 key".into());
            }
            &signature::ECDSA_P384_SHA384_ASN1
        } else {
            return Err(format!(
                "signature algorithm {} is none of RSASSA-PSS, ecdsa-with-SHA256, \
                 ecdsa-with-SHA384",
                algorithm.algorithm
            ));
        };
    UnparsedPublicKey::new(scheme, &key.subject_public_key.data)
        .verify(signed, signature_value)
        .map_err(|_| "signature does not verify under the issuer's key".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{
        BasicConstraints, CertificateParams, CertificateRevocationListParams, DnType, IsCa, Issuer,
        KeyIdMethod, KeyPair, KeyUsagePurpose, RevokedCertParams, SerialNumber, date_time_ymd,
    };

    /// 2026-01-01T00:00:00Z, inside every test CRL's window.
    const NOW: i64 = 1_767_225_600;

    fn ca_params(cn: &str, serial: u8) -> CertificateParams {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(DnType::CommonName, cn);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        // A high first byte: DER pads the serial with a zero, which the check must ignore.
        p.serial_number = Some(SerialNumber::from(vec![0x80 | serial, 1, 2, 3]));
        p
    }

    /// A test PKI shaped like Intel's: root → intermediate CA → leaf, ECDSA P-256.
    struct Pki {
        root_params: CertificateParams,
        root_key: KeyPair,
        root: Vec<u8>,
        intermediate: Vec<u8>,
        intermediate_serial: Vec<u8>,
    }

    fn pki() -> Pki {
        let root_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let root_params = ca_params("Test Root CA", 1);
        let root = root_params.self_signed(&root_key).unwrap().der().to_vec();
        let int_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let int_params = ca_params("Test Intermediate CA", 2);
        let intermediate_serial = int_params.serial_number.clone().unwrap().to_bytes();
        let issuer = Issuer::from_params(&root_params, &root_key);
        let intermediate = int_params
            .signed_by(&int_key, &issuer)
            .unwrap()
            .der()
            .to_vec();
        Pki {
            root_params,
            root_key,
            root,
            intermediate,
            intermediate_serial,
        }
    }

    /// A CRL in the name of `params`, signed by `key`, revoking `serials`, valid in 2025–2026.
    fn crl(params: &CertificateParams, key: &KeyPair, serials: &[Vec<u8>]) -> Vec<u8> {
        CertificateRevocationListParams {
            this_update: date_time_ymd(2025, 1, 1),
            next_update: date_time_ymd(2026, 12, 31),
            crl_number: SerialNumber::from(vec![1]),
            issuing_distribution_point: None,
            revoked_certs: serials
                .iter()
                .map(|s| RevokedCertParams {
                    serial_number: SerialNumber::from(s.clone()),
                    revocation_time: date_time_ymd(2025, 6, 1),
                    reason_code: None,
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        }
        .signed_by(&Issuer::from_params(params, key))
        .unwrap()
        .der()
        .to_vec()
    }

    fn check(bundle: &CrlBundle, pki: &Pki, now: i64) -> Result<(), ValidationError> {
        bundle.check(
            "PCK CA",
            &pki.intermediate,
            &pki.root,
            now,
            &mut Explanation::default(),
        )
    }

    #[test]
    fn a_revoked_intermediate_is_refused_naming_its_serial_and_the_crl_issuer() {
        let pki = pki();
        let revoking = crl(
            &pki.root_params,
            &pki.root_key,
            std::slice::from_ref(&pki.intermediate_serial),
        );
        let bundle = CrlBundle::from_files([("root.crl", revoking)]).unwrap();
        match check(&bundle, &pki, NOW).unwrap_err() {
            ValidationError::Revoked {
                which,
                serial,
                issuer,
            } => {
                assert_eq!(which, "PCK CA");
                // DER pads the serial with a zero byte; the message shows it as encoded.
                assert_eq!(
                    serial,
                    format!("00{}", hex::encode(&pki.intermediate_serial))
                );
                assert!(issuer.contains("Test Root CA"), "{issuer}");
            }
            other => panic!("expected a revocation, got {other:?}"),
        }

        // The same chain passes under a CRL of the same issuer that revokes something else.
        let other = crl(&pki.root_params, &pki.root_key, &[vec![0x42]]);
        let bundle = CrlBundle::from_files([("root.crl", other)]).unwrap();
        check(&bundle, &pki, NOW).unwrap();
    }

    #[test]
    fn a_crl_not_signed_by_the_issuer_is_refused() {
        let pki = pki();
        // The issuer's name, another key: a CRL anyone could make.
        let impostor = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let forged = crl(&pki.root_params, &impostor, &[]);
        // The issuer's own CRL with one bit of its signature flipped.
        let mut tampered = crl(&pki.root_params, &pki.root_key, &[]);
        let at = tampered.len() - 5;
        tampered[at] ^= 1;
        for bytes in [forged, tampered] {
            let bundle = CrlBundle::from_files([("root.crl", bytes)]).unwrap();
            match check(&bundle, &pki, NOW).unwrap_err() {
                ValidationError::Certificate { which, reason } => {
                    assert!(which.contains("Test Root CA"), "{which}");
                    assert!(reason.contains("not signed by its issuer"), "{reason}");
                }
                other => panic!("expected a CRL refusal, got {other:?}"),
            }
        }
    }

    #[test]
    fn an_expired_or_future_crl_is_refused() {
        let pki = pki();
        let current = crl(&pki.root_params, &pki.root_key, &[]);
        let bundle = CrlBundle::from_files([("root.crl", current)]).unwrap();
        check(&bundle, &pki, NOW).unwrap();
        // 2027-01-02, after nextUpdate; 2024-06-01, before thisUpdate.
        for (now, needle) in [(1_798_848_000, "expired"), (1_717_200_000, "after the")] {
            match check(&bundle, &pki, now).unwrap_err() {
                ValidationError::Certificate { reason, .. } => {
                    assert!(reason.contains(needle), "{reason}")
                }
                other => panic!("expected a CRL refusal, got {other:?}"),
            }
        }
    }

    #[test]
    fn a_bundle_without_a_crl_of_the_issuer_refuses_the_certificate() {
        let pki = pki();
        let elsewhere = pki_other_root_crl();
        for bundle in [
            CrlBundle::from_files(Vec::<(String, Vec<u8>)>::new()).unwrap(),
            CrlBundle::from_files([("other.crl", elsewhere)]).unwrap(),
        ] {
            match check(&bundle, &pki, NOW).unwrap_err() {
                ValidationError::Certificate { which, reason } => {
                    assert!(which.contains("Test Root CA"), "{which}");
                    assert!(reason.contains("none in the CRL bundle"), "{reason}");
                }
                other => panic!("expected a missing CRL, got {other:?}"),
            }
        }
    }

    fn pki_other_root_crl() -> Vec<u8> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        crl(&ca_params("Another Root CA", 9), &key, &[])
    }

    #[test]
    fn der_and_pem_crls_are_read_and_anything_else_is_refused() {
        let pki = pki();
        let der = crl(&pki.root_params, &pki.root_key, &[]);
        let pem_text = format!(
            "-----BEGIN X509 CRL-----\n{}\n-----END X509 CRL-----\n",
            base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &der)
        );
        let bundle =
            CrlBundle::from_files([("a.der", der.clone()), ("b.pem", pem_text.into_bytes())])
                .unwrap();
        assert_eq!(bundle.len(), 2);
        let summary = &bundle.summaries()[0];
        assert!(summary.issuer.contains("Test Root CA"));
        assert_eq!(summary.revoked, 0);

        let mut trailing = der.clone();
        trailing.push(0);
        for bad in [
            trailing,
            pki.root.clone(),
            b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".to_vec(),
            b"not a crl".to_vec(),
        ] {
            assert!(CrlBundle::from_files([("bad", bad)]).is_err());
        }
    }
}

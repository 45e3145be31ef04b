//! What makes a key an attestation key (AK) this crate accepts, whoever vouches for it: the
//! template every AK must match, its identity (the fingerprint), its signature check, its
//! public key as DER, and the walk of a certificate chain that vouches for it. The policies
//! that decide *which* AKs to trust ([`super::trust`]) build on this.

use super::structures::{
    AsymScheme, ECC_NIST_P256, KdfScheme, ObjectAttributes, PublicParams, SymDefObject, TpmtPublic,
    TpmtSignature, alg,
};
use crate::ValidationError;
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use rustls_pki_types::{CertificateDer, SignatureVerificationAlgorithm, TrustAnchor, UnixTime};
use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

/// Smallest RSA AK accepted, in bits.
pub const MIN_RSA_BITS: u16 = 2048;
/// Largest RSA AK accepted, in bits (ring verifies up to 8192).
pub const MAX_RSA_BITS: u16 = 8192;

/// 65537, big-endian, no leading zeros.
const RSA_DEFAULT_EXPONENT: [u8; 3] = [0x01, 0x00, 0x01];

/// Attributes every AK must have: a restricted signing key that never leaves its TPM.
pub const REQUIRED_AK_ATTRIBUTES: u32 = ObjectAttributes::RESTRICTED
    | ObjectAttributes::SIGN
    | ObjectAttributes::FIXED_TPM
    | ObjectAttributes::FIXED_PARENT;

/// The AK's exact `TPMA_OBJECT`: [`REQUIRED_AK_ATTRIBUTES`] with sensitiveDataOrigin,
/// userWithAuth and noDA (`0x00050472`), as `asterism-tpm` creates it. noDA keeps the AK
/// out of the TPM's dictionary-attack lockout, which unclean resets would otherwise trip.
/// Exact, so that a public area is a function of its key (module documentation of
/// [`AkFingerprint`]).
pub const AK_ATTRIBUTES: u32 = REQUIRED_AK_ATTRIBUTES
    | ObjectAttributes::SENSITIVE_DATA_ORIGIN
    | ObjectAttributes::USER_WITH_AUTH
    | ObjectAttributes::NO_DA;

impl TpmtPublic {
    /// An AK's public area: named with SHA-256, exactly [`AK_ATTRIBUTES`], no auth policy,
    /// with `params` (see [`PublicParams::ecdsa_p256`] and [`PublicParams::rsassa_sha256`]).
    pub fn ak(params: PublicParams) -> Self {
        Self {
            name_alg: alg::SHA256,
            attributes: ObjectAttributes(AK_ATTRIBUTES),
            auth_policy: Vec::new(),
            params,
        }
    }
}

/// `tcg-kp-AIKCertificate` (2.23.133.8.3), DER value of the OID.
pub(super) const TCG_KP_AIK_CERTIFICATE: &[u8] = &[0x67, 0x81, 0x05, 0x08, 0x03];

/// SHA-256 of an AK's `TPMT_PUBLIC` bytes: what [`AkTrust::Pinned`] pins, and the
/// identity a verified quote reports.
///
/// A platform CA certifies only the AK's public key, and a quote's signature covers nothing
/// of the public area, so anything in it but the key could be changed by whoever presents
/// the evidence. The validator therefore accepts exactly one template (the AK policy: exact
/// attributes, empty authPolicy, fixed scheme and parameters, canonical key encoding) and
/// computes the identity from the key alone, as the hash of that template around it. For an
/// AK that meets the policy this is the hash of its `ak_public` bytes, so
/// [`AkFingerprint::of_public_area`] pins it; one key has exactly one identity.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AkFingerprint([u8; 32]);

impl AkFingerprint {
    /// The fingerprint of a `TPMT_PUBLIC` as it appears in the evidence's `ak_public`.
    pub fn of_public_area(tpmt_public: &[u8]) -> Self {
        Self(crate::sha::sha256(tpmt_public))
    }

    /// Parses 64 hex digits.
    pub fn from_hex(s: &str) -> Result<Self, AkTrustError> {
        let bytes = hex::decode(s).map_err(|e| AkTrustError::Fingerprint(e.to_string()))?;
        let arr: [u8; 32] = bytes
            .as_slice()
            .try_into()
            .map_err(|_| AkTrustError::Fingerprint(format!("{} bytes, want 32", bytes.len())))?;
        Ok(Self(arr))
    }

    /// The raw digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl From<[u8; 32]> for AkFingerprint {
    fn from(b: [u8; 32]) -> Self {
        Self(b)
    }
}

impl fmt::Display for AkFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for AkFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AkFingerprint({self})")
    }
}

/// Why an AK trust policy could not be built.
#[derive(Debug, thiserror::Error)]
pub enum AkTrustError {
    /// A platform CA root certificate could not be used as a trust anchor.
    #[error("platform CA root #{index} is not a usable certificate: {reason}")]
    BadRoot {
        /// Position of the root in the input.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// A platform CA policy needs at least one root.
    #[error("a platform CA policy needs at least one root certificate")]
    NoRoots,
    /// A PEM bundle could not be read.
    #[error("platform CA PEM: {0}")]
    Pem(String),
    /// A fingerprint is not 64 hex digits.
    #[error("AK fingerprint: {0}")]
    Fingerprint(String),
    /// A cloud vTPM CA certificate is not usable.
    #[error("cloud vTPM CA {role} #{index}: {reason}")]
    CloudCertificate {
        /// `root` or `intermediate`.
        role: &'static str,
        /// Position among the certificates of that role.
        index: usize,
        /// What is wrong.
        reason: String,
    },
}

/// One walk of an AK certificate chain, shared by the platform CA and cloud vTPM CA
/// policies: the chain (leaf first, as the evidence carries it) must reach one of `anchors`
/// through the chain's own certificates and `extra_intermediates`, every certificate's
/// extended key usage allowing one of `ekus` (tried in order), and the leaf's public key
/// must be exactly the AK's. The messages name the policy.
pub(super) struct AkChainWalk<'a> {
    pub anchors: &'a [TrustAnchor<'a>],
    pub extra_intermediates: &'a [Vec<u8>],
    pub ekus: &'a [&'static [u8]],
    /// The refusal when the evidence carries no certificate.
    pub missing: &'static str,
    /// The prefix of a refusal by the path builder.
    pub untrusted: &'static str,
    /// The refusal when no certificate's EKU allows any of `ekus`.
    pub no_eku: &'static str,
}

/// What a successful [`AkChainWalk`] found: the trust anchor the path ended at, and the leaf
/// certificate it verified (DER), for a policy that checks more of the leaf.
pub(super) struct WalkedChain<'c> {
    pub anchor: TrustAnchor<'static>,
    pub leaf: &'c [u8],
}

impl AkChainWalk<'_> {
    /// Walks `chain` for `ak` at `now`.
    pub(super) fn verify<'c>(
        &self,
        chain: &'c [Vec<u8>],
        ak: &AkKey,
        now: SystemTime,
    ) -> Result<WalkedChain<'c>, ValidationError> {
        let untrusted = |m: String| ValidationError::UntrustedKey(m);
        let (leaf, sent) = chain
            .split_first()
            .ok_or_else(|| untrusted(self.missing.into()))?;
        let leaf_der = CertificateDer::from(leaf.as_slice());
        let leaf_cert = webpki::EndEntityCert::try_from(&leaf_der)
            .map_err(|e| untrusted(format!("AK certificate does not parse: {e}")))?;
        let intermediates: Vec<CertificateDer<'_>> = sent
            .iter()
            .chain(self.extra_intermediates)
            .map(|c| CertificateDer::from(c.as_slice()))
            .collect();
        let secs = now
            .duration_since(UNIX_EPOCH)
            .map_err(|_| untrusted("system clock is before 1970".into()))?;
        let time = UnixTime::since_unix_epoch(secs);
        let mut anchor = None;
        for &eku in self.ekus {
            match leaf_cert.verify_for_usage(
                CHAIN_ALGS,
                self.anchors,
                &intermediates,
                time,
                webpki::KeyUsage::required_if_present(eku),
                None,
                None,
            ) {
                Ok(path) => {
                    anchor = Some(path.anchor().to_owned());
                    break;
                }
                #[allow(deprecated)]
                Err(webpki::Error::RequiredEkuNotFound)
                | Err(webpki::Error::RequiredEkuNotFoundContext(_)) => continue,
                Err(e) => return Err(untrusted(format!("{}: {e}", self.untrusted))),
            }
        }
        let anchor = anchor.ok_or_else(|| untrusted(self.no_eku.into()))?;
        if leaf_cert.subject_public_key_info().as_ref() != ak.spki_der().as_slice() {
            return Err(untrusted(
                "the AK certificate's public key is not the key in ak_public".into(),
            ));
        }
        Ok(WalkedChain {
            anchor,
            leaf: leaf.as_slice(),
        })
    }
}

/// Signature algorithms accepted on certificates of an AK chain, and of an EK chain
/// (`tpm::ek`): the ones TPM manufacturers and platform CAs use, none with SHA-1.
pub(super) static CHAIN_ALGS: &[&dyn SignatureVerificationAlgorithm] = &[
    webpki::ring::ECDSA_P256_SHA256,
    webpki::ring::ECDSA_P256_SHA384,
    webpki::ring::ECDSA_P384_SHA256,
    webpki::ring::ECDSA_P384_SHA384,
    webpki::ring::RSA_PKCS1_2048_8192_SHA256,
    webpki::ring::RSA_PKCS1_2048_8192_SHA384,
    webpki::ring::RSA_PKCS1_2048_8192_SHA512,
    webpki::ring::RSA_PSS_2048_8192_SHA256_LEGACY_KEY,
    webpki::ring::RSA_PSS_2048_8192_SHA384_LEGACY_KEY,
    webpki::ring::RSA_PSS_2048_8192_SHA512_LEGACY_KEY,
];

/// Applies the AK policy that an AK trusted by a platform CA or a pin must pass (our AK
/// template exactly: restricted signing key, fixedTPM, fixedParent, sensitiveDataOrigin,
/// userWithAuth, noDA, empty authPolicy, nameAlg SHA-256, ECDSA-SHA256 on P-256 or
/// RSASSA-SHA256) to a `TPMT_PUBLIC`. An enrolment checks this before it certifies a key, so
/// a platform CA never certifies a key that verifiers would refuse anyway.
pub fn check_ak_template(tpmt_public: &[u8]) -> Result<(), ValidationError> {
    let public = TpmtPublic::parse(tpmt_public)
        .map_err(|e| ValidationError::Malformed(format!("AK public area: {e}")))?;
    AkKey::from_public(&public, AttributeRule::Exact).map(|_| ())
}

/// The DER SubjectPublicKeyInfo that a certificate for the AK whose `TPMT_PUBLIC` this is
/// must carry: a platform CA's AK certificate is accepted only if its key is exactly these
/// bytes. ECC P-256: `id-ecPublicKey` with `prime256v1`, key `04 || x || y`; RSA:
/// `rsaEncryption` with NULL parameters, key the DER `RSAPublicKey` with minimal integers
/// and exponent 65537. Refuses what [`check_ak_template`] refuses: a platform CA certifies
/// only keys a verifier would accept.
pub fn ak_spki_der(tpmt_public: &[u8]) -> Result<Vec<u8>, ValidationError> {
    let public = TpmtPublic::parse(tpmt_public)
        .map_err(|e| ValidationError::Malformed(format!("AK public area: {e}")))?;
    AkKey::from_public(&public, AttributeRule::Exact).map(|key| key.spki_der())
}

/// How strictly an AK's `TPMA_OBJECT` is checked ([`AkTrust::attribute_rule`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttributeRule {
    /// Exactly [`AK_ATTRIBUTES`].
    Exact,
    /// [`REQUIRED_AK_ATTRIBUTES`] set and decrypt clear; the rest as the maker chose.
    Required,
}

/// An AK public key that passed the AK policy, ready to verify quotes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AkKey {
    /// P-256 point, uncompressed (`04 || x || y`), ECDSA-SHA256.
    EcdsaP256([u8; 65]),
    /// RSA modulus (no leading zeros) and exponent (no leading zeros), RSASSA-SHA256.
    RsaSsa { n: Vec<u8>, e: Vec<u8> },
}

fn policy(msg: impl Into<String>) -> ValidationError {
    ValidationError::Policy(msg.into())
}

/// Left-pads a big-endian TPM2B integer to 32 bytes; refuses longer ones.
fn pad32(what: &str, v: &[u8]) -> Result<[u8; 32], ValidationError> {
    let mut out = [0u8; 32];
    let start = 32usize
        .checked_sub(v.len())
        .ok_or_else(|| policy(format!("{what} is {} bytes, at most 32 for P-256", v.len())))?;
    let dst = out
        .get_mut(start..)
        .ok_or_else(|| policy(format!("{what}: bad length")))?;
    dst.copy_from_slice(v);
    Ok(out)
}

/// An AK of `kind` (`ECC`, `RSA`) signs with `expected` (`name`-SHA256) and has no
/// symmetric algorithm.
fn signing_only(
    kind: &str,
    symmetric: &SymDefObject,
    scheme: &AsymScheme,
    expected: AsymScheme,
    name: &str,
) -> Result<(), ValidationError> {
    if *symmetric != SymDefObject::Null {
        return Err(policy(format!("{kind} AK has a symmetric algorithm")));
    }
    if *scheme != expected {
        return Err(policy(format!(
            "{kind} AK scheme {scheme:?} is not {name}-SHA256"
        )));
    }
    Ok(())
}

impl AkKey {
    /// Applies the AK policy: attributes (restricted, sign, fixedTPM, fixedParent, not
    /// decrypt), nameAlg SHA-256, no symmetric part, and exactly ECC P-256 with
    /// ECDSA-SHA256 (KDF null) or RSA 2048–8192 with RSASSA-SHA256.
    pub(crate) fn from_public(
        p: &TpmtPublic,
        rule: AttributeRule,
    ) -> Result<Self, ValidationError> {
        let attrs = p.attributes;
        if !p.auth_policy.is_empty() {
            return Err(policy(format!(
                "AK authPolicy is {} bytes; an AK has an empty authPolicy",
                p.auth_policy.len()
            )));
        }
        if !attrs.has(REQUIRED_AK_ATTRIBUTES) {
            let missing: Vec<&str> = [
                (ObjectAttributes::RESTRICTED, "restricted"),
                (ObjectAttributes::SIGN, "sign"),
                (ObjectAttributes::FIXED_TPM, "fixedTPM"),
                (ObjectAttributes::FIXED_PARENT, "fixedParent"),
            ]
            .into_iter()
            .filter(|(bit, _)| !attrs.has(*bit))
            .map(|(_, name)| name)
            .collect();
            return Err(policy(format!(
                "AK objectAttributes {:#010x} lack {}",
                attrs.0,
                missing.join(", ")
            )));
        }
        if attrs.has(ObjectAttributes::DECRYPT) {
            return Err(policy(format!(
                "AK objectAttributes {:#010x} have decrypt set",
                attrs.0
            )));
        }
        if rule == AttributeRule::Exact && attrs.0 != AK_ATTRIBUTES {
            return Err(policy(format!(
                "AK objectAttributes {:#010x} are not the AK template's {AK_ATTRIBUTES:#010x}",
                attrs.0
            )));
        }
        if p.name_alg != alg::SHA256 {
            return Err(policy(format!(
                "AK nameAlg {:#06x} is not SHA-256",
                p.name_alg
            )));
        }
        let sha256_scheme = |scheme: u16| AsymScheme::Hashed {
            scheme,
            hash: alg::SHA256,
        };
        match &p.params {
            PublicParams::Ecc {
                symmetric,
                scheme,
                curve,
                kdf,
                x,
                y,
            } => {
                signing_only("ECC", symmetric, scheme, sha256_scheme(alg::ECDSA), "ECDSA")?;
                if *curve != ECC_NIST_P256 {
                    return Err(policy(format!("ECC AK curve {curve:#06x} is not P-256")));
                }
                if *kdf != KdfScheme::Null {
                    return Err(policy("ECC AK has a KDF"));
                }
                // Exactly 32 bytes each: a shorter encoding of the same point would be a
                // second public area, and a second identity, for one key.
                if x.len() != 32 || y.len() != 32 {
                    return Err(policy(format!(
                        "ECC AK coordinates are {} and {} bytes, 32 each expected",
                        x.len(),
                        y.len()
                    )));
                }
                let mut point = [0u8; 65];
                let (tag, xy) = point.split_at_mut(1);
                let (px, py) = xy.split_at_mut(32);
                tag.copy_from_slice(&[0x04]);
                px.copy_from_slice(&pad32("AK x coordinate", x)?);
                py.copy_from_slice(&pad32("AK y coordinate", y)?);
                Ok(Self::EcdsaP256(point))
            }
            PublicParams::Rsa {
                symmetric,
                scheme,
                key_bits,
                exponent,
                modulus,
            } => {
                signing_only(
                    "RSA",
                    symmetric,
                    scheme,
                    sha256_scheme(alg::RSASSA),
                    "RSASSA",
                )?;
                if !(MIN_RSA_BITS..=MAX_RSA_BITS).contains(key_bits) || key_bits % 8 != 0 {
                    return Err(policy(format!(
                        "RSA AK keyBits {key_bits} not a multiple of 8 in {MIN_RSA_BITS}..={MAX_RSA_BITS}"
                    )));
                }
                // The modulus must have exactly keyBits bits.
                let full = modulus.len() == usize::from(*key_bits / 8)
                    && modulus.first().is_some_and(|b| b & 0x80 != 0);
                if !full {
                    return Err(policy(format!(
                        "RSA AK modulus is {} bytes or lacks its top bit; keyBits is {key_bits}",
                        modulus.len()
                    )));
                }
                // Only the default exponent, encoded as 0 (an explicit 65537 is the same key
                // in a second public area).
                if *exponent != 0 {
                    return Err(policy(format!(
                        "RSA AK exponent {exponent} is not the default (encoded 0)"
                    )));
                }
                Ok(Self::RsaSsa {
                    n: modulus.clone(),
                    e: RSA_DEFAULT_EXPONENT.to_vec(),
                })
            }
        }
    }

    /// The one public area the AK policy accepts for this key.
    pub(crate) fn canonical_public(&self) -> TpmtPublic {
        TpmtPublic::ak(match self {
            Self::EcdsaP256(point) => PublicParams::ecdsa_p256(
                point.get(1..33).unwrap_or_default().to_vec(),
                point.get(33..65).unwrap_or_default().to_vec(),
            ),
            Self::RsaSsa { n, .. } => PublicParams::rsassa_sha256(n.clone(), 0),
        })
    }

    /// The AK's identity: a function of the key alone (see [`AkFingerprint`]).
    pub(crate) fn fingerprint(&self) -> Result<AkFingerprint, ValidationError> {
        let bytes = self
            .canonical_public()
            .to_bytes()
            .map_err(|e| policy(format!("AK public area: {e}")))?;
        Ok(AkFingerprint::of_public_area(&bytes))
    }

    /// Verifies a TPM signature over `attest` (the TPM signed SHA-256(attest)).
    pub(crate) fn verify(&self, attest: &[u8], sig: &TpmtSignature) -> Result<(), ValidationError> {
        let bad = |m: &str| ValidationError::BadSignature(m.to_owned());
        match (self, sig) {
            (Self::EcdsaP256(point), TpmtSignature::Ecdsa { hash, r, s }) => {
                if *hash != alg::SHA256 {
                    return Err(bad("ECDSA signature hash is not SHA-256"));
                }
                let mut rs = [0u8; 64];
                let (pr, ps) = rs.split_at_mut(32);
                pr.copy_from_slice(&pad32("signature r", r)?);
                ps.copy_from_slice(&pad32("signature s", s)?);
                UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                    .verify(attest, &rs)
                    .map_err(|_| bad("ECDSA P-256 signature over the quote does not verify"))
            }
            (Self::RsaSsa { n, e }, TpmtSignature::RsaSsa { hash, sig }) => {
                if *hash != alg::SHA256 {
                    return Err(bad("RSASSA signature hash is not SHA-256"));
                }
                RsaPublicKeyComponents { n, e }
                    .verify(&signature::RSA_PKCS1_2048_8192_SHA256, attest, sig)
                    .map_err(|_| bad("RSASSA-SHA256 signature over the quote does not verify"))
            }
            _ => Err(bad(&format!(
                "signature scheme {:#06x} does not match the AK's scheme",
                sig.scheme()
            ))),
        }
    }

    /// The key as a DER SubjectPublicKeyInfo, as a certificate for it would carry it.
    pub(crate) fn spki_der(&self) -> Vec<u8> {
        match self {
            Self::EcdsaP256(point) => {
                // AlgorithmIdentifier { id-ecPublicKey, prime256v1 }
                const ALG: &[u8] = &[
                    0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08,
                    0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07,
                ];
                spki(ALG, point)
            }
            Self::RsaSsa { n, e } => {
                // AlgorithmIdentifier { rsaEncryption, NULL }
                const ALG: &[u8] = &[
                    0x30, 0x0d, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01,
                    0x05, 0x00,
                ];
                let mut ints = der_uint(n);
                ints.extend_from_slice(&der_uint(e));
                spki(ALG, &der_tlv(0x30, &ints))
            }
        }
    }
}

fn spki(alg_id: &[u8], key: &[u8]) -> Vec<u8> {
    let mut bits = Vec::with_capacity(key.len() + 1);
    bits.push(0); // no unused bits
    bits.extend_from_slice(key);
    let mut body = alg_id.to_vec();
    body.extend_from_slice(&der_tlv(0x03, &bits));
    der_tlv(0x30, &body)
}

fn der_tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(content.len() + 4);
    out.push(tag);
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        let significant = bytes.get(skip..).unwrap_or_default();
        out.push(0x80 | significant.len() as u8);
        out.extend_from_slice(significant);
    }
    out.extend_from_slice(content);
    out
}

/// A DER INTEGER of an unsigned big-endian value: minimal, with a 0x00 if the top bit is set.
fn der_uint(v: &[u8]) -> Vec<u8> {
    let skip = v.iter().take_while(|b| **b == 0).count();
    let v = v.get(skip..).unwrap_or_default();
    let mut content = Vec::with_capacity(v.len() + 1);
    if v.first().is_none_or(|b| b & 0x80 != 0) {
        content.push(0);
    }
    content.extend_from_slice(v);
    der_tlv(0x02, &content)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn der_integers_are_minimal() {
        assert_eq!(der_uint(&[0, 0, 1]), vec![2, 1, 1]);
        assert_eq!(der_uint(&[0x80]), vec![2, 2, 0, 0x80]);
        assert_eq!(der_uint(&[]), vec![2, 1, 0]);
        let long = der_tlv(0x04, &[0; 300]);
        assert_eq!(&long[..4], &[0x04, 0x82, 0x01, 0x2c]);
    }

    #[test]
    fn ecdsa_signature_components_longer_than_32_bytes_are_refused() {
        let key = AkKey::EcdsaP256([4; 65]);
        let sig = TpmtSignature::Ecdsa {
            hash: alg::SHA256,
            r: vec![1; 33],
            s: vec![1; 32],
        };
        assert!(matches!(
            key.verify(b"x", &sig),
            Err(ValidationError::Policy(m)) if m.contains("signature r is 33 bytes")
        ));
    }
}

//! The AK's public key as an X.509 certificate carries it, built from its TPMT_PUBLIC.
//!
//! The certificate's SubjectPublicKeyInfo must be byte for byte what the verifier derives
//! from the evidence's `ak_public` (`asterism-attestation` compares the DER):
//!
//! * ECC P-256: algorithm `id-ecPublicKey` with parameters `prime256v1`, key
//!   `04 || x || y` with both coordinates left-padded to 32 bytes;
//! * RSA: algorithm `rsaEncryption` with NULL parameters, key the DER `RSAPublicKey`
//!   `SEQUENCE { INTEGER n, INTEGER e }` (minimal integers; exponent 0 in the TPM means
//!   65537).

use anyhow::{Result, bail};
use asterism_attestation::tpm::TpmtPublic;
use asterism_attestation::tpm::structures::{ECC_NIST_P256, PublicParams};
use rcgen::{PublicKeyData, SignatureAlgorithm};

/// An AK public key ready to be certified by rcgen.
pub struct AkSubjectKey {
    /// The subjectPublicKey bit string's content.
    key: Vec<u8>,
    alg: &'static SignatureAlgorithm,
}

impl AkSubjectKey {
    /// Parses a TPMT_PUBLIC (no size prefix) and takes its public key.
    pub fn from_public_area(public_area: &[u8]) -> Result<Self> {
        let public = TpmtPublic::parse(public_area)
            .map_err(|e| anyhow::anyhow!("the AK public area does not parse: {e}"))?;
        match &public.params {
            PublicParams::Ecc { curve, x, y, .. } => {
                if *curve != ECC_NIST_P256 {
                    bail!("ECC AK curve {curve:#06x} is not NIST P-256");
                }
                let mut key = Vec::with_capacity(65);
                key.push(0x04);
                key.extend_from_slice(&pad32("x", x)?);
                key.extend_from_slice(&pad32("y", y)?);
                Ok(Self {
                    key,
                    alg: &rcgen::PKCS_ECDSA_P256_SHA256,
                })
            }
            PublicParams::Rsa {
                exponent, modulus, ..
            } => {
                if modulus.is_empty() {
                    bail!("RSA AK has an empty modulus");
                }
                let e = if *exponent == 0 { 65537 } else { *exponent };
                let mut ints = der_uint(modulus);
                ints.extend_from_slice(&der_uint(&e.to_be_bytes()));
                Ok(Self {
                    key: der_tlv(0x30, &ints),
                    alg: &rcgen::PKCS_RSA_SHA256,
                })
            }
        }
    }
}

impl PublicKeyData for AkSubjectKey {
    fn der_bytes(&self) -> &[u8] {
        &self.key
    }

    fn algorithm(&self) -> &'static SignatureAlgorithm {
        self.alg
    }
}

fn pad32(what: &str, v: &[u8]) -> Result<[u8; 32]> {
    let mut out = [0u8; 32];
    let Some(start) = 32usize.checked_sub(v.len()) else {
        bail!(
            "AK {what} coordinate is {} bytes, at most 32 for P-256",
            v.len()
        );
    };
    if let Some(dst) = out.get_mut(start..) {
        dst.copy_from_slice(v);
    }
    Ok(out)
}

fn der_tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(content.len() + 4);
    out.push(tag);
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let significant: Vec<u8> = bytes.iter().copied().skip_while(|b| *b == 0).collect();
        out.push(0x80 | significant.len() as u8);
        out.extend_from_slice(&significant);
    }
    out.extend_from_slice(content);
    out
}

/// A DER INTEGER of an unsigned big-endian value: minimal, with a 0x00 if the top bit is set.
fn der_uint(v: &[u8]) -> Vec<u8> {
    let digits: Vec<u8> = v.iter().copied().skip_while(|b| *b == 0).collect();
    let mut content = Vec::with_capacity(digits.len() + 1);
    if digits.first().is_none_or(|b| b & 0x80 != 0) {
        content.push(0);
    }
    content.extend_from_slice(&digits);
    der_tlv(0x02, &content)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn der_integers_are_minimal_and_positive() {
        assert_eq!(der_uint(&[0, 0, 1]), vec![2, 1, 1]);
        assert_eq!(der_uint(&[0x80]), vec![2, 2, 0, 0x80]);
        assert_eq!(der_uint(&65537u32.to_be_bytes()), vec![2, 3, 1, 0, 1]);
        assert_eq!(&der_tlv(0x04, &[0; 300])[..4], &[0x04, 0x82, 0x01, 0x2c]);
    }

    #[test]
    fn short_coordinates_are_left_padded_and_long_ones_refused() {
        let padded = pad32("x", &[1, 2]).unwrap();
        assert_eq!(&padded[30..], &[1, 2]);
        assert!(padded[..30].iter().all(|b| *b == 0));
        assert!(pad32("x", &[1; 33]).is_err());
    }
}

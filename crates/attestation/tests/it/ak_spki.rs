//! [`ak_spki_der`]: the SubjectPublicKeyInfo an AK certificate must carry, pinned byte for
//! byte for both key types. The platform CA (`asterism-provision`) certifies exactly these
//! bytes and the verifier compares a certificate's key with them, so a change to either
//! encoding breaks every issued AK certificate.

use crate::common::*;
use asterism_attestation::ValidationError;
use asterism_attestation::tpm::ak_spki_der;
use asterism_attestation::tpm::structures::PublicParams;

/// `SEQUENCE { SEQUENCE { id-ecPublicKey, prime256v1 }, BIT STRING (66 bytes, 0 unused) }`.
const P256_SPKI_PREFIX: &str = "3059301306072a8648ce3d020106082a8648ce3d030107034200";
/// `SEQUENCE { SEQUENCE { rsaEncryption, NULL }, BIT STRING (271 bytes, 0 unused) }` for a
/// 2048-bit modulus with exponent 65537.
const RSA2048_SPKI_PREFIX: &str = "30820122300d06092a864886f70d01010105000382010f00";

#[test]
fn p256_ak_spki_is_the_uncompressed_point_under_id_ec_public_key_prime256v1() {
    let ak = ecdsa_ak();
    let spki = ak_spki_der(ak.public_area_bytes()).unwrap();
    // ring's encoding of the same key, not ours: `04 || x || y`.
    let expected = format!("{P256_SPKI_PREFIX}{}", hex::encode(ak.subject_public_key()));
    assert_eq!(hex::encode(&spki), expected);
    assert_eq!(spki.len(), 91);
}

#[test]
fn rsa_ak_spki_is_the_der_rsa_public_key_under_rsa_encryption_with_null() {
    let ak = rsa_ak();
    let spki = ak_spki_der(ak.public_area_bytes()).unwrap();
    // ring's DER RSAPublicKey of the same key: minimal INTEGERs, exponent 65537.
    let expected = format!(
        "{RSA2048_SPKI_PREFIX}{}",
        hex::encode(ak.subject_public_key())
    );
    assert_eq!(hex::encode(&spki), expected);
    assert_eq!(spki.len(), 294);
    // The exponent, encoded 0 in the TPM, is written as 65537.
    assert!(hex::encode(&spki).ends_with("0203010001"));
}

#[test]
fn ak_spki_of_a_public_area_that_does_not_parse_is_refused_as_malformed() {
    let ak = ecdsa_ak();
    let bytes = ak.public_area_bytes();
    let truncated = &bytes[..bytes.len() - 1];
    assert!(matches!(
        ak_spki_der(truncated),
        Err(ValidationError::Malformed(m)) if m.starts_with("AK public area")
    ));
}

#[test]
fn ak_spki_of_a_key_outside_the_ak_template_is_refused() {
    // A shorter encoding of an ECC coordinate is a second public area for one key.
    let short_x = ecdsa_ak()
        .with_public(|p| {
            if let PublicParams::Ecc { x, .. } = &mut p.params {
                x.remove(0);
            }
        })
        .unwrap();
    assert!(matches!(
        ak_spki_der(short_x.public_area_bytes()),
        Err(ValidationError::Policy(m)) if m.contains("coordinates are 31 and 32 bytes")
    ));
    // An explicit 65537 is the default exponent in a second public area.
    let explicit_exponent = rsa_ak()
        .with_public(|p| {
            if let PublicParams::Rsa { exponent, .. } = &mut p.params {
                *exponent = 65537;
            }
        })
        .unwrap();
    assert!(matches!(
        ak_spki_der(explicit_exponent.public_area_bytes()),
        Err(ValidationError::Policy(m)) if m.contains("exponent 65537 is not the default")
    ));
}

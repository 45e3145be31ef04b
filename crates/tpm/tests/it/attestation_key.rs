//! The attestation key: created once, persisted at its handle, found again afterwards, and
//! made from the restricted-signing template.

use crate::common::{
    ALG_ECC, ALG_ECDSA, ALG_NULL, ALG_RSA, ALG_RSASSA, ALG_SHA256, AkPublic, ECC_NIST_P256,
    parse_public, swtpm_and_tpm,
};
use asterism_tpm::ak::{AK_ATTRIBUTES, ECC_AK_HANDLE, RSA_AK_HANDLE};
use asterism_tpm::{AkAlgorithm, AkConfig, PersistentHandle, Tpm};

const FIXED_TPM: u32 = 1 << 1;
const FIXED_PARENT: u32 = 1 << 4;
const SENSITIVE_DATA_ORIGIN: u32 = 1 << 5;
const USER_WITH_AUTH: u32 = 1 << 6;
const NO_DA: u32 = 1 << 10;
const RESTRICTED: u32 = 1 << 16;
const DECRYPT: u32 = 1 << 17;
const SIGN: u32 = 1 << 18;

#[test]
fn ak_is_created_once_then_loaded_from_its_persistent_handle() {
    let (mut swtpm, mut tpm) = swtpm_and_tpm(false);
    let config = AkConfig::default();

    let first = tpm.load_attestation_key(&config).unwrap();
    assert!(first.was_created());
    assert_eq!(first.handle().unwrap().raw(), ECC_AK_HANDLE);

    let second = tpm.load_attestation_key(&config).unwrap();
    assert!(!second.was_created(), "the persisted AK must be reused");
    assert_eq!(first.public_area(), second.public_area());

    // A new connection finds the same key.
    drop(tpm);
    let mut tpm = Tpm::open(&swtpm.config()).unwrap();
    let third = tpm.load_attestation_key(&config).unwrap();
    assert!(!third.was_created());
    assert_eq!(first.public_area(), third.public_area());

    // So does a new swtpm process on the same state (persistent objects live in NV).
    drop(tpm);
    swtpm.restart().unwrap();
    let mut tpm = Tpm::open(&swtpm.config()).unwrap();
    let fourth = tpm.load_attestation_key(&config).unwrap();
    assert!(!fourth.was_created());
    assert_eq!(first.public_area(), fourth.public_area());
}

#[test]
fn ecc_ak_is_a_restricted_p256_ecdsa_sha256_signing_key() {
    let (_swtpm, mut tpm) = swtpm_and_tpm(false);
    let ak = tpm.load_attestation_key(&AkConfig::default()).unwrap();
    assert_eq!(ak.algorithm(), AkAlgorithm::EccP256);

    let public = parse_public(ak.public_area());
    assert_eq!(public.alg, ALG_ECC);
    assert_eq!(public.name_alg, ALG_SHA256);
    assert_eq!(
        public.attributes,
        FIXED_TPM
            | FIXED_PARENT
            | SENSITIVE_DATA_ORIGIN
            | USER_WITH_AUTH
            | NO_DA
            | RESTRICTED
            | SIGN
    );
    assert_eq!(public.attributes, AK_ATTRIBUTES);
    assert_eq!(public.attributes & DECRYPT, 0);
    assert!(public.auth_policy.is_empty());
    assert_eq!(public.symmetric, ALG_NULL);
    assert_eq!((public.scheme, public.scheme_hash), (ALG_ECDSA, ALG_SHA256));
    assert_eq!(public.curve_or_bits, ECC_NIST_P256);
    let AkPublic::Ecc { x, y } = public.key else {
        panic!("not an ECC key");
    };
    // The TPM filled in a real point, not the template's zeroes.
    assert_eq!((x.len(), y.len()), (32, 32));
    assert!(x.iter().any(|b| *b != 0));
}

#[test]
fn rsa_ak_is_a_restricted_2048_bit_rsassa_sha256_signing_key() {
    let (_swtpm, mut tpm) = swtpm_and_tpm(false);
    let config = AkConfig::new(AkAlgorithm::Rsa2048);
    let ak = tpm.load_attestation_key(&config).unwrap();
    assert_eq!(ak.handle().unwrap().raw(), RSA_AK_HANDLE);

    let public = parse_public(ak.public_area());
    assert_eq!(public.alg, ALG_RSA);
    assert_eq!(public.name_alg, ALG_SHA256);
    assert_eq!(public.attributes, AK_ATTRIBUTES);
    assert_eq!(
        (public.scheme, public.scheme_hash),
        (ALG_RSASSA, ALG_SHA256)
    );
    assert_eq!(public.curve_or_bits, 2048);
    let AkPublic::Rsa { modulus, exponent } = public.key else {
        panic!("not an RSA key");
    };
    assert_eq!(modulus.len(), 256);
    assert_eq!(exponent, 65537);

    // Both AKs can live side by side at their own handles.
    let ecc = tpm.load_attestation_key(&AkConfig::default()).unwrap();
    assert_ne!(ecc.public_area(), ak.public_area());
    let again = tpm.load_attestation_key(&config).unwrap();
    assert!(!again.was_created());
    assert_eq!(again.public_area(), ak.public_area());
}

#[test]
fn an_object_of_another_template_at_the_ak_handle_is_replaced() {
    let (_swtpm, mut tpm) = swtpm_and_tpm(false);
    let handle = PersistentHandle::try_from(ECC_AK_HANDLE).unwrap();
    // An RSA key squatting on the ECC AK's handle.
    let squatter = tpm
        .load_attestation_key(&AkConfig::new(AkAlgorithm::Rsa2048).with_handle(handle))
        .unwrap();
    assert_eq!(parse_public(squatter.public_area()).alg, ALG_RSA);

    let ak = tpm.load_attestation_key(&AkConfig::default()).unwrap();
    assert!(ak.was_created(), "the mismatching object must be replaced");
    assert_eq!(parse_public(ak.public_area()).alg, ALG_ECC);
    let again = tpm.load_attestation_key(&AkConfig::default()).unwrap();
    assert!(!again.was_created());
}

#[test]
fn primary_ak_is_deterministic_for_a_given_tpm() {
    // The AK is a primary key: recreating it from the template after eviction yields the
    // same key, because it is derived from the owner seed.
    let (_swtpm, mut tpm) = swtpm_and_tpm(false);
    let first = tpm.load_attestation_key(&AkConfig::default()).unwrap();
    let other_handle = PersistentHandle::try_from(0x8100_8F10).unwrap();
    let elsewhere = tpm
        .load_attestation_key(&AkConfig::default().with_handle(other_handle))
        .unwrap();
    assert!(elsewhere.was_created());
    assert_eq!(first.public_area(), elsewhere.public_area());
}

#[test]
fn persistent_handles_outside_the_persistent_range_are_rejected() {
    assert!(PersistentHandle::try_from(0x8000_0001).is_err());
    assert!(PersistentHandle::try_from(0x0100_0000).is_err());
    assert!(PersistentHandle::try_from(0x81FF_FFFF).is_ok());
}

/// A platform's own AK (as a cloud vTPM provisions one) is used as it is, and never created
/// or replaced.
#[test]
fn a_provisioned_ak_is_used_as_it_is_and_never_created_or_replaced() {
    let (_swtpm, mut tpm) = swtpm_and_tpm(false);
    let azure = PersistentHandle::try_from(0x8100_0003).unwrap();

    // Nothing provisioned: an error, and nothing made at the handle.
    let config = AkConfig::provisioned_at(AkAlgorithm::Rsa2048, azure);
    let err = tpm.load_attestation_key(&config).unwrap_err();
    assert!(err.to_string().contains("0x81000003"), "{err}");
    assert!(
        tpm.load_attestation_key(&config).is_err(),
        "nothing was created"
    );

    // The platform made an RSA AK there (here: our template, at that handle).
    let made = tpm
        .load_attestation_key(&AkConfig::new(AkAlgorithm::Rsa2048).with_handle(azure))
        .unwrap();
    let loaded = tpm.load_attestation_key(&config).unwrap();
    assert!(!loaded.was_created());
    assert_eq!(loaded.public_area(), made.public_area());

    // Asked for an ECC AK where the platform's key is RSA: refused, and the key stays.
    let wrong = AkConfig::provisioned_at(AkAlgorithm::EccP256, azure);
    let err = tpm.load_attestation_key(&wrong).unwrap_err();
    assert!(err.to_string().contains("no attestation key"), "{err}");
    let again = tpm.load_attestation_key(&config).unwrap();
    assert_eq!(again.public_area(), made.public_area(), "never replaced");
}

//! The attestation key (AK): algorithms, templates and persistent handles.
//!
//! **Choice: the AK is a primary key of the owner hierarchy**, not a child of an SRK.
//! `TPM2_CreatePrimary` derives a primary key deterministically from the hierarchy's seed and
//! the template, so the same TPM always gives the same AK until the owner hierarchy is cleared,
//! and no storage key or key blob has to be kept anywhere. The key is made persistent with
//! `TPM2_EvictControl` so that later loads are a handle look-up instead of a key generation (an
//! RSA primary takes seconds on some TPMs).
//!
//! Templates (TPMT_PUBLIC, nameAlg SHA-256, empty authPolicy, empty auth value):
//!
//! | | ECC P-256 (default) | RSA-2048 |
//! | --- | --- | --- |
//! | attributes | fixedTPM, fixedParent, sensitiveDataOrigin, userWithAuth, noDA, restricted, sign (`0x00050472`) | same |
//! | scheme | ECDSA with SHA-256 | RSASSA-PKCS1-v1_5 with SHA-256 |
//! | parameters | curve NIST P-256, symmetric NULL, KDF NULL | 2048 bits, exponent 0 (= 65537), symmetric NULL |
//! | unique | x and y: 32 zero bytes each | modulus: 256 zero bytes |
//! | persistent handle | `0x81008F00` | `0x81008F01` |
//!
//! **noDA**: the AK is exempt from the TPM's dictionary-attack protection. Its auth value is
//! empty, so there is nothing to guess, but a TPM counts every reset without an orderly
//! `TPM2_Shutdown` (a power cut, a crash, a killed swtpm) as an authorisation failure against
//! DA-protected objects; after `maxTries` such resets (3 on swtpm's defaults) every use of a
//! DA-protected AK fails with `TPM_RC_LOCKOUT` for `recoveryTime` (about 1,000 s), and a node
//! that crashed three times could not rejoin. Verifiers require this exact template
//! (`asterism-attestation`'s AK policy), so an AK without noDA is refused there: a TPM
//! provisioned with the earlier template must have its AK re-created (`asterism-provision`).
//!
//! The zero-filled `unique` follows the TCG EK-template convention; it makes the template
//! (and so the derived key) a fixed function of the algorithm.
//!
//! **A cloud's AK from an NV template** ([`NvTemplateAk`]): GCE's vTPM keeps no AK but the
//! template of one in NV (`0x01c10003` ECC P-256, `0x01c10001` RSA-2048) and Google's
//! certificate for the key that template makes as a primary of the endorsement hierarchy
//! (`0x01c10002`, `0x01c10000`). [`crate::Tpm::load_nv_template_ak`] makes that key
//! (transient, never persisted) after checking that the template is an attestation key
//! ([`provisioned_mismatch`]); its attributes are the cloud's (GCE's lack noDA), which
//! verifiers accept only with the cloud's certificate.

use tss_esapi::attributes::ObjectAttributesBuilder;
use tss_esapi::interface_types::algorithm::{HashingAlgorithm, PublicAlgorithm};
use tss_esapi::interface_types::ecc::EccCurve;
use tss_esapi::interface_types::key_bits::RsaKeyBits;
use tss_esapi::structures::{
    EccParameter, EccPoint, EccScheme, HashScheme, KeyDerivationFunctionScheme, Public,
    PublicBuilder, PublicEccParametersBuilder, PublicKeyRsa, PublicRsaParametersBuilder,
    RsaExponent, RsaScheme, SymmetricDefinitionObject,
};

use crate::error::TpmError;

/// The persistent handle of the ECC AK.
pub const ECC_AK_HANDLE: u32 = 0x8100_8F00;
/// The persistent handle of the RSA AK.
pub const RSA_AK_HANDLE: u32 = 0x8100_8F01;

/// TPMA_OBJECT of every AK: fixedTPM | fixedParent | sensitiveDataOrigin | userWithAuth |
/// noDA | restricted | sign.
pub const AK_ATTRIBUTES: u32 =
    (1 << 1) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 10) | (1 << 16) | (1 << 18);

/// The AK's key type and signature scheme.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AkAlgorithm {
    /// ECC NIST P-256, ECDSA with SHA-256.
    #[default]
    EccP256,
    /// RSA-2048, RSASSA-PKCS1-v1_5 with SHA-256.
    Rsa2048,
}

impl AkAlgorithm {
    /// The conventional persistent handle for this algorithm.
    pub const fn default_handle(self) -> PersistentHandle {
        match self {
            AkAlgorithm::EccP256 => PersistentHandle(ECC_AK_HANDLE),
            AkAlgorithm::Rsa2048 => PersistentHandle(RSA_AK_HANDLE),
        }
    }
}

/// A handle in the TPM's persistent-object range `0x81000000..=0x81FFFFFF`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PersistentHandle(u32);

impl PersistentHandle {
    /// The raw handle.
    pub const fn raw(self) -> u32 {
        self.0
    }
}

impl TryFrom<u32> for PersistentHandle {
    type Error = TpmError;

    fn try_from(handle: u32) -> Result<Self, Self::Error> {
        if handle >> 24 == 0x81 {
            Ok(PersistentHandle(handle))
        } else {
            Err(TpmError::InvalidPersistentHandle { handle })
        }
    }
}

/// Which AK to load and where it lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AkConfig {
    /// Key type and scheme.
    pub algorithm: AkAlgorithm,
    /// Where the key is persisted.
    pub handle: PersistentHandle,
    /// Use the key already at `handle` as its maker made it, never create or replace it
    /// (a cloud vTPM's own AK, which the VM's hardware report vouches for). Without it, a
    /// key at `handle` that was not made from our template is replaced by one that is.
    pub provisioned: bool,
}

impl AkConfig {
    /// `algorithm` at its conventional handle.
    pub const fn new(algorithm: AkAlgorithm) -> Self {
        AkConfig {
            algorithm,
            handle: algorithm.default_handle(),
            provisioned: false,
        }
    }

    /// The key the platform provisioned at `handle`: loaded as it is, never created or
    /// replaced; it must be an attestation key of `algorithm` (see
    /// [`provisioned_mismatch`]).
    pub const fn provisioned_at(algorithm: AkAlgorithm, handle: PersistentHandle) -> Self {
        AkConfig {
            algorithm,
            handle,
            provisioned: true,
        }
    }

    /// The same key at another persistent handle.
    pub const fn with_handle(mut self, handle: PersistentHandle) -> Self {
        self.handle = handle;
        self
    }
}

impl Default for AkConfig {
    /// ECC P-256 at `0x81008F00`.
    fn default() -> Self {
        AkConfig::new(AkAlgorithm::EccP256)
    }
}

/// NV index of Google's certificate for the RSA AK of a GCE vTPM (DER).
pub const GCE_RSA_AK_CERT_NV_INDEX: u32 = 0x01c1_0000;
/// NV index of the template (TPMT_PUBLIC) of the RSA AK of a GCE vTPM.
pub const GCE_RSA_AK_TEMPLATE_NV_INDEX: u32 = 0x01c1_0001;
/// NV index of Google's certificate for the ECC AK of a GCE vTPM (DER).
pub const GCE_ECC_AK_CERT_NV_INDEX: u32 = 0x01c1_0002;
/// NV index of the template (TPMT_PUBLIC) of the ECC AK of a GCE vTPM.
pub const GCE_ECC_AK_TEMPLATE_NV_INDEX: u32 = 0x01c1_0003;

/// The most bytes read from an AK template's NV index. A TPMT_PUBLIC is at most a few
/// hundred bytes (an RSA-4096 unique field is 512); a larger index is no template.
pub const MAX_AK_TEMPLATE: usize = 1024;

/// An AK that the vTPM does not keep but makes again on each boot: a primary key of the
/// endorsement hierarchy, created from a template (TPMT_PUBLIC) the cloud stores in an NV
/// index, and certified by the cloud's vTPM CA in a paired NV index. A primary key is a
/// fixed function of the hierarchy's seed and the template, so it is the key the
/// certificate names every time. GCE's vTPM works this way ([`NvTemplateAk::GCE`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NvTemplateAk {
    /// The key type and scheme the template must describe.
    pub algorithm: AkAlgorithm,
    /// The NV index holding the template (a marshalled TPMT_PUBLIC).
    pub template_index: u32,
    /// The NV index holding the cloud's certificate for the key (DER, maybe padded).
    pub certificate_index: u32,
}

impl NvTemplateAk {
    /// GCE's ECC P-256 AK: template in `0x01c10003`, certificate in `0x01c10002`.
    pub const GCE_ECC: NvTemplateAk = NvTemplateAk {
        algorithm: AkAlgorithm::EccP256,
        template_index: GCE_ECC_AK_TEMPLATE_NV_INDEX,
        certificate_index: GCE_ECC_AK_CERT_NV_INDEX,
    };

    /// GCE's RSA-2048 AK: template in `0x01c10001`, certificate in `0x01c10000`.
    pub const GCE_RSA: NvTemplateAk = NvTemplateAk {
        algorithm: AkAlgorithm::Rsa2048,
        template_index: GCE_RSA_AK_TEMPLATE_NV_INDEX,
        certificate_index: GCE_RSA_AK_CERT_NV_INDEX,
    };

    /// GCE's AKs, preferred first (ECC: smaller quotes, faster to create).
    pub const GCE: [NvTemplateAk; 2] = [Self::GCE_ECC, Self::GCE_RSA];

    /// GCE's AK of `algorithm`.
    pub const fn gce(algorithm: AkAlgorithm) -> NvTemplateAk {
        match algorithm {
            AkAlgorithm::EccP256 => Self::GCE_ECC,
            AkAlgorithm::Rsa2048 => Self::GCE_RSA,
        }
    }
}

/// Where a loaded attestation key lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AkLocation {
    /// A persistent object at this handle.
    Persistent(PersistentHandle),
    /// A transient primary key made from an NV template, held by the connection that made
    /// it (and made again from the template if it was flushed).
    NvTemplate(NvTemplateAk),
}

impl std::fmt::Display for AkLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AkLocation::Persistent(handle) => write!(f, "persistent handle {:#010x}", handle.0),
            AkLocation::NvTemplate(ak) => write!(
                f,
                "endorsement primary from the template in NV index {:#010x}",
                ak.template_index
            ),
        }
    }
}

/// A loaded attestation key: what a verifier needs to know about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttestationKey {
    pub(crate) algorithm: AkAlgorithm,
    pub(crate) location: AkLocation,
    pub(crate) public: Vec<u8>,
    pub(crate) created: bool,
}

impl AttestationKey {
    /// The public area, marshalled as a TPMT_PUBLIC (TPM wire encoding, no TPM2B size
    /// prefix): what evidence carries as the AK public key.
    pub fn public_area(&self) -> &[u8] {
        &self.public
    }

    /// Key type and scheme.
    pub fn algorithm(&self) -> AkAlgorithm {
        self.algorithm
    }

    /// The persistent handle the key lives at; `None` for a key made from an NV template,
    /// which is not persistent.
    pub fn handle(&self) -> Option<PersistentHandle> {
        match self.location {
            AkLocation::Persistent(handle) => Some(handle),
            AkLocation::NvTemplate(_) => None,
        }
    }

    /// Where the key lives.
    pub fn location(&self) -> AkLocation {
        self.location
    }

    /// Whether this load created (and persisted) the key rather than finding it. A key made
    /// from an NV template is created on every load, from the cloud's template, and says
    /// `false`: it is the cloud's key, not one of ours.
    pub fn was_created(&self) -> bool {
        self.created
    }
}

/// The AK template for `algorithm` (see the module documentation).
pub(crate) fn template(algorithm: AkAlgorithm) -> tss_esapi::Result<Public> {
    let attributes = ObjectAttributesBuilder::new()
        .with_fixed_tpm(true)
        .with_fixed_parent(true)
        .with_sensitive_data_origin(true)
        .with_user_with_auth(true)
        .with_no_da(true)
        .with_restricted(true)
        .with_sign_encrypt(true)
        .build()?;
    let builder = PublicBuilder::new()
        .with_name_hashing_algorithm(HashingAlgorithm::Sha256)
        .with_object_attributes(attributes);
    match algorithm {
        AkAlgorithm::EccP256 => builder
            .with_public_algorithm(PublicAlgorithm::Ecc)
            .with_ecc_parameters(
                PublicEccParametersBuilder::new()
                    .with_symmetric(SymmetricDefinitionObject::Null)
                    .with_ecc_scheme(EccScheme::EcDsa(HashScheme::new(HashingAlgorithm::Sha256)))
                    .with_curve(EccCurve::NistP256)
                    .with_key_derivation_function_scheme(KeyDerivationFunctionScheme::Null)
                    .with_is_signing_key(true)
                    .with_restricted(true)
                    .build()?,
            )
            .with_ecc_unique_identifier(EccPoint::new(
                EccParameter::try_from(vec![0u8; 32])?,
                EccParameter::try_from(vec![0u8; 32])?,
            ))
            .build(),
        AkAlgorithm::Rsa2048 => builder
            .with_public_algorithm(PublicAlgorithm::Rsa)
            .with_rsa_parameters(
                PublicRsaParametersBuilder::new()
                    .with_symmetric(SymmetricDefinitionObject::Null)
                    .with_scheme(RsaScheme::RsaSsa(HashScheme::new(HashingAlgorithm::Sha256)))
                    .with_key_bits(RsaKeyBits::Rsa2048)
                    .with_exponent(RsaExponent::default())
                    .with_is_signing_key(true)
                    .with_restricted(true)
                    .build()?,
            )
            .with_rsa_unique_identifier(PublicKeyRsa::try_from(vec![0u8; 256])?)
            .build(),
    }
}

/// Why a key a platform provisioned cannot serve as an AK of `algorithm`, if it cannot: it
/// must be a restricted signing key that never leaves the TPM (restricted, sign, fixedTPM,
/// fixedParent, not decrypt), named with SHA-256, with an empty auth policy, and of the
/// algorithm's key type (RSA-2048 with RSASSA-SHA256, or ECC P-256 with ECDSA-SHA256).
/// The rest of its attributes are its maker's (a cloud's AK may lack noDA).
pub fn provisioned_mismatch(algorithm: AkAlgorithm, found: &Public) -> Option<String> {
    const RESTRICTED: u32 = 1 << 16;
    const DECRYPT: u32 = 1 << 17;
    const SIGN: u32 = 1 << 18;
    const FIXED_TPM: u32 = 1 << 1;
    const FIXED_PARENT: u32 = 1 << 4;
    let required = RESTRICTED | SIGN | FIXED_TPM | FIXED_PARENT;
    let attributes = u32::from(found.object_attributes());
    if attributes & required != required || attributes & DECRYPT != 0 {
        return Some(format!(
            "attributes {attributes:#010x}: an AK is restricted, sign, fixedTPM, fixedParent and not decrypt"
        ));
    }
    if found.name_hashing_algorithm() != HashingAlgorithm::Sha256 {
        return Some(format!(
            "name algorithm {:?}, expected SHA-256",
            found.name_hashing_algorithm()
        ));
    }
    if !found.auth_policy().is_empty() {
        return Some("a non-empty auth policy".to_owned());
    }
    match (algorithm, found) {
        (AkAlgorithm::Rsa2048, Public::Rsa { parameters, .. })
            if parameters.key_bits() == RsaKeyBits::Rsa2048
                && parameters.rsa_scheme()
                    == RsaScheme::RsaSsa(HashScheme::new(HashingAlgorithm::Sha256)) =>
        {
            None
        }
        (AkAlgorithm::EccP256, Public::Ecc { parameters, .. })
            if parameters.ecc_curve() == EccCurve::NistP256
                && parameters.ecc_scheme()
                    == EccScheme::EcDsa(HashScheme::new(HashingAlgorithm::Sha256)) =>
        {
            None
        }
        (_, Public::Rsa { parameters, .. }) => Some(format!(
            "RSA key {:?} with scheme {:?}, expected {algorithm:?}",
            parameters.key_bits(),
            parameters.rsa_scheme()
        )),
        (_, Public::Ecc { parameters, .. }) => Some(format!(
            "ECC key {:?} with scheme {:?}, expected {algorithm:?}",
            parameters.ecc_curve(),
            parameters.ecc_scheme()
        )),
        _ => Some(format!("another key type, expected {algorithm:?}")),
    }
}

/// Whether the public area `found` at the AK handle is a key made from `expected`'s template:
/// same type, name algorithm, attributes, auth policy and parameters. The `unique` field (the
/// public key itself) is not compared. Returns what differs, or `None` when it matches.
pub(crate) fn template_mismatch(expected: &Public, found: &Public) -> Option<String> {
    if expected.object_attributes() != found.object_attributes() {
        return Some(format!(
            "attributes {:#010x}, expected {:#010x}",
            u32::from(found.object_attributes()),
            u32::from(expected.object_attributes())
        ));
    }
    if expected.name_hashing_algorithm() != found.name_hashing_algorithm() {
        return Some(format!(
            "name algorithm {:?}, expected {:?}",
            found.name_hashing_algorithm(),
            expected.name_hashing_algorithm()
        ));
    }
    if expected.auth_policy() != found.auth_policy() {
        return Some("a non-empty auth policy".to_owned());
    }
    match (expected, found) {
        (Public::Ecc { parameters: e, .. }, Public::Ecc { parameters: f, .. }) if e == f => None,
        (Public::Rsa { parameters: e, .. }, Public::Rsa { parameters: f, .. }) if e == f => None,
        (Public::Ecc { .. }, Public::Ecc { parameters, .. }) => {
            Some(format!("ECC parameters {parameters:?}"))
        }
        (Public::Rsa { .. }, Public::Rsa { parameters, .. }) => {
            Some(format!("RSA parameters {parameters:?}"))
        }
        _ => Some("another key type".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tss_esapi::traits::Marshall;

    #[test]
    fn a_provisioned_key_must_be_a_restricted_signing_key_of_the_algorithm() {
        let rsa = template(AkAlgorithm::Rsa2048).unwrap();
        let ecc = template(AkAlgorithm::EccP256).unwrap();
        assert_eq!(provisioned_mismatch(AkAlgorithm::Rsa2048, &rsa), None);
        assert_eq!(provisioned_mismatch(AkAlgorithm::EccP256, &ecc), None);
        assert!(provisioned_mismatch(AkAlgorithm::EccP256, &rsa).is_some());
        assert!(provisioned_mismatch(AkAlgorithm::Rsa2048, &ecc).is_some());

        // Without noDA (as a cloud makes its AK): still an AK.
        let without_no_da = ObjectAttributesBuilder::new()
            .with_fixed_tpm(true)
            .with_fixed_parent(true)
            .with_sensitive_data_origin(true)
            .with_user_with_auth(true)
            .with_restricted(true)
            .with_sign_encrypt(true)
            .build()
            .unwrap();
        let cloud = rebuild(&rsa, without_no_da);
        assert_eq!(provisioned_mismatch(AkAlgorithm::Rsa2048, &cloud), None);

        // Not restricted: it could sign anything, a fake quote included.
        let unrestricted = ObjectAttributesBuilder::new()
            .with_fixed_tpm(true)
            .with_fixed_parent(true)
            .with_sign_encrypt(true)
            .build()
            .unwrap();
        let reason = provisioned_mismatch(AkAlgorithm::Rsa2048, &rebuild(&rsa, unrestricted));
        assert!(reason.is_some_and(|r| r.contains("restricted")));
    }

    /// `public` with other object attributes.
    fn rebuild(public: &Public, attributes: tss_esapi::attributes::ObjectAttributes) -> Public {
        let Public::Rsa {
            parameters, unique, ..
        } = public
        else {
            panic!("an RSA template");
        };
        PublicBuilder::new()
            .with_name_hashing_algorithm(HashingAlgorithm::Sha256)
            .with_object_attributes(attributes)
            .with_public_algorithm(PublicAlgorithm::Rsa)
            .with_rsa_parameters(*parameters)
            .with_rsa_unique_identifier(unique.clone())
            .build()
            .unwrap()
    }

    #[test]
    fn persistent_handles_are_range_checked() {
        assert_eq!(
            PersistentHandle::try_from(ECC_AK_HANDLE).unwrap().raw(),
            ECC_AK_HANDLE
        );
        assert!(matches!(
            PersistentHandle::try_from(0x8000_0000),
            Err(TpmError::InvalidPersistentHandle { .. })
        ));
        assert_eq!(AkConfig::default().handle.raw(), 0x8100_8F00);
        assert_eq!(
            AkConfig::new(AkAlgorithm::Rsa2048).handle.raw(),
            0x8100_8F01
        );
    }

    #[test]
    fn templates_carry_the_ak_attributes_and_scheme() {
        let ecc = template(AkAlgorithm::EccP256).unwrap();
        assert_eq!(u32::from(ecc.object_attributes()), AK_ATTRIBUTES);
        let bytes = ecc.marshall().unwrap();
        // type ECC (0x0023), nameAlg SHA-256 (0x000b), attributes.
        assert_eq!(
            &bytes[..8],
            &[0x00, 0x23, 0x00, 0x0b, 0x00, 0x05, 0x04, 0x72]
        );
        assert!(template_mismatch(&ecc, &ecc).is_none());

        let rsa = template(AkAlgorithm::Rsa2048).unwrap();
        assert_eq!(&rsa.marshall().unwrap()[..4], &[0x00, 0x01, 0x00, 0x0b]);
        assert!(template_mismatch(&ecc, &rsa).is_some());
    }
}

//! `TPM2_MakeCredential` in software: the owner's half of credential activation.
//!
//! A verifier that holds an EK's public key and an AK's name makes a challenge only the TPM
//! holding both can open (TPM 2.0 Part 1, "Credential Protection"; Part 3,
//! `TPM2_MakeCredential` and `TPM2_ActivateCredential`):
//!
//! 1. a random `seed` (as long as the EK's nameAlg digest) is shared with the EK:
//!    * RSA EK: the seed encrypted with RSA-OAEP, the EK's nameAlg as hash and MGF1 hash,
//!      label `"IDENTITY\0"`;
//!    * ECC EK: an ephemeral ECDH key pair on the EK's curve; `Z` the x-coordinate of the
//!      shared point, `seed = KDFe(nameAlg, Z, "IDENTITY", ephemeral.x, EK.x)`; the
//!      ephemeral public point (`TPMS_ECC_POINT`) is the encrypted secret;
//! 2. `symKey = KDFa(nameAlg, seed, "STORAGE", name, "", bits of the EK's symmetric key)`
//!    and `encIdentity = AES-CFB(symKey, IV 0, TPM2B_DIGEST(credential))`;
//! 3. `HMACkey = KDFa(nameAlg, seed, "INTEGRITY", "", "", digest bits)` and
//!    `outerHMAC = HMAC(HMACkey, encIdentity || name)`;
//! 4. the credential blob (`TPM2B_ID_OBJECT` content) is `TPM2B_DIGEST(outerHMAC) ||
//!    encIdentity`.
//!
//! The TPM recomputes the HMAC with the AK's name as *it* knows it, so a blob made for one
//! AK name cannot be opened with another key, and only the EK's private key recovers the
//! seed. The EK's template (nameAlg, symmetric algorithm) decides the algorithms: the TCG
//! default EK templates L-1 (RSA-2048) and L-2 (ECC P-256) use SHA-256 and AES-128-CFB,
//! which is what is supported here. The high-range templates (ECC P-384, swtpm's ECC EK)
//! use SHA-384 and an EK policy with PolicyOR that activation does not satisfy yet.
//!
//! Everything here is computation on values: no files, no TPM.

use std::fmt;

use anyhow::{Context, Result, anyhow, bail};
use asterism_attestation::tpm::TpmtPublic;
use asterism_attestation::tpm::ek::VerifiedEk;
use asterism_attestation::tpm::structures::{ObjectAttributes, PublicParams, SymDefObject, alg};
use ring::rand::{SecureRandom, SystemRandom};
use ring::{agreement, digest, hmac};
use zeroize::Zeroizing;

/// `TPM_ALG_CFB`.
const ALG_CFB: u16 = 0x0043;

/// How many bytes an enrolment credential has: one SHA-256 digest.
pub const CREDENTIAL_LEN: usize = 32;

/// What the enrolment proof's HMAC starts with, so the key proves this and nothing else.
pub const PROOF_CONTEXT: &[u8] = b"asterism enrolment v1";

/// The secret a challenge carries to the TPM. Random, zeroized on drop, never printed.
pub struct Credential(Zeroizing<[u8; CREDENTIAL_LEN]>);

impl Credential {
    /// A fresh credential from the system's random generator.
    pub fn random() -> Result<Self> {
        let mut bytes = Zeroizing::new([0u8; CREDENTIAL_LEN]);
        SystemRandom::new()
            .fill(bytes.as_mut())
            .map_err(|_| anyhow!("the system random generator failed"))?;
        Ok(Self(bytes))
    }

    /// The credential's bytes.
    pub fn expose(&self) -> &[u8; CREDENTIAL_LEN] {
        &self.0
    }
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Credential(<redacted>)")
    }
}

/// What `TPM2_MakeCredential` returns: the inputs of `TPM2_ActivateCredential`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MadeCredential {
    /// The content of the `TPM2B_ID_OBJECT`: `TPM2B_DIGEST(outerHMAC) || encIdentity`.
    pub credential_blob: Vec<u8>,
    /// The content of the `TPM2B_ENCRYPTED_SECRET`: the seed, encrypted to the EK.
    pub encrypted_secret: Vec<u8>,
}

/// A hash that names keys: the EK's nameAlg decides the KDFs and the HMAC. Only SHA-256
/// (the low-range EK templates and our AK).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NameHash {
    Sha256,
}

impl NameHash {
    fn of(alg_id: u16) -> Result<Self> {
        match alg_id {
            alg::SHA256 => Ok(Self::Sha256),
            other => bail!("name algorithm {other:#06x} is not supported (SHA-256 only)"),
        }
    }

    fn len(self) -> usize {
        match self {
            Self::Sha256 => 32,
        }
    }

    fn hmac(self) -> hmac::Algorithm {
        match self {
            Self::Sha256 => hmac::HMAC_SHA256,
        }
    }

    fn digest(self) -> &'static digest::Algorithm {
        match self {
            Self::Sha256 => &digest::SHA256,
        }
    }
}

/// The Name of an object: `nameAlg || H_nameAlg(TPMT_PUBLIC)`, from the marshalled
/// `TPMT_PUBLIC` (its nameAlg is bytes 2..4).
pub fn object_name(tpmt_public: &[u8]) -> Result<Vec<u8>> {
    let &[_, _, high, low, ..] = tpmt_public else {
        bail!("a TPMT_PUBLIC shorter than its header");
    };
    let name_alg = u16::from_be_bytes([high, low]);
    let hash = NameHash::of(name_alg)?;
    let mut name = name_alg.to_be_bytes().to_vec();
    name.extend_from_slice(digest::digest(hash.digest(), tpmt_public).as_ref());
    Ok(name)
}

/// `KDFa` (SP 800-108 counter mode with HMAC, TPM 2.0 Part 1): `bits` bits from `key`,
/// `label` (a terminating zero is added), `context_u` and `context_v`.
fn kdfa(
    hash: NameHash,
    key: &[u8],
    label: &[u8],
    context_u: &[u8],
    context_v: &[u8],
    bits: u32,
) -> Zeroizing<Vec<u8>> {
    let key = hmac::Key::new(hash.hmac(), key);
    let bytes = (bits as usize).div_ceil(8);
    let mut out = Zeroizing::new(Vec::with_capacity(bytes + hash.len()));
    let mut counter: u32 = 1;
    while out.len() < bytes {
        let mut ctx = hmac::Context::with_key(&key);
        ctx.update(&counter.to_be_bytes());
        ctx.update(label);
        ctx.update(&[0]);
        ctx.update(context_u);
        ctx.update(context_v);
        ctx.update(&bits.to_be_bytes());
        out.extend_from_slice(ctx.sign().as_ref());
        counter += 1;
    }
    out.truncate(bytes);
    out
}

/// `KDFe` (SP 800-56A concatenation KDF, TPM 2.0 Part 1): `bits` bits from the shared
/// x-coordinate `z`, `label` (a terminating zero is added), `party_u` and `party_v`.
fn kdfe(
    hash: NameHash,
    z: &[u8],
    label: &[u8],
    party_u: &[u8],
    party_v: &[u8],
    bits: u32,
) -> Zeroizing<Vec<u8>> {
    let bytes = (bits as usize).div_ceil(8);
    let mut out = Zeroizing::new(Vec::with_capacity(bytes + hash.len()));
    let mut counter: u32 = 1;
    while out.len() < bytes {
        let mut ctx = digest::Context::new(hash.digest());
        ctx.update(&counter.to_be_bytes());
        ctx.update(z);
        ctx.update(label);
        ctx.update(&[0]);
        ctx.update(party_u);
        ctx.update(party_v);
        out.extend_from_slice(ctx.finish().as_ref());
        counter += 1;
    }
    out.truncate(bytes);
    out
}

/// AES-128 in CFB mode (128-bit feedback) with a zero IV, encrypting in place.
fn aes_cfb_encrypt(key: &[u8], data: &mut [u8]) -> Result<()> {
    aes_cfb_encrypt_iv(key, [0; 16], data)
}

fn aes_cfb_encrypt_iv(key: &[u8], iv: [u8; 16], data: &mut [u8]) -> Result<()> {
    use aes::cipher::{BlockEncrypt, KeyInit};
    let run = |cipher: &dyn Fn(&mut aes::Block), data: &mut [u8]| {
        let mut feedback = aes::Block::from(iv);
        for chunk in data.chunks_mut(16) {
            let mut keystream = feedback;
            cipher(&mut keystream);
            for (byte, k) in chunk.iter_mut().zip(keystream.iter()) {
                *byte ^= k;
            }
            // The ciphertext block is the next block's input (only a full block has a next).
            if let Some(full) = feedback.get_mut(..chunk.len()) {
                full.copy_from_slice(chunk);
            }
        }
    };
    let cipher = aes::Aes128::new_from_slice(key)
        .map_err(|_| anyhow!("an AES key of {} bytes, not 16", key.len()))?;
    run(&|block| cipher.encrypt_block(block), data);
    Ok(())
}

/// The parameters of an EK that decide how a credential is made for it.
struct EkParams {
    hash: NameHash,
    sym_key_bits: u16,
}

/// Checks that `ek` is a storage key a credential can be made for (restricted decryption
/// key, fixedTPM, fixedParent, AES-128-CFB as its symmetric algorithm, nameAlg SHA-256) and
/// returns its parameters.
fn ek_params(ek: &TpmtPublic) -> Result<EkParams> {
    let required = ObjectAttributes::RESTRICTED
        | ObjectAttributes::DECRYPT
        | ObjectAttributes::FIXED_TPM
        | ObjectAttributes::FIXED_PARENT;
    if !ek.attributes.has(required) || ek.attributes.has(ObjectAttributes::SIGN) {
        bail!(
            "the EK's attributes {:#010x} are not those of an endorsement key (restricted, \
             decrypt, fixedTPM, fixedParent, not sign)",
            ek.attributes.0
        );
    }
    let hash = NameHash::of(ek.name_alg).context("the EK")?;
    let symmetric = match &ek.params {
        PublicParams::Rsa { symmetric, .. } | PublicParams::Ecc { symmetric, .. } => symmetric,
    };
    let sym_key_bits = match symmetric {
        SymDefObject::Cipher {
            algorithm: alg::AES,
            key_bits: bits @ 128,
            mode: ALG_CFB,
        } => *bits,
        other => bail!("the EK's symmetric algorithm {other:?} is not AES-128-CFB"),
    };
    Ok(EkParams { hash, sym_key_bits })
}

/// `TPM2_MakeCredential(ek, credential, name)`: a challenge that only the TPM holding the
/// EK `ek` and a key named `name` can open. Only for an EK whose certificate was verified:
/// a challenge to an unverified key proves nothing.
pub fn make_credential(
    ek: &VerifiedEk,
    name: &[u8],
    credential: &Credential,
) -> Result<MadeCredential> {
    make_credential_for_key(ek.ek_public(), name, credential)
}

/// [`make_credential`] for any EK public area (the tests' uncertified swtpm EKs).
fn make_credential_for_key(
    ek: &TpmtPublic,
    name: &[u8],
    credential: &Credential,
) -> Result<MadeCredential> {
    let params = ek_params(ek)?;
    let (seed, encrypted_secret) = share_seed(ek, params.hash)?;
    wrap_credential(&params, &seed, name, credential.expose(), encrypted_secret)
}

/// Steps 2–4 of the module documentation, from a seed already shared with the EK.
fn wrap_credential(
    params: &EkParams,
    seed: &[u8],
    name: &[u8],
    credential: &[u8],
    encrypted_secret: Vec<u8>,
) -> Result<MadeCredential> {
    let hash = params.hash;
    let sym_key = kdfa(
        hash,
        seed,
        b"STORAGE",
        name,
        &[],
        u32::from(params.sym_key_bits),
    );
    let len = u16::try_from(credential.len()).context("credential length")?;
    let mut enc_identity = Zeroizing::new(Vec::with_capacity(2 + credential.len()));
    enc_identity.extend_from_slice(&len.to_be_bytes());
    enc_identity.extend_from_slice(credential);
    aes_cfb_encrypt(&sym_key, &mut enc_identity)?;

    let hmac_key = kdfa(hash, seed, b"INTEGRITY", &[], &[], 8 * hash.len() as u32);
    let mut ctx = hmac::Context::with_key(&hmac::Key::new(hash.hmac(), &hmac_key));
    ctx.update(&enc_identity);
    ctx.update(name);
    let outer_hmac = ctx.sign();

    let mut credential_blob = Vec::with_capacity(2 + hash.len() + enc_identity.len());
    credential_blob.extend_from_slice(&(hash.len() as u16).to_be_bytes());
    credential_blob.extend_from_slice(outer_hmac.as_ref());
    credential_blob.extend_from_slice(&enc_identity);
    Ok(MadeCredential {
        credential_blob,
        encrypted_secret,
    })
}

/// Step 1: a seed shared with the EK, and the EK-encrypted form the TPM opens.
fn share_seed(ek: &TpmtPublic, hash: NameHash) -> Result<(Zeroizing<Vec<u8>>, Vec<u8>)> {
    match &ek.params {
        PublicParams::Rsa {
            exponent, modulus, ..
        } => {
            let mut seed = Zeroizing::new(vec![0u8; hash.len()]);
            SystemRandom::new()
                .fill(&mut seed)
                .map_err(|_| anyhow!("the system random generator failed"))?;
            let encrypted = rsa_oaep_identity(modulus, *exponent, hash, &seed)?;
            Ok((seed, encrypted))
        }
        PublicParams::Ecc { curve, x, y, .. } => {
            let (algorithm, size) = match *curve {
                0x0003 => (&agreement::ECDH_P256, 32),
                other => bail!("the EK's curve {other:#06x} is not supported (P-256 only)"),
            };
            let rng = SystemRandom::new();
            let ephemeral = agreement::EphemeralPrivateKey::generate(algorithm, &rng)
                .map_err(|_| anyhow!("generating an ephemeral ECDH key"))?;
            let public = ephemeral
                .compute_public_key()
                .map_err(|_| anyhow!("computing the ephemeral ECDH public key"))?;
            // Uncompressed: 04 || x || y.
            let (ephemeral_x, ephemeral_y) = public
                .as_ref()
                .get(1..)
                .filter(|xy| xy.len() == 2 * size)
                .map(|xy| xy.split_at(size))
                .context("an ephemeral public key of the wrong size")?;
            let ek_x = left_pad(x, size).context("the EK's x-coordinate")?;
            let ek_y = left_pad(y, size).context("the EK's y-coordinate")?;
            let mut ek_point = vec![0x04];
            ek_point.extend_from_slice(&ek_x);
            ek_point.extend_from_slice(&ek_y);
            let peer = agreement::UnparsedPublicKey::new(algorithm, &ek_point);
            let seed = agreement::agree_ephemeral(ephemeral, &peer, |z| {
                kdfe(
                    hash,
                    z,
                    b"IDENTITY",
                    ephemeral_x,
                    &ek_x,
                    8 * hash.len() as u32,
                )
            })
            .map_err(|_| anyhow!("ECDH with the EK failed (is its point on the curve?)"))?;
            let mut point = Vec::with_capacity(4 + 2 * size);
            for coordinate in [ephemeral_x, ephemeral_y] {
                point.extend_from_slice(&(size as u16).to_be_bytes());
                point.extend_from_slice(coordinate);
            }
            Ok((seed, point))
        }
    }
}

/// A big-endian integer as exactly `size` bytes.
fn left_pad(value: &[u8], size: usize) -> Result<Vec<u8>> {
    let skip = value.iter().take_while(|b| **b == 0).count();
    let trimmed = value.get(skip..).unwrap_or_default();
    let pad = size
        .checked_sub(trimmed.len())
        .with_context(|| format!("{} bytes, more than {size}", trimmed.len()))?;
    let mut out = vec![0u8; pad];
    out.extend_from_slice(trimmed);
    Ok(out)
}

/// RSA-OAEP encryption of `seed` to the key (`modulus`, `exponent`; 0 means 65537) with the
/// label `"IDENTITY\0"`, hashed with the EK's nameAlg.
fn rsa_oaep_identity(
    modulus: &[u8],
    exponent: u32,
    hash: NameHash,
    seed: &[u8],
) -> Result<Vec<u8>> {
    use rsa::{BigUint, Oaep, RsaPublicKey};
    let exponent = if exponent == 0 { 65537 } else { exponent };
    let key = RsaPublicKey::new(
        BigUint::from_bytes_be(modulus),
        BigUint::from(u64::from(exponent)),
    )
    .context("the EK's RSA public key")?;
    // The label includes its terminating zero, as the TPM's does.
    let label = "IDENTITY\0";
    let padding = match hash {
        NameHash::Sha256 => Oaep::new_with_label::<sha2_rsa::Sha256, _>(label),
    };
    key.encrypt(&mut rand_core_rsa::OsRng, padding, seed)
        .context("RSA-OAEP encryption to the EK")
}

/// The enrolment proof: `HMAC-SHA256(credential, PROOF_CONTEXT || len(name) || name ||
/// request digest)`. It shows that whoever answers recovered the credential, without
/// revealing it, and ties the answer to one AK and one request.
pub fn enrolment_proof(credential: &[u8], ak_name: &[u8], request_digest: &[u8; 32]) -> [u8; 32] {
    let key = hmac::Key::new(hmac::HMAC_SHA256, credential);
    let mut ctx = hmac::Context::with_key(&key);
    ctx.update(PROOF_CONTEXT);
    // A name is at most 2 + 64 bytes; the length keeps the fields apart.
    ctx.update(&(ak_name.len() as u16).to_be_bytes());
    ctx.update(ak_name);
    ctx.update(request_digest);
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.sign().as_ref());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kdfa_counts_blocks_and_truncates() {
        let long = kdfa(NameHash::Sha256, b"key", b"STORAGE", b"u", b"v", 512);
        assert_eq!(long.len(), 64);
        let short = kdfa(NameHash::Sha256, b"key", b"STORAGE", b"u", b"v", 128);
        assert_eq!(short.len(), 16);
        // The bit count is part of the input: a shorter key is not a prefix of a longer one.
        assert_ne!(&long[..16], short.as_slice());
        // The first block: HMAC(key, 1 || "STORAGE" || 0 || u || v || 512).
        let key = hmac::Key::new(hmac::HMAC_SHA256, b"key");
        let block = hmac::sign(
            &key,
            &[
                &1u32.to_be_bytes()[..],
                b"STORAGE\0",
                b"u",
                b"v",
                &512u32.to_be_bytes(),
            ]
            .concat(),
        );
        assert_eq!(&long[..32], block.as_ref());
    }

    #[test]
    fn aes_cfb_matches_the_nist_vectors() {
        // NIST SP 800-38A, F.3.13 CFB128-AES128.Encrypt.
        let key = hex::decode("2b7e151628aed2a6abf7158809cf4f3c").unwrap();
        let iv: [u8; 16] = hex::decode("000102030405060708090a0b0c0d0e0f")
            .unwrap()
            .try_into()
            .unwrap();
        let plain = hex::decode(
            "6bc1bee22e409f96e93d7e117393172aae2d8a571e03ac9c9eb76fac45af8e51\
             30c81c46a35ce411e5fbc1191a0a52eff69f2445df4f9b17ad2b417be66c3710",
        )
        .unwrap();
        let cipher = "3b3fd92eb72dad20333449f8e83cfb4ac8a64537a0b3a93fcde3cdad9f1ce58b\
                      26751f67a3cbb140b1808cf187a4f4dfc04b05357c5d1c0eeac4c66f9ff7f2e6";
        let mut data = plain.clone();
        aes_cfb_encrypt_iv(&key, iv, &mut data).unwrap();
        assert_eq!(hex::encode(&data), cipher);
        // A partial last block is the prefix of the full block's ciphertext.
        let mut data = plain[..37].to_vec();
        aes_cfb_encrypt_iv(&key, iv, &mut data).unwrap();
        assert_eq!(hex::encode(&data), cipher[..74]);
        // With a zero IV (as for credentials) the first block is AES_K(0) XOR P1:
        // AES-128(0^128, 0^128) = 66e94bd4ef8a2c3b884cfa59ca342b2e (FIPS-197 style vector).
        let mut zero = [0u8; 16];
        aes_cfb_encrypt(&[0; 16], &mut zero).unwrap();
        assert_eq!(hex::encode(zero), "66e94bd4ef8a2c3b884cfa59ca342b2e");
    }

    #[test]
    fn names_are_the_name_algorithm_and_the_hash_of_the_public_area() {
        let public = [0x00, 0x23, 0x00, 0x0b, 0xaa];
        let name = object_name(&public).unwrap();
        assert_eq!(&name[..2], &[0x00, 0x0b]);
        assert_eq!(
            &name[2..],
            digest::digest(&digest::SHA256, &public).as_ref()
        );
        assert!(object_name(&[0x00, 0x23, 0x00, 0x04]).is_err(), "SHA-1");
        assert!(object_name(&[0x00]).is_err());
    }

    #[test]
    fn the_proof_depends_on_every_input() {
        let base = enrolment_proof(&[1; 32], &[2; 34], &[3; 32]);
        assert_ne!(base, enrolment_proof(&[9; 32], &[2; 34], &[3; 32]));
        assert_ne!(base, enrolment_proof(&[1; 32], &[9; 34], &[3; 32]));
        assert_ne!(base, enrolment_proof(&[1; 32], &[2; 34], &[9; 32]));
        assert_eq!(
            format!("{:?}", Credential::random().unwrap()),
            "Credential(<redacted>)"
        );
    }

    // ---- against the TPM: software MakeCredential, swtpm ActivateCredential ----

    use asterism_testkit::Swtpm;
    use asterism_tpm::{AkAlgorithm, AkConfig, AttestationKey, EkCertSlot, Tpm};

    /// A fresh swtpm, open, with an ECC P-256 AK loaded, and the AK's name.
    fn tpm_with_ak() -> (Swtpm, Tpm, AttestationKey, Vec<u8>) {
        let swtpm = Swtpm::start().unwrap();
        let mut tpm = Tpm::open(&swtpm.config()).unwrap();
        let ak = tpm
            .load_attestation_key(&AkConfig::new(AkAlgorithm::EccP256))
            .unwrap();
        let name = object_name(ak.public_area()).unwrap();
        (swtpm, tpm, ak, name)
    }

    #[test]
    fn the_tpm_recovers_a_credential_made_in_software_for_each_ek_template() {
        let (_swtpm, mut tpm, ak, name) = tpm_with_ak();
        for slot in [EkCertSlot::Rsa2048, EkCertSlot::EccP256] {
            let ek = TpmtPublic::parse(&tpm.read_ek_public(slot).unwrap()).unwrap();
            let credential = Credential::random().unwrap();
            let made = make_credential_for_key(&ek, &name, &credential).unwrap();
            let recovered = tpm
                .activate_credential(&ak, slot, &made.credential_blob, &made.encrypted_secret)
                .unwrap_or_else(|e| panic!("{slot:?}: {e}"));
            assert_eq!(recovered.expose(), credential.expose(), "{slot:?}");
            assert_eq!(format!("{recovered:?}"), "ActivatedCredential(<redacted>)");
        }
    }

    #[test]
    fn the_tpm_refuses_a_credential_made_for_another_key_name_or_another_ek() {
        let (_swtpm, mut tpm, ak, name) = tpm_with_ak();
        let slot = EkCertSlot::Rsa2048;
        let ek = TpmtPublic::parse(&tpm.read_ek_public(slot).unwrap()).unwrap();
        let credential = Credential::random().unwrap();

        let mut other_name = name.clone();
        *other_name.last_mut().unwrap() ^= 1;
        let made = make_credential_for_key(&ek, &other_name, &credential).unwrap();
        let error = tpm
            .activate_credential(&ak, slot, &made.credential_blob, &made.encrypted_secret)
            .unwrap_err();
        assert!(error.to_string().contains("ActivateCredential"), "{error}");

        // Another TPM's EK: its seed cannot be decrypted here.
        let other = Swtpm::start().unwrap();
        let mut other_tpm = Tpm::open(&other.config()).unwrap();
        let other_ek = TpmtPublic::parse(&other_tpm.read_ek_public(slot).unwrap()).unwrap();
        let made = make_credential_for_key(&other_ek, &name, &credential).unwrap();
        assert!(
            tpm.activate_credential(&ak, slot, &made.credential_blob, &made.encrypted_secret)
                .is_err()
        );

        // A flipped bit anywhere in the blob fails the integrity check.
        let mut made = make_credential_for_key(&ek, &name, &credential).unwrap();
        *made.credential_blob.last_mut().unwrap() ^= 1;
        assert!(
            tpm.activate_credential(&ak, slot, &made.credential_blob, &made.encrypted_secret)
                .is_err()
        );
    }
}

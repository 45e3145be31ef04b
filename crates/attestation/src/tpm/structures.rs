//! TPM 2.0 wire structures a quote is made of (TPM 2.0 Part 2): `TPMS_ATTEST` (quote only),
//! `TPMT_SIGNATURE` (ECDSA, RSASSA) and `TPMT_PUBLIC` (ECC, RSA).
//!
//! Parsers take exactly one structure: every TPM2B and list length is checked against the
//! specification's maximum, every union selector is checked, and trailing bytes are an
//! error. Values inside (TPM2B payloads) are kept byte for byte, so marshalling a parsed
//! structure gives back the input: policy (which algorithms, which sizes) is the
//! validator's business, not the parser's.

use super::wire::{ParseError, Reader, Writer};
use crate::measurements::PcrIndex;
use std::collections::BTreeSet;

/// TPM 2.0 algorithm identifiers (`TPM_ALG_ID`) used here.
pub mod alg {
    /// `TPM_ALG_RSA`.
    pub const RSA: u16 = 0x0001;
    /// `TPM_ALG_SHA1`.
    pub const SHA1: u16 = 0x0004;
    /// `TPM_ALG_AES`.
    pub const AES: u16 = 0x0006;
    /// `TPM_ALG_MGF1`.
    pub const MGF1: u16 = 0x0007;
    /// `TPM_ALG_SHA256`.
    pub const SHA256: u16 = 0x000b;
    /// `TPM_ALG_SHA384`.
    pub const SHA384: u16 = 0x000c;
    /// `TPM_ALG_SHA512`.
    pub const SHA512: u16 = 0x000d;
    /// `TPM_ALG_NULL`.
    pub const NULL: u16 = 0x0010;
    /// `TPM_ALG_SM4`.
    pub const SM4: u16 = 0x0013;
    /// `TPM_ALG_RSASSA` (PKCS#1 v1.5 signatures).
    pub const RSASSA: u16 = 0x0014;
    /// `TPM_ALG_RSAES`.
    pub const RSAES: u16 = 0x0015;
    /// `TPM_ALG_RSAPSS`.
    pub const RSAPSS: u16 = 0x0016;
    /// `TPM_ALG_OAEP`.
    pub const OAEP: u16 = 0x0017;
    /// `TPM_ALG_ECDSA`.
    pub const ECDSA: u16 = 0x0018;
    /// `TPM_ALG_ECDH`.
    pub const ECDH: u16 = 0x0019;
    /// `TPM_ALG_ECDAA`.
    pub const ECDAA: u16 = 0x001a;
    /// `TPM_ALG_SM2`.
    pub const SM2: u16 = 0x001b;
    /// `TPM_ALG_ECSCHNORR`.
    pub const ECSCHNORR: u16 = 0x001c;
    /// `TPM_ALG_ECMQV`.
    pub const ECMQV: u16 = 0x001d;
    /// `TPM_ALG_KDF1_SP800_56A`.
    pub const KDF1_SP800_56A: u16 = 0x0020;
    /// `TPM_ALG_KDF2`.
    pub const KDF2: u16 = 0x0021;
    /// `TPM_ALG_KDF1_SP800_108`.
    pub const KDF1_SP800_108: u16 = 0x0022;
    /// `TPM_ALG_ECC`.
    pub const ECC: u16 = 0x0023;
    /// `TPM_ALG_CAMELLIA`.
    pub const CAMELLIA: u16 = 0x0026;
}

/// `TPM_ECC_NIST_P256`.
pub const ECC_NIST_P256: u16 = 0x0003;
/// `TPM_GENERATED_VALUE`: the magic at the start of every TPM-made `TPMS_ATTEST`.
pub const TPM_GENERATED: u32 = 0xff54_4347;
/// `TPM_ST_ATTEST_QUOTE`.
pub const ST_ATTEST_QUOTE: u16 = 0x8018;

/// Largest digest (SHA-512) a TPM2B_DIGEST holds.
const MAX_DIGEST: usize = 64;
/// `sizeof(TPMU_NAME)`: a TPMT_HA with the largest digest.
const MAX_NAME: usize = 2 + MAX_DIGEST;
/// `sizeof(TPMT_HA)`, the bound of TPM2B_DATA.
const MAX_DATA: usize = 2 + MAX_DIGEST;
/// `MAX_RSA_KEY_BYTES` for 8192-bit keys.
const MAX_RSA_BYTES: usize = 1024;
/// `MAX_ECC_KEY_BYTES` for the largest standard curve (P-521).
const MAX_ECC_BYTES: usize = 66;
/// Bound on TPML_PCR_SELECTION.count (`HASH_COUNT` is the number of banks a TPM has).
const MAX_PCR_BANKS: usize = 16;
/// `PCR_SELECT_MAX` of a PC-client TPM with 24 PCRs; also its `PCR_SELECT_MIN`, so the
/// bitmap is exactly 3 bytes.
pub const PCR_SELECT_SIZE: usize = 3;

/// `TPMS_CLOCK_INFO`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClockInfo {
    /// Milliseconds the TPM has been powered since it was last cleared.
    pub clock: u64,
    /// TPM resets since the last clear.
    pub reset_count: u32,
    /// TPM restarts since the last reset.
    pub restart_count: u32,
    /// Whether `clock` is known not to have rolled back.
    pub safe: bool,
}

/// `TPMS_PCR_SELECTION`: one bank and a 3-byte bitmap of PCRs 0..=23.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PcrSelection {
    /// The bank's hash algorithm (`TPM_ALG_ID`).
    pub hash: u16,
    /// Bit `i % 8` of byte `i / 8` selects PCR `i`.
    pub bitmap: [u8; PCR_SELECT_SIZE],
}

impl PcrSelection {
    /// A selection of `indices` in bank `hash`.
    pub fn new(hash: u16, indices: impl IntoIterator<Item = PcrIndex>) -> Self {
        let mut bitmap = [0u8; PCR_SELECT_SIZE];
        for i in indices {
            let i = usize::from(i.get());
            if let Some(byte) = bitmap.get_mut(i / 8) {
                *byte |= 1 << (i % 8);
            }
        }
        Self { hash, bitmap }
    }

    /// The selected PCR indices, ascending.
    pub fn indices(&self) -> BTreeSet<PcrIndex> {
        self.iter().collect()
    }

    /// The selected PCR indices, ascending, without collecting them.
    pub fn iter(&self) -> impl Iterator<Item = PcrIndex> + '_ {
        PcrIndex::all().filter(|i| {
            let i = usize::from(i.get());
            self.bitmap
                .get(i / 8)
                .is_some_and(|byte| byte & (1 << (i % 8)) != 0)
        })
    }
}

/// `TPMS_QUOTE_INFO`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuoteInfo {
    /// `TPML_PCR_SELECTION`: the banks and PCRs the quote covers.
    pub pcr_select: Vec<PcrSelection>,
    /// Digest of the selected PCR values, with the signing scheme's hash.
    pub pcr_digest: Vec<u8>,
}

/// `TPMS_ATTEST` of type `TPM_ST_ATTEST_QUOTE`: what a TPM signs in TPM2_Quote. The magic
/// and type are checked by the parser and written by the marshaller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TpmsAttest {
    /// `TPM2B_NAME` of the signing key.
    pub qualified_signer: Vec<u8>,
    /// `TPM2B_DATA`: the caller's qualifying data (here: the report data).
    pub extra_data: Vec<u8>,
    /// `TPMS_CLOCK_INFO`.
    pub clock_info: ClockInfo,
    /// Vendor-specific firmware version.
    pub firmware_version: u64,
    /// `TPMS_QUOTE_INFO`.
    pub quote: QuoteInfo,
}

impl TpmsAttest {
    const NAME: &'static str = "TPMS_ATTEST";

    /// Parses exactly one `TPMS_ATTEST` of type quote.
    pub fn parse(bytes: &[u8]) -> Result<Self, ParseError> {
        let mut r = Reader::new(bytes, Self::NAME);
        let magic = r.u32("magic")?;
        if magic != TPM_GENERATED {
            return Err(ParseError::Unsupported {
                structure: Self::NAME,
                field: "magic (want TPM_GENERATED 0xff544347)",
                value: magic,
            });
        }
        let ty = r.u16("type")?;
        if ty != ST_ATTEST_QUOTE {
            return Err(ParseError::Unsupported {
                structure: Self::NAME,
                field: "type (want TPM_ST_ATTEST_QUOTE 0x8018)",
                value: u32::from(ty),
            });
        }
        let qualified_signer = r.tpm2b("qualifiedSigner", MAX_NAME)?.to_vec();
        let extra_data = r.tpm2b("extraData", MAX_DATA)?.to_vec();
        let clock = r.u64("clockInfo.clock")?;
        let reset_count = r.u32("clockInfo.resetCount")?;
        let restart_count = r.u32("clockInfo.restartCount")?;
        let safe = match r.u8("clockInfo.safe")? {
            0 => false,
            1 => true,
            _ => {
                return Err(ParseError::Invalid {
                    structure: Self::NAME,
                    field: "clockInfo.safe",
                    reason: "TPMI_YES_NO must be 0 or 1",
                });
            }
        };
        let firmware_version = r.u64("firmwareVersion")?;
        let count = r.u32("pcrSelect.count")?;
        let count = usize::try_from(count).unwrap_or(usize::MAX);
        if count > MAX_PCR_BANKS {
            return Err(ParseError::TooLong {
                structure: Self::NAME,
                field: "pcrSelect.count",
                size: count,
                max: MAX_PCR_BANKS,
            });
        }
        let mut pcr_select = Vec::with_capacity(count);
        for _ in 0..count {
            let hash = r.u16("pcrSelect.hash")?;
            let size = usize::from(r.u8("pcrSelect.sizeofSelect")?);
            if size != PCR_SELECT_SIZE {
                return Err(ParseError::Invalid {
                    structure: Self::NAME,
                    field: "pcrSelect.sizeofSelect",
                    reason: "must be 3 (24 PCRs)",
                });
            }
            let bitmap = r
                .take(PCR_SELECT_SIZE, "pcrSelect.pcrSelect")?
                .try_into()
                .map_err(|_| ParseError::Truncated {
                    structure: Self::NAME,
                    field: "pcrSelect.pcrSelect",
                })?;
            pcr_select.push(PcrSelection { hash, bitmap });
        }
        let pcr_digest = r.tpm2b("pcrDigest", MAX_DIGEST)?.to_vec();
        r.finish()?;
        Ok(Self {
            qualified_signer,
            extra_data,
            clock_info: ClockInfo {
                clock,
                reset_count,
                restart_count,
                safe,
            },
            firmware_version,
            quote: QuoteInfo {
                pcr_select,
                pcr_digest,
            },
        })
    }

    /// Marshals the structure; refuses fields the parser would refuse.
    pub fn to_bytes(&self) -> Result<Vec<u8>, ParseError> {
        let mut w = Writer::new(Self::NAME);
        w.u32(TPM_GENERATED);
        w.u16(ST_ATTEST_QUOTE);
        w.tpm2b("qualifiedSigner", MAX_NAME, &self.qualified_signer)?;
        w.tpm2b("extraData", MAX_DATA, &self.extra_data)?;
        w.u64(self.clock_info.clock);
        w.u32(self.clock_info.reset_count);
        w.u32(self.clock_info.restart_count);
        w.u8(u8::from(self.clock_info.safe));
        w.u64(self.firmware_version);
        let count = self.quote.pcr_select.len();
        if count > MAX_PCR_BANKS {
            return Err(ParseError::TooLong {
                structure: Self::NAME,
                field: "pcrSelect.count",
                size: count,
                max: MAX_PCR_BANKS,
            });
        }
        w.u32(u32::try_from(count).unwrap_or(u32::MAX));
        for sel in &self.quote.pcr_select {
            w.u16(sel.hash);
            w.u8(u8::try_from(PCR_SELECT_SIZE).unwrap_or(u8::MAX));
            w.bytes(&sel.bitmap);
        }
        w.tpm2b("pcrDigest", MAX_DIGEST, &self.quote.pcr_digest)?;
        Ok(w.finish())
    }
}

/// `TPMT_SIGNATURE` for the schemes an attestation key may use here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TpmtSignature {
    /// `TPM_ALG_ECDSA`: `TPMS_SIGNATURE_ECDSA`.
    Ecdsa {
        /// Hash algorithm of the signed digest.
        hash: u16,
        /// `signatureR` (TPM2B_ECC_PARAMETER, big-endian, possibly shorter than the curve).
        r: Vec<u8>,
        /// `signatureS`.
        s: Vec<u8>,
    },
    /// `TPM_ALG_RSASSA`: `TPMS_SIGNATURE_RSASSA` (PKCS#1 v1.5).
    RsaSsa {
        /// Hash algorithm of the signed digest.
        hash: u16,
        /// The signature (TPM2B_PUBLIC_KEY_RSA).
        sig: Vec<u8>,
    },
}

impl TpmtSignature {
    const NAME: &'static str = "TPMT_SIGNATURE";

    /// Parses exactly one `TPMT_SIGNATURE` (ECDSA or RSASSA).
    pub fn parse(bytes: &[u8]) -> Result<Self, ParseError> {
        let mut r = Reader::new(bytes, Self::NAME);
        let sig_alg = r.u16("sigAlg")?;
        let sig = match sig_alg {
            alg::ECDSA => {
                let hash = r.u16("hash")?;
                let rr = r.tpm2b("signatureR", MAX_ECC_BYTES)?.to_vec();
                let s = r.tpm2b("signatureS", MAX_ECC_BYTES)?.to_vec();
                Self::Ecdsa { hash, r: rr, s }
            }
            alg::RSASSA => {
                let hash = r.u16("hash")?;
                let sig = r.tpm2b("sig", MAX_RSA_BYTES)?.to_vec();
                Self::RsaSsa { hash, sig }
            }
            other => {
                return Err(ParseError::Unsupported {
                    structure: Self::NAME,
                    field: "sigAlg (want ECDSA 0x0018 or RSASSA 0x0014)",
                    value: u32::from(other),
                });
            }
        };
        r.finish()?;
        Ok(sig)
    }

    /// Marshals the structure; refuses fields the parser would refuse.
    pub fn to_bytes(&self) -> Result<Vec<u8>, ParseError> {
        let mut w = Writer::new(Self::NAME);
        match self {
            Self::Ecdsa { hash, r, s } => {
                w.u16(alg::ECDSA);
                w.u16(*hash);
                w.tpm2b("signatureR", MAX_ECC_BYTES, r)?;
                w.tpm2b("signatureS", MAX_ECC_BYTES, s)?;
            }
            Self::RsaSsa { hash, sig } => {
                w.u16(alg::RSASSA);
                w.u16(*hash);
                w.tpm2b("sig", MAX_RSA_BYTES, sig)?;
            }
        }
        Ok(w.finish())
    }

    /// The signature scheme (`TPM_ALG_ECDSA` or `TPM_ALG_RSASSA`).
    pub fn scheme(&self) -> u16 {
        match self {
            Self::Ecdsa { .. } => alg::ECDSA,
            Self::RsaSsa { .. } => alg::RSASSA,
        }
    }

    /// The hash algorithm the signature claims.
    pub fn hash(&self) -> u16 {
        match self {
            Self::Ecdsa { hash, .. } | Self::RsaSsa { hash, .. } => *hash,
        }
    }
}

/// `TPMA_OBJECT` bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ObjectAttributes(pub u32);

impl ObjectAttributes {
    /// `fixedTPM`: the key cannot be duplicated out of this TPM.
    pub const FIXED_TPM: u32 = 1 << 1;
    /// `stClear`.
    pub const ST_CLEAR: u32 = 1 << 2;
    /// `fixedParent`: the key cannot be moved to another parent.
    pub const FIXED_PARENT: u32 = 1 << 4;
    /// `sensitiveDataOrigin`: the TPM generated the private part.
    pub const SENSITIVE_DATA_ORIGIN: u32 = 1 << 5;
    /// `userWithAuth`.
    pub const USER_WITH_AUTH: u32 = 1 << 6;
    /// `adminWithPolicy`.
    pub const ADMIN_WITH_POLICY: u32 = 1 << 7;
    /// `noDA`.
    pub const NO_DA: u32 = 1 << 10;
    /// `restricted`: the key signs only TPM-generated structures (or digests the TPM
    /// checked do not start with `TPM_GENERATED`).
    pub const RESTRICTED: u32 = 1 << 16;
    /// `decrypt`.
    pub const DECRYPT: u32 = 1 << 17;
    /// `sign` (`encrypt` for symmetric keys).
    pub const SIGN: u32 = 1 << 18;

    /// Whether every bit of `mask` is set.
    pub fn has(self, mask: u32) -> bool {
        self.0 & mask == mask
    }
}

/// `TPMT_SYM_DEF_OBJECT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SymDefObject {
    /// `TPM_ALG_NULL`: no symmetric algorithm (any signing key).
    Null,
    /// A block cipher (AES, SM4, Camellia) with key size and mode.
    Cipher {
        /// The algorithm.
        algorithm: u16,
        /// Key size in bits.
        key_bits: u16,
        /// Block mode.
        mode: u16,
    },
}

/// `TPMT_RSA_SCHEME` / `TPMT_ECC_SCHEME` (`TPMU_ASYM_SCHEME`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsymScheme {
    /// `TPM_ALG_NULL`: the caller picks the scheme per operation.
    Null,
    /// `TPM_ALG_RSAES`: no details.
    RsaEs,
    /// A scheme whose details are one hash algorithm (RSASSA, RSAPSS, OAEP, ECDSA, ECDH,
    /// ECMQV, SM2, ECSCHNORR).
    Hashed {
        /// The scheme.
        scheme: u16,
        /// Its hash algorithm.
        hash: u16,
    },
    /// `TPM_ALG_ECDAA`: a hash algorithm and a count.
    Ecdaa {
        /// Hash algorithm.
        hash: u16,
        /// Commit count.
        count: u16,
    },
}

/// `TPMT_KDF_SCHEME`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KdfScheme {
    /// `TPM_ALG_NULL`.
    Null,
    /// MGF1 or one of the SP 800-56A/108 KDFs, with its hash.
    Hashed {
        /// The KDF.
        scheme: u16,
        /// Its hash algorithm.
        hash: u16,
    },
}

/// The type-specific part of `TPMT_PUBLIC`: parameters and unique (public key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublicParams {
    /// `TPM_ALG_RSA`: `TPMS_RSA_PARMS` and the modulus.
    Rsa {
        /// `symmetric`.
        symmetric: SymDefObject,
        /// `scheme`.
        scheme: AsymScheme,
        /// `keyBits`.
        key_bits: u16,
        /// `exponent`; 0 means the default 65537.
        exponent: u32,
        /// `unique.rsa`: the modulus, big-endian.
        modulus: Vec<u8>,
    },
    /// `TPM_ALG_ECC`: `TPMS_ECC_PARMS` and the public point.
    Ecc {
        /// `symmetric`.
        symmetric: SymDefObject,
        /// `scheme`.
        scheme: AsymScheme,
        /// `curveID`.
        curve: u16,
        /// `kdf`.
        kdf: KdfScheme,
        /// `unique.ecc.x`, big-endian.
        x: Vec<u8>,
        /// `unique.ecc.y`, big-endian.
        y: Vec<u8>,
    },
}

impl PublicParams {
    /// An ECDSA-SHA256 signing key on NIST P-256 with the public point `(x, y)`
    /// (big-endian coordinates), no symmetric algorithm and no KDF: the ECC AK's parameters.
    pub fn ecdsa_p256(x: Vec<u8>, y: Vec<u8>) -> Self {
        Self::Ecc {
            symmetric: SymDefObject::Null,
            scheme: AsymScheme::Hashed {
                scheme: alg::ECDSA,
                hash: alg::SHA256,
            },
            curve: ECC_NIST_P256,
            kdf: KdfScheme::Null,
            x,
            y,
        }
    }

    /// An RSASSA-SHA256 signing key with `modulus` (big-endian; `keyBits` is its length,
    /// saturating) and `exponent` (0: the default 65537), no symmetric algorithm: the RSA
    /// AK's parameters.
    pub fn rsassa_sha256(modulus: Vec<u8>, exponent: u32) -> Self {
        Self::Rsa {
            symmetric: SymDefObject::Null,
            scheme: AsymScheme::Hashed {
                scheme: alg::RSASSA,
                hash: alg::SHA256,
            },
            key_bits: u16::try_from(modulus.len() * 8).unwrap_or(u16::MAX),
            exponent,
            modulus,
        }
    }
}

/// `TPMT_PUBLIC` of an asymmetric (RSA or ECC) key, without the TPM2B_PUBLIC size prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TpmtPublic {
    /// `nameAlg`: the hash that names the key.
    pub name_alg: u16,
    /// `objectAttributes`.
    pub attributes: ObjectAttributes,
    /// `authPolicy` (TPM2B_DIGEST).
    pub auth_policy: Vec<u8>,
    /// Type, parameters and public key.
    pub params: PublicParams,
}

impl TpmtPublic {
    const NAME: &'static str = "TPMT_PUBLIC";

    /// Parses exactly one `TPMT_PUBLIC` of type RSA or ECC.
    pub fn parse(bytes: &[u8]) -> Result<Self, ParseError> {
        let mut r = Reader::new(bytes, Self::NAME);
        let ty = r.u16("type")?;
        let name_alg = r.u16("nameAlg")?;
        let attributes = ObjectAttributes(r.u32("objectAttributes")?);
        let auth_policy = r.tpm2b("authPolicy", MAX_DIGEST)?.to_vec();
        let params = match ty {
            alg::RSA => {
                let symmetric = parse_sym(&mut r)?;
                let scheme = parse_scheme(&mut r)?;
                let key_bits = r.u16("parameters.keyBits")?;
                let exponent = r.u32("parameters.exponent")?;
                let modulus = r.tpm2b("unique.rsa", MAX_RSA_BYTES)?.to_vec();
                PublicParams::Rsa {
                    symmetric,
                    scheme,
                    key_bits,
                    exponent,
                    modulus,
                }
            }
            alg::ECC => {
                let symmetric = parse_sym(&mut r)?;
                let scheme = parse_scheme(&mut r)?;
                let curve = r.u16("parameters.curveID")?;
                let kdf = parse_kdf(&mut r)?;
                let x = r.tpm2b("unique.ecc.x", MAX_ECC_BYTES)?.to_vec();
                let y = r.tpm2b("unique.ecc.y", MAX_ECC_BYTES)?.to_vec();
                PublicParams::Ecc {
                    symmetric,
                    scheme,
                    curve,
                    kdf,
                    x,
                    y,
                }
            }
            other => {
                return Err(ParseError::Unsupported {
                    structure: Self::NAME,
                    field: "type (want RSA 0x0001 or ECC 0x0023)",
                    value: u32::from(other),
                });
            }
        };
        r.finish()?;
        Ok(Self {
            name_alg,
            attributes,
            auth_policy,
            params,
        })
    }

    /// Marshals the structure; refuses fields the parser would refuse.
    pub fn to_bytes(&self) -> Result<Vec<u8>, ParseError> {
        let mut w = Writer::new(Self::NAME);
        let ty = match self.params {
            PublicParams::Rsa { .. } => alg::RSA,
            PublicParams::Ecc { .. } => alg::ECC,
        };
        w.u16(ty);
        w.u16(self.name_alg);
        w.u32(self.attributes.0);
        w.tpm2b("authPolicy", MAX_DIGEST, &self.auth_policy)?;
        match &self.params {
            PublicParams::Rsa {
                symmetric,
                scheme,
                key_bits,
                exponent,
                modulus,
            } => {
                write_sym(&mut w, symmetric)?;
                write_scheme(&mut w, scheme)?;
                w.u16(*key_bits);
                w.u32(*exponent);
                w.tpm2b("unique.rsa", MAX_RSA_BYTES, modulus)?;
            }
            PublicParams::Ecc {
                symmetric,
                scheme,
                curve,
                kdf,
                x,
                y,
            } => {
                write_sym(&mut w, symmetric)?;
                write_scheme(&mut w, scheme)?;
                w.u16(*curve);
                write_kdf(&mut w, kdf)?;
                w.tpm2b("unique.ecc.x", MAX_ECC_BYTES, x)?;
                w.tpm2b("unique.ecc.y", MAX_ECC_BYTES, y)?;
            }
        }
        Ok(w.finish())
    }
}

fn parse_sym(r: &mut Reader<'_>) -> Result<SymDefObject, ParseError> {
    match r.u16("parameters.symmetric.algorithm")? {
        alg::NULL => Ok(SymDefObject::Null),
        algorithm @ (alg::AES | alg::SM4 | alg::CAMELLIA) => Ok(SymDefObject::Cipher {
            algorithm,
            key_bits: r.u16("parameters.symmetric.keyBits")?,
            mode: r.u16("parameters.symmetric.mode")?,
        }),
        other => Err(ParseError::Unsupported {
            structure: r.structure(),
            field: "parameters.symmetric.algorithm",
            value: u32::from(other),
        }),
    }
}

fn write_sym(w: &mut Writer, sym: &SymDefObject) -> Result<(), ParseError> {
    match *sym {
        SymDefObject::Null => w.u16(alg::NULL),
        SymDefObject::Cipher {
            algorithm,
            key_bits,
            mode,
        } => {
            if !matches!(algorithm, alg::AES | alg::SM4 | alg::CAMELLIA) {
                return Err(ParseError::Unsupported {
                    structure: "TPMT_PUBLIC",
                    field: "parameters.symmetric.algorithm",
                    value: u32::from(algorithm),
                });
            }
            w.u16(algorithm);
            w.u16(key_bits);
            w.u16(mode);
        }
    }
    Ok(())
}

/// The asymmetric schemes that carry a hash algorithm (`TPMS_SCHEME_HASH`), and nothing more.
const HASHED_ASYM_SCHEMES: [u16; 8] = [
    alg::RSASSA,
    alg::RSAPSS,
    alg::OAEP,
    alg::ECDSA,
    alg::ECDH,
    alg::ECMQV,
    alg::SM2,
    alg::ECSCHNORR,
];

/// The key derivation schemes that carry a hash algorithm, and nothing more.
const HASHED_KDF_SCHEMES: [u16; 4] = [
    alg::MGF1,
    alg::KDF1_SP800_56A,
    alg::KDF2,
    alg::KDF1_SP800_108,
];

fn parse_scheme(r: &mut Reader<'_>) -> Result<AsymScheme, ParseError> {
    match r.u16("parameters.scheme.scheme")? {
        alg::NULL => Ok(AsymScheme::Null),
        alg::RSAES => Ok(AsymScheme::RsaEs),
        alg::ECDAA => Ok(AsymScheme::Ecdaa {
            hash: r.u16("parameters.scheme.hashAlg")?,
            count: r.u16("parameters.scheme.count")?,
        }),
        scheme if HASHED_ASYM_SCHEMES.contains(&scheme) => Ok(AsymScheme::Hashed {
            scheme,
            hash: r.u16("parameters.scheme.hashAlg")?,
        }),
        other => Err(ParseError::Unsupported {
            structure: r.structure(),
            field: "parameters.scheme.scheme",
            value: u32::from(other),
        }),
    }
}

fn write_scheme(w: &mut Writer, scheme: &AsymScheme) -> Result<(), ParseError> {
    match *scheme {
        AsymScheme::Null => w.u16(alg::NULL),
        AsymScheme::RsaEs => w.u16(alg::RSAES),
        AsymScheme::Ecdaa { hash, count } => {
            w.u16(alg::ECDAA);
            w.u16(hash);
            w.u16(count);
        }
        AsymScheme::Hashed { scheme, hash } => {
            if !HASHED_ASYM_SCHEMES.contains(&scheme) {
                return Err(ParseError::Unsupported {
                    structure: "TPMT_PUBLIC",
                    field: "parameters.scheme.scheme",
                    value: u32::from(scheme),
                });
            }
            w.u16(scheme);
            w.u16(hash);
        }
    }
    Ok(())
}

fn parse_kdf(r: &mut Reader<'_>) -> Result<KdfScheme, ParseError> {
    match r.u16("parameters.kdf.scheme")? {
        alg::NULL => Ok(KdfScheme::Null),
        scheme if HASHED_KDF_SCHEMES.contains(&scheme) => Ok(KdfScheme::Hashed {
            scheme,
            hash: r.u16("parameters.kdf.hashAlg")?,
        }),
        other => Err(ParseError::Unsupported {
            structure: r.structure(),
            field: "parameters.kdf.scheme",
            value: u32::from(other),
        }),
    }
}

fn write_kdf(w: &mut Writer, kdf: &KdfScheme) -> Result<(), ParseError> {
    match *kdf {
        KdfScheme::Null => w.u16(alg::NULL),
        KdfScheme::Hashed { scheme, hash } => {
            if !HASHED_KDF_SCHEMES.contains(&scheme) {
                return Err(ParseError::Unsupported {
                    structure: "TPMT_PUBLIC",
                    field: "parameters.kdf.scheme",
                    value: u32::from(scheme),
                });
            }
            w.u16(scheme);
            w.u16(hash);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attest() -> TpmsAttest {
        TpmsAttest {
            qualified_signer: vec![0, 0x0b, 1, 2, 3],
            extra_data: vec![7; 32],
            clock_info: ClockInfo {
                clock: 1,
                reset_count: 2,
                restart_count: 3,
                safe: true,
            },
            firmware_version: 4,
            quote: QuoteInfo {
                pcr_select: vec![PcrSelection::new(
                    alg::SHA256,
                    [0u8, 7, 8, 23].map(|i| PcrIndex::new(i).unwrap()),
                )],
                pcr_digest: vec![9; 32],
            },
        }
    }

    #[test]
    fn attest_round_trips_and_keeps_the_selection() {
        let a = attest();
        let bytes = a.to_bytes().unwrap();
        assert_eq!(&bytes[..6], &[0xff, 0x54, 0x43, 0x47, 0x80, 0x18]);
        let back = TpmsAttest::parse(&bytes).unwrap();
        assert_eq!(back, a);
        let idx: Vec<u8> = back.quote.pcr_select[0]
            .indices()
            .iter()
            .map(|i| i.get())
            .collect();
        assert_eq!(idx, vec![0, 7, 8, 23]);
        assert_eq!(back.quote.pcr_select[0].bitmap, [0x81, 0x01, 0x80]);
    }

    #[test]
    fn attest_rejects_wrong_magic_type_and_select_size() {
        let bytes = attest().to_bytes().unwrap();
        let mut b = bytes.clone();
        b[0] = 0;
        assert!(matches!(
            TpmsAttest::parse(&b),
            Err(ParseError::Unsupported { field, .. }) if field.starts_with("magic")
        ));
        let mut b = bytes.clone();
        b[5] = 0x17; // TPM_ST_ATTEST_CERTIFY
        assert!(matches!(
            TpmsAttest::parse(&b),
            Err(ParseError::Unsupported { field, .. }) if field.starts_with("type")
        ));
        let mut b = bytes.clone();
        // safe flag: 4 + 2 + (2 + 5) + (2 + 32) + 8 + 4 + 4 = 63
        b[63] = 2;
        assert!(matches!(
            TpmsAttest::parse(&b),
            Err(ParseError::Invalid {
                field: "clockInfo.safe",
                ..
            })
        ));
    }

    #[test]
    fn public_round_trips_for_rsa_and_ecc() {
        let ecc = TpmtPublic {
            name_alg: alg::SHA256,
            attributes: ObjectAttributes(0x0005_0072),
            auth_policy: vec![],
            params: PublicParams::ecdsa_p256(vec![1; 32], vec![2; 32]),
        };
        let b = ecc.to_bytes().unwrap();
        assert_eq!(TpmtPublic::parse(&b).unwrap(), ecc);
        let rsa = TpmtPublic {
            name_alg: alg::SHA256,
            attributes: ObjectAttributes(0x0005_0072),
            auth_policy: vec![3; 32],
            params: PublicParams::Rsa {
                symmetric: SymDefObject::Cipher {
                    algorithm: alg::AES,
                    key_bits: 128,
                    mode: 0x43,
                },
                scheme: AsymScheme::Ecdaa { hash: 1, count: 2 },
                key_bits: 2048,
                exponent: 0,
                modulus: vec![0xff; 256],
            },
        };
        let b = rsa.to_bytes().unwrap();
        assert_eq!(TpmtPublic::parse(&b).unwrap(), rsa);
    }

    #[test]
    fn signature_round_trips() {
        for s in [
            TpmtSignature::Ecdsa {
                hash: alg::SHA256,
                r: vec![1; 31],
                s: vec![2; 32],
            },
            TpmtSignature::RsaSsa {
                hash: alg::SHA256,
                sig: vec![3; 256],
            },
        ] {
            let b = s.to_bytes().unwrap();
            assert_eq!(TpmtSignature::parse(&b).unwrap(), s);
        }
    }
}

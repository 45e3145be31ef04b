//! Helpers shared by the TPM integration tests: an independent, minimal reading of the TPM
//! wire structures, so the tests check the bytes rather than trust the code under test.
//!
//! This parser stays here on purpose, not in `asterism-testkit` and not shared with the
//! verifier (`asterism-attestation`): it is an oracle. Written apart from the code under
//! test, a misreading of the TPM specification in either shows up as a disagreement instead
//! of passing both.

#![allow(dead_code)]

use asterism_testkit::Swtpm;
use asterism_tpm::Tpm;

/// Starts a private swtpm and opens it.
pub fn swtpm_and_tpm(ek_cert: bool) -> (Swtpm, Tpm) {
    let swtpm = Swtpm::builder()
        .with_ek_cert(ek_cert)
        .start()
        .unwrap_or_else(|e| panic!("cannot start swtpm: {e}"));
    let tpm = Tpm::open(&swtpm.config()).unwrap_or_else(|e| panic!("cannot open swtpm: {e}"));
    (swtpm, tpm)
}

/// A cursor over big-endian TPM wire data.
pub struct Reader<'a> {
    pub bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes }
    }
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        assert!(
            self.bytes.len() >= n,
            "truncated: need {n}, have {}",
            self.bytes.len()
        );
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        head
    }
    pub fn u8(&mut self) -> u8 {
        self.take(1)[0]
    }
    pub fn u16(&mut self) -> u16 {
        u16::from_be_bytes(self.take(2).try_into().unwrap())
    }
    pub fn u32(&mut self) -> u32 {
        u32::from_be_bytes(self.take(4).try_into().unwrap())
    }
    pub fn u64(&mut self) -> u64 {
        u64::from_be_bytes(self.take(8).try_into().unwrap())
    }
    pub fn tpm2b(&mut self) -> &'a [u8] {
        let n = self.u16() as usize;
        self.take(n)
    }
    pub fn done(&self) -> bool {
        self.bytes.is_empty()
    }
}

/// TPM_ALG_ID values used here.
pub const ALG_RSA: u16 = 0x0001;
pub const ALG_SHA256: u16 = 0x000b;
pub const ALG_NULL: u16 = 0x0010;
pub const ALG_RSASSA: u16 = 0x0014;
pub const ALG_ECDSA: u16 = 0x0018;
pub const ALG_ECC: u16 = 0x0023;
pub const ECC_NIST_P256: u16 = 0x0003;

/// The AK's public key, read from a TPMT_PUBLIC.
#[derive(Debug)]
pub enum AkPublic {
    Ecc { x: Vec<u8>, y: Vec<u8> },
    Rsa { modulus: Vec<u8>, exponent: u32 },
}

/// The fields of a TPMT_PUBLIC the tests look at.
#[derive(Debug)]
pub struct Public {
    pub alg: u16,
    pub name_alg: u16,
    pub attributes: u32,
    pub auth_policy: Vec<u8>,
    pub symmetric: u16,
    pub scheme: u16,
    pub scheme_hash: u16,
    pub curve_or_bits: u16,
    pub key: AkPublic,
}

pub fn parse_public(bytes: &[u8]) -> Public {
    let mut r = Reader::new(bytes);
    let alg = r.u16();
    let name_alg = r.u16();
    let attributes = r.u32();
    let auth_policy = r.tpm2b().to_vec();
    let symmetric = r.u16();
    assert_eq!(
        symmetric, ALG_NULL,
        "a signing key has no symmetric algorithm"
    );
    let scheme = r.u16();
    let scheme_hash = r.u16();
    let public = match alg {
        ALG_ECC => {
            let curve = r.u16();
            let kdf = r.u16();
            assert_eq!(kdf, ALG_NULL);
            let x = r.tpm2b().to_vec();
            let y = r.tpm2b().to_vec();
            Public {
                alg,
                name_alg,
                attributes,
                auth_policy,
                symmetric,
                scheme,
                scheme_hash,
                curve_or_bits: curve,
                key: AkPublic::Ecc { x, y },
            }
        }
        ALG_RSA => {
            let bits = r.u16();
            let exponent = r.u32();
            let modulus = r.tpm2b().to_vec();
            Public {
                alg,
                name_alg,
                attributes,
                auth_policy,
                symmetric,
                scheme,
                scheme_hash,
                curve_or_bits: bits,
                key: AkPublic::Rsa {
                    modulus,
                    exponent: if exponent == 0 { 65537 } else { exponent },
                },
            }
        }
        other => panic!("unexpected key type {other:#06x}"),
    };
    assert!(r.done(), "trailing bytes after TPMT_PUBLIC");
    public
}

/// The fields of a TPMS_ATTEST of type quote.
#[derive(Debug)]
pub struct Attest {
    pub magic: u32,
    pub kind: u16,
    pub extra_data: Vec<u8>,
    pub reset_count: u32,
    pub restart_count: u32,
    /// (hash, selected PCR indices)
    pub selections: Vec<(u16, Vec<u32>)>,
    pub pcr_digest: Vec<u8>,
}

pub fn parse_attest(bytes: &[u8]) -> Attest {
    let mut r = Reader::new(bytes);
    let magic = r.u32();
    let kind = r.u16();
    let _signer = r.tpm2b();
    let extra_data = r.tpm2b().to_vec();
    let _clock = r.u64();
    let reset_count = r.u32();
    let restart_count = r.u32();
    let _safe = r.u8();
    let _firmware = r.u64();
    let count = r.u32();
    let mut selections = Vec::new();
    for _ in 0..count {
        let hash = r.u16();
        let size = r.u8() as usize;
        let bitmap = r.take(size);
        let mut indices = Vec::new();
        for (byte_index, byte) in bitmap.iter().enumerate() {
            for bit in 0..8 {
                if byte & (1 << bit) != 0 {
                    indices.push((byte_index * 8 + bit) as u32);
                }
            }
        }
        selections.push((hash, indices));
    }
    let pcr_digest = r.tpm2b().to_vec();
    assert!(r.done(), "trailing bytes after TPMS_ATTEST");
    Attest {
        magic,
        kind,
        extra_data,
        reset_count,
        restart_count,
        selections,
        pcr_digest,
    }
}

/// A TPMT_SIGNATURE.
#[derive(Debug)]
pub enum Signature {
    Ecdsa { hash: u16, r: Vec<u8>, s: Vec<u8> },
    RsaSsa { hash: u16, sig: Vec<u8> },
}

pub fn parse_signature(bytes: &[u8]) -> Signature {
    let mut rd = Reader::new(bytes);
    let alg = rd.u16();
    let hash = rd.u16();
    let sig = match alg {
        ALG_ECDSA => {
            let r = rd.tpm2b().to_vec();
            let s = rd.tpm2b().to_vec();
            Signature::Ecdsa { hash, r, s }
        }
        ALG_RSASSA => Signature::RsaSsa {
            hash,
            sig: rd.tpm2b().to_vec(),
        },
        other => panic!("unexpected signature algorithm {other:#06x}"),
    };
    assert!(rd.done(), "trailing bytes after TPMT_SIGNATURE");
    sig
}

/// Left-pads a big-endian integer to `n` bytes.
pub fn pad(value: &[u8], n: usize) -> Vec<u8> {
    assert!(value.len() <= n);
    let mut out = vec![0u8; n - value.len()];
    out.extend_from_slice(value);
    out
}

/// Verifies a quote signature over `attest` with the AK public area, in software (ring).
pub fn verify_quote_signature(ak_public: &[u8], attest: &[u8], signature: &[u8]) {
    use ring::signature as sig;
    let public = parse_public(ak_public);
    match (public.key, parse_signature(signature)) {
        (AkPublic::Ecc { x, y }, Signature::Ecdsa { hash, r, s }) => {
            assert_eq!(hash, ALG_SHA256);
            let mut point = vec![0x04];
            point.extend(pad(&x, 32));
            point.extend(pad(&y, 32));
            let mut rs = pad(&r, 32);
            rs.extend(pad(&s, 32));
            sig::UnparsedPublicKey::new(&sig::ECDSA_P256_SHA256_FIXED, &point)
                .verify(attest, &rs)
                .expect("ECDSA quote signature must verify");
        }
        (AkPublic::Rsa { modulus, exponent }, Signature::RsaSsa { hash, sig: s }) => {
            assert_eq!(hash, ALG_SHA256);
            // Big-endian without leading zero bytes, as ring wants it.
            let e = exponent.to_be_bytes();
            let e = &e[e.iter().position(|b| *b != 0).unwrap()..];
            sig::RsaPublicKeyComponents { n: &modulus[..], e }
                .verify(&sig::RSA_PKCS1_2048_8192_SHA256, attest, &s)
                .expect("RSASSA quote signature must verify");
        }
        (key, signature) => panic!("signature {signature:?} does not fit key {key:?}"),
    }
}

pub fn sha256(data: &[u8]) -> [u8; 32] {
    ring::digest::digest(&ring::digest::SHA256, data)
        .as_ref()
        .try_into()
        .unwrap()
}

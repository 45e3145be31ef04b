//! **For tests and benchmarks only**: a software "TPM" that makes `tpm-quote` evidence in
//! the real wire format (`TPMS_ATTEST`, `TPMT_SIGNATURE`, `TPMT_PUBLIC`), signed by a
//! software ECDSA P-256 or RSA key instead of a TPM-resident AK.
//!
//! The evidence verifies like a real quote, so tests can build valid evidence and then
//! tamper with any part of it, and load generators can produce realistic evidence. Nothing
//! ties the key to a TPM: a verifier accepts such an AK only where a test pins it.
//!
//! It is a crate of its own, outside `asterism-attestation`'s insecure test feature, so that
//! benchmarks can measure the verifier as programs build it (optimised, without that
//! feature) against evidence made here. No program may depend on it: `scripts/check-deps`
//! refuses a normal dependency on it.
#![forbid(unsafe_code)]

use asterism_attestation::tpm::structures::{
    ClockInfo, PcrSelection, PublicParams, QuoteInfo, TpmsAttest, TpmtPublic, TpmtSignature, alg,
};
use asterism_attestation::tpm::{AkFingerprint, ParseError, TpmQuoteEvidence, VARIANT};
use asterism_attestation::{IssueError, Issuer, PcrIndex, ReportData};
use prost::Message;
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, KeyPair, RsaKeyPair};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};

/// Why the software TPM failed.
#[derive(Debug, thiserror::Error)]
pub enum SoftError {
    /// The key could not be created or loaded.
    #[error("software AK key: {0}")]
    Key(String),
    /// Signing failed.
    #[error("software AK signing failed")]
    Sign,
    /// A structure could not be marshalled.
    #[error("marshalling")]
    Marshal(#[source] ParseError),
}

enum SoftKey {
    Ecdsa(EcdsaKeyPair),
    Rsa(RsaKeyPair),
}

/// A software attestation key and its `TPMT_PUBLIC`.
pub struct SoftAk {
    key: SoftKey,
    public: TpmtPublic,
    public_bytes: Vec<u8>,
    rng: SystemRandom,
}

impl SoftAk {
    /// A fresh random ECDSA P-256 AK.
    pub fn generate_ecdsa_p256() -> Result<Self, SoftError> {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .map_err(|e| SoftError::Key(e.to_string()))?;
        Self::from_ecdsa_p256_pkcs8(pkcs8.as_ref())
    }

    /// An ECDSA P-256 AK from a PKCS#8 private key.
    pub fn from_ecdsa_p256_pkcs8(pkcs8: &[u8]) -> Result<Self, SoftError> {
        let rng = SystemRandom::new();
        let key =
            EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8, &rng)
                .map_err(|e| SoftError::Key(e.to_string()))?;
        let point = key.public_key().as_ref();
        let x = point.get(1..33).unwrap_or_default().to_vec();
        let y = point.get(33..65).unwrap_or_default().to_vec();
        let public = TpmtPublic::ak(PublicParams::ecdsa_p256(x, y));
        Self::assemble(SoftKey::Ecdsa(key), public, rng)
    }

    /// An RSASSA-SHA256 AK from a PKCS#8 RSA private key (ring cannot generate RSA keys).
    pub fn from_rsa_pkcs8(pkcs8: &[u8]) -> Result<Self, SoftError> {
        let key = RsaKeyPair::from_pkcs8(pkcs8).map_err(|e| SoftError::Key(e.to_string()))?;
        let comps: signature::RsaPublicKeyComponents<Vec<u8>> = key.public().into();
        let e = comps
            .e
            .iter()
            .fold(0u64, |acc, b| (acc << 8) | u64::from(*b));
        let exponent = match u32::try_from(e) {
            Ok(65537) => 0, // the TPM's encoding of the default exponent
            Ok(e) => e,
            Err(_) => return Err(SoftError::Key("RSA exponent too large".into())),
        };
        let public = TpmtPublic::ak(PublicParams::rsassa_sha256(comps.n, exponent));
        Self::assemble(SoftKey::Rsa(key), public, SystemRandom::new())
    }

    fn assemble(key: SoftKey, public: TpmtPublic, rng: SystemRandom) -> Result<Self, SoftError> {
        let public_bytes = public.to_bytes().map_err(SoftError::Marshal)?;
        Ok(Self {
            key,
            public,
            public_bytes,
            rng,
        })
    }

    /// Replaces the public area's non-key fields (attributes, nameAlg, scheme, …), for
    /// tests of the AK policy. The key itself is unchanged.
    pub fn with_public(mut self, edit: impl FnOnce(&mut TpmtPublic)) -> Result<Self, SoftError> {
        edit(&mut self.public);
        self.public_bytes = self.public.to_bytes().map_err(SoftError::Marshal)?;
        Ok(self)
    }

    /// The parsed public area.
    pub fn public_area(&self) -> &TpmtPublic {
        &self.public
    }

    /// The marshalled `TPMT_PUBLIC` (the evidence's `ak_public`).
    pub fn public_area_bytes(&self) -> &[u8] {
        &self.public_bytes
    }

    /// The fingerprint to pin this AK with.
    pub fn fingerprint(&self) -> AkFingerprint {
        AkFingerprint::of_public_area(&self.public_bytes)
    }

    /// The TPM name of the key: nameAlg || SHA-256(TPMT_PUBLIC).
    pub fn name(&self) -> Vec<u8> {
        let mut name = alg::SHA256.to_be_bytes().to_vec();
        name.extend_from_slice(&Sha256::digest(&self.public_bytes));
        name
    }

    /// The raw public key as an X.509 certificate carries it in its subjectPublicKey bit
    /// string: `04 || x || y` for P-256, a DER RSAPublicKey for RSA.
    pub fn subject_public_key(&self) -> Vec<u8> {
        match &self.key {
            SoftKey::Ecdsa(k) => k.public_key().as_ref().to_vec(),
            SoftKey::Rsa(k) => k.public().as_ref().to_vec(),
        }
    }

    /// Whether this is an RSA key.
    pub fn is_rsa(&self) -> bool {
        matches!(self.key, SoftKey::Rsa(_))
    }

    /// Signs `attest` bytes as a TPM would (the scheme of the key, SHA-256).
    pub fn sign(&self, attest: &[u8]) -> Result<TpmtSignature, SoftError> {
        match &self.key {
            SoftKey::Ecdsa(k) => {
                let sig = k.sign(&self.rng, attest).map_err(|_| SoftError::Sign)?;
                let (r, s) = sig.as_ref().split_at(32);
                Ok(TpmtSignature::Ecdsa {
                    hash: alg::SHA256,
                    r: r.to_vec(),
                    s: s.to_vec(),
                })
            }
            SoftKey::Rsa(k) => {
                let mut sig = vec![0u8; k.public().modulus_len()];
                k.sign(&signature::RSA_PKCS1_SHA256, &self.rng, attest, &mut sig)
                    .map_err(|_| SoftError::Sign)?;
                Ok(TpmtSignature::RsaSsa {
                    hash: alg::SHA256,
                    sig,
                })
            }
        }
    }
}

/// A quote before signing: edit any field, then [`SoftQuote::sign`].
#[derive(Debug, Clone)]
pub struct SoftQuote {
    /// The `TPMS_ATTEST` to sign.
    pub attest: TpmsAttest,
    /// The PCR values to supply.
    pub pcrs: BTreeMap<PcrIndex, [u8; 32]>,
    /// The AK certificate chain to carry.
    pub ak_cert_chain: Vec<Vec<u8>>,
    /// The event log to carry.
    pub event_log: Option<Vec<u8>>,
}

impl SoftQuote {
    /// Marshals and signs the quote with `ak`, giving the wire message.
    pub fn sign(&self, ak: &SoftAk) -> Result<TpmQuoteEvidence, SoftError> {
        let attest = self.attest.to_bytes().map_err(SoftError::Marshal)?;
        let signature = ak.sign(&attest)?.to_bytes().map_err(SoftError::Marshal)?;
        Ok(TpmQuoteEvidence::new(
            attest,
            signature,
            &self.pcrs,
            ak.public_area_bytes().to_vec(),
            self.ak_cert_chain.clone(),
            self.event_log.clone(),
        ))
    }

    /// Signs with `ak` and encodes: the evidence bytes.
    pub fn evidence(&self, ak: &SoftAk) -> Result<Vec<u8>, SoftError> {
        Ok(self.sign(ak)?.encode_to_vec())
    }
}

/// A software TPM: 24 SHA-256 PCRs and a software AK.
pub struct SoftTpm {
    ak: SoftAk,
    pcrs: BTreeMap<PcrIndex, [u8; 32]>,
    selection: BTreeSet<PcrIndex>,
    ak_cert_chain: Vec<Vec<u8>>,
    event_log: Option<Vec<u8>>,
    clock: ClockInfo,
}

impl SoftTpm {
    /// All PCRs zero, quoting all 24, no certificate chain.
    pub fn new(ak: SoftAk) -> Self {
        tracing::warn!("using the insecure software TPM: its quotes prove nothing");
        Self {
            ak,
            pcrs: PcrIndex::all().map(|i| (i, [0u8; 32])).collect(),
            selection: PcrIndex::all().collect(),
            ak_cert_chain: Vec::new(),
            event_log: None,
            clock: ClockInfo {
                clock: 1_000,
                reset_count: 1,
                restart_count: 0,
                safe: true,
            },
        }
    }

    /// The AK.
    pub fn ak(&self) -> &SoftAk {
        &self.ak
    }

    /// Sets a PCR to `value`.
    pub fn set_pcr(&mut self, index: PcrIndex, value: [u8; 32]) {
        self.pcrs.insert(index, value);
    }

    /// Extends a PCR: `PCR = SHA-256(PCR || digest)`.
    pub fn extend_pcr(&mut self, index: PcrIndex, digest: &[u8; 32]) {
        let old = self.pcr(index);
        let mut h = Sha256::new();
        h.update(old);
        h.update(digest);
        self.pcrs.insert(index, h.finalize().into());
    }

    /// A PCR's value.
    pub fn pcr(&self, index: PcrIndex) -> [u8; 32] {
        self.pcrs.get(&index).copied().unwrap_or([0u8; 32])
    }

    /// Which PCRs quotes cover.
    pub fn set_selection(&mut self, selection: impl IntoIterator<Item = PcrIndex>) {
        self.selection = selection.into_iter().collect();
    }

    /// The certificate chain to attach (DER, leaf first).
    pub fn set_ak_cert_chain(&mut self, chain: Vec<Vec<u8>>) {
        self.ak_cert_chain = chain;
    }

    /// The event log to attach.
    pub fn set_event_log(&mut self, log: Option<Vec<u8>>) {
        self.event_log = log;
    }

    /// An unsigned quote over the current selection with `report_data` as qualifying data.
    pub fn quote(&self, report_data: &ReportData) -> SoftQuote {
        let pcrs: BTreeMap<PcrIndex, [u8; 32]> =
            self.selection.iter().map(|i| (*i, self.pcr(*i))).collect();
        let mut h = Sha256::new();
        for v in pcrs.values() {
            h.update(v);
        }
        SoftQuote {
            attest: TpmsAttest {
                qualified_signer: self.ak.name(),
                extra_data: report_data.as_bytes().to_vec(),
                clock_info: self.clock,
                firmware_version: 0x2024_0001,
                quote: QuoteInfo {
                    pcr_select: vec![PcrSelection::new(
                        alg::SHA256,
                        self.selection.iter().copied(),
                    )],
                    pcr_digest: h.finalize().to_vec(),
                },
            },
            pcrs,
            ak_cert_chain: self.ak_cert_chain.clone(),
            event_log: self.event_log.clone(),
        }
    }
}

impl Issuer for SoftTpm {
    fn variant(&self) -> &'static str {
        VARIANT
    }

    fn issue(&self, report_data: &ReportData) -> Result<Vec<u8>, IssueError> {
        self.quote(report_data)
            .evidence(&self.ak)
            .map_err(|e| IssueError {
                variant: VARIANT,
                message: e.to_string(),
                source: Some(Box::new(e)),
            })
    }

    fn blocks(&self) -> bool {
        false
    }
}

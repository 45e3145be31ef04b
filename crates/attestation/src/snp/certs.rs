//! The AMD certificate chain of a report's signing key: VCEK → ASK → ARK, or VLEK → ASVK →
//! ARK. The AMD roots (ARK) of every product are embedded; the chain must end at one of them.
//!
//! AMD's certificates are signed with RSASSA-PSS (SHA-384, 48-byte salt) and carry AMD's own
//! extensions, and the chain has a fixed shape, so it is checked here link by link with `ring`
//! rather than by a general-purpose path builder: each refusal names the certificate.

use ring::signature::{self, UnparsedPublicKey};
use serde::Deserialize;
use x509_parser::certificate::X509Certificate;
use x509_parser::oid_registry::{
    OID_KEY_TYPE_EC_PUBLIC_KEY, OID_NIST_EC_P384, OID_NIST_HASH_SHA384, OID_PKCS1_RSAENCRYPTION,
    OID_PKCS1_RSASSAPSS,
};
use x509_parser::pem::Pem;
use x509_parser::prelude::FromDer;
use x509_parser::signature_algorithm::SignatureAlgorithm;
use x509_parser::time::ASN1Time;
use x509_parser::x509::{AlgorithmIdentifier, SubjectPublicKeyInfo};

use super::{Product, SignerKind};
use crate::ValidationError;
use crate::explain::{Check, Explanation};

/// Largest certificate accepted (AMD's are under 2 KiB).
const MAX_CERT_DER: usize = 16 * 1024;
/// Largest PEM or JSON input accepted.
const MAX_TEXT: usize = 64 * 1024;

const MILAN_ARK: &str = include_str!("roots/milan-ark.pem");
const MILAN_ASK: &str = include_str!("roots/milan-ask.pem");
const MILAN_ASVK: &str = include_str!("roots/milan-asvk.pem");
const GENOA_ARK: &str = include_str!("roots/genoa-ark.pem");
const GENOA_ASK: &str = include_str!("roots/genoa-ask.pem");
const TURIN_ARK: &str = include_str!("roots/turin-ark.pem");
const TURIN_ASK: &str = include_str!("roots/turin-ask.pem");

/// The AMD root key certificate (ARK) of `product`, PEM, as embedded in this crate.
pub fn embedded_ark(product: Product) -> &'static str {
    match product {
        Product::Milan => MILAN_ARK,
        Product::Genoa => GENOA_ARK,
        Product::Turin => TURIN_ARK,
    }
}

/// The intermediate (ASK for VCEKs, ASVK for VLEKs) of `product`, PEM, when this crate embeds
/// it: every ASK, and the Milan ASVK. Used when the caller passes no intermediate.
pub fn embedded_intermediate(product: Product, signer: SignerKind) -> Option<&'static str> {
    match (product, signer) {
        (Product::Milan, SignerKind::Vcek) => Some(MILAN_ASK),
        (Product::Milan, SignerKind::Vlek) => Some(MILAN_ASVK),
        (Product::Genoa, SignerKind::Vcek) => Some(GENOA_ASK),
        (Product::Turin, SignerKind::Vcek) => Some(TURIN_ASK),
        (Product::Genoa | Product::Turin, SignerKind::Vlek) => None,
    }
}

/// One embedded product: its ARK and intermediates, DER.
#[derive(Debug)]
struct EmbeddedProduct {
    product: Product,
    ark: Vec<u8>,
    intermediates: Vec<(SignerKind, Vec<u8>)>,
}

/// The embedded roots and intermediates, decoded once per verifier. A PEM that does not
/// decode leaves its product out, so chains ending there are refused rather than trusted (a
/// unit test proves all decode).
#[derive(Debug)]
pub(crate) struct Roots(Vec<EmbeddedProduct>);

impl Roots {
    /// The embedded roots whose ARK decodes and is self-signed (checked here, once, rather
    /// than with every chain: an RSA-4096 verification that a peer could otherwise make us
    /// repeat).
    pub(crate) fn embedded() -> Self {
        Self(
            Product::ALL
                .into_iter()
                .filter_map(|product| {
                    let ark = single_pem(embedded_ark(product).as_bytes()).ok()?;
                    let self_signed = parse_cert(&ark)
                        .ok()
                        .is_some_and(|c| verify_pss(&c, &c).is_ok());
                    if !self_signed {
                        return None;
                    }
                    let intermediates = [SignerKind::Vcek, SignerKind::Vlek]
                        .into_iter()
                        .filter_map(|s| {
                            let pem = embedded_intermediate(product, s)?;
                            Some((s, single_pem(pem.as_bytes()).ok()?))
                        })
                        .collect();
                    Some(EmbeddedProduct {
                        product,
                        ark,
                        intermediates,
                    })
                })
                .collect(),
        )
    }
}

/// The certificates that vouch for a report's signing key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnpCerts {
    leaf: Vec<u8>,
    intermediate: Option<Vec<u8>>,
    root: Option<Vec<u8>>,
    tcbm: Option<u64>,
}

fn bad_input(what: &str, reason: impl std::fmt::Display) -> ValidationError {
    ValidationError::Malformed(format!("SEV-SNP certificates: {what}: {reason}"))
}

/// The DER certificates of a PEM text, in order; other PEM blocks are refused.
fn pem_certs(text: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    if text.len() > MAX_TEXT {
        return Err(format!("{} bytes, at most {MAX_TEXT}", text.len()));
    }
    let mut out = Vec::new();
    for pem in Pem::iter_from_buffer(text) {
        let pem = pem.map_err(|e| format!("not PEM: {e}"))?;
        if pem.label != "CERTIFICATE" {
            return Err(format!("unexpected PEM block {:?}", pem.label));
        }
        out.push(pem.contents);
    }
    Ok(out)
}

fn single_pem(text: &[u8]) -> Result<Vec<u8>, String> {
    let mut certs = pem_certs(text)?;
    match (certs.pop(), certs.is_empty()) {
        (Some(der), true) => Ok(der),
        (None, _) => Err("no certificate".into()),
        (Some(_), false) => Err("more than one certificate".into()),
    }
}

fn capped(what: &str, der: &[u8]) -> Result<Vec<u8>, ValidationError> {
    if der.is_empty() || der.len() > MAX_CERT_DER {
        return Err(bad_input(
            what,
            format!("{} bytes, expected 1 to {MAX_CERT_DER}", der.len()),
        ));
    }
    Ok(der.to_vec())
}

/// Azure THIM's answer for a VM's VCEK.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Thim {
    vcek_cert: String,
    certificate_chain: String,
    tcbm: Option<String>,
}

impl SnpCerts {
    /// Certificates as DER: the signing key's (VCEK or VLEK), its intermediate (ASK or
    /// ASVK; `None` uses the embedded one, where this crate has it) and the root (ARK;
    /// optional, since the embedded root is what is trusted: a root given here must equal it).
    pub fn from_der(
        leaf: &[u8],
        intermediate: Option<&[u8]>,
        root: Option<&[u8]>,
    ) -> Result<Self, ValidationError> {
        Ok(Self {
            leaf: capped("leaf", leaf)?,
            intermediate: intermediate
                .map(|d| capped("intermediate", d))
                .transpose()?,
            root: root.map(|d| capped("root", d)).transpose()?,
            tcbm: None,
        })
    }

    /// Certificates as PEM: `leaf` holds exactly the signing key's certificate; `chain`, if
    /// given, the intermediate and optionally the root after it (AMD KDS's `cert_chain`).
    pub fn from_pem(leaf: &[u8], chain: Option<&[u8]>) -> Result<Self, ValidationError> {
        let leaf = single_pem(leaf).map_err(|e| bad_input("leaf PEM", e))?;
        let (intermediate, root) = match chain {
            None => (None, None),
            Some(chain) => {
                let mut certs = pem_certs(chain)
                    .map_err(|e| bad_input("chain PEM", e))?
                    .into_iter();
                let intermediate = certs
                    .next()
                    .ok_or_else(|| bad_input("chain PEM", "no certificate"))?;
                let root = certs.next();
                if certs.next().is_some() {
                    return Err(bad_input(
                        "chain PEM",
                        "more than an intermediate and a root",
                    ));
                }
                (Some(intermediate), root)
            }
        };
        Self::from_der(&leaf, intermediate.as_deref(), root.as_deref())
    }

    /// Azure THIM's JSON: `vcekCert` (PEM), `certificateChain` (PEM, ASK then ARK) and
    /// `tcbm` (the TCB the VCEK was issued for, 16 hex digits), which must then equal the
    /// report's `reported_tcb`.
    pub fn from_thim_json(json: &[u8]) -> Result<Self, ValidationError> {
        if json.len() > MAX_TEXT {
            return Err(bad_input(
                "THIM JSON",
                format!("{} bytes, at most {MAX_TEXT}", json.len()),
            ));
        }
        let thim: Thim = serde_json::from_slice(json).map_err(|e| bad_input("THIM JSON", e))?;
        let tcbm = thim
            .tcbm
            .map(|t| {
                if t.len() != 16 {
                    return Err(bad_input(
                        "THIM tcbm",
                        format!("{t:?} is not 16 hex digits"),
                    ));
                }
                u64::from_str_radix(&t, 16).map_err(|e| bad_input("THIM tcbm", e))
            })
            .transpose()?;
        let mut certs = Self::from_pem(
            thim.vcek_cert.as_bytes(),
            Some(thim.certificate_chain.as_bytes()),
        )?;
        certs.tcbm = tcbm;
        Ok(certs)
    }

    /// The signing key's certificate, DER.
    pub fn leaf_der(&self) -> &[u8] {
        &self.leaf
    }

    /// The TCB Azure THIM says the VCEK was issued for, when these came from THIM.
    pub fn tcbm(&self) -> Option<u64> {
        self.tcbm
    }

    /// A digest of the certificates as given (each length-prefixed, absent ones marked), so
    /// that a cached chain is reused only for exactly these certificates.
    pub(crate) fn digest(&self) -> [u8; 32] {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        for part in [
            Some(&self.leaf),
            self.intermediate.as_ref(),
            self.root.as_ref(),
        ] {
            match part {
                Some(der) => {
                    h.update([1]);
                    h.update((der.len() as u64).to_be_bytes());
                    h.update(der);
                }
                None => h.update([0]),
            }
        }
        h.finalize().into()
    }
}

/// What the signing key's certificate says about the chip, from AMD's extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeafExtensions {
    pub product_name: String,
    /// The chip ID (VCEK only): 64 bytes on Milan and Genoa, 8 on Turin.
    pub hwid: Option<Vec<u8>>,
    pub bootloader: u8,
    pub tee: u8,
    pub snp: u8,
    pub microcode: u8,
    pub fmc: Option<u8>,
}

/// One certificate's validity period, kept so that a cached chain is still checked at `now`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Window {
    pub which: String,
    pub not_before: i64,
    pub not_after: i64,
}

impl Window {
    /// Records and checks the window at `now`.
    pub fn check(&self, now: i64, explanation: &mut Explanation) -> Result<(), ValidationError> {
        let ok = self.not_before <= now && now <= self.not_after;
        let expected = format!(
            "valid from {} to {}",
            show_time(self.not_before),
            show_time(self.not_after)
        );
        explanation.push(Check::pass_if(
            ok,
            format!("{}.validity", self.which),
            expected.clone(),
            format!("checked at {}", show_time(now)),
        ));
        if ok {
            Ok(())
        } else {
            Err(cert_error(
                &self.which,
                format!("used at {}, but {expected}", show_time(now)),
            ))
        }
    }
}

fn show_time(t: i64) -> String {
    ASN1Time::from_timestamp(t)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| format!("unix {t}"))
}

/// A chain that verified: the product its root names, the leaf's key and extensions, and
/// the validity windows to re-check at each use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VerifiedChain {
    pub product: Product,
    pub signer: SignerKind,
    /// The leaf's P-384 public key, SEC1 uncompressed.
    pub leaf_key: Vec<u8>,
    pub leaf: LeafExtensions,
    pub windows: Vec<Window>,
    /// The intermediate (ASK or ASVK) and the ARK that signed it, DER, for the revocation
    /// check that runs on every use (a CRL expires).
    pub intermediate_der: Vec<u8>,
    pub ark_der: Vec<u8>,
}

fn cert_error(which: &str, reason: impl Into<String>) -> ValidationError {
    ValidationError::Certificate {
        which: which.to_string(),
        reason: reason.into(),
    }
}

/// Fails the certificate `which` with `reason`, recording it.
pub(crate) fn refuse(
    explanation: &mut Explanation,
    which: &str,
    reason: String,
) -> ValidationError {
    explanation.push(Check::pass_if(
        false,
        which.to_owned(),
        "acceptable",
        reason.clone(),
    ));
    cert_error(which, reason)
}

fn parse_cert(der: &[u8]) -> Result<X509Certificate<'_>, String> {
    match X509Certificate::from_der(der) {
        Ok(([], cert)) => Ok(cert),
        Ok((rest, _)) => Err(format!("{} bytes after the certificate", rest.len())),
        Err(e) => Err(format!("not an X.509 certificate: {e}")),
    }
}

fn common_name(cert: &X509Certificate<'_>) -> String {
    cert.subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or("")
        .to_string()
}

/// Checks that `issuer` signed `subject` with RSASSA-PSS, SHA-384, MGF1-SHA-384 and a
/// 48-byte salt, the only scheme AMD uses for these certificates.
fn verify_pss(issuer: &X509Certificate<'_>, subject: &X509Certificate<'_>) -> Result<(), String> {
    verify_pss_raw(
        issuer.public_key(),
        &subject.signature_algorithm,
        subject.tbs_certificate.as_ref(),
        &subject.signature_value.data,
    )
    .map_err(|e| e.replace("{issuer}", &common_name(issuer)))
}

/// Checks an RSASSA-PSS signature (SHA-384, MGF1-SHA-384, 48-byte salt: AMD's only scheme,
/// for certificates and CRLs alike) by the RSA key `spki` over `signed`. A failed
/// verification says `{issuer}`, for the caller to name the key.
pub(crate) fn verify_pss_raw(
    spki: &SubjectPublicKeyInfo<'_>,
    algorithm: &AlgorithmIdentifier<'_>,
    signed: &[u8],
    signature_value: &[u8],
) -> Result<(), String> {
    if algorithm.algorithm != OID_PKCS1_RSASSAPSS {
        return Err(format!(
            "signature algorithm {}, expected RSASSA-PSS",
            algorithm.algorithm
        ));
    }
    let params = match SignatureAlgorithm::try_from(algorithm) {
        Ok(SignatureAlgorithm::RSASSA_PSS(p)) => p,
        _ => return Err("unreadable RSASSA-PSS parameters".into()),
    };
    let mgf_hash_ok = params
        .mask_gen_algorithm()
        .is_ok_and(|m| m.hash == OID_NIST_HASH_SHA384);
    if *params.hash_algorithm_oid() != OID_NIST_HASH_SHA384
        || !mgf_hash_ok
        || params.salt_length() != 48
    {
        return Err("RSASSA-PSS parameters are not SHA-384 with a 48-byte salt".into());
    }
    if spki.algorithm.algorithm != OID_PKCS1_RSAENCRYPTION {
        return Err("the issuer's key is not an RSA key".into());
    }
    UnparsedPublicKey::new(
        &signature::RSA_PSS_2048_8192_SHA384,
        &spki.subject_public_key.data,
    )
    .verify(signed, signature_value)
    .map_err(|_| "signature does not verify under {issuer}".to_string())
}

fn window(which: &str, cert: &X509Certificate<'_>) -> Window {
    Window {
        which: which.to_string(),
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
    }
}

/// A CA certificate (ARK, ASK, ASVK) must say it is a CA that signs certificates.
fn check_ca(cert: &X509Certificate<'_>) -> Result<(), String> {
    let ca = cert
        .basic_constraints()
        .ok()
        .flatten()
        .is_some_and(|bc| bc.value.ca);
    let signs = cert
        .key_usage()
        .ok()
        .flatten()
        .is_some_and(|ku| ku.value.key_cert_sign());
    if ca && signs {
        Ok(())
    } else {
        Err("not a CA certificate allowed to sign certificates".into())
    }
}

const AMD_OID_PREFIX: &str = "1.3.6.1.4.1.3704.1.";

/// The value of a small DER INTEGER (an SPL): 0 to 255.
fn der_u8(value: &[u8]) -> Option<u8> {
    match value {
        [0x02, 1, v] if *v < 0x80 => Some(*v),
        [0x02, 2, 0, v] if *v >= 0x80 => Some(*v),
        _ => None,
    }
}

fn der_string(value: &[u8]) -> Option<String> {
    match value {
        // IA5String or UTF8String, short form length.
        [0x16 | 0x0C, len, rest @ ..] if usize::from(*len) == rest.len() && *len < 0x80 => {
            String::from_utf8(rest.to_vec()).ok()
        }
        _ => None,
    }
}

fn leaf_extensions(
    cert: &X509Certificate<'_>,
    signer: SignerKind,
) -> Result<LeafExtensions, String> {
    let mut product_name = None;
    let mut hwid = None;
    let (mut bl, mut tee, mut snp, mut ucode, mut fmc) = (None, None, None, None, None);
    for ext in cert.extensions() {
        let oid = ext.oid.to_id_string();
        let Some(suffix) = oid.strip_prefix(AMD_OID_PREFIX) else {
            continue;
        };
        let spl = |name: &str| {
            der_u8(ext.value).ok_or_else(|| format!("extension {name} is not an SPL integer"))
        };
        match suffix {
            "2" => {
                product_name =
                    Some(der_string(ext.value).ok_or("extension productName is not a string")?)
            }
            "3.1" => bl = Some(spl("blSPL")?),
            "3.2" => tee = Some(spl("teeSPL")?),
            "3.3" => snp = Some(spl("snpSPL")?),
            "3.8" => ucode = Some(spl("ucodeSPL")?),
            "3.9" => fmc = Some(spl("fmcSPL")?),
            // The chip ID, raw bytes (not DER-wrapped).
            "4" => hwid = Some(ext.value.to_vec()),
            _ => {}
        }
    }
    let need = |v: Option<u8>, name: &str| v.ok_or_else(|| format!("no {name} extension"));
    if signer == SignerKind::Vcek && hwid.is_none() {
        return Err("no hwID extension".into());
    }
    Ok(LeafExtensions {
        product_name: product_name.ok_or("no productName extension")?,
        hwid,
        bootloader: need(bl, "blSPL")?,
        tee: need(tee, "teeSPL")?,
        snp: need(snp, "snpSPL")?,
        microcode: need(ucode, "ucodeSPL")?,
        fmc,
    })
}

/// The leaf's public key, which must be an ECDSA P-384 key.
fn leaf_key(cert: &X509Certificate<'_>) -> Result<Vec<u8>, String> {
    let spki = cert.public_key();
    let curve_ok = spki
        .algorithm
        .parameters
        .as_ref()
        .and_then(|p| p.as_oid().ok())
        .is_some_and(|oid| oid == OID_NIST_EC_P384);
    if spki.algorithm.algorithm != OID_KEY_TYPE_EC_PUBLIC_KEY || !curve_ok {
        return Err("the key is not an ECDSA P-384 key".into());
    }
    Ok(spki.subject_public_key.data.to_vec())
}

/// What the leaf of `certs` claims, read without verifying its chain: for refusing a report
/// that does not match it, or is not signed by its key, before the chain costs RSA
/// verifications. Nothing here is trusted until [`verify_chain`] has verified the leaf.
pub(crate) struct ClaimedLeaf {
    /// The product its `productName` names.
    pub product: Product,
    /// Its P-384 key, SEC1 uncompressed.
    pub key: Vec<u8>,
    pub leaf: LeafExtensions,
}

/// The leaf of `certs` as a [`ClaimedLeaf`] for a report signed by `signer`: its common
/// name, key and extensions must be those of a `signer` certificate, as [`verify_chain`]
/// requires.
pub(crate) fn claimed_leaf(certs: &SnpCerts, signer: SignerKind) -> Result<ClaimedLeaf, String> {
    let leaf = parse_cert(&certs.leaf)?;
    let cn = common_name(&leaf);
    let want = format!("SEV-{}", signer.name());
    if cn != want {
        return Err(format!("common name {cn:?}, expected {want:?}"));
    }
    let key = leaf_key(&leaf)?;
    let ext = leaf_extensions(&leaf, signer)?;
    let product = Product::from_product_name(&ext.product_name)
        .ok_or_else(|| format!("productName {:?} names no product", ext.product_name))?;
    Ok(ClaimedLeaf {
        product,
        key,
        leaf: ext,
    })
}

/// Verifies the chain of `certs` for a report signed by `signer`, at `now` (unix seconds),
/// recording each link.
pub(crate) fn verify_chain(
    roots: &Roots,
    certs: &SnpCerts,
    signer: SignerKind,
    now: i64,
    explanation: &mut Explanation,
) -> Result<VerifiedChain, ValidationError> {
    let leaf_name = signer.name();
    let int_name = signer.intermediate_name();
    let leaf = parse_cert(&certs.leaf).map_err(|r| refuse(explanation, leaf_name, r))?;

    // The intermediate: the caller's, or the embedded one whose subject issued the leaf.
    let embedded_int = roots.0.iter().find_map(|p| {
        p.intermediates.iter().find_map(|(s, der)| {
            let cert = parse_cert(der).ok()?;
            (*s == signer && cert.subject().as_raw() == leaf.issuer().as_raw())
                .then_some(der.as_slice())
        })
    });
    let int_der = match (&certs.intermediate, embedded_int) {
        (Some(der), _) => der.as_slice(),
        (None, Some(der)) => der,
        (None, None) => {
            return Err(refuse(
                explanation,
                int_name,
                format!(
                    "none given, and none embedded for the {leaf_name}'s issuer {}",
                    leaf.issuer()
                ),
            ));
        }
    };
    let int = parse_cert(int_der).map_err(|r| refuse(explanation, int_name, r))?;

    // The root: the embedded ARK whose subject issued the intermediate.
    let Some((product, ark_der)) = roots.0.iter().find_map(|p| {
        let ark = parse_cert(&p.ark).ok()?;
        (ark.subject().as_raw() == int.issuer().as_raw()).then_some((p.product, p.ark.as_slice()))
    }) else {
        return Err(refuse(
            explanation,
            int_name,
            format!(
                "issued by {}, which is none of the embedded AMD roots (ARK-Milan, ARK-Genoa, ARK-Turin)",
                int.issuer()
            ),
        ));
    };
    if let Some(root) = &certs.root
        && root.as_slice() != ark_der
    {
        return Err(refuse(
            explanation,
            "ARK",
            format!("the given root is not the embedded AMD ARK-{product}"),
        ));
    }
    let ark = parse_cert(ark_der).map_err(|r| refuse(explanation, "ARK", r))?;
    // Its self-signature was checked once, when the roots were loaded ([`Roots::embedded`]).
    check_ca(&ark)
        .map_err(|r| refuse(explanation, "ARK", format!("embedded ARK-{product}: {r}")))?;
    explanation.push(Check::pass_if(
        true,
        "ARK",
        "an embedded AMD root, self-signed",
        format!("ARK-{product}"),
    ));
    let ark_window = window("ARK", &ark);
    ark_window.check(now, explanation)?;

    // The intermediate: ASK-<product> for a VCEK, SEV-VLEK-<product> for a VLEK.
    let int_cn = common_name(&int);
    let want_int_cn = match signer {
        SignerKind::Vcek => format!("SEV-{product}"),
        SignerKind::Vlek => format!("SEV-VLEK-{product}"),
    };
    if int_cn != want_int_cn {
        return Err(refuse(
            explanation,
            int_name,
            format!("common name {int_cn:?}, expected {want_int_cn:?}"),
        ));
    }
    verify_pss(&ark, &int)
        .and_then(|()| check_ca(&int))
        .map_err(|r| refuse(explanation, int_name, r))?;
    explanation.push(Check::pass_if(
        true,
        int_name,
        format!("signed by ARK-{product}"),
        int_cn,
    ));
    let int_window = window(int_name, &int);
    int_window.check(now, explanation)?;

    // The leaf: SEV-VCEK or SEV-VLEK, signed by the intermediate, a P-384 key.
    let leaf_cn = common_name(&leaf);
    let want_leaf_cn = format!("SEV-{leaf_name}");
    if leaf_cn != want_leaf_cn {
        return Err(refuse(
            explanation,
            leaf_name,
            format!("common name {leaf_cn:?}, expected {want_leaf_cn:?}"),
        ));
    }
    if leaf.issuer().as_raw() != int.subject().as_raw() {
        return Err(refuse(
            explanation,
            leaf_name,
            format!("issued by {}, not by {}", leaf.issuer(), int.subject()),
        ));
    }
    verify_pss(&int, &leaf).map_err(|r| refuse(explanation, leaf_name, r))?;
    let leaf_key = leaf_key(&leaf).map_err(|r| refuse(explanation, leaf_name, r))?;
    let leaf_ext = leaf_extensions(&leaf, signer).map_err(|r| refuse(explanation, leaf_name, r))?;
    explanation.push(Check::pass_if(
        true,
        leaf_name,
        format!("signed by {int_name} {want_int_cn}"),
        format!("{leaf_cn} for {}", leaf_ext.product_name),
    ));
    let leaf_window = window(leaf_name, &leaf);
    leaf_window.check(now, explanation)?;

    Ok(VerifiedChain {
        product,
        signer,
        leaf_key,
        leaf: leaf_ext,
        windows: vec![ark_window, int_window, leaf_window],
        intermediate_der: int_der.to_vec(),
        ark_der: ark_der.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_arks_are_self_signed_amd_roots_of_their_product() {
        let roots = Roots::embedded();
        assert_eq!(roots.0.len(), 3, "every embedded root decodes");
        for p in &roots.0 {
            let ark = parse_cert(&p.ark).unwrap();
            verify_pss(&ark, &ark).unwrap();
            check_ca(&ark).unwrap();
            assert_eq!(common_name(&ark), format!("ARK-{}", p.product));
            assert_eq!(ark.subject().as_raw(), ark.issuer().as_raw());
            for (signer, der) in &p.intermediates {
                let int = parse_cert(der).unwrap();
                verify_pss(&ark, &int).unwrap();
                check_ca(&int).unwrap();
                let want = match signer {
                    SignerKind::Vcek => format!("SEV-{}", p.product),
                    SignerKind::Vlek => format!("SEV-VLEK-{}", p.product),
                };
                assert_eq!(common_name(&int), want);
            }
        }
    }

    #[test]
    fn a_root_signature_check_refuses_another_products_root() {
        let roots = Roots::embedded();
        let milan = parse_cert(&roots.0[0].ark).unwrap();
        let turin = parse_cert(&roots.0[2].ark).unwrap();
        assert!(verify_pss(&turin, &milan).is_err());
    }

    #[test]
    fn a_signing_key_certificate_is_no_ca() {
        let vcek = include_bytes!("../../tests/data/cvm/snp-milan/vcek_milan.der");
        assert!(check_ca(&parse_cert(vcek).unwrap()).is_err());
    }

    #[test]
    fn spl_integers_decode_strictly() {
        assert_eq!(der_u8(&[2, 1, 0x73]), Some(0x73));
        assert_eq!(der_u8(&[2, 2, 0, 0xdc]), Some(0xdc));
        assert_eq!(der_u8(&[2, 1, 0xdc]), None, "negative");
        assert_eq!(der_u8(&[2, 2, 0, 0x01]), None, "not minimal");
        assert_eq!(der_u8(&[4, 1, 1]), None);
    }

    const MILAN_VCEK: &[u8] = include_bytes!("../../tests/data/cvm/snp-milan/vcek_milan.der");

    /// `der` with the `nth` occurrence of `from`, counted from the end (0 the last),
    /// replaced by `to`.
    fn replaced_from_end(der: &[u8], nth: usize, from: &[u8], to: &[u8]) -> Vec<u8> {
        let at = der
            .windows(from.len())
            .enumerate()
            .filter(|(_, w)| *w == from)
            .map(|(at, _)| at)
            .nth_back(nth)
            .unwrap();
        let mut out = der.to_vec();
        out.splice(at..at + from.len(), to.iter().copied());
        out
    }

    /// The VCEK's signature verifies under the Milan ASK only while its signature algorithm
    /// says SHA-384, MGF1 with SHA-384 and a 48-byte salt. That algorithm identifier, at
    /// the certificate's end, is outside what the signature covers, so the signature stays
    /// the same when it names another hash, another mask hash or another salt length; each
    /// of these alone is refused.
    #[test]
    fn pss_parameters_other_than_sha384_mgf1_sha384_and_a_48_byte_salt_are_refused() {
        let ask = single_pem(MILAN_ASK.as_bytes()).unwrap();
        let ask = parse_cert(&ask).unwrap();
        verify_pss(&ask, &parse_cert(MILAN_VCEK).unwrap()).unwrap();
        let sha384 = [6, 9, 0x60, 0x86, 0x48, 1, 0x65, 3, 4, 2, 2];
        let sha256 = [6, 9, 0x60, 0x86, 0x48, 1, 0x65, 3, 4, 2, 1];
        let (salt_48, salt_32) = ([0xa2, 3, 2, 1, 0x30], [0xa2, 3, 2, 1, 0x20]);
        for (name, der) in [
            // The outer identifier names the hash, then MGF1's hash, then the salt length.
            (
                "hash SHA-256",
                replaced_from_end(MILAN_VCEK, 1, &sha384, &sha256),
            ),
            (
                "MGF1 with SHA-256",
                replaced_from_end(MILAN_VCEK, 0, &sha384, &sha256),
            ),
            (
                "salt 32",
                replaced_from_end(MILAN_VCEK, 0, &salt_48, &salt_32),
            ),
        ] {
            let vcek = parse_cert(&der).unwrap();
            assert_eq!(
                verify_pss(&ask, &vcek).unwrap_err(),
                "RSASSA-PSS parameters are not SHA-384 with a 48-byte salt",
                "{name}"
            );
        }
    }

    /// A CA certificate must both say it is a CA and allow certificate signing: either alone
    /// is refused.
    #[test]
    fn a_ca_certificate_needs_both_the_ca_flag_and_certificate_signing() {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, KeyUsagePurpose};
        let cert = |is_ca, key_usages| {
            let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = is_ca;
            params.key_usages = key_usages;
            params
                .self_signed(&KeyPair::generate().unwrap())
                .unwrap()
                .der()
                .to_vec()
        };
        let ca = || IsCa::Ca(BasicConstraints::Unconstrained);
        let both = cert(ca(), vec![KeyUsagePurpose::KeyCertSign]);
        let ca_only = cert(ca(), vec![KeyUsagePurpose::DigitalSignature]);
        let signs_only = cert(IsCa::ExplicitNoCa, vec![KeyUsagePurpose::KeyCertSign]);
        check_ca(&parse_cert(&both).unwrap()).unwrap();
        assert!(check_ca(&parse_cert(&ca_only).unwrap()).is_err());
        assert!(check_ca(&parse_cert(&signs_only).unwrap()).is_err());
    }

    /// An SPL of 0x7F is one content byte; 0x80 needs a leading zero byte, and one byte
    /// 0x80 (a negative number) is refused.
    #[test]
    fn an_spl_takes_one_byte_up_to_0x7f_and_two_from_0x80() {
        assert_eq!(der_u8(&[2, 1, 0x7f]), Some(0x7f));
        assert_eq!(der_u8(&[2, 1, 0x80]), None);
        assert_eq!(der_u8(&[2, 2, 0, 0x80]), Some(0x80));
        assert_eq!(der_u8(&[2, 2, 0, 0x7f]), None);
    }

    /// A product name is an IA5String or UTF8String whose one length byte is exactly the
    /// length of the rest, and below 0x80 (a length byte of 0x80 or more is no short form).
    #[test]
    fn a_product_name_string_is_read_only_with_its_exact_short_form_length() {
        assert_eq!(der_string(b"\x16\x05Milan").as_deref(), Some("Milan"));
        assert_eq!(der_string(b"\x0c\x05Genoa").as_deref(), Some("Genoa"));
        assert_eq!(
            der_string(b"\x16\x04Milan"),
            None,
            "length short of the rest"
        );
        assert_eq!(der_string(b"\x16\x06Milan"), None, "length past the rest");
        assert_eq!(der_string(b"\x04\x05Milan"), None, "an OCTET STRING");
        let long = [[0x16, 0x80].as_slice(), &[b'A'; 0x80]].concat();
        assert_eq!(der_string(&long), None, "length byte 0x80");
        let short = [[0x16, 0x7f].as_slice(), &[b'A'; 0x7f]].concat();
        assert_eq!(der_string(&short), Some("A".repeat(0x7f)));
    }

    /// The signing key must be an EC key on P-384: the VCEK's key is, the same key with its
    /// curve named P-521 is refused, and so is the ASK's RSA key.
    #[test]
    fn a_signing_key_must_be_an_ec_key_on_p384() {
        let key = leaf_key(&parse_cert(MILAN_VCEK).unwrap()).unwrap();
        assert_eq!((key.len(), key.first()), (97, Some(&4)));
        let p384 = [6, 5, 0x2b, 0x81, 4, 0, 0x22];
        let p521 = [6, 5, 0x2b, 0x81, 4, 0, 0x23];
        let on_p521 = replaced_from_end(MILAN_VCEK, 0, &p384, &p521);
        assert!(leaf_key(&parse_cert(&on_p521).unwrap()).is_err());
        let ask = single_pem(MILAN_ASK.as_bytes()).unwrap();
        assert!(leaf_key(&parse_cert(&ask).unwrap()).is_err());
    }

    /// A Turin VCEK given without its chain takes the embedded intermediate that issued it,
    /// Turin's ASK (not the first embedded ASK, Milan's), and its chain verifies to
    /// ARK-Turin.
    #[test]
    fn a_turin_vcek_without_a_chain_takes_the_embedded_turin_ask() {
        let vcek = include_bytes!("../../tests/data/cvm/snp-milan/vcek_turin.der");
        let certs = SnpCerts::from_der(vcek, None, None).unwrap();
        let chain = verify_chain(
            &Roots::embedded(),
            &certs,
            SignerKind::Vcek,
            1_748_736_000,
            &mut Explanation::default(),
        )
        .unwrap();
        assert_eq!(chain.product, Product::Turin);
        assert_eq!(
            chain.intermediate_der,
            single_pem(TURIN_ASK.as_bytes()).unwrap()
        );
    }
}

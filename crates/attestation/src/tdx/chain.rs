//! Certificate helpers: the PCK leaf's signature over the QE report, and, when the
//! collateral checks failed, which chain failed and why.

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, UnixTime};
use webpki::{
    BorrowedCertRevocationList, CertRevocationList, EndEntityCert, ExpirationPolicy, KeyUsage,
    RevocationCheckDepth, RevocationOptionsBuilder, UnknownStatusPolicy,
};

use super::collateral::TdxCollateral;
use crate::ValidationError;

/// Intel's SGX Root CA, which roots every PCK, TCB signing and CRL chain (SHA-256
/// fingerprint 44a0196b2b99f889b8e149e95b807a350e7424964399e885a7cbb8ccfab674d3).
pub(crate) const INTEL_SGX_ROOT_CA: &[u8] = include_bytes!("intel_sgx_root_ca.der");

/// The certificates of a PEM chain, leaf first. Bytes outside PEM sections (a quote's
/// chain often ends with a NUL) are ignored.
pub(crate) fn pem_chain(
    pem: &[u8],
    which: &str,
) -> Result<Vec<CertificateDer<'static>>, ValidationError> {
    let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(pem).collect();
    match certs {
        Ok(certs) if !certs.is_empty() => Ok(certs),
        Ok(_) => Err(cert_error(which, "no certificate in the PEM chain")),
        Err(e) => Err(cert_error(which, format!("PEM chain does not parse: {e}"))),
    }
}

/// Verifies the PCK leaf's ECDSA P-256 signature (`r || s`) over the QE report.
pub(crate) fn verify_qe_report_signature(
    pck_leaf: &CertificateDer<'_>,
    qe_report: &[u8],
    signature: &[u8; 64],
) -> Result<(), ValidationError> {
    let leaf = EndEntityCert::try_from(pck_leaf)
        .map_err(|e| cert_error("PCK", format!("does not parse: {e}")))?;
    leaf.verify_signature(
        webpki::ring::ECDSA_P256_SHA256,
        qe_report,
        &p256_signature_der(signature),
    )
    .map_err(|_| {
        ValidationError::BadSignature("TDX QE report: the PCK signature does not verify".into())
    })
}

/// Finds which chain of the quote and collateral fails at `now`: the TCB signing chain
/// (TCB info and QE identity), or the PCK chain, checked against Intel's root with both
/// CRLs. Only called to name the culprit once verification failed on a chain. (The PCK
/// CRL's issuer is the PCK leaf's issuer, so the PCK chain covers it.)
pub(crate) fn diagnose_chains(
    pck_chain: &[CertificateDer<'_>],
    collateral: &TdxCollateral,
    now: UnixTime,
) -> Option<ValidationError> {
    let c = &collateral.inner;
    let crls = match parse_crls(&[&c.root_ca_crl, &c.pck_crl]) {
        Ok(crls) => crls,
        Err(e) => return Some(e),
    };
    let chains: [(&str, Result<Vec<CertificateDer<'static>>, ValidationError>); 3] = [
        (
            "TCB signing chain",
            pem_chain(c.tcb_info_issuer_chain.as_bytes(), "TCB signing chain"),
        ),
        (
            "QE identity signing chain",
            pem_chain(
                c.qe_identity_issuer_chain.as_bytes(),
                "QE identity signing chain",
            ),
        ),
        (
            "PCK",
            Ok(pck_chain.iter().map(|c| c.clone().into_owned()).collect()),
        ),
    ];
    for (which, chain) in chains {
        let chain = match chain {
            Ok(chain) => chain,
            Err(e) => return Some(e),
        };
        if let Err(e) = verify_chain(&chain, &crls, now) {
            return Some(match e {
                ChainError::Crl(reason) => cert_error(&format!("CRL ({which} path)"), reason),
                ChainError::Cert(reason) => cert_error(which, reason),
            });
        }
    }
    None
}

fn parse_crls(ders: &[&Vec<u8>]) -> Result<Vec<CertRevocationList<'static>>, ValidationError> {
    ders.iter()
        .map(|der| {
            BorrowedCertRevocationList::from_der(der)
                .and_then(|crl| crl.to_owned())
                .map(CertRevocationList::from)
                .map_err(|e| cert_error("CRL", format!("does not parse: {e}")))
        })
        .collect()
}

/// Why a chain failed: a certificate on it, or a CRL that vouches for one.
enum ChainError {
    Cert(String),
    Crl(String),
}

fn verify_chain(
    chain: &[CertificateDer<'_>],
    crls: &[CertRevocationList<'_>],
    now: UnixTime,
) -> Result<(), ChainError> {
    let [leaf, intermediates @ ..] = chain else {
        return Err(ChainError::Cert("empty chain".into()));
    };
    let root = CertificateDer::from(INTEL_SGX_ROOT_CA);
    let anchor =
        webpki::anchor_from_trusted_cert(&root).map_err(|e| ChainError::Cert(e.to_string()))?;
    // The root itself may come last in the chain: it is the anchor, not an intermediate.
    let intermediates: Vec<CertificateDer<'_>> = intermediates
        .iter()
        .filter(|c| c.as_ref() != INTEL_SGX_ROOT_CA)
        .cloned()
        .collect();
    let leaf = EndEntityCert::try_from(leaf)
        .map_err(|e| ChainError::Cert(format!("does not parse: {e}")))?;
    let crl_refs: Vec<&CertRevocationList<'_>> = crls.iter().collect();
    let revocation = RevocationOptionsBuilder::new(&crl_refs)
        .map_err(|_| ChainError::Crl("no CRL".into()))?
        .with_depth(RevocationCheckDepth::Chain)
        .with_status_policy(UnknownStatusPolicy::Deny)
        .with_expiration_policy(ExpirationPolicy::Enforce)
        .build();
    leaf.verify_for_usage(
        &[webpki::ring::ECDSA_P256_SHA256],
        &[anchor],
        &intermediates,
        now,
        KeyUsage::server_auth(),
        Some(revocation),
        None,
    )
    .map(|_| ())
    .map_err(|e| {
        let reason = describe_webpki(&e);
        match e {
            webpki::Error::InvalidCrlSignatureForPublicKey
            | webpki::Error::CrlExpired { .. }
            | webpki::Error::IssuerNotCrlSigner
            | webpki::Error::UnknownRevocationStatus
            | webpki::Error::UnsupportedCrlSignatureAlgorithmContext(_)
            | webpki::Error::UnsupportedCrlSignatureAlgorithmForPublicKeyContext(_) => {
                ChainError::Crl(reason)
            }
            _ => ChainError::Cert(reason),
        }
    })
}

fn describe_webpki(e: &webpki::Error) -> String {
    match e {
        webpki::Error::InvalidCrlSignatureForPublicKey => "its signature does not verify".into(),
        webpki::Error::UnknownIssuer => "does not chain to the Intel SGX Root CA".into(),
        webpki::Error::CertExpired { .. } => "expired at the verification time".into(),
        webpki::Error::CertNotValidYet { .. } => "not yet valid at the verification time".into(),
        webpki::Error::CertRevoked => "revoked".into(),
        webpki::Error::CrlExpired { .. } => "past its next update".into(),
        other => format!("{other:?}"),
    }
}

/// DER-encodes an ECDSA signature given as the 32-byte `r` and `s`.
pub(crate) fn p256_signature_der(sig: &[u8; 64]) -> Vec<u8> {
    fn integer(out: &mut Vec<u8>, half: &[u8]) {
        let trimmed: &[u8] = match half.iter().position(|&b| b != 0) {
            Some(i) => half.get(i..).unwrap_or(&[]),
            None => &[0],
        };
        let pad = trimmed.first().is_some_and(|&b| b & 0x80 != 0);
        out.push(0x02);
        // At most 33 bytes: a single-byte DER length.
        out.push(u8::try_from(trimmed.len() + usize::from(pad)).unwrap_or(0));
        if pad {
            out.push(0);
        }
        out.extend_from_slice(trimmed);
    }
    let (r, s) = sig.split_at(32);
    let mut body = Vec::with_capacity(70);
    integer(&mut body, r);
    integer(&mut body, s);
    let mut out = Vec::with_capacity(72);
    out.push(0x30);
    out.push(u8::try_from(body.len()).unwrap_or(0));
    out.extend_from_slice(&body);
    out
}

pub(crate) fn cert_error(which: &str, reason: impl Into<String>) -> ValidationError {
    ValidationError::Certificate {
        which: which.into(),
        reason: reason.into(),
    }
}

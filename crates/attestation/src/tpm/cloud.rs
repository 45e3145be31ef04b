//! Cloud vTPM CAs that certify the attestation keys (AKs) of their VMs' vTPMs: Google
//! Compute Engine (Shielded and Confidential VMs) and Azure Trusted Launch.
//!
//! The cloud creates the vTPM's AK and stores a certificate for it in the vTPM's NV memory
//! (GCE: RSA AK at `0x01c10000`, ECC AK at `0x01c10002`; Azure: `0x01c101d0`). The node sends
//! it as the first certificate of the evidence's AK chain; the verifier holds the cloud's
//! root certificate(s) and, where the node cannot read them from its vTPM, the intermediates
//! ([`CloudAkCa`]).
//!
//! What is checked, in order ([`CloudAkCa`] through [`super::AkTrust::CloudAk`]):
//!
//! * the chain, with `rustls-webpki` as for a platform CA ([`super::PlatformCa`]): the
//!   signature of every certificate with the AK and EK chains' accepted algorithms (no
//!   SHA-1), validity at the verification time, basicConstraints of every issuer (a CA as
//!   the leaf is refused), name constraints, unknown critical extensions; the extended key
//!   usage, *if* a certificate of the path lists any, must include `tcg-kp-AIKCertificate`
//!   (2.23.133.8.3) or, as Google's vTPM CA issues AK certificates,
//!   `tcg-kp-EKCertificate` (2.23.133.8.1);
//! * the root the path ends at is valid at the verification time (webpki does not look at
//!   a trust anchor's validity);
//! * the AK certificate's keyUsage is present and allows digitalSignature: an AK signs;
//! * the certificate's public key is the AK of the evidence (RSA or ECC P-256), so a
//!   certificate of another of the cloud's keys (another VM's AK, this vTPM's EK) is
//!   refused.
//!
//! Roots and intermediates must be CAs (basicConstraints CA, keyUsage keyCertSign) when
//! they are loaded. Revocation (CRLs) is not checked.
//!
//! What it proves: the AK is one the cloud made in one of its vTPMs. A cloud that
//! certifies its own vTPM is trusted as the hypervisor is: it could certify a key that
//! never was in a vTPM.

use std::time::SystemTime;

use rustls_pki_types::{CertificateDer, TrustAnchor};

use super::ak::{
    AkChainWalk, AkFingerprint, AkKey, AkTrustError, AttributeRule, TCG_KP_AIK_CERTIFICATE,
};
use super::ek::{asn1_time, certificates_in_file, check_ca, parse_exact};
use super::structures::TpmtPublic;
use crate::ValidationError;

/// `tcg-kp-EKCertificate` (2.23.133.8.1): Google's vTPM CA puts it on AK certificates and on
/// its intermediates.
const TCG_KP_EK_CERTIFICATE: &[u8] = &[0x67, 0x81, 0x05, 0x08, 0x01];

/// Most intermediates a verifier may be configured with (a cloud has a handful).
pub const MAX_CLOUD_INTERMEDIATES: usize = 64;

/// A root with its DER, to check its validity once a path ends at it.
#[derive(Debug, Clone)]
struct Root {
    der: Vec<u8>,
    anchor: TrustAnchor<'static>,
}

/// The root certificate(s) of a cloud's vTPM CA, and the intermediates that the nodes'
/// vTPMs do not store: AKs whose certificate chains to one of the roots are trusted (module
/// documentation).
#[derive(Debug, Clone)]
pub struct CloudAkCa {
    roots: Vec<Root>,
    intermediates: Vec<Vec<u8>>,
}

fn bad(role: &'static str, index: usize, reason: impl Into<String>) -> AkTrustError {
    AkTrustError::CloudCertificate {
        role,
        index,
        reason: reason.into(),
    }
}

impl CloudAkCa {
    /// Trusts the DER certificates `roots`, with the DER certificates `intermediates` to
    /// build paths through. Each must be a CA certificate.
    pub fn from_der<R: AsRef<[u8]>, I: AsRef<[u8]>>(
        roots: impl IntoIterator<Item = R>,
        intermediates: impl IntoIterator<Item = I>,
    ) -> Result<Self, AkTrustError> {
        let mut out = Vec::new();
        for (index, der) in roots.into_iter().enumerate() {
            let der = der.as_ref();
            let cert = parse_exact(der).map_err(|e| bad("root", index, e))?;
            check_ca(&cert).map_err(|e| bad("root", index, e))?;
            let anchor = webpki::anchor_from_trusted_cert(&CertificateDer::from(der))
                .map_err(|e| bad("root", index, e.to_string()))?
                .to_owned();
            out.push(Root {
                der: der.to_vec(),
                anchor,
            });
        }
        if out.is_empty() {
            return Err(AkTrustError::NoRoots);
        }
        let mut inters = Vec::new();
        for (index, der) in intermediates.into_iter().enumerate() {
            let der = der.as_ref();
            if index >= MAX_CLOUD_INTERMEDIATES {
                return Err(bad(
                    "intermediate",
                    index,
                    format!("more than {MAX_CLOUD_INTERMEDIATES} intermediates"),
                ));
            }
            let cert = parse_exact(der).map_err(|e| bad("intermediate", index, e))?;
            check_ca(&cert).map_err(|e| bad("intermediate", index, e))?;
            inters.push(der.to_vec());
        }
        Ok(Self {
            roots: out,
            intermediates: inters,
        })
    }

    /// As [`CloudAkCa::from_der`], from file contents: each PEM (one or more `CERTIFICATE`
    /// blocks) or one DER certificate, as the clouds publish them.
    pub fn from_files<R: AsRef<[u8]>, I: AsRef<[u8]>>(
        roots: impl IntoIterator<Item = R>,
        intermediates: impl IntoIterator<Item = I>,
    ) -> Result<Self, AkTrustError> {
        let split = |role: &'static str, files: Vec<Vec<u8>>| -> Result<_, AkTrustError> {
            let mut certs = Vec::new();
            for (index, bytes) in files.iter().enumerate() {
                certs.extend(certificates_in_file(bytes).map_err(|e| bad(role, index, e))?);
            }
            Ok(certs)
        };
        let roots = split(
            "root",
            roots.into_iter().map(|r| r.as_ref().to_vec()).collect(),
        )?;
        let intermediates = split(
            "intermediate",
            intermediates
                .into_iter()
                .map(|i| i.as_ref().to_vec())
                .collect(),
        )?;
        Self::from_der(roots, intermediates)
    }

    /// Checks, as the validator does, that `chain` (DER, the AK certificate first, as a
    /// node sends it) certifies the AK whose `TPMT_PUBLIC` is `ak_public` at `now`, and that
    /// the AK is one (restricted signing key, RSA 2048–8192 or ECC P-256, SHA-256). Returns
    /// the AK's identity. For checking an AK certificate collected from a machine; the
    /// validator checks it with the quote.
    pub fn check_ak_certificate(
        &self,
        chain: &[Vec<u8>],
        ak_public: &[u8],
        now: SystemTime,
    ) -> Result<AkFingerprint, ValidationError> {
        let public = TpmtPublic::parse(ak_public)
            .map_err(|e| ValidationError::Malformed(format!("ak_public: {e}")))?;
        let ak = AkKey::from_public(&public, AttributeRule::Required)?;
        self.verify(chain, &ak, now)?;
        ak.fingerprint()
    }

    /// Checks that `chain` (leaf first, as in the evidence) certifies `ak` at `now`.
    pub(super) fn verify(
        &self,
        chain: &[Vec<u8>],
        ak: &AkKey,
        now: SystemTime,
    ) -> Result<(), ValidationError> {
        let untrusted = |m: String| ValidationError::UntrustedKey(m);
        let anchors: Vec<TrustAnchor<'_>> = self.roots.iter().map(|r| r.anchor.clone()).collect();
        let walked = AkChainWalk {
            anchors: &anchors,
            extra_intermediates: &self.intermediates,
            ekus: &[TCG_KP_AIK_CERTIFICATE, TCG_KP_EK_CERTIFICATE],
            missing: "the evidence carries no AK certificate (cloud vTPM CA policy)",
            untrusted: "AK certificate chain to the cloud's vTPM CA is not trusted",
            no_eku: "AK certificate chain to the cloud's vTPM CA is not trusted: a certificate's \
                     extended key usage names neither AIK (2.23.133.8.3) nor the vTPM CA's \
                     2.23.133.8.1",
        }
        .verify(chain, ak, now)?;
        let used = &walked.anchor;
        let root = self
            .roots
            .iter()
            .find(|r| {
                r.anchor.subject == used.subject
                    && r.anchor.subject_public_key_info == used.subject_public_key_info
            })
            .ok_or_else(|| untrusted("the path ends at an unknown root".into()))?;
        let at = asn1_time(now).map_err(untrusted)?;
        let root_cert = parse_exact(&root.der).map_err(untrusted)?;
        if !root_cert.validity().is_valid_at(at) {
            return Err(untrusted(format!(
                "cloud vTPM CA root {} is not valid at {at} (valid from {} to {})",
                root_cert.subject(),
                root_cert.validity().not_before,
                root_cert.validity().not_after
            )));
        }

        let leaf_cert = parse_exact(walked.leaf).map_err(untrusted)?;
        let usage = leaf_cert
            .key_usage()
            .map_err(|e| untrusted(format!("AK certificate keyUsage: {e}")))?
            .ok_or_else(|| {
                untrusted("the AK certificate has no keyUsage (digitalSignature required)".into())
            })?;
        if !usage.value.digital_signature() {
            return Err(untrusted(format!(
                "the AK certificate's keyUsage {} lacks digitalSignature",
                usage.value
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "cloud_tests.rs"]
mod tests;

//! Which attestation keys (AKs) a verifier trusts: pinned, certified by a platform CA or a
//! cloud's vTPM CA, or bound to a confidential VM's hardware report. What every AK must
//! meet whoever vouches for it is in [`super::ak`].

use super::ak::{
    AkChainWalk, AkFingerprint, AkKey, AkTrustError, AttributeRule, TCG_KP_AIK_CERTIFICATE,
};
use super::cloud::CloudAkCa;
use super::evidence::QuoteEvidence;
use super::platform::CvmAkTrust;
use crate::ValidationError;
use crate::explain::Check;
use crate::measurements::CvmReferences;
use rustls_pki_types::{CertificateDer, TrustAnchor};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::SystemTime;

/// Platform CA roots that certify AKs (the evidence carries the AK certificate chain).
///
/// Chains are verified with `rustls-webpki`: it is maintained with rustls, pure Rust on
/// ring, builds paths through the supplied intermediates to a root, checks each
/// certificate's signature, validity period and basicConstraints (CA flag and path length;
/// a CA certificate is refused as the leaf), name constraints, and refuses unknown critical
/// extensions. Hand-rolled X.509 path validation on top of a DER parser would re-implement
/// all of that. Two webpki behaviours are designed around:
///
/// * webpki always checks an extended key usage. We require `tcg-kp-AIKCertificate`
///   (2.23.133.8.3) *if* a certificate of the path carries an EKU extension, and accept
///   certificates without one (AK certificates often have none). A certificate whose EKU
///   lists only other purposes (say, TLS server auth) is refused, intermediates included.
/// * webpki ignores the keyUsage extension of the leaf. That is fine here: what the AK
///   may sign is bounded by its TPM attributes (restricted signing key), which are checked
///   before the chain.
///
/// Revocation (CRLs) is not checked.
#[derive(Debug, Clone)]
pub struct PlatformCa {
    roots: Vec<TrustAnchor<'static>>,
}

impl PlatformCa {
    /// Trusts the given DER root certificates.
    pub fn from_der<B: AsRef<[u8]>>(
        roots: impl IntoIterator<Item = B>,
    ) -> Result<Self, AkTrustError> {
        let mut anchors = Vec::new();
        for (index, der) in roots.into_iter().enumerate() {
            let cert = CertificateDer::from(der.as_ref());
            let anchor =
                webpki::anchor_from_trusted_cert(&cert).map_err(|e| AkTrustError::BadRoot {
                    index,
                    reason: e.to_string(),
                })?;
            anchors.push(anchor.to_owned());
        }
        if anchors.is_empty() {
            return Err(AkTrustError::NoRoots);
        }
        Ok(Self { roots: anchors })
    }

    /// Trusts every certificate in a PEM bundle.
    pub fn from_pem(pem: &[u8]) -> Result<Self, AkTrustError> {
        use rustls_pki_types::pem::PemObject;
        let certs = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| AkTrustError::Pem(e.to_string()))?;
        Self::from_der(certs.iter().map(|c| c.as_ref()))
    }

    fn verify(
        &self,
        chain: &[Vec<u8>],
        ak: &AkKey,
        now: SystemTime,
    ) -> Result<(), ValidationError> {
        let walk = AkChainWalk {
            anchors: &self.roots,
            extra_intermediates: &[],
            ekus: &[TCG_KP_AIK_CERTIFICATE],
            missing: "the evidence carries no AK certificate chain (platform CA policy)",
            untrusted: "AK certificate chain is not trusted",
            no_eku: "AK certificate chain is not trusted: a certificate's extended key usage \
                     does not name AIK (2.23.133.8.3)",
        };
        walk.verify(chain, ak, now).map(|_| ())
    }
}

/// A set of pinned AK fingerprints.
#[derive(Debug, Clone, Default)]
pub struct PinnedAks(BTreeSet<AkFingerprint>);

impl PinnedAks {
    /// Pins exactly `fingerprints`.
    pub fn new(fingerprints: impl IntoIterator<Item = AkFingerprint>) -> Self {
        Self(fingerprints.into_iter().collect())
    }

    /// Whether `fp` is pinned.
    pub fn contains(&self, fp: &AkFingerprint) -> bool {
        self.0.contains(fp)
    }
}

/// Marker for [`AkTrust::InsecureAnyAk`]; made only by [`AkTrust::insecure_any_ak`].
#[cfg(feature = "insecure-test-attestation")]
#[derive(Debug, Clone)]
pub struct InsecureAnyAk(());

/// How a verifier decides that an AK belongs to a genuine TPM. A mandatory input of
/// [`super::TpmQuoteValidator::new`].
#[derive(Debug, Clone)]
pub enum AkTrust {
    /// The evidence carries the AK's certificate chain (leaf first); it must chain to one
    /// of these roots and the leaf's public key must be the AK.
    PlatformCa(PlatformCa),
    /// The SHA-256 of the AK's `TPMT_PUBLIC` must be one of these.
    Pinned(PinnedAks),
    /// **Insecure, development only**: any AK that meets the AK policy is trusted, so a
    /// software key can forge evidence. Logged at warn on every validation. Only in builds
    /// with the `insecure-test-attestation` feature, which never compile optimised.
    #[cfg(feature = "insecure-test-attestation")]
    InsecureAnyAk(InsecureAnyAk),
    /// The evidence carries a confidential VM's hardware report that vouches for the AK
    /// (Azure SEV-SNP, Azure TDX, AWS SEV-SNP); see [`CvmAkTrust`].
    ConfidentialVm(Arc<CvmAkTrust>),
    /// The evidence carries the AK certificate a cloud's vTPM CA issued (GCE, Azure Trusted
    /// Launch); it must chain to one of the cloud's roots ([`CloudAkCa`]).
    CloudAk(Arc<CloudAkCa>),
}

impl AkTrust {
    /// Trusts AKs certified by `roots`.
    pub fn platform_ca(roots: PlatformCa) -> Self {
        Self::PlatformCa(roots)
    }

    /// Trusts exactly the AKs with these fingerprints.
    pub fn pinned(fingerprints: impl IntoIterator<Item = AkFingerprint>) -> Self {
        Self::Pinned(PinnedAks::new(fingerprints))
    }

    /// **Insecure**: trusts any AK. Evidence then proves nothing about the platform; every
    /// validation that relies on it logs a warning. Only with the `insecure-test-attestation`
    /// feature.
    #[cfg(feature = "insecure-test-attestation")]
    pub fn insecure_any_ak() -> Self {
        tracing::warn!("AK trust policy insecure_any_ak: any attestation key will be accepted");
        Self::InsecureAnyAk(InsecureAnyAk(()))
    }

    /// Trusts AKs that a confidential VM's hardware report vouches for.
    pub fn confidential_vm(trust: CvmAkTrust) -> Self {
        Self::ConfidentialVm(Arc::new(trust))
    }

    /// Trusts AKs that a cloud's vTPM CA certified.
    pub fn cloud_ak(ca: CloudAkCa) -> Self {
        Self::CloudAk(Arc::new(ca))
    }

    /// Refuses `references` when this is a confidential-VM trust whose platform requires
    /// reference values they lack ([`CvmAkTrust::require_references`]); every other
    /// policy needs none. Binaries call it at start, with the measurements they loaded.
    pub fn require_references(
        &self,
        references: &CvmReferences,
    ) -> Result<(), super::platform::MissingReferences> {
        match self {
            Self::ConfidentialVm(trust) => trust.require_references(references),
            _ => Ok(()),
        }
    }

    /// Which AK attributes this policy accepts. A platform CA or a pin vouches for keys
    /// made by our own template, so the template must match exactly. A cloud's vTPM makes
    /// its AK with its own template (Azure's and Google's lack noDA); the hardware report or
    /// the cloud's certificate vouches for the key itself, so only the attributes that make
    /// it an AK are required.
    pub(crate) fn attribute_rule(&self) -> AttributeRule {
        match self {
            Self::ConfidentialVm(_) | Self::CloudAk(_) => AttributeRule::Required,
            _ => AttributeRule::Exact,
        }
    }

    /// Checks the AK against the policy; returns a warning to carry along when the policy
    /// is insecure, and the checks of a confidential VM's hardware report (empty for the
    /// other policies).
    pub(crate) fn check(
        &self,
        ak: &AkKey,
        fingerprint: &AkFingerprint,
        evidence: &QuoteEvidence,
        cvm: &CvmReferences,
        now: SystemTime,
    ) -> (Vec<Check>, Result<Option<String>, ValidationError>) {
        let chain = &evidence.ak_cert_chain;
        let result = match self {
            Self::ConfidentialVm(trust) => {
                let (explanation, result) = trust.check(
                    &evidence.ak_public_bytes,
                    evidence.platform.as_ref(),
                    cvm,
                    now,
                );
                return (explanation.checks, result.map(|()| None));
            }
            Self::PlatformCa(ca) => ca.verify(chain, ak, now).map(|()| None),
            Self::CloudAk(ca) => ca.verify(chain, ak, now).map(|()| None),
            Self::Pinned(pins) if pins.contains(fingerprint) => Ok(None),
            Self::Pinned(_) => Err(ValidationError::UntrustedKey(format!(
                "AK {fingerprint} is not pinned"
            ))),
            #[cfg(feature = "insecure-test-attestation")]
            Self::InsecureAnyAk(_) => {
                tracing::warn!(
                    ak = %fingerprint,
                    "insecure_any_ak: accepting an attestation key nobody vouched for"
                );
                Ok(Some(format!(
                    "insecure_any_ak: AK {fingerprint} was not checked against any trust policy"
                )))
            }
        };
        (Vec::new(), result)
    }
}

//! TDX collateral: what Intel's Provisioning Certification Service (PCS) publishes for a
//! platform, passed to the verifier as data. The verifier never fetches it; a join service
//! caches it and an operator can hand it over in an offline bundle.

use sha2::{Digest, Sha256};

use crate::ValidationError;

/// The largest collateral JSON accepted, checked before parsing. Real collateral is about
/// 16 KiB; the PCK CRL grows with revocations, hence the headroom.
pub const MAX_COLLATERAL_LEN: usize = 1024 * 1024;

/// The PCS collateral for one platform (its FMSPC): the TCB info and QE identity with their
/// signatures and signing chain, the root CA and PCK CRLs with the CRL issuer chain.
///
/// JSON keys (values hex where binary): `tcb_info`, `tcb_info_signature`,
/// `tcb_info_issuer_chain`, `qe_identity`, `qe_identity_signature`,
/// `qe_identity_issuer_chain`, `root_ca_crl`, `pck_crl`, `pck_crl_issuer_chain`.
#[derive(Clone)]
pub struct TdxCollateral {
    pub(crate) inner: dcap_qvl::QuoteCollateralV3,
    /// SHA-256 of the JSON it was parsed from: identifies it in the verifier's cache.
    pub(crate) digest: [u8; 32],
}

impl std::fmt::Debug for TdxCollateral {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TdxCollateral")
            .field("digest", &hex::encode(self.digest))
            .finish_non_exhaustive()
    }
}

impl TdxCollateral {
    /// Parses the collateral JSON (at most [`MAX_COLLATERAL_LEN`] bytes). Its signatures
    /// and validity are checked at verification, against the quote and the time given there.
    ///
    /// A PCK chain in the collateral (`pck_certificate_chain`) is ignored: the chain is
    /// always the one the quote carries, so the key that signed the QE report is the one
    /// whose chain is checked.
    pub fn from_json(json: &[u8]) -> Result<Self, ValidationError> {
        if json.len() > MAX_COLLATERAL_LEN {
            return Err(ValidationError::Malformed(format!(
                "TDX collateral: {} bytes, more than {MAX_COLLATERAL_LEN}",
                json.len()
            )));
        }
        let mut inner: dcap_qvl::QuoteCollateralV3 = serde_json::from_slice(json)
            .map_err(|e| ValidationError::Malformed(format!("TDX collateral JSON: {e}")))?;
        inner.pck_certificate_chain = None;
        Ok(Self {
            inner,
            digest: Sha256::digest(json).into(),
        })
    }

    /// The FMSPC (family-model-stepping-platform-custom SKU) the TCB info is for, as
    /// written in it (upper-case hex), if it can be read. Unverified until a quote is.
    pub fn fmspc(&self) -> Option<String> {
        let info: serde_json::Value = serde_json::from_str(&self.inner.tcb_info).ok()?;
        info.get("fmspc")?.as_str().map(str::to_owned)
    }

    /// How new the TCB info is, as written in it: its `tcbEvaluationDataNumber` (Intel
    /// raises it with every TCB recovery) and its `issueDate`, if they can be read.
    /// Unverified until a quote is.
    pub fn freshness(&self) -> Option<(u64, String)> {
        let info: serde_json::Value = serde_json::from_str(&self.inner.tcb_info).ok()?;
        let number = info.get("tcbEvaluationDataNumber")?.as_u64()?;
        let issued = info.get("issueDate")?.as_str()?.to_owned();
        Some((number, issued))
    }
}

/// Which PCK CA issued a platform's PCK certificate: it selects the PCK CRL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PckCa {
    /// "Intel SGX PCK Platform CA": multi-package platforms, the usual case for TDX servers.
    Platform,
    /// "Intel SGX PCK Processor CA": single-package platforms.
    Processor,
}

impl PckCa {
    fn as_query(self) -> &'static str {
        match self {
            PckCa::Platform => "platform",
            PckCa::Processor => "processor",
        }
    }
}

/// Where Intel's PCS (API version 4) serves the collateral of one platform. The issuer
/// chains come with the responses, in the `TCB-Info-Issuer-Chain`,
/// `SGX-Enclave-Identity-Issuer-Chain` and `SGX-PCK-CRL-Issuer-Chain` headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PckCollateralUrls {
    /// TDX TCB info for the FMSPC (`tcbInfo` and its `signature`).
    pub tcb_info: String,
    /// The TD quoting enclave's identity (`enclaveIdentity` and its `signature`).
    pub qe_identity: String,
    /// The PCK CRL of the PCK CA, DER.
    pub pck_crl: String,
    /// The Intel SGX Root CA's CRL, DER.
    pub root_ca_crl: String,
}

/// The Intel PCS v4 URLs of the collateral for platform `fmspc` whose PCK certificate `ca`
/// issued. Strings only: fetching is the caller's business, never the verifier's.
pub fn pck_collateral_urls(fmspc: &[u8; 6], ca: PckCa) -> PckCollateralUrls {
    const PCS: &str = "https://api.trustedservices.intel.com";
    PckCollateralUrls {
        tcb_info: format!(
            "{PCS}/tdx/certification/v4/tcb?fmspc={}",
            hex::encode_upper(fmspc)
        ),
        qe_identity: format!("{PCS}/tdx/certification/v4/qe/identity"),
        pck_crl: format!(
            "{PCS}/sgx/certification/v4/pckcrl?ca={}&encoding=der",
            ca.as_query()
        ),
        root_ca_crl: "https://certificates.trustedservices.intel.com/IntelSGXRootCA.der".into(),
    }
}

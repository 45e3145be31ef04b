//! Intel TDX evidence: DCAP quotes (versions 4 and 5) checked against Intel's PCS
//! collateral, which the caller passes in; nothing is fetched during verification.
//!
//! Order of the checks (signature and chain failures stop, field checks all run):
//!
//! 1. the quote parses with exact sizes ([`TdQuote::parse`]);
//! 2. the attestation key's signature over the header and TD report;
//! 3. the PCK's signature over the QE report;
//! 4. the QE report's REPORT_DATA binds the attestation key
//!    (`SHA-256(attestation key || QE auth data) || 32 zero bytes`);
//! 5. the collateral, by the `dcap-qvl` crate: the PCK chain, the TCB signing chain and the
//!    CRL issuer chain to Intel's SGX Root CA with both CRLs, each valid at the given time;
//!    the signatures and validity of the TCB info and the QE identity; the QE report against
//!    the QE identity; the platform's TCB level (PCK CPU SVN and PCE SVN, TEE_TCB_SVN) and the
//!    TDX module identity against the TCB info;
//! 6. the field checks: TCB status against the policy, TD attributes, MRTD, RTMR 0–3 and the
//!    other reference values of the policy, REPORT_DATA (constant time).
//!
//! Step 5 is the expensive part and depends only on the collateral and the quote's
//! signature data, not on the TD's measurements or REPORT_DATA; the verifier caches its
//! outcome per exact inputs, with the validity window of everything it checked, so a
//! repeat quote from the same platform costs the quote's own signature and the field
//! checks (see [`TdxVerifier`]).

mod chain;
mod collateral;
mod quote;

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use rustls_pki_types::UnixTime;
use subtle::ConstantTimeEq;

use crate::ValidationError;
use crate::explain::{Check, Explanation, Outcome, Reference, lower_hex};
use crate::measurements::InsecureNoLaunchMeasurement;
use crate::revocation::CrlBundle;

pub use collateral::{
    MAX_COLLATERAL_LEN, PckCa, PckCollateralUrls, TdxCollateral, pck_collateral_urls,
};
pub use quote::{MAX_QUOTE_LEN, TdQuote, TdReport, TdReportKind};

/// A platform's TCB status, as Intel's TCB info and QE identity rate it (the platform's
/// and the QE's statuses merged, as Intel's quote verification library does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TcbStatus {
    /// All TCB components are current.
    UpToDate,
    /// The TCB is current, but advisories need mitigations in the TD's software.
    SWHardeningNeeded,
    /// The TCB is current, but the platform's configuration (BIOS) needs changes.
    ConfigurationNeeded,
    /// Both configuration changes and software mitigations are needed.
    ConfigurationAndSWHardeningNeeded,
    /// Some TCB component is out of date: known vulnerabilities are not fixed.
    OutOfDate,
    /// Out of date, and configuration changes are needed.
    OutOfDateConfigurationNeeded,
    /// TDX 1.5: launched on an out-of-date TCB that a TD-preserving update since fixed;
    /// relaunching the TD would make it current.
    TdRelaunchAdvised,
    /// [`TcbStatus::TdRelaunchAdvised`], and configuration changes are needed.
    TdRelaunchAdvisedConfigurationNeeded,
    /// The platform's keys are revoked. Never accepted, whatever the policy says.
    Revoked,
}

impl TcbStatus {
    const ALL: [(TcbStatus, &'static str); 9] = [
        (TcbStatus::UpToDate, "UpToDate"),
        (TcbStatus::SWHardeningNeeded, "SWHardeningNeeded"),
        (TcbStatus::ConfigurationNeeded, "ConfigurationNeeded"),
        (
            TcbStatus::ConfigurationAndSWHardeningNeeded,
            "ConfigurationAndSWHardeningNeeded",
        ),
        (TcbStatus::OutOfDate, "OutOfDate"),
        (
            TcbStatus::OutOfDateConfigurationNeeded,
            "OutOfDateConfigurationNeeded",
        ),
        (TcbStatus::TdRelaunchAdvised, "TDRelaunchAdvised"),
        (
            TcbStatus::TdRelaunchAdvisedConfigurationNeeded,
            "TDRelaunchAdvisedConfigurationNeeded",
        ),
        (TcbStatus::Revoked, "Revoked"),
    ];

    fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(s, _)| *s == self)
            .map_or("?", |(_, n)| n)
    }

    fn from_dcap(status: dcap_qvl::tcb_info::TcbStatus) -> Self {
        use dcap_qvl::tcb_info::TcbStatus as D;
        match status {
            D::UpToDate => TcbStatus::UpToDate,
            D::SWHardeningNeeded => TcbStatus::SWHardeningNeeded,
            D::ConfigurationNeeded => TcbStatus::ConfigurationNeeded,
            D::ConfigurationAndSWHardeningNeeded => TcbStatus::ConfigurationAndSWHardeningNeeded,
            D::OutOfDate => TcbStatus::OutOfDate,
            D::OutOfDateConfigurationNeeded => TcbStatus::OutOfDateConfigurationNeeded,
            D::TDRelaunchAdvised => TcbStatus::TdRelaunchAdvised,
            D::TDRelaunchAdvisedConfigurationNeeded => {
                TcbStatus::TdRelaunchAdvisedConfigurationNeeded
            }
            D::Revoked => TcbStatus::Revoked,
        }
    }
}

/// The name of a TCB status that is not one of Intel's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown TCB status {0:?}")]
pub struct UnknownTcbStatus(pub String);

// Read in Intel's spelling (`UpToDate`, `SWHardeningNeeded`, `TDRelaunchAdvised`, …).
display_and_parse_by_name!(TcbStatus, UnknownTcbStatus, TcbStatus::ALL.map(|(s, _)| s));

/// What a TDX quote must meet besides its signatures and collateral.
///
/// The default accepts the TCB statuses `UpToDate` and `SWHardeningNeeded`, refuses debug
/// and every TD attribute that weakens isolation, requires SEPT_VE_DISABLE, and requires
/// reference values for MRTD and RTMR 0 to 2 (the caller adds them from its measurements
/// file): a quote is refused while one is missing, unless
/// [`TdxPolicy::insecure_no_launch_measurement`] is set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TdxPolicy {
    /// The TCB statuses accepted. `SWHardeningNeeded` is in the default: the platform's TCB
    /// is current, and the advisories it names are mitigated by the TD's own kernel, which
    /// the RTMRs measure. `Revoked` is refused even when listed.
    pub accepted_tcb_statuses: Vec<TcbStatus>,
    /// The Intel advisory IDs (`INTEL-SA-…`) accepted with a TCB status other than
    /// `UpToDate`: every advisory the collateral names for the platform's TCB level must be
    /// listed, or the quote is refused. Empty by default, so `SWHardeningNeeded` passes only
    /// for advisories the operator has judged mitigated inside the TD.
    pub accepted_advisory_ids: Vec<String>,
    /// Expected MRTD (the TD firmware's measurement); required.
    pub mrtd: Option<Reference<48>>,
    /// Expected RTMR0 to RTMR3; RTMR 0 to 2 are required, RTMR 3 is compared when set.
    pub rtmrs: [Option<Reference<48>>; 4],
    /// **Insecure**: with MRTD or one of RTMR 0 to 2 unset, accept any value there (a
    /// warning is logged and recorded on every verification).
    pub insecure_no_launch_measurement: Option<InsecureNoLaunchMeasurement>,
    /// Require the TD attribute SEPT_VE_DISABLE. On by default: a TD whose own kernel
    /// takes #VE exceptions on private memory cannot run safely without it. Off only for
    /// a platform whose TD is a paravisor that handles them itself (Azure,
    /// [`crate::tpm::CvmAkTrust::azure_tdx`]).
    pub require_sept_ve_disable: bool,
    /// Expected MRCONFIGID.
    pub mr_config_id: Option<Reference<48>>,
    /// Expected MROWNER.
    pub mr_owner: Option<Reference<48>>,
    /// Expected MROWNERCONFIG.
    pub mr_owner_config: Option<Reference<48>>,
    /// Expected XFAM (the CPU extended features the TD may use).
    pub xfam: Option<Reference<8>>,
}

impl Default for TdxPolicy {
    fn default() -> Self {
        Self {
            accepted_tcb_statuses: vec![TcbStatus::UpToDate, TcbStatus::SWHardeningNeeded],
            accepted_advisory_ids: Vec::new(),
            mrtd: None,
            rtmrs: [None; 4],
            insecure_no_launch_measurement: None,
            require_sept_ve_disable: true,
            mr_config_id: None,
            mr_owner: None,
            mr_owner_config: None,
            xfam: None,
        }
    }
}

/// A TDX quote whose signatures, chain, collateral and policy checks all passed. Only
/// [`TdxVerifier`] makes one.
#[derive(Debug, Clone)]
pub struct VerifiedTdQuote {
    version: u16,
    report: TdReport,
    tcb_status: TcbStatus,
    advisory_ids: Vec<String>,
    fmspc: [u8; 6],
    explanation: Explanation,
}

impl VerifiedTdQuote {
    /// The quote version (4 or 5).
    pub fn version(&self) -> u16 {
        self.version
    }

    /// The TD report, every field.
    pub fn report(&self) -> &TdReport {
        &self.report
    }

    /// MRTD.
    pub fn mr_td(&self) -> &[u8; 48] {
        &self.report.mr_td
    }

    /// RTMR `i` (0 to 3).
    pub fn rtmr(&self, i: usize) -> Option<&[u8; 48]> {
        self.report.rtmr.get(i)
    }

    /// REPORT_DATA, equal to what the caller expected.
    pub fn report_data(&self) -> &[u8; 64] {
        &self.report.report_data
    }

    /// The platform's TCB status.
    pub fn tcb_status(&self) -> TcbStatus {
        self.tcb_status
    }

    /// The Intel security advisories (`INTEL-SA-…`) that apply to the platform's TCB level.
    pub fn advisory_ids(&self) -> &[String] {
        &self.advisory_ids
    }

    /// The platform's FMSPC, from its PCK certificate.
    pub fn fmspc(&self) -> &[u8; 6] {
        &self.fmspc
    }

    /// Every check that ran, in order.
    pub fn explanation(&self) -> &Explanation {
        &self.explanation
    }
}

/// What step 5 established for one platform and collateral, kept for repeat quotes.
#[derive(Debug, Clone)]
struct Collateral {
    tcb_status: TcbStatus,
    advisory_ids: Vec<String>,
    fmspc: [u8; 6],
    /// Everything checked is valid from `valid_from` to `valid_until` (unix seconds): the
    /// latest issue date and the earliest expiry over certificates, CRLs, TCB info and QE
    /// identity.
    valid_from: u64,
    valid_until: u64,
}

struct CacheEntry {
    collateral_digest: [u8; 32],
    /// The exact quote bytes step 5 depends on (see [`TdQuote`]'s chain inputs).
    inputs: Vec<u8>,
    outcome: Collateral,
}

/// How many platforms' collateral outcomes the verifier remembers.
const CACHE_ENTRIES: usize = 64;

/// Verifies TDX quotes against a [`TdxPolicy`] and collateral the caller passes in.
///
/// Keeps, per exact collateral and exact quote signature data (attestation key, QE report
/// and its signature, PCK chain) and TDX module fields, the outcome of the collateral
/// checks with the window in which all of it is valid. A repeat quote matching an entry at
/// a time inside its window skips those checks; any other input, or any other time, runs
/// them in full.
pub struct TdxVerifier {
    policy: TdxPolicy,
    cache: Mutex<Vec<CacheEntry>>,
    crls: Option<Arc<CrlBundle>>,
}

impl fmt::Debug for TdxVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TdxVerifier")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl TdxVerifier {
    /// A verifier enforcing `policy`, rooted at Intel's SGX Root CA.
    pub fn new(policy: TdxPolicy) -> Self {
        Self {
            policy,
            cache: Mutex::new(Vec::new()),
            crls: None,
        }
    }

    /// Also checks the quote's PCK certificate against its PCK CA's CRLs, and the PCK CA
    /// against the Intel SGX Root CA's, from `crls`, on every verification and in addition
    /// to the CRLs of the collateral: a quote is refused when either is revoked, or when
    /// the bundle has no verified, current CRL of the issuer ([`crate::revocation`]). Lets
    /// an operator apply a newer revocation list than the collateral carries.
    #[must_use]
    pub fn with_crls(mut self, crls: Arc<CrlBundle>) -> Self {
        self.crls = Some(crls);
        self
    }

    /// The CRL bundle this verifier checks the PCK chain against, if any.
    pub fn crls(&self) -> Option<&Arc<CrlBundle>> {
        self.crls.as_ref()
    }

    /// The policy this verifier enforces.
    pub fn policy(&self) -> &TdxPolicy {
        &self.policy
    }

    /// Verifies `quote` with `collateral` at time `now`, expecting `expected_report_data`.
    pub fn verify(
        &self,
        quote: &[u8],
        collateral: &TdxCollateral,
        expected_report_data: &[u8; 64],
        now: SystemTime,
    ) -> Result<VerifiedTdQuote, ValidationError> {
        let mut explanation = Explanation::default();
        let result = self.run(
            &self.policy,
            quote,
            collateral,
            expected_report_data,
            now,
            &mut explanation,
        );
        Self::finish(result, explanation)
    }

    /// As [`TdxVerifier::verify`], also returning every check that ran, pass or fail.
    pub fn verify_explained(
        &self,
        quote: &[u8],
        collateral: &TdxCollateral,
        expected_report_data: &[u8; 64],
        now: SystemTime,
    ) -> (Explanation, Result<VerifiedTdQuote, ValidationError>) {
        self.verify_explained_with(&self.policy, quote, collateral, expected_report_data, now)
    }

    /// As [`TdxVerifier::verify_explained`], enforcing `policy` instead of the verifier's
    /// own: for reference values that change while the verifier lives (a reloaded
    /// measurements file). Cached collateral stays valid; it does not depend on the policy.
    pub fn verify_explained_with(
        &self,
        policy: &TdxPolicy,
        quote: &[u8],
        collateral: &TdxCollateral,
        expected_report_data: &[u8; 64],
        now: SystemTime,
    ) -> (Explanation, Result<VerifiedTdQuote, ValidationError>) {
        let mut explanation = Explanation::default();
        let result = self.run(
            policy,
            quote,
            collateral,
            expected_report_data,
            now,
            &mut explanation,
        );
        (explanation.clone(), Self::finish(result, explanation))
    }

    fn finish(
        result: Result<(u16, TdReport, Collateral), ValidationError>,
        explanation: Explanation,
    ) -> Result<VerifiedTdQuote, ValidationError> {
        match result {
            Ok((version, report, outcome)) => Ok(VerifiedTdQuote {
                version,
                report,
                tcb_status: outcome.tcb_status,
                advisory_ids: outcome.advisory_ids,
                fmspc: outcome.fmspc,
                explanation,
            }),
            Err(e) => {
                tracing::warn!(error = %e, "TDX quote refused");
                Err(e)
            }
        }
    }

    fn run(
        &self,
        policy: &TdxPolicy,
        raw: &[u8],
        collateral: &TdxCollateral,
        expected_report_data: &[u8; 64],
        now: SystemTime,
        ex: &mut Explanation,
    ) -> Result<(u16, TdReport, Collateral), ValidationError> {
        let now_secs = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_err(|_| ValidationError::Policy("verification time is before 1970".into()))?
            .as_secs();
        let quote = TdQuote::parse(raw).inspect_err(|e| {
            ex.push(Check::new(
                "quote",
                "a TDX quote, version 4 or 5, exact sizes",
                e.to_string(),
                Outcome::Fail,
            ));
        })?;

        // The order bounds what a forgery costs: the quote's own signature holds for a
        // forger who signs with a key of their own, so first the QE report's binding of
        // that key (one SHA-256), then the QE report's PCK signature when these bytes were
        // not verified before, and only then the quote's signature: a forgery fails at the
        // first check it cannot pass, after at most one P-256 verification.
        let mut want = [0u8; 64];
        let digest = crate::sha::sha256_parts([quote.attestation_key(), quote.qe_auth_data()]);
        if let Some(dst) = want.get_mut(..32) {
            dst.copy_from_slice(&digest);
        }
        let observed = quote::qe_report_data(quote.qe_report());
        let bound = observed == want;
        ex.push(Check::pass_if(
            bound,
            "qe_report.report_data",
            crate::explain::lower_hex(&want),
            crate::explain::lower_hex(&observed),
        ));
        if !bound {
            return Err(ValidationError::BadSignature(
                "TDX quote: the QE report does not bind the attestation key".into(),
            ));
        }

        let cached = self.cached(&quote, collateral, now_secs);
        if cached.is_some() {
            // The QE report, its signature and the PCK chain are byte for byte those
            // verified when the entry was made.
            ex.push(Check::new(
                "qe_report.signature",
                "ECDSA P-256 by the PCK",
                "verifies (identical bytes verified before)",
                Outcome::Pass,
            ));
        } else {
            let pck_chain = chain::pem_chain(quote.pck_chain_pem(), "PCK").inspect_err(|e| {
                ex.push(Check::new(
                    "pck_chain",
                    "PEM certificates",
                    e.to_string(),
                    Outcome::Fail,
                ));
            })?;
            let leaf = pck_chain
                .first()
                .ok_or_else(|| chain::cert_error("PCK", "empty chain"))?;
            let qe_sig = chain::verify_qe_report_signature(
                leaf,
                quote.qe_report(),
                quote.qe_report_signature(),
            );
            ex.push(Check::pass_if(
                qe_sig.is_ok(),
                "qe_report.signature",
                "ECDSA P-256 by the PCK",
                if qe_sig.is_ok() {
                    "verifies"
                } else {
                    "does not verify"
                },
            ));
            qe_sig?;
        }

        let key = {
            let mut k = [0u8; 65];
            k[0] = 0x04;
            if let Some(dst) = k.get_mut(1..) {
                dst.copy_from_slice(quote.attestation_key());
            }
            k
        };
        let quote_sig_ok = ring::signature::UnparsedPublicKey::new(
            &ring::signature::ECDSA_P256_SHA256_FIXED,
            &key,
        )
        .verify(quote.signed(), quote.signature())
        .is_ok();
        ex.push(Check::pass_if(
            quote_sig_ok,
            "quote.signature",
            "ECDSA P-256 by the attestation key over header and TD report",
            if quote_sig_ok {
                "verifies"
            } else {
                "does not verify"
            },
        ));
        if !quote_sig_ok {
            return Err(ValidationError::BadSignature(
                "TDX quote: the attestation key's signature over the TD report does not verify"
                    .into(),
            ));
        }

        let outcome = match cached {
            Some(outcome) => {
                for field in ["pck_chain", "crls", "tcb_info", "qe_identity"] {
                    ex.push(Check::new(
                        field,
                        "valid, chaining to the Intel SGX Root CA",
                        format!(
                            "verified before for these exact inputs; valid until {}",
                            outcome.valid_until
                        ),
                        Outcome::Pass,
                    ));
                }
                outcome
            }
            None => {
                let outcome = verify_collateral(raw, &quote, collateral, now_secs, ex)?;
                self.remember(&quote, collateral, &outcome);
                outcome
            }
        };

        if let Some(crls) = &self.crls {
            // The chain was verified to Intel's root above (now or for these exact bytes
            // before): PCK ← PCK CA ← root. The root's key is the embedded one.
            let pck_chain = chain::pem_chain(quote.pck_chain_pem(), "PCK")?;
            let (Some(pck), Some(pck_ca)) = (pck_chain.first(), pck_chain.get(1)) else {
                return Err(chain::cert_error(
                    "PCK",
                    "the quote's chain has no PCK CA certificate",
                ));
            };
            let now = i64::try_from(now_secs).unwrap_or(i64::MAX);
            crls.check("PCK", pck, pck_ca, now, ex)?;
            crls.check("PCK CA", pck_ca, chain::INTEL_SGX_ROOT_CA, now, ex)?;
        }

        check_fields(
            policy,
            quote.report(),
            outcome.tcb_status,
            &outcome.advisory_ids,
            expected_report_data,
            ex,
        )?;
        Ok((quote.version(), quote.report().clone(), outcome))
    }

    /// The FMSPC of the platform that made `quote`, when a quote with the same signature
    /// data (so the same PCK certificate) passed the collateral checks before: read from
    /// that verified certificate, without parsing the quote's again. Only a hint for
    /// choosing collateral; it vouches for nothing.
    pub(crate) fn known_fmspc(&self, quote: &[u8]) -> Option<[u8; 6]> {
        let quote = TdQuote::parse(quote).ok()?;
        let cache = self.cache.lock().ok()?;
        cache
            .iter()
            .find(|e| same_inputs(&e.inputs, &quote))
            .map(|e| e.outcome.fmspc)
    }

    fn cached(
        &self,
        quote: &TdQuote<'_>,
        collateral: &TdxCollateral,
        now: u64,
    ) -> Option<Collateral> {
        let cache = self.cache.lock().ok()?;
        cache
            .iter()
            .find(|e| e.collateral_digest == collateral.digest && same_inputs(&e.inputs, quote))
            .map(|e| e.outcome.clone())
            .filter(|o| o.valid_from <= now && now <= o.valid_until)
    }

    fn remember(&self, quote: &TdQuote<'_>, collateral: &TdxCollateral, outcome: &Collateral) {
        let Ok(mut cache) = self.cache.lock() else {
            return;
        };
        cache.retain(|e| {
            !(e.collateral_digest == collateral.digest && same_inputs(&e.inputs, quote))
        });
        if cache.len() >= CACHE_ENTRIES {
            cache.remove(0);
        }
        cache.push(CacheEntry {
            collateral_digest: collateral.digest,
            inputs: quote.chain_inputs().concat(),
            outcome: outcome.clone(),
        });
    }
}

fn same_inputs(stored: &[u8], quote: &TdQuote<'_>) -> bool {
    let mut rest = stored;
    for part in quote.chain_inputs() {
        match rest.split_at_checked(part.len()) {
            Some((head, tail)) if head == *part => rest = tail,
            _ => return false,
        }
    }
    rest.is_empty()
}

/// Step 5: the PCK chain, CRLs, TCB info and QE identity, by `dcap-qvl`. Its attribute
/// checks on the TD are left to ours, which run on every quote, cached or not.
fn verify_collateral(
    raw: &[u8],
    quote: &TdQuote<'_>,
    collateral: &TdxCollateral,
    now: u64,
    ex: &mut Explanation,
) -> Result<Collateral, ValidationError> {
    let verifier =
        dcap_qvl::verify::QuoteVerifier::new(chain::INTEL_SGX_ROOT_CA.to_vec()).allow_debug(true);
    let claims = verifier.verify_with_policy(raw, collateral.inner.clone(), now, &AcceptAll);
    let claims = match claims {
        Ok(claims) => claims,
        Err(e) => {
            let error = map_dcap_error(&e, quote, collateral, now);
            let (field, reason) = match &error {
                ValidationError::Certificate { which, reason } => (which.clone(), reason.clone()),
                other => ("collateral".to_string(), other.to_string()),
            };
            ex.push(Check::new(
                field,
                "valid, chaining to the Intel SGX Root CA",
                reason,
                Outcome::Fail,
            ));
            return Err(error);
        }
    };
    let window = format!(
        "valid from {} to {} (unix time)",
        claims.latest_issue_date, claims.earliest_expiration_date
    );
    for field in ["pck_chain", "crls", "tcb_info", "qe_identity"] {
        ex.push(Check::new(
            field,
            "valid, chaining to the Intel SGX Root CA",
            window.clone(),
            Outcome::Pass,
        ));
    }
    Ok(Collateral {
        tcb_status: TcbStatus::from_dcap(claims.tcb.status),
        advisory_ids: claims.tcb.advisory_ids,
        fmspc: claims.platform.pck.fmspc,
        valid_from: claims.latest_issue_date,
        valid_until: claims.earliest_expiration_date,
    })
}

/// Accepts whatever `dcap-qvl` verified: the TCB status policy is ours.
struct AcceptAll;

impl dcap_qvl::Policy for AcceptAll {
    fn validate(&self, _: &dcap_qvl::QuoteClaims) -> anyhow::Result<()> {
        Ok(())
    }
}

/// Names the collateral item behind a `dcap-qvl` error, from its message and, for chain
/// failures, by checking each chain again.
fn map_dcap_error(
    e: &anyhow::Error,
    quote: &TdQuote<'_>,
    collateral: &TdxCollateral,
    now: u64,
) -> ValidationError {
    let msg = format!("{e:#}");
    let lower = msg.to_ascii_lowercase();
    let has = |s: &str| lower.contains(s);
    if has("certificate chain") || has("crl") || has("revocation") || has("root ca") {
        let pck = chain::pem_chain(quote.pck_chain_pem(), "PCK").unwrap_or_default();
        let time = UnixTime::since_unix_epoch(std::time::Duration::from_secs(now));
        if let Some(found) = chain::diagnose_chains(&pck, collateral, time) {
            return found;
        }
    }
    let which = if has("tcbinfo") || has("tcb info") || has("tcb_info") {
        "TCB info"
    } else if has("qeidentity")
        || has("qe identity")
        || has("qe_identity")
        || has("qe mrsigner")
        || has("qe isvprodid")
        || has("qe miscselect")
        || has("qe attributes")
        || has("qe report validation")
        || has("qe tcb")
    {
        "QE identity"
    } else if has("crl") {
        "CRL"
    } else if has("tcb level") || has("fmspc") || has("tdx module") {
        "TCB info (platform match)"
    } else if has("tcb status") && has("revoked") {
        return ValidationError::Field {
            field: "tcb_status".into(),
            expected: "not Revoked".into(),
            observed: "Revoked".into(),
        };
    } else if has("pck") {
        "PCK"
    } else {
        "collateral"
    };
    chain::cert_error(which, msg)
}

/// TD attribute bits (TDX module ABI, TDATTRIBUTES).
mod attr {
    pub const DEBUG: u64 = 1 << 0;
    /// TUD bits 4 to 6: performance profiling and the like, which expose TD state.
    pub const TUD_PROFILING: u64 = 0b0111_0000;
    pub const SERVTD_EXT: u64 = 1 << 17;
    pub const SEPT_VE_DISABLE: u64 = 1 << 28;
    pub const MIGRATABLE: u64 = 1 << 29;
    /// Bits the TDX 1.5 ABI reserves (must be zero): 1–3, 7–15, 23–26, 32–61.
    pub const RESERVED: u64 = 0b1110 | (0x1ff << 7) | (0b1111 << 23) | (((1u64 << 30) - 1) << 32);
}

/// The RTMRs' field names, as checks record them.
const RTMR_FIELDS: [&str; 4] = ["rtmr0", "rtmr1", "rtmr2", "rtmr3"];

/// The field checks of a TD report whose signatures and collateral verified: TCB status,
/// TD attributes, reference values and REPORT_DATA. Every check runs and is recorded; the
/// first failure is returned.
///
/// TD attributes: DEBUG and the other TD-under-debug bits are always refused (the host
/// could read the TD's memory and registers); SEPT_VE_DISABLE must be set when the policy
/// requires it (without it the host can inject #VE exceptions by unmapping private pages);
/// a migratable TD, service-TD extension and reserved bits are refused. ICSSD, LASS, PKS, KL, TPA and PERFMON are
/// features the TD may use and are accepted.
pub fn check_fields(
    policy: &TdxPolicy,
    report: &TdReport,
    tcb_status: TcbStatus,
    advisory_ids: &[String],
    expected_report_data: &[u8; 64],
    ex: &mut Explanation,
) -> Result<(), ValidationError> {
    let start = ex.checks.len();

    let accepted =
        tcb_status != TcbStatus::Revoked && policy.accepted_tcb_statuses.contains(&tcb_status);
    let names: Vec<String> = policy
        .accepted_tcb_statuses
        .iter()
        .map(ToString::to_string)
        .collect();
    let observed = if advisory_ids.is_empty() {
        tcb_status.to_string()
    } else {
        format!("{tcb_status} ({})", advisory_ids.join(", "))
    };
    ex.push(Check::pass_if(
        accepted,
        "tcb_status",
        format!("one of {}", names.join(", ")),
        observed,
    ));
    // A status other than UpToDate is acceptable only for advisories the operator has
    // judged mitigated inside the TD; each one must be listed.
    if tcb_status != TcbStatus::UpToDate && !advisory_ids.is_empty() {
        let unlisted: Vec<&str> = advisory_ids
            .iter()
            .filter(|id| !policy.accepted_advisory_ids.contains(id))
            .map(String::as_str)
            .collect();
        ex.push(Check::pass_if(
            unlisted.is_empty(),
            "advisory_ids",
            if policy.accepted_advisory_ids.is_empty() {
                "none (no advisory is accepted)".to_owned()
            } else {
                format!("among {}", policy.accepted_advisory_ids.join(", "))
            },
            advisory_ids.join(", "),
        ));
    }

    let bits = report.td_attributes_bits();
    let flag = |field: &'static str, mask: u64, want_set: bool| {
        let set = bits & mask != 0;
        Check::pass_if(
            set == want_set,
            field,
            if want_set { "set" } else { "clear" },
            if set { "set" } else { "clear" },
        )
    };
    ex.push(flag("td_attributes.debug", attr::DEBUG, false));
    ex.push(flag(
        "td_attributes.tud_profiling",
        attr::TUD_PROFILING,
        false,
    ));
    if policy.require_sept_ve_disable {
        ex.push(flag(
            "td_attributes.sept_ve_disable",
            attr::SEPT_VE_DISABLE,
            true,
        ));
    } else {
        ex.push(Check::pass_if(
            true,
            "td_attributes.sept_ve_disable",
            "set or clear (the platform's paravisor handles #VE)",
            if bits & attr::SEPT_VE_DISABLE != 0 {
                "set"
            } else {
                "clear"
            },
        ));
    }
    ex.push(flag("td_attributes.migratable", attr::MIGRATABLE, false));
    ex.push(flag("td_attributes.servtd_ext", attr::SERVTD_EXT, false));
    ex.push(Check::pass_if(
        bits & attr::RESERVED == 0,
        "td_attributes.reserved",
        "0",
        format!("{:#018x}", bits & attr::RESERVED),
    ));
    if let Some(mr_service_td) = &report.mr_service_td {
        ex.push(Check::pass_if(
            mr_service_td.iter().all(|&b| b == 0),
            "mr_service_td",
            "zero (no service TD)",
            lower_hex(mr_service_td),
        ));
    }

    let insecure = policy.insecure_no_launch_measurement.is_some();
    ex.push(reference_check(
        policy.mrtd.as_ref(),
        "mr_td",
        &report.mr_td,
        Required::Yes { insecure },
    ));
    for (i, (want, got)) in policy.rtmrs.iter().zip(&report.rtmr).enumerate() {
        let required = if i < REQUIRED_RTMRS {
            Required::Yes { insecure }
        } else {
            Required::No
        };
        ex.push(reference_check(
            want.as_ref(),
            RTMR_FIELDS.get(i).copied().unwrap_or("rtmr"),
            got,
            required,
        ));
    }
    let optional: [(&Option<Reference<48>>, &str, &[u8; 48]); 3] = [
        (&policy.mr_config_id, "mr_config_id", &report.mr_config_id),
        (&policy.mr_owner, "mr_owner", &report.mr_owner),
        (
            &policy.mr_owner_config,
            "mr_owner_config",
            &report.mr_owner_config,
        ),
    ];
    for (want, field, got) in optional {
        if let Some(want) = want {
            ex.push(want.check(field, got));
        }
    }
    if let Some(xfam) = &policy.xfam {
        ex.push(xfam.check("xfam", &report.xfam));
    }

    let bound = bool::from(report.report_data.ct_eq(expected_report_data));
    ex.push(Check::pass_if(
        bound,
        "report_data",
        "the binding computed for this session",
        if bound { "matches" } else { "differs" },
    ));

    let first = ex
        .checks
        .get(start..)
        .and_then(|new| new.iter().find(|c| c.outcome == Outcome::Fail));
    match first {
        None => Ok(()),
        Some(c) if c.field == "report_data" => Err(ValidationError::BindingMismatch),
        Some(c) => Err(ValidationError::from(c)),
    }
}

/// A reference value check, or the observed value recorded as unpinned.
/// RTMR 0 to 2 (firmware configuration, boot loader and kernel, as TDVF and the boot chain
/// extend them) must have reference values; RTMR 3 is left to the platform.
pub const REQUIRED_RTMRS: usize = 3;

/// Whether a reference value must be set, and whether its absence was allowed.
#[derive(Clone, Copy)]
enum Required {
    Yes { insecure: bool },
    No,
}

fn reference_check(
    want: Option<&Reference<48>>,
    field: &'static str,
    got: &[u8; 48],
    required: Required,
) -> Check {
    match (want, required) {
        (Some(want), _) => want.check(field, got),
        (None, Required::No) => Check::new(
            field,
            "any (no reference value)",
            lower_hex(got),
            Outcome::Pass,
        ),
        (None, Required::Yes { insecure: true }) => {
            tracing::warn!(
                field,
                value = %lower_hex(got),
                "insecure_no_launch_measurement: accepting a TDX measurement that no \
                 reference value pins"
            );
            Check::new(
                field,
                "no reference configured (insecure_no_launch_measurement)",
                lower_hex(got),
                Outcome::Warn,
            )
        }
        (None, Required::Yes { insecure: false }) => Check::new(
            field,
            "a reference value (none is configured)",
            lower_hex(got),
            Outcome::Fail,
        ),
    }
}

//! AK trust rooted in a confidential VM's hardware report: the vTPM's attestation key is
//! vouched for by the CPU vendor's signature over the VM's launch state, as the clouds ship
//! it (docs/attestation.md, "Confidential VMs").
//!
//! * **Azure SEV-SNP**: the evidence carries the HCL report (SNP report + runtime data) and
//!   the VCEK with its ASK. The SNP report must verify to an AMD root; its REPORT_DATA must
//!   be SHA-256 of the runtime data; the runtime data's `HCLAkPub` must be the AK.
//! * **Azure TDX**: the evidence carries the DCAP quote over the TD report and the runtime
//!   data. The quote must verify against Intel's root with collateral passed in; its
//!   REPORT_DATA must be SHA-256 of the runtime data; the runtime data's AK must be the AK.
//! * **AWS SEV-SNP**: the evidence carries the SNP report and the VLEK with its ASVK; the
//!   report's REPORT_DATA must be SHA-512 of the AK's SubjectPublicKeyInfo.
//!
//! The hardware report binds the AK, not the session: the session is bound by the TPM
//! quote the AK signs (its qualifying data), checked by the quote validator as for every
//! other AK. The chain is therefore hardware → AK → PCRs → session.

use super::evidence::PlatformKind;
use crate::ValidationError;
use crate::explain::Reference;
use crate::explain::{Check, Explanation};
use crate::hcl::{self, HardwareKind, HardwareReport, HclReport, RuntimeData};
use crate::measurements::{CvmReferences, InsecureNoLaunchMeasurement, MeasurementMode};
use crate::memo::ExactMemo;
use crate::revocation::CrlBundle;
use crate::snp::{SignerKind, SnpCerts, SnpPolicy, SnpVerifier};
use crate::tdx::{TdxCollateral, TdxPolicy, TdxVerifier};
use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

/// Most TDX collateral sets (one per platform FMSPC) a verifier holds.
pub const MAX_TDX_COLLATERAL_SETS: usize = 64;

/// The clouds' bindings of a vTPM AK to a hardware report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CvmPlatform {
    /// Azure confidential VM on AMD SEV-SNP (HCL report, VCEK).
    AzureSevSnp,
    /// Azure confidential VM on Intel TDX (DCAP quote over the HCL's TD report).
    AzureTdx,
    /// AWS instance with AMD SEV-SNP (report bound to the AK, VLEK).
    AwsSevSnp,
}

impl CvmPlatform {
    /// Every platform, for help texts.
    pub const ALL: [CvmPlatform; 3] = [Self::AzureSevSnp, Self::AzureTdx, Self::AwsSevSnp];

    /// The name used on command lines and in the evidence (`azure-sev-snp`, …).
    pub fn name(self) -> &'static str {
        match self {
            Self::AzureSevSnp => "azure-sev-snp",
            Self::AzureTdx => "azure-tdx",
            Self::AwsSevSnp => "aws-sev-snp",
        }
    }

    /// The only key that may sign this platform's SEV-SNP reports: Azure's hosts sign with
    /// their chips' VCEKs, AWS signs with the VLEK AMD issued to it. `None` for TDX.
    pub fn snp_signer(self) -> Option<SignerKind> {
        match self {
            Self::AzureSevSnp => Some(SignerKind::Vcek),
            Self::AwsSevSnp => Some(SignerKind::Vlek),
            Self::AzureTdx => None,
        }
    }

    fn of(kind: &PlatformKind) -> Self {
        match kind {
            PlatformKind::AzureSevSnp(_) => Self::AzureSevSnp,
            PlatformKind::AzureTdx(_) => Self::AzureTdx,
            PlatformKind::AwsSevSnp(_) => Self::AwsSevSnp,
        }
    }
}

/// A platform name that is none of [`CvmPlatform::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown confidential-VM platform {0:?}; known: azure-sev-snp, azure-tdx, aws-sev-snp")]
pub struct UnknownPlatform(pub String);

display_and_parse_by_name!(CvmPlatform, UnknownPlatform, CvmPlatform::ALL);

/// Why a [`CvmAkTrust`] could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CvmTrustError {
    /// [`CvmAkTrust::sev_snp`] was asked for a platform that is not SEV-SNP.
    #[error("{0} is not an SEV-SNP platform")]
    NotSevSnp(CvmPlatform),
    /// The policy refuses the only signer the platform uses.
    #[error("{platform} reports are signed by a {signer} only, and the policy refuses that signer")]
    SignerRefused {
        /// The platform.
        platform: CvmPlatform,
        /// Its signer.
        signer: SignerKind,
    },
}

/// The reference values a confidential-VM verifier requires and the measurements lack
/// ([`CvmAkTrust::require_references`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{platform} needs enforced reference values for {}; set them in the measurements file \
     (docs/attestation.md), or accept any launch with --insecure-no-launch-measurement",
    .missing.join(", ")
)]
pub struct MissingReferences {
    /// The platform.
    pub platform: CvmPlatform,
    /// The missing values, named as in the measurements file (`snp.launchMeasurement`,
    /// `tdx.mrtd`, `tdx.rtmr0`, …).
    pub missing: Vec<&'static str>,
}

/// TDX collateral passed in by the operator (an offline bundle), one set per platform
/// FMSPC. Verification never fetches any.
#[derive(Debug, Clone, Default)]
pub struct TdxCollateralSet(Vec<(String, TdxCollateral)>);

impl TdxCollateralSet {
    /// A set of collateral, keeping for each FMSPC only the newest TCB info
    /// ([`TdxCollateral::freshness`]: the highest TCB evaluation number, then the latest
    /// issue date), so that an older bundle left beside a newer one cannot decide (a
    /// platform Intel has since marked out of date would pass under the older one). If the
    /// newest does not verify, the quote is refused; there is no falling back to an older
    /// one. Refuses a set whose FMSPC or freshness cannot be read, and more than
    /// [`MAX_TDX_COLLATERAL_SETS`].
    pub fn new(sets: Vec<TdxCollateral>) -> Result<Self, ValidationError> {
        if sets.len() > MAX_TDX_COLLATERAL_SETS {
            return Err(ValidationError::Malformed(format!(
                "{} TDX collateral sets, at most {MAX_TDX_COLLATERAL_SETS}",
                sets.len()
            )));
        }
        let mut newest: Vec<(String, (u64, String), TdxCollateral)> = Vec::new();
        for (index, collateral) in sets.into_iter().enumerate() {
            let unreadable = |what: &str| {
                ValidationError::Malformed(format!(
                    "TDX collateral set #{index}: its TCB info has no readable {what}"
                ))
            };
            let fmspc = collateral
                .fmspc()
                .ok_or_else(|| unreadable("fmspc"))?
                .to_ascii_uppercase();
            let fresh = collateral
                .freshness()
                .ok_or_else(|| unreadable("tcbEvaluationDataNumber and issueDate"))?;
            match newest.iter_mut().find(|(f, _, _)| *f == fmspc) {
                Some(kept) if kept.1 >= fresh => {}
                Some(kept) => *kept = (fmspc, fresh, collateral),
                None => newest.push((fmspc, fresh, collateral)),
            }
        }
        Ok(Self(newest.into_iter().map(|(f, _, c)| (f, c)).collect()))
    }

    /// Number of sets.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// How a verifier trusts AKs on confidential VMs of one platform; an [`super::AkTrust`]
/// mode ([`super::AkTrust::confidential_vm`]).
pub struct CvmAkTrust {
    platform: CvmPlatform,
    insecure_no_launch_measurement: Option<InsecureNoLaunchMeasurement>,
    snp: SnpVerifier,
    tdx: TdxVerifier,
    tdx_collateral: TdxCollateralSet,
    crls: Option<Arc<CrlBundle>>,
    runtime_data: RuntimeDataMemo,
}

/// The HCL runtime data of recent verified evidence, parsed, with the REPORT_DATA it gives:
/// a vTPM presents the same runtime data on every handshake, and parsing its JSON and
/// hashing it were about an eighth of an Azure verification's CPU.
///
/// Keyed by the exact bytes and filled only after a hardware report bound them (its
/// REPORT_DATA was that digest), so a peer without genuine evidence can neither add nor
/// evict an entry. What is kept is a pure function of the bytes; every verification still
/// compares the bytes in full, checks the hardware report's binding and matches the AK.
/// Runtime data is parsed only once a hardware report has bound it: before that it is only
/// hashed, so a peer's unauthenticated JSON costs one SHA-256 and no parse.
struct RuntimeDataMemo(ExactMemo<(Arc<RuntimeData>, [u8; 64])>);

/// How many nodes' runtime data is kept (about 3 KiB each).
const RUNTIME_DATA_MEMO: usize = 64;

impl Default for RuntimeDataMemo {
    fn default() -> Self {
        Self(ExactMemo::new(RUNTIME_DATA_MEMO))
    }
}

impl RuntimeDataMemo {
    /// The REPORT_DATA that binds `bytes`, and their parse if a hardware report bound these
    /// exact bytes before. Nothing is parsed here: runtime data no hardware report has
    /// vouched for is only hashed.
    fn lookup(&self, bytes: &[u8]) -> ([u8; 64], Option<Arc<RuntimeData>>) {
        match self.0.get(bytes) {
            Some((parsed, report_data)) => (report_data, Some(parsed)),
            None => (hcl::runtime_data_report_data(bytes), None),
        }
    }

    /// The parse of `bytes`, which a hardware report has just bound to `report_data`: the
    /// one [`Self::lookup`] found, or parsed now and kept (the oldest entry goes first).
    fn bound(
        &self,
        bytes: &[u8],
        report_data: [u8; 64],
        known: Option<Arc<RuntimeData>>,
    ) -> Result<Arc<RuntimeData>, ValidationError> {
        if let Some(parsed) = known {
            return Ok(parsed);
        }
        let parsed = Arc::new(RuntimeData::parse(bytes)?);
        self.0.insert(bytes, (Arc::clone(&parsed), report_data));
        Ok(parsed)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.len()
    }
}

impl fmt::Debug for CvmAkTrust {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CvmAkTrust")
            .field("platform", &self.platform)
            .field("tdx_collateral_sets", &self.tdx_collateral.len())
            .field("crls", &self.crls.as_ref().map(|c| c.len()))
            .field(
                "insecure_no_launch_measurement",
                &self.insecure_no_launch_measurement.is_some(),
            )
            .finish_non_exhaustive()
    }
}

impl CvmAkTrust {
    /// Azure SEV-SNP or AWS SEV-SNP AKs, with the SNP report checked against `policy`.
    /// The launch measurement and host data come from the measurements in force at each
    /// validation (they override the policy's when set there).
    ///
    /// The platform fixes the signer ([`CvmPlatform::snp_signer`]): whatever else `policy`
    /// allows, an Azure report must be VCEK-signed and an AWS report VLEK-signed, so a
    /// report from another cloud's or an attacker's own SEV-SNP host is refused at its
    /// signer. Refused when `policy` does not allow the platform's signer.
    pub fn sev_snp(platform: CvmPlatform, mut policy: SnpPolicy) -> Result<Self, CvmTrustError> {
        let signer = platform
            .snp_signer()
            .ok_or(CvmTrustError::NotSevSnp(platform))?;
        if !policy.allows_signer(signer) {
            return Err(CvmTrustError::SignerRefused { platform, signer });
        }
        policy.allow_vcek = signer == SignerKind::Vcek;
        policy.allow_vlek = signer == SignerKind::Vlek;
        Ok(Self {
            platform,
            insecure_no_launch_measurement: policy.insecure_no_launch_measurement,
            snp: SnpVerifier::new(policy),
            tdx: TdxVerifier::new(TdxPolicy::default()),
            tdx_collateral: TdxCollateralSet::default(),
            crls: None,
            runtime_data: RuntimeDataMemo::default(),
        })
    }

    /// Azure TDX AKs, with the quote checked against `policy` and `collateral`. MRTD and
    /// the RTMRs come from the measurements in force at each validation (they override
    /// the policy's when set there); all four RTMRs are required, as Azure's paravisor
    /// fixes them (it extends none).
    ///
    /// SEPT_VE_DISABLE is not required: on Azure the TD is the paravisor, which runs the
    /// guest as a partitioned L2 VM and handles #VE itself, and Azure launches it with the
    /// attribute clear. What protects the guest is then the paravisor that MRTD pins.
    pub fn azure_tdx(mut policy: TdxPolicy, collateral: TdxCollateralSet) -> Self {
        policy.require_sept_ve_disable = false;
        Self {
            platform: CvmPlatform::AzureTdx,
            insecure_no_launch_measurement: policy.insecure_no_launch_measurement,
            snp: SnpVerifier::new(SnpPolicy::default()),
            tdx: TdxVerifier::new(policy),
            tdx_collateral: collateral,
            crls: None,
            runtime_data: RuntimeDataMemo::default(),
        }
    }

    /// **Insecure**: accept hardware reports whose launch no reference value pins
    /// ([`InsecureNoLaunchMeasurement`]); a warning is logged now and on every verification
    /// that relies on it.
    #[must_use]
    pub fn insecure_no_launch_measurement(mut self, marker: InsecureNoLaunchMeasurement) -> Self {
        tracing::warn!(
            platform = %self.platform,
            "insecure_no_launch_measurement: hardware reports without a reference launch \
             measurement will be accepted"
        );
        self.insecure_no_launch_measurement = Some(marker);
        let mut snp = self.snp.policy().clone();
        snp.insecure_no_launch_measurement = Some(marker);
        self.snp = SnpVerifier::new(snp);
        let mut tdx = self.tdx.policy().clone();
        tdx.insecure_no_launch_measurement = Some(marker);
        self.tdx = TdxVerifier::new(tdx);
        match self.crls.take() {
            Some(crls) => self.with_crls(crls),
            None => self,
        }
    }

    /// Checks certificate revocation against the offline CRL bundle `crls`: the ASK or
    /// ASVK against its ARK's CRLs (SEV-SNP), the PCK and PCK CA against their issuers'
    /// CRLs (TDX, in addition to the collateral's). With a bundle, a report whose chain it
    /// cannot vouch for (no CRL of the issuer, a CRL not signed by it, an expired CRL) is
    /// refused. Without one, SEV-SNP revocation is not checked at all.
    #[must_use]
    pub fn with_crls(mut self, crls: Arc<CrlBundle>) -> Self {
        self.snp = SnpVerifier::new(self.snp.policy().clone()).with_crls(Arc::clone(&crls));
        self.tdx = TdxVerifier::new(self.tdx.policy().clone()).with_crls(Arc::clone(&crls));
        self.crls = Some(crls);
        self
    }

    /// The CRL bundle revocation is checked against, if any.
    pub fn crls(&self) -> Option<&Arc<CrlBundle>> {
        self.crls.as_ref()
    }

    /// The platform this trust is for.
    pub fn platform(&self) -> CvmPlatform {
        self.platform
    }

    /// The SEV-SNP policy in force (its signer narrowed to the platform's); the default
    /// for a TDX trust, which never uses it.
    pub fn snp_policy(&self) -> &SnpPolicy {
        self.snp.policy()
    }

    /// The TDX policy in force; the default for an SEV-SNP trust, which never uses it.
    pub fn tdx_policy(&self) -> &TdxPolicy {
        self.tdx.policy()
    }

    /// The reference values this platform requires that neither `references` nor the
    /// policy sets as enforced, named as in the measurements file. SEV-SNP: the launch
    /// measurement. Azure TDX: MRTD and RTMR 0 to 3 (Azure's paravisor extends no RTMR,
    /// so all four are fixed at launch). A warn-only value counts as missing: it gates
    /// nothing.
    pub fn missing_references(&self, references: &CvmReferences) -> Vec<&'static str> {
        let enforced = |from_file: &Option<Reference<48>>, from_policy: &Option<Reference<48>>| {
            from_file
                .as_ref()
                .or(from_policy.as_ref())
                .is_some_and(|r| r.mode == MeasurementMode::Enforce)
        };
        match self.platform {
            CvmPlatform::AzureSevSnp | CvmPlatform::AwsSevSnp => {
                if enforced(
                    &references.snp_launch_measurement,
                    &self.snp.policy().measurement,
                ) {
                    Vec::new()
                } else {
                    vec!["snp.launchMeasurement"]
                }
            }
            CvmPlatform::AzureTdx => {
                let policy = self.tdx.policy();
                let mut missing = Vec::new();
                if !enforced(&references.tdx_mrtd, &policy.mrtd) {
                    missing.push("tdx.mrtd");
                }
                let names = ["tdx.rtmr0", "tdx.rtmr1", "tdx.rtmr2", "tdx.rtmr3"];
                for ((name, file), set) in names
                    .into_iter()
                    .zip(&references.tdx_rtmrs)
                    .zip(&policy.rtmrs)
                {
                    if !enforced(file, set) {
                        missing.push(name);
                    }
                }
                missing
            }
        }
    }

    /// Refuses `references` when they lack a value the platform requires
    /// ([`Self::missing_references`]), unless this trust was built with
    /// [`Self::insecure_no_launch_measurement`]; then it logs a warning instead. Binaries
    /// call it at start, so that they refuse to run without the values; every
    /// verification calls it again, as the measurements file may change.
    pub fn require_references(&self, references: &CvmReferences) -> Result<(), MissingReferences> {
        let missing = self.missing_references(references);
        if missing.is_empty() {
            return Ok(());
        }
        if self.insecure_no_launch_measurement.is_some() {
            tracing::warn!(
                platform = %self.platform,
                missing = %missing.join(", "),
                "insecure_no_launch_measurement: verifying without these reference values"
            );
            return Ok(());
        }
        Err(MissingReferences {
            platform: self.platform,
            missing,
        })
    }

    /// Checks that the evidence's platform report vouches for the AK `ak_public`
    /// (`TPMT_PUBLIC` bytes as presented). Returns every check that ran, and the verdict.
    pub(crate) fn check(
        &self,
        ak_public: &[u8],
        platform: Option<&PlatformKind>,
        references: &CvmReferences,
        now: SystemTime,
    ) -> (Explanation, Result<(), ValidationError>) {
        let mut explanation = Explanation::default();
        let result = self.run(ak_public, platform, references, now, &mut explanation);
        (explanation, result)
    }

    fn run(
        &self,
        ak_public: &[u8],
        platform: Option<&PlatformKind>,
        references: &CvmReferences,
        now: SystemTime,
        explanation: &mut Explanation,
    ) -> Result<(), ValidationError> {
        if let Err(e) = self.require_references(references) {
            let field = e.missing.first().copied().unwrap_or("launch measurement");
            explanation.push(Check::pass_if(
                false,
                field,
                "an enforced reference value",
                "none configured",
            ));
            return Err(ValidationError::Field {
                field: field.into(),
                expected: "an enforced reference value".into(),
                observed: "none configured".into(),
            });
        }
        let kind = platform.ok_or_else(|| {
            ValidationError::UntrustedKey(format!(
                "the evidence carries no {} hardware report for its AK",
                self.platform
            ))
        })?;
        if CvmPlatform::of(kind) != self.platform {
            return Err(ValidationError::UntrustedKey(format!(
                "the evidence carries a {} hardware report; this verifier trusts {} AKs",
                CvmPlatform::of(kind),
                self.platform
            )));
        }
        match kind {
            PlatformKind::AzureSevSnp(azure) => {
                let hcl = HclReport::parse(&azure.hcl_report)?;
                let HardwareReport::Snp(report) = hcl.hardware_report() else {
                    return Err(ValidationError::Field {
                        field: "hcl_report.report_type".into(),
                        expected: "SEV-SNP".into(),
                        observed: format!("{:?}", HardwareKind::Tdx),
                    });
                };
                let (expected, known) = self.runtime_data.lookup(hcl.runtime_data());
                let certs = snp_certs(&azure.certs)?;
                self.verify_snp(report, &certs, &expected, references, now, explanation)?;
                let runtime = self
                    .runtime_data
                    .bound(hcl.runtime_data(), expected, known)?;
                ak_check(explanation, hcl::hcl_ak_matches(&runtime, ak_public))
            }
            PlatformKind::AwsSevSnp(aws) => {
                let expected = hcl::aws_snp_report_data(ak_public)?;
                let certs = snp_certs(&aws.certs)?;
                self.verify_snp(&aws.report, &certs, &expected, references, now, explanation)?;
                explanation.push(Check::pass_if(
                    true,
                    "ak",
                    "the key whose SHA-512 is report_data",
                    "the quote's AK",
                ));
                Ok(())
            }
            PlatformKind::AzureTdx(azure) => {
                let (expected, known) = self.runtime_data.lookup(&azure.runtime_data);
                self.verify_tdx(&azure.quote, &expected, references, now, explanation)?;
                let runtime = self
                    .runtime_data
                    .bound(&azure.runtime_data, expected, known)?;
                ak_check(explanation, hcl::hcl_ak_matches(&runtime, ak_public))
            }
        }
    }

    fn verify_snp(
        &self,
        report: &[u8],
        certs: &SnpCerts,
        expected_report_data: &[u8; 64],
        references: &CvmReferences,
        now: SystemTime,
        explanation: &mut Explanation,
    ) -> Result<crate::snp::VerifiedSnpReport, ValidationError> {
        let mut policy = self.snp.policy().clone();
        if references.snp_launch_measurement.is_some() {
            policy.measurement = references.snp_launch_measurement;
        }
        if references.snp_host_data.is_some() {
            policy.host_data = references.snp_host_data;
        }
        let (checks, result) =
            self.snp
                .verify_explained_with(&policy, report, certs, expected_report_data, now);
        explanation.checks.extend(checks.checks);
        result
    }

    fn verify_tdx(
        &self,
        quote: &[u8],
        expected_report_data: &[u8; 64],
        references: &CvmReferences,
        now: SystemTime,
        explanation: &mut Explanation,
    ) -> Result<(), ValidationError> {
        let mut policy = self.tdx.policy().clone();
        if references.tdx_mrtd.is_some() {
            policy.mrtd = references.tdx_mrtd;
        }
        for (slot, reference) in policy.rtmrs.iter_mut().zip(references.tdx_rtmrs) {
            if reference.is_some() {
                *slot = reference;
            }
        }
        // Collateral is per platform (FMSPC), one set each (the newest). The quote's PCK
        // certificate names its platform: read it (no signature is checked for that) and
        // verify against that platform's set only, so that a quote costs one verification
        // whatever the bundle holds. The verifier still refuses collateral for another
        // platform than the verified certificate's. A quote whose FMSPC cannot be read is
        // tried against each set, and refused by each.
        // Reading it from the certificate costs more than the rest of a cached verification
        // (PEM and X.509 parsing): a platform whose quote verified before is known by its
        // exact signature data.
        let fmspc = match self.tdx.known_fmspc(quote) {
            Some(known) => Some(hex::encode_upper(known)),
            None => quote_fmspc(quote),
        };
        let candidates: Vec<&TdxCollateral> = self
            .tdx_collateral
            .0
            .iter()
            .filter(|(f, _)| fmspc.as_ref().is_none_or(|q| q == f))
            .map(|(_, c)| c)
            .collect();
        if let Some(fmspc) = &fmspc
            && candidates.is_empty()
            && !self.tdx_collateral.is_empty()
        {
            explanation.push(Check::pass_if(
                false,
                "tdx_collateral",
                format!("collateral for FMSPC {fmspc}"),
                "none in the bundle",
            ));
            return Err(ValidationError::Certificate {
                which: "TDX collateral".into(),
                reason: format!(
                    "none for the quote's platform FMSPC {fmspc} (add its PCS collateral to the bundle)"
                ),
            });
        }
        let mut last = None;
        for collateral in candidates {
            let (checks, result) = self.tdx.verify_explained_with(
                &policy,
                quote,
                collateral,
                expected_report_data,
                now,
            );
            match result {
                Ok(_) => {
                    explanation.checks.extend(checks.checks);
                    return Ok(());
                }
                Err(e) => last = Some((checks, e)),
            }
        }
        match last {
            Some((checks, e)) => {
                explanation.checks.extend(checks.checks);
                Err(e)
            }
            None => Err(ValidationError::Certificate {
                which: "TDX collateral".into(),
                reason: "none was passed in (an offline bundle is needed)".into(),
            }),
        }
    }
}

/// The FMSPC the quote's PCK certificate names (upper-case hex), read without checking any
/// signature: it only selects the collateral to verify with.
fn quote_fmspc(quote: &[u8]) -> Option<String> {
    let parsed = crate::tdx::TdQuote::parse(quote).ok()?;
    let extension = dcap_qvl::intel::parse_pck_extension_from_pem(parsed.pck_chain_pem()).ok()?;
    Some(hex::encode_upper(extension.fmspc))
}

/// Records the AK binding check and returns its verdict.
fn ak_check(
    explanation: &mut Explanation,
    result: Result<(), ValidationError>,
) -> Result<(), ValidationError> {
    let field = || format!("runtime_data.keys[{}]", hcl::AK_KEY_ID);
    explanation.push(match &result {
        Ok(()) => Check::pass_if(true, field(), "the quote's AK", "the quote's AK"),
        Err(ValidationError::Field {
            field,
            expected,
            observed,
        }) => Check::pass_if(false, field.clone(), expected.clone(), observed.clone()),
        Err(e) => Check::pass_if(false, field(), "the quote's AK", e.to_string()),
    });
    result
}

/// The signing key's certificate and its intermediate, DER, as the evidence carries them.
fn snp_certs(certs: &[Vec<u8>]) -> Result<SnpCerts, ValidationError> {
    match certs {
        [leaf] => SnpCerts::from_der(leaf, None, None),
        [leaf, intermediate] => SnpCerts::from_der(leaf, Some(intermediate), None),
        _ => Err(ValidationError::Malformed(format!(
            "{} SEV-SNP certificates; want the VCEK or VLEK, optionally its ASK or ASVK",
            certs.len()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUNTIME: &[u8] = include_bytes!("../../tests/data/cvm/snp-azure/runtimedata.bin");

    /// The same runtime data with another AK modulus: one hex digit of `n` changed.
    fn other_runtime() -> Vec<u8> {
        let text = std::str::from_utf8(RUNTIME).unwrap();
        let n = text.find("\"n\":\"").unwrap() + 5;
        let mut bytes = RUNTIME.to_vec();
        bytes[n + 10] = if bytes[n + 10] == b'A' { b'B' } else { b'A' };
        bytes
    }

    #[test]
    fn the_runtime_data_memo_answers_exactly_what_parsing_and_hashing_give() {
        let memo = RuntimeDataMemo::default();
        let (report_data, known) = memo.lookup(RUNTIME);
        assert!(known.is_none());
        assert_eq!(report_data, hcl::runtime_data_report_data(RUNTIME));
        assert_eq!(memo.len(), 0, "looking up keeps nothing");

        let parsed = memo.bound(RUNTIME, report_data, None).unwrap();
        assert_eq!(*parsed, RuntimeData::parse(RUNTIME).unwrap());
        let (again_rd, again) = memo.lookup(RUNTIME);
        assert_eq!(
            (again.is_some_and(|a| *a == *parsed), again_rd),
            (true, report_data)
        );

        // Bytes of the same length that differ in one digit of the AK are not the entry.
        let other = other_runtime();
        assert_eq!(other.len(), RUNTIME.len());
        let (o_rd, known) = memo.lookup(&other);
        assert!(known.is_none());
        assert_eq!(o_rd, hcl::runtime_data_report_data(&other));
        assert_ne!(o_rd, report_data);
        let o = memo.bound(&other, o_rd, None).unwrap();
        assert_ne!(o.ak, parsed.ak);
    }

    #[test]
    fn runtime_data_no_report_bound_is_hashed_but_never_parsed() {
        let memo = RuntimeDataMemo::default();
        let garbage = b"{ not json";
        let (report_data, known) = memo.lookup(garbage);
        assert!(known.is_none());
        assert_eq!(report_data, hcl::runtime_data_report_data(garbage));
        assert!(memo.bound(garbage, report_data, None).is_err());
        assert_eq!(memo.len(), 0, "bytes that do not parse are not kept");
    }

    #[test]
    fn the_runtime_data_memo_keeps_the_newest_entries_up_to_its_bound() {
        let memo = RuntimeDataMemo::default();
        let parsed = Arc::new(RuntimeData::parse(RUNTIME).unwrap());
        for i in 0..=RUNTIME_DATA_MEMO {
            let key = i.to_be_bytes();
            memo.0.insert(&key, (Arc::clone(&parsed), [0; 64]));
            memo.0.insert(&key, (Arc::clone(&parsed), [0; 64]));
        }
        assert_eq!(memo.len(), RUNTIME_DATA_MEMO);
        assert!(memo.lookup(&0usize.to_be_bytes()).1.is_none());
        assert!(memo.lookup(&RUNTIME_DATA_MEMO.to_be_bytes()).1.is_some());
    }
}

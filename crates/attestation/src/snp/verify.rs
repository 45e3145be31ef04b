//! The SEV-SNP verifier: chain, certificate against report, signature, fields.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use ring::signature::{self, UnparsedPublicKey};

use super::certs::{self, LeafExtensions, Roots, SnpCerts, VerifiedChain, verify_chain};
use super::policy::{SnpPolicy, check_fields};
use super::{Product, SignerKind, SnpReport, Tcb};
use crate::ValidationError;
use crate::explain::{Check, Explanation, Outcome};
use crate::revocation::CrlBundle;

/// How many verified chains the verifier remembers (a chain per chip and TCB; a cluster has
/// far fewer). When full, one entry makes room for the next.
const CACHE_CAPACITY: usize = 1024;

/// The cache key: the certificates as given (SHA-256 of their bytes). Nothing of the
/// report, which is not authenticated when the cache is consulted: keyed by its chip ID
/// and TCB, a peer could miss the cache at will by changing them, making the verifier
/// verify the chain again and evicting other chips' entries.
type CacheKey = [u8; 32];

/// Verifies SEV-SNP reports against a policy. Verified chains are cached per certificate
/// bytes, so a chip's later reports cost one P-384 verification: a cache hit skips the RSA
/// signatures of the chain, but still checks each certificate's validity at `now` and the
/// certificate's extensions (chip ID, TCB) against the report.
#[derive(Debug)]
pub struct SnpVerifier {
    policy: SnpPolicy,
    roots: Roots,
    crls: Option<Arc<CrlBundle>>,
    cache: Mutex<HashMap<CacheKey, Arc<VerifiedChain>>>,
}

/// A report whose signature, chain and fields were all accepted. Only this crate constructs
/// it.
#[derive(Debug, Clone)]
pub struct VerifiedSnpReport {
    report: SnpReport,
    product: Product,
    signer: SignerKind,
    tcb: Tcb,
    explanation: Explanation,
}

impl VerifiedSnpReport {
    /// The report.
    pub fn report(&self) -> &SnpReport {
        &self.report
    }

    /// The product, detected from the root the chain ended at.
    pub fn product(&self) -> Product {
        self.product
    }

    /// The kind of key that signed the report.
    pub fn signer(&self) -> SignerKind {
        self.signer
    }

    /// The chip ID (zero when the platform masks it, as VLEK-signing clouds may).
    pub fn chip_id(&self) -> &[u8; 64] {
        &self.report.chip_id
    }

    /// The reported TCB, decoded for the product.
    pub fn tcb(&self) -> Tcb {
        self.tcb
    }

    /// The launch measurement.
    pub fn measurement(&self) -> &[u8; 48] {
        &self.report.measurement
    }

    /// The REPORT_DATA, equal to what the caller expected.
    pub fn report_data(&self) -> &[u8; 64] {
        &self.report.report_data
    }

    /// Every check that ran, in order.
    pub fn explanation(&self) -> &Explanation {
        &self.explanation
    }
}

fn unix_seconds(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_secs()).map_or(i64::MIN, |s| -s),
    }
}

/// Checks that the certificate belongs to this report: its product against the chain's and
/// the report's CPUID, its chip ID and SPLs against the report's. Records every check and
/// refuses with the first failure.
fn check_leaf(
    report: &SnpReport,
    chain: &VerifiedChain,
    tcbm: Option<u64>,
    explanation: &mut Explanation,
) -> Result<(), ValidationError> {
    check_leaf_parts(
        report,
        chain.product,
        chain.signer,
        &chain.leaf,
        tcbm,
        explanation,
    )
}

/// [`check_leaf`] for a leaf of `product` signed for `signer`, whether its chain was
/// verified or not (an unverified leaf can only make a report fail earlier).
fn check_leaf_parts(
    report: &SnpReport,
    product: Product,
    signer: SignerKind,
    leaf: &LeafExtensions,
    tcbm: Option<u64>,
    explanation: &mut Explanation,
) -> Result<(), ValidationError> {
    let first = explanation.checks.len();
    let leaf_name = signer.name();

    explanation.push(Check::pass_if(
        super::Product::from_product_name(&leaf.product_name) == Some(product),
        format!("{leaf_name}.productName"),
        product.name(),
        leaf.product_name.clone(),
    ));
    if let Some(cpuid) = report.cpuid {
        explanation.push(Check::pass_if(
            cpuid.product() == Some(product),
            "cpuid",
            format!("a {product} family and model"),
            format!(
                "family {:#x} model {:#x} stepping {:#x}",
                cpuid.family, cpuid.model, cpuid.stepping
            ),
        ));
    }

    if let Some(hwid) = &leaf.hwid {
        // Turin's chip ID is 8 bytes; the report pads it with zeros.
        let (head, tail) = report.chip_id.split_at(hwid.len().min(64));
        let ok = head == hwid.as_slice() && tail.iter().all(|b| *b == 0);
        explanation.push(Check::pass_if(
            ok,
            "chip_id",
            format!("{leaf_name} hwID {}", hex::encode(hwid)),
            hex::encode(report.chip_id),
        ));
    }

    let tcb = report.reported_tcb.parts(product);
    let spl = |field: &'static str, ext: &str, cert: Option<u8>, observed: Option<u8>| {
        Check::pass_if(
            cert == observed,
            field,
            format!(
                "{leaf_name} {ext} {}",
                cert.map_or("absent".into(), |v| v.to_string())
            ),
            observed.map_or("absent".into(), |v| v.to_string()),
        )
    };
    if product == Product::Turin {
        explanation.push(spl("reported_tcb.fmc", "fmcSPL", leaf.fmc, tcb.fmc));
    }
    explanation.push(spl(
        "reported_tcb.bootloader",
        "blSPL",
        Some(leaf.bootloader),
        Some(tcb.bootloader),
    ));
    explanation.push(spl(
        "reported_tcb.tee",
        "teeSPL",
        Some(leaf.tee),
        Some(tcb.tee),
    ));
    explanation.push(spl(
        "reported_tcb.snp",
        "snpSPL",
        Some(leaf.snp),
        Some(tcb.snp),
    ));
    explanation.push(spl(
        "reported_tcb.microcode",
        "ucodeSPL",
        Some(leaf.microcode),
        Some(tcb.microcode),
    ));
    if let Some(tcbm) = tcbm {
        explanation.push(Check::pass_if(
            tcbm == report.reported_tcb.as_u64(),
            "reported_tcb",
            format!("THIM tcbm {tcbm:016X}"),
            format!("{:016X}", report.reported_tcb.as_u64()),
        ));
    }

    match explanation
        .checks
        .get(first..)
        .and_then(|new| new.iter().find(|c| c.outcome == Outcome::Fail))
    {
        None => Ok(()),
        Some(c) => Err(c.into()),
    }
}

impl SnpVerifier {
    /// A verifier enforcing `policy`.
    pub fn new(policy: SnpPolicy) -> Self {
        Self {
            policy,
            roots: Roots::embedded(),
            crls: None,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// Also checks the intermediate (ASK or ASVK) against the CRLs of its ARK in `crls`,
    /// on every verification: a report is refused when the intermediate is revoked, or when
    /// the bundle has no verified, current CRL of that ARK ([`crate::revocation`]).
    /// Without this no revocation is checked.
    #[must_use]
    pub fn with_crls(mut self, crls: Arc<CrlBundle>) -> Self {
        self.crls = Some(crls);
        self
    }

    /// The CRL bundle this verifier checks intermediates against, if any.
    pub fn crls(&self) -> Option<&Arc<CrlBundle>> {
        self.crls.as_ref()
    }

    /// The policy this verifier enforces.
    pub fn policy(&self) -> &SnpPolicy {
        &self.policy
    }

    /// Verifies `report` (the raw 1184 bytes) signed by the key `certs` certify, bound to
    /// `expected_report_data`, with certificate validity judged at `now`.
    pub fn verify(
        &self,
        report: &[u8],
        certs: &SnpCerts,
        expected_report_data: &[u8; 64],
        now: SystemTime,
    ) -> Result<VerifiedSnpReport, ValidationError> {
        self.verify_explained(report, certs, expected_report_data, now)
            .1
    }

    /// Like [`SnpVerifier::verify`], and also returns every check that ran, in order (for
    /// `asterism verify`): a signature or chain failure ends the list; field checks all run.
    pub fn verify_explained(
        &self,
        report: &[u8],
        certs: &SnpCerts,
        expected_report_data: &[u8; 64],
        now: SystemTime,
    ) -> (Explanation, Result<VerifiedSnpReport, ValidationError>) {
        self.verify_explained_with(&self.policy, report, certs, expected_report_data, now)
    }

    /// As [`SnpVerifier::verify_explained`], enforcing `policy` instead of the verifier's
    /// own: for reference values that change while the verifier lives (a reloaded
    /// measurements file). Cached chains stay valid; they do not depend on the policy.
    pub fn verify_explained_with(
        &self,
        policy: &SnpPolicy,
        report: &[u8],
        certs: &SnpCerts,
        expected_report_data: &[u8; 64],
        now: SystemTime,
    ) -> (Explanation, Result<VerifiedSnpReport, ValidationError>) {
        let mut explanation = Explanation::default();
        let result = self.run(
            policy,
            report,
            certs,
            expected_report_data,
            now,
            &mut explanation,
        );
        match &result {
            Ok(v) => tracing::debug!(
                product = %v.product,
                signer = %v.signer,
                chip_id = %hex::encode(v.report.chip_id),
                "SEV-SNP report verified"
            ),
            Err(e) => tracing::info!(error = %e, "SEV-SNP report refused"),
        }
        (explanation, result)
    }

    fn run(
        &self,
        policy: &SnpPolicy,
        bytes: &[u8],
        certs: &SnpCerts,
        expected_report_data: &[u8; 64],
        now: SystemTime,
        explanation: &mut Explanation,
    ) -> Result<VerifiedSnpReport, ValidationError> {
        let layout = format!(
            "a report of version {} to {}",
            super::MIN_VERSION,
            super::MAX_VERSION
        );
        let report = SnpReport::parse(bytes).inspect_err(|e| {
            explanation.push(Check::pass_if(
                false,
                "report",
                layout.clone(),
                e.to_string(),
            ))
        })?;
        explanation.push(Check::pass_if(
            true,
            "version",
            layout,
            report.version.to_string(),
        ));

        let signer = report.key_info.signer();
        let allowed = signer.is_some_and(|s| policy.allows_signer(s));
        let allowed_names = [SignerKind::Vcek, SignerKind::Vlek]
            .into_iter()
            .filter(|s| policy.allows_signer(*s))
            .map(SignerKind::name)
            .collect::<Vec<_>>()
            .join(" or ");
        let check = Check::pass_if(
            allowed,
            "key_info.signing_key",
            allowed_names,
            signer.map_or_else(
                || report.key_info.signing_key().to_string(),
                |s| s.name().to_string(),
            ),
        );
        explanation.push(check.clone());
        let Some(signer) = signer.filter(|_| allowed) else {
            return Err((&check).into());
        };

        // A chain not verified before costs two RSA-4096 verifications: first the report's
        // own signature, under the key its leaf certificate names, so that a forged report
        // costs one P-384 verification whatever certificates come with it.
        let verify_report = |key: &[u8]| {
            UnparsedPublicKey::new(&signature::ECDSA_P384_SHA384_FIXED, key)
                .verify(report.signed_bytes(), &report.signature_fixed())
                .is_ok()
        };
        let mut signed_early = false;
        if !self.is_cached(certs, signer) {
            let claimed = certs::claimed_leaf(certs, signer)
                .map_err(|reason| certs::refuse(explanation, signer.name(), reason))?;
            // The leaf's own statements about the chip first, as a cached chain's would be
            // checked (recorded only if one fails: they are checked again, and recorded,
            // once the chain is verified).
            let mut scratch = Explanation::default();
            if let Err(e) = check_leaf_parts(
                &report,
                claimed.product,
                signer,
                &claimed.leaf,
                certs.tcbm(),
                &mut scratch,
            ) {
                explanation.checks.extend(scratch.checks);
                return Err(e);
            }
            if !verify_report(&claimed.key) {
                explanation.push(Check::pass_if(
                    false,
                    "signature",
                    format!("ECDSA P-384 by the {}", signer.name()),
                    "invalid",
                ));
                return Err(ValidationError::BadSignature(format!(
                    "the SEV-SNP report is not signed by the {}",
                    signer.name()
                )));
            }
            signed_early = true;
        }

        let now_secs = unix_seconds(now);
        let chain = self.chain(certs, signer, now_secs, explanation)?;
        if let Some(crls) = &self.crls {
            crls.check(
                signer.intermediate_name(),
                &chain.intermediate_der,
                &chain.ark_der,
                now_secs,
                explanation,
            )?;
        }
        check_leaf(&report, &chain, certs.tcbm(), explanation)?;

        // Checked above under the same leaf's key when the chain was verified just now.
        let signed = signed_early || verify_report(&chain.leaf_key);
        explanation.push(Check::pass_if(
            signed,
            "signature",
            format!("ECDSA P-384 by the {}", signer.name()),
            if signed { "valid" } else { "invalid" },
        ));
        if !signed {
            return Err(ValidationError::BadSignature(format!(
                "the SEV-SNP report is not signed by the {}",
                signer.name()
            )));
        }

        check_fields(
            &report,
            chain.product,
            policy,
            expected_report_data,
            explanation,
        )?;

        let tcb = report.reported_tcb.parts(chain.product);
        Ok(VerifiedSnpReport {
            report,
            product: chain.product,
            signer,
            tcb,
            explanation: explanation.clone(),
        })
    }

    /// Whether the chain of `certs` for `signer` was verified before (and is still cached).
    fn is_cached(&self, certs: &SnpCerts, signer: SignerKind) -> bool {
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&certs.digest())
            .is_some_and(|c| c.signer == signer)
    }

    /// The verified chain for this report: from the cache, with each certificate's validity
    /// checked again at `now`, or verified and cached.
    fn chain(
        &self,
        certs: &SnpCerts,
        signer: SignerKind,
        now: i64,
        explanation: &mut Explanation,
    ) -> Result<Arc<VerifiedChain>, ValidationError> {
        let key: CacheKey = certs.digest();
        let cached = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        if let Some(chain) = cached.filter(|c| c.signer == signer) {
            explanation.push(Check::pass_if(
                true,
                "chain",
                "verified earlier",
                format!(
                    "{} → {} → ARK-{}",
                    signer,
                    signer.intermediate_name(),
                    chain.product
                ),
            ));
            for w in &chain.windows {
                w.check(now, explanation)?;
            }
            return Ok(chain);
        }
        let chain = Arc::new(verify_chain(&self.roots, certs, signer, now, explanation)?);
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= CACHE_CAPACITY
            && let Some(evict) = cache.keys().next().copied()
        {
            cache.remove(&evict);
        }
        cache.insert(key, Arc::clone(&chain));
        Ok(chain)
    }
}

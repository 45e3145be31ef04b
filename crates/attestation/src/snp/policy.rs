//! What a correctly signed SEV-SNP report must also show: its binding, TCB minimums, guest
//! policy bits, VMPL and reference values.

use subtle::ConstantTimeEq;

use super::{Product, SignerKind, SnpReport};
use crate::ValidationError;
use crate::explain::{Check, Explanation, Outcome, Reference, lower_hex};
use crate::measurements::InsecureNoLaunchMeasurement;

/// Minimum security versions of the TCB components.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MinimumTcb {
    /// PSP boot loader.
    pub bootloader: u8,
    /// PSP operating system (TEE).
    pub tee: u8,
    /// SNP firmware.
    pub snp: u8,
    /// CPU microcode.
    pub microcode: u8,
    /// FMC; applied on Turin, whose TCB has this component.
    pub fmc: u8,
}

/// One value per product (TCB versions are numbered per product).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PerProduct<T> {
    /// For Milan.
    pub milan: T,
    /// For Genoa.
    pub genoa: T,
    /// For Turin.
    pub turin: T,
}

impl<T: Copy> PerProduct<T> {
    /// `value` for every product.
    pub fn same(value: T) -> Self {
        Self {
            milan: value,
            genoa: value,
            turin: value,
        }
    }

    /// The value for `product`.
    pub fn get(&self, product: Product) -> T {
        match product {
            Product::Milan => self.milan,
            Product::Genoa => self.genoa,
            Product::Turin => self.turin,
        }
    }
}

/// The default Milan floor's SNP firmware SVN: 0x18 (24), the SNP firmware that attests the
/// fix of AMD-SB-3019 (CVE-2024-56161, the microcode signature check) on Milan, as the
/// bulletin's figure is quoted by a verifier's maintainers (microsoft/CCF issue 6812). A report
/// under it comes from firmware on which the host could load its own microcode.
pub const MILAN_SNP_FLOOR: u8 = 0x18;

/// The default Genoa floor's SNP firmware SVN: 0x17 (23), the Genoa figure of the same
/// bulletin and the same source as [`MILAN_SNP_FLOOR`]. It is the component that attests the
/// fix: the SNP firmware refuses microcode whose signature the fixed loader would refuse.
pub const GENOA_SNP_FLOOR: u8 = 0x17;

/// What a verified SEV-SNP report must show besides a valid signature and chain.
///
/// The default: a Milan TCB floor of boot loader 3, TEE 0, SNP [`MILAN_SNP_FLOOR`],
/// microcode 115; a Genoa floor of SNP [`GENOA_SNP_FLOOR`] and 0 for the other parts (no
/// bulletin figure for them could be confirmed); no floor for Turin, whose reports are
/// therefore refused until the operator sets one (`docs/attestation.md` section 8 gives each
/// number's source, and why Turin has none); debug always refused; no migration agent; SMT allowed (every cloud runs its hosts with
/// SMT); VMPL 0 (the report must come from the most privileged level, the guest firmware or
/// the cloud's paravisor); VCEK and VLEK both accepted (a cloud's trust mode narrows this to
/// its own signer, [`crate::tpm::CvmAkTrust::sev_snp`]); no reference for the host data or
/// the key digests. A launch measurement is required: without a reference value the report
/// is refused, unless [`SnpPolicy::insecure_no_launch_measurement`] is set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnpPolicy {
    /// Minimum SVNs applied to `reported_tcb` (the TCB the signing key was issued for),
    /// `launch_tcb` and `committed_tcb`; the current TCB is reported, not checked. A product
    /// without a floor (`None`) has every report refused: a floor is a mandatory input, and
    /// accepting any firmware takes an explicit all-zero [`MinimumTcb`].
    pub minimum_tcb: PerProduct<Option<MinimumTcb>>,
    /// Accept a guest that may be associated with a migration agent.
    pub allow_migration_agent: bool,
    /// Accept a guest whose policy lets the host use SMT.
    pub allow_smt: bool,
    /// The VMPL the report must have been requested from; `None` accepts any.
    pub vmpl: Option<u32>,
    /// Accept reports signed by a VCEK.
    pub allow_vcek: bool,
    /// Accept reports signed by a VLEK.
    pub allow_vlek: bool,
    /// The expected launch measurement; `None` refuses every report, unless
    /// [`Self::insecure_no_launch_measurement`] is set.
    pub measurement: Option<Reference<48>>,
    /// **Insecure**: with no [`Self::measurement`], accept any launch measurement (a
    /// warning is logged and recorded on every verification).
    pub insecure_no_launch_measurement: Option<InsecureNoLaunchMeasurement>,
    /// The expected host data, if any is configured.
    pub host_data: Option<Reference<32>>,
    /// The ID key digests accepted, if restricted.
    pub id_key_digests: Option<Vec<[u8; 48]>>,
    /// The author key digests accepted, if restricted.
    pub author_key_digests: Option<Vec<[u8; 48]>>,
}

impl Default for SnpPolicy {
    fn default() -> Self {
        Self {
            minimum_tcb: PerProduct {
                milan: Some(MinimumTcb {
                    bootloader: 3,
                    tee: 0,
                    snp: MILAN_SNP_FLOOR,
                    microcode: 115,
                    fmc: 0,
                }),
                genoa: Some(MinimumTcb {
                    bootloader: 0,
                    tee: 0,
                    snp: GENOA_SNP_FLOOR,
                    microcode: 0,
                    fmc: 0,
                }),
                turin: None,
            },
            allow_migration_agent: false,
            allow_smt: true,
            vmpl: Some(0),
            allow_vcek: true,
            allow_vlek: true,
            measurement: None,
            insecure_no_launch_measurement: None,
            host_data: None,
            id_key_digests: None,
            author_key_digests: None,
        }
    }
}

impl SnpPolicy {
    /// Whether reports signed by `signer` are accepted.
    pub fn allows_signer(&self, signer: SignerKind) -> bool {
        match signer {
            SignerKind::Vcek => self.allow_vcek,
            SignerKind::Vlek => self.allow_vlek,
        }
    }
}

/// The field names of one TCB's parts, as checks record them.
macro_rules! tcb_fields {
    ($tcb:literal) => {
        [
            concat!($tcb, ".fmc"),
            concat!($tcb, ".bootloader"),
            concat!($tcb, ".tee"),
            concat!($tcb, ".snp"),
            concat!($tcb, ".microcode"),
        ]
    };
}

fn at_least(field: &'static str, min: u8, observed: u8) -> Check {
    Check::pass_if(
        observed >= min,
        field,
        format!(">= {min}"),
        observed.to_string(),
    )
}

fn bit_refused(field: &'static str, allowed: bool, set: bool) -> Check {
    let expected = if allowed { "0 or 1" } else { "0" };
    Check::pass_if(allowed || !set, field, expected, u8::from(set).to_string())
}

fn digest_in(field: &'static str, allowed: Option<&[[u8; 48]]>, observed: &[u8; 48]) -> Check {
    match allowed {
        None => Check::pass_if(true, field, "any", lower_hex(observed)),
        Some(set) => Check::pass_if(
            set.contains(observed),
            field,
            format!(
                "one of [{}]",
                set.iter()
                    .map(|d| lower_hex(d))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            lower_hex(observed),
        ),
    }
}

/// Checks the fields of a report whose signature and chain were verified (so `product` is
/// the product its chain ended at), recording every check, and refuses with the first
/// failure: [`ValidationError::BindingMismatch`] for REPORT_DATA, otherwise
/// [`ValidationError::Field`] naming the field. All checks run even after a failure.
pub fn check_fields(
    report: &SnpReport,
    product: Product,
    policy: &SnpPolicy,
    expected_report_data: &[u8; 64],
    explanation: &mut Explanation,
) -> Result<(), ValidationError> {
    let first = explanation.checks.len();

    // Compared in constant time: the expected value may be derived from a session secret.
    let bound: bool = report.report_data.ct_eq(expected_report_data).into();
    explanation.push(Check::pass_if(
        bound,
        "report_data",
        lower_hex(expected_report_data),
        lower_hex(&report.report_data),
    ));

    // The reported TCB is the one the VCEK or VLEK certifies. The launch TCB is the
    // firmware the guest was launched (and its secrets provisioned) on, and the committed
    // TCB the oldest the host can return to: a host updated after the launch, or one that
    // can roll back below the floor, is refused as well.
    match policy.minimum_tcb.get(product) {
        Some(min) => {
            for (
                raw,
                [
                    fmc_field,
                    bootloader_field,
                    tee_field,
                    snp_field,
                    microcode_field,
                ],
            ) in [
                (&report.reported_tcb, tcb_fields!("reported_tcb")),
                (&report.launch_tcb, tcb_fields!("launch_tcb")),
                (&report.committed_tcb, tcb_fields!("committed_tcb")),
            ] {
                let tcb = raw.parts(product);
                if let Some(fmc) = tcb.fmc {
                    explanation.push(at_least(fmc_field, min.fmc, fmc));
                }
                explanation.push(at_least(bootloader_field, min.bootloader, tcb.bootloader));
                explanation.push(at_least(tee_field, min.tee, tcb.tee));
                explanation.push(at_least(snp_field, min.snp, tcb.snp));
                explanation.push(at_least(microcode_field, min.microcode, tcb.microcode));
            }
        }
        None => explanation.push(Check::new(
            "reported_tcb",
            format!(
                "a minimum TCB for {product} (none is configured: set snp.minimumTcb.{} in \
                 the confidential-VM policy)",
                product.name().to_ascii_lowercase()
            ),
            format!("{:016X}", report.reported_tcb.as_u64()),
            Outcome::Fail,
        )),
    }
    explanation.push(Check::pass_if(
        report.reported_tcb.reserved_is_zero(product),
        "reported_tcb.reserved",
        "zero",
        lower_hex(&report.reported_tcb.0),
    ));

    explanation.push(bit_refused(
        "policy.debug",
        false,
        report.policy.debug_allowed(),
    ));
    explanation.push(bit_refused(
        "policy.migrate_ma",
        policy.allow_migration_agent,
        report.policy.migrate_ma_allowed(),
    ));
    explanation.push(bit_refused(
        "policy.smt",
        policy.allow_smt,
        report.policy.smt_allowed(),
    ));
    explanation.push(match policy.vmpl {
        Some(vmpl) => Check::pass_if(
            report.vmpl == vmpl,
            "vmpl",
            vmpl.to_string(),
            report.vmpl.to_string(),
        ),
        None => Check::pass_if(true, "vmpl", "any", report.vmpl.to_string()),
    });

    explanation.push(
        match (&policy.measurement, policy.insecure_no_launch_measurement) {
            (Some(reference), _) => reference.check("measurement", &report.measurement),
            (None, Some(_)) => {
                tracing::warn!(
                    measurement = %hex::encode(report.measurement),
                    "insecure_no_launch_measurement: accepting an SEV-SNP launch measurement \
                     that no reference value pins"
                );
                Check::new(
                    "measurement",
                    "no reference configured (insecure_no_launch_measurement)",
                    hex::encode(report.measurement),
                    Outcome::Warn,
                )
            }
            (None, None) => Check::new(
                "measurement",
                "a reference value (none is configured)",
                hex::encode(report.measurement),
                Outcome::Fail,
            ),
        },
    );
    explanation.push(match &policy.host_data {
        Some(reference) => reference.check("host_data", &report.host_data),
        None => Check::pass_if(true, "host_data", "any", hex::encode(report.host_data)),
    });
    explanation.push(digest_in(
        "id_key_digest",
        policy.id_key_digests.as_deref(),
        &report.id_key_digest,
    ));
    explanation.push(digest_in(
        "author_key_digest",
        policy.author_key_digests.as_deref(),
        &report.author_key_digest,
    ));

    match explanation
        .checks
        .get(first..)
        .and_then(|new| new.iter().find(|c| c.outcome == Outcome::Fail))
    {
        None => Ok(()),
        Some(c) if c.field == "report_data" => Err(ValidationError::BindingMismatch),
        Some(c) => Err(c.into()),
    }
}

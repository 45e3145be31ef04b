//! The confidential-VM policy file: what a verifier accepts of an SEV-SNP report or a TDX
//! quote besides the reference values (those are in the measurements file, which reloads).
//!
//! ```json
//! {
//!   "snp": {
//!     "minimumTcb": {
//!       "milan": {"bootloader": 3, "tee": 0, "snp": 24, "microcode": 115},
//!       "genoa": {"bootloader": 9, "tee": 0, "snp": 23, "microcode": 72},
//!       "turin": {"fmc": 1, "bootloader": 1, "tee": 1, "snp": 1, "microcode": 1}
//!     },
//!     "allowMigrationAgent": false,
//!     "allowSmt": true,
//!     "vmpl": 0,
//!     "signers": ["vcek", "vlek"],
//!     "idKeyDigests": ["<96 hex digits>"],
//!     "authorKeyDigests": ["<96 hex digits>"]
//!   },
//!   "tdx": {
//!     "acceptedTcbStatuses": ["UpToDate", "SWHardeningNeeded"],
//!     "acceptedAdvisoryIds": ["INTEL-SA-00615"],
//!     "mrConfigId": "<96 hex digits>",
//!     "mrOwner": "<96 hex digits>",
//!     "mrOwnerConfig": "<96 hex digits>",
//!     "xfam": "<16 hex digits>"
//!   }
//! }
//! ```
//!
//! Every member is optional; an absent one keeps the default ([`SnpPolicy::default`],
//! [`TdxPolicy::default`]); unknown members are refused, so a misspelt knob is an error and
//! not a silent default. A product's `minimumTcb` entry replaces that product's floor
//! whole (absent parts are 0). Turin has no default floor: its reports are refused until
//! the file sets one. `"vmpl": null` accepts any VMPL.

use crate::explain::Reference;
use crate::snp::{MinimumTcb, SnpPolicy};
use crate::tdx::{TcbStatus, TdxPolicy};
use serde::Deserialize;

/// Largest policy file accepted.
pub const MAX_POLICY_SIZE: usize = 64 * 1024;

/// Why a confidential-VM policy file was refused.
#[derive(Debug, thiserror::Error)]
pub enum CvmPolicyError {
    /// Larger than [`MAX_POLICY_SIZE`].
    #[error("the policy is {0} bytes, at most {MAX_POLICY_SIZE}")]
    TooLarge(usize),
    /// Not JSON of the documented shape.
    #[error("policy JSON")]
    Json(#[source] serde_json::Error),
    /// A value is out of its range.
    #[error("{field}: {reason}")]
    Value {
        /// The member.
        field: String,
        /// What is wrong.
        reason: String,
    },
}

/// The SEV-SNP and TDX policies of a file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CvmPolicy {
    /// What an SEV-SNP report must meet.
    pub snp: SnpPolicy,
    /// What a TDX quote must meet.
    pub tdx: TdxPolicy,
}

impl CvmPolicy {
    /// Parses the file format (module documentation).
    pub fn from_json(bytes: &[u8]) -> Result<Self, CvmPolicyError> {
        if bytes.len() > MAX_POLICY_SIZE {
            return Err(CvmPolicyError::TooLarge(bytes.len()));
        }
        let file: FileRepr = serde_json::from_slice(bytes).map_err(CvmPolicyError::Json)?;
        let mut policy = Self::default();
        if let Some(snp) = file.snp {
            apply_snp(&mut policy.snp, snp)?;
        }
        if let Some(tdx) = file.tdx {
            apply_tdx(&mut policy.tdx, tdx)?;
        }
        Ok(policy)
    }
}

fn apply_snp(p: &mut SnpPolicy, f: SnpRepr) -> Result<(), CvmPolicyError> {
    if let Some(m) = f.minimum_tcb {
        if let Some(t) = m.milan {
            p.minimum_tcb.milan = Some(t.into());
        }
        if let Some(t) = m.genoa {
            p.minimum_tcb.genoa = Some(t.into());
        }
        if let Some(t) = m.turin {
            p.minimum_tcb.turin = Some(t.into());
        }
    }
    if let Some(v) = f.allow_migration_agent {
        p.allow_migration_agent = v;
    }
    if let Some(v) = f.allow_smt {
        p.allow_smt = v;
    }
    if let Some(v) = f.vmpl {
        if v.is_some_and(|l| l > 3) {
            return Err(value("snp.vmpl", "a VMPL is 0 to 3, or null for any"));
        }
        p.vmpl = v;
    }
    if let Some(signers) = f.signers {
        p.allow_vcek = signers.iter().any(|s| s == "vcek");
        p.allow_vlek = signers.iter().any(|s| s == "vlek");
        if let Some(bad) = signers.iter().find(|s| *s != "vcek" && *s != "vlek") {
            return Err(value(
                "snp.signers",
                format!("{bad:?} is neither vcek nor vlek"),
            ));
        }
        if !p.allow_vcek && !p.allow_vlek {
            return Err(value("snp.signers", "at least one of vcek and vlek"));
        }
    }
    if let Some(d) = f.id_key_digests {
        p.id_key_digests = Some(digests("snp.idKeyDigests", &d)?);
    }
    if let Some(d) = f.author_key_digests {
        p.author_key_digests = Some(digests("snp.authorKeyDigests", &d)?);
    }
    Ok(())
}

fn apply_tdx(p: &mut TdxPolicy, f: TdxRepr) -> Result<(), CvmPolicyError> {
    if let Some(statuses) = f.accepted_tcb_statuses {
        let parsed = statuses
            .iter()
            .map(|s| {
                s.parse::<TcbStatus>()
                    .map_err(|e| value("tdx.acceptedTcbStatuses", e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if parsed.is_empty() {
            return Err(value("tdx.acceptedTcbStatuses", "accepts nothing"));
        }
        p.accepted_tcb_statuses = parsed;
    }
    if let Some(ids) = f.accepted_advisory_ids {
        if let Some(bad) = ids.iter().find(|id| !is_advisory_id(id)) {
            return Err(value(
                "tdx.acceptedAdvisoryIds",
                format!("{bad:?} is not an Intel advisory ID (INTEL-SA-<digits>)"),
            ));
        }
        p.accepted_advisory_ids = ids;
    }
    p.mr_config_id = fixed("tdx.mrConfigId", f.mr_config_id)?.or(p.mr_config_id);
    p.mr_owner = fixed("tdx.mrOwner", f.mr_owner)?.or(p.mr_owner);
    p.mr_owner_config = fixed("tdx.mrOwnerConfig", f.mr_owner_config)?.or(p.mr_owner_config);
    p.xfam = fixed("tdx.xfam", f.xfam)?.or(p.xfam);
    Ok(())
}

/// `INTEL-SA-` and digits, as Intel's collateral names advisories.
fn is_advisory_id(id: &str) -> bool {
    id.strip_prefix("INTEL-SA-")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

fn value(field: &str, reason: impl Into<String>) -> CvmPolicyError {
    CvmPolicyError::Value {
        field: field.to_owned(),
        reason: reason.into(),
    }
}

fn hex_array<const N: usize>(field: &str, text: &str) -> Result<[u8; N], CvmPolicyError> {
    crate::explain::hex_array(text).map_err(|reason| value(field, reason))
}

fn digests(field: &str, list: &[String]) -> Result<Vec<[u8; 48]>, CvmPolicyError> {
    list.iter().map(|d| hex_array(field, d)).collect()
}

fn fixed<const N: usize>(
    field: &str,
    text: Option<String>,
) -> Result<Option<Reference<N>>, CvmPolicyError> {
    text.map(|t| hex_array(field, &t).map(Reference::enforce))
        .transpose()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileRepr {
    #[serde(default)]
    snp: Option<SnpRepr>,
    #[serde(default)]
    tdx: Option<TdxRepr>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SnpRepr {
    #[serde(default)]
    minimum_tcb: Option<MinimumTcbRepr>,
    #[serde(default)]
    allow_migration_agent: Option<bool>,
    #[serde(default)]
    allow_smt: Option<bool>,
    #[serde(default, deserialize_with = "present")]
    vmpl: Option<Option<u32>>,
    #[serde(default)]
    signers: Option<Vec<String>>,
    #[serde(default)]
    id_key_digests: Option<Vec<String>>,
    #[serde(default)]
    author_key_digests: Option<Vec<String>>,
}

/// Tells `"vmpl": null` (any) from an absent member (the default).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<u32>>, D::Error> {
    Option::<u32>::deserialize(d).map(Some)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MinimumTcbRepr {
    #[serde(default)]
    milan: Option<TcbRepr>,
    #[serde(default)]
    genoa: Option<TcbRepr>,
    #[serde(default)]
    turin: Option<TcbRepr>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct TcbRepr {
    #[serde(default)]
    bootloader: u8,
    #[serde(default)]
    tee: u8,
    #[serde(default)]
    snp: u8,
    #[serde(default)]
    microcode: u8,
    #[serde(default)]
    fmc: u8,
}

impl From<TcbRepr> for MinimumTcb {
    fn from(t: TcbRepr) -> Self {
        MinimumTcb {
            bootloader: t.bootloader,
            tee: t.tee,
            snp: t.snp,
            microcode: t.microcode,
            fmc: t.fmc,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct TdxRepr {
    #[serde(default)]
    accepted_tcb_statuses: Option<Vec<String>>,
    #[serde(default)]
    accepted_advisory_ids: Option<Vec<String>>,
    #[serde(default)]
    mr_config_id: Option<String>,
    #[serde(default)]
    mr_owner: Option<String>,
    #[serde(default)]
    mr_owner_config: Option<String>,
    #[serde(default)]
    xfam: Option<String>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn an_empty_file_is_the_default_policy() {
        assert_eq!(CvmPolicy::from_json(b"{}").unwrap(), CvmPolicy::default());
    }

    #[test]
    fn every_knob_is_read() {
        let json = format!(
            r#"{{"snp": {{"minimumTcb": {{"genoa": {{"bootloader": 9, "snp": 23}}}},
                "allowMigrationAgent": true, "allowSmt": false, "vmpl": null,
                "signers": ["vlek"], "idKeyDigests": ["{d}"]}},
               "tdx": {{"acceptedTcbStatuses": ["UpToDate"], "mrOwner": "{d}",
                "acceptedAdvisoryIds": ["INTEL-SA-00615"],
                "xfam": "e702060000000000"}}}}"#,
            d = "ab".repeat(48)
        );
        let p = CvmPolicy::from_json(json.as_bytes()).unwrap();
        let genoa = p.snp.minimum_tcb.genoa.unwrap();
        assert_eq!((genoa.bootloader, genoa.snp), (9, 23));
        assert_eq!(p.snp.minimum_tcb.turin, None, "no floor unless one is set");
        assert_eq!(
            p.snp.minimum_tcb.milan,
            SnpPolicy::default().minimum_tcb.milan
        );
        assert!(p.snp.allow_migration_agent);
        assert!(!p.snp.allow_smt);
        assert_eq!(p.snp.vmpl, None);
        assert!(!p.snp.allow_vcek && p.snp.allow_vlek);
        assert_eq!(p.snp.id_key_digests, Some(vec![[0xab; 48]]));
        assert_eq!(p.tdx.accepted_tcb_statuses, vec![TcbStatus::UpToDate]);
        assert_eq!(p.tdx.accepted_advisory_ids, ["INTEL-SA-00615"]);
        assert_eq!(p.tdx.mr_owner, Some(Reference::enforce([0xab; 48])));
        assert!(p.tdx.xfam.is_some());
    }

    #[test]
    fn the_size_cap_and_the_ranges_are_exact() {
        // A document of exactly the cap is read; one byte more is refused by its size.
        let at_cap = |extra: usize| {
            let mut doc = br#"{"snp": {"vmpl": 3}}"#.to_vec();
            doc.resize(MAX_POLICY_SIZE + extra, b' ');
            CvmPolicy::from_json(&doc)
        };
        assert_eq!(
            at_cap(0).unwrap().snp.vmpl,
            Some(3),
            "VMPL 3 is the last one"
        );
        assert!(matches!(at_cap(1), Err(CvmPolicyError::TooLarge(n)) if n == MAX_POLICY_SIZE + 1));
        // Each signer alone, and both.
        for (signers, vcek, vlek) in [
            (r#"["vcek"]"#, true, false),
            (r#"["vlek"]"#, false, true),
            (r#"["vcek", "vlek"]"#, true, true),
        ] {
            let json = format!(r#"{{"snp": {{"signers": {signers}}}}}"#);
            let p = CvmPolicy::from_json(json.as_bytes()).unwrap().snp;
            assert_eq!((p.allow_vcek, p.allow_vlek), (vcek, vlek), "{signers}");
        }
    }

    #[test]
    fn bad_values_and_unknown_knobs_are_refused() {
        for bad in [
            r#"{"snp": {"vmpl": 4}}"#,
            r#"{"snp": {"signers": []}}"#,
            r#"{"snp": {"signers": ["vcek", "ask"]}}"#,
            r#"{"snp": {"idKeyDigests": ["abcd"]}}"#,
            r#"{"snp": {"allowDebug": true}}"#,
            r#"{"tdx": {"acceptedTcbStatuses": ["Fine"]}}"#,
            r#"{"tdx": {"acceptedTcbStatuses": []}}"#,
            r#"{"tdx": {"acceptedAdvisoryIds": ["SA-00615"]}}"#,
            r#"{"tdx": {"acceptedAdvisoryIds": ["INTEL-SA-"]}}"#,
            r#"{"gcp": {}}"#,
        ] {
            assert!(CvmPolicy::from_json(bad.as_bytes()).is_err(), "{bad}");
        }
    }
}

//! The `tpm-quote` validator.

use super::ak::AkKey;
use super::eventlog::{Event, EventLog, pcr_start};
use super::evidence::{QuoteEvidence, VARIANT};
use super::structures::{PcrSelection, QuoteInfo, alg};
use super::trust::AkTrust;
use crate::explain::{Check, Outcome};
use crate::measurements::{MeasurementMode, Measurements, MeasurementsProvider, PcrIndex};
use crate::memo::ExactMemo;
use crate::{Measurement, ReportData, ValidationError, Validator, VerifiedEvidence};
use asterism_basics::error_chain;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::SystemTime;

type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// Verifies `tpm-quote` evidence: a TPM 2.0 quote over the SHA-256 PCR bank whose
/// qualifying data is the expected [`ReportData`], signed by a trusted attestation key.
///
/// Steps, in order; the first failure rejects and says what failed:
///
/// 1. decode: size cap, canonical protobuf, version 1, every TPM structure parsed exactly
///    (this checks the `TPMS_ATTEST` magic and the quote type);
/// 2. AK policy, the whole template: attributes exactly `0x00050472` (restricted, sign,
///    fixedTPM, fixedParent, sensitiveDataOrigin, userWithAuth, noDA), empty authPolicy,
///    nameAlg SHA-256, ECC P-256 with ECDSA-SHA256 (KDF null, 32-byte coordinates) or RSA
///    2048–8192 with RSASSA-SHA256 and the default exponent; the AK's identity is then
///    computed from the key alone ([`crate::AkFingerprint`]);
/// 3. AK trust: the [`AkTrust`] policy;
/// 4. the signature over the `TPMS_ATTEST` bytes, with the AK;
/// 5. the signed PCR selection is exactly one bank, SHA-256, not empty (no SHA-1);
/// 6. the supplied PCR values cover exactly the signed selection;
/// 7. `pcrDigest` = SHA-256 of the supplied values in ascending index order;
/// 8. the qualifying data (`extraData`) equals the expected report data (constant time);
/// 9. when the evidence carries a TCG event log: the log parses exactly and its SHA-256
///    replay equals the quoted value of every quoted PCR it extends (otherwise the log is
///    not this boot's, and the evidence is refused);
/// 10. the PCR values against the expected measurements: an enforced mismatch rejects, a
///     warn-only mismatch is logged and returned as a warning. With an event log, the
///     explanation names the events of each differing PCR, and the first one that differs
///     from the measurements' reference events when they list some.
pub struct TpmQuoteValidator {
    trust: AkTrust,
    measurements: Arc<dyn MeasurementsProvider>,
    clock: Clock,
    pcr_digests: PcrDigestMemo,
}

impl TpmQuoteValidator {
    /// A validator with a mandatory AK trust policy and measurements source (fixed:
    /// [`crate::Measurements::into_provider`]; replaced by the binary when its file
    /// changes: [`crate::SharedMeasurements`]).
    pub fn new(trust: AkTrust, measurements: Arc<dyn MeasurementsProvider>) -> Self {
        Self {
            trust,
            measurements,
            clock: Arc::new(SystemTime::now),
            pcr_digests: PcrDigestMemo::default(),
        }
    }

    /// Uses `clock` instead of the system time for certificate validity periods.
    pub fn with_clock(mut self, clock: impl Fn() -> SystemTime + Send + Sync + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Like [`Validator::validate`], and also returns what was checked of a confidential
    /// VM's hardware report, field by field, whether or not the evidence was accepted (for
    /// `asterism verify`; empty for the other AK trust policies).
    pub fn validate_explained(
        &self,
        evidence: &[u8],
        expected: &ReportData,
    ) -> (Vec<Check>, Result<VerifiedEvidence, ValidationError>) {
        let explained = self.validate_with_pcrs(evidence, expected);
        (explained.checks, explained.result)
    }

    /// Like [`Self::validate_explained`], and also returns the quote's PCR values once they
    /// are proven, so that a refusal by the measurements can still show every PCR.
    pub fn validate_with_pcrs(&self, evidence: &[u8], expected: &ReportData) -> Explained {
        let mut checks = Vec::new();
        let mut pcrs = None;
        let result = self.check(
            evidence,
            Binding::ReportData(expected),
            &mut checks,
            Some(&mut pcrs),
        );
        log_result(&result);
        Explained {
            checks,
            pcrs,
            result,
        }
    }

    /// Validates evidence taken with another verifier's nonce (not a [`ReportData`]): the
    /// real cloud evidence of the tests.
    #[cfg(test)]
    pub(crate) fn validate_raw_binding(
        &self,
        evidence: &[u8],
        qualifying_data: &[u8],
    ) -> Result<VerifiedEvidence, ValidationError> {
        self.check(
            evidence,
            Binding::Raw(qualifying_data),
            &mut Vec::new(),
            None,
        )
    }

    fn check(
        &self,
        evidence: &[u8],
        expected: Binding<'_>,
        checks: &mut Vec<Check>,
        proven_pcrs: Option<&mut Option<Vec<Measurement>>>,
    ) -> Result<VerifiedEvidence, ValidationError> {
        let explaining = proven_pcrs.is_some();
        let ev = QuoteEvidence::decode(evidence)
            .map_err(|e| ValidationError::Malformed(error_chain(&e)))?;

        let ak = AkKey::from_public(&ev.ak_public, self.trust.attribute_rule())?;
        // The identity comes from the key, the part a certificate vouches for, not from
        // the presented bytes.
        let fingerprint = ak.fingerprint()?;
        let measurements = self.measurements.current();
        let (cvm_checks, trust) =
            self.trust
                .check(&ak, &fingerprint, &ev, measurements.cvm(), (self.clock)());
        checks.extend(cvm_checks);
        let trust_warning = trust?;

        ak.verify(&ev.attest_bytes, &ev.signature)?;

        let selected = signed_sha256_selection(&ev.attest.quote)?;
        // Compared in place: both ascend, so equal sequences are equal sets.
        if !ev.pcrs.keys().copied().eq(selected.iter()) {
            let supplied: BTreeSet<PcrIndex> = ev.pcrs.keys().copied().collect();
            return Err(ValidationError::Policy(format!(
                "supplied PCRs {} do not match the signed selection {}",
                list(&supplied),
                list(&selected.indices())
            )));
        }
        if ev.attest.quote.pcr_digest.as_slice() != self.pcr_digests.digest(&ev.pcrs).as_slice() {
            return Err(ValidationError::Policy(
                "the supplied PCR values do not hash to the signed pcrDigest".into(),
            ));
        }

        if !expected.matches(&ev.attest.extra_data) {
            return Err(ValidationError::BindingMismatch);
        }
        // Only now: the values come from a trusted AK, are signed, and belong to this nonce.
        let measured: Vec<Measurement> = ev
            .pcrs
            .iter()
            .map(|(i, v)| Measurement {
                index: u32::from(i.get()),
                value: v.to_vec(),
            })
            .collect();
        // A copy only for a caller that explains (the plain path has no use for it).
        if let Some(proven) = proven_pcrs {
            *proven = Some(measured.clone());
        }

        if let Some(bytes) = &ev.event_log {
            let (log, covered) = replayed_log(bytes, &ev.pcrs)?;
            checks.extend(explain_mismatches(&measurements, &ev.pcrs, &log, &covered));
        }

        let mut warnings: Vec<String> = trust_warning.into_iter().collect();
        warnings.extend(
            checks
                .iter()
                .filter(|c| c.outcome == Outcome::Warn)
                .map(|c| format!("warn-only: {c}")),
        );
        warnings.extend(measurements.compare(&ev.pcrs)?);

        // The explaining caller keeps its own list; the plain path hands its list over.
        let checks = if explaining {
            checks.clone()
        } else {
            std::mem::take(checks)
        };
        Ok(
            VerifiedEvidence::new(VARIANT, fingerprint.to_string(), measured, warnings)
                .with_checks(checks),
        )
    }
}

/// What the quote's qualifying data must be.
enum Binding<'a> {
    /// The verifier's binding: what every caller outside this crate's tests uses.
    ReportData(&'a ReportData),
    /// Exactly these bytes.
    #[cfg(test)]
    Raw(&'a [u8]),
}

impl Binding<'_> {
    /// Whether `extra_data` is the binding, in constant time.
    fn matches(&self, extra_data: &[u8]) -> bool {
        match self {
            Self::ReportData(r) => r.matches(extra_data),
            #[cfg(test)]
            Self::Raw(raw) => {
                use subtle::ConstantTimeEq;
                raw.len() == extra_data.len() && bool::from(raw.ct_eq(extra_data))
            }
        }
    }
}

/// What [`TpmQuoteValidator::validate_with_pcrs`] found.
#[derive(Debug)]
pub struct Explained {
    /// What was checked of a confidential VM's hardware report (empty for other AK trust
    /// policies).
    pub checks: Vec<Check>,
    /// The quote's PCR values, set only once the AK was trusted, the signature, the PCR
    /// digest and the nonce binding verified: trustworthy even when `result` is a
    /// measurement refusal. `None` when the evidence was refused before that.
    pub pcrs: Option<Vec<Measurement>>,
    /// The verdict, as [`Validator::validate`] returns it.
    pub result: Result<VerifiedEvidence, ValidationError>,
}

impl crate::sealed::Sealed for TpmQuoteValidator {}

impl Validator for TpmQuoteValidator {
    fn variant(&self) -> &'static str {
        VARIANT
    }

    fn validate(
        &self,
        evidence: &[u8],
        expected: &ReportData,
    ) -> Result<VerifiedEvidence, ValidationError> {
        let result = self.check(
            evidence,
            Binding::ReportData(expected),
            &mut Vec::new(),
            None,
        );
        log_result(&result);
        result
    }
}

fn log_result(result: &Result<VerifiedEvidence, ValidationError>) {
    match result {
        Ok(v) => tracing::debug!(ak = v.identity(), "tpm-quote evidence accepted"),
        Err(e) => tracing::info!(reason = %e, "tpm-quote evidence rejected"),
    }
}

/// The signed selection must be exactly one SHA-256 bank with at least one PCR.
fn signed_sha256_selection(quote: &QuoteInfo) -> Result<&PcrSelection, ValidationError> {
    match quote.pcr_select.as_slice() {
        [only] if only.hash == alg::SHA256 => {
            if only.iter().next().is_none() {
                return Err(ValidationError::Policy("the quote selects no PCRs".into()));
            }
            Ok(only)
        }
        _ => {
            let banks: Vec<String> = quote
                .pcr_select
                .iter()
                .map(|s| format!("{:#06x}", s.hash))
                .collect();
            Err(ValidationError::Policy(format!(
                "the signed PCR selection must be exactly the SHA-256 bank (0x000b); found banks [{}]",
                banks.join(", ")
            )))
        }
    }
}

/// SHA-256 over the values in ascending index order, as the TPM computes `pcrDigest` for a
/// single-bank selection.
fn pcr_digest(pcrs: &BTreeMap<PcrIndex, [u8; 32]>) -> [u8; 32] {
    crate::sha::sha256_parts(pcrs.values().map(<[u8; 32]>::as_slice))
}

/// How many PCR sets [`PcrDigestMemo`] keeps.
const PCR_DIGEST_MEMO: usize = 8;

/// The last few [`pcr_digest`]s, keyed by the exact indices and values hashed.
///
/// Nodes booted from one image send the same PCR values, and hashing 24 of them is a third
/// of a verification's cost beside the signature on a machine without SHA extensions. This
/// keeps no verdict: a hit returns exactly what hashing those bytes returns, and the result
/// is still compared with the signed `pcrDigest`, so a peer that fills the memo gains
/// nothing but a miss for others (bounded: a miss costs one comparison per entry).
struct PcrDigestMemo(ExactMemo<[u8; 32]>);

impl Default for PcrDigestMemo {
    fn default() -> Self {
        Self(ExactMemo::new(PCR_DIGEST_MEMO))
    }
}

impl PcrDigestMemo {
    fn digest(&self, pcrs: &BTreeMap<PcrIndex, [u8; 32]>) -> [u8; 32] {
        // The key: each index byte and value, in ascending order (at most 24 x 33 bytes).
        let mut key = [0u8; 24 * 33];
        let mut len = 0;
        for (i, v) in pcrs {
            let Some((index, value)) = key
                .get_mut(len..len + 33)
                .and_then(|slot| slot.split_first_mut())
            else {
                return pcr_digest(pcrs);
            };
            *index = i.get();
            value.copy_from_slice(v);
            len += 33;
        }
        let key = key.get(..len).unwrap_or_default();
        if let Some(d) = self.0.get(key) {
            return d;
        }
        let d = pcr_digest(pcrs);
        self.0.insert(key, d);
        d
    }
}

/// Parses the event log and replays it; refuses it unless every quoted PCR it extends
/// replays to the quoted value. Returns the log and the PCRs it covers.
fn replayed_log(
    bytes: &[u8],
    quoted: &BTreeMap<PcrIndex, [u8; 32]>,
) -> Result<(EventLog, BTreeSet<PcrIndex>), ValidationError> {
    let log = EventLog::parse(bytes).map_err(ValidationError::EventLog)?;
    let replayed = log.replay_sha256().map_err(ValidationError::EventLog)?;
    for (index, value) in &replayed {
        if let Some(q) = quoted.get(index)
            && q != value
        {
            return Err(ValidationError::EventLogReplay {
                index: u32::from(index.get()),
                replayed: hex::encode(value),
                quoted: hex::encode(q),
            });
        }
    }
    let covered = replayed.keys().copied().collect();
    Ok((log, covered))
}

/// For every PCR that differs from its expected value and that the (replayed) log covers:
/// the first event that differs from the reference events, or, without reference events,
/// every event of the PCR. Each is logged, so the verifier's log says which event changed.
fn explain_mismatches(
    measurements: &Measurements,
    quoted: &BTreeMap<PcrIndex, [u8; 32]>,
    log: &EventLog,
    covered: &BTreeSet<PcrIndex>,
) -> Vec<Check> {
    let mut checks = Vec::new();
    for (index, want) in measurements.iter() {
        let differs = quoted.get(&index).is_some_and(|v| *v != want.expected);
        if !differs || !covered.contains(&index) {
            continue;
        }
        let outcome = match want.mode {
            MeasurementMode::Enforce => Outcome::Fail,
            MeasurementMode::WarnOnly => Outcome::Warn,
        };
        let events: Vec<&Event> = log.extended(index).collect();
        let references = measurements.reference_events(index);
        let locality = log.startup_locality();
        let found = if references.is_empty() {
            start_difference(index, locality, None, outcome)
                .into_iter()
                .chain(events.iter().enumerate().map(|(k, e)| {
                    Check::new(
                        event_field(index, k, Some(e)),
                        "(no reference events)",
                        digest_hex(e),
                        outcome,
                    )
                }))
                .collect()
        } else {
            let reference_locality = measurements.reference_startup_locality(index);
            start_difference(index, locality, Some(reference_locality), outcome)
                .or_else(|| first_difference(index, &events, references, outcome))
                .into_iter()
                .collect::<Vec<_>>()
        };
        for c in &found {
            tracing::info!(pcr = index.get(), check = %c, "PCR differs from its expected value at this event");
        }
        checks.extend(found);
    }
    checks
}

/// Where PCR `index` started before its first event ([`pcr_start`]), when that explains a
/// difference: with reference events, when the log's startup locality starts the PCR
/// elsewhere than the reference's; without, when it starts the PCR elsewhere than zero.
/// Only PCR 0 can differ.
fn start_difference(
    index: PcrIndex,
    locality: u8,
    reference_locality: Option<u8>,
    outcome: Outcome,
) -> Option<Check> {
    let start = pcr_start(index, locality);
    let observed = format!("{} (startup locality {locality})", hex::encode(start));
    let expected = match reference_locality {
        Some(r) if pcr_start(index, r) == start => return None,
        Some(r) => format!(
            "{} (startup locality {r})",
            hex::encode(pcr_start(index, r))
        ),
        None if start == [0; 32] => return None,
        None => "(no reference events)".to_owned(),
    };
    Some(Check::new(
        format!("PCR {index} start (StartupLocality)"),
        expected,
        observed,
        outcome,
    ))
}

/// The first position where the log's events of PCR `index` and the reference events
/// differ (a digest, an event the reference lacks, an event the log lacks).
fn first_difference(
    index: PcrIndex,
    events: &[&Event],
    references: &[crate::ReferenceEvent],
    outcome: Outcome,
) -> Option<Check> {
    let reference_text = |r: &crate::ReferenceEvent| match &r.description {
        Some(d) => format!("{} ({d})", hex::encode(r.digest)),
        None => hex::encode(r.digest),
    };
    for k in 0..events.len().max(references.len()) {
        let check = match (events.get(k), references.get(k)) {
            (Some(e), Some(r)) if e.sha256() == Some(r.digest) => continue,
            (Some(e), Some(r)) => Check::new(
                event_field(index, k, Some(e)),
                reference_text(r),
                digest_hex(e),
                outcome,
            ),
            (Some(e), None) => Check::new(
                event_field(index, k, Some(e)),
                format!("no such event (the reference has {})", references.len()),
                digest_hex(e),
                outcome,
            ),
            (None, Some(r)) => Check::new(
                event_field(index, k, None),
                reference_text(r),
                format!("no such event (the log has {})", events.len()),
                outcome,
            ),
            (None, None) => break,
        };
        return Some(check);
    }
    None
}

/// `PCR 9 event 2 (EV_EVENT_TAG Linux initrd)`: the event's position among the PCR's
/// events, counted from 1, and what it is.
fn event_field(index: PcrIndex, position: usize, event: Option<&Event>) -> String {
    let n = position + 1;
    match event {
        Some(e) => format!("PCR {index} event {n} ({})", e.label()),
        None => format!("PCR {index} event {n}"),
    }
}

fn digest_hex(e: &Event) -> String {
    e.sha256()
        .map_or_else(|| "no SHA-256 digest".into(), hex::encode)
}

fn list(s: &BTreeSet<PcrIndex>) -> String {
    let v: Vec<String> = s.iter().map(|i| i.to_string()).collect();
    format!("[{}]", v.join(","))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn set(seed: u8, count: u8) -> BTreeMap<PcrIndex, [u8; 32]> {
        (0..count)
            .map(|i| (PcrIndex::new(i).unwrap(), [seed.wrapping_add(i); 32]))
            .collect()
    }

    #[test]
    fn the_digest_memo_returns_what_hashing_returns_for_hits_misses_and_after_eviction() {
        let memo = PcrDigestMemo::default();
        // More distinct sets than the memo holds, each asked twice, and in two rounds.
        for _round in 0..2 {
            for seed in 0..(PCR_DIGEST_MEMO as u8 * 2) {
                let pcrs = set(seed, 24);
                assert_eq!(memo.digest(&pcrs), pcr_digest(&pcrs));
                assert_eq!(memo.digest(&pcrs), pcr_digest(&pcrs));
            }
        }
        assert_eq!(memo.0.len(), PCR_DIGEST_MEMO);
        // One value changed, or one index fewer, or the same values under other indices:
        // each is another key.
        let pcrs = set(1, 24);
        assert_eq!(memo.digest(&pcrs), pcr_digest(&pcrs));
        let mut changed = pcrs.clone();
        changed.insert(PcrIndex::new(23).unwrap(), [0; 32]);
        assert_eq!(memo.digest(&changed), pcr_digest(&changed));
        assert_ne!(memo.digest(&changed), memo.digest(&pcrs));
        let mut fewer = pcrs.clone();
        fewer.remove(&PcrIndex::new(23).unwrap());
        assert_eq!(memo.digest(&fewer), pcr_digest(&fewer));
        let moved: BTreeMap<_, _> = [(PcrIndex::new(1).unwrap(), [7; 32])].into();
        let here: BTreeMap<_, _> = [(PcrIndex::new(2).unwrap(), [7; 32])].into();
        assert_eq!(memo.digest(&moved), pcr_digest(&moved));
        // Same value and digest input, other index: the TPM's digest is over values only,
        // so both hash alike; the selection check, not the memo, tells them apart.
        assert_eq!(memo.digest(&here), pcr_digest(&here));
    }
}

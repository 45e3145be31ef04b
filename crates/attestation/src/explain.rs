//! What a verifier checked, field by field: the record `asterism verify` prints for a
//! confidential-VM report (launch measurement, TCB parts, policy bits, binding), each with
//! the expected and the observed value and whether it passed.

use std::borrow::Cow;
use std::fmt;

/// How one check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The observed value meets the policy.
    Pass,
    /// The observed value differs, but the policy only warns about this field.
    Warn,
    /// The observed value does not meet the policy; the evidence is refused.
    Fail,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Outcome::Pass => "pass",
            Outcome::Warn => "warn",
            Outcome::Fail => "FAIL",
        })
    }
}

/// One checked field: its name, the value the policy wants and the value the evidence has.
/// Each is text; fixed words are borrowed, so that recording a check on every verification
/// allocates only for the values it prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// The field, named as in the hardware vendor's specification (for example
    /// `reported_tcb.snp` or `td_attributes.debug`).
    pub field: Cow<'static, str>,
    /// What the policy wants, in words or as a value (for example `>= 8` or a hex digest).
    pub expected: Cow<'static, str>,
    /// What the evidence holds.
    pub observed: Cow<'static, str>,
    /// Whether the field passed.
    pub outcome: Outcome,
}

impl Check {
    /// A check of `field` that ended with `outcome`.
    pub fn new(
        field: impl Into<Cow<'static, str>>,
        expected: impl Into<Cow<'static, str>>,
        observed: impl Into<Cow<'static, str>>,
        outcome: Outcome,
    ) -> Self {
        Self {
            field: field.into(),
            expected: expected.into(),
            observed: observed.into(),
            outcome,
        }
    }

    /// A check that passes when `ok`, and fails otherwise.
    pub fn pass_if(
        ok: bool,
        field: impl Into<Cow<'static, str>>,
        expected: impl Into<Cow<'static, str>>,
        observed: impl Into<Cow<'static, str>>,
    ) -> Self {
        let outcome = if ok { Outcome::Pass } else { Outcome::Fail };
        Self::new(field, expected, observed, outcome)
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:<4} {}: expected {}, observed {}",
            self.outcome, self.field, self.expected, self.observed
        )
    }
}

/// Every check of one report, in the order they ran. Verification stops at the first
/// signature or chain failure (nothing after it can be trusted), but runs every field check
/// of a correctly signed report, so that one rejection lists all that is wrong.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Explanation {
    /// The checks, in order.
    pub checks: Vec<Check>,
}

impl Explanation {
    /// Records a check.
    pub fn push(&mut self, check: Check) {
        self.checks.push(check);
    }

    /// The first failed check, if any.
    pub fn first_failure(&self) -> Option<&Check> {
        self.checks.iter().find(|c| c.outcome == Outcome::Fail)
    }

    /// The checks that only warned.
    pub fn warnings(&self) -> impl Iterator<Item = &Check> {
        self.checks.iter().filter(|c| c.outcome == Outcome::Warn)
    }
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in &self.checks {
            writeln!(f, "{c}")?;
        }
        Ok(())
    }
}

/// Decodes `text`, hex, into exactly `N` bytes; the error says what is wrong ("not hex: …"
/// or "<n> bytes, want N"). Reference values and policy digests are read with it.
pub(crate) fn hex_array<const N: usize>(text: &str) -> Result<[u8; N], String> {
    let bytes = hex::decode(text).map_err(|e| format!("not hex: {e}"))?;
    bytes
        .as_slice()
        .try_into()
        .map_err(|_| format!("{} bytes, want {N}", bytes.len()))
}

/// An expected fixed-size value of a confidential-VM report (a 48-byte launch measurement,
/// an MRTD, an RTMR, a 32-byte host data field) and what a mismatch means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reference<const N: usize> {
    /// The expected bytes.
    pub value: [u8; N],
    /// Enforce (a mismatch rejects) or warn only (a mismatch is reported, never gates).
    pub mode: crate::MeasurementMode,
}

impl<const N: usize> Reference<N> {
    /// An enforced reference value.
    pub fn enforce(value: [u8; N]) -> Self {
        Self {
            value,
            mode: crate::MeasurementMode::Enforce,
        }
    }

    /// A warn-only reference value.
    pub fn warn_only(value: [u8; N]) -> Self {
        Self {
            value,
            mode: crate::MeasurementMode::WarnOnly,
        }
    }

    /// Compares `observed` with the reference: pass when equal, otherwise fail or warn as
    /// the mode says. Values print as lower-case hex.
    pub fn check(&self, field: impl Into<Cow<'static, str>>, observed: &[u8]) -> Check {
        let outcome = if observed == self.value.as_slice() {
            Outcome::Pass
        } else if self.mode == crate::MeasurementMode::WarnOnly {
            Outcome::Warn
        } else {
            Outcome::Fail
        };
        Check::new(field, lower_hex(&self.value), lower_hex(observed), outcome)
    }
}

/// Lower-case hex, as `hex::encode` writes it, without its per-character iterator: the
/// field checks run on every quote, and encoding was a noticeable share of their cost.
pub(crate) fn lower_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let digit = |n: u8| DIGITS.get(usize::from(n)).copied().unwrap_or(b'0');
    let mut out = Vec::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(digit(b >> 4));
        out.push(digit(b & 0x0f));
    }
    String::from_utf8(out).unwrap_or_default()
}

//! Which TPM failures are worth retrying, and how long to wait between attempts.
//!
//! Pure functions: [`classify`] maps a response code to a [`RetryAction`] and
//! [`RetryPolicy::delay`] gives the bounded exponential back-off. [`crate::Tpm`] applies them
//! around every command.
//!
//! The TSS's ESAPI already re-sends a command a few times, without waiting, when the TPM
//! answers `TPM_RC_RETRY`, `TPM_RC_YIELDED` or `TPM_RC_TESTING`. This layer adds what ESAPI
//! does not: a pause that grows between rounds, a hard bound on the total, and recovery from
//! transient-object exhaustion.

use std::time::Duration;

use crate::error::{
    Layer, ResponseCode, TPM_RC_MEMORY, TPM_RC_NV_RATE, TPM_RC_OBJECT_MEMORY, TPM_RC_RETRY,
    TPM_RC_SESSION_MEMORY, TPM_RC_TESTING, TPM_RC_YIELDED,
};

/// What to do after a command failed with a given code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RetryAction {
    /// Retrying cannot help: report the error.
    Fail,
    /// The TPM is busy (`TPM_RC_RETRY`, `TPM_RC_YIELDED`, `TPM_RC_TESTING`, `TPM_RC_NV_RATE`,
    /// or the TSS's own "try again"): wait, then send the command again.
    Retry,
    /// The TPM has no room for another transient object or session
    /// (`TPM_RC_OBJECT_MEMORY`, `TPM_RC_SESSION_MEMORY`, `TPM_RC_MEMORY`): flush the transient
    /// objects this connection can see, wait, then send the command again.
    FlushAndRetry,
}

/// The TSS base code "try again" (shared by all software layers).
const TSS_TRY_AGAIN: u32 = 9;

/// Decides whether a failed command may be retried.
pub fn classify(code: ResponseCode) -> RetryAction {
    match code.tpm_base() {
        Some(TPM_RC_RETRY | TPM_RC_YIELDED | TPM_RC_TESTING | TPM_RC_NV_RATE) => RetryAction::Retry,
        Some(TPM_RC_OBJECT_MEMORY | TPM_RC_SESSION_MEMORY | TPM_RC_MEMORY) => {
            RetryAction::FlushAndRetry
        }
        Some(_) => RetryAction::Fail,
        None => match code.layer() {
            Layer::Esapi | Layer::Sapi | Layer::Tcti if code.raw() & 0xffff == TSS_TRY_AGAIN => {
                RetryAction::Retry
            }
            _ => RetryAction::Fail,
        },
    }
}

/// Bounded exponential back-off: the first retry waits `initial_delay`, each further one
/// twice as long, capped at `max_delay`; at most `max_attempts` sends in all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Sends of one command, the first included (at least 1).
    pub max_attempts: u32,
    /// Wait before the first retry.
    pub initial_delay: Duration,
    /// Upper bound of any single wait.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    /// 8 sends, waiting 20, 40, 80, 160, 320, 640 and 1000 ms: about 2.3 s in the worst
    /// case, long enough for a TPM self-test or an NV rate limit to pass.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 8,
            initial_delay: Duration::from_millis(20),
            max_delay: Duration::from_secs(1),
        }
    }
}

impl RetryPolicy {
    /// A policy that never retries.
    pub const fn no_retry() -> Self {
        RetryPolicy {
            max_attempts: 1,
            initial_delay: Duration::ZERO,
            max_delay: Duration::ZERO,
        }
    }

    /// How long to wait after `failed_attempts` sends have failed (counting from 1), or
    /// `None` when the budget is spent.
    pub fn delay(&self, failed_attempts: u32) -> Option<Duration> {
        if failed_attempts == 0 || failed_attempts >= self.max_attempts {
            return None;
        }
        let doublings = (failed_attempts - 1).min(31);
        let delay = self
            .initial_delay
            .checked_mul(1u32 << doublings)
            .unwrap_or(self.max_delay);
        Some(delay.min(self.max_delay))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::TPM_RC_HANDLE;

    #[test]
    fn busy_tpm_codes_are_retried() {
        for rc in [TPM_RC_RETRY, TPM_RC_YIELDED, TPM_RC_TESTING, TPM_RC_NV_RATE] {
            assert_eq!(
                classify(ResponseCode::new(rc)),
                RetryAction::Retry,
                "{rc:#x}"
            );
        }
        // The same codes relayed by a resource manager.
        assert_eq!(
            classify(ResponseCode::new(0x000c_0000 | TPM_RC_RETRY)),
            RetryAction::Retry
        );
        // The TSS's own "try again" from ESAPI and from the TCTI.
        assert_eq!(classify(ResponseCode::new(0x0007_0009)), RetryAction::Retry);
        assert_eq!(classify(ResponseCode::new(0x000a_0009)), RetryAction::Retry);
    }

    #[test]
    fn object_memory_exhaustion_flushes_before_retrying() {
        assert_eq!(
            classify(ResponseCode::new(0x902)),
            RetryAction::FlushAndRetry
        );
        assert_eq!(
            classify(ResponseCode::new(TPM_RC_SESSION_MEMORY)),
            RetryAction::FlushAndRetry
        );
        assert_eq!(
            classify(ResponseCode::new(TPM_RC_MEMORY)),
            RetryAction::FlushAndRetry
        );
    }

    #[test]
    fn real_failures_are_not_retried() {
        for rc in [
            TPM_RC_HANDLE | 0x100, // TPM_RC_HANDLE, handle 1
            0x101,                 // TPM_RC_FAILURE
            0x921,                 // TPM_RC_LOCKOUT: waiting milliseconds does not help
            0x98E,                 // TPM_RC_AUTH_FAIL
            0x000a_000a,           // TSS2_TCTI_RC_IO_ERROR
            0x0007_0005,           // TSS2_ESYS_RC_BAD_REFERENCE
        ] {
            assert_eq!(
                classify(ResponseCode::new(rc)),
                RetryAction::Fail,
                "{rc:#x}"
            );
        }
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_and_stops_at_the_budget() {
        let policy = RetryPolicy {
            max_attempts: 6,
            initial_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(50),
        };
        let delays: Vec<_> = (1..=6).map(|n| policy.delay(n)).collect();
        assert_eq!(
            delays,
            vec![
                Some(Duration::from_millis(10)),
                Some(Duration::from_millis(20)),
                Some(Duration::from_millis(40)),
                Some(Duration::from_millis(50)),
                Some(Duration::from_millis(50)),
                None,
            ]
        );
        assert_eq!(policy.delay(0), None);
        assert_eq!(RetryPolicy::no_retry().delay(1), None);
    }

    #[test]
    fn default_budget_is_bounded() {
        let policy = RetryPolicy::default();
        let total: Duration = (1..policy.max_attempts)
            .filter_map(|n| policy.delay(n))
            .sum();
        assert!(total <= Duration::from_secs(3), "{total:?}");
        assert!(total >= Duration::from_secs(1), "{total:?}");
        // Huge attempt numbers neither overflow nor exceed the cap.
        let long = RetryPolicy {
            max_attempts: u32::MAX,
            ..policy
        };
        assert_eq!(long.delay(200), Some(policy.max_delay));
    }
}

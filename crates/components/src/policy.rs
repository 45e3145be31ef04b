//! The download policy: attempts, per-attempt timeout, exponential backoff, size caps, and
//! which HTTP statuses are worth retrying. Values only, no I/O.

use std::time::Duration;

use http::StatusCode;

/// Retries, timeouts and size limits of downloads and archives.
#[derive(Debug, Clone)]
pub struct DownloadPolicy {
    /// How many attempts at most (≥ 1).
    pub max_attempts: u32,
    /// The pause after the first failed attempt; it doubles after each further one.
    pub initial_backoff: Duration,
    /// The longest pause.
    pub max_backoff: Duration,
    /// The deadline of one attempt, body included.
    pub attempt_timeout: Duration,
    /// The largest resource accepted, bytes.
    pub max_size: u64,
    /// The most bytes an archive may unpack to.
    pub max_extracted_size: u64,
    /// The most entries an archive may hold.
    pub max_entries: u64,
    /// How many redirects are followed.
    pub max_redirects: u32,
    /// The shortest interval between two progress lines of one download.
    pub progress_interval: Duration,
}

impl Default for DownloadPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 8,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
            attempt_timeout: Duration::from_secs(10 * 60),
            max_size: 1 << 30,
            max_extracted_size: 4 << 30,
            max_entries: 100_000,
            max_redirects: 10,
            progress_interval: Duration::from_secs(5),
        }
    }
}

impl DownloadPolicy {
    /// The pause before attempt `attempt + 1` after `attempt` (1-based) failed:
    /// `initial · 2^(attempt−1)`, at most `max_backoff`.
    #[must_use]
    pub fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u32
            .checked_shl(attempt.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.initial_backoff
            .checked_mul(factor)
            .unwrap_or(self.max_backoff)
            .min(self.max_backoff)
    }
}

/// Whether an HTTP status is worth another attempt: 408, 425, 429, 502, 503 and 504, the
/// statuses that say the server or a proxy may answer later; every other status is final.
#[must_use]
pub fn is_retriable_status(status: StatusCode) -> bool {
    matches!(status.as_u16(), 408 | 425 | 429 | 502 | 503 | 504)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let p = DownloadPolicy {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(350),
            ..DownloadPolicy::default()
        };
        assert_eq!(p.backoff(1), Duration::from_millis(100));
        assert_eq!(p.backoff(2), Duration::from_millis(200));
        assert_eq!(p.backoff(3), Duration::from_millis(350));
        assert_eq!(p.backoff(40), Duration::from_millis(350));
    }

    #[test]
    fn only_the_listed_statuses_are_retried() {
        for s in [408, 425, 429, 502, 503, 504] {
            assert!(is_retriable_status(StatusCode::from_u16(s).unwrap()), "{s}");
        }
        for s in [400, 401, 403, 404, 410, 500, 501] {
            assert!(
                !is_retriable_status(StatusCode::from_u16(s).unwrap()),
                "{s}"
            );
        }
    }
}

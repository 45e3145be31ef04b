//! Pauses between attempts at a busy node.

use std::time::Duration;

/// The first pause.
const FIRST: Duration = Duration::from_millis(250);

/// Pauses between attempts: 0.25 s, doubling, at most `cap`.
#[derive(Debug)]
pub(crate) struct Backoff {
    /// Attempts counted so far.
    pub(crate) attempts: u32,
    cap: Duration,
}

impl Backoff {
    /// Pauses up to `cap`.
    pub(crate) fn new(cap: Duration) -> Self {
        Self { attempts: 0, cap }
    }

    /// Counts an attempt and says how long to wait before the next.
    pub(crate) fn next_wait(&mut self) -> Duration {
        let wait = FIRST.saturating_mul(1 << self.attempts.min(8));
        self.attempts = self.attempts.saturating_add(1);
        wait.min(self.cap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_up_to_the_cap() {
        let mut b = Backoff::new(Duration::from_secs(5));
        let waits: Vec<_> = (0..8).map(|_| b.next_wait().as_millis()).collect();
        assert_eq!(waits, [250, 500, 1000, 2000, 4000, 5000, 5000, 5000]);
        assert_eq!(b.attempts, 8);
    }
}

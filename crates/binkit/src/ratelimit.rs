//! A token bucket per key: the join service's per attested identity, the verify service's
//! per source address.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Buckets kept before idle ones are dropped.
const MAX_BUCKETS: usize = 10_000;

/// Token buckets keyed by a peer's identity (an attested AK, a source address): `rate`
/// requests per second sustained, bursts of `burst`. At most 10,000 keys are tracked;
/// buckets that have refilled completely are forgotten first.
#[derive(Debug)]
pub struct RateLimiter {
    rate: f64,
    burst: f64,
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

impl RateLimiter {
    /// A limiter allowing `rate` requests per second with bursts of `burst`.
    pub fn new(rate: f64, burst: u32) -> Self {
        Self {
            rate: rate.max(0.0),
            burst: f64::from(burst.max(1)),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one token for `key` at `now`; false if the bucket is empty.
    pub fn allow(&self, key: &str, now: Instant) -> bool {
        let Ok(mut buckets) = self.buckets.lock() else {
            return false;
        };
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(key) {
            // Drop buckets that have refilled completely: forgetting them changes nothing.
            let full_after = Duration::from_secs_f64(self.burst / self.rate.max(1e-9));
            buckets.retain(|_, (_, last)| now.saturating_duration_since(*last) < full_after);
        }
        let (tokens, last) = buckets.entry(key.to_owned()).or_insert((self.burst, now));
        let elapsed = now.saturating_duration_since(*last).as_secs_f64();
        *tokens = (*tokens + elapsed * self.rate).min(self.burst);
        *last = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_passes_then_the_rate_applies_per_key() {
        let l = RateLimiter::new(10.0, 20);
        let t = Instant::now();
        assert!((0..20).all(|_| l.allow("a", t)));
        assert!(!l.allow("a", t));
        assert!(l.allow("b", t), "another key has its own bucket");
        assert!(l.allow("a", t + Duration::from_millis(100)));
        assert!(!l.allow("a", t + Duration::from_millis(100)));
    }
}

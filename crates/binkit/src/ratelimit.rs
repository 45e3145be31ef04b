//! A token bucket per key: the join service's per attested identity, the verify service's
//! per source address.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Buckets kept before idle ones are dropped.
const MAX_BUCKETS: usize = 10_000;

/// Token buckets keyed by a peer's identity (an attested AK, a source address): `rate`
/// requests per second sustained, bursts of `burst`. At most 10,000 keys are tracked: when
/// the table is full, the buckets that have refilled completely are forgotten (which
/// changes nothing), then, if that freed less than an eighth, the buckets used longest ago
/// until an eighth is free. So a flood of new keys costs constant time per key, amortised,
/// and bounded memory; a forgotten key starts again with a full bucket, which is why what
/// all keys together may do is bounded elsewhere (the verify service's quote queue).
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
            self.make_room(&mut buckets, now);
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

impl RateLimiter {
    /// Frees at least an eighth of a full table: refilled buckets first, then those used
    /// longest ago.
    fn make_room(&self, buckets: &mut HashMap<String, (f64, Instant)>, now: Instant) {
        let full_after = Duration::from_secs_f64(self.burst / self.rate.max(1e-9));
        buckets.retain(|_, (_, last)| now.saturating_duration_since(*last) < full_after);
        let keep = MAX_BUCKETS - MAX_BUCKETS / 8;
        if buckets.len() > keep {
            let mut by_age: Vec<(Instant, String)> = buckets
                .iter()
                .map(|(key, (_, last))| (*last, key.clone()))
                .collect();
            let forget = buckets.len() - keep;
            by_age.select_nth_unstable_by_key(forget - 1, |(last, _)| *last);
            for (_, key) in by_age.iter().take(forget) {
                buckets.remove(key);
            }
        }
    }

    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.buckets.lock().map_or(0, |b| b.len())
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

    #[test]
    fn a_flood_of_new_keys_is_bounded_and_forgets_the_keys_used_longest_ago() {
        // One token in 1,000 s: no bucket refills within the test.
        let l = RateLimiter::new(0.001, 1);
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(1);
        for n in 0..MAX_BUCKETS - 1 {
            let at = t0 + Duration::from_micros(u64::try_from(n).unwrap());
            assert!(l.allow(&format!("flood-{n}"), at));
        }
        // A key that has used its burst, seen after the flood's first part.
        assert!(l.allow("drained", t1));
        assert!(!l.allow("drained", t1));
        assert!(l.allow("later-first", t1));
        assert!(
            l.tracked() <= MAX_BUCKETS - MAX_BUCKETS / 8 + 1,
            "a full table frees an eighth at once"
        );
        for n in 0..MAX_BUCKETS / 2 {
            assert!(l.allow(&format!("later-{n}"), t1));
            assert!(l.tracked() <= MAX_BUCKETS, "the table grew past its bound");
        }
        // The keys used longest ago were forgotten, not the drained one seen since.
        assert!(!l.allow("drained", t1), "a recent empty bucket kept");
        assert!(l.allow("flood-0", t1), "an old key starts again full");
    }

    #[test]
    fn a_full_table_forgets_refilled_buckets_and_not_one_still_refilling() {
        // Two at once, then one every 2 s: a bucket is full again 4 s after its last use.
        let l = RateLimiter::new(0.5, 2);
        let t0 = Instant::now();
        for n in 0..MAX_BUCKETS - 1 {
            assert!(l.allow(&format!("old-{n}"), t0));
        }
        let t10 = t0 + Duration::from_secs(10);
        assert!(l.allow("drained", t10) && l.allow("drained", t10));
        // Full: the old buckets have refilled and go; the drained one, 2 s later, has one
        // token back, not a fresh burst.
        let t12 = t0 + Duration::from_secs(12);
        assert!(l.allow("new", t12));
        assert_eq!(l.tracked(), 2);
        assert!(l.allow("drained", t12));
        assert!(!l.allow("drained", t12));
    }
}

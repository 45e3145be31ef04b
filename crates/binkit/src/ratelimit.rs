//! Token buckets per key: the join service's per attested identity, the verify service's
//! per source address ([`RateLimiter`]), and the bootstrapper's per source beside what each
//! source has in progress ([`BucketTable`] with a count of its own).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Buckets [`RateLimiter`] keeps before idle ones are dropped.
const MAX_BUCKETS: usize = 10_000;

/// A token bucket's rule: `burst` tokens at once, then `per_second` more each second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    burst: f64,
    per_second: f64,
}

impl Rate {
    /// `burst` at once (at least 1), then `per_second` a second.
    #[must_use]
    pub fn per_second(per_second: f64, burst: u32) -> Self {
        Self {
            burst: f64::from(burst.max(1)),
            per_second: per_second.max(0.0),
        }
    }

    /// `burst` at once (at least 1), then one per `interval`; a zero interval refills at
    /// once.
    #[must_use]
    pub fn one_per(interval: Duration, burst: u32) -> Self {
        let per_second = if interval.is_zero() {
            f64::INFINITY
        } else {
            1.0 / interval.as_secs_f64()
        };
        Self::per_second(per_second, burst)
    }

    /// How long an emptied bucket takes to be full again.
    fn full_after(&self) -> Duration {
        Duration::try_from_secs_f64(self.burst / self.per_second).unwrap_or(Duration::MAX)
    }
}

/// One key's bucket.
#[derive(Debug, Clone, Copy)]
pub struct TokenBucket {
    tokens: f64,
    refilled: Instant,
}

impl TokenBucket {
    /// Takes one token; false if there is none.
    pub fn try_take(&mut self) -> bool {
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Adds what `rate` earned since the last refill, at most up to its burst.
    fn refill(&mut self, rate: Rate, now: Instant) {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        let earned = if rate.per_second.is_infinite() {
            rate.burst
        } else {
            elapsed * rate.per_second
        };
        self.tokens = (self.tokens + earned).min(rate.burst);
        self.refilled = now;
    }
}

/// A token bucket per key, and a `V` beside it (what the key has in progress, say), for at
/// most `max` keys. When the table is full and a new key comes, it forgets first the idle
/// keys whose buckets have refilled (which changes nothing), then, if that freed less than
/// an eighth, the idle keys seen longest ago until an eighth is free; a key whose `V` is
/// not idle is never forgotten. So a flood of new keys costs constant time per key,
/// amortised, and bounded memory; a forgotten key starts again with a full bucket, which is
/// why what all keys together may do must be bounded elsewhere.
#[derive(Debug)]
pub struct BucketTable<K, V = ()> {
    rate: Rate,
    max: usize,
    entries: HashMap<K, (TokenBucket, V)>,
}

impl<K: Hash + Eq + Clone, V: Default> BucketTable<K, V> {
    /// An empty table of at most `max` keys (at least 8), each held to `rate`.
    #[must_use]
    pub fn new(rate: Rate, max: usize) -> Self {
        Self {
            rate,
            max: max.max(8),
            entries: HashMap::new(),
        }
    }

    /// `key`'s bucket, refilled as of `now`, and its `V`; a new key starts with a full
    /// bucket and `V::default()`. `None` if the table is full of keys that `idle` says are
    /// not idle.
    pub fn entry(
        &mut self,
        key: K,
        now: Instant,
        idle: impl Fn(&V) -> bool,
    ) -> Option<(&mut TokenBucket, &mut V)> {
        if self.entries.len() >= self.max && !self.entries.contains_key(&key) {
            self.make_room(now, &idle);
            if self.entries.len() >= self.max {
                return None;
            }
        }
        let (bucket, value) = self.entries.entry(key).or_insert_with(|| {
            let bucket = TokenBucket {
                tokens: self.rate.burst,
                refilled: now,
            };
            (bucket, V::default())
        });
        bucket.refill(self.rate, now);
        Some((bucket, value))
    }

    /// `key`'s `V`, if the table holds `key`.
    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        self.entries.get_mut(key).map(|(_, value)| value)
    }

    /// Whether the table holds `key`.
    pub fn contains(&self, key: &K) -> bool {
        self.entries.contains_key(key)
    }

    /// How many keys the table holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the table holds no key.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Frees an eighth of a full table if its idle keys allow: idle keys with refilled
    /// buckets first, then idle keys seen longest ago.
    fn make_room(&mut self, now: Instant, idle: &impl Fn(&V) -> bool) {
        let full_after = self.rate.full_after();
        self.entries.retain(|_, (bucket, value)| {
            !idle(value) || now.saturating_duration_since(bucket.refilled) < full_after
        });
        let keep = self.max - self.max / 8;
        if self.entries.len() <= keep {
            return;
        }
        let mut by_age: Vec<(Instant, K)> = self
            .entries
            .iter()
            .filter(|(_, (_, value))| idle(value))
            .map(|(key, (bucket, _))| (bucket.refilled, key.clone()))
            .collect();
        // Once per eighth of the table's new keys: a sort is cheap enough.
        by_age.sort_unstable_by_key(|(seen, _)| *seen);
        let forget = self.entries.len() - keep;
        for (_, key) in by_age.iter().take(forget) {
            self.entries.remove(key);
        }
    }
}

/// Token buckets keyed by a peer's identity (an attested AK, a source address): `rate`
/// requests per second sustained, bursts of `burst`, for at most 10,000 keys (a
/// [`BucketTable`], whose keys are all idle: a full table forgets refilled buckets, then
/// those used longest ago). What all keys together may do is bounded elsewhere (the verify
/// service's quote queue).
#[derive(Debug)]
pub struct RateLimiter {
    buckets: Mutex<BucketTable<String>>,
}

impl RateLimiter {
    /// A limiter allowing `rate` requests per second with bursts of `burst`.
    pub fn new(rate: f64, burst: u32) -> Self {
        Self {
            buckets: Mutex::new(BucketTable::new(Rate::per_second(rate, burst), MAX_BUCKETS)),
        }
    }

    /// Takes one token for `key` at `now`; false if the bucket is empty.
    pub fn allow(&self, key: &str, now: Instant) -> bool {
        let Ok(mut buckets) = self.buckets.lock() else {
            return false;
        };
        buckets
            .entry(key.to_owned(), now, |()| true)
            .is_some_and(|(bucket, ())| bucket.try_take())
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

    #[test]
    fn one_per_interval_earns_one_token_each_interval_and_a_zero_interval_refills_at_once() {
        let mut t = BucketTable::<u8>::new(Rate::one_per(Duration::from_secs(2), 3), 8);
        let t0 = Instant::now();
        let mut take = |at: Instant| t.entry(1, at, |()| true).unwrap().0.try_take();
        assert!((0..3).all(|_| take(t0)));
        assert!(!take(t0));
        assert!(
            !take(t0 + Duration::from_secs(1)),
            "half an interval earns nothing"
        );
        assert!(take(t0 + Duration::from_secs(2)));
        assert!(!take(t0 + Duration::from_secs(2)));

        let mut t = BucketTable::<u8>::new(Rate::one_per(Duration::ZERO, 2), 8);
        assert!((0..100).all(|_| t.entry(1, t0, |()| true).unwrap().0.try_take()));
    }

    /// A key whose count says it is busy is never forgotten: a table full of busy keys
    /// refuses a new one, and takes it once one of them is idle again.
    #[test]
    fn a_full_table_keeps_its_busy_keys_and_refuses_a_new_one_while_all_are_busy() {
        let mut t = BucketTable::<u32, usize>::new(Rate::per_second(1.0, 1), 8);
        let t0 = Instant::now();
        let idle = |busy: &usize| *busy == 0;
        for key in 0..8 {
            *t.entry(key, t0, idle).unwrap().1 += 1;
        }
        let later = t0 + Duration::from_secs(60);
        assert!(t.entry(100, later, idle).is_none(), "every key is busy");
        assert!(t.entry(3, later, idle).is_some(), "a key held goes on");
        *t.get_mut(&3).unwrap() -= 1;
        assert!(t.entry(100, later, idle).is_some());
        assert!(!t.contains(&3), "the idle key made room");
        assert!((0..8).filter(|k| *k != 3).all(|k| t.contains(&k)));
        assert_eq!(t.len(), 8);
        assert!(t.get_mut(&3).is_none());
    }

    /// Room is made only when the table is full and the key is new: a refilled key stays
    /// while there is room, and a known key in a full table forgets no other.
    #[test]
    fn a_table_forgets_only_when_full_and_the_key_is_new() {
        let mut t = BucketTable::<u32>::new(Rate::per_second(1.0, 1), 8);
        let t0 = Instant::now();
        assert!(t.is_empty());
        assert!(t.entry(0, t0, |()| true).unwrap().0.try_take());
        // Full again 1 s after its last use: from then on, it counts as refilled.
        let refilled = t0 + Duration::from_secs(1);
        for key in 1..8 {
            assert!(t.entry(key, refilled, |()| true).is_some());
        }
        assert!(t.contains(&0), "a refilled key kept while there was room");
        assert!(t.entry(0, refilled, |()| true).is_some());
        assert_eq!(t.len(), 8, "a known key made no room");
        assert!(t.entry(8, refilled, |()| true).is_some());
        assert!(!t.is_empty() && t.len() <= 8);

        // A full table whose keys were all used 1 s ago, the time a bucket of 1 takes to
        // refill, forgets them all for a new key.
        let mut t = BucketTable::<u32>::new(Rate::per_second(1.0, 1), 8);
        for key in 0..8 {
            assert!(t.entry(key, t0, |()| true).unwrap().0.try_take());
        }
        assert!(t.entry(8, refilled, |()| true).is_some());
        assert_eq!(t.len(), 1);
    }
}

//! A cap on what one key (a source address, an attestation key) holds at once: each
//! connection takes a [`Share`] of its key and gives it back when dropped.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};

/// At most `max` shares per key at once. A key with no share held is forgotten, so the map
/// holds at most one entry per share held.
#[derive(Debug)]
pub struct Shares<K> {
    held: Arc<Mutex<HashMap<K, usize>>>,
    max: usize,
}

impl<K: Eq + Hash + Clone> Shares<K> {
    /// At most `max` shares per key.
    pub fn new(max: usize) -> Self {
        Self {
            held: Arc::default(),
            max,
        }
    }

    /// A share of `key`, or `None` when it holds `max` already.
    pub fn take(&self, key: K) -> Option<Share<K>> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let n = held.get(&key).copied().unwrap_or(0);
        if n >= self.max {
            // Refused: nothing is recorded, so a refused key leaves no entry behind.
            return None;
        }
        held.insert(key.clone(), n + 1);
        Some(Share {
            held: self.held.clone(),
            key,
        })
    }
}

/// One share of a key; given back when dropped.
#[derive(Debug)]
pub struct Share<K: Eq + Hash> {
    held: Arc<Mutex<HashMap<K, usize>>>,
    key: K,
}

impl<K: Eq + Hash> Drop for Share<K> {
    fn drop(&mut self) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = held.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_holds_at_most_max_shares_and_gets_them_back_when_dropped() {
        let shares = Shares::new(2);
        let a1 = shares.take("a").unwrap();
        let _a2 = shares.take("a").unwrap();
        assert!(shares.take("a").is_none(), "a third share of a");
        let _b = shares.take("b").expect("another key is unaffected");
        drop(a1);
        assert!(shares.take("a").is_some(), "a's share came back");
    }

    #[test]
    fn a_key_with_no_share_held_is_forgotten() {
        let shares = Shares::new(1);
        for i in 0..100 {
            drop(shares.take(i).unwrap());
        }
        assert!(shares.held.lock().unwrap().is_empty());
    }

    #[test]
    fn a_refused_key_leaves_no_entry() {
        let shares = Shares::new(0);
        for i in 0..100 {
            assert!(shares.take(i).is_none());
        }
        assert!(shares.held.lock().unwrap().is_empty());
    }
}

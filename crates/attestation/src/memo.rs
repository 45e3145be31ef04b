//! A small memo of values computed from bytes, keyed by those exact bytes: the runtime-data
//! memo of the confidential-VM trust path and the PCR-digest memo of the TPM quote
//! validator. It holds results of pure functions of the key, never verdicts, so what a peer
//! puts in it can only cost others a miss; it is bounded, the oldest entry going first.

use std::collections::VecDeque;
use std::sync::Mutex;

/// At most `cap` entries of (key bytes, value).
pub(crate) struct ExactMemo<V> {
    entries: Mutex<VecDeque<(Box<[u8]>, V)>>,
    cap: usize,
}

impl<V: Clone> ExactMemo<V> {
    /// An empty memo of at most `cap` entries.
    pub(crate) const fn new(cap: usize) -> Self {
        Self {
            entries: Mutex::new(VecDeque::new()),
            cap,
        }
    }

    /// The value kept for exactly `key`, if any.
    pub(crate) fn get(&self, key: &[u8]) -> Option<V> {
        let entries = self.entries.lock().ok()?;
        entries
            .iter()
            .find(|(k, _)| **k == *key)
            .map(|(_, v)| v.clone())
    }

    /// Keeps `value` for `key` unless `key` is kept already; the oldest entry goes first.
    pub(crate) fn insert(&self, key: &[u8], value: V) {
        if let Ok(mut entries) = self.entries.lock()
            && !entries.iter().any(|(k, _)| **k == *key)
        {
            if entries.len() >= self.cap {
                entries.pop_front();
            }
            entries.push_back((key.into(), value));
        }
    }

    /// How many entries are kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.lock().map(|e| e.len()).unwrap_or(0)
    }
}

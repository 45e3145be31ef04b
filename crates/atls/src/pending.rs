//! Handshake slots shared fairly between sources.
//!
//! A server holds a fixed number of handshakes in progress (TLS handshake and attestation
//! exchange, before the peer is verified). A fixed cap alone lets a set of sources that
//! each stay under a per-source limit hold every slot, and an honest client from another
//! source then waits until theirs time out. [`PendingSlots`] instead gives a new connection
//! a slot whenever its source holds fewer slots than the busiest source: when every slot is
//! taken, the busiest source (the one whose oldest handshake is oldest, among equals) loses
//! its oldest handshake to the newcomer. A source that is itself the busiest replaces its
//! own oldest handshake. So no set of sources can keep a source with fewer handshakes out:
//! 32 sources holding 2 slots each of 64 cannot starve a 33rd, which takes a slot of one of
//! them, and its slot is never the one taken while any source holds more.
//!
//! A *source* is an IPv4 address (an IPv4-mapped IPv6 address counts as its IPv4 address)
//! or an IPv6 /64 prefix, since one host commonly holds a whole /64.

use std::collections::{HashMap, VecDeque};
use std::future::Future as _;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::oneshot;

/// The source an address counts against: the IPv4 address, or the IPv6 /64 (one rule for
/// every per-source limit of the workspace).
pub use asterism_basics::source_of;

/// Why a connection got no slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SlotRefused {
    /// The source already holds its per-source maximum of handshakes.
    #[error("too many handshakes in progress from this source")]
    SourceLimit,
}

/// One handshake in progress of a source.
struct Held {
    seq: u64,
    evict: oneshot::Sender<()>,
}

#[derive(Default)]
struct Table {
    sources: HashMap<IpAddr, VecDeque<Held>>,
    total: usize,
    next_seq: u64,
}

/// Handshake slots, at most `capacity` in all and `per_source` per source, shared fairly
/// between sources (see the module documentation).
pub struct PendingSlots {
    capacity: usize,
    per_source: usize,
    table: Mutex<Table>,
}

impl std::fmt::Debug for PendingSlots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingSlots")
            .field("capacity", &self.capacity)
            .field("per_source", &self.per_source)
            .finish_non_exhaustive()
    }
}

/// A slot held by one handshake. It is given back when dropped; [`PendingSlot::evicted`]
/// completes when a connection of another source took it, and the handshake must then
/// be abandoned.
#[derive(Debug)]
pub struct PendingSlot {
    owner: Arc<PendingSlots>,
    source: IpAddr,
    seq: u64,
    /// `None` once the eviction was seen.
    evicted: Option<oneshot::Receiver<()>>,
}

impl PendingSlot {
    /// Completes when this slot was taken by another connection (the handshake lost its
    /// place); never completes otherwise.
    pub async fn evicted(&mut self) {
        std::future::poll_fn(|cx| self.poll_evicted(cx)).await;
    }

    /// [`PendingSlot::evicted`] as a poll, for a connection wrapper that closes its
    /// connection when the slot is taken: `Ready` once taken, `Pending` (with `cx` woken
    /// on eviction) otherwise.
    pub fn poll_evicted(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        // The sender is dropped only when the slot leaves the table: by eviction (which
        // sends first) or by this slot's own drop, which cannot run while it is borrowed.
        match &mut self.evicted {
            Some(rx) => match std::pin::Pin::new(rx).poll(cx) {
                std::task::Poll::Ready(_) => {
                    self.evicted = None;
                    std::task::Poll::Ready(())
                }
                std::task::Poll::Pending => std::task::Poll::Pending,
            },
            None => std::task::Poll::Ready(()),
        }
    }
}

impl Drop for PendingSlot {
    fn drop(&mut self) {
        let mut table = self
            .owner
            .table
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut removed = false;
        if let Some(held) = table.sources.get_mut(&self.source) {
            if let Some(pos) = held.iter().position(|h| h.seq == self.seq) {
                held.remove(pos);
                removed = true;
            }
            if held.is_empty() {
                table.sources.remove(&self.source);
            }
        }
        if removed {
            table.total = table.total.saturating_sub(1);
        }
    }
}

impl PendingSlots {
    /// `capacity` slots in all, at most `per_source` per source (both at least 1).
    #[must_use]
    pub fn new(capacity: usize, per_source: usize) -> Arc<Self> {
        Arc::new(Self {
            capacity: capacity.max(1),
            per_source: per_source.max(1),
            table: Mutex::new(Table::default()),
        })
    }

    /// Handshakes in progress, all sources together.
    #[must_use]
    pub fn in_use(&self) -> usize {
        self.table
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .total
    }

    /// A slot for a connection from `ip`: a free one, or one taken from the busiest source
    /// when all are in use. Refused only when `ip`'s source holds its per-source maximum.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<PendingSlot, SlotRefused> {
        let source = source_of(ip);
        let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        let own = table.sources.get(&source).map_or(0, VecDeque::len);
        if own >= self.per_source {
            return Err(SlotRefused::SourceLimit);
        }
        if table.total >= self.capacity {
            // The busiest source; among equals the one whose oldest handshake is oldest.
            // If this source is (one of) the busiest, it gives up its own oldest.
            let victim = table
                .sources
                .iter()
                .filter_map(|(s, held)| held.front().map(|h| (*s, held.len(), h.seq)))
                .max_by(|a, b| a.1.cmp(&b.1).then(b.2.cmp(&a.2)))
                .map(|(s, len, _)| if len > own { s } else { source });
            if let Some(victim) = victim {
                let mut emptied = false;
                if let Some(held) = table.sources.get_mut(&victim) {
                    if let Some(oldest) = held.pop_front() {
                        let _ = oldest.evict.send(());
                    }
                    emptied = held.is_empty();
                }
                if emptied {
                    table.sources.remove(&victim);
                }
                table.total = table.total.saturating_sub(1);
                tracing::debug!(source = %source, evicted = %victim, "all handshake slots in use; the busiest source lost its oldest");
            }
        }
        let seq = table.next_seq;
        table.next_seq = table.next_seq.wrapping_add(1);
        let (tx, rx) = oneshot::channel();
        table
            .sources
            .entry(source)
            .or_default()
            .push_back(Held { seq, evict: tx });
        table.total += 1;
        Ok(PendingSlot {
            owner: Arc::clone(self),
            source,
            seq,
            evicted: Some(rx),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    fn ip(a: u8, b: u8) -> IpAddr {
        IpAddr::from([127, 0, a, b])
    }

    fn is_evicted(slot: &mut PendingSlot) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        matches!(pin!(slot.evicted()).poll(&mut cx), Poll::Ready(()))
    }

    #[test]
    fn thirty_two_sources_with_two_slots_each_cannot_starve_a_thirty_third() {
        let slots = PendingSlots::new(64, 2);
        let mut attacker = Vec::new();
        for s in 0..32 {
            for _ in 0..2 {
                attacker.push(slots.admit(ip(1, s)).unwrap());
            }
        }
        assert_eq!(slots.in_use(), 64);
        let mut owner = slots.admit(ip(2, 1)).unwrap();
        assert_eq!(slots.in_use(), 64);
        assert_eq!(
            attacker.iter_mut().map(is_evicted).filter(|e| *e).count(),
            1
        );
        // The attackers keep reconnecting, from every source, many times over: the owner's
        // slot is never the one taken, since some attacker always holds more.
        for round in 0..10 {
            for s in 0..32 {
                attacker.retain_mut(|slot| !is_evicted(slot));
                if let Ok(slot) = slots.admit(ip(1, s)) {
                    attacker.push(slot);
                }
                assert!(!is_evicted(&mut owner), "round {round}, source {s}");
            }
        }
        assert!(slots.in_use() <= 64);
    }

    #[test]
    fn a_source_at_its_limit_is_refused_and_the_busiest_loses_its_oldest() {
        let slots = PendingSlots::new(3, 2);
        let mut a1 = slots.admit(ip(1, 1)).unwrap();
        let mut a2 = slots.admit(ip(1, 1)).unwrap();
        assert_eq!(slots.admit(ip(1, 1)).unwrap_err(), SlotRefused::SourceLimit);
        let mut b1 = slots.admit(ip(1, 2)).unwrap();
        // Full: a new source takes the oldest slot of the busiest source (a).
        let mut c1 = slots.admit(ip(1, 3)).unwrap();
        assert!(is_evicted(&mut a1));
        assert!(!is_evicted(&mut a2) && !is_evicted(&mut b1) && !is_evicted(&mut c1));
        // All sources hold one: a source that is among the busiest replaces its own.
        let _b2 = slots.admit(ip(1, 2)).unwrap();
        assert!(is_evicted(&mut b1));
        assert!(!is_evicted(&mut a2) && !is_evicted(&mut c1));
        drop(a1);
        drop(b1);
        assert_eq!(slots.in_use(), 3);
        drop(a2);
        assert_eq!(slots.in_use(), 2);
    }
}

//! Connection slots shared fairly between sources.
//!
//! A server holds a fixed number of connections of a kind (handshakes in progress before
//! the peer is verified, or open connections of a service anyone can reach). A fixed cap
//! alone lets a set of sources that each stay under a per-source limit hold every slot,
//! and an honest client from another source then waits until theirs time out.
//! [`PendingSlots`] instead gives a new connection a slot whenever its source holds fewer
//! slots than the busiest source: when every slot is taken, the busiest source (the one
//! whose oldest connection is oldest, among equals) loses its oldest to the newcomer. A
//! source that is itself the busiest replaces its own oldest. So no set of sources can keep
//! a source with fewer connections out: 32 sources holding 2 slots each of 64 cannot
//! starve a 33rd, which takes a slot of one of them, and its slot is never the one taken
//! while any source holds more.
//!
//! A *source* is [`source_of`] an address: the IPv4 address, or the IPv6 /64. The holder of
//! a slot polls [`PendingSlot::poll_evicted`] and drops its connection once it fires.

use crate::source_of;
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};

/// Why a connection got no slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotRefused {
    /// The source already holds its per-source maximum of slots.
    SourceLimit,
}

impl std::fmt::Display for SlotRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::SourceLimit => f.write_str("too many connections in progress from this source"),
        }
    }
}

impl std::error::Error for SlotRefused {}

/// The signal a slot's holder polls: set when another connection took the slot.
#[derive(Debug, Default)]
struct Eviction {
    evicted: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl Eviction {
    fn evict(&self) {
        self.evicted.store(true, Ordering::Release);
        let waker = self
            .waker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    fn poll(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.evicted.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        {
            let mut waker = self.waker.lock().unwrap_or_else(PoisonError::into_inner);
            match &mut *waker {
                Some(w) if w.will_wake(cx.waker()) => {}
                slot => *slot = Some(cx.waker().clone()),
            }
        }
        // An eviction between the first check and storing the waker found no waker.
        if self.evicted.load(Ordering::Acquire) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

/// One slot held by a source.
struct Held {
    seq: u64,
    eviction: Arc<Eviction>,
}

#[derive(Default)]
struct Table {
    sources: HashMap<IpAddr, VecDeque<Held>>,
    total: usize,
    next_seq: u64,
}

/// Connection slots, at most `capacity` in all and `per_source` per source, shared fairly
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

/// A slot held by one connection. It is given back when dropped; [`PendingSlot::evicted`]
/// completes when a connection of another source took it, and the connection must then
/// be closed.
#[derive(Debug)]
pub struct PendingSlot {
    owner: Arc<PendingSlots>,
    source: IpAddr,
    seq: u64,
    eviction: Arc<Eviction>,
    took_from: Option<IpAddr>,
}

impl PendingSlot {
    /// Completes when this slot was taken by another connection (the connection lost its
    /// place); never completes otherwise.
    pub async fn evicted(&mut self) {
        std::future::poll_fn(|cx| self.poll_evicted(cx)).await;
    }

    /// [`PendingSlot::evicted`] as a poll, for a connection wrapper that closes its
    /// connection when the slot is taken: `Ready` once taken, `Pending` (with `cx` woken
    /// on eviction) otherwise.
    pub fn poll_evicted(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.eviction.poll(cx)
    }

    /// The source whose oldest slot this one took because all were in use, if it did:
    /// for the caller's log.
    #[must_use]
    pub fn took_from(&self) -> Option<IpAddr> {
        self.took_from
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

    /// Slots in use, all sources together.
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
        let mut took_from = None;
        if table.total >= self.capacity {
            // The busiest source; among equals the one whose oldest slot is oldest.
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
                        oldest.eviction.evict();
                    }
                    emptied = held.is_empty();
                }
                if emptied {
                    table.sources.remove(&victim);
                }
                table.total = table.total.saturating_sub(1);
                took_from = Some(victim);
            }
        }
        let seq = table.next_seq;
        table.next_seq = table.next_seq.wrapping_add(1);
        let eviction = Arc::new(Eviction::default());
        table.sources.entry(source).or_default().push_back(Held {
            seq,
            eviction: Arc::clone(&eviction),
        });
        table.total += 1;
        Ok(PendingSlot {
            owner: Arc::clone(self),
            source,
            seq,
            eviction,
            took_from,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::pin;

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

    struct CountingWaker(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_waiting_holder_is_woken_when_its_slot_is_taken_and_learns_who_took_it() {
        let slots = PendingSlots::new(1, 1);
        let mut held = slots.admit(ip(1, 1)).unwrap();
        assert_eq!(held.took_from(), None);
        let counter = Arc::new(CountingWaker(std::sync::atomic::AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&counter));
        let mut cx = Context::from_waker(&waker);
        assert_eq!(held.poll_evicted(&mut cx), Poll::Pending);
        assert_eq!(held.poll_evicted(&mut cx), Poll::Pending);
        assert_eq!(counter.0.load(Ordering::SeqCst), 0);
        let newcomer = slots.admit(ip(1, 2)).unwrap();
        assert_eq!(newcomer.took_from(), Some(ip(1, 1)));
        assert_eq!(counter.0.load(Ordering::SeqCst), 1, "woken once");
        assert_eq!(held.poll_evicted(&mut cx), Poll::Ready(()));
        assert_eq!(slots.in_use(), 1);
        drop(held);
        assert_eq!(
            slots.in_use(),
            1,
            "an evicted slot's drop frees nothing more"
        );
    }

    #[test]
    fn the_holder_last_polled_is_the_one_woken() {
        let slots = PendingSlots::new(1, 1);
        let mut held = slots.admit(ip(1, 1)).unwrap();
        let first = Arc::new(CountingWaker(std::sync::atomic::AtomicUsize::new(0)));
        let second = Arc::new(CountingWaker(std::sync::atomic::AtomicUsize::new(0)));
        let first_waker = Waker::from(Arc::clone(&first));
        let second_waker = Waker::from(Arc::clone(&second));
        assert!(
            held.poll_evicted(&mut Context::from_waker(&first_waker))
                .is_pending()
        );
        // The connection moved to another task, which polls now.
        assert!(
            held.poll_evicted(&mut Context::from_waker(&second_waker))
                .is_pending()
        );
        drop(slots.admit(ip(1, 2)).unwrap());
        assert_eq!(second.0.load(Ordering::SeqCst), 1);
        assert_eq!(first.0.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn the_table_and_its_refusal_say_what_they_are() {
        let slots = PendingSlots::new(3, 2);
        let shown = format!("{slots:?}");
        assert!(
            shown.contains("capacity: 3") && shown.contains("per_source: 2"),
            "{shown}"
        );
        assert_eq!(
            SlotRefused::SourceLimit.to_string(),
            "too many connections in progress from this source"
        );
    }
}

//! A queue for costly work that unauthenticated callers can ask for, shared fairly between
//! their sources.
//!
//! A service that does expensive work for anyone who asks (a TPM quote, a password hash,
//! a key derivation) bounds how much runs at once. A plain semaphore serves in arrival
//! order, so a flood from many sources, each within its own rate, puts every honest caller
//! behind the whole flood. [`FairQueue`] runs at most `max_running` at once and gives each
//! freed turn to the waiting call whose source has had the fewest turns (the earliest
//! among equals): the owner's first call goes ahead of a flood's hundredth, however many
//! sources the flood comes from.
//!
//! What it holds is bounded: at most `max_waiting` calls wait, each at most `deadline`,
//! and a call that cannot wait gets [`Busy`] at once. It remembers how many turns at most
//! [`MAX_SOURCES`] sources had; beyond that, it forgets the sources with nothing waiting.
//! A source is an IPv4 address or an IPv6 /64 ([`asterism_basics::source_of`]).

use asterism_basics::source_of;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::oneshot;

/// The most sources whose turns are remembered at once.
pub const MAX_SOURCES: usize = 4096;

/// A call got no turn: the queue was full, or its deadline passed while it waited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("too many calls are waiting for their turn; retry later")]
pub struct Busy;

#[derive(Debug)]
struct Waiter {
    source: IpAddr,
    seq: u64,
    turn: oneshot::Sender<()>,
}

#[derive(Debug, Default)]
struct QueueState {
    running: usize,
    waiting: Vec<Waiter>,
    /// Turns each source has had (or has been given), to pick the next waiter.
    served: HashMap<IpAddr, u64>,
    next_seq: u64,
}

impl QueueState {
    /// Counts a turn given to `source`; first, when the table is full, forgets the counts
    /// of the sources with nothing waiting.
    fn count_turn(&mut self, source: IpAddr) {
        if self.served.len() >= MAX_SOURCES && !self.served.contains_key(&source) {
            self.forget_idle_sources();
        }
        *self.served.entry(source).or_insert(0) += 1;
    }

    fn forget_idle_sources(&mut self) {
        let waiting = &self.waiting;
        self.served
            .retain(|s, _| waiting.iter().any(|w| w.source == *s));
    }

    /// Gives freed turns to the waiters whose sources had the fewest turns.
    fn pass_on(&mut self, max_running: usize) {
        while self.running < max_running {
            let Some(pos) = self
                .waiting
                .iter()
                .enumerate()
                .min_by_key(|(_, w)| (self.served.get(&w.source).copied().unwrap_or(0), w.seq))
                .map(|(pos, _)| pos)
            else {
                return;
            };
            let w = self.waiting.swap_remove(pos);
            self.count_turn(w.source);
            self.running += 1;
            // A waiter whose future is already gone gives the turn back in its `Withdraw`.
            let _ = w.turn.send(());
        }
    }
}

/// Costly calls running and waiting (see the module documentation).
#[derive(Debug)]
pub struct FairQueue {
    max_running: usize,
    max_waiting: usize,
    deadline: Duration,
    state: Mutex<QueueState>,
}

/// A call's turn; the next waiting call gets it when this is dropped.
#[derive(Debug)]
pub struct Turn {
    queue: Arc<FairQueue>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut state = self.queue.lock();
        state.running = state.running.saturating_sub(1);
        state.pass_on(self.queue.max_running);
    }
}

/// Withdraws a waiting call whose future was dropped (the caller went away, or its
/// deadline passed), or gives back a turn it was given but never took.
struct Withdraw<'a> {
    queue: &'a Arc<FairQueue>,
    seq: u64,
    armed: bool,
}

impl Drop for Withdraw<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut state = self.queue.lock();
        if let Some(pos) = state.waiting.iter().position(|w| w.seq == self.seq) {
            state.waiting.swap_remove(pos);
        } else {
            // Given a turn that nobody will take: pass it on.
            state.running = state.running.saturating_sub(1);
            state.pass_on(self.queue.max_running);
        }
    }
}

impl FairQueue {
    /// A queue of `max_running` calls at once (at least 1), with at most `max_waiting`
    /// waiting, each for at most `deadline`.
    #[must_use]
    pub fn new(max_running: usize, max_waiting: usize, deadline: Duration) -> Arc<Self> {
        Arc::new(Self {
            max_running: max_running.max(1),
            max_waiting,
            deadline,
            state: Mutex::new(QueueState::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Calls running now.
    #[must_use]
    pub fn running(&self) -> usize {
        self.lock().running
    }

    /// Calls waiting now.
    #[must_use]
    pub fn waiting(&self) -> usize {
        self.lock().waiting.len()
    }

    /// Waits for a turn for a call from `ip`: at once when fewer than `max_running` run
    /// and nobody waits; [`Busy`] when the queue is full or the deadline passed first.
    pub async fn turn(self: &Arc<Self>, ip: IpAddr) -> Result<Turn, Busy> {
        let source = source_of(ip);
        let (seq, rx) = {
            let mut state = self.lock();
            if state.running < self.max_running && state.waiting.is_empty() {
                state.running += 1;
                state.count_turn(source);
                return Ok(Turn {
                    queue: Arc::clone(self),
                });
            }
            if state.waiting.len() >= self.max_waiting {
                return Err(Busy);
            }
            let seq = state.next_seq;
            state.next_seq = state.next_seq.wrapping_add(1);
            let (tx, rx) = oneshot::channel();
            state.waiting.push(Waiter {
                source,
                seq,
                turn: tx,
            });
            (seq, rx)
        };
        let mut withdraw = Withdraw {
            queue: self,
            seq,
            armed: true,
        };
        match tokio::time::timeout(self.deadline, rx).await {
            Ok(Ok(())) => {
                withdraw.armed = false;
                Ok(Turn {
                    queue: Arc::clone(self),
                })
            }
            // The deadline passed (or the queue dropped the waiter): `withdraw` removes it,
            // or passes on a turn given at the last moment.
            _ => Err(Busy),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(n: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, n])
    }

    type Order = Arc<Mutex<Vec<u8>>>;

    /// A task that waits for a turn from address `from`, notes `from` in `order` when it
    /// gets it, and holds it for `hold`.
    fn take_turn(
        q: &Arc<FairQueue>,
        order: &Order,
        from: u8,
        hold: Duration,
    ) -> tokio::task::JoinHandle<()> {
        let (q, order) = (q.clone(), order.clone());
        tokio::spawn(async move {
            let turn = q.turn(ip(from)).await.unwrap();
            order.lock().unwrap().push(from);
            tokio::time::sleep(hold).await;
            drop(turn);
        })
    }

    #[tokio::test]
    async fn a_call_waits_for_its_turn_and_a_new_source_goes_first() {
        let q = FairQueue::new(1, 8, Duration::from_secs(10));
        let order = Arc::new(Mutex::new(Vec::new()));
        let running = q.turn(ip(1)).await.unwrap();
        let spawn = |from: u8| take_turn(&q, &order, from, Duration::from_millis(100));
        // A flood from address 1 waits; then the owner (address 9) asks.
        let mut tasks: Vec<_> = (0..3).map(|_| spawn(1)).collect();
        tokio::task::yield_now().await;
        tasks.push(spawn(9));
        tokio::task::yield_now().await;
        assert_eq!(q.waiting(), 4);
        drop(running);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![9, 1, 1, 1]);
        assert_eq!(q.running(), 0);
    }

    #[tokio::test]
    async fn at_most_max_running_run_at_once() {
        let q = FairQueue::new(2, 8, Duration::from_secs(10));
        let a = q.turn(ip(1)).await.unwrap();
        let b = q.turn(ip(2)).await.unwrap();
        let third = {
            let q = q.clone();
            tokio::spawn(async move { q.turn(ip(3)).await.map(drop) })
        };
        tokio::task::yield_now().await;
        assert_eq!((q.running(), q.waiting()), (2, 1));
        drop(a);
        third.await.unwrap().unwrap();
        drop(b);
        assert_eq!((q.running(), q.waiting()), (0, 0));
    }

    #[tokio::test]
    async fn a_full_queue_and_a_passed_deadline_refuse_and_free_their_places() {
        let q = FairQueue::new(1, 1, Duration::from_millis(300));
        let running = q.turn(ip(1)).await.unwrap();
        let waiting = {
            let q = q.clone();
            tokio::spawn(async move { q.turn(ip(2)).await.map(drop) })
        };
        tokio::task::yield_now().await;
        assert_eq!(q.turn(ip(3)).await.unwrap_err(), Busy);
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(waiting.await.unwrap().unwrap_err(), Busy);
        assert_eq!(q.waiting(), 0);
        drop(running);
        drop(q.turn(ip(3)).await.unwrap());
        assert_eq!(q.running(), 0);
    }

    #[tokio::test]
    async fn the_addresses_of_one_ipv6_64_count_as_one_source() {
        let q = FairQueue::new(1, 8, Duration::from_secs(10));
        let order = Arc::new(Mutex::new(Vec::new()));
        let running = q.turn(ip(1)).await.unwrap();
        let spawn = |from: IpAddr, tag: u8| {
            let (q, order) = (q.clone(), order.clone());
            tokio::spawn(async move {
                let turn = q.turn(from).await.unwrap();
                order.lock().unwrap().push(tag);
                drop(turn);
            })
        };
        // Two turns already went to the /64 (through two of its addresses); a third
        // address of it waits behind an IPv4 source that had one.
        let v6 = |n: u16| IpAddr::from([0x2001, 0xdb8, 0, 1, 0, 0, 0, n]);
        drop(running);
        drop(q.turn(v6(1)).await.unwrap());
        let hold = q.turn(v6(2)).await.unwrap();
        let tasks = vec![spawn(v6(3), 6), spawn(ip(1), 4)];
        tokio::task::yield_now().await;
        drop(hold);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![4, 6]);
    }

    #[tokio::test]
    async fn a_freed_turn_goes_to_one_waiter_and_counts_for_its_source() {
        let q = FairQueue::new(1, 8, Duration::from_secs(10));
        let order = Arc::new(Mutex::new(Vec::new()));
        let running = q.turn(ip(9)).await.unwrap();
        let spawn = |from: u8| take_turn(&q, &order, from, Duration::from_millis(50));
        // Source 1 asks twice, then source 2 once: 1 goes first (earlier), then 2, which
        // has had fewer turns than 1 by then, then 1 again.
        let mut tasks = vec![spawn(1)];
        tokio::task::yield_now().await;
        tasks.push(spawn(1));
        tokio::task::yield_now().await;
        tasks.push(spawn(2));
        tokio::task::yield_now().await;
        drop(running);
        tokio::task::yield_now().await;
        assert_eq!(
            (q.running(), q.waiting()),
            (1, 2),
            "one turn for one waiter"
        );
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![1, 2, 1]);
    }

    #[tokio::test]
    async fn a_waiter_that_goes_away_leaves_the_others_in_line() {
        let q = FairQueue::new(1, 8, Duration::from_secs(10));
        let running = q.turn(ip(1)).await.unwrap();
        let gone = {
            let q = q.clone();
            tokio::spawn(async move { q.turn(ip(2)).await.map(drop) })
        };
        tokio::task::yield_now().await;
        let stays = {
            let q = q.clone();
            tokio::spawn(async move { q.turn(ip(3)).await.map(drop) })
        };
        tokio::task::yield_now().await;
        gone.abort();
        assert!(gone.await.unwrap_err().is_cancelled());
        assert_eq!(q.waiting(), 1);
        drop(running);
        stays.await.unwrap().unwrap();
        assert_eq!((q.running(), q.waiting()), (0, 0));
    }

    #[tokio::test]
    async fn the_turn_counts_stay_bounded_and_keep_the_waiting_sources() {
        let q = FairQueue::new(1, 8, Duration::from_secs(10));
        for n in 0..u32::try_from(MAX_SOURCES).unwrap() + 100 {
            drop(
                q.turn(IpAddr::from((0x0a00_0000 + n).to_be_bytes()))
                    .await
                    .unwrap(),
            );
            assert!(q.lock().served.len() <= MAX_SOURCES);
        }
        let mut state = q.lock();
        let (tx, _rx) = oneshot::channel();
        state.waiting.push(Waiter {
            source: ip(200),
            seq: 0,
            turn: tx,
        });
        state.served.insert(ip(200), 7);
        state.forget_idle_sources();
        assert_eq!(state.served.len(), 1);
        assert_eq!(state.served.get(&ip(200)), Some(&7));
    }

    #[tokio::test]
    async fn a_new_source_does_not_wipe_the_turns_of_the_others() {
        let q = FairQueue::new(1, 8, Duration::from_secs(10));
        let order = Arc::new(Mutex::new(Vec::new()));
        // Source 1 had three turns, source 2 one, all given at once.
        for _ in 0..3 {
            drop(q.turn(ip(1)).await.unwrap());
        }
        drop(q.turn(ip(2)).await.unwrap());
        let running = q.turn(ip(9)).await.unwrap();
        // Source 1 asks, then source 3, new: 3 goes first.
        let mut tasks = vec![take_turn(&q, &order, 1, Duration::ZERO)];
        tokio::task::yield_now().await;
        tasks.push(take_turn(&q, &order, 3, Duration::ZERO));
        tokio::task::yield_now().await;
        drop(running);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![3, 1]);
    }
}

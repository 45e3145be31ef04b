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
//! What it holds is bounded: at most `max_waiting` calls wait, each at most `deadline`.
//! When all places are taken, a call from a source that weighs less than the heaviest
//! waiting source takes that source's newest place, and the call that held it gets
//! [`Busy`]; any other call gets [`Busy`] at once. A source weighs the calls it has waiting,
//! then the turns it has had: so no set of sources can keep the owner out by filling the
//! queue, unless every place is held by a different source that has never had a turn, and
//! each such source is good for one turn only. It remembers how many turns at most
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

    /// The waiter to give up its place for a call from `source` when every place is taken:
    /// the newest waiter of the heaviest source (most calls waiting, then most turns had),
    /// if that source weighs more than `source` will with its call added. `None` when no
    /// source is heavier: then the call is refused.
    fn place_to_take(&self, source: IpAddr) -> Option<usize> {
        let mut waiting: HashMap<IpAddr, usize> = HashMap::with_capacity(self.waiting.len());
        for w in &self.waiting {
            *waiting.entry(w.source).or_insert(0) += 1;
        }
        let turns = |s: &IpAddr| self.served.get(s).copied().unwrap_or(0);
        let weight = |s: &IpAddr| (waiting.get(s).copied().unwrap_or(0), turns(s));
        let (pos, heaviest) = self
            .waiting
            .iter()
            .enumerate()
            .max_by_key(|(_, w)| (weight(&w.source), w.seq))?;
        let (own_waiting, own_turns) = weight(&source);
        ((own_waiting + 1, own_turns) < weight(&heaviest.source)).then_some(pos)
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
    turn: oneshot::Receiver<()>,
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
        } else if self.turn.try_recv().is_ok() {
            // Given a turn that nobody will take: pass it on. (Turns are given and places
            // taken under the lock, so a waiter that is gone either has its turn in the
            // channel or lost its place, and then holds nothing.)
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
    /// and nobody waits. [`Busy`] when every place is taken and no heavier source holds
    /// one, when a lighter source takes this call's place, or when the deadline passes
    /// first.
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
                // Dropping the waiter's sender tells it (its receiver closes) that it lost
                // its place.
                let pos = state.place_to_take(source).ok_or(Busy)?;
                drop(state.waiting.swap_remove(pos));
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
            turn: rx,
            armed: true,
        };
        match tokio::time::timeout(self.deadline, &mut withdraw.turn).await {
            Ok(Ok(())) => {
                withdraw.armed = false;
                Ok(Turn {
                    queue: Arc::clone(self),
                })
            }
            // A lighter source took the place (`withdraw` finds nothing to give back), or
            // the deadline passed: `withdraw` removes the waiter, or passes on a turn given
            // at the last moment.
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

    /// Spawns a call from `from` that waits for its turn and drops it at once; lets it
    /// queue before returning.
    async fn queued(q: &Arc<FairQueue>, from: u8) -> tokio::task::JoinHandle<Result<(), Busy>> {
        let q = q.clone();
        let task = tokio::spawn(async move { q.turn(ip(from)).await.map(drop) });
        tokio::task::yield_now().await;
        task
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
        let third = queued(&q, 3).await;
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
        let waiting = queued(&q, 2).await;
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
        let gone = queued(&q, 2).await;
        let stays = queued(&q, 3).await;
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

    #[tokio::test]
    async fn a_lighter_source_takes_the_newest_place_of_the_heaviest_when_all_are_taken() {
        let q = FairQueue::new(1, 3, Duration::from_secs(10));
        let order = Arc::new(Mutex::new(Vec::new()));
        let running = q.turn(ip(1)).await.unwrap();
        // A flood from source 1 takes every place; the newest is `last`.
        let mut tasks = Vec::new();
        for _ in 0..2 {
            tasks.push(take_turn(&q, &order, 1, Duration::ZERO));
            tokio::task::yield_now().await;
        }
        let last = queued(&q, 1).await;
        assert_eq!(q.waiting(), 3);
        // Source 1 cannot push itself further; the owner (source 9) gets a place.
        assert_eq!(q.turn(ip(1)).await.unwrap_err(), Busy);
        tasks.push(take_turn(&q, &order, 9, Duration::ZERO));
        tokio::task::yield_now().await;
        assert_eq!(
            last.await.unwrap().unwrap_err(),
            Busy,
            "the newest place was taken"
        );
        assert_eq!(q.waiting(), 3);
        drop(running);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![9, 1, 1]);
        assert_eq!(
            (q.running(), q.waiting()),
            (0, 0),
            "the lost place held no turn"
        );
        drop(q.turn(ip(2)).await.unwrap());
    }

    #[tokio::test]
    async fn a_place_goes_only_to_a_source_that_weighs_less_than_its_holder() {
        let q = FairQueue::new(1, 3, Duration::from_secs(10));
        let running = q.turn(ip(9)).await.unwrap();
        // Source 1 waits twice, source 2 once: all places are taken.
        let waiting = vec![
            queued(&q, 1).await,
            queued(&q, 1).await,
            queued(&q, 2).await,
        ];
        // Source 2 with a second call would weigh what source 1 weighs: no gain in
        // fairness, so no place.
        assert_eq!(q.turn(ip(2)).await.unwrap_err(), Busy);
        assert_eq!(q.waiting(), 3);
        drop(running);
        for t in waiting {
            t.await.unwrap().unwrap();
        }
    }

    #[tokio::test]
    async fn sources_that_have_had_turns_cannot_keep_a_new_source_out() {
        let q = FairQueue::new(1, 2, Duration::from_secs(10));
        let order = Arc::new(Mutex::new(Vec::new()));
        // Sources 2 and 3 have had a turn each, and wait again, one place each.
        drop(q.turn(ip(2)).await.unwrap());
        drop(q.turn(ip(3)).await.unwrap());
        let running = q.turn(ip(1)).await.unwrap();
        let first = take_turn(&q, &order, 2, Duration::ZERO);
        tokio::task::yield_now().await;
        let newest = queued(&q, 3).await;
        // Source 1 has had a turn too: it weighs what they weigh, and gets no place.
        assert_eq!(q.turn(ip(1)).await.unwrap_err(), Busy);
        // Source 9 has had none: it takes source 3's place, the newest.
        let owner = take_turn(&q, &order, 9, Duration::ZERO);
        tokio::task::yield_now().await;
        assert_eq!(newest.await.unwrap().unwrap_err(), Busy);
        drop(running);
        first.await.unwrap();
        owner.await.unwrap();
        assert_eq!(*order.lock().unwrap(), vec![9, 2]);
    }

    #[tokio::test]
    async fn a_full_queue_of_sources_that_never_had_a_turn_refuses_one_more() {
        let q = FairQueue::new(1, 2, Duration::from_secs(10));
        let running = q.turn(ip(1)).await.unwrap();
        let waiting = vec![queued(&q, 2).await, queued(&q, 3).await];
        assert_eq!(q.turn(ip(4)).await.unwrap_err(), Busy);
        drop(running);
        for t in waiting {
            t.await.unwrap().unwrap();
        }
        assert_eq!((q.running(), q.waiting()), (0, 0));
    }
}

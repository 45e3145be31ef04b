//! Limits on what unauthenticated callers can make the InitServer do.
//!
//! Anyone on the network can connect to the InitServer. Each connection costs a TPM quote
//! (the node attests in the handshake) and each Init call a bcrypt check of the init
//! secret, both far more expensive than the caller's effort. [`PeerLimiter`] bounds both, at
//! two points: before the aTLS handshake of a new connection, and before the secret check of
//! an Init call. Each point has its own limiter with the same [`InitLimits`]:
//!
//! * at most `max_in_flight` Init calls (`max_pending_handshakes` handshakes) at once in
//!   all;
//! * at most `per_peer_in_flight` at once from one source;
//! * per source, a token bucket: `per_peer_burst` attempts at once, then one every
//!   `per_peer_interval`.
//!
//! A source is an IPv4 address or an IPv6 /64 (`asterism_basics::source_of`, as the
//! aTLS listener counts them): whoever holds a /64 holds all its addresses. A refused
//! connection is closed before the handshake; a refused call gets `RESOURCE_EXHAUSTED`. The
//! owner, calling from one address a few times, never comes near the per-source limits; a
//! flood from one source is held to the bucket's rate.
//!
//! The per-source table holds at most [`MAX_PEERS`] sources. It bounds memory, never who
//! gets in: when it is full, the sources with nothing in progress that were seen longest
//! ago are forgotten (an eighth of the table at once), and a forgotten source starts again
//! with a full bucket. A flood from more sources than the table holds therefore cannot
//! refuse the owner's new address; what all sources together get is bounded by the shared
//! limits below.
//!
//! What all addresses together may hold is shared, not refused, so that no set of
//! addresses can keep the owner out:
//!
//! * handshakes: `max_pending_handshakes` slots shared fairly between addresses by the
//!   aTLS listener (`asterism_atls::pending`): a connection from an address holding fewer
//!   slots than the busiest takes the busiest's oldest;
//! * secret checks (bcrypt for Init, a LUKS2 key derivation for Recover): at most
//!   `max_in_flight` at once, further calls wait in a fair queue ([`check_queue`],
//!   `asterism_binkit::fair_queue`) of at most [`MAX_QUEUED_CHECKS`] for at most
//!   [`CHECK_QUEUE_DEADLINE`]; the next check goes to the waiting call whose address has
//!   had the fewest checks, so the owner's first call goes ahead of a flood's hundredth.

use asterism_basics::source_of;
use asterism_binkit::FairQueue;
use asterism_binkit::ratelimit::{BucketTable, Rate};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The most addresses tracked at once.
pub const MAX_PEERS: usize = 4096;
/// The most secret checks waiting for their turn, all addresses together.
pub const MAX_QUEUED_CHECKS: usize = 256;
/// How long a secret check waits for its turn before it is refused (`RESOURCE_EXHAUSTED`,
/// which the CLI retries).
pub const CHECK_QUEUE_DEADLINE: Duration = Duration::from_secs(10);

/// The InitServer's limits (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitLimits {
    /// Init calls in progress at once (bcrypt checks), all addresses together.
    pub max_in_flight: usize,
    /// Handshakes in progress at once, all addresses together. Larger than
    /// `max_in_flight`: a peer that connects and sends nothing holds its slot until the
    /// handshake deadline, so a small number would let a few silent connections shut the
    /// owner out.
    pub max_pending_handshakes: usize,
    /// Attempts in progress at once from one address.
    pub per_peer_in_flight: usize,
    /// Attempts one address may make at once before it is held to the rate.
    pub per_peer_burst: u32,
    /// One more attempt per address per this interval.
    pub per_peer_interval: Duration,
}

impl Default for InitLimits {
    /// 4 Init calls and 64 handshakes at once, 2 per address, 10 per address in a burst,
    /// then one every 2 s.
    fn default() -> Self {
        Self {
            max_in_flight: 4,
            max_pending_handshakes: 64,
            per_peer_in_flight: 2,
            per_peer_burst: 10,
            per_peer_interval: Duration::from_secs(2),
        }
    }
}

/// Why an attempt was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Too many attempts in progress, all addresses together.
    #[error("too many attempts in progress; retry later")]
    Busy,
    /// Too many attempts in progress from this address.
    #[error("too many attempts in progress from this address; retry later")]
    PeerBusy,
    /// This address used up its attempts for now.
    #[error("too many attempts from this address; retry later")]
    RateLimited,
    /// Every source in the full table has an attempt in progress.
    #[error("too many sources with attempts in progress; retry later")]
    TooManyPeers,
}

#[derive(Debug)]
struct State {
    in_flight: usize,
    /// Per source: its bucket, and its attempts in progress.
    peers: BucketTable<IpAddr, usize>,
}

/// Counts attempts per address and in all; see the module documentation.
#[derive(Debug)]
pub struct PeerLimiter {
    limits: InitLimits,
    state: Mutex<State>,
}

/// One admitted attempt; dropping it ends the attempt.
#[derive(Debug)]
pub struct Permit {
    limiter: Arc<PeerLimiter>,
    ip: IpAddr,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut state = self
            .limiter
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        state.in_flight = state.in_flight.saturating_sub(1);
        if let Some(in_flight) = state.peers.get_mut(&self.ip) {
            *in_flight = in_flight.saturating_sub(1);
        }
    }
}

impl PeerLimiter {
    /// The limiter of Init and Recover calls, per address: how many at once and how
    /// often. How many in all is the [`check_queue`]'s, which makes calls wait instead of
    /// refusing them.
    #[must_use]
    pub fn for_calls(limits: InitLimits) -> Arc<Self> {
        Self::new(InitLimits {
            max_in_flight: usize::MAX,
            ..limits
        })
    }

    /// The limiter of connections (handshakes), per address. How many in all is the aTLS
    /// listener's, shared fairly between addresses.
    #[must_use]
    pub fn for_handshakes(limits: InitLimits) -> Arc<Self> {
        Self::new(InitLimits {
            max_in_flight: usize::MAX,
            ..limits
        })
    }

    fn new(limits: InitLimits) -> Arc<Self> {
        let rate = Rate::one_per(limits.per_peer_interval, limits.per_peer_burst);
        Arc::new(Self {
            limits,
            state: Mutex::new(State {
                in_flight: 0,
                peers: BucketTable::new(rate, MAX_PEERS),
            }),
        })
    }

    /// Admits one attempt from `ip`, or says why not.
    pub fn try_acquire(self: &Arc<Self>, ip: IpAddr) -> Result<Permit, Refused> {
        self.try_acquire_at(ip, Instant::now())
    }

    fn try_acquire_at(self: &Arc<Self>, ip: IpAddr, now: Instant) -> Result<Permit, Refused> {
        let ip = source_of(ip);
        let mut guard = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let state = &mut *guard;
        if state.in_flight >= self.limits.max_in_flight {
            return Err(Refused::Busy);
        }
        // A full table forgets only sources with nothing in progress: when every source
        // has an attempt in progress (more than the shared limits let run at once, so not
        // while they hold), a new one is refused.
        let (bucket, in_flight) = state
            .peers
            .entry(ip, now, |in_flight| *in_flight == 0)
            .ok_or(Refused::TooManyPeers)?;
        if *in_flight >= self.limits.per_peer_in_flight {
            return Err(Refused::PeerBusy);
        }
        if !bucket.try_take() {
            return Err(Refused::RateLimited);
        }
        *in_flight += 1;
        state.in_flight += 1;
        Ok(Permit {
            limiter: Arc::clone(self),
            ip,
        })
    }
}

/// The secret checks' queue: at most `max_running` at once (at least 1), the others waiting,
/// at most [`MAX_QUEUED_CHECKS`] of them, for at most [`CHECK_QUEUE_DEADLINE`]; each freed
/// turn goes to the waiting call whose source has had the fewest checks.
#[must_use]
pub fn check_queue(max_running: usize) -> Arc<FairQueue> {
    FairQueue::new(max_running, MAX_QUEUED_CHECKS, CHECK_QUEUE_DEADLINE)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn limits() -> InitLimits {
        InitLimits {
            max_in_flight: 3,
            max_pending_handshakes: 3,
            per_peer_in_flight: 2,
            per_peer_burst: 4,
            per_peer_interval: Duration::from_secs(1),
        }
    }

    fn ip(n: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, n])
    }

    #[test]
    fn an_address_is_held_to_its_burst_then_its_rate() {
        let l = PeerLimiter::new(limits());
        let t0 = Instant::now();
        for _ in 0..4 {
            drop(l.try_acquire_at(ip(1), t0).unwrap());
        }
        assert_eq!(
            l.try_acquire_at(ip(1), t0).unwrap_err(),
            Refused::RateLimited
        );
        // Another address is not affected.
        drop(l.try_acquire_at(ip(2), t0).unwrap());
        // One more after one interval, not two.
        let t1 = t0 + Duration::from_secs(1);
        drop(l.try_acquire_at(ip(1), t1).unwrap());
        assert_eq!(
            l.try_acquire_at(ip(1), t1).unwrap_err(),
            Refused::RateLimited
        );
    }

    #[test]
    fn attempts_in_progress_are_bounded_per_address_and_in_all() {
        let l = PeerLimiter::new(limits());
        let t0 = Instant::now();
        let a = l.try_acquire_at(ip(1), t0).unwrap();
        let _b = l.try_acquire_at(ip(1), t0).unwrap();
        assert_eq!(l.try_acquire_at(ip(1), t0).unwrap_err(), Refused::PeerBusy);
        let _c = l.try_acquire_at(ip(2), t0).unwrap();
        assert_eq!(l.try_acquire_at(ip(3), t0).unwrap_err(), Refused::Busy);
        drop(a);
        drop(l.try_acquire_at(ip(3), t0).unwrap());
        drop(l.try_acquire_at(ip(1), t0).unwrap());
    }

    fn flood_address(i: usize) -> IpAddr {
        IpAddr::from([10, 1, (i >> 8) as u8, i as u8])
    }

    #[test]
    fn the_address_table_is_bounded_and_refuses_only_while_every_source_is_busy() {
        let l = PeerLimiter::new(InitLimits {
            max_in_flight: usize::MAX,
            ..limits()
        });
        let t0 = Instant::now();
        let held: Vec<_> = (0..MAX_PEERS)
            .map(|i| l.try_acquire_at(flood_address(i), t0).unwrap())
            .collect();
        assert_eq!(
            l.try_acquire_at(ip(1), t0).unwrap_err(),
            Refused::TooManyPeers
        );
        // A source in the table is not refused for the table: its second attempt goes on.
        drop(l.try_acquire_at(flood_address(7), t0).unwrap());
        drop(held);
        // Idle, the sources seen longest ago make room at once, buckets refilled or not.
        drop(l.try_acquire_at(ip(1), t0).unwrap());
        assert!(l.state.lock().unwrap().peers.len() <= MAX_PEERS);
    }

    /// Making room first forgets every idle source whose bucket has refilled (as of the
    /// moment it refilled, `per_peer_burst` intervals on), and never a source with an
    /// attempt in progress, however long ago it was seen.
    #[test]
    fn making_room_forgets_refilled_idle_sources_and_keeps_busy_ones() {
        let limiter = || {
            PeerLimiter::new(InitLimits {
                max_in_flight: usize::MAX,
                ..limits()
            })
        };
        let len = |l: &Arc<PeerLimiter>| l.state.lock().unwrap().peers.len();
        let t0 = Instant::now();

        // 2 s on no bucket has refilled: the eighth seen longest ago makes room.
        let l = limiter();
        let seen = |i: usize| t0 + Duration::from_micros(i as u64);
        for i in 0..MAX_PEERS {
            drop(l.try_acquire_at(flood_address(i), seen(i)).unwrap());
        }
        drop(
            l.try_acquire_at(ip(1), t0 + Duration::from_secs(2))
                .unwrap(),
        );
        assert_eq!(len(&l), MAX_PEERS - MAX_PEERS / 8 + 1);
        {
            let state = l.state.lock().unwrap();
            let kept = |i: usize| state.peers.contains(&flood_address(i));
            assert!(
                (0..MAX_PEERS / 8).all(|i| !kept(i)),
                "the oldest eighth went"
            );
            assert!((MAX_PEERS / 8..MAX_PEERS).all(kept), "the rest stayed");
        }

        // limits(): a burst of 4, one a second: full again 4 s on, when all are forgotten.
        let l = limiter();
        for i in 0..MAX_PEERS {
            drop(l.try_acquire_at(flood_address(i), t0).unwrap());
        }
        let refilled = t0 + Duration::from_secs(4);
        drop(l.try_acquire_at(ip(1), refilled).unwrap());
        assert_eq!(len(&l), 1, "all refilled ones forgotten");

        // Half refilled, half not: forgetting the refilled half makes room enough.
        let l = limiter();
        for i in 0..MAX_PEERS {
            let at = if i % 2 == 0 {
                t0
            } else {
                t0 + Duration::from_secs(3)
            };
            drop(l.try_acquire_at(flood_address(i), at).unwrap());
        }
        drop(l.try_acquire_at(ip(1), refilled).unwrap());
        assert_eq!(
            len(&l),
            MAX_PEERS / 2 + 1,
            "the refilled half forgotten, no more"
        );

        // Sources with an attempt in progress are kept, however long ago they were seen.
        let held: Vec<_> = (0..MAX_PEERS)
            .map(|i| l.try_acquire_at(flood_address(i), refilled).unwrap())
            .collect();
        let much_later = refilled + Duration::from_secs(60);
        assert_eq!(
            l.try_acquire_at(ip(2), much_later).unwrap_err(),
            Refused::TooManyPeers,
        );
        drop(held);
    }

    /// A flood from more sources than the table holds, each coming back before its bucket
    /// refills, does not keep a new address out (the owner's), and the table stays bounded.
    #[test]
    fn a_flood_from_more_sources_than_the_table_holds_does_not_keep_the_owner_out() {
        let l = PeerLimiter::new(InitLimits {
            max_in_flight: usize::MAX,
            ..limits()
        });
        let t0 = Instant::now();
        for round in 0..3u32 {
            let now = t0 + Duration::from_millis(100) * round;
            for i in 0..MAX_PEERS + MAX_PEERS / 2 {
                // Some of the flood's attempts are refused for its rate; none for the table.
                let r = l.try_acquire_at(flood_address(i), now);
                assert_ne!(r.as_ref().err(), Some(&Refused::TooManyPeers));
            }
            let owner = l.try_acquire_at(ip(200), now);
            assert!(owner.is_ok(), "round {round}: {owner:?}");
            assert!(l.state.lock().unwrap().peers.len() <= MAX_PEERS);
        }
    }

    /// An IPv6 /64 is one source: its addresses share one bucket.
    #[test]
    fn the_addresses_of_one_ipv6_64_share_a_bucket() {
        let l = PeerLimiter::new(limits());
        let t0 = Instant::now();
        let v6 = |n: u16| IpAddr::from([0x2001, 0xdb8, 0, 1, 0, 0, 0, n]);
        for n in 0..4 {
            drop(l.try_acquire_at(v6(n), t0).unwrap());
        }
        assert_eq!(
            l.try_acquire_at(v6(99), t0).unwrap_err(),
            Refused::RateLimited
        );
        let other_64 = IpAddr::from([0x2001, 0xdb8, 0, 2, 0, 0, 0, 1]);
        drop(l.try_acquire_at(other_64, t0).unwrap());
    }
}

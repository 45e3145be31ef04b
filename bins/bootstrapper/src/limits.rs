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
//! * at most `per_peer_in_flight` at once from one IP address;
//! * per IP address, a token bucket: `per_peer_burst` attempts at once, then one every
//!   `per_peer_interval`.
//!
//! A refused connection is closed before the handshake; a refused call gets
//! `RESOURCE_EXHAUSTED`. The owner, calling from one address a few times, never comes near
//! the limits; a flood from one address is held to the bucket's rate, and a flood from many
//! addresses to `max_in_flight` quotes or bcrypt checks at a time. The per-address table
//! holds at most [`MAX_PEERS`] addresses; when it is full of active ones, new addresses are
//! refused until entries expire.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The most addresses tracked at once.
pub const MAX_PEERS: usize = 4096;

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
    /// The table of addresses is full.
    #[error("too many addresses; retry later")]
    TooManyPeers,
}

#[derive(Debug)]
struct Peer {
    tokens: f64,
    refilled: Instant,
    in_flight: usize,
}

#[derive(Debug, Default)]
struct State {
    in_flight: usize,
    peers: HashMap<IpAddr, Peer>,
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
        if let Some(peer) = state.peers.get_mut(&self.ip) {
            peer.in_flight = peer.in_flight.saturating_sub(1);
        }
    }
}

impl PeerLimiter {
    /// The limiter of Init calls.
    #[must_use]
    pub fn for_calls(limits: InitLimits) -> Arc<Self> {
        Self::new(limits)
    }

    /// The limiter of connections (handshakes).
    #[must_use]
    pub fn for_handshakes(limits: InitLimits) -> Arc<Self> {
        Self::new(InitLimits {
            max_in_flight: limits.max_pending_handshakes,
            ..limits
        })
    }

    fn new(limits: InitLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            state: Mutex::new(State::default()),
        })
    }

    /// Admits one attempt from `ip`, or says why not.
    pub fn try_acquire(self: &Arc<Self>, ip: IpAddr) -> Result<Permit, Refused> {
        self.try_acquire_at(ip, Instant::now())
    }

    fn try_acquire_at(self: &Arc<Self>, ip: IpAddr, now: Instant) -> Result<Permit, Refused> {
        let ip = ip.to_canonical();
        let limits = self.limits;
        let burst = f64::from(limits.per_peer_burst);
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.in_flight >= limits.max_in_flight {
            return Err(Refused::Busy);
        }
        if !state.peers.contains_key(&ip) && state.peers.len() >= MAX_PEERS {
            // Forget addresses that are idle and whose bucket has refilled: remembering them
            // changes nothing.
            let full_after = limits
                .per_peer_interval
                .saturating_mul(limits.per_peer_burst);
            state
                .peers
                .retain(|_, p| p.in_flight > 0 || now.duration_since(p.refilled) < full_after);
            if state.peers.len() >= MAX_PEERS {
                return Err(Refused::TooManyPeers);
            }
        }
        let peer = state.peers.entry(ip).or_insert(Peer {
            tokens: burst,
            refilled: now,
            in_flight: 0,
        });
        let interval = limits.per_peer_interval.as_secs_f64();
        if interval > 0.0 {
            let earned = now.duration_since(peer.refilled).as_secs_f64() / interval;
            peer.tokens = (peer.tokens + earned).min(burst);
        } else {
            peer.tokens = burst;
        }
        peer.refilled = now;
        if peer.in_flight >= limits.per_peer_in_flight {
            return Err(Refused::PeerBusy);
        }
        if peer.tokens < 1.0 {
            return Err(Refused::RateLimited);
        }
        peer.tokens -= 1.0;
        peer.in_flight += 1;
        state.in_flight += 1;
        Ok(Permit {
            limiter: Arc::clone(self),
            ip,
        })
    }
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

    #[test]
    fn the_address_table_is_bounded_and_forgets_idle_addresses() {
        let l = PeerLimiter::new(InitLimits {
            max_in_flight: usize::MAX,
            ..limits()
        });
        let t0 = Instant::now();
        let mut held = Vec::new();
        for i in 0..MAX_PEERS {
            let addr = IpAddr::from([10, 1, (i >> 8) as u8, i as u8]);
            held.push(l.try_acquire_at(addr, t0).unwrap());
        }
        assert_eq!(
            l.try_acquire_at(ip(1), t0).unwrap_err(),
            Refused::TooManyPeers
        );
        drop(held);
        // Once idle with refilled buckets, the addresses are forgotten.
        let later = t0 + Duration::from_secs(4);
        drop(l.try_acquire_at(ip(1), later).unwrap());
    }
}

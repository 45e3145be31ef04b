//! Handshake slots shared fairly between sources (`asterism_basics::slots`): the aTLS
//! listener holds one slot per handshake in progress (TLS handshake and attestation
//! exchange, before the peer is verified), at most so many in all and per source. When all
//! are taken, a connection from a source holding fewer than the busiest takes the
//! busiest's oldest, so no set of sources can keep another out. A *source* is an IPv4
//! address or an IPv6 /64 ([`source_of`]).

pub use asterism_basics::slots::{PendingSlot, PendingSlots, SlotRefused};
/// The source an address counts against: the IPv4 address, or the IPv6 /64 (one rule for
/// every per-source limit of the workspace).
pub use asterism_basics::source_of;

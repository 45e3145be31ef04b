//! Plumbing shared by the Asterism binaries, one definition each: the log subscriber
//! ([`logging`]), shutdown on SIGINT or SIGTERM ([`signal`]), the AK-trust flags
//! ([`ak_trust`]), an error with its causes on one line ([`error_chain`], from
//! `asterism-basics`), capped reads and private file writes ([`fs`]), the watcher that
//! reloads an expected-measurements file ([`measurements`]), a token bucket per peer
//! ([`ratelimit`]), a queue for costly work shared fairly between sources ([`fair_queue`]),
//! a service's runtime and exit code ([`service`]), the one hardened gRPC serve
//! ([`grpc`]), and a Unix socket only its owner can reach from its first moment
//! ([`socket`]).
//!
//! For binaries (and the library halves of binary packages) only. A library crate must
//! never depend on this one: libraries take values (bytes, measurements, a shutdown future),
//! not flags, environment variables, signals or paths to watch (docs/binkit.md).
#![forbid(unsafe_code)]

pub mod ak_trust;
pub mod fair_queue;
pub mod fs;
pub mod grpc;
pub mod logging;
pub mod measurements;
pub mod ratelimit;
pub mod service;
pub mod signal;
pub mod socket;

pub use ak_trust::AkTrustArgs;
pub use fair_queue::FairQueue;
pub use fs::{FileError, read_capped, write_atomic, write_new, write_private};
pub use logging::{LogArgs, LogFormat};
pub use measurements::MeasurementsWatcher;
pub use ratelimit::RateLimiter;
pub use signal::shutdown_signal;
pub use socket::{PrivateSocket, SocketError, SocketFile, bind_private};

pub use asterism_basics::error_chain;

//! Plumbing shared by the Asterism binaries, one definition each: the log subscriber
//! ([`logging`]), shutdown on SIGINT or SIGTERM ([`signal`]), the AK-trust flags
//! ([`ak_trust`]), an error with its causes on one line ([`error_chain`]), capped reads and
//! private file writes ([`fs`]), the watcher that reloads an expected-measurements file
//! ([`measurements`]), and a token bucket per peer ([`ratelimit`]).
//!
//! For binaries (and the library halves of binary packages) only. A library crate must
//! never depend on this one: libraries take values (bytes, measurements, a shutdown future),
//! not flags, environment variables, signals or paths to watch (docs/binkit.md).
#![forbid(unsafe_code)]

pub mod ak_trust;
pub mod fs;
pub mod grpc;
pub mod logging;
pub mod measurements;
pub mod ratelimit;
pub mod service;
pub mod signal;

pub use ak_trust::AkTrustArgs;
pub use fs::{FileError, read_capped, write_atomic, write_new, write_private};
pub use logging::{LogArgs, LogFormat};
pub use measurements::MeasurementsWatcher;
pub use ratelimit::RateLimiter;
pub use signal::shutdown_signal;

/// An error and its causes on one line, `a: b: c`, for the log (a `Display` of the error
/// alone would drop the causes).
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

#[cfg(test)]
mod tests {
    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn the_chain_names_every_cause_in_order() {
        let e = Outer(std::io::Error::other("inner"));
        assert_eq!(super::error_chain(&e), "outer: inner");
    }
}

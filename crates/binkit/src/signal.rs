//! Shutdown on SIGINT or SIGTERM.

use std::future::Future;

use tokio::signal::unix::{SignalKind, signal};

/// A signal handler could not be installed.
#[derive(Debug, thiserror::Error)]
#[error("cannot handle {signal}")]
pub struct SignalError {
    /// `SIGTERM` or `SIGINT`.
    pub signal: &'static str,
    /// The cause.
    #[source]
    pub source: std::io::Error,
}

/// Completes on the first SIGTERM or SIGINT, logging which (info). The handlers are
/// installed now, before the caller announces its service, so an early signal is never
/// fatal. Call it inside a Tokio runtime.
pub fn shutdown_signal() -> Result<impl Future<Output = ()> + Send + 'static, SignalError> {
    let handler = |kind: SignalKind, name: &'static str| {
        signal(kind).map_err(|source| SignalError {
            signal: name,
            source,
        })
    };
    let mut term = handler(SignalKind::terminate(), "SIGTERM")?;
    let mut int = handler(SignalKind::interrupt(), "SIGINT")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("received SIGTERM"),
            _ = int.recv() => tracing::info!("received SIGINT"),
        }
    })
}

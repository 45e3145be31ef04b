//! What the flows (InitServer, JoinClient) share with the orchestrator: the events they
//! send it and the pause that a stop request cuts short.

use std::time::Duration;

use asterism_kms::ClusterId;
use tokio::sync::watch;

use crate::error::StepError;

/// How the JoinClient ended.
#[derive(Debug)]
pub(crate) enum JoinEnd {
    /// The node joined the cluster.
    Joined(ClusterId),
    /// The node lock was taken by the InitServer: nothing to do.
    LostRace,
    /// Stopped before it got a ticket.
    Stopped,
}

/// What the flows tell the orchestrator.
#[derive(Debug)]
pub(crate) enum Event {
    /// An Init took the node lock: stop the JoinClient.
    InitLocked,
    /// The Init after the lock finished (on failure the disk is already marked for reset).
    InitDone(Result<ClusterId, StepError>),
    /// The JoinClient ended.
    JoinDone(Result<JoinEnd, StepError>),
    /// The InitServer stopped.
    ServerDone(Result<(), tonic::transport::Error>),
}

/// Waits `interval`, or less if `stop` is set. Returns whether stop is set.
pub(crate) async fn pause(stop: &mut watch::Receiver<bool>, interval: Duration) -> bool {
    if *stop.borrow() {
        return true;
    }
    let stopped = tokio::select! {
        () = tokio::time::sleep(interval) => false,
        _ = stop.wait_for(|s| *s) => true,
    };
    stopped || *stop.borrow()
}

/// Runs `round` with the attempt's number (from 1) until it gives a value, pausing
/// `interval` after each round that gives none: the value, or `None` once `stop` is set
/// (also in the middle of a round, which is then dropped).
pub(crate) async fn rounds_until<T, F, Fut>(
    stop: &mut watch::Receiver<bool>,
    interval: Duration,
    mut round: F,
) -> Option<T>
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let mut attempt: u64 = 0;
    loop {
        if *stop.borrow() {
            return None;
        }
        attempt += 1;
        let got = tokio::select! {
            got = round(attempt) => got,
            _ = stop.wait_for(|s| *s) => return None,
        };
        if got.is_some() {
            return got;
        }
        if pause(stop, interval).await {
            return None;
        }
    }
}

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

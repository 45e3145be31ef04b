//! The node lock: where InitServer and JoinClient meet. Exactly one of them
//! takes it, once; taking it extends the cluster ID into PCR 15, after which the node can no
//! longer pass attestation as a fresh node in this boot. That is the point of no return.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use asterism_kms::ClusterId;
use tracing::info;

use crate::effects::{MarkError, NodeMarker};

/// Which flow took the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// The InitServer.
    Init,
    /// The JoinClient.
    Join,
    /// The rejoin client (a reboot, keys from a join service).
    Rejoin,
    /// The recovery server (a reboot, keys from the owner).
    Recovery,
}

/// A one-shot lock with no unlock.
pub struct NodeLock {
    taken: AtomicBool,
    marker: Arc<dyn NodeMarker>,
}

impl std::fmt::Debug for NodeLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeLock")
            .field("taken", &self.taken.load(Ordering::SeqCst))
            .finish_non_exhaustive()
    }
}

/// The lock was taken, but marking PCR 15 failed. The lock stays taken: the caller is past
/// the point of no return and must fail (reset the disk) rather than let the other flow try.
#[derive(Debug, thiserror::Error)]
#[error("took the node lock but could not mark the node")]
pub struct LockError(#[source] pub MarkError);

impl NodeLock {
    /// An unlocked lock that marks through `marker`.
    #[must_use]
    pub fn new(marker: Arc<dyn NodeMarker>) -> Self {
        Self {
            taken: AtomicBool::new(false),
            marker,
        }
    }

    /// Whether the lock has been taken.
    #[must_use]
    pub fn is_taken(&self) -> bool {
        self.taken.load(Ordering::SeqCst)
    }

    /// Takes the lock for `holder` if nobody has (`Ok(true)`), then marks the node with
    /// `cluster_id`; `Ok(false)` if it was taken already. Marking blocks on the TPM: call
    /// this on a blocking thread.
    pub fn try_lock_once(&self, holder: Holder, cluster_id: &ClusterId) -> Result<bool, LockError> {
        if self
            .taken
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return Ok(false);
        }
        info!(by = ?holder, cluster_id = %cluster_id, "took the node lock; marking PCR 15 (point of no return)");
        self.marker.mark(cluster_id).map_err(LockError)?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Recorder(Mutex<Vec<ClusterId>>);

    impl NodeMarker for Recorder {
        fn is_marked(&self) -> Result<bool, MarkError> {
            Ok(!self.0.lock().unwrap().is_empty())
        }
        fn mark(&self, cluster_id: &ClusterId) -> Result<(), MarkError> {
            self.0.lock().unwrap().push(*cluster_id);
            Ok(())
        }
    }

    #[test]
    fn only_the_first_taker_wins_and_the_node_is_marked_once() {
        let marker = Arc::new(Recorder::default());
        let lock = Arc::new(NodeLock::new(marker.clone()));
        let id = ClusterId::from([7; 32]);
        let winners: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|i| {
                    let lock = lock.clone();
                    let holder = if i % 2 == 0 {
                        Holder::Init
                    } else {
                        Holder::Join
                    };
                    s.spawn(move || usize::from(lock.try_lock_once(holder, &id).unwrap()))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(winners, 1);
        assert_eq!(marker.0.lock().unwrap().len(), 1);
        assert!(lock.is_taken());
    }
}

//! The node: its configuration and its effects (PCR 15, the state disk and its file system,
//! the attestation issuer, the metadata, the Kubernetes driver, the log buffer) and the node
//! lock. Built
//! once by the program (or a test) and handed to the flows.

use std::sync::Arc;

use asterism_attestation::Issuer;
use asterism_binkit::error_chain;
use tracing::warn;

use crate::config::Config;
use crate::effects::{DiskOps, KubernetesDriver, NodeMarker, StateMount};
use crate::error::blocking;
use crate::lock::NodeLock;
use crate::logbuf::LogBuffer;
use asterism_cluster::NodeDir;

/// A node and its effects.
pub struct Node<M> {
    pub(crate) config: Config,
    pub(crate) marker: Arc<dyn NodeMarker>,
    pub(crate) disk: Arc<dyn DiskOps>,
    pub(crate) mount: Arc<dyn StateMount>,
    pub(crate) issuer: Arc<dyn Issuer>,
    pub(crate) metadata: M,
    pub(crate) driver: Arc<dyn KubernetesDriver>,
    pub(crate) logs: LogBuffer,
    pub(crate) lock: NodeLock,
}

impl<M> std::fmt::Debug for Node<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("config", &self.config)
            .field("driver", &self.driver.name())
            .field("lock", &self.lock)
            .finish_non_exhaustive()
    }
}

impl<M> Node<M> {
    /// A node with its effects: the node marker (PCR 15), the state disk, its file system
    /// (used only where the disk is mapped), the attestation issuer, the metadata client,
    /// the Kubernetes driver and the log buffer that failed Inits stream back.
    #[allow(clippy::too_many_arguments)] // one per effect, each named by its type
    pub fn new(
        config: Config,
        marker: Arc<dyn NodeMarker>,
        disk: Arc<dyn DiskOps>,
        mount: Arc<dyn StateMount>,
        issuer: Arc<dyn Issuer>,
        metadata: M,
        driver: Arc<dyn KubernetesDriver>,
        logs: LogBuffer,
    ) -> Self {
        Self {
            lock: NodeLock::new(marker.clone()),
            config,
            marker,
            disk,
            mount,
            issuer,
            metadata,
            driver,
            logs,
        }
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The node directory.
    pub(crate) fn dir(&self) -> &NodeDir {
        &self.config.node_dir
    }

    /// Marks the state disk for reset after a failure past the point of no return, so that
    /// the next boot formats it instead of finding a half-initialised node.
    pub(crate) async fn reset_after_failure(&self, error: &(dyn std::error::Error + Send + Sync)) {
        tracing::error!(error = %error_chain(error), "a step after the point of no return failed; marking the state disk for reset");
        let disk = self.disk.clone();
        match blocking(move || disk.mark_for_reset()).await {
            Ok(()) => warn!(
                "the state disk is marked for reset: the next boot formats it; reboot the node (reset its TPM) to start over"
            ),
            Err(e) => {
                tracing::error!(error = %error_chain(&e), "cannot mark the state disk for reset")
            }
        }
    }
}

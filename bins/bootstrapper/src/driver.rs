//! The `none` Kubernetes driver of local mode (docs/design/local-cluster.md): on init it
//! makes the cluster CA and an admin kubeconfig; on join it does nothing (the join service
//! admitted the node to the membership record when it issued the ticket).

use futures::future::BoxFuture;
use tracing::info;
use zeroize::Zeroizing;

use crate::effects::{ClusterInit, ClusterJoin, DriverError, KubernetesDriver};

/// The `none` driver.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoneDriver;

impl NoneDriver {
    /// The driver.
    #[must_use]
    pub fn new() -> Self {
        Self
    }
}

impl KubernetesDriver for NoneDriver {
    fn name(&self) -> &'static str {
        "none"
    }

    fn init<'a>(
        &'a self,
        params: &'a ClusterInit,
    ) -> BoxFuture<'a, Result<Zeroizing<Vec<u8>>, DriverError>> {
        Box::pin(async move {
            let _ = params;
            Err(DriverError("asterism-pki is not available yet".into()))
        })
    }

    fn join<'a>(&'a self, params: &'a ClusterJoin) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async move {
            info!(node = %params.node_name, role = %params.role, endpoint = %params.api_server_endpoint, "none driver: no Kubernetes to join; the join service has admitted the node");
            Ok(())
        })
    }
}

//! The `none` Kubernetes driver of local mode (docs/design/local-cluster.md): on init it
//! makes the cluster CA (`ca.crt`, `ca.key` 0600) and an admin kubeconfig whose server is
//! `https://<node ip>:6443`; on join it does nothing (the join service admitted the node to
//! the membership record when it issued the ticket).

use std::net::SocketAddr;
use std::time::SystemTime;

use asterism_pki::{ClusterCa, render_admin_kubeconfig};
use futures::future::BoxFuture;
use tracing::info;
use zeroize::Zeroizing;

use crate::effects::{ClusterInit, ClusterJoin, DriverError, KubernetesDriver};
use crate::files;

/// The API server port.
const KUBERNETES_PORT: u16 = 6443;

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

fn fail(what: &str) -> impl FnOnce(&dyn std::error::Error) -> DriverError + '_ {
    move |e| DriverError(format!("{what}: {}", crate::node::error_chain(e)))
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
            let now = SystemTime::now();
            let ca = ClusterCa::generate(now).map_err(|e| fail("generating the cluster CA")(&e))?;
            let key = ca
                .key_pem()
                .map_err(|e| fail("encoding the cluster CA key")(&e))?;
            files::write_atomic(
                &params.pki_dir.join("ca.key"),
                key.expose_secret().as_bytes(),
                files::SECRET_MODE,
            )
            .map_err(|e| fail("writing the cluster CA key")(&e))?;
            files::write_atomic(
                &params.pki_dir.join("ca.crt"),
                ca.cert_pem().as_bytes(),
                files::PUBLIC_MODE,
            )
            .map_err(|e| fail("writing the cluster CA certificate")(&e))?;
            let admin = ca
                .issue_admin(now)
                .map_err(|e| fail("issuing the admin certificate")(&e))?;
            let server = format!(
                "https://{}",
                SocketAddr::new(params.node_ip, KUBERNETES_PORT)
            );
            let kubeconfig =
                render_admin_kubeconfig(&params.cluster_name, &server, ca.cert_pem(), &admin);
            info!(pki_dir = %params.pki_dir.display(), server = %server, "none driver: made the cluster CA and the admin kubeconfig (no Kubernetes is started)");
            Ok(Zeroizing::new(
                kubeconfig.expose_secret().as_bytes().to_vec(),
            ))
        })
    }

    fn join<'a>(&'a self, params: &'a ClusterJoin) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async move {
            info!(node = %params.node_name, role = %params.role, endpoint = %params.api_server_endpoint, "none driver: no Kubernetes to join; the join service has admitted the node");
            Ok(())
        })
    }
}

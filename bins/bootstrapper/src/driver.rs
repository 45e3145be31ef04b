//! The Kubernetes drivers.
//!
//! * `none` (local mode, docs/design/local-cluster.md): on init it makes the cluster CA
//!   (`ca.crt`, `ca.key` 0600) and an admin kubeconfig whose server is
//!   `https://<node ip>:6443`; on join it does nothing (the join service admitted the node to
//!   the membership record when it issued the ticket).
//! * `kubeadm` (real machines, docs/kubernetes.md): components, kubeadm configuration and
//!   kubeadm through `asterism_kubernetes::kubeadm`.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::SystemTime;

use asterism_kubernetes::components::{Component, DownloadPolicy, Installer};
use asterism_kubernetes::kubeadm::config::{
    ApiVersion, BootstrapToken, CloudProvider, InitParams, JoinParams, NodePaths,
};
use asterism_kubernetes::kubeadm::runner::ProcessCommands;
use asterism_kubernetes::kubeadm::setup::{
    CONTROL_PLANE_FILES, ControlPlaneFile, KubeadmNode, SetupConfig,
};
use asterism_metadata::Metadata;

use asterism_pki::{ClusterCa, render_admin_kubeconfig};
use futures::future::BoxFuture;
use tracing::info;
use zeroize::Zeroizing;

use crate::effects::{ClusterInit, ClusterJoin, DriverError, KubernetesDriver};
use crate::files;
use crate::node_state::Role;

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

/// Settings of the [`KubeadmDriver`] (from the bootstrapper's flags).
#[derive(Debug, Clone)]
pub struct KubeadmDriverConfig {
    /// Programs and paths of the node (kubeadm, systemctl, `/etc/kubernetes`, the kubelet's
    /// certificate, the directory for private configuration files).
    pub setup: SetupConfig,
    /// The node's address in the cluster network.
    pub node_ip: IpAddr,
    /// The cloud-provider setting, the same for init and join.
    pub cloud_provider: CloudProvider,
    /// The components to install before kubeadm runs (empty: the image holds them).
    pub components: Vec<Component>,
    /// Retries, timeouts and size limits of component downloads.
    pub download: DownloadPolicy,
}

/// The `kubeadm` driver (REFERENCE §11.5–§11.7): installs the components, renders the kubeadm
/// configuration and runs kubeadm through `asterism_kubernetes::kubeadm`. The provider ID
/// and the load balancer host come from the metadata, as in the original.
pub struct KubeadmDriver<M> {
    node: KubeadmNode<ProcessCommands>,
    metadata: M,
    node_ip: IpAddr,
    cloud_provider: CloudProvider,
    components: Vec<Component>,
}

impl<M> std::fmt::Debug for KubeadmDriver<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeadmDriver")
            .field("setup", self.node.config())
            .field("node_ip", &self.node_ip)
            .field("cloud_provider", &self.cloud_provider)
            .field("components", &self.components.len())
            .finish_non_exhaustive()
    }
}

impl<M: Metadata> KubeadmDriver<M> {
    /// The driver; fails when the component list is unusable (a missing or malformed hash,
    /// URL or path is refused here, before the node does anything).
    pub fn new(config: KubeadmDriverConfig, metadata: M) -> Result<Self, DriverError> {
        asterism_kubernetes::components::check_all(&config.components)
            .map_err(|e| fail("the Kubernetes components")(&e))?;
        let installer =
            Installer::new(config.download).map_err(|e| fail("the component installer")(&e))?;
        Ok(Self {
            node: KubeadmNode::new(config.setup, ProcessCommands::default(), installer),
            metadata,
            node_ip: config.node_ip,
            cloud_provider: config.cloud_provider,
            components: config.components,
        })
    }

    /// Starts the kubelet of an already-bootstrapped (or rejoined) node (REFERENCE §11.7).
    pub async fn start_kubelet(&self) -> Result<(), DriverError> {
        self.node
            .start_kubelet()
            .await
            .map_err(|e| fail("starting the kubelet")(&e))
    }

    /// The provider ID from the metadata (empty when the record has none).
    async fn provider_id(&self) -> Result<String, DriverError> {
        let me = self
            .metadata
            .self_instance()
            .await
            .map_err(|e| fail("asking the metadata for this node")(&e))?;
        Ok(me.provider_id)
    }
}

/// The init parameters of the kubeadm configuration, from the driver's parameters and the
/// metadata's provider ID and load balancer host.
pub fn kubeadm_init_params(
    params: &ClusterInit,
    paths: &NodePaths,
    cloud_provider: CloudProvider,
    provider_id: String,
    load_balancer_host: String,
) -> Result<InitParams, DriverError> {
    let kubernetes_version = params
        .kubernetes_version
        .parse()
        .map_err(|e| fail("the Kubernetes version")(&e))?;
    Ok(InitParams {
        kubernetes_version,
        cluster_name: params.cluster_name.clone(),
        node_name: params.node_name.clone(),
        node_ip: params.node_ip,
        provider_id,
        control_plane_endpoint: load_balancer_host,
        service_cidr: params.service_cidr.clone(),
        cert_sans: params.apiserver_cert_sans.clone(),
        cloud_provider,
        paths: paths.clone(),
    })
}

/// The API server endpoint a node joins through: the load balancer (`<host>:6443`) when the
/// metadata names one, else the ticket's endpoint (REFERENCE §11.6 step 3).
#[must_use]
pub fn join_endpoint(load_balancer_host: &str, ticket_endpoint: &str) -> String {
    if load_balancer_host.is_empty() {
        ticket_endpoint.to_owned()
    } else {
        match load_balancer_host.parse::<IpAddr>() {
            Ok(ip) => SocketAddr::new(ip, KUBERNETES_PORT).to_string(),
            Err(_) => format!("{load_balancer_host}:{KUBERNETES_PORT}"),
        }
    }
}

/// The control-plane files the join flow wrote under `pki_dir`, for kubeadm.
fn read_control_plane_files(pki_dir: &Path) -> Result<Vec<ControlPlaneFile>, DriverError> {
    let mut out = Vec::new();
    for name in CONTROL_PLANE_FILES {
        let path = pki_dir.join(name);
        match std::fs::read(&path) {
            Ok(data) => out.push(ControlPlaneFile {
                name: name.to_owned(),
                data: Zeroizing::new(data),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(fail("reading a control-plane file")(&e)),
        }
    }
    Ok(out)
}

impl<M: Metadata + 'static> KubernetesDriver for KubeadmDriver<M> {
    fn name(&self) -> &'static str {
        "kubeadm"
    }

    fn init<'a>(
        &'a self,
        params: &'a ClusterInit,
    ) -> BoxFuture<'a, Result<Zeroizing<Vec<u8>>, DriverError>> {
        Box::pin(async move {
            let provider_id = self.provider_id().await?;
            let lb = self
                .metadata
                .control_plane_endpoint()
                .await
                .map_err(|e| fail("asking the metadata for the load balancer")(&e))?;
            let init = kubeadm_init_params(
                params,
                &self.node.config().paths,
                self.cloud_provider,
                provider_id,
                lb,
            )?;
            let kubeconfig = self
                .node
                .init(&self.components, &init, params.conformance_mode)
                .await
                .map_err(|e| fail("kubeadm init")(&e))?;
            info!(cluster = %params.cluster_name, version = %params.kubernetes_version, "kubeadm driver: the cluster is initialised");
            Ok(kubeconfig)
        })
    }

    fn join<'a>(&'a self, params: &'a ClusterJoin) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async move {
            let provider_id = self.provider_id().await?;
            let lb = self
                .metadata
                .control_plane_endpoint()
                .await
                .map_err(|e| fail("asking the metadata for the load balancer")(&e))?;
            let control_plane = params.role == Role::ControlPlane;
            let files = if control_plane {
                read_control_plane_files(&params.pki_dir)?
            } else {
                Vec::new()
            };
            let token = BootstrapToken::new(Zeroizing::new(params.token.as_str().to_owned()))
                .map_err(|e| fail("the join ticket")(&e))?;
            let join = JoinParams {
                // Replaced by the installed kubeadm's version.
                api_version: ApiVersion::V1Beta4,
                node_name: params.node_name.clone(),
                node_ip: self.node_ip,
                provider_id,
                api_server_endpoint: join_endpoint(&lb, &params.api_server_endpoint),
                token,
                ca_cert_hashes: vec![params.discovery_token_ca_cert_hash.clone()],
                control_plane,
                cloud_provider: self.cloud_provider,
                paths: self.node.config().paths.clone(),
            };
            self.node
                .join_with_installed_kubeadm(&self.components, join, &files)
                .await
                .map_err(|e| fail("kubeadm join")(&e))?;
            info!(node = %params.node_name, role = %params.role, "kubeadm driver: joined the cluster");
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn init() -> ClusterInit {
        ClusterInit {
            cluster_name: "asterism".into(),
            kubernetes_version: "v1.31.2".into(),
            apiserver_cert_sans: vec!["api.example".into()],
            service_cidr: "10.96.0.0/12".into(),
            conformance_mode: false,
            node_ip: "10.9.0.2".parse().unwrap(),
            node_name: "cp-0".into(),
            pki_dir: "/unused".into(),
        }
    }

    #[test]
    fn init_parameters_come_from_the_request_and_the_metadata() {
        let p = kubeadm_init_params(
            &init(),
            &NodePaths::standard(),
            CloudProvider::External,
            "gce://p/z/cp-0".into(),
            "10.9.0.100".into(),
        )
        .unwrap();
        assert_eq!(p.kubernetes_version.as_str(), "v1.31.2");
        assert_eq!(p.control_plane_endpoint, "10.9.0.100");
        assert_eq!(p.provider_id, "gce://p/z/cp-0");
        assert_eq!(p.cert_sans, ["api.example"]);
        assert_eq!(p.cloud_provider, CloudProvider::External);
        let mut bad = init();
        bad.kubernetes_version = "1.31".into();
        assert!(
            kubeadm_init_params(
                &bad,
                &NodePaths::standard(),
                CloudProvider::None,
                String::new(),
                String::new()
            )
            .is_err()
        );
    }

    #[test]
    fn joins_go_through_the_load_balancer_when_there_is_one() {
        assert_eq!(
            join_endpoint("10.9.0.100", "10.9.0.2:6443"),
            "10.9.0.100:6443"
        );
        assert_eq!(
            join_endpoint("lb.example", "10.9.0.2:6443"),
            "lb.example:6443"
        );
        assert_eq!(join_endpoint("fd00::1", "x"), "[fd00::1]:6443");
        assert_eq!(join_endpoint("", "10.9.0.2:6443"), "10.9.0.2:6443");
    }

    #[test]
    fn control_plane_files_are_read_from_the_pki_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("etcd")).unwrap();
        std::fs::write(dir.path().join("ca.key"), b"k").unwrap();
        std::fs::write(dir.path().join("etcd/ca.crt"), b"c").unwrap();
        let files = read_control_plane_files(dir.path()).unwrap();
        let names: Vec<_> = files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["ca.key", "etcd/ca.crt"]);
    }
}

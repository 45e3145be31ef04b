//! The Kubernetes drivers.
//!
//! * `none` (local mode, docs/design/local-cluster.md): on init it makes the cluster CA
//!   (`ca.crt`, `ca.key` 0600) and an admin kubeconfig whose server is
//!   `https://<node ip>:6443`; on join it does nothing (the join service admitted the node to
//!   the membership record when it issued the ticket).
//! * `kubeadm` (real machines, docs/kubernetes.md): components, kubeadm configuration and
//!   kubeadm through `asterism_kubeadm`; after init, the Kubernetes API steps
//!   through `asterism_kube_api` (components ConfigMap, node annotation,
//!   `internal-config`); etcd's I/O priority after init, a control-plane join and a kubelet
//!   start, and a join tried up to three times, through `asterism_kubeadm`.
//!
//! Both are handed the Kubernetes version and the checked components of the init request or
//! the join ticket; the `none` driver installs nothing and says so in its log.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use asterism_cluster::{API_SERVER_PORT, Role};
use asterism_components::{Component, DownloadPolicy, Installer};
use asterism_kube_api::{ApiOptions, ClusterApi, WaitPolicy};
use asterism_kubeadm::config::{
    ApiVersion, CloudProvider, InitParams, JoinParams, NodePaths, k8s_node_name,
};
use asterism_kubeadm::etcdio::EtcdIoPriority;
use asterism_kubeadm::runner::ProcessCommands;
use asterism_kubeadm::setup::{KubeadmNode, SetupConfig};
use asterism_kubernetes_versions::KubernetesVersion;
use asterism_metadata::Metadata;

use asterism_pki::{ClusterCa, render_admin_kubeconfig};
use futures::future::BoxFuture;
use tracing::{info, warn};
use zeroize::Zeroizing;

use crate::effects::{ClusterInit, ClusterJoin, Components, DriverError, KubernetesDriver};
use crate::files;

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

fn fail<E: Into<Box<dyn std::error::Error + Send + Sync>>>(
    what: &'static str,
) -> impl FnOnce(E) -> DriverError {
    move |e| DriverError::new(what, e)
}

/// The `none` driver installs nothing: it says what it was handed, and that nothing is
/// installed, so that a local cluster's log never suggests Kubernetes binaries are there.
fn nothing_installed(kubernetes_version: Option<KubernetesVersion>, components: &Components) {
    info!("{}", nothing_installed_line(kubernetes_version, components));
}

/// What [`nothing_installed`] logs.
fn nothing_installed_line(
    kubernetes_version: Option<KubernetesVersion>,
    components: &Components,
) -> String {
    let version =
        kubernetes_version.map_or_else(|| "no Kubernetes version".to_owned(), |v| v.to_string());
    format!(
        "none driver: {} components for {version} handed over, nothing installed",
        components.len()
    )
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
            nothing_installed(Some(params.kubernetes_version), &params.components);
            let now = SystemTime::now();
            let ca = ClusterCa::generate(now).map_err(fail("generating the cluster CA"))?;
            let key = ca.key_pem().map_err(fail("encoding the cluster CA key"))?;
            files::write_atomic(
                &params.pki_dir.join("ca.key"),
                key.expose_secret().as_bytes(),
                files::SECRET_MODE,
            )
            .map_err(fail("writing the cluster CA key"))?;
            files::write_atomic(
                &params.pki_dir.join("ca.crt"),
                ca.cert_pem().as_bytes(),
                files::PUBLIC_MODE,
            )
            .map_err(fail("writing the cluster CA certificate"))?;
            let admin = ca
                .issue_admin(now)
                .map_err(fail("issuing the admin certificate"))?;
            let server = format!(
                "https://{}",
                SocketAddr::new(params.node_ip, API_SERVER_PORT)
            );
            let kubeconfig =
                render_admin_kubeconfig(&params.cluster_name, &server, ca.cert_pem(), &admin);
            info!(pki_dir = %params.pki_dir.display(), server = %server, "none driver: made the cluster CA and the admin kubeconfig (no Kubernetes is started)");
            Ok(Zeroizing::new(
                kubeconfig.expose_secret().as_bytes().to_vec(),
            ))
        })
    }

    fn join(&self, params: ClusterJoin) -> BoxFuture<'_, Result<(), DriverError>> {
        Box::pin(async move {
            nothing_installed(params.kubernetes_version, &params.components);
            // kubeadm would put the control-plane files into its certificate directory;
            // here they go into the node's (a worker has none).
            let paths: Vec<PathBuf> = params
                .control_plane_files
                .iter()
                .map(|f| params.pki_dir.join(&f.name))
                .collect();
            let batch: Vec<files::FileToWrite<'_>> = paths
                .iter()
                .zip(&params.control_plane_files)
                .map(|(path, f)| (path.as_path(), f.data.as_slice(), files::SECRET_MODE))
                .collect();
            files::write_all_atomic(&batch).map_err(fail("writing the control-plane files"))?;
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
    /// The components to install when the init request or join ticket names none (empty:
    /// the image holds kubeadm, the kubelet and the CNI plugins).
    pub fallback_components: Vec<Component>,
    /// Retries, timeouts and size limits of component downloads.
    pub download: DownloadPolicy,
    /// How the Kubernetes API is reached after init.
    pub api: PostInitApi,
}

/// How the kubeadm driver reaches the Kubernetes API after `kubeadm init` (docs/kubernetes.md).
#[derive(Debug, Clone)]
pub struct PostInitApi {
    /// The kubeconfig the client is built from: the admin kubeconfig kubeadm wrote
    /// (`<kubernetes dir>/admin.conf`).
    pub kubeconfig: PathBuf,
    /// Timeouts of each request.
    pub options: ApiOptions,
    /// How long to wait for the API server to answer.
    pub wait: WaitPolicy,
}

impl PostInitApi {
    /// kubeadm's `admin.conf` in `kubernetes_dir`, the default timeouts and wait.
    #[must_use]
    pub fn admin_conf(kubernetes_dir: &Path) -> Self {
        Self {
            kubeconfig: kubernetes_dir.join("admin.conf"),
            options: ApiOptions::default(),
            wait: WaitPolicy::default(),
        }
    }
}

/// The Kubernetes API steps after init (docs/kubernetes.md): wait for the API
/// server, create the immutable components ConfigMap, annotate node `node_name` with its
/// name, create `internal-config`. Returns the ConfigMap's name.
pub async fn post_init_api_steps(
    api: &ClusterApi,
    wait: WaitPolicy,
    components: &Components,
    cluster_version: KubernetesVersion,
    node_name: &str,
) -> Result<String, DriverError> {
    api.wait_until_ready(wait)
        .await
        .map_err(fail("waiting for the Kubernetes API server"))?;
    let config_map = api
        .create_components_config_map(&components.to_proto(), &cluster_version.to_string())
        .await
        .map_err(fail("creating the components ConfigMap"))?;
    api.annotate_node_components(node_name, &config_map)
        .await
        .map_err(fail("annotating the node with its components"))?;
    api.create_internal_config()
        .await
        .map_err(fail("creating internal-config"))?;
    info!(configmap = %config_map, node = %node_name, "recorded the components in the cluster and created internal-config");
    Ok(config_map)
}

/// The `kubeadm` driver (docs/kubernetes.md): installs the components of the request
/// (or ticket), renders the kubeadm configuration and runs kubeadm through
/// `asterism_kubeadm`; after init it takes the Kubernetes API steps
/// ([`post_init_api_steps`]). The provider ID comes from the metadata, and so does, on
/// init, the load balancer host (the control-plane endpoint). A join uses the API server
/// endpoint of its ticket as it is.
pub struct KubeadmDriver<M> {
    node: KubeadmNode<ProcessCommands>,
    metadata: M,
    node_ip: IpAddr,
    cloud_provider: CloudProvider,
    fallback_components: Components,
    api: PostInitApi,
}

impl<M> std::fmt::Debug for KubeadmDriver<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeadmDriver")
            .field("setup", self.node.config())
            .field("node_ip", &self.node_ip)
            .field("cloud_provider", &self.cloud_provider)
            .field("fallback_components", &self.fallback_components.len())
            .field("api", &self.api)
            .finish_non_exhaustive()
    }
}

impl<M: Metadata> KubeadmDriver<M> {
    /// The driver; fails when the fallback component list is unusable (a missing or
    /// malformed hash, URL or path is refused here, before the node does anything).
    pub fn new(config: KubeadmDriverConfig, metadata: M) -> Result<Self, DriverError> {
        let fallback_components = Components::new(config.fallback_components)
            .map_err(fail("the fallback Kubernetes components"))?;
        let installer = Installer::new(config.download).map_err(fail("the component installer"))?;
        Ok(Self {
            node: KubeadmNode::new(config.setup, ProcessCommands::default(), installer),
            metadata,
            node_ip: config.node_ip,
            cloud_provider: config.cloud_provider,
            fallback_components,
            api: config.api,
        })
    }

    /// Prioritises etcd's I/O with `step` after init, after a control-plane join and after
    /// the kubelet starts (docs/kubernetes.md); the step never fails the driver.
    #[must_use]
    pub fn with_etcd_io_priority(mut self, step: EtcdIoPriority) -> Self {
        self.node = self.node.with_etcd_io_priority(step);
        self
    }

    /// The components to install: the request's (or ticket's), else the fallback list.
    fn components<'a>(&'a self, requested: &'a Components) -> &'a Components {
        if requested.is_empty() {
            if !self.fallback_components.is_empty() {
                info!(
                    count = self.fallback_components.len(),
                    "the request names no Kubernetes components: installing the fallback list"
                );
            }
            &self.fallback_components
        } else {
            if !self.fallback_components.is_empty() {
                warn!(
                    count = requested.len(),
                    "the request names Kubernetes components: the fallback list is not used"
                );
            }
            requested
        }
    }

    /// Starts the kubelet of an already-bootstrapped (or rejoined) node.
    pub async fn start_kubelet(&self) -> Result<(), DriverError> {
        self.node
            .start_kubelet()
            .await
            .map_err(fail("starting the kubelet"))
    }

    /// The provider ID from the metadata (empty when the record has none).
    async fn provider_id(&self) -> Result<String, DriverError> {
        let me = self
            .metadata
            .self_instance()
            .await
            .map_err(fail("asking the metadata for this node"))?;
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
    Ok(InitParams {
        kubernetes_version: params.kubernetes_version,
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
                .map_err(fail("asking the metadata for the load balancer"))?;
            let init = kubeadm_init_params(
                params,
                &self.node.config().paths,
                self.cloud_provider,
                provider_id,
                lb,
            )?;
            let components = self.components(&params.components);
            let node_name = k8s_node_name(&params.node_name).map_err(fail("the node name"))?;
            let kubeconfig = self
                .node
                .init(components.checked(), &init, params.conformance_mode)
                .await
                .map_err(fail("kubeadm init"))?;
            info!(cluster = %params.cluster_name, version = %params.kubernetes_version, "kubeadm driver: kubeadm init finished");
            let api = ClusterApi::from_kubeconfig(&self.api.kubeconfig, self.api.options)
                .await
                .map_err(fail("the Kubernetes API client"))?;
            post_init_api_steps(
                &api,
                self.api.wait,
                components,
                params.kubernetes_version,
                &node_name,
            )
            .await?;
            info!(cluster = %params.cluster_name, "kubeadm driver: the cluster is initialised");
            Ok(kubeconfig)
        })
    }

    fn join(&self, params: ClusterJoin) -> BoxFuture<'_, Result<(), DriverError>> {
        Box::pin(async move {
            let provider_id = self.provider_id().await?;
            let control_plane = params.role == Role::ControlPlane;
            let join = JoinParams {
                // Replaced by the installed kubeadm's version.
                api_version: ApiVersion::V1Beta4,
                node_name: params.node_name.clone(),
                node_ip: self.node_ip,
                provider_id,
                api_server_endpoint: params.api_server_endpoint.as_str().to_owned(),
                token: params.token,
                ca_cert_hashes: vec![params.discovery_token_ca_cert_hash.clone()],
                control_plane,
                cloud_provider: self.cloud_provider,
                paths: self.node.config().paths.clone(),
            };
            let components = self.components(&params.components);
            self.node
                .join_with_installed_kubeadm(
                    components.checked(),
                    join,
                    &params.control_plane_files,
                )
                .await
                .map_err(fail("kubeadm join"))?;
            info!(node = %params.node_name, role = %params.role, version = %params.kubernetes_version.map(|v| v.to_string()).unwrap_or_default(), "kubeadm driver: joined the cluster");
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
            kubernetes_version: "v1.31.2".parse().unwrap(),
            apiserver_cert_sans: vec!["api.example".into()],
            service_cidr: "10.96.0.0/12".into(),
            conformance_mode: false,
            node_ip: "10.9.0.2".parse().unwrap(),
            node_name: "cp-0".into(),
            pki_dir: "/unused".into(),
            components: Components::default(),
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
        assert_eq!(p.kubernetes_version.to_string(), "v1.31.2");
        assert_eq!(p.control_plane_endpoint, "10.9.0.100");
        assert_eq!(p.provider_id, "gce://p/z/cp-0");
        assert_eq!(p.cert_sans, ["api.example"]);
        assert_eq!(p.cloud_provider, CloudProvider::External);
    }

    #[tokio::test]
    async fn the_none_driver_writes_the_control_plane_files_it_is_handed_once() {
        use asterism_kubeadm::setup::ControlPlaneFile;
        let dir = tempfile::tempdir().unwrap();
        let pki_dir = dir.path().join("pki");
        let join = ClusterJoin {
            api_server_endpoint: crate::effects::ApiServerEndpoint::parse("10.9.0.2:6443").unwrap(),
            token: asterism_cluster::BootstrapToken::parse("abcdef.0123456789abcdef").unwrap(),
            discovery_token_ca_cert_hash: format!("sha256:{}", "ab".repeat(32)),
            role: Role::ControlPlane,
            node_name: "cp-1".into(),
            pki_dir: pki_dir.clone(),
            kubernetes_version: None,
            components: Components::default(),
            control_plane_files: vec![
                ControlPlaneFile {
                    name: "ca.key".into(),
                    data: Zeroizing::new(b"k".to_vec()),
                },
                ControlPlaneFile {
                    name: "etcd/ca.crt".into(),
                    data: Zeroizing::new(b"c".to_vec()),
                },
            ],
        };
        let worker_dir = dir.path().join("worker-pki");
        let worker = ClusterJoin {
            api_server_endpoint: join.api_server_endpoint.clone(),
            token: asterism_cluster::BootstrapToken::parse("abcdef.0123456789abcdef").unwrap(),
            discovery_token_ca_cert_hash: join.discovery_token_ca_cert_hash.clone(),
            node_name: join.node_name.clone(),
            kubernetes_version: None,
            components: Components::default(),
            pki_dir: worker_dir.clone(),
            control_plane_files: Vec::new(),
            role: Role::Worker,
        };
        NoneDriver::new().join(join).await.unwrap();
        assert_eq!(std::fs::read(pki_dir.join("ca.key")).unwrap(), b"k");
        assert_eq!(std::fs::read(pki_dir.join("etcd/ca.crt")).unwrap(), b"c");
        // A worker is handed none, and nothing is written.
        NoneDriver::new().join(worker).await.unwrap();
        assert!(!worker_dir.exists());
    }

    /// What the node logs is checked in a real process by `asterism-mini`'s cluster test
    /// (every bootstrapper's log holds the line); a test-local subscriber here would race
    /// with the other tests' threads for the call site.
    #[tokio::test]
    async fn the_none_driver_is_handed_the_version_on_join_and_says_it_installs_nothing() {
        let table = asterism_kubernetes_versions::VersionTable::builtin().unwrap();
        let release = table.select("v1.31.13").unwrap();
        let components = Components::new(release.components().to_vec()).unwrap();
        let count = components.len();
        assert!(count > 0);
        assert_eq!(
            nothing_installed_line(Some(release.version()), &components),
            format!("none driver: {count} components for v1.31.13 handed over, nothing installed")
        );
        let dir = tempfile::tempdir().unwrap();
        let join = ClusterJoin {
            api_server_endpoint: crate::effects::ApiServerEndpoint::parse("10.9.0.2:6443").unwrap(),
            token: asterism_cluster::BootstrapToken::parse("abcdef.0123456789abcdef").unwrap(),
            discovery_token_ca_cert_hash: format!("sha256:{}", "ab".repeat(32)),
            role: Role::Worker,
            node_name: "worker-0".into(),
            pki_dir: dir.path().join("pki"),
            kubernetes_version: Some(release.version()),
            components,
            control_plane_files: Vec::new(),
        };
        NoneDriver::new().join(join).await.unwrap();
        assert!(
            !dir.path().join("pki").exists(),
            "nothing installed or written"
        );
    }
}

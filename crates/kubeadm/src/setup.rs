//! The node setup with kubeadm (docs/kubernetes.md, "What runs"): install the components, enable the
//! kubelet, write the audit policy (and, on a joining control-plane node, the control-plane
//! files), render the configuration into a private file, run kubeadm, remove the file.
//!
//! The bootstrapper's `kubeadm` driver is a thin adapter over [`KubeadmNode`].

use std::path::{Component as PathPart, Path, PathBuf};

use tracing::{info, warn};
use zeroize::Zeroizing;

use super::config::{
    self, AUDIT_POLICY, ConfigError, InitParams, JoinParams, NodePaths, PrivateConfigFile,
};
use super::etcdio::EtcdIoPriority;
use super::runner::{
    Commands, InitRun, Kubeadm, KubeadmError, Kubelet, KubeletService, LocalKubeletCert,
};
use asterism_components::{CheckedComponents, ComponentError, Installer};

pub use asterism_cluster::{CONTROL_PLANE_FILES, ControlPlaneFile};

/// How often a join is tried, back to back: joining sometimes fails transiently (a download,
/// the API server not answering yet), and a failed join makes the node reset its disk.
pub const JOIN_ATTEMPTS: u32 = 3;

/// Setting up the node failed.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// A component could not be installed.
    #[error("installing the Kubernetes components")]
    Components(#[from] ComponentError),
    /// The kubeadm configuration was refused or could not be written.
    #[error("the kubeadm configuration")]
    Config(#[from] ConfigError),
    /// kubeadm or systemctl failed.
    #[error("kubeadm")]
    Kubeadm(#[from] KubeadmError),
    /// A control-plane file name is not a plain relative path.
    #[error("control-plane file name {0:?} is not a plain relative path")]
    ControlPlaneFileName(String),
}

/// Where the setup finds its programs and puts its files.
#[derive(Debug, Clone)]
pub struct SetupConfig {
    /// kubeadm's and the kubelet's files.
    pub paths: NodePaths,
    /// The kubeadm binary (`/run/state/bin/kubeadm`, installed as a component).
    pub kubeadm: PathBuf,
    /// How the kubelet runs (systemd's unit, or the node image's supervisor).
    pub kubelet_service: KubeletService,
    /// Where private directories for configuration files are made (the system's temporary
    /// directory).
    pub config_dir: PathBuf,
}

impl SetupConfig {
    /// The production layout; `config_dir` is the temporary directory to use.
    #[must_use]
    pub fn standard(config_dir: PathBuf) -> Self {
        Self {
            paths: NodePaths::standard(),
            kubeadm: "/run/state/bin/kubeadm".into(),
            kubelet_service: KubeletService::default(),
            config_dir,
        }
    }
}

/// Sets a node up with kubeadm.
#[derive(Debug)]
pub struct KubeadmNode<C> {
    config: SetupConfig,
    kubeadm: Kubeadm<C>,
    kubelet: Kubelet<C>,
    installer: Installer,
    etcd_io: Option<EtcdIoPriority>,
}

impl<C: Commands + Clone> KubeadmNode<C> {
    /// A setup running its programs through `commands` and installing with `installer`.
    pub fn new(config: SetupConfig, commands: C, installer: Installer) -> Self {
        Self {
            kubeadm: Kubeadm::new(config.kubeadm.clone(), commands.clone()),
            kubelet: Kubelet::new(&config.kubelet_service, commands),
            config,
            installer,
            etcd_io: None,
        }
    }
}

impl<C: Commands> KubeadmNode<C> {
    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &SetupConfig {
        &self.config
    }

    /// The kubeadm runner.
    pub fn kubeadm(&self) -> &Kubeadm<C> {
        &self.kubeadm
    }

    /// Prioritises etcd's I/O with `step` after init, after a control-plane join and
    /// after the kubelet starts (without it, etcd's priority is left alone).
    #[must_use]
    pub fn with_etcd_io_priority(mut self, step: EtcdIoPriority) -> Self {
        self.etcd_io = Some(step);
        self
    }

    /// The etcd I/O step, if configured; it never fails.
    async fn prioritize_etcd_io(&self) {
        if let Some(step) = &self.etcd_io {
            step.prioritize().await;
        }
    }

    async fn install(&self, components: &CheckedComponents) -> Result<(), SetupError> {
        if components.is_empty() {
            info!("no Kubernetes components to install: using what the image holds");
        } else {
            self.installer.install_checked(components.checked()).await?;
        }
        self.kubelet.enable().await?;
        Ok(())
    }

    fn write_audit_policy(&self) -> Result<(), SetupError> {
        super::runner::write_atomic(
            &self.config.paths.audit_policy(),
            AUDIT_POLICY.as_bytes(),
            0o644,
        )?;
        Ok(())
    }

    /// Initialises the cluster on this node (install, kubelet, kubeadm init) and returns the
    /// admin kubeconfig. `params.paths` must be this setup's paths.
    pub async fn init(
        &self,
        components: &CheckedComponents,
        params: &InitParams,
        conformance_mode: bool,
    ) -> Result<Zeroizing<Vec<u8>>, SetupError> {
        // Everything that can be refused is refused before anything is downloaded or run
        // (the components were checked when `components` was made).
        let yaml = config::render_init(params)?;
        let node_name = config::k8s_node_name(&params.node_name)?;
        self.install(components).await?;
        self.write_audit_policy()?;
        let file = PrivateConfigFile::write(
            &self.config.config_dir,
            "kubeadm-init.yaml",
            yaml.as_bytes(),
        )?;
        let paths = &self.config.paths;
        let kubelet = LocalKubeletCert {
            node_name,
            ips: vec![params.node_ip],
            cert_path: paths.kubelet_cert.clone(),
            key_path: paths.kubelet_key.clone(),
        };
        let result = self
            .kubeadm
            .init(&InitRun {
                config: file.path(),
                cluster_name: &params.cluster_name,
                conformance_mode,
                certificates_dir: &paths.pki_dir(),
                manifests_dir: &paths.manifests_dir(),
                kubelet: &kubelet,
            })
            .await;
        // The file goes whatever kubeadm did.
        let removed = file.remove();
        let kubeconfig = result?;
        removed?;
        self.prioritize_etcd_io().await;
        Ok(kubeconfig)
    }

    /// Joins this node: `control_plane_files` are written to kubeadm's
    /// certificate directory first (keys 0600, the rest 0644) when `params.control_plane`.
    pub async fn join(
        &self,
        components: &CheckedComponents,
        params: &JoinParams,
        control_plane_files: &[ControlPlaneFile],
    ) -> Result<(), SetupError> {
        let yaml = config::render_join(params)?;
        for f in control_plane_files {
            check_file_name(&f.name)?;
        }
        self.install(components).await?;
        self.write_audit_policy()?;
        if params.control_plane {
            let pki = self.config.paths.pki_dir();
            for f in control_plane_files {
                let mode = if f.name.ends_with(".crt") || f.name.ends_with(".pub") {
                    0o644
                } else {
                    0o600
                };
                super::runner::write_atomic(&pki.join(&f.name), &f.data, mode)?;
            }
            info!(count = control_plane_files.len(), dir = %pki.display(), "wrote the control-plane files for kubeadm");
        }
        let file = PrivateConfigFile::write(
            &self.config.config_dir,
            "kubeadm-join.yaml",
            yaml.as_bytes(),
        )?;
        let result = self
            .kubeadm
            .join(file.path(), &self.config.paths.manifests_dir())
            .await;
        let removed = file.remove();
        result?;
        removed?;
        if params.control_plane {
            self.prioritize_etcd_io().await;
        }
        Ok(())
    }

    /// Joins like [`Self::join`], with the configuration API version of the kubeadm the
    /// components installed (`kubeadm version -o short`): a joining node does not know the
    /// cluster's version (the join ticket carries none).
    ///
    /// The whole join (install, version, kubeadm join) is tried up to [`JOIN_ATTEMPTS`]
    /// times back to back; each attempt empties the manifests directory first and nothing
    /// else is reset. Refusals that would repeat (a configuration or a control-plane file
    /// name) are not retried.
    pub async fn join_with_installed_kubeadm(
        &self,
        components: &CheckedComponents,
        mut params: JoinParams,
        control_plane_files: &[ControlPlaneFile],
    ) -> Result<(), SetupError> {
        for f in control_plane_files {
            check_file_name(&f.name)?;
        }
        // Refused here, once, rather than on every attempt.
        config::render_join(&params)?;
        let mut attempt = 1;
        loop {
            match self
                .join_once_with_installed_kubeadm(components, &mut params, control_plane_files)
                .await
            {
                Ok(()) => return Ok(()),
                Err(e) if attempt < JOIN_ATTEMPTS && is_transient(&e) => {
                    warn!(attempt, of = JOIN_ATTEMPTS, error = ?e, "joining the cluster failed; trying again");
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn join_once_with_installed_kubeadm(
        &self,
        components: &CheckedComponents,
        params: &mut JoinParams,
        control_plane_files: &[ControlPlaneFile],
    ) -> Result<(), SetupError> {
        if !components.is_empty() {
            self.installer.install_checked(components.checked()).await?;
        }
        let version = self.kubeadm.version().await?;
        params.api_version = config::ApiVersion::for_kubernetes(&version);
        info!(kubeadm = %version, api = params.api_version.as_str(), "chose the join configuration version");
        self.join(&CheckedComponents::default(), params, control_plane_files)
            .await
    }

    /// Starts the kubelet on an already-bootstrapped node (a reboot: no kubeadm), then
    /// prioritises etcd's I/O (on any node, whatever its role: a worker has no etcd, and the
    /// step gives up after its bounded wait).
    pub async fn start_kubelet(&self) -> Result<(), SetupError> {
        self.kubelet.start().await?;
        self.prioritize_etcd_io().await;
        Ok(())
    }
}

/// Whether another join attempt may end otherwise: everything but a refusal of the
/// configuration or of a file name (those are the same on every attempt).
fn is_transient(e: &SetupError) -> bool {
    !matches!(
        e,
        SetupError::Config(_) | SetupError::ControlPlaneFileName(_)
    )
}

/// A control-plane file name must be a plain relative path (`etcd/ca.key`), nothing that
/// could leave the certificate directory.
fn check_file_name(name: &str) -> Result<(), SetupError> {
    let p = Path::new(name);
    let plain = !name.is_empty() && p.components().all(|c| matches!(c, PathPart::Normal(_)));
    if plain {
        Ok(())
    } else {
        Err(SetupError::ControlPlaneFileName(name.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_plane_file_names_stay_in_the_certificate_directory() {
        assert!(check_file_name("ca.key").is_ok());
        assert!(check_file_name("etcd/ca.crt").is_ok());
        for bad in ["", "/etc/shadow", "../x", "etcd/../../x", "./ca.key"] {
            assert!(check_file_name(bad).is_err(), "{bad}");
        }
    }
}

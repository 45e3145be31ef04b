//! The client: built from a kubeconfig (the admin kubeconfig after init) or from the pod's
//! service account, and the wait for the API server.

use super::error::{ApiError, Result};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams};
use std::path::Path;
use std::time::Duration;
use tokio::time::Instant;

/// Timeouts of every request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiOptions {
    /// Establishing the TCP and TLS connection.
    pub connect_timeout: Duration,
    /// Waiting for (each read of) an answer.
    pub read_timeout: Duration,
}

impl Default for ApiOptions {
    /// 10 s each: a join request has a 30 s deadline and makes a few sequential calls.
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(10),
        }
    }
}

/// How [`ClusterApi::wait_until_ready`] polls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitPolicy {
    /// Pause between two attempts.
    pub interval: Duration,
    /// Give up after this long.
    pub deadline: Duration,
}

impl Default for WaitPolicy {
    /// Every 5 s for at most 2 min: time for a just-started API server to come up.
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(5),
            deadline: Duration::from_secs(120),
        }
    }
}

/// A Kubernetes API client for the objects Asterism reads and writes. Cheap to clone (one
/// connection pool).
#[derive(Clone)]
pub struct ClusterApi {
    pub(crate) client: kube::Client,
}

impl std::fmt::Debug for ClusterApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterApi").finish_non_exhaustive()
    }
}

impl ClusterApi {
    /// A client from the kubeconfig at `path`, its current context (e.g.
    /// `/etc/kubernetes/admin.conf` on a control-plane node after init).
    pub async fn from_kubeconfig(path: &Path, options: ApiOptions) -> Result<Self> {
        let kubeconfig =
            kube::config::Kubeconfig::read_from(path).map_err(|source| ApiError::Kubeconfig {
                path: path.to_owned(),
                source,
            })?;
        let config = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .map_err(|source| ApiError::Kubeconfig {
            path: path.to_owned(),
            source,
        })?;
        Self::from_config(config, options)
    }

    /// A client from the pod's service account (kube-rs reads `KUBERNETES_SERVICE_HOST`,
    /// `KUBERNETES_SERVICE_PORT` and `/var/run/secrets/kubernetes.io/serviceaccount/`).
    pub fn in_cluster(options: ApiOptions) -> Result<Self> {
        let config = kube::Config::incluster().map_err(ApiError::InCluster)?;
        Self::from_config(config, options)
    }

    /// A client from a kube-rs configuration. kube-rs' own retries are switched off: every
    /// failure reaches the caller, classified, and the caller decides (a join request
    /// answers "unavailable, retry later" rather than hold the node).
    pub fn from_config(mut config: kube::Config, options: ApiOptions) -> Result<Self> {
        config.connect_timeout = Some(options.connect_timeout);
        config.read_timeout = Some(options.read_timeout);
        config.write_timeout = Some(options.read_timeout);
        config.default_retry = false;
        let client = kube::Client::try_from(config).map_err(ApiError::Client)?;
        Ok(Self { client })
    }

    /// Waits until the API server answers a namespace listing (one item is enough), trying every
    /// `policy.interval` until `policy.deadline` (every error is retried: while the API server
    /// starts, any error may be transient).
    pub async fn wait_until_ready(&self, policy: WaitPolicy) -> Result<()> {
        const OP: &str = "list namespaces";
        let started = Instant::now();
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let params = ListParams::default().limit(1);
        let mut attempts = 0u32;
        let mut last: Option<ApiError> = None;
        loop {
            attempts = attempts.saturating_add(1);
            let remaining = policy.deadline.saturating_sub(started.elapsed());
            match tokio::time::timeout(remaining, namespaces.list(&params)).await {
                Ok(Ok(_)) => {
                    tracing::info!(
                        attempts,
                        waited_ms = started.elapsed().as_millis(),
                        "the API server is ready"
                    );
                    return Ok(());
                }
                Ok(Err(e)) => {
                    let e = ApiError::from_kube(OP, e);
                    tracing::debug!(attempts, error = %e, "the API server is not ready yet");
                    last = Some(e);
                }
                // The deadline passed during the attempt: report the attempt before, if any.
                Err(_) => {
                    last = last.or(Some(ApiError::Server {
                        op: OP.into(),
                        code: 504,
                        reason: "Timeout".into(),
                        message: "no answer before the deadline".into(),
                    }));
                }
            }
            let waited = started.elapsed();
            if waited.saturating_add(policy.interval) >= policy.deadline {
                let last = last.unwrap_or(ApiError::Server {
                    op: OP.into(),
                    code: 504,
                    reason: "Timeout".into(),
                    message: "no answer before the deadline".into(),
                });
                return Err(ApiError::NotReady {
                    waited,
                    attempts,
                    last: Box::new(last),
                });
            }
            tokio::time::sleep(policy.interval).await;
        }
    }

    /// The underlying kube-rs client, for calls this module does not wrap.
    pub fn client(&self) -> &kube::Client {
        &self.client
    }
}

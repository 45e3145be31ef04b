//! The Kubernetes API for Asterism, through kube-rs: what the bootstrapper writes after init
//! and what the join service keeps where every replica sees it.
//!
//! * [`ClusterApi`]: a client from a kubeconfig or the pod's service account, and
//!   [`ClusterApi::wait_until_ready`] (every error retried until a deadline).
//! * After init: [`ClusterApi::apply_join_config`] (`kube-system/join-config`: the
//!   measurements and the salt), [`ClusterApi::create_components_config_map`],
//!   [`ClusterApi::annotate_node_components`] (step 9), [`ClusterApi::create_internal_config`]
//!   (step 10).
//! * The post-init deployment ([`deployment`], [`ClusterApi::apply_deployment`],
//!   [`ClusterApi::wait_for_daemon_set`]): `join-config`, the key service's Secret, and
//!   the key, join and verify services with their RBAC, as typed objects that `asterism
//!   init` applies and writes to the owner's workspace.
//! * The join service's cluster state: [`ClusterApi::bootstrap_token`] (Secrets
//!   `bootstrap-token-<id>`, reused within their lifetime), [`ClusterApi::bind_disk`]
//!   and [`ClusterApi::check_disk`] (immutable ConfigMaps per disk UUID),
//!   [`ClusterApi::record_member`] and [`ClusterApi::members`], and
//!   [`ClusterApi::add_joining_node`].
//!
//! Every failure is an [`ApiError`], classified from the HTTP status and the API's `Status`
//! reason; [`ApiError::is_retryable`] tells "retry later" from "fix the cluster". kube-rs'
//! own retries are off. Bootstrap tokens are never logged (their ID is public and is).
//!
//! docs/kubernetes-api.md lists the objects, the RBAC rules the join service needs and
//! what the recorded-response tests cover.
//!
//! This is the only crate that may depend on `kube` (docs/dependencies.md; the join service
//! needs nothing else of Kubernetes). It never logs tokens or keys. Its tests run against
//! the recording API server in `asterism-testkit`.
#![forbid(unsafe_code)]

mod client;
mod config_maps;
mod deploy;
mod error;
mod join_state;
mod tokens;

pub use client::{ApiOptions, ClusterApi, WaitPolicy};
pub use config_maps::{
    ATTESTATION_CONFIG_BACKUP_KEY, ATTESTATION_CONFIG_KEY, CLUSTER_VERSION_KEY,
    COMPONENTS_ANNOTATION, COMPONENTS_KEY, COMPONENTS_PREFIX, INTERNAL_CONFIG, JOIN_CONFIG,
    JoinConfigChange, MEASUREMENT_SALT_KEY, MEASUREMENT_SALT_LEN, RecordedComponents,
    components_config_map_name, components_json,
};
pub use deploy::{
    CLI_FIELD_MANAGER, CONTROL_PLANE_LABEL, Deployment, DeploymentSpec, Images, JOIN_SERVICE,
    JOIN_SERVICE_PORT, JOIN_SERVICE_TRUST, JoinServiceTrust, KEY_SERVICE, KEY_SERVICE_SECRET,
    KeyServiceSecret, MASTER_SECRET_KEY, Manifest, Object, RolloutStatus, SALT_KEY, TRUST_DIR,
    VERIFY_SERVICE, VERIFY_SERVICE_PORT, deployment, join_config,
};
pub use error::ApiError;
pub use join_state::{
    CONTROL_PLANE_JOIN_DEADLINE, CONTROL_PLANE_JOINING_NODE, DISK_PREFIX, DiskBinding,
    FIELD_MANAGER, JoiningNode, KeyClaim, MEMBER_PREFIX, MemberRecord, NODE_VERSION, UPDATE_GROUP,
    UPDATE_VERSION, WORKER_JOIN_DEADLINE, joining_node_resource, node_version_resource,
};
pub use tokens::{
    BOOTSTRAP_TOKEN_PREFIX, BOOTSTRAP_TOKEN_TYPE, BootstrapToken, ExpiringToken, NODE_TOKEN_GROUP,
    TOKEN_DESCRIPTION, TokenPolicy, token_from_secret, token_secret,
};

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use std::collections::BTreeMap;
use std::time::SystemTime;

/// The namespace of every namespaced object here.
pub const NAMESPACE: &str = "kube-system";
/// Label on the objects the join service creates (tokens, disk bindings, members).
pub const MANAGED_BY_LABEL: &str = "asterism.dev/managed-by";
/// Its value.
pub const MANAGED_BY: &str = "join-service";
/// Label saying which record an object is (`bootstrap-token`, `disk-binding`, `member`).
pub const RECORD_LABEL: &str = "asterism.dev/record";

fn labels(record: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned()),
        (RECORD_LABEL.to_owned(), record.to_owned()),
    ])
}

/// `t` as RFC 3339 in UTC, whole seconds (`2026-01-01T12:00:00Z`), as kubeadm writes token
/// expirations.
fn rfc3339(t: SystemTime) -> Result<String, ApiError> {
    let ts = Timestamp::try_from(t)
        .and_then(|ts| Timestamp::from_second(ts.as_second()))
        .map_err(|e| ApiError::InvalidInput {
            what: "time",
            detail: e.to_string(),
        })?;
    Ok(ts.to_string())
}

/// An RFC 3339 time (any offset).
fn timestamp(s: &str) -> Option<SystemTime> {
    s.parse::<Timestamp>().ok().map(SystemTime::from)
}

impl ClusterApi {
    fn config_maps(&self) -> kube::Api<ConfigMap> {
        kube::Api::namespaced(self.client.clone(), NAMESPACE)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::time::Duration;

    #[test]
    fn times_are_rfc3339_in_whole_seconds() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_767_268_800_250);
        assert_eq!(rfc3339(t).unwrap(), "2026-01-01T12:00:00Z");
        assert_eq!(
            timestamp("2026-01-01T13:00:00+01:00"),
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_767_268_800))
        );
        assert_eq!(timestamp("tomorrow"), None);
    }
}

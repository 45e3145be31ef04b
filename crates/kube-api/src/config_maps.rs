//! The ConfigMaps written after init (docs/kubernetes-api.md): the
//! join service's `join-config`, the immutable components ConfigMap, `internal-config`,
//! and the components annotation of the first node.

use super::error::{ApiError, Result};
use super::{ClusterApi, NAMESPACE};
use asterism_proto::components::Component;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams, PostParams};
use sha2::{Digest as _, Sha256};
use std::collections::BTreeMap;

/// The join service's configuration ConfigMap.
pub const JOIN_CONFIG: &str = "join-config";
/// Its key holding the attestation configuration (JSON).
pub const ATTESTATION_CONFIG_KEY: &str = "attestationConfig";
/// Its key holding the previous attestation configuration after an update.
pub const ATTESTATION_CONFIG_BACKUP_KEY: &str = "attestationConfig_backup";
/// Its binary key holding the 32-byte measurement salt.
pub const MEASUREMENT_SALT_KEY: &str = "measurementSalt";
/// The empty ConfigMap projected next to `join-config`.
pub const INTERNAL_CONFIG: &str = "internal-config";
/// Name prefix of components ConfigMaps (`sha256-<hex>` follows).
pub const COMPONENTS_PREFIX: &str = "k8s-components-";
/// Key of the components list (JSON) in a components ConfigMap.
pub const COMPONENTS_KEY: &str = "components";
/// Key of the Kubernetes version in a components ConfigMap.
pub const CLUSTER_VERSION_KEY: &str = "cluster-version";
/// Node annotation naming the node's components ConfigMap. The node operator reads this
/// key, so it must not change.
pub const COMPONENTS_ANNOTATION: &str = "constellation.edgeless.systems/kubernetes-components";

pub use asterism_cluster::MEASUREMENT_SALT_LEN;

/// How many times a read-modify-write is retried after losing a race.
const UPDATE_ATTEMPTS: u32 = 5;

/// What [`ClusterApi::apply_join_config`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinConfigChange {
    /// `join-config` did not exist and was created.
    Created,
    /// The attestation configuration was replaced; the previous one is in
    /// `attestationConfig_backup`.
    Updated,
    /// It already held this configuration and salt: nothing was written.
    Unchanged,
}

/// The components ConfigMap name: `k8s-components-` and
/// `sha256:<hex of SHA-256 over every component's hash string, in order>` with `:`
/// replaced by `-`.
pub fn components_config_map_name(components: &[Component]) -> String {
    format!(
        "{COMPONENTS_PREFIX}sha256-{}",
        components_digest(components)
    )
}

/// Hex of SHA-256 over every component's hash string, in order.
fn components_digest(components: &[Component]) -> String {
    let mut h = Sha256::new();
    for c in components {
        h.update(c.hash.as_bytes());
    }
    hex::encode(h.finalize())
}

/// What a components ConfigMap records: the cluster's Kubernetes version and components,
/// checked to hash to the ConfigMap's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedComponents {
    /// The ConfigMap's name.
    pub name: String,
    /// `data.cluster-version`.
    pub cluster_version: String,
    /// `data.components`, in order.
    pub components: Vec<Component>,
}

/// One component as the ConfigMap's JSON holds it (zero values omitted).
#[derive(serde::Deserialize)]
struct StoredComponent {
    #[serde(default)]
    url: String,
    #[serde(default)]
    hash: String,
    #[serde(default)]
    install_path: String,
    #[serde(default)]
    extract: bool,
}

/// The components list as stored in the ConfigMap: keys `url`, `hash`,
/// `install_path`, `extract`, zero values omitted.
pub fn components_json(components: &[Component]) -> String {
    #[derive(serde::Serialize)]
    struct Entry<'a> {
        #[serde(skip_serializing_if = "str::is_empty")]
        url: &'a str,
        #[serde(skip_serializing_if = "str::is_empty")]
        hash: &'a str,
        #[serde(skip_serializing_if = "str::is_empty")]
        install_path: &'a str,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        extract: bool,
    }
    let list: Vec<Entry<'_>> = components
        .iter()
        .map(|c| Entry {
            url: &c.url,
            hash: &c.hash,
            install_path: &c.install_path,
            extract: c.extract,
        })
        .collect();
    // Serialising strings and booleans cannot fail.
    serde_json::to_string(&list).unwrap_or_default()
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(NAMESPACE.to_owned()),
        ..ObjectMeta::default()
    }
}

impl ClusterApi {
    /// Creates or updates `kube-system/join-config`: `data.
    /// attestationConfig` = `attestation_config` (JSON text), `binaryData.measurementSalt` =
    /// the salt. An update keeps the previous configuration in `attestationConfig_backup`
    /// and uses the object's resourceVersion (a concurrent writer makes it read and try
    /// again). The salt is never changed: a different stored salt is [`ApiError::SaltMismatch`].
    pub async fn apply_join_config(
        &self,
        attestation_config: &str,
        measurement_salt: &[u8; MEASUREMENT_SALT_LEN],
    ) -> Result<JoinConfigChange> {
        serde_json::from_str::<serde_json::Value>(attestation_config).map_err(|e| {
            ApiError::InvalidInput {
                what: "attestation configuration",
                detail: format!("not JSON: {e}"),
            }
        })?;
        let api = self.config_maps();
        let salt = ByteString(measurement_salt.to_vec());
        let mut attempt = 0;
        loop {
            attempt += 1;
            let get_op = format!("get ConfigMap {NAMESPACE}/{JOIN_CONFIG}");
            let current = api
                .get_opt(JOIN_CONFIG)
                .await
                .map_err(|e| ApiError::from_kube(get_op, e))?;
            let Some(mut cm) = current else {
                let cm = ConfigMap {
                    metadata: meta(JOIN_CONFIG),
                    data: Some(BTreeMap::from([(
                        ATTESTATION_CONFIG_KEY.to_owned(),
                        attestation_config.to_owned(),
                    )])),
                    binary_data: Some(BTreeMap::from([(
                        MEASUREMENT_SALT_KEY.to_owned(),
                        salt.clone(),
                    )])),
                    ..ConfigMap::default()
                };
                let op = format!("create ConfigMap {NAMESPACE}/{JOIN_CONFIG}");
                match api.create(&PostParams::default(), &cm).await {
                    Ok(_) => {
                        tracing::info!("created {NAMESPACE}/{JOIN_CONFIG}");
                        return Ok(JoinConfigChange::Created);
                    }
                    Err(e) => match ApiError::from_kube(op, e) {
                        // Someone created it meanwhile: update theirs.
                        ApiError::AlreadyExists { .. } if attempt < UPDATE_ATTEMPTS => continue,
                        other => return Err(other),
                    },
                }
            };

            let stored_salt = cm
                .binary_data
                .as_ref()
                .and_then(|b| b.get(MEASUREMENT_SALT_KEY));
            if stored_salt.is_some_and(|s| s != &salt) {
                return Err(ApiError::SaltMismatch);
            }
            let data = cm.data.get_or_insert_with(BTreeMap::new);
            let previous = data.get(ATTESTATION_CONFIG_KEY).cloned();
            if previous.as_deref() == Some(attestation_config) && stored_salt.is_some() {
                return Ok(JoinConfigChange::Unchanged);
            }
            if let Some(previous) = previous.filter(|p| p != attestation_config) {
                data.insert(ATTESTATION_CONFIG_BACKUP_KEY.to_owned(), previous);
            }
            data.insert(
                ATTESTATION_CONFIG_KEY.to_owned(),
                attestation_config.to_owned(),
            );
            cm.binary_data
                .get_or_insert_with(BTreeMap::new)
                .insert(MEASUREMENT_SALT_KEY.to_owned(), salt.clone());
            // `replace` sends the resourceVersion we read: the API server refuses it with
            // 409 Conflict if the object changed since.
            let op = format!("update ConfigMap {NAMESPACE}/{JOIN_CONFIG}");
            match api.replace(JOIN_CONFIG, &PostParams::default(), &cm).await {
                Ok(_) => {
                    tracing::info!(
                        "updated {NAMESPACE}/{JOIN_CONFIG}; the previous attestation configuration is in {ATTESTATION_CONFIG_BACKUP_KEY}"
                    );
                    return Ok(JoinConfigChange::Updated);
                }
                Err(e) => match ApiError::from_kube(op, e) {
                    ApiError::Conflict { .. } if attempt < UPDATE_ATTEMPTS => continue,
                    other => return Err(other),
                },
            }
        }
    }

    /// Creates the immutable components ConfigMap of `components`:
    /// `data.components` = the list as JSON, `data.cluster-version` = `cluster_version`.
    /// Returns its name. Idempotent: its name derives from the component hashes, so an
    /// existing one is the same.
    pub async fn create_components_config_map(
        &self,
        components: &[Component],
        cluster_version: &str,
    ) -> Result<String> {
        let name = components_config_map_name(components);
        let cm = ConfigMap {
            metadata: meta(&name),
            immutable: Some(true),
            data: Some(BTreeMap::from([
                (COMPONENTS_KEY.to_owned(), components_json(components)),
                (CLUSTER_VERSION_KEY.to_owned(), cluster_version.to_owned()),
            ])),
            ..ConfigMap::default()
        };
        let op = format!("create ConfigMap {NAMESPACE}/{name}");
        match self.config_maps().create(&PostParams::default(), &cm).await {
            Ok(_) => {
                tracing::info!(configmap = %name, "created the components ConfigMap");
                Ok(name)
            }
            Err(e) => match ApiError::from_kube(op, e) {
                ApiError::AlreadyExists { .. } => Ok(name),
                other => Err(other),
            },
        }
    }

    /// Reads the components ConfigMap `name` (as the NodeVersion or a node annotation names
    /// it) and checks that its list hashes to the name:
    /// [`ApiError::ComponentsMismatch`] otherwise, since whoever can write ConfigMaps but
    /// not the reference could else hand joining nodes other binaries.
    pub async fn components_config_map(&self, name: &str) -> Result<RecordedComponents> {
        let object = format!("ConfigMap {NAMESPACE}/{name}");
        let cm = self
            .config_maps()
            .get(name)
            .await
            .map_err(|e| ApiError::from_kube(format!("get {object}"), e))?;
        let data = cm.data.unwrap_or_default();
        let field = |key: &str| {
            data.get(key).ok_or_else(|| ApiError::Malformed {
                object: object.clone(),
                detail: format!("no data.{key}"),
            })
        };
        let stored: Vec<StoredComponent> =
            serde_json::from_str(field(COMPONENTS_KEY)?).map_err(|e| ApiError::Malformed {
                object: object.clone(),
                detail: format!("data.{COMPONENTS_KEY} is no component list: {e}"),
            })?;
        let components: Vec<Component> = stored
            .into_iter()
            .map(|c| Component {
                url: c.url,
                hash: c.hash,
                install_path: c.install_path,
                extract: c.extract,
            })
            .collect();
        if components_config_map_name(&components) != name {
            return Err(ApiError::ComponentsMismatch {
                name: name.to_owned(),
                content_hash: format!("sha256:{}", components_digest(&components)),
            });
        }
        Ok(RecordedComponents {
            name: name.to_owned(),
            cluster_version: field(CLUSTER_VERSION_KEY)?.clone(),
            components,
        })
    }

    /// Creates the empty `kube-system/internal-config`; an
    /// existing one is left alone.
    pub async fn create_internal_config(&self) -> Result<()> {
        let cm = ConfigMap {
            metadata: meta(INTERNAL_CONFIG),
            ..ConfigMap::default()
        };
        let op = format!("create ConfigMap {NAMESPACE}/{INTERNAL_CONFIG}");
        match self.config_maps().create(&PostParams::default(), &cm).await {
            Ok(_) => Ok(()),
            Err(e) => match ApiError::from_kube(op, e) {
                ApiError::AlreadyExists { .. } => Ok(()),
                other => Err(other),
            },
        }
    }

    /// Annotates node `node` with its components ConfigMap. A JSON
    /// merge patch of the one annotation: it cannot conflict with other writers, so unlike
    /// a read-modify-write it needs no retry.
    pub async fn annotate_node_components(&self, node: &str, config_map: &str) -> Result<()> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let patch = serde_json::json!({
            "metadata": { "annotations": { COMPONENTS_ANNOTATION: config_map } }
        });
        nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| ApiError::from_kube(format!("annotate Node {node}"), e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn component(url: &str, hash: &str, path: &str, extract: bool) -> Component {
        Component {
            url: url.into(),
            hash: hash.into(),
            install_path: path.into(),
            extract,
        }
    }

    #[test]
    fn the_name_hashes_the_concatenated_component_hashes() {
        let list = [
            component("https://a", "sha256:aa", "/a", true),
            component("data:,x", "", "/p", false),
            component("https://b", "sha256:bb", "/b", false),
        ];
        let expected = hex::encode(Sha256::digest(b"sha256:aasha256:bb"));
        assert_eq!(
            components_config_map_name(&list),
            format!("k8s-components-sha256-{expected}")
        );
        // Empty list: SHA-256 of nothing.
        assert_eq!(
            components_config_map_name(&[]),
            "k8s-components-sha256-e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn the_json_omits_zero_values() {
        let list = [
            component("https://a", "sha256:aa", "/opt/cni/bin", true),
            component("data:,x", "", "/p", false),
        ];
        assert_eq!(
            components_json(&list),
            r#"[{"url":"https://a","hash":"sha256:aa","install_path":"/opt/cni/bin","extract":true},{"url":"data:,x","install_path":"/p"}]"#
        );
    }
}

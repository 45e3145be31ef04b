//! The records the bootstrapper writes on a node for other programs, each defined once so
//! that the writer and the readers share its form:
//!
//! * [`InitNode`], `state/asterism/init-node.json` on the first node: its disk, AK and
//!   release, for the join service (`--init-node`). JSON with the keys `disk`, `ak`,
//!   `name`, `role`, `kubernetes_version` and `kubernetes_components`; the last two are
//!   omitted when empty. The version is `v<major>.<minor>.<patch>` exactly: a record with
//!   another is refused when read.
//! * [`KubernetesHandover`], `state/asterism/kubernetes.json` on every node: what its
//!   Kubernetes driver was handed, for the operator and `asterism mini status`. Indented
//!   JSON with the keys `driver`, `kubernetes_version` and `kubernetes_components`.
//!
//! Records written before these types existed read unchanged.

use crate::Role;
use asterism_kubernetes_versions::{Component, KubernetesVersion};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// The first node of the cluster, as its bootstrapper recorded it at init. It derived its
/// own disk key from the master secret, so no join ticket ever bound its disk: the join
/// service binds the disk to the AK when it starts. The record also holds the cluster's
/// Kubernetes version and components, which every join ticket carries.
///
/// The disk and the AK are kept in their text forms: their types live in crates this one
/// must not depend on (`asterism-kms`, `asterism-attestation`), and the join service parses
/// both where it uses them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InitNode {
    /// The state disk's UUID.
    pub disk: String,
    /// The attestation key identity of the init node (SHA-256 of its AK's public area, hex,
    /// as the validator reports it).
    pub ak: String,
    /// The node name.
    pub name: String,
    /// The role: the init node is [`Role::ControlPlane`].
    pub role: Role,
    /// The Kubernetes version the cluster was initialised with (`v1.31.13`); `None` in a
    /// record that names no release (the key absent, or empty).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "version_or_empty"
    )]
    pub kubernetes_version: Option<KubernetesVersion>,
    /// The components the first node installed, as the init request named them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kubernetes_components: Vec<Component>,
}

impl InitNode {
    const WHAT: &'static str = "an init-node record";

    /// The record as the file holds it.
    pub fn to_json(&self) -> Result<String, RecordError> {
        write_json(self, Self::WHAT, serde_json::to_string)
    }

    /// Reads a record from the file's bytes.
    pub fn from_json(bytes: &[u8]) -> Result<Self, RecordError> {
        read_json(bytes, Self::WHAT)
    }
}

/// What a node was handed to set up Kubernetes with: the driver it was handed to, and the
/// Kubernetes version and components of the init request or join ticket, in order. The
/// bootstrapper writes it with the node's files and never reads it back. Handed is not
/// installed: the `none` driver installs nothing, and the kubeadm driver installs its
/// fallback list when the list is empty.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubernetesHandover {
    /// The Kubernetes driver's name (`none`, `kubeadm`).
    pub driver: String,
    /// The version the request or ticket named; written as `v<major>.<minor>.<patch>`, or
    /// as the empty string when it named none.
    #[serde(default, with = "version_or_empty")]
    pub kubernetes_version: Option<KubernetesVersion>,
    /// The components, as received: URL, hash, install path and extract flag of each, zero
    /// values left out as components travel.
    #[serde(default)]
    pub kubernetes_components: Vec<Component>,
}

impl KubernetesHandover {
    const WHAT: &'static str = "a Kubernetes hand-over record";

    /// The file content: indented JSON.
    pub fn to_json(&self) -> Result<String, RecordError> {
        write_json(self, Self::WHAT, serde_json::to_string_pretty)
    }

    /// Reads a record from the file's bytes.
    pub fn from_json(bytes: &[u8]) -> Result<Self, RecordError> {
        read_json(bytes, Self::WHAT)
    }
}

/// Writes `record` with `to_string` (compact or indented), naming the record on failure.
fn write_json<T: Serialize>(
    record: &T,
    what: &'static str,
    to_string: fn(&T) -> serde_json::Result<String>,
) -> Result<String, RecordError> {
    to_string(record).map_err(|source| RecordError::Write { what, source })
}

/// Reads a record of type `T` from a file's bytes, naming the record on failure.
fn read_json<T: DeserializeOwned>(bytes: &[u8], what: &'static str) -> Result<T, RecordError> {
    serde_json::from_slice(bytes).map_err(|source| RecordError::Read { what, source })
}

/// A Kubernetes version that may be absent, as the records spell it: the version's text, or
/// the empty string for none (the form the records had when the version was a string).
mod version_or_empty {
    use asterism_kubernetes_versions::KubernetesVersion;
    use serde::{Deserialize as _, Deserializer, Serializer};

    #[allow(clippy::ref_option)] // serde's `with` hands the field by reference
    pub(super) fn serialize<S: Serializer>(
        version: &Option<KubernetesVersion>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match version {
            Some(v) => serializer.collect_str(v),
            None => serializer.serialize_str(""),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<KubernetesVersion>, D::Error> {
        let text = String::deserialize(deserializer)?;
        if text.is_empty() {
            return Ok(None);
        }
        text.parse().map(Some).map_err(serde::de::Error::custom)
    }
}

/// Why a node record cannot be written or read.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The bytes are not such a record.
    #[error("not {what}")]
    Read {
        /// Which record (`an init-node record`).
        what: &'static str,
        /// What the JSON parser found.
        #[source]
        source: serde_json::Error,
    },
    /// The record does not serialise.
    #[error("{what} does not serialise")]
    Write {
        /// Which record.
        what: &'static str,
        /// What the JSON writer found.
        #[source]
        source: serde_json::Error,
    },
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A component downloaded from `https://example.com/<file>` whose hash repeats the
    /// hex byte `hash_byte`.
    fn component(file: &str, hash_byte: &str, install_path: &str, extract: bool) -> Component {
        Component {
            url: format!("https://example.com/{file}"),
            hash: format!("sha256:{}", hash_byte.repeat(32)),
            install_path: install_path.into(),
            extract,
        }
    }

    fn record() -> InitNode {
        InitNode {
            disk: "2f4e6c1a-3b5d-4e7f-8a9b-0c1d2e3f4a5b".into(),
            ak: "ab".repeat(32),
            name: "node-0".into(),
            role: Role::ControlPlane,
            kubernetes_version: Some(KubernetesVersion::new(1, 31, 13)),
            kubernetes_components: vec![component(
                "kubelet",
                "cd",
                "/run/state/bin/kubelet",
                false,
            )],
        }
    }

    #[test]
    fn a_written_record_reads_back_the_same() {
        let record = record();
        let json = record.to_json().unwrap();
        assert_eq!(InitNode::from_json(json.as_bytes()).unwrap(), record);
    }

    #[test]
    fn the_files_keys_and_the_roles_spelling_are_unchanged() {
        let value: serde_json::Value = serde_json::from_str(&record().to_json().unwrap()).unwrap();
        let mut keys: Vec<&str> = value
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "ak",
                "disk",
                "kubernetes_components",
                "kubernetes_version",
                "name",
                "role"
            ]
        );
        assert_eq!(value["role"], "ControlPlane");
    }

    #[test]
    fn a_record_in_the_earlier_untyped_form_still_reads() {
        // As the bootstrapper wrote it with `serde_json::json!` (keys sorted).
        let earlier = format!(
            r#"{{"ak":"{ak}","disk":"2f4e6c1a-3b5d-4e7f-8a9b-0c1d2e3f4a5b","kubernetes_components":[{{"hash":"sha256:{hash}","install_path":"/run/state/bin/kubelet","url":"https://example.com/kubelet"}}],"kubernetes_version":"v1.31.13","name":"node-0","role":"ControlPlane"}}"#,
            ak = "ab".repeat(32),
            hash = "cd".repeat(32),
        );
        assert_eq!(InitNode::from_json(earlier.as_bytes()).unwrap(), record());
    }

    #[test]
    fn a_record_without_a_release_reads_with_an_empty_one_and_writes_none() {
        let json = format!(
            r#"{{"disk":"d","ak":"{}","name":"node-0","role":"ControlPlane"}}"#,
            "ab".repeat(32)
        );
        let record = InitNode::from_json(json.as_bytes()).unwrap();
        assert!(record.kubernetes_version.is_none());
        assert!(record.kubernetes_components.is_empty());
        let written = record.to_json().unwrap();
        assert!(!written.contains("kubernetes"), "{written}");
        let empty = json.replace('}', r#","kubernetes_version":""}"#);
        let record = InitNode::from_json(empty.as_bytes()).unwrap();
        assert!(record.kubernetes_version.is_none());
    }

    #[test]
    fn a_record_whose_version_is_not_a_patch_version_is_refused() {
        for bad in ["v1.31", "1.31.13", "v1.31.13-rc.0", "latest"] {
            let json = record().to_json().unwrap().replace("v1.31.13", bad);
            assert!(
                matches!(
                    InitNode::from_json(json.as_bytes()),
                    Err(RecordError::Read { .. })
                ),
                "{bad}"
            );
            let json = handover().to_json().unwrap().replace("v1.31.13", bad);
            assert!(
                KubernetesHandover::from_json(json.as_bytes()).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_record_without_its_node_is_refused() {
        assert!(matches!(
            InitNode::from_json(br#"{"disk":"d","ak":"a","role":"ControlPlane"}"#),
            Err(RecordError::Read { .. })
        ));
        assert!(InitNode::from_json(b"not json").is_err());
    }

    fn handover() -> KubernetesHandover {
        KubernetesHandover {
            driver: "none".into(),
            kubernetes_version: Some(KubernetesVersion::new(1, 31, 13)),
            kubernetes_components: vec![component("cni.tgz", "ab", "/run/state/cni/bin", true)],
        }
    }

    #[test]
    fn the_kubernetes_handover_reads_back_as_written() {
        let handover = handover();
        let json = handover.to_json().unwrap();
        assert_eq!(
            KubernetesHandover::from_json(json.as_bytes()).unwrap(),
            handover
        );
    }

    #[test]
    fn the_kubernetes_handover_file_is_indented_json_with_unchanged_keys() {
        let expected = format!(
            r#"{{
  "driver": "none",
  "kubernetes_version": "v1.31.13",
  "kubernetes_components": [
    {{
      "url": "https://example.com/cni.tgz",
      "hash": "sha256:{}",
      "install_path": "/run/state/cni/bin",
      "extract": true
    }}
  ]
}}"#,
            "ab".repeat(32)
        );
        assert_eq!(handover().to_json().unwrap(), expected);
    }

    #[test]
    fn a_kubernetes_handover_without_a_release_reads_with_an_empty_one() {
        let record = KubernetesHandover::from_json(br#"{"driver":"kubeadm"}"#).unwrap();
        assert!(record.kubernetes_version.is_none());
        assert!(record.kubernetes_components.is_empty());
        assert!(matches!(
            KubernetesHandover::from_json(b"{}"),
            Err(RecordError::Read { what, .. }) if what.contains("hand-over")
        ));
    }

    #[test]
    fn a_kubernetes_handover_without_a_version_writes_it_empty() {
        let record = KubernetesHandover {
            kubernetes_version: None,
            ..handover()
        };
        let json = record.to_json().unwrap();
        assert!(json.contains(r#""kubernetes_version": """#), "{json}");
        assert_eq!(
            KubernetesHandover::from_json(json.as_bytes()).unwrap(),
            record
        );
    }
}

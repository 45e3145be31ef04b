//! The node state file (`state/constellation/node_state.json`: role and measurement salt,
//! docs/bootstrapper.md), the record of what the node was handed to set up Kubernetes
//! (`state/asterism/kubernetes.json`), and the layout of a node directory
//! (docs/design/local-cluster.md, "Per-node directory").

use std::path::{Path, PathBuf};

use asterism_cluster::{MEASUREMENT_SALT_LEN, Role};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use crate::files::{self, FileError};

/// The largest node state file accepted when reading it back.
const MAX_NODE_STATE_LEN: u64 = 4096;

/// What a node keeps on its state disk to find its cluster again after a reboot: its role
/// and the cluster's measurement salt (with the measurement secret from a rejoin ticket,
/// the salt gives the cluster ID).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeState {
    /// The node's role.
    pub role: Role,
    /// The cluster's measurement salt (not secret).
    pub measurement_salt: [u8; MEASUREMENT_SALT_LEN],
}

/// Why a node state file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum NodeStateError {
    /// The file could not be read or written.
    #[error(transparent)]
    File(#[from] FileError),
    /// The content is not a node state.
    #[error("node state file {path} is malformed: {reason}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    #[serde(rename = "Role")]
    role: String,
    #[serde(rename = "MeasurementSalt")]
    measurement_salt: String,
}

impl NodeState {
    /// The file content, byte for byte what the original writes (Go `json.MarshalIndent`
    /// with a TAB indent, no trailing newline).
    #[must_use]
    pub fn to_json(&self) -> String {
        format!(
            "{{\n\t\"Role\": \"{}\",\n\t\"MeasurementSalt\": \"{}\"\n}}",
            self.role.as_str(),
            STANDARD.encode(self.measurement_salt)
        )
    }

    /// Parses a node state file's content; the salt must be exactly 32 bytes.
    pub fn from_json(text: &[u8], path: &Path) -> Result<Self, NodeStateError> {
        let bad = |reason: String| NodeStateError::Malformed {
            path: path.to_path_buf(),
            reason,
        };
        let wire: Wire = serde_json::from_slice(text).map_err(|e| bad(e.to_string()))?;
        // Exactly the two spellings this file is written with; `Unknown` is no role a
        // bootstrapped node can have.
        let role = match wire.role.as_str() {
            "ControlPlane" => Role::ControlPlane,
            "Worker" => Role::Worker,
            other => return Err(bad(format!("unknown role {other:?}"))),
        };
        let salt = STANDARD
            .decode(wire.measurement_salt.as_bytes())
            .map_err(|_| bad("MeasurementSalt is not base64".into()))?;
        let measurement_salt =
            <[u8; MEASUREMENT_SALT_LEN]>::try_from(salt.as_slice()).map_err(|_| {
                bad(format!(
                    "MeasurementSalt has {} bytes, {MEASUREMENT_SALT_LEN} expected",
                    salt.len()
                ))
            })?;
        Ok(Self {
            role,
            measurement_salt,
        })
    }

    /// Writes the file atomically (mode 0600).
    pub fn write(&self, path: &Path) -> Result<(), NodeStateError> {
        files::write_atomic(path, self.to_json().as_bytes(), files::SECRET_MODE)?;
        Ok(())
    }

    /// Reads the file.
    pub fn read(path: &Path) -> Result<Self, NodeStateError> {
        let bytes = files::read_capped(path, MAX_NODE_STATE_LEN)?;
        Self::from_json(&bytes, path)
    }
}

/// The paths of one node directory (`<cluster dir>/nodes/<name>/`, `/run/node` in the node
/// image). `state/` is the mount point of the state disk's file system where the disk is
/// mapped (device-mapper); without device-mapper it is a plain directory that stands for
/// the mounted disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeDir {
    root: PathBuf,
}

impl NodeDir {
    /// The node directory at `root`.
    #[must_use]
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The directory itself.
    #[must_use]
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `state.img`: the LUKS2 state disk image.
    #[must_use]
    pub fn state_image(&self) -> PathBuf {
        self.root.join("state.img")
    }

    /// `state/`: the mounted state disk, or the plain directory that stands for it.
    #[must_use]
    pub fn state(&self) -> PathBuf {
        self.root.join("state")
    }

    /// `state/initial.key`: the first-boot passphrase (0400) until re-keying replaces it,
    /// where `state/` only stands for the disk (no device-mapper).
    #[must_use]
    pub fn initial_key(&self) -> PathBuf {
        self.state().join("initial.key")
    }

    /// `run/initial.key`: the first-boot passphrase of a disk that is mapped, outside the
    /// file system it protects (it is written before the format, and `run/` is memory on a
    /// node); removed after re-keying.
    #[must_use]
    pub fn mapped_initial_key(&self) -> PathBuf {
        self.run().join("initial.key")
    }

    /// `state/constellation/node_state.json`.
    #[must_use]
    pub fn node_state(&self) -> PathBuf {
        self.state().join("constellation").join("node_state.json")
    }

    /// `state/asterism/init-node.json`: on the first node, its disk UUID and attestation
    /// key identity, for the join service to bind (docs/join-service.md).
    #[must_use]
    pub fn init_node_record(&self) -> PathBuf {
        self.state().join("asterism").join("init-node.json")
    }

    /// `state/asterism/services/`: on a control plane that hosts the cluster's key and join
    /// services outside Kubernetes, their secrets and trust ([`crate::hosted`]).
    #[must_use]
    pub fn hosted_services(&self) -> PathBuf {
        self.state().join("asterism").join("services")
    }

    /// `state/asterism/kubernetes.json`: what the node was handed to set up Kubernetes with
    /// ([`asterism_cluster::KubernetesHandover`]).
    #[must_use]
    pub fn kubernetes_handover(&self) -> PathBuf {
        self.state().join("asterism").join("kubernetes.json")
    }

    /// `state/ssh/`.
    #[must_use]
    pub fn ssh(&self) -> PathBuf {
        self.state().join("ssh")
    }

    /// `state/ssh/ssh_host_ed25519_key`.
    #[must_use]
    pub fn ssh_host_key(&self) -> PathBuf {
        self.ssh().join("ssh_host_ed25519_key")
    }

    /// `state/ssh/ssh_ca.pub`.
    #[must_use]
    pub fn ssh_ca_pub(&self) -> PathBuf {
        self.ssh().join("ssh_ca.pub")
    }

    /// `state/ssh/ssh_host_cert.pub`.
    #[must_use]
    pub fn ssh_host_cert(&self) -> PathBuf {
        self.ssh().join("ssh_host_cert.pub")
    }

    /// `state/kubernetes/pki/`: the cluster CA and control-plane files.
    #[must_use]
    pub fn kubernetes_pki(&self) -> PathBuf {
        self.state().join("kubernetes").join("pki")
    }

    /// `state/kubelet/pki/kubelet-client-crt.pem`.
    #[must_use]
    pub fn kubelet_cert(&self) -> PathBuf {
        self.state()
            .join("kubelet")
            .join("pki")
            .join("kubelet-client-crt.pem")
    }

    /// `state/kubelet/pki/kubelet-client-key.pem`.
    #[must_use]
    pub fn kubelet_key(&self) -> PathBuf {
        self.state()
            .join("kubelet")
            .join("pki")
            .join("kubelet-client-key.pem")
    }

    /// `run/`: scratch space (detached LUKS header copies; the first-boot passphrase of a
    /// mapped disk).
    #[must_use]
    pub fn run(&self) -> PathBuf {
        self.root.join("run")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_state_is_written_as_the_original_writes_it_and_reads_back() {
        let state = NodeState {
            role: Role::ControlPlane,
            measurement_salt: [0xab; 32],
        };
        let json = state.to_json();
        assert_eq!(
            json,
            "{\n\t\"Role\": \"ControlPlane\",\n\t\"MeasurementSalt\": \"q6urq6urq6urq6urq6urq6urq6urq6urq6urq6urq6s=\"\n}"
        );
        let back = NodeState::from_json(json.as_bytes(), Path::new("x")).unwrap();
        assert_eq!(back, state);
    }

    #[test]
    fn a_salt_of_the_wrong_length_or_an_unknown_role_is_refused() {
        let short = "{\"Role\": \"Worker\", \"MeasurementSalt\": \"AAAA\"}";
        assert!(NodeState::from_json(short.as_bytes(), Path::new("x")).is_err());
        for role in ["Boss", "Unknown", "worker"] {
            let json = format!(
                "{{\"Role\": \"{role}\", \"MeasurementSalt\": \"q6urq6urq6urq6urq6urq6urq6urq6urq6urq6urq6s=\"}}"
            );
            assert!(
                NodeState::from_json(json.as_bytes(), Path::new("x")).is_err(),
                "{role}"
            );
        }
    }
}

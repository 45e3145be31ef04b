//! The node state file (`state/constellation/node_state.json`, where existing state disks
//! have it: role and measurement salt, docs/bootstrapper.md). The layout of a node
//! directory is [`asterism_cluster::NodeDir`].

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
    /// The file content: JSON indented with one TAB per level, no trailing newline. Existing
    /// state disks hold files in exactly this form, so it must not change byte for byte.
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

//! The node marker: a node records that it has been bootstrapped into a
//! cluster by extending the cluster ID into PCR 15.
//!
//! * [`mark_node_bootstrapped`] does `TPM2_PCR_Event(15, clusterID)`: every allocated bank
//!   of PCR 15 is extended with its own hash of the 32-byte cluster ID, so the SHA-256 PCR
//!   becomes `SHA-256(old || SHA-256(clusterID))` ([`crate::Tpm::pcr_event`]).
//! * [`is_node_bootstrapped`] reads PCR 15 of the SHA-256 bank: bootstrapped iff it is not
//!   all zero. A TPM that returns no value for it (no SHA-256 bank) is an error, never
//!   "not bootstrapped".
//! * [`expected_marker_pcr`] is the value a node marked once from a reset PCR 15 has:
//!   `SHA-256(0^32 || SHA-256(clusterID))`, what `verify` expects for a running node.
//!
//! Why this matters: the expected measurements of a node that may still be initialised or
//! join enforce PCR 15 as all zero, so once a node is marked it can no
//! longer pass that attestation. Only a TPM reset (a reboot; for swtpm a restart of the
//! process, see the `asterism-swtpm` crate) clears the marker; reopening the TPM does not.
//!
//! The cluster ID is taken as raw bytes (`asterism_kms::ClusterId::as_bytes`), so this crate
//! does not depend on the key-management crate. It is not secret.

use tracing::info;

use crate::device::Tpm;
use crate::error::TpmError;
use crate::pcr::{self, PCR_CLUSTER_ID, PcrSelection, PcrValue};

/// The marker PCR: 15 (`PCRIndexClusterID`).
pub const MARKER_PCR: u32 = PCR_CLUSTER_ID;

/// Why the marker could not be set or read.
#[derive(Debug, thiserror::Error)]
pub enum MarkerError {
    /// Extending PCR 15 failed.
    #[error("cannot record the cluster ID in PCR {MARKER_PCR}")]
    Mark(#[source] TpmError),
    /// Reading PCR 15 failed (this includes a TPM without a SHA-256 bank).
    #[error("cannot read PCR {MARKER_PCR} of the SHA-256 bank")]
    Read(#[source] TpmError),
    /// The TPM answered the read but returned no value for PCR 15.
    #[error("the TPM returned no value for PCR {MARKER_PCR} of the SHA-256 bank")]
    Absent,
}

/// The SHA-256 PCR 15 of a node marked once with `cluster_id` after a TPM reset:
/// `SHA-256(0^32 || SHA-256(cluster_id))`.
pub fn expected_marker_pcr(cluster_id: &[u8; 32]) -> PcrValue {
    pcr::event_extended(&[0; 32], cluster_id)
}

/// Marks the node as bootstrapped into the cluster `cluster_id`: `TPM2_PCR_Event(15,
/// cluster_id)`. It does not check whether the node was marked already; the caller's node
/// lock makes marking one-shot. Marking twice gives a value no cluster
/// expects.
pub fn mark_node_bootstrapped(tpm: &mut Tpm, cluster_id: &[u8; 32]) -> Result<(), MarkerError> {
    tpm.pcr_event(MARKER_PCR, cluster_id)
        .map_err(MarkerError::Mark)?;
    info!(pcr = MARKER_PCR, "marked the node as bootstrapped");
    Ok(())
}

/// The SHA-256 value of PCR 15.
pub fn read_marker_pcr(tpm: &mut Tpm) -> Result<PcrValue, MarkerError> {
    let selection = PcrSelection::new([MARKER_PCR]).map_err(MarkerError::Read)?;
    let values = tpm.read_pcrs(&selection).map_err(MarkerError::Read)?;
    values
        .into_iter()
        .find(|(index, _)| *index == MARKER_PCR)
        .map(|(_, value)| value)
        .ok_or(MarkerError::Absent)
}

/// Whether the node has been marked as bootstrapped: PCR 15 of the SHA-256 bank is not all
/// zero. A PCR that cannot be read is an error.
pub fn is_node_bootstrapped(tpm: &mut Tpm) -> Result<bool, MarkerError> {
    Ok(read_marker_pcr(tpm)? != [0; 32])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_marker_matches_the_reference_worked_example() {
        let mut cluster_id = [0u8; 32];
        let hex = "128c164378fe8767f998fbdfe4b4d6463ec5ae1b664ea5999bc27417607ae9b6";
        for (i, byte) in cluster_id.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
        }
        let pcr: String = expected_marker_pcr(&cluster_id)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            pcr,
            "23400370357e846478cce7cc0c76cdfe4da077cc57b36dee0f665ede2c8b3f2f"
        );
    }
}

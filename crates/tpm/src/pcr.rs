//! PCR selections and the SHA-256 arithmetic of PCRs (pure, no TPM needed).

use sha2::{Digest, Sha256};

use crate::error::TpmError;

/// Number of PCRs in a PC-client TPM bank: indices 0..=23.
pub const PCR_COUNT: u32 = 24;

/// The PCR that marks a node as bootstrapped: the cluster ID is extended into it, and
/// verifiers and existing measurement policies expect it at this index.
pub const PCR_CLUSTER_ID: u32 = 15;

/// A SHA-256 PCR value.
pub type PcrValue = [u8; 32];

/// A non-empty set of PCR indices in 0..=23, always iterated in ascending order (the order a
/// TPM quote digests them in).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PcrSelection(u32);

impl PcrSelection {
    /// PCRs 0..=23, what the vTPM issuer quotes.
    pub const fn all() -> Self {
        PcrSelection((1 << PCR_COUNT) - 1)
    }

    /// The given indices; duplicates are merged. Rejects an empty set and indices above 23.
    pub fn new(indices: impl IntoIterator<Item = u32>) -> Result<Self, TpmError> {
        let mut mask = 0u32;
        for index in indices {
            mask |= 1 << check_index(index)?;
        }
        if mask == 0 {
            return Err(TpmError::EmptyPcrSelection);
        }
        Ok(PcrSelection(mask))
    }

    /// The indices, ascending.
    pub fn indices(&self) -> Vec<u32> {
        (0..PCR_COUNT).filter(|i| self.contains(*i)).collect()
    }

    /// Whether `index` is selected.
    pub fn contains(&self, index: u32) -> bool {
        index < PCR_COUNT && self.0 & (1 << index) != 0
    }

    /// How many PCRs are selected.
    pub fn len(&self) -> usize {
        self.0.count_ones() as usize
    }

    /// Always false: a selection is never empty. (For API symmetry with `len`.)
    pub fn is_empty(&self) -> bool {
        self.0 == 0
    }
}

/// Checks that `index` names one of PCRs 0..=23.
pub(crate) fn check_index(index: u32) -> Result<u32, TpmError> {
    if index < PCR_COUNT {
        Ok(index)
    } else {
        Err(TpmError::InvalidPcrIndex { index })
    }
}

/// The value a SHA-256 PCR takes after `TPM2_PCR_Extend(digest)`: `SHA-256(old || digest)`.
pub fn extended(old: &PcrValue, digest: &[u8; 32]) -> PcrValue {
    let mut hasher = Sha256::new();
    hasher.update(old);
    hasher.update(digest);
    hasher.finalize().into()
}

/// The value a SHA-256 PCR takes after `TPM2_PCR_Event(data)`:
/// `SHA-256(old || SHA-256(data))`.
pub fn event_extended(old: &PcrValue, data: &[u8]) -> PcrValue {
    extended(old, &Sha256::digest(data).into())
}

/// The `pcrDigest` of a TPMS_QUOTE_INFO over one SHA-256 bank: SHA-256 of the selected PCR
/// values concatenated in ascending index order. `values` must already be in that order.
pub fn quote_digest(values: &[(u32, PcrValue)]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for (_, value) in values {
        hasher.update(value);
    }
    hasher.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selection_is_ascending_deduplicated_and_bounded() {
        let selection = PcrSelection::new([15, 0, 7, 15]).unwrap();
        assert_eq!(selection.indices(), vec![0, 7, 15]);
        assert_eq!(selection.len(), 3);
        assert!(selection.contains(7) && !selection.contains(8) && !selection.contains(99));
        assert_eq!(PcrSelection::all().indices(), (0..24).collect::<Vec<_>>());
        assert!(matches!(
            PcrSelection::new([24]),
            Err(TpmError::InvalidPcrIndex { index: 24 })
        ));
        assert!(matches!(
            PcrSelection::new([]),
            Err(TpmError::EmptyPcrSelection)
        ));
    }

    #[test]
    fn cluster_id_event_matches_the_reference_worked_example() {
        // The original's worked example: PCR 15 after PCR_Event(15, clusterID) from all zeroes.
        let cluster_id = hex32("128c164378fe8767f998fbdfe4b4d6463ec5ae1b664ea5999bc27417607ae9b6");
        let expected = hex32("23400370357e846478cce7cc0c76cdfe4da077cc57b36dee0f665ede2c8b3f2f");
        assert_eq!(event_extended(&[0; 32], &cluster_id), expected);
    }

    fn hex32(s: &str) -> [u8; 32] {
        let mut out = [0u8; 32];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
        }
        out
    }
}

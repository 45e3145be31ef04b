//! Expected-measurements files as tests write them (the format of docs/attestation.md).

use asterism_attestation::PcrIndex;

/// 32 bytes of `0xaa` in hex: an expected PCR value.
pub const HEX_AA: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

/// 32 zero bytes in hex: a PCR nothing extended.
pub const HEX_ZERO: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// PCR `i` (0 to 23).
#[allow(clippy::expect_used)] // a test helper fails the test loudly
pub fn pcr(i: u8) -> PcrIndex {
    PcrIndex::new(i).expect("a PCR index is below 24")
}

/// A measurements file of `entries` (`"4": "<hex>", "9": {"expected": …}`).
pub fn measurements_file(entries: &str) -> String {
    format!(r#"{{"measurements": {{{entries}}}}}"#)
}

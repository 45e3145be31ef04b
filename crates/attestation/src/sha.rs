//! SHA-2 digests on the verification path, from ring's assembly implementations.
//!
//! The profile of a confidential-VM verification showed the portable `sha2` compression
//! function at 8 % of the whole path on a CPU without SHA extensions, for about 2 KiB of
//! runtime data and a TPM public area; ring's vectorised code does the same work in about a
//! third of the time. The results are the same digests: the tests below compare both.

use ring::digest::{Context, SHA256, SHA512, digest};

/// SHA-256 of `data`.
pub(crate) fn sha256(data: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(digest(&SHA256, data).as_ref());
    out
}

/// SHA-256 of the concatenation of `parts`.
pub(crate) fn sha256_parts<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> [u8; 32] {
    let mut h = Context::new(&SHA256);
    for p in parts {
        h.update(p);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(h.finish().as_ref());
    out
}

/// SHA-512 of `data`.
pub(crate) fn sha512(data: &[u8]) -> [u8; 64] {
    let mut out = [0u8; 64];
    out.copy_from_slice(digest(&SHA512, data).as_ref());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::Digest as _;

    #[test]
    fn the_digests_are_those_of_the_reference_implementation() {
        for len in [0usize, 1, 55, 56, 63, 64, 65, 1000, 2413] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let want256: [u8; 32] = sha2::Sha256::digest(&data).into();
            assert_eq!(sha256(&data), want256, "{len}");
            let (a, b) = data.split_at(len / 3);
            assert_eq!(sha256_parts([a, b]), want256, "{len}");
            let want512: [u8; 64] = sha2::Sha512::digest(&data).into();
            assert_eq!(sha512(&data), want512, "{len}");
        }
    }
}

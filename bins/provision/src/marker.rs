//! `node-marker status|mark`: the PCR 15 node marker of a running TPM, for tests and for
//! operators debugging a node.

use std::io::Write;

use anyhow::{Context, Result, bail};
use asterism_tpm::marker::{expected_marker_pcr, mark_node_bootstrapped, read_marker_pcr};
use asterism_tpm::{Tpm, TpmConfig};

use crate::progress;

/// Prints `bootstrapped` or `not-bootstrapped` on stdout; PCR 15 and, with a cluster ID,
/// whether it matches, on stderr.
pub fn status(tcti: &str, cluster_id: Option<&str>) -> Result<()> {
    let cluster_id = cluster_id.map(parse_cluster_id).transpose()?;
    let mut tpm = open(tcti)?;
    let value = read_marker_pcr(&mut tpm)?;
    let bootstrapped = value != [0; 32];
    progress!("PCR 15 = {}", hex::encode(value));
    if let Some(id) = cluster_id {
        let expected = expected_marker_pcr(&id);
        if value == expected {
            progress!("PCR 15 is the marker of cluster {}", hex::encode(id));
        } else {
            progress!(
                "PCR 15 is not the marker of cluster {} (that would be {})",
                hex::encode(id),
                hex::encode(expected)
            );
        }
    }
    answer(if bootstrapped {
        "bootstrapped"
    } else {
        "not-bootstrapped"
    })
}

/// Marks the node, refusing one that is marked already.
pub fn mark(tcti: &str, cluster_id: &str) -> Result<()> {
    let id = parse_cluster_id(cluster_id)?;
    let mut tpm = open(tcti)?;
    let before = read_marker_pcr(&mut tpm)?;
    if before != [0; 32] {
        bail!(
            "the node is marked already (PCR 15 = {}); only a TPM reset clears the marker",
            hex::encode(before)
        );
    }
    mark_node_bootstrapped(&mut tpm, &id)?;
    let after = read_marker_pcr(&mut tpm)?;
    progress!("PCR 15 = {}", hex::encode(after));
    answer("bootstrapped")
}

fn open(tcti: &str) -> Result<Tpm> {
    let config: TpmConfig = tcti.parse().with_context(|| format!("--tpm {tcti:?}"))?;
    Ok(Tpm::open(&config)?)
}

fn parse_cluster_id(text: &str) -> Result<[u8; 32]> {
    let bytes = hex::decode(text.trim()).context("--cluster-id is not hex")?;
    bytes
        .as_slice()
        .try_into()
        .map_err(|_| anyhow::anyhow!("--cluster-id is {} bytes; expected 32", bytes.len()))
}

fn answer(line: &str) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}").context("writing to stdout")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_ids_are_exactly_32_hex_bytes() {
        assert_eq!(parse_cluster_id(&"ab".repeat(32)).unwrap(), [0xab; 32]);
        assert!(parse_cluster_id(&"ab".repeat(31)).is_err());
        assert!(parse_cluster_id("xyz").is_err());
    }
}

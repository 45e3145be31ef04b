//! `asterism verify`: fetch fresh evidence from a node and print every measured PCR with
//! pass or fail, and on a confidential VM every checked field of its hardware report.

use crate::trust::TrustArgs;
use anyhow::{Context, Result, bail};
use asterism_attestation::explain::Check;
use asterism_attestation::{
    ExpectedPcr, MeasurementMode, Measurements, PcrIndex, ReportData, TpmQuoteValidator,
};
use asterism_proto::verify::GetAttestationRequest;
use asterism_proto::verify::api_client::ApiClient;
use ring::rand::SecureRandom;
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

/// Arguments of `asterism verify`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The node's verify service, HOST:PORT.
    #[arg(long)]
    endpoint: String,
    /// The cluster's workspace (for the cluster ID, which a bootstrapped node's PCR 15
    /// must show). Without it, PCR 15 is expected as in the measurements file.
    #[arg(long, value_name = "DIR")]
    workspace: Option<PathBuf>,
    #[command(flatten)]
    trust: TrustArgs,
}

impl Args {
    /// Arguments to verify the node at `endpoint` of the cluster whose workspace is
    /// `workspace`, trusting AKs of `platform_ca` and expecting `measurements`.
    pub fn for_node(
        endpoint: &str,
        workspace: &std::path::Path,
        platform_ca: &std::path::Path,
        measurements: &std::path::Path,
    ) -> Self {
        Self {
            endpoint: endpoint.to_string(),
            workspace: Some(workspace.to_path_buf()),
            trust: TrustArgs::platform_ca(platform_ca, measurements),
        }
    }
}

/// `SHA-256(0^32 || SHA-256(cluster ID))`: PCR 15 of a node marked with `cluster_id`.
fn marker(cluster_id: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update([0u8; 32]);
    h.update(Sha256::digest(cluster_id));
    h.finalize().into()
}

fn cluster_id(workspace: &std::path::Path) -> Result<Vec<u8>> {
    let path = workspace.join("cluster-id");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let id = hex::decode(text.trim()).with_context(|| format!("{} is not hex", path.display()))?;
    if id.len() != 32 {
        bail!("{} holds {} bytes, want 32", path.display(), id.len());
    }
    Ok(id)
}

/// Runs the command; fails when an enforced PCR does not match.
pub async fn run(args: Args) -> Result<()> {
    let loaded = args.trust.load_measurements()?;
    let mut expected: Vec<(PcrIndex, ExpectedPcr)> = loaded.iter().map(|(i, e)| (i, *e)).collect();
    let pcr15 = PcrIndex::new(15).context("PCR 15")?;
    if let Some(ws) = &args.workspace {
        let want = ExpectedPcr::enforce(marker(&cluster_id(ws)?));
        expected.retain(|(i, _)| *i != pcr15);
        expected.push((pcr15, want));
        expected.sort_by_key(|(i, _)| *i);
    }
    // The validator checks the AK, the signature, the digest and the nonce binding; every
    // PCR is compared below, one by one, so that all are reported. PCR 15 stays enforced
    // (the validator requires one enforced entry), the rest are compared here.
    let lenient = Measurements::new(expected.iter().map(|(i, e)| {
        if *i == pcr15 {
            (*i, *e)
        } else {
            (*i, ExpectedPcr::warn_only(e.expected))
        }
    }))?
    .with_cvm(loaded.cvm().clone());
    let validator = TpmQuoteValidator::new(args.trust.ak_trust()?, lenient.into_provider());

    let mut nonce = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut nonce)
        .map_err(|_| anyhow::anyhow!("the system random generator failed"))?;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", args.endpoint))
        .with_context(|| format!("invalid endpoint {:?}", args.endpoint))?
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(30))
        .connect()
        .await
        .with_context(|| format!("connecting to the verify service at {}", args.endpoint))?;
    let evidence = ApiClient::new(channel)
        .max_decoding_message_size(128 * 1024)
        .get_attestation(GetAttestationRequest {
            nonce: nonce.to_vec(),
        })
        .await
        .map_err(|s| {
            anyhow::anyhow!(
                "the verify service refused: {:?}: {}",
                s.code(),
                s.message()
            )
        })?
        .into_inner()
        .attestation;
    let (checks, verified) = validator.validate_explained(&evidence, &ReportData::verify(&nonce));
    let mut out = std::io::stdout().lock();
    let verified = match verified {
        Ok(v) => v,
        Err(e) => {
            print_checks(&mut out, &checks)?;
            bail!("the node's evidence was rejected: {e}");
        }
    };

    writeln!(
        out,
        "node {}: {} evidence, attestation key {} (fresh: bound to this call's nonce)",
        args.endpoint,
        verified.variant(),
        verified.identity()
    )?;
    writeln!(
        out,
        "{:>4}  {:<6}  {:<64}  EXPECTED",
        "PCR", "RESULT", "OBSERVED"
    )?;
    let mut failed = 0;
    for (index, want) in &expected {
        let observed = verified
            .measurements()
            .iter()
            .find(|m| m.index == u32::from(index.get()))
            .map(|m| hex::encode(&m.value))
            .unwrap_or_else(|| "(absent)".into());
        let wanted = hex::encode(want.expected);
        let result = if observed == wanted {
            "pass"
        } else if want.mode == MeasurementMode::WarnOnly {
            "warn"
        } else {
            failed += 1;
            "FAIL"
        };
        let shown = if observed == wanted {
            String::from("=")
        } else {
            wanted
        };
        writeln!(
            out,
            "{:>4}  {result:<6}  {observed:<64}  {shown}",
            index.get()
        )?;
    }
    print_checks(&mut out, verified.checks())?;
    if failed > 0 {
        bail!("{failed} enforced PCR(s) differ from the expected measurements");
    }
    Ok(())
}

/// Prints every checked field of a confidential VM's hardware report (nothing for other
/// nodes): the report's fields, certificates and binding, each with pass, warn or FAIL.
fn print_checks(out: &mut impl Write, checks: &[Check]) -> Result<()> {
    if checks.is_empty() {
        return Ok(());
    }
    writeln!(out, "confidential-VM hardware report:")?;
    writeln!(
        out,
        "{:<6}  {:<32}  {:<40}  EXPECTED",
        "RESULT", "FIELD", "OBSERVED"
    )?;
    for c in checks {
        writeln!(
            out,
            "{:<6}  {:<32}  {:<40}  {}",
            c.outcome.to_string(),
            c.field,
            c.observed,
            c.expected
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use asterism_attestation::explain::Outcome;

    #[test]
    fn every_checked_field_is_printed_with_its_outcome() {
        let checks = [
            Check::new(
                "measurement",
                "ab".repeat(48),
                "cd".repeat(48),
                Outcome::Fail,
            ),
            Check::new("reported_tcb.snp", ">= 8", "22", Outcome::Pass),
            Check::new("policy.smt", "allowed", "allowed", Outcome::Warn),
        ];
        let mut out = Vec::new();
        print_checks(&mut out, &checks).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2 + checks.len(), "{text}");
        assert!(lines[2].starts_with("FAIL") && lines[2].contains(&"cd".repeat(48)));
        assert!(lines[3].starts_with("pass") && lines[3].contains("reported_tcb.snp"));
        assert!(lines[4].starts_with("warn"));

        let mut none = Vec::new();
        print_checks(&mut none, &[]).unwrap();
        assert!(
            none.is_empty(),
            "nodes without a hardware report print nothing extra"
        );
    }
}

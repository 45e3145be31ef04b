//! `asterism data-key`: fetch a data key from a key service over attested TLS.

use anyhow::{Context, Result, bail};
use asterism_atls::{AtlsConfig, AtlsConnector};
use asterism_kms::{KeyId, KeyServiceClient};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `asterism data-key`.
#[derive(clap::Args)]
pub struct Args {
    /// Key service address, HOST:PORT.
    #[arg(long)]
    endpoint: String,
    /// Key ID without the `key-` prefix (for example `measurementSecret` or a disk UUID).
    #[arg(long)]
    key_id: String,
    /// Key length in bytes (1..=4096).
    #[arg(long, default_value_t = 32)]
    length: u32,
    /// Write the key to this file (mode 0600, never overwriting). Without it, only the
    /// key's SHA-256 fingerprint is printed.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Attest with the insecure Ed25519 test variant, using this seed file
    /// (see `insecure-test-identity`). Development only.
    #[arg(long)]
    insecure_test_seed_file: Option<PathBuf>,
    /// Deadline for the whole operation, in seconds.
    #[arg(long, default_value_t = 30)]
    timeout_secs: u64,
}

fn issuer(args: &Args) -> Result<Arc<dyn asterism_atls::Issuer>> {
    let Some(seed_file) = &args.insecure_test_seed_file else {
        bail!(
            "no attestation configured: this machine has no TPM variant yet; \
             pass --insecure-test-seed-file for development"
        );
    };
    let seed = crate::read_seed(seed_file)?;
    test_issuer(&seed)
}

#[cfg(feature = "insecure-test-attestation")]
fn test_issuer(seed: &[u8; 32]) -> Result<Arc<dyn asterism_atls::Issuer>> {
    tracing::warn!("attesting with the INSECURE Ed25519 test variant");
    Ok(Arc::new(
        asterism_atls::attestation::test_ed25519::InsecureTestIssuer::from_seed(seed)?,
    ))
}

#[cfg(not(feature = "insecure-test-attestation"))]
fn test_issuer(_seed: &[u8; 32]) -> Result<Arc<dyn asterism_atls::Issuer>> {
    bail!("this build has no insecure test attestation (development feature not enabled)")
}

/// Runs the command.
pub async fn run(args: Args) -> Result<()> {
    let deadline = Duration::from_secs(args.timeout_secs);
    let connector = AtlsConnector::new(
        AtlsConfig::attesting(issuer(&args)?)
            .with_handshake_timeout(deadline)
            .with_exchange_timeout(deadline),
    )?;
    let id = KeyId::parse(&args.key_id).context("invalid --key-id")?;
    let length = usize::try_from(args.length).context("invalid --length")?;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", args.endpoint))
        .with_context(|| format!("invalid endpoint {:?}", args.endpoint))?
        .timeout(deadline)
        .connect_with_connector(connector)
        .await
        .with_context(|| format!("connecting to the key service at {}", args.endpoint))?;
    let key = KeyServiceClient::from_channel(channel, deadline)
        .data_key(&id, length)
        .await
        .context("fetching the data key")?;
    let fingerprint = hex::encode(Sha256::digest(key.expose_secret()));
    if let Some(out) = &args.out {
        asterism_binkit::write_new(out, key.expose_secret(), asterism_binkit::fs::PRIVATE_MODE)?;
    }
    let mut stdout = std::io::stdout().lock();
    writeln!(
        stdout,
        "fetched {}-byte data key {:?} over attested TLS; sha256 fingerprint {fingerprint}",
        key.len(),
        args.key_id
    )?;
    Ok(())
}

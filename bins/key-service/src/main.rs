//! `asterism-key-service`: derives data keys from the cluster's master secret and serves
//! them over plaintext gRPC on a Unix socket or a loopback address, or over attested TLS
//! (clients must attest) on any address.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use asterism_binkit::{AkTrustArgs, LogArgs};
use asterism_key_service::{KeyService, LIMITS, Listener, read_secret_file};
use asterism_kms::KeyServiceAddress;
use asterism_kms::{ClusterKms, MasterSecret, Salt};
use clap::{Parser, ValueEnum};

/// Derives data keys from the cluster master secret and serves them over gRPC (kms.API).
#[derive(Debug, Parser)]
#[command(name = "asterism-key-service", version)]
struct Args {
    /// File holding the raw master secret (at least 16 bytes; no access for group or others).
    #[arg(long, value_name = "PATH", default_value = "/var/config/mastersecret")]
    master_secret_file: PathBuf,

    /// File holding the raw salt (at least 32 bytes; no access for group or others).
    #[arg(long, value_name = "PATH", default_value = "/var/config/salt")]
    salt_file: PathBuf,

    /// Where to listen for plaintext gRPC: a Unix socket, `unix:/path/to.sock` (created
    /// mode 0600). TCP addresses are refused: any local user could connect to them.
    #[arg(
        long,
        value_name = "ADDRESS",
        default_value = "unix:/run/asterism/key-service.sock"
    )]
    listen: KeyServiceAddress,

    /// Serve over attested TLS on this `IP:PORT` instead (any address): every client must
    /// present evidence that `--verify-clients` accepts before any request is read, and
    /// gets only `measurementSecret` (attestation says what a peer runs, not which node it
    /// is; disk keys go to nodes through the join service).
    #[arg(long, value_name = "IP:PORT", requires = "verify_clients")]
    atls_listen: Option<std::net::SocketAddr>,

    /// Evidence variant clients must attest with on `--atls-listen`.
    #[arg(long, value_enum, requires = "atls_listen")]
    verify_clients: Option<ClientVariant>,

    /// `tpm-quote`: which client attestation keys to trust.
    #[command(flatten)]
    ak_trust: AkTrustArgs,

    /// `tpm-quote`: the expected measurements (JSON, see docs/attestation.md). The file is
    /// re-read when it changes.
    #[arg(long, value_name = "PATH")]
    measurements: Option<PathBuf>,

    /// INSECURE, development only: an Ed25519 public key (64 hex digits) whose
    /// `insecure-test-ed25519` evidence is accepted. Repeatable.
    #[arg(long, value_name = "HEX")]
    insecure_test_trusted_key: Vec<String>,

    #[command(flatten)]
    log: LogArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ClientVariant {
    /// A TPM 2.0 quote (vTPM or hardware TPM) checked against expected measurements.
    TpmQuote,
    /// INSECURE: Ed25519 test evidence from pinned keys (development builds only).
    InsecureTestEd25519,
}

fn load_kms(master_secret_file: &Path, salt_file: &Path) -> anyhow::Result<ClusterKms> {
    let mut bytes = read_secret_file(master_secret_file)?;
    let master_secret = MasterSecret::new(std::mem::take(&mut *bytes)).with_context(|| {
        format!(
            "master secret file {} is unusable",
            master_secret_file.display()
        )
    })?;
    let mut bytes = read_secret_file(salt_file)?;
    let salt = Salt::new(std::mem::take(&mut *bytes))
        .with_context(|| format!("salt file {} is unusable", salt_file.display()))?;
    Ok(ClusterKms::new(master_secret, salt))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let shutdown = asterism_binkit::shutdown_signal()?;
    let kms = load_kms(&args.master_secret_file, &args.salt_file)?;
    tracing::info!(
        master_secret_file = %args.master_secret_file.display(),
        salt_file = %args.salt_file.display(),
        "loaded the master secret and salt"
    );
    if let Some(addr) = args.atls_listen {
        let validator = client_validator(&args)?;
        let server =
            asterism_atls::AtlsServer::new(asterism_atls::AtlsConfig::verifying(validator))
                .context("setting up attested TLS")?;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        let address = listener
            .local_addr()
            .context("cannot read the bound address")?;
        tracing::info!(listen = %address, "key service listening (attested TLS, clients must attest)");
        let incoming = asterism_binkit::grpc::fair_share(
            server.incoming(listener),
            asterism_key_service::ATLS_CONNECTIONS,
            |tls| {
                use tonic::transport::server::Connected as _;
                tls.connect_info().remote_addr.map(|peer| peer.ip())
            },
        );
        asterism_key_service::serve_with_limits(
            incoming,
            KeyService::attested_only(kms),
            &asterism_key_service::ATLS_LIMITS,
            shutdown,
        )
        .await?;
        tracing::info!("key service stopped");
        return Ok(());
    }
    let listener = Listener::bind(&args.listen).await?;
    let address = listener
        .local_addr()
        .context("cannot read the bound address")?;
    tracing::info!(listen = %address, "key service listening (plaintext gRPC)");
    listener
        .serve(KeyService::new(kms), &LIMITS, shutdown)
        .await?;
    tracing::info!("key service stopped");
    Ok(())
}

/// Builds the validator for `--verify-clients`.
fn client_validator(args: &Args) -> anyhow::Result<std::sync::Arc<dyn asterism_atls::Validator>> {
    match args.verify_clients {
        Some(ClientVariant::TpmQuote) => tpm_validator(args),
        Some(ClientVariant::InsecureTestEd25519) => test_validator(&args.insecure_test_trusted_key),
        None => anyhow::bail!("--atls-listen needs --verify-clients"),
    }
}

/// Builds the `tpm-quote` validator: an AK trust policy (exactly one of platform CA,
/// pinned keys or the insecure any-key option) and hot-reloaded measurements.
fn tpm_validator(args: &Args) -> anyhow::Result<std::sync::Arc<dyn asterism_atls::Validator>> {
    let path = args
        .measurements
        .as_ref()
        .context("tpm-quote needs --measurements (expected PCR values are mandatory)")?;
    // Re-read when the file changes, here at the edge; validation reads only memory.
    let measurements = asterism_binkit::measurements::watch(path)
        .with_context(|| format!("loading measurements from {}", path.display()))?;
    let trust = args
        .ak_trust
        .ak_trust_for(&asterism_attestation::MeasurementsProvider::current(
            &measurements,
        ))
        .context("tpm-quote")?;
    Ok(std::sync::Arc::new(
        asterism_attestation::TpmQuoteValidator::new(trust, std::sync::Arc::new(measurements)),
    ))
}

#[cfg(feature = "insecure-test-attestation")]
fn test_validator(keys: &[String]) -> anyhow::Result<std::sync::Arc<dyn asterism_atls::Validator>> {
    use asterism_atls::attestation::test_ed25519::InsecureTestValidator;
    if keys.is_empty() {
        anyhow::bail!("insecure-test-ed25519 needs at least one --insecure-test-trusted-key");
    }
    let keys = keys
        .iter()
        .map(|k| {
            let bytes = hex::decode(k)
                .ok()
                .and_then(|b| <[u8; 32]>::try_from(b).ok());
            bytes.with_context(|| format!("--insecure-test-trusted-key {k:?} is not 64 hex digits"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    tracing::warn!(
        keys = keys.len(),
        "accepting INSECURE Ed25519 test evidence: clients prove nothing about their platform"
    );
    Ok(std::sync::Arc::new(InsecureTestValidator::new(keys)))
}

#[cfg(not(feature = "insecure-test-attestation"))]
fn test_validator(
    _keys: &[String],
) -> anyhow::Result<std::sync::Arc<dyn asterism_atls::Validator>> {
    anyhow::bail!(
        "this build has no insecure test attestation; rebuild with \
         `--features insecure-test-attestation` (development only)"
    )
}

fn main() -> ExitCode {
    let args = Args::parse();
    // Our crates at the chosen level; dependencies (HTTP/2 framing and the like) only warn.
    args.log.init(&[
        "asterism_key_service",
        "asterism_kms",
        "asterism_atls",
        "asterism_attestation",
    ]);
    asterism_binkit::service::main("key service", run(args))
}

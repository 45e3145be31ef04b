//! `asterism-key-service`: derives data keys from the cluster's master secret and serves
//! them over plaintext gRPC on a Unix socket or a loopback address, or over attested TLS
//! (clients must attest) on any address.

use std::future::Future;
use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use asterism_key_service::{KeyService, Limits, Listener, read_secret_file};
use asterism_kms::KeyServiceAddress;
use asterism_kms::{ClusterKms, MasterSecret, Salt};
use clap::{ArgAction, Parser, ValueEnum};
use tokio::signal::unix::{SignalKind, signal};
use tracing_subscriber::EnvFilter;

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

    /// Where to listen for plaintext gRPC: `unix:/path/to.sock`, or a loopback `IP:PORT`
    /// such as `127.0.0.1:9000` or `[::1]:9000`. Other addresses are refused.
    #[arg(long, value_name = "ADDRESS", default_value = "127.0.0.1:9000")]
    listen: KeyServiceAddress,

    /// Serve over attested TLS on this `IP:PORT` instead (any address): every client must
    /// present evidence that `--verify-clients` accepts before any request is read.
    #[arg(long, value_name = "IP:PORT", requires = "verify_clients")]
    atls_listen: Option<std::net::SocketAddr>,

    /// Evidence variant clients must attest with on `--atls-listen`.
    #[arg(long, value_enum, requires = "atls_listen")]
    verify_clients: Option<ClientVariant>,

    /// `tpm-quote`: PEM file of the platform CA(s) that certify client attestation keys.
    #[arg(long, value_name = "PATH")]
    platform_ca: Option<PathBuf>,

    /// `tpm-quote`: accept attestation keys with this fingerprint (SHA-256 of the AK's
    /// TPMT_PUBLIC, 64 hex digits) instead of a platform CA. Repeatable.
    #[arg(long, value_name = "HEX")]
    pinned_ak: Vec<String>,

    /// `tpm-quote`: INSECURE, development only: accept any attestation key (the PCR values
    /// are still checked). Warned on every connection.
    #[arg(long)]
    #[cfg(feature = "insecure-test-attestation")]
    insecure_any_ak: bool,

    /// `tpm-quote`: the expected measurements (JSON, see docs/attestation.md). The file is
    /// re-read when it changes.
    #[arg(long, value_name = "PATH")]
    measurements: Option<PathBuf>,

    /// INSECURE, development only: an Ed25519 public key (64 hex digits) whose
    /// `insecure-test-ed25519` evidence is accepted. Repeatable.
    #[arg(long, value_name = "HEX")]
    insecure_test_trusted_key: Vec<String>,

    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Human)]
    log_format: LogFormat,

    /// More log output: -v for debug, -vv for trace.
    #[arg(short, long, action = ArgAction::Count)]
    verbose: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ClientVariant {
    /// A TPM 2.0 quote (vTPM or hardware TPM) checked against expected measurements.
    TpmQuote,
    /// INSECURE: Ed25519 test evidence from pinned keys (development builds only).
    InsecureTestEd25519,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    /// One human-readable line per event.
    Human,
    /// One JSON object per line.
    Json,
}

/// The log filter: `ASTERISM_LOG` when set (a level or a tracing filter, as for the
/// `asterism` CLI; the end-to-end tests run every process at `trace` with it), else `default`.
fn log_filter(default: &str) -> EnvFilter {
    match std::env::var("ASTERISM_LOG") {
        Ok(filter) if !filter.trim().is_empty() => EnvFilter::new(filter),
        _ => EnvFilter::new(default),
    }
}

fn init_logging(format: LogFormat, verbose: u8) {
    let level = match verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    // Our crates at the chosen level; dependencies (HTTP/2 framing and the like) only warn.
    let filter = log_filter(&format!(
        "warn,asterism_key_service={level},asterism_kms={level},asterism_atls={level},asterism_attestation={level}"
    ));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let installed = match format {
        LogFormat::Human => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    if let Err(err) = installed {
        eprintln!("cannot install the log subscriber: {err}");
    }
}

/// Completes on SIGTERM or SIGINT. The handlers are installed now, before the service is
/// announced, so an early signal is never fatal.
fn shutdown_signal() -> anyhow::Result<impl Future<Output = ()>> {
    let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("received SIGTERM"),
            _ = int.recv() => tracing::info!("received SIGINT"),
        }
    })
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
    let shutdown = shutdown_signal()?;
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
        asterism_key_service::serve_with_limits(
            server.incoming(listener),
            KeyService::attested_only(kms),
            &Limits::default(),
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
        .serve(KeyService::new(kms), &Limits::default(), shutdown)
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
    use asterism_attestation::{
        AkFingerprint, AkTrust, PlatformCa, ReloadingMeasurements, TpmQuoteValidator,
    };
    let chosen = usize::from(args.platform_ca.is_some())
        + usize::from(!args.pinned_ak.is_empty())
        + usize::from(insecure_any_ak(args));
    if chosen != 1 {
        anyhow::bail!(
            "tpm-quote needs exactly one AK trust policy: --platform-ca, --pinned-ak or --insecure-any-ak"
        );
    }
    let trust = if let Some(path) = &args.platform_ca {
        let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        AkTrust::platform_ca(
            PlatformCa::from_pem(&pem)
                .with_context(|| format!("{} holds no usable CA certificate", path.display()))?,
        )
    } else if !args.pinned_ak.is_empty() {
        let pins = args
            .pinned_ak
            .iter()
            .map(|h| AkFingerprint::from_hex(h).with_context(|| format!("--pinned-ak {h:?}")))
            .collect::<anyhow::Result<Vec<_>>>()?;
        AkTrust::pinned(pins)
    } else {
        insecure_any_ak_trust()?
    };
    let path = args
        .measurements
        .as_ref()
        .context("tpm-quote needs --measurements (expected PCR values are mandatory)")?;
    let measurements = ReloadingMeasurements::open(path)
        .with_context(|| format!("loading measurements from {}", path.display()))?;
    Ok(std::sync::Arc::new(TpmQuoteValidator::new(
        trust,
        std::sync::Arc::new(measurements),
    )))
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
    init_logging(args.log_format, args.verbose);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            tracing::error!(error = %err, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!(error = format!("{err:#}"), "key service failed");
            ExitCode::FAILURE
        }
    }
}

/// Whether `--insecure-any-ak` was given; the flag exists only in builds with the
/// `insecure-test-attestation` feature (never optimised ones).
#[cfg(feature = "insecure-test-attestation")]
fn insecure_any_ak(args: &Args) -> bool {
    args.insecure_any_ak
}

#[cfg(not(feature = "insecure-test-attestation"))]
fn insecure_any_ak(_: &Args) -> bool {
    false
}

#[cfg(feature = "insecure-test-attestation")]
fn insecure_any_ak_trust() -> anyhow::Result<asterism_attestation::AkTrust> {
    tracing::warn!("accepting ANY attestation key (--insecure-any-ak): development only");
    Ok(asterism_attestation::AkTrust::insecure_any_ak())
}

#[cfg(not(feature = "insecure-test-attestation"))]
fn insecure_any_ak_trust() -> anyhow::Result<asterism_attestation::AkTrust> {
    anyhow::bail!("no AK trust policy: --platform-ca or --pinned-ak")
}

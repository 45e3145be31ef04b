//! `asterism-metadata`: the local cluster's metadata service (plain HTTP), answering
//! `GET /self`, `/peers`, `/endpoint` and `/initsecrethash` from a JSON file.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use asterism_binkit::logging::{self, LogFormat};
use asterism_binkit::service::Runtime;
use asterism_metadata::{MetadataConfig, MetadataServer};
use clap::Parser;

/// Serves instance metadata over plain HTTP; `GET /self` answers by the caller's source
/// address.
#[derive(Debug, Parser)]
#[command(name = "asterism-metadata", version)]
struct Args {
    /// Address to listen on.
    #[arg(long, value_name = "IP:PORT", default_value = "127.0.10.254:8080")]
    listen: SocketAddr,

    /// JSON file `{"instances": [InstanceMetadata…], "initSecretHash": "$2b$…"}`.
    #[arg(long, value_name = "PATH")]
    config: PathBuf,

    /// More log output: -v for debug.
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
}

async fn run(args: Args) -> anyhow::Result<()> {
    let shutdown = asterism_binkit::shutdown_signal()?;
    let config = MetadataConfig::load(&args.config)
        .with_context(|| format!("loading {}", args.config.display()))?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let address = listener.local_addr().context("reading the bound address")?;
    tracing::info!(listen = %address, instances = config.instances.len(), "metadata service listening");
    MetadataServer::new(config)
        .serve(listener, shutdown)
        .await
        .context("serving")?;
    tracing::info!("metadata service stopped");
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    let level = if args.verbose > 0 { "debug" } else { "info" };
    logging::init(
        LogFormat::Human,
        &logging::directives(&logging::crate_directives(level, &["asterism_metadata"])),
    );
    Runtime::with_worker_threads(2).main("metadata service", run(args))
}

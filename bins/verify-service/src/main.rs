//! `asterism-verify-service`: answers `verify.API/GetAttestation` with fresh `tpm-quote`
//! evidence of this node, bound to the caller's nonce.
//!
//! The answer is plain gRPC, with no attested TLS: the evidence is self-authenticating (signed by the TPM over `SHA-256("asterism/verify/v1" || nonce)`),
//! and `asterism verify` checks it. The purpose label keeps this service from ever signing
//! a binding that attested TLS would accept.
//!
//! Anyone who reaches the port can ask, and each answer costs a TPM quote, so quotes are
//! held to a token bucket per source address (`--rate-limit-per-second`,
//! `--rate-limit-burst`): a source over its rate gets `RESOURCE_EXHAUSTED` without a quote.
//! Many sources, each within its rate, could still keep the TPM busy, so quotes also take
//! turns in a queue shared fairly between sources (`asterism_binkit::fair_queue`): one
//! quote at a time, at most [`MAX_QUOTES_WAITING`] waiting for at most
//! [`QUOTE_QUEUE_DEADLINE`], and each freed turn to the source that has had the fewest
//! quotes, so the owner's `asterism verify` goes ahead of a flood's hundredth quote.
//!
//! Connections are bounded too, since anyone can also hold them open without asking: at
//! most 128 in all and 4 per source ([`CONNECTIONS`]), shared
//! fairly (`asterism_binkit::grpc::fair_share`): when all are taken, a connection from a source
//! holding fewer than the busiest source takes the busiest's oldest, which is closed. No
//! set of sources can keep the owner's `asterism verify` out. Every connection is closed
//! after [`LIMITS`]' maximum age, and one that stops answering HTTP/2 pings sooner.
#![forbid(unsafe_code)]

use anyhow::{Context as _, Result};
use asterism_attestation::{Issuer, ReportData};
use asterism_basics::source_of;
use asterism_binkit::grpc::{self, FairShare, Limits};
use asterism_binkit::{FairQueue, RateLimiter};
use asterism_proto::verify::api_server::{Api, ApiServer};
use asterism_proto::verify::{GetAttestationRequest, GetAttestationResponse};
use asterism_tpm::{AkConfig, PcrSelection, TpmConfig, TpmIssuer};
use clap::Parser;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::service::Routes;

/// Longest AK certificate read, in bytes.
const MAX_AK_CERT: u64 = 64 * 1024;

/// Longest nonce accepted, in bytes.
const MAX_NONCE: usize = 64;

/// Quotes that wait for the TPM at once, all sources together; a request beyond them gets
/// `RESOURCE_EXHAUSTED` at once.
const MAX_QUOTES_WAITING: usize = 256;

/// How long a quote waits for its turn: less than [`LIMITS`]' request deadline, so that a
/// caller hears `RESOURCE_EXHAUSTED` (and may retry) rather than a timeout.
const QUOTE_QUEUE_DEADLINE: Duration = Duration::from_secs(8);

/// The verify service's gRPC caps: a request is a nonce (1 KiB is plenty), answered within
/// 10 s; 4 requests at a time per connection, as each costs a TPM quote; the services'
/// header cap and keepalive pings; and no connection older than 60 s (an `asterism verify`
/// takes one quote). How many connections are open is [`CONNECTIONS`]'.
const LIMITS: Limits = Limits {
    max_request_size: 1024,
    request_timeout: Some(Duration::from_secs(10)),
    max_streams_per_connection: Some(4),
    max_connection_age: Some(Duration::from_secs(60)),
    max_connection_age_grace: Some(Duration::from_secs(10)),
    ..Limits::SERVICE
};

/// Connections open at once: 128 in all, 4 from one source (an IPv4 address, or an IPv6
/// /64), shared fairly.
const CONNECTIONS: FairShare = FairShare {
    max: 128,
    per_source: 4,
};

/// Serves fresh attestation evidence of this node to `asterism verify`.
#[derive(Parser, Debug)]
#[command(name = "asterism-verify-service", version)]
struct Args {
    /// Where to listen, IP:PORT.
    #[arg(long)]
    listen: SocketAddr,
    /// The node's TPM (`device:/dev/tpmrm0`, `swtpm:host=…,port=…`).
    #[arg(long, default_value = "device:/dev/tpmrm0")]
    tpm: TpmConfig,
    /// The AK certificate (DER) to send along, so verifiers can check it against their
    /// platform CA.
    #[arg(long)]
    ak_cert: Option<PathBuf>,
    /// Sustained quotes per second per source address (an IPv4 address, or an IPv6 /64).
    #[arg(long, default_value_t = 1.0)]
    rate_limit_per_second: f64,
    /// Quotes one source address may ask for at once before the rate applies.
    #[arg(long, default_value_t = 5)]
    rate_limit_burst: u32,
}

struct Verify {
    issuer: Arc<TpmIssuer>,
    /// Quotes per source address.
    limiter: RateLimiter,
    /// Quotes at once, all sources together: one, the TPM's turns shared fairly.
    quotes: Arc<FairQueue>,
}

/// The key a peer's quotes are counted under: its IPv4 address (an IPv4-mapped IPv6
/// address counts as its IPv4 address), or its IPv6 /64, since one host commonly holds a
/// whole /64. A request without an address (not over TCP) counts as one unknown source.
fn source(peer: Option<SocketAddr>) -> String {
    peer.map_or_else(|| "unknown".to_owned(), |p| source_of(p.ip()).to_string())
}

#[tonic::async_trait]
impl Api for Verify {
    async fn get_attestation(
        &self,
        request: tonic::Request<GetAttestationRequest>,
    ) -> Result<tonic::Response<GetAttestationResponse>, tonic::Status> {
        let peer = request.remote_addr();
        if !self.limiter.allow(&source(peer), std::time::Instant::now()) {
            // At debug: a flood must not flood the log too.
            tracing::debug!(peer = ?peer, "refused a quote: this source is over its rate");
            return Err(tonic::Status::resource_exhausted(
                "too many attestation requests from this address; retry later",
            ));
        }
        let nonce = request.into_inner().nonce;
        if nonce.is_empty() || nonce.len() > MAX_NONCE {
            return Err(tonic::Status::invalid_argument(format!(
                "the nonce must have 1..={MAX_NONCE} bytes"
            )));
        }
        let ip = peer.map_or(Ipv4Addr::UNSPECIFIED.into(), |p| p.ip());
        let turn = self.quotes.turn(ip).await.map_err(|busy| {
            tracing::debug!(peer = ?peer, "refused a quote: no turn for the TPM");
            tonic::Status::resource_exhausted(busy.to_string())
        })?;
        let issuer = self.issuer.clone();
        // The turn is held until the TPM is done, even if the caller goes away first.
        let evidence = tokio::task::spawn_blocking(move || {
            let evidence = issuer.issue(&ReportData::verify(&nonce));
            drop(turn);
            evidence
        })
        .await
        .map_err(|_| tonic::Status::internal("issuing evidence failed"))?
        .map_err(|e| {
            tracing::error!(error = %e, "issuing evidence failed");
            tonic::Status::internal("issuing evidence failed")
        })?;
        tracing::info!(peer = ?peer, "issued verification evidence");
        Ok(tonic::Response::new(GetAttestationResponse {
            attestation: evidence,
        }))
    }
}

async fn run(args: Args) -> Result<()> {
    let chain = match &args.ak_cert {
        Some(p) => vec![asterism_binkit::read_capped(p, MAX_AK_CERT)?],
        None => Vec::new(),
    };
    let tpm = args.tpm.clone();
    // Connect per quote: the node's TPM is shared with other processes (one client at a
    // time on swtpm).
    let issuer = tokio::task::spawn_blocking(move || {
        TpmIssuer::connecting_per_use(tpm, AkConfig::default(), PcrSelection::all(), chain)
    })
    .await
    .context("opening the TPM")?
    .context("opening the TPM and loading the attestation key")?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    tracing::info!(listen = %args.listen, "verify service listening (plain gRPC; evidence is self-authenticating)");
    let shutdown = asterism_binkit::shutdown_signal()?;
    let api = ApiServer::new(Verify {
        issuer: Arc::new(issuer),
        limiter: RateLimiter::new(args.rate_limit_per_second, args.rate_limit_burst),
        quotes: FairQueue::new(1, MAX_QUOTES_WAITING, QUOTE_QUEUE_DEADLINE),
    })
    .max_decoding_message_size(LIMITS.max_request_size);
    let incoming = grpc::fair_share(TcpListenerStream::new(listener), CONNECTIONS, |tcp| {
        tcp.peer_addr().ok().map(|peer| peer.ip())
    });
    grpc::serve(incoming, Routes::new(api), &LIMITS, shutdown)
        .await
        .context("serving")?;
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    asterism_binkit::logging::init(
        asterism_binkit::LogFormat::Human,
        &asterism_binkit::logging::directives("info"),
    );
    asterism_binkit::service::Runtime::with_worker_threads(2).main("verify service", run(args))
}

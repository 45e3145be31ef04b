//! `asterism`: the command-line tool of a cluster's owner.
//!
//! `init` initialises the first node of a cluster, `verify` checks a node's fresh evidence,
//! `mini` runs a local cluster, `readmit` lets a member with a new attestation key rejoin,
//! `data-key` fetches a key from a key service over attested
//! TLS. The commands live in the `asterism` library so that tests can drive them.

use anyhow::{Context, Result};
use asterism::{data_key, identity, init, mini, readmit, verify};
use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "asterism",
    version,
    about = "Asterism: attested bootstrapping of confidential Kubernetes clusters"
)]
struct Cli {
    /// Log verbosity (error, warn, info, debug, trace) or a tracing filter.
    #[arg(long, global = true, default_value = "warn", env = "ASTERISM_LOG")]
    log: String,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Initialise the first control-plane node of a new cluster.
    Init(init::Args),
    /// Fetch fresh evidence from a node and print every PCR with pass or fail.
    Verify(verify::Args),
    /// Fetch a data key from a key service over attested TLS.
    DataKey(data_key::Args),
    /// Let a member that came back with another attestation key (a replaced TPM) receive
    /// its next join ticket. Run on a control-plane node, as the join service's user.
    Readmit(readmit::Args),
    /// A local cluster on this machine: swtpm per node, LUKS2 image files, real services.
    #[command(subcommand)]
    Mini(MiniCommand),
    /// Create an Ed25519 test identity (a 32-byte seed file, mode 0600) and print its
    /// public key. INSECURE: development and tests only.
    InsecureTestIdentity {
        /// Where to write the seed. Refuses to overwrite an existing file.
        #[arg(long)]
        out: PathBuf,
    },
}

#[derive(Subcommand)]
enum MiniCommand {
    /// Build and start a local cluster (one control plane, N workers).
    Up(mini::UpArgs),
    /// Show the nodes and the processes of a local cluster.
    Status(mini::DirArgs),
    /// Stop every process of a local cluster.
    Down(mini::DirArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    asterism_binkit::logging::init(asterism_binkit::LogFormat::Human, &cli.log);
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::DataKey(args) => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            rt.block_on(data_key::run(args))
        }
        Command::Init(args) => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            let done = rt.block_on(init::run(args))?;
            // The cluster ID on stdout for scripts; progress went to stderr.
            let mut stdout = std::io::stdout().lock();
            std::io::Write::write_fmt(
                &mut stdout,
                format_args!("{}\t{}\n", done.cluster_id, done.workspace.display()),
            )?;
            Ok(())
        }
        Command::Mini(MiniCommand::Up(args)) => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            rt.block_on(mini::up(args))
        }
        Command::Verify(args) => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            rt.block_on(verify::run(args))
        }
        Command::Mini(MiniCommand::Status(args)) => mini::status(args),
        Command::Mini(MiniCommand::Down(args)) => mini::down(args),
        Command::InsecureTestIdentity { out } => identity::create(&out),
        Command::Readmit(args) => {
            let member = readmit::run(&args)?;
            eprintln!(
                "re-admitted {}: its next join ticket may come with another attestation key (now {})",
                args.node,
                member.get("ak").and_then(|a| a.as_str()).unwrap_or("?")
            );
            Ok(())
        }
    }
}

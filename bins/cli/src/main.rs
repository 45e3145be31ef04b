//! `asterism`: the command-line tool of a cluster's owner.
//!
//! `init` initialises the first node of a cluster, `verify` checks a node's fresh evidence,
//! `recover` brings back the control plane of a cluster that went down whole,
//! `mini` runs a local cluster, `readmit` lets a member with a new attestation key rejoin,
//! `data-key` fetches a key from a key service over attested TLS, `recovery-share decrypt`
//! opens a custodian's share of the master secret. The commands live in the `asterism`
//! library so that tests can drive them.
//!
//! `mini` is the `asterism-mini` program, run git-style: it drives swtpm and LUKS2 images,
//! and this tool must link neither the TSS nor libcryptsetup (scripts/check-deps).
#![forbid(unsafe_code)]

use anyhow::{Context, Result};
use asterism::{
    bring_up, control_plane, data_key, identity, init, readmit, recover, recovery_share, verify,
};
use clap::{Parser, Subcommand};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

#[derive(Parser)]
#[command(
    name = "asterism",
    version,
    about = "Asterism: attested bootstrapping of confidential Kubernetes clusters"
)]
struct Cli {
    #[command(flatten)]
    log: asterism_binkit::logging::ToolLogArgs,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Initialise the first control-plane node of a new cluster, then deploy the key, join
    /// and verify services into it (unless --skip-bring-up).
    Init {
        /// The initialisation.
        #[command(flatten)]
        init: init::Args,
        /// The bring-up after it.
        #[command(flatten)]
        bring_up: bring_up::Args,
    },
    /// Fetch fresh evidence from a node and print every PCR with pass or fail.
    Verify(verify::Args),
    /// Bring back the control-plane nodes of a cluster that went down whole: each node's
    /// evidence is checked, then it gets the two keys it needs, derived from the master
    /// secret here.
    Recover(recover::Args),
    /// Fetch a data key from a key service over attested TLS.
    DataKey(data_key::Args),
    /// Let a member that came back with another attestation key (a replaced TPM) receive
    /// its next join ticket. Run on a control-plane node, as the join service's user.
    Readmit(readmit::Args),
    /// The control plane as the workspace records it: `sync` adds the control-plane nodes
    /// the join service lists, signed by the control plane's identity, so that `recover`
    /// sends keys to their attestation keys (only for their disks).
    #[command(subcommand)]
    ControlPlane(ControlPlaneCommand),
    /// A custodian's share of the master secret (`asterism init --recovery-shares`):
    /// `decrypt` it with the custodian's key for `asterism recover --share`.
    RecoveryShare(recovery_share::Args),
    /// A local cluster on this machine: swtpm per node, LUKS2 image files, real services.
    /// Runs `asterism-mini` (next to this executable, else on PATH) with these arguments:
    /// `up`, `status`, `down`; `asterism mini --help` lists them.
    #[command(disable_help_flag = true)]
    Mini {
        /// The arguments of `asterism-mini`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// Create an Ed25519 test identity (a 32-byte seed file, mode 0600) and print its
    /// public key. INSECURE: development and tests only.
    InsecureTestIdentity {
        /// Where to write the seed. Refuses to overwrite an existing file.
        #[arg(long)]
        out: PathBuf,
    },
}

#[derive(Subcommand)]
enum ControlPlaneCommand {
    /// Add the control-plane nodes of the join service's signed list to the workspace.
    Sync(control_plane::SyncArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    cli.log.init();
    asterism_binkit::logging::tool_exit(run(cli))
}

fn run(cli: Cli) -> Result<std::process::ExitCode> {
    match cli.command {
        Command::DataKey(args) => asterism_binkit::service::block_on(data_key::run(args)),
        Command::Init {
            init: args,
            bring_up,
        } => {
            // A node that hosts the services itself has no Kubernetes API to deploy them to.
            let bring_up = if args.host_cluster_services {
                bring_up::Args::skipped("the node hosts the key and join services itself")
            } else {
                bring_up
            };
            let done = asterism_binkit::service::block_on(init::run_with(args, &bring_up))?;
            // The cluster ID on stdout for scripts; progress went to stderr.
            let mut stdout = std::io::stdout().lock();
            std::io::Write::write_fmt(
                &mut stdout,
                format_args!("{}\t{}\n", done.cluster_id, done.workspace.display()),
            )?;
            Ok(())
        }
        Command::Recover(args) => {
            asterism_binkit::service::block_on(recover::run(args)).map(|_| ())
        }
        Command::Verify(args) => asterism_binkit::service::block_on(verify::run(args)),
        // Its exit code is ours.
        Command::Mini { args } => return run_mini(&args, &cli.log.log),
        Command::InsecureTestIdentity { out } => identity::create(&out),
        Command::RecoveryShare(args) => {
            let out = recovery_share::run(&args)?;
            eprintln!(
                "decrypted share written to {} (mode 0600); give it to whoever runs \
                 `asterism recover --share`, and delete it afterwards",
                out.display()
            );
            Ok(())
        }
        Command::ControlPlane(ControlPlaneCommand::Sync(args)) => {
            let added = control_plane::sync(&args)?;
            for m in &added {
                eprintln!(
                    "▸ recorded control-plane node {}: attestation key {}, disk {}",
                    m.name, m.ak, m.disk
                );
            }
            eprintln!(
                "▸ {} new control-plane node(s) in {}",
                added.len(),
                args.workspace.join(control_plane::RECORD_FILE).display()
            );
            Ok(())
        }
        Command::Readmit(args) => {
            let member = readmit::run(&args)?;
            eprintln!(
                "re-admitted {}: its next join ticket may come with another attestation key (now {})",
                args.node,
                member.get("ak").and_then(|a| a.as_str()).unwrap_or("?")
            );
            Ok(())
        }
    }?;
    Ok(std::process::ExitCode::SUCCESS)
}

/// The program that `asterism mini` runs.
const MINI_PROGRAM: &str = "asterism-mini";

/// Runs `asterism-mini` with `args` and the log filter (through `ASTERISM_LOG`, which it
/// reads too), and returns its exit code as ours.
fn run_mini(args: &[OsString], log: &str) -> Result<std::process::ExitCode> {
    let program = find_mini()?;
    let status = asterism_children::status(
        std::process::Command::new(&program)
            .args(args)
            .env("ASTERISM_LOG", log),
    )
    .with_context(|| format!("running {}", program.display()))?;
    Ok(match status.code() {
        Some(code) => std::process::ExitCode::from(u8::try_from(code).unwrap_or(1)),
        // Killed by a signal: the shell's convention, 128 + the signal number.
        None => {
            let signal = std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0);
            std::process::ExitCode::from(u8::try_from(128 + signal).unwrap_or(1))
        }
    })
}

/// `asterism-mini` next to this executable (a build or an install puts them together), else
/// the first one on `PATH`.
fn find_mini() -> Result<PathBuf> {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join(MINI_PROGRAM)));
    let on_path = std::env::var_os("PATH")
        .map(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join(MINI_PROGRAM))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    beside
        .into_iter()
        .chain(on_path)
        .find(|candidate| is_executable(candidate))
        .with_context(|| {
            format!(
                "`asterism mini` runs `{MINI_PROGRAM}`, which is neither next to this executable \
                 nor on PATH; build it (`cargo build -p asterism-mini`) or install it beside `asterism`"
            )
        })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory as _;
        super::Cli::command().debug_assert();
    }
}

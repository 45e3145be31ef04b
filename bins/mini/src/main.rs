//! `asterism-mini`: a local cluster on this machine (`up`, `status`, `down`). The operator's
//! `asterism` CLI runs it for `asterism mini …`, with the same arguments.
#![forbid(unsafe_code)]

use anyhow::Result;
use asterism_mini as mini;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "asterism-mini",
    version,
    about = "A local cluster on this machine: swtpm per node, LUKS2 image files, real services"
)]
struct Cli {
    #[command(flatten)]
    log: asterism_binkit::logging::ToolLogArgs,

    #[command(subcommand)]
    command: MiniCommand,
}

#[derive(Subcommand)]
enum MiniCommand {
    /// Build and start a local cluster (one control plane, N workers).
    Up(mini::UpArgs),
    /// Show the nodes and the processes of a local cluster.
    Status(mini::StatusArgs),
    /// Stop every process of a local cluster.
    Down(mini::DirArgs),
    /// Where the bootstrappers of one or more clusters spent their time (the VM benchmark's
    /// figures, scripts/bench-vm-boot).
    Timing(mini::timing::TimingArgs),
    /// VM mode: answers one metadata request of a guest on stdin and stdout (QEMU starts
    /// it per connection).
    #[command(hide = true)]
    VmMetadataRelay(mini::vm::RelayArgs),
    /// VM mode: passes one connection of a guest to its cloud metadata address to a
    /// stand-in, on stdin and stdout (QEMU starts it per connection).
    #[command(hide = true)]
    VmCloudRelay(mini::vm::CloudRelayArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    cli.log.init();
    asterism_binkit::logging::tool_exit(run(cli.command).map(|()| std::process::ExitCode::SUCCESS))
}

fn run(command: MiniCommand) -> Result<()> {
    match command {
        MiniCommand::Up(args) => asterism_binkit::service::block_on(mini::up(args)),
        MiniCommand::Status(args) => mini::status(args),
        MiniCommand::Down(args) => mini::down(args),
        MiniCommand::VmMetadataRelay(args) => mini::vm::metadata_relay(&args),
        MiniCommand::VmCloudRelay(args) => mini::vm::cloud_relay(&args),
        MiniCommand::Timing(args) => mini::timing::report(&args),
    }
}

//! The command-line arguments of `asterism-mini up`, `status` and `down`.

use std::path::PathBuf;

use crate::vm;

/// Arguments of `asterism mini up`.
#[derive(clap::Args, Debug)]
pub struct UpArgs {
    /// Directory of the local cluster (created).
    #[arg(long, default_value = ".asterism/mini")]
    pub dir: PathBuf,
    /// Number of worker nodes (there is one control-plane node).
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Loopback network of the cluster: nodes get `127.0.<net>.<n>`, the metadata service
    /// `127.0.<net>.254`. Two clusters on one machine need different values.
    #[arg(long, default_value_t = 10)]
    pub net: u8,
    /// Directory holding the Asterism binaries (default: next to this executable).
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
    /// Boot every node as a QEMU VM from the node image (docs/mini.md, "VM mode").
    #[arg(long)]
    pub vm: bool,
    /// Settings of VM mode.
    #[command(flatten)]
    pub vm_args: vm::VmArgs,
}

/// Arguments of `asterism mini status` and `down`.
#[derive(clap::Args, Debug)]
pub struct DirArgs {
    /// Directory of the local cluster.
    #[arg(long, default_value = ".asterism/mini")]
    pub dir: PathBuf,
}

/// Arguments of `asterism mini status`.
#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// The cluster.
    #[command(flatten)]
    pub cluster: DirArgs,
    /// Print the record and the processes as JSON (every node's components in full).
    #[arg(long)]
    pub json: bool,
}

//! `asterism-provision`: plays the cloud provider for local clusters.
//!
//! A cloud provider manufactures each machine's TPM (endorsement keys and their
//! certificates), certifies an attestation key (AK) of each vTPM with its platform CA, and
//! publishes the expected measurements of its images. This tool does the same for swtpm
//! TPMs on one machine:
//!
//! * `platform-ca init`: a local platform CA (ECDSA P-256 key, mode 0600, and a self-signed
//!   CA certificate);
//! * `node`: manufactures an swtpm state directory, creates and persists the AK, certifies
//!   it with the platform CA, reads the PCRs, writes what a verifier needs and checks that a
//!   quote of the new TPM is accepted with exactly those files;
//! * `node-marker status|mark`: reads or sets the node marker in PCR 15;
//! * `boot-measurements`: the expected measurements of a VM image from a reference boot's
//!   event log and PCR values (docs/vm-image.md).
//!
//! For machines with real TPMs, where no provider certifies the AK, the owner plays the
//! enrolment CA with the same platform CA, once per machine:
//!
//! * `enroll request` (machine): the EK certificate and chain, the EK and the AK;
//! * `enroll challenge` (owner): verifies the EK certificate against the manufacturers'
//!   bundle and the AK against our template, and makes a credential only that TPM can open
//!   (`TPM2_MakeCredential` in software);
//! * `enroll activate` (machine): `TPM2_ActivateCredential`, answered with an HMAC proof,
//!   never the credential;
//! * `enroll finish` (owner): checks the proof, and only then certifies the AK.
//!
//! Progress goes to stderr; the only output on stdout is the answer of `node-marker`. Keys
//! and enrolment credentials never appear in the output.
#![forbid(unsafe_code)]

mod boot;
mod ca;
mod credential;
mod enroll;
mod files;
mod marker;
mod node;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(
    name = "asterism-provision",
    version,
    about = "Plays the cloud provider for local Asterism clusters: platform CA, node TPMs \
             (swtpm) with certified attestation keys, expected measurements"
)]
struct Cli {
    #[command(flatten)]
    log: asterism_binkit::logging::ToolLogArgs,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The local platform CA that certifies attestation keys.
    PlatformCa {
        #[command(subcommand)]
        command: PlatformCaCommand,
    },
    /// Provision a node's TPM: manufacture an swtpm state directory, create and certify the
    /// attestation key, write the files a verifier needs.
    Node(NodeArgs),
    /// Read or set the node marker (PCR 15) of a running TPM.
    NodeMarker {
        #[command(subcommand)]
        command: MarkerCommand,
    },
    /// Enrol a machine with a real TPM, once: prove by credential activation that its
    /// attestation key is in the TPM whose EK certificate a manufacturer signed, then
    /// certify the key with the platform CA (docs/provisioning.md, "Enrolling machines with
    /// real TPMs").
    Enroll {
        #[command(subcommand)]
        command: EnrollCommand,
    },
    /// The expected measurements of nodes booted like a reference boot (a VM image's, or one
    /// machine's of a fleet): PCRs 0-9 from its TCG event log, which must replay to the PCR
    /// values read, each with its events, and PCR 15 zero. Names the events that make a
    /// PCR differ between machines.
    BootMeasurements {
        /// The reference boot's event log (`binary_bios_measurements`).
        #[arg(long)]
        event_log: PathBuf,
        /// The PCR values the machine read: `{"sha256": {"0": "<hex>", …}}`, or the text
        /// `tpm2_pcrread sha256` prints.
        #[arg(long)]
        pcrs: PathBuf,
        /// The measurements file to write (must not exist).
        #[arg(long)]
        out: PathBuf,
    },
}

#[derive(Subcommand)]
enum PlatformCaCommand {
    /// Create a platform CA in DIR: `platform-ca.key` (PKCS#8, mode 0600) and
    /// `platform-ca.pem` (self-signed CA certificate). Refuses to overwrite either.
    Init {
        /// The CA directory (created with mode 0700 if missing).
        #[arg(long)]
        dir: PathBuf,
    },
}

/// Arguments of `node`.
#[derive(clap::Args)]
struct NodeArgs {
    /// The swtpm state directory to manufacture: must be missing or empty (created with
    /// mode 0700).
    #[arg(long)]
    state_dir: PathBuf,
    /// The platform CA directory (`platform-ca init`). Its `ek-ca/` subdirectory holds the
    /// TPM manufacturer CA that signs the EK certificates (created on first use).
    #[arg(long)]
    ca_dir: PathBuf,
    /// The attestation key's algorithm.
    #[arg(long, value_enum, default_value_t = AkKind::Ecc)]
    ak: AkKind,
    /// Where to write ak-cert.der, ak-public.bin, measurements.json and platform-ca.pem
    /// (created if missing; none of them may exist yet).
    #[arg(long)]
    out: PathBuf,
    /// Validity of the AK certificate, in days.
    #[arg(long, default_value_t = 3650, value_parser = clap::value_parser!(u32).range(1..=36500))]
    validity_days: u32,
}

/// The AK algorithms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum AkKind {
    /// ECC NIST P-256, ECDSA-SHA256, persistent handle 0x81008F00.
    Ecc,
    /// RSA-2048, RSASSA-SHA256, persistent handle 0x81008F01.
    Rsa,
}

#[derive(Subcommand)]
enum EnrollCommand {
    /// On the machine: write the EK certificate (and chain), the EK and the attestation key
    /// (created and persisted if missing) to a request file for the owner.
    Request {
        /// The TPM, e.g. `device:/dev/tpmrm0` or `swtpm:host=127.0.0.1,port=2321`.
        #[arg(long)]
        tpm: String,
        /// Which EK and EK certificate to use.
        #[arg(long, value_enum, default_value_t = EkKind::Rsa2048)]
        ek: EkKind,
        /// The attestation key's algorithm (as for `node`).
        #[arg(long, value_enum, default_value_t = AkKind::Ecc)]
        ak: AkKind,
        /// The request file to write (must not exist).
        #[arg(long)]
        out: PathBuf,
    },
    /// On the owner's side: verify the request's EK certificate against the manufacturers'
    /// bundle and the AK against our template, and make a challenge only that TPM can
    /// answer.
    Challenge {
        /// The machine's request file.
        #[arg(long)]
        request: PathBuf,
        /// The TPM manufacturers' CA certificates (a directory of PEM or DER files).
        #[arg(long)]
        ek_ca_dir: PathBuf,
        /// Where to keep the pending state for `finish` (written mode 0600; must not exist).
        #[arg(long)]
        pending: PathBuf,
        /// The challenge file to write for the machine (must not exist).
        #[arg(long)]
        out: PathBuf,
    },
    /// On the machine: open the challenge with the TPM (TPM2_ActivateCredential) and write
    /// the proof for the owner.
    Activate {
        /// The TPM, e.g. `device:/dev/tpmrm0` or `swtpm:host=127.0.0.1,port=2321`.
        #[arg(long)]
        tpm: String,
        /// The owner's challenge file.
        #[arg(long)]
        challenge: PathBuf,
        /// The response file to write (must not exist).
        #[arg(long)]
        out: PathBuf,
    },
    /// On the owner's side: check the machine's proof and only then certify its attestation
    /// key with the platform CA; the pending file is used up.
    Finish {
        /// The pending file `challenge` wrote.
        #[arg(long)]
        pending: PathBuf,
        /// The machine's response file.
        #[arg(long)]
        response: PathBuf,
        /// The platform CA directory (`platform-ca init`).
        #[arg(long)]
        ca_dir: PathBuf,
        /// Where to write ak-cert.der, ak-public.bin and platform-ca.pem (created if
        /// missing; none of them may exist yet).
        #[arg(long)]
        out: PathBuf,
        /// Validity of the AK certificate, in days.
        #[arg(long, default_value_t = 3650, value_parser = clap::value_parser!(u32).range(1..=36500))]
        validity_days: u32,
    },
}

/// The EKs a machine may enrol with: the TCG default templates L-1 and L-2. (The
/// high-range P-384 EK's policy, a PolicyOR, is not satisfied by activation yet.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
enum EkKind {
    /// RSA-2048 EK, certificate at NV index 0x01C00002.
    #[value(name = "rsa2048")]
    #[serde(rename = "rsa2048")]
    Rsa2048,
    /// ECC NIST P-256 EK, certificate at NV index 0x01C0000A.
    EccP256,
}

#[derive(Subcommand)]
enum MarkerCommand {
    /// Print `bootstrapped` or `not-bootstrapped` on stdout (PCR 15 not all zero or zero).
    Status {
        /// The TPM, e.g. `swtpm:host=127.0.0.1,port=2321` or `device:/dev/tpmrm0`.
        #[arg(long)]
        tpm: String,
        /// Also say whether PCR 15 is what this cluster ID (64 hex digits) gives.
        #[arg(long)]
        cluster_id: Option<String>,
    },
    /// Mark the node as bootstrapped into a cluster: PCR_Event(15, cluster ID). Refuses a
    /// node that is marked already.
    Mark {
        /// The TPM, e.g. `swtpm:host=127.0.0.1,port=2321` or `device:/dev/tpmrm0`.
        #[arg(long)]
        tpm: String,
        /// The cluster ID, 64 hex digits.
        #[arg(long)]
        cluster_id: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    cli.log.init();
    asterism_binkit::logging::tool_exit(run(cli).map(|()| ExitCode::SUCCESS))
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::PlatformCa {
            command: PlatformCaCommand::Init { dir },
        } => ca::init(&dir),
        Command::Node(args) => node::provision(&args),
        Command::NodeMarker { command } => match command {
            MarkerCommand::Status { tpm, cluster_id } => {
                marker::status(&tpm, cluster_id.as_deref())
            }
            MarkerCommand::Mark { tpm, cluster_id } => marker::mark(&tpm, &cluster_id),
        },
        Command::Enroll { command } => match command {
            EnrollCommand::Request { tpm, ek, ak, out } => enroll::request(&tpm, ek, ak, &out),
            EnrollCommand::Challenge {
                request,
                ek_ca_dir,
                pending,
                out,
            } => enroll::challenge(&request, &ek_ca_dir, &pending, &out),
            EnrollCommand::Activate {
                tpm,
                challenge,
                out,
            } => enroll::activate(&tpm, &challenge, &out),
            EnrollCommand::Finish {
                pending,
                response,
                ca_dir,
                out,
                validity_days,
            } => enroll::finish(&pending, &response, &ca_dir, &out, validity_days),
        },
        Command::BootMeasurements {
            event_log,
            pcrs,
            out,
        } => boot::run(&event_log, &pcrs, &out),
    }
}

/// A progress line on stderr.
macro_rules! progress {
    ($($arg:tt)*) => {
        eprintln!("asterism-provision: {}", format_args!($($arg)*))
    };
}
pub(crate) use progress;

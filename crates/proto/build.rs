//! Generates the prost messages and tonic services from `proto/`.
//!
//! The .proto files are parsed by `protox` (pure Rust), so no system `protoc` is needed.

use std::path::Path;

/// Messages that carry secret material. Their `Debug` is written by hand in `lib.rs` so
/// that a stray `{:?}` never prints a key.
const SECRET_MESSAGES: &[&str] = &[
    "init.InitRequest",
    "join.IssueJoinTicketResponse",
    "join.IssueRejoinTicketResponse",
    "join.control_plane_cert_or_key",
    "kms.GetDataKeyResponse",
    "kms.GetControlPlaneIdentityResponse",
    "recoverproto.RecoverMessage",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = Path::new("proto");
    let files = [
        "components.proto",
        "init.proto",
        "join.proto",
        "kms.proto",
        "recover.proto",
        "verify.proto",
    ];
    for file in files {
        println!("cargo:rerun-if-changed={}", dir.join(file).display());
    }
    let fds = protox::compile(files, [dir])?;
    tonic_prost_build::configure()
        .skip_debug(SECRET_MESSAGES.iter().map(|m| format!(".{m}")))
        .compile_fds(fds)?;
    Ok(())
}

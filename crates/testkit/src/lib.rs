//! Test-only helpers for Asterism. Used as a dev-dependency only; never linked into a
//! program.
//!
//! * [`Swtpm`] runs a real TPM 2.0 emulator (swtpm) for one test: a private state directory,
//!   free loopback TCP ports, optionally an EK with a certificate, and clean-up on drop. It
//!   is a thin wrapper around the production launcher [`asterism_swtpm`], which
//!   programs use on persistent state directories.
//! * [`TpmNode`] is the set-up most TPM tests share: a swtpm, an issuer on it, and the
//!   fingerprint of its AK to pin ([`TpmNode::ak_trust`], [`pin`]).
//! * `kube_api` (feature `kube-api`) is a recording Kubernetes API server (HTTPS with a test CA on loopback,
//!   recorded responses, every request recorded), since no API server runs where tests run.
//! * [`cvm`] gives the real confidential-VM evidence of `asterism-attestation`'s test data
//!   in the forms tests elsewhere need (the Azure SEV-SNP HCL report, whole).
//! * `relay` (feature `tls-relay`) is a man in the middle that terminates TLS on both sides
//!   and copies the plaintext: what a relayed attested session looks like.
//! * `tls` (feature `tls`) is a TLS 1.3 client that trusts any server certificate (still
//!   checking the handshake signature), raw or as a tonic connector: a peer without evidence.
//! * [`luks`] asks the cryptsetup program itself about an image: does a key open it, its
//!   token, its UUID.
//! * [`metadata`] makes the local metadata service's instances.
//! * [`process`] runs a program under test: a free port, its standard error as it comes, a
//!   line or an exit waited for with a deadline.
//! * [`logs`] captures what the code under test logs.
//! * [`check_swtpm_installed`] explains what to install when swtpm is missing.
//!
//! What a package's tests alone need stays in its `tests/common`; what two packages need
//! lives here. One exception on purpose: `crates/tpm/tests/common` keeps a TPM structure
//! parser of its own, an oracle independent of the verifier's.
#![forbid(unsafe_code)]

#[cfg(feature = "cloud")]
pub mod cloud;
pub mod cvm;
#[cfg(feature = "kube-api")]
pub mod kube_api;
pub mod logs;
pub mod luks;
pub mod measurements;
pub mod metadata;
#[cfg(feature = "net")]
pub mod net;
pub mod process;
#[cfg(feature = "tls-relay")]
pub mod relay;
mod swtpm;
#[cfg(feature = "tls")]
pub mod tls;
#[cfg(feature = "tls-server")]
pub mod tls_server;
mod tpm_node;

pub use asterism_swtpm::{SwtpmError, check_swtpm_installed};
pub use swtpm::{Swtpm, SwtpmBuilder};
pub use tpm_node::{TpmNode, TpmNodeError, pin};

/// A URL query value, percent-decoded (`+` is a space), for the HTTP stand-ins.
#[cfg(any(feature = "cloud", feature = "kube-api"))]
fn percent_decode(s: &str) -> String {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'%' => {
                let hex: Vec<u8> = bytes.by_ref().take(2).collect();
                let decoded = std::str::from_utf8(&hex)
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                out.push(decoded.unwrap_or(b'?'));
            }
            b'+' => out.push(b' '),
            other => out.push(other),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

//! `asterism readmit <node>`: lets a member that comes back with another attestation key
//! (a replaced or re-provisioned TPM) receive its next join ticket. The join service refuses
//! such a node until an operator says so; this asks it over its admin socket, a Unix socket
//! only the service's user can open, on a control-plane node.

use anyhow::{Context, Result, bail};
use std::io::Write as _;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

/// Arguments of `asterism readmit`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The node (its metadata name, as `/v1/members` lists it).
    pub node: String,
    /// The join service's admin socket (its `--admin-socket`).
    #[arg(long, value_name = "PATH")]
    pub admin_socket: PathBuf,
}

/// Whether `name` is a DNS-1123 subdomain, as node names are (and nothing that could change
/// the request path).
fn is_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

/// Re-admits `args.node`; returns the member record as the join service answered it.
pub fn run(args: &Args) -> Result<serde_json::Value> {
    if !is_node_name(&args.node) {
        bail!("{:?} is no node name (a DNS-1123 subdomain)", args.node);
    }
    let mut s = UnixStream::connect(&args.admin_socket).with_context(|| {
        format!(
            "connecting to the join service's admin socket {}",
            args.admin_socket.display()
        )
    })?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "POST /v1/members/{}/readmit HTTP/1.1\r\nhost: localhost\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        args.node
    )?;
    let answer = asterism_binkit::fs::read_capped_from(s, 1 << 20)?
        .context("the join service's answer is larger than 1 MiB")?;
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("malformed answer from the join service")?;
    let status = head.lines().next().unwrap_or_default();
    if !status.starts_with("HTTP/1.1 200") {
        bail!("the join service refused: {status}: {}", body.trim());
    }
    serde_json::from_str(body).context("the join service's answer is no member record")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_node_names_are_sent() {
        for ok in ["worker-0", "cp-0.zone.example"] {
            assert!(is_node_name(ok), "{ok}");
        }
        for bad in ["", "Worker", "../x", "a/b", "a b", "-a", "a..b", "a?b"] {
            assert!(!is_node_name(bad), "{bad}");
        }
    }
}

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

/// Re-admits `args.node`; returns the member record as the join service answered it.
pub fn run(args: &Args) -> Result<serde_json::Value> {
    // A node name cannot change the request path.
    if !asterism_basics::is_node_name(&args.node) {
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
        // Refused before the socket is dialled: the socket here does not exist.
        for bad in ["", "Worker", "../x", "a/b", "a b", "-a", "a..b", "a?b"] {
            let args = Args {
                node: bad.into(),
                admin_socket: "/nonexistent/admin.sock".into(),
            };
            let err = run(&args).unwrap_err().to_string();
            assert!(err.contains("is no node name"), "{bad:?}: {err}");
        }
        let args = Args {
            node: "cp-0.zone.example".into(),
            admin_socket: "/nonexistent/admin.sock".into(),
        };
        let err = format!("{:#}", run(&args).unwrap_err());
        assert!(err.contains("connecting"), "{err}");
    }
}

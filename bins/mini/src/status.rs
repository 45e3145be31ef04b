//! What `asterism-mini` records of a cluster (`mini.json`) and shows of it: the node
//! table, each node's Kubernetes hand-over, and `status` (the table and the processes).

use anyhow::{Context, Result};
use asterism_cluster::{KubernetesHandover, NodeDir};
use serde::{Deserialize, Serialize};
use std::io::Write;

use crate::pids::{alive, pid_files};
use crate::{Node, StatusArgs, abs};

/// What `mini up` recorded about the cluster, in `<dir>/mini.json`.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct ClusterRecord {
    /// The cluster ID, hex.
    pub cluster_id: String,
    /// One entry per node.
    pub nodes: Vec<NodeRecord>,
}

/// The outcome for one node.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct NodeRecord {
    /// Node name.
    pub name: String,
    /// `ControlPlane` or `Worker`.
    pub role: String,
    /// Its address.
    pub ip: String,
    /// Who verified its evidence.
    pub attestation: String,
    /// Whether its disk opens with the derived key and not with the first-boot passphrase.
    pub disk_rekeyed: bool,
    /// Milliseconds from bootstrapper start to its exit.
    pub bootstrap_ms: u64,
    /// `ok` or the bootstrapper's exit status.
    pub exit: String,
    /// What its bootstrapper handed its Kubernetes driver (the node's
    /// `state/asterism/kubernetes.json`); `None` when the node recorded nothing (it did not
    /// get that far), and in a record of an older `mini`.
    #[serde(default)]
    pub kubernetes: Option<KubernetesHandover>,
}

/// The largest hand-over record read from a node directory.
pub(crate) const MAX_HANDOVER_LEN: u64 = 1 << 20;

/// The hand-over record of `node` (`state/asterism/kubernetes.json`, what its bootstrapper
/// handed its Kubernetes driver); `None` when it wrote none.
pub(crate) fn read_handover(node: &Node) -> Result<Option<KubernetesHandover>> {
    let path = NodeDir::new(&node.dir).kubernetes_handover();
    if !path.exists() {
        return Ok(None);
    }
    let bytes = asterism_binkit::fs::read_capped(&path, MAX_HANDOVER_LEN)?;
    let record =
        KubernetesHandover::from_json(&bytes).with_context(|| path.display().to_string())?;
    Ok(Some(record))
}

/// The table's KUBERNETES column: `v1.31.13, 9 components (none driver: not installed)`.
pub(crate) fn handover_summary(handover: &KubernetesHandover) -> String {
    let version = handover
        .kubernetes_version
        .map_or_else(|| "no version".to_owned(), |v| v.to_string());
    let count = handover.kubernetes_components.len();
    let noun = if count == 1 {
        "component"
    } else {
        "components"
    };
    let installed = if handover.driver == "none" {
        "none driver: not installed".to_owned()
    } else {
        format!("{} driver", handover.driver)
    };
    format!("{version}, {count} {noun} ({installed})")
}

pub(crate) fn member_verdict(members: &serde_json::Value, name: &str) -> String {
    let found = members
        .as_array()
        .or_else(|| members.get("members").and_then(|m| m.as_array()))
        .and_then(|list| {
            list.iter()
                .find(|m| m.get("name").and_then(|v| v.as_str()) == Some(name))
        });
    match found {
        Some(m) => {
            let ak = m.get("ak").and_then(|v| v.as_str()).unwrap_or("?");
            format!(
                "verified by join service (tpm-quote AK {})",
                ak.get(..12).unwrap_or(ak)
            )
        }
        None => "not admitted".to_string(),
    }
}

/// The node table: one line per node, its Kubernetes hand-over last.
#[must_use]
pub fn table(r: &ClusterRecord) -> String {
    let mut out = format!("cluster {}\n", r.cluster_id);
    out.push_str(&format!(
        "{:<16} {:<13} {:<52} {:<13} {:>9}  {:<6} KUBERNETES\n",
        "NODE", "ROLE", "ATTESTATION", "DISK RE-KEYED", "JOIN (ms)", "EXIT"
    ));
    for n in &r.nodes {
        let kubernetes = n
            .kubernetes
            .as_ref()
            .map_or_else(|| "- (nothing recorded)".to_owned(), handover_summary);
        out.push_str(&format!(
            "{:<16} {:<13} {:<52} {:<13} {:>9}  {:<6} {}\n",
            n.name,
            n.role,
            n.attestation,
            if n.disk_rekeyed { "yes" } else { "NO" },
            n.bootstrap_ms,
            n.exit,
            kubernetes
        ));
    }
    out
}

/// Prints the node table.
pub fn print_table(r: &ClusterRecord) {
    let _ = std::io::stdout().lock().write_all(table(r).as_bytes());
}

/// One process of the cluster, as `status --json` lists it.
#[derive(Serialize, Debug)]
pub(crate) struct ProcessStatus {
    /// Its pid file, relative to the cluster directory.
    pid_file: String,
    pid: u32,
    running: bool,
}

/// `asterism mini status`: the table (or, with `--json`, the record with every node's
/// components in full) and the cluster's processes.
pub fn status(args: StatusArgs) -> Result<()> {
    let dir = abs(&args.cluster.dir)?;
    let record: ClusterRecord = serde_json::from_slice(
        &std::fs::read(dir.join("mini.json"))
            .with_context(|| format!("no local cluster recorded in {}", dir.display()))?,
    )?;
    let processes: Vec<ProcessStatus> = pid_files(&dir)?
        .into_iter()
        .map(|(pid_file, pid)| ProcessStatus {
            pid_file,
            pid,
            running: alive(pid),
        })
        .collect();
    let mut out = std::io::stdout().lock();
    if args.json {
        let report = serde_json::json!({ "cluster": record, "processes": processes });
        writeln!(out, "{report:#}")?;
        return Ok(());
    }
    out.write_all(table(&record).as_bytes())?;
    for p in &processes {
        let state = if p.running { "running" } else { "stopped" };
        writeln!(out, "{:<40} pid {:<8} {state}", p.pid_file, p.pid)?;
    }
    Ok(())
}

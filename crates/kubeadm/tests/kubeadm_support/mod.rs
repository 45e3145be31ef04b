//! Helpers of the kubeadm and driver tests: the components tests' HTTP server and tarballs
//! (one file, included from asterism-components' tests), and the recording kubeadm stand-in
//! installed into a directory as `kubeadm` and `systemctl`.
#![allow(dead_code, unused_imports)]

use std::path::PathBuf;

#[path = "../../../components/tests/support/mod.rs"]
mod download;

pub use download::*;

/// A directory holding the recording stand-in as `kubeadm` and `systemctl`.
pub struct StandIn {
    pub dir: tempfile::TempDir,
}

impl StandIn {
    pub fn install() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let exe = env!("CARGO_BIN_EXE_asterism-kubeadm-stand-in");
        std::fs::copy(exe, dir.path().join("kubeadm")).unwrap();
        std::fs::copy(exe, dir.path().join("systemctl")).unwrap();
        std::fs::copy(exe, dir.path().join("ionice")).unwrap();
        Self { dir }
    }

    pub fn ionice(&self) -> PathBuf {
        self.dir.path().join("ionice")
    }

    pub fn kubeadm(&self) -> PathBuf {
        self.dir.path().join("kubeadm")
    }

    pub fn systemctl(&self) -> PathBuf {
        self.dir.path().join("systemctl")
    }

    /// Writes `stand-in.json`.
    pub fn settings(&self, json: serde_json::Value) {
        std::fs::write(self.dir.path().join("stand-in.json"), json.to_string()).unwrap();
    }

    /// The recorded calls, in order.
    pub fn calls(&self) -> Vec<serde_json::Value> {
        let Ok(text) = std::fs::read_to_string(self.dir.path().join("calls.jsonl")) else {
            return Vec::new();
        };
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The argument lists of the recorded calls.
    pub fn argv(&self) -> Vec<String> {
        self.calls()
            .iter()
            .map(|c| {
                let args: Vec<&str> = c["args"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|a| a.as_str().unwrap())
                    .collect();
                format!("{} {}", c["program"].as_str().unwrap(), args.join(" "))
            })
            .collect()
    }
}

//! Provisioning a local cluster: its directory, the platform CA, each node's TPM and
//! attestation files, and the init secret.

use crate::process::{os, run_logged};
use crate::{abs, step};
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};

pub(crate) fn random_init_secret() -> Result<String> {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 24];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| anyhow::anyhow!("the system random generator failed"))?;
    Ok(hex::encode(bytes))
}

/// Checks that the binaries `programs` are in `bins` and swtpm is installed, then creates
/// the cluster directory (it must not exist) with `run/` and `log/`. Returns it, absolute.
pub(crate) fn create_cluster_dir(dir: &Path, bins: &Path, programs: &[&str]) -> Result<PathBuf> {
    for name in programs {
        let path = bins.join(name);
        if !path.is_file() {
            bail!(
                "{} is missing; build everything first: cargo build --workspace (or pass --bin-dir)",
                path.display()
            );
        }
    }
    asterism_swtpm::check_swtpm_installed(true).context("swtpm is needed for local clusters")?;
    if dir.exists() {
        bail!(
            "{} already exists: run `asterism mini down --dir {0}` and remove it, or choose another --dir",
            dir.display()
        );
    }
    std::fs::create_dir_all(dir)?;
    let dir = abs(dir)?;
    std::fs::create_dir_all(dir.join("run"))?;
    std::fs::create_dir_all(dir.join("log"))?;
    Ok(dir)
}

/// The name of node `i` (`control-plane-0` first, then `worker-0`, …) and whether it is
/// the control plane.
pub(crate) fn node_name(i: usize) -> (String, bool) {
    match i.checked_sub(1) {
        None => ("control-plane-0".to_string(), true),
        Some(w) => (format!("worker-{w}"), false),
    }
}

/// Creates the local platform CA in `<dir>/platform-ca`: what a cloud provider uses to
/// vouch for its (v)TPMs.
pub(crate) fn create_platform_ca(provision: &Path, dir: &Path) -> Result<PathBuf> {
    step("creating the local platform CA");
    let ca_dir = dir.join("platform-ca");
    run_logged(
        provision,
        &os(&[&"platform-ca", &"init", &"--dir", &ca_dir]),
        &dir.join("log/provision.log"),
    )?;
    Ok(ca_dir)
}

/// Creates the directory of node `name` and provisions its TPM state: EK with its
/// certificate, an AK certified by the platform CA. Returns the directory.
pub(crate) fn provision_node(
    provision: &Path,
    ca_dir: &Path,
    dir: &Path,
    name: &str,
) -> Result<PathBuf> {
    let ndir = dir.join("nodes").join(name);
    for sub in ["tpm", "attestation", "state", "run", "log"] {
        std::fs::create_dir_all(ndir.join(sub))?;
    }
    step(format!(
        "provisioning {name}: swtpm with EK, AK certified by the platform CA"
    ));
    run_logged(
        provision,
        &os(&[
            &"node",
            &"--state-dir",
            &ndir.join("tpm"),
            &"--ca-dir",
            &ca_dir,
            &"--out",
            &asterism_cluster::NodeDir::new(&ndir).attestation(),
        ]),
        &ndir.join("log/provision.log"),
    )?;
    Ok(ndir)
}

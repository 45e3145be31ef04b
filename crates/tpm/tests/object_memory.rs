//! Transient-object exhaustion (TPM_RC_OBJECT_MEMORY) is recovered from: the transient
//! objects are flushed and the command is sent again.
//!
//! swtpm has no resource manager, so objects another client left loaded stay loaded. This
//! test fills every transient slot with `tpm2_createprimary` (tpm2-tools) and then creates
//! the AK, which needs a slot.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::process::Command;

use asterism_testkit::Swtpm;
use asterism_tpm::{AkConfig, Tpm};

fn tpm2_tool(swtpm: &Swtpm, args: &[&str]) -> Option<String> {
    let output = match Command::new(args[0])
        .args(&args[1..])
        .args(["-T", &swtpm.tcti()])
        .output()
    {
        Ok(output) => output,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return None,
        Err(error) => panic!("running {}: {error}", args[0]),
    };
    assert!(
        output.status.success(),
        "{} failed: {}",
        args[0],
        String::from_utf8_lossy(&output.stderr)
    );
    Some(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[test]
fn ak_creation_recovers_from_object_memory_exhaustion() {
    let swtpm = Swtpm::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    // Fill the transient slots (swtpm has 3) with objects nobody will flush.
    for n in 0..3 {
        let context = dir.path().join(format!("primary{n}.ctx"));
        let created = tpm2_tool(
            &swtpm,
            &[
                "tpm2_createprimary",
                "-C",
                "o",
                "-G",
                "ecc",
                "-c",
                context.to_str().unwrap(),
            ],
        );
        if created.is_none() {
            eprintln!("tpm2-tools not installed; skipping the TPM_RC_OBJECT_MEMORY test");
            return;
        }
    }
    let transient = tpm2_tool(&swtpm, &["tpm2_getcap", "handles-transient"]).unwrap();
    assert_eq!(transient.lines().count(), 3, "slots not full: {transient}");

    let mut tpm = Tpm::open(&swtpm.config()).unwrap();
    let ak = tpm.load_attestation_key(&AkConfig::default()).unwrap();
    assert!(ak.was_created());
}

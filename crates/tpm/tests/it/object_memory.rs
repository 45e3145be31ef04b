//! Transient-object exhaustion (TPM_RC_OBJECT_MEMORY) is recovered from: the transient
//! objects are flushed and the command is sent again.
//!
//! swtpm has no resource manager, so objects another client left loaded stay loaded. This
//! test fills every transient slot with `tpm2_createprimary` (tpm2-tools) and then creates
//! the AK, which needs a slot.

use std::process::Command;

use asterism_testkit::Swtpm;
use asterism_tpm::{AkConfig, Tpm};

/// Runs a tpm2-tools program against `swtpm`: `None` when tpm2-tools is not installed,
/// otherwise whether it succeeded and what it printed (stdout, stderr).
fn tpm2_tool(swtpm: &Swtpm, args: &[&str]) -> Option<(bool, String, String)> {
    let output = match asterism_children::output(
        Command::new(args[0])
            .args(&args[1..])
            .args(["-T", &swtpm.tcti()]),
    ) {
        Ok(output) => output,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return None,
        Err(error) => panic!("running {}: {error}", args[0]),
    };
    Some((
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    ))
}

#[test]
fn ak_creation_recovers_from_object_memory_exhaustion() {
    let swtpm = Swtpm::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    // Fill the transient slots with objects nobody will flush, until the TPM refuses.
    let mut loaded = 0;
    for n in 0..32 {
        let context = dir.path().join(format!("primary{n}.ctx"));
        let Some((ok, _, stderr)) = tpm2_tool(
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
        ) else {
            eprintln!("tpm2-tools not installed; skipping the TPM_RC_OBJECT_MEMORY test");
            return;
        };
        if !ok {
            assert!(
                stderr.contains("0x902"),
                "expected TPM_RC_OBJECT_MEMORY: {stderr}"
            );
            break;
        }
        loaded += 1;
    }
    assert!(loaded > 0 && loaded < 32, "{loaded} objects loaded");
    let (_, transient, _) = tpm2_tool(&swtpm, &["tpm2_getcap", "handles-transient"]).unwrap();
    assert_eq!(transient.lines().count(), loaded, "{transient}");

    // Creating the AK needs a slot: the crate flushes and retries.
    let mut tpm = Tpm::open(&swtpm.config()).unwrap();
    let ak = tpm.load_attestation_key(&AkConfig::default()).unwrap();
    assert!(ak.was_created());
}

//! A node whose TPM is reset without `TPM2_Shutdown` (a power cut, a crash) again and again
//! still quotes with its AK.
//!
//! A TPM counts a reset without an orderly shutdown as an authorisation failure when a
//! dictionary-attack-protected object was used since the last start-up; swtpm's defaults
//! lock such objects out after 3 failures, for about 1,000 s. The AK is created with noDA,
//! so it never locks out. The swtpm here is killed with SIGKILL each time: no shutdown of
//! any kind reaches the TPM.

use std::time::{Duration, Instant};

use asterism_swtpm::{SwtpmConfig, SwtpmProcess};
use asterism_tpm::{AkConfig, PcrSelection, Tpm};

/// More unclean resets than swtpm's default `maxTries` (3).
const RESETS: usize = 6;

fn kill_hard(pid: u32) {
    let status = asterism_children::status(
        std::process::Command::new("kill").args(["-KILL", &pid.to_string()]),
    )
    .unwrap();
    assert!(status.success());
    let start = Instant::now();
    while std::path::Path::new(&format!("/proc/{pid}")).exists()
        && std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
    {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "swtpm {pid} survived SIGKILL"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn the_ak_still_quotes_after_repeated_unclean_resets() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let state = root.join("state");
    std::fs::create_dir(&state).unwrap();
    let config = SwtpmConfig::new(&state)
        .unwrap()
        .with_run_dir(&root)
        .unwrap();
    let mut swtpm = SwtpmProcess::start(&config).unwrap();
    for round in 0..=RESETS {
        let mut tpm = Tpm::open(&swtpm.tcti().parse().unwrap()).unwrap();
        let ak = tpm.load_attestation_key(&AkConfig::default()).unwrap();
        assert_eq!(ak.was_created(), round == 0, "the same AK every time");
        let quoted = tpm.quote(&ak, &[round as u8; 32], &PcrSelection::all());
        if let Err(e) = quoted {
            panic!("after {round} unclean resets the AK cannot quote: {e:?}");
        }
        drop(tpm);
        // A power cut: the process dies, the TPM never hears of it.
        kill_hard(swtpm.pid());
        drop(swtpm);
        swtpm = SwtpmProcess::start(&config).unwrap();
    }
}

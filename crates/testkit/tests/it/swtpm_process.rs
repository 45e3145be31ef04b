//! The production swtpm launcher (`asterism_swtpm`): persistent state directories,
//! chosen ports, detached processes found again by their pid and port files, TPM resets.

use std::fs;
use std::net::{TcpListener, TcpStream};

use asterism_swtpm::{
    ManufactureOptions, PcrBank, STATE_FILE, SwtpmConfig, SwtpmError, SwtpmProcess, has_tpm_state,
    manufacture,
};
use asterism_tpm::{AkConfig, EkCertSlot, PcrSelection, Tpm};

/// A temporary directory with an empty `state/` in it.
fn state_dir() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    fs::create_dir(&state).unwrap();
    (dir, state)
}

/// A port P with P and P + 1 free a moment ago.
fn free_pair() -> u16 {
    loop {
        let first = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = first.local_addr().unwrap().port();
        if port < u16::MAX - 1 && TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            return port;
        }
    }
}

/// Whether `pid` runs (an exited process that nobody has reaped yet has no command line).
fn alive(pid: u32) -> bool {
    fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| !cmdline.is_empty())
}

fn pcr(tpm: &mut Tpm, index: u32) -> [u8; 32] {
    tpm.read_pcrs(&PcrSelection::new([index]).unwrap()).unwrap()[0].1
}

#[test]
fn starts_on_an_existing_state_dir_with_a_chosen_port_and_cleans_its_files_on_stop() {
    let (_dir, state) = state_dir();
    let port = free_pair();
    let config = SwtpmConfig::new(&state).unwrap().with_port(port).unwrap();
    let swtpm = SwtpmProcess::start(&config).unwrap();
    assert_eq!(swtpm.port(), port);
    assert!(!swtpm.is_detached());
    assert_eq!(swtpm.tcti(), format!("swtpm:host=127.0.0.1,port={port}"));
    let pid: u32 = fs::read_to_string(config.pid_file())
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(pid, swtpm.pid());
    assert_eq!(
        fs::read_to_string(config.port_file()).unwrap().trim(),
        port.to_string()
    );
    Tpm::open(&swtpm.tcti().parse().unwrap()).unwrap();

    swtpm.stop().unwrap();
    assert!(!config.pid_file().exists());
    assert!(!config.port_file().exists());
    assert!(TcpStream::connect(("127.0.0.1", port + 1)).is_err());
    // The state stays: it is the node's TPM.
    assert!(state.join(STATE_FILE).is_file());
}

#[test]
fn a_chosen_port_in_use_fails_without_trying_another() {
    let (_dir, state) = state_dir();
    let taken = TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let port = taken.local_addr().unwrap().port();
    let config = SwtpmConfig::new(&state).unwrap().with_port(port).unwrap();
    match SwtpmProcess::start(&config) {
        Err(SwtpmError::Start { attempts, .. }) => assert_eq!(attempts, 1),
        other => panic!("expected a start failure, got {other:?}"),
    }
}

#[test]
fn a_detached_swtpm_outlives_its_handle_and_is_found_and_stopped_by_attach() {
    let (dir, state) = state_dir();
    let run = dir.path().join("run");
    fs::create_dir(&run).unwrap();
    let config = SwtpmConfig::new(&state)
        .unwrap()
        .with_run_dir(&run)
        .unwrap()
        .with_log_file(dir.path().join("swtpm.log"))
        .unwrap();
    let started = SwtpmProcess::start_detached(&config).unwrap();
    let (pid, port) = (started.pid(), started.port());
    assert!(started.is_detached());
    drop(started);

    // Still running: another handle (as another process would) finds it and uses it.
    let mut found = SwtpmProcess::attach(&config).unwrap();
    assert_eq!((found.pid(), found.port()), (pid, port));
    assert!(found.is_running());
    let mut tpm = Tpm::open(&found.tcti().parse().unwrap()).unwrap();
    tpm.extend_pcr(4, &[7; 32]).unwrap();
    drop(tpm);

    // A second swtpm on the same state directory is refused, supervised or detached.
    for result in [
        SwtpmProcess::start(&config),
        SwtpmProcess::start_detached(&config),
    ] {
        match result {
            Err(SwtpmError::AlreadyRunning { pid: running, .. }) => assert_eq!(running, pid),
            other => panic!("expected AlreadyRunning, got {other:?}"),
        }
    }

    // A restart keeps it detached and resets the PCRs.
    found.restart().unwrap();
    assert!(found.is_detached());
    let mut tpm = Tpm::open(&found.tcti().parse().unwrap()).unwrap();
    assert_eq!(pcr(&mut tpm, 4), [0; 32]);
    drop(tpm);
    let restarted = found.pid();
    assert_ne!(restarted, pid);

    SwtpmProcess::attach(&config).unwrap().stop().unwrap();
    assert!(!alive(restarted), "swtpm {restarted} still runs");
    assert!(matches!(
        SwtpmProcess::attach(&config),
        Err(SwtpmError::NotRunning { .. })
    ));
    assert!(fs::read_to_string(dir.path().join("swtpm.log")).is_ok());
}

#[test]
fn a_restart_resets_the_pcrs_but_keeps_the_ak_and_the_ek_certificate() {
    let (dir, state) = state_dir();
    let options = ManufactureOptions::new(dir.path().join("ek-ca")).unwrap();
    manufacture(&state, &options).unwrap();
    assert!(has_tpm_state(&state));
    assert!(dir.path().join("ek-ca/issuercert.pem").is_file());

    let mut swtpm = SwtpmProcess::start(&SwtpmConfig::new(&state).unwrap()).unwrap();
    let mut tpm = Tpm::open(&swtpm.tcti().parse().unwrap()).unwrap();
    let ak = tpm.load_attestation_key(&AkConfig::default()).unwrap();
    assert!(ak.was_created());
    tpm.pcr_event(15, b"cluster").unwrap();
    assert_ne!(pcr(&mut tpm, 15), [0; 32]);
    drop(tpm);

    swtpm.restart().unwrap();
    let mut tpm = Tpm::open(&swtpm.tcti().parse().unwrap()).unwrap();
    assert_eq!(pcr(&mut tpm, 15), [0; 32], "a restart is a TPM reset");
    let again = tpm.load_attestation_key(&AkConfig::default()).unwrap();
    assert!(!again.was_created(), "the persistent AK survives");
    assert_eq!(again.public_area(), ak.public_area());
    assert!(
        tpm.read_ek_certificate(EkCertSlot::Rsa2048)
            .unwrap()
            .is_some()
    );
}

#[test]
fn manufacture_refuses_a_directory_that_already_holds_a_tpm() {
    let (dir, state) = state_dir();
    let options = ManufactureOptions::new(dir.path().join("ek-ca"))
        .unwrap()
        .with_pcr_banks([PcrBank::Sha256])
        .unwrap();
    manufacture(&state, &options).unwrap();
    let before = fs::read(state.join(STATE_FILE)).unwrap();
    assert!(matches!(
        manufacture(&state, &options),
        Err(SwtpmError::AlreadyManufactured { .. })
    ));
    assert_eq!(fs::read(state.join(STATE_FILE)).unwrap(), before);
}

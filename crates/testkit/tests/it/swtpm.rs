//! The swtpm launcher: it starts a TPM that answers, restarts it on the same state, and
//! cleans up after itself.

use std::net::TcpStream;

use asterism_testkit::{Swtpm, check_swtpm_installed};
use asterism_tpm::TpmConfig;

#[test]
fn swtpm_is_installed() {
    check_swtpm_installed(true).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn started_swtpm_listens_and_names_itself_in_its_tcti() {
    let swtpm = Swtpm::start().unwrap();
    assert!(swtpm.state_dir().is_absolute());
    let config: TpmConfig = swtpm.tcti().parse().unwrap();
    assert_eq!(config, swtpm.config());
    assert_eq!(
        swtpm.tcti(),
        format!("swtpm:host=127.0.0.1,port={}", swtpm.port())
    );
    TcpStream::connect(("127.0.0.1", swtpm.port())).unwrap();
    TcpStream::connect(("127.0.0.1", swtpm.port() + 1)).unwrap();
}

#[test]
fn restart_keeps_the_state_directory() {
    let mut swtpm = Swtpm::builder().with_ek_cert(true).start().unwrap();
    let state = swtpm.state_dir().to_owned();
    let files_before = std::fs::read_dir(&state).unwrap().count();
    swtpm.restart().unwrap();
    assert_eq!(swtpm.state_dir(), state);
    assert!(std::fs::read_dir(&state).unwrap().count() >= files_before);
    TcpStream::connect(("127.0.0.1", swtpm.port())).unwrap();
}

#[test]
fn stop_and_drop_remove_the_state_directory() {
    let swtpm = Swtpm::start().unwrap();
    let state = swtpm.state_dir().to_owned();
    swtpm.stop().unwrap();
    assert!(!state.exists());

    let swtpm = Swtpm::start().unwrap();
    let state = swtpm.state_dir().to_owned();
    let port = swtpm.port();
    drop(swtpm);
    assert!(!state.exists());
    assert!(TcpStream::connect(("127.0.0.1", port + 1)).is_err());
}

#[test]
fn parallel_swtpms_get_distinct_ports() {
    let swtpms: Vec<Swtpm> = (0..4).map(|_| Swtpm::start().unwrap()).collect();
    let mut ports: Vec<u16> = swtpms.iter().map(Swtpm::port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 4);
}

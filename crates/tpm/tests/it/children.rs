//! A child started while a TPM command is in flight does not stop the swtpm.
//!
//! The TSS opens a socket for each command to swtpm, without close-on-exec, and swtpm serves
//! one connection at a time until its client closes it. A child that inherits the socket
//! keeps it open for its whole life, and every later command on that swtpm waits for the
//! child to exit. `asterism_children` starts every child with only its standard streams;
//! this test starts long-lived children (`sleep`) while another thread reads the TPM without
//! pause, then reads it again while they live. (Started with `Command::spawn` instead, the
//! children hold the connection and the test fails.)

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use asterism_testkit::Swtpm;
use asterism_tpm::{PcrSelection, Tpm};

/// How many children are started while the TPM is read.
const CHILDREN: usize = 40;

#[test]
fn children_started_while_the_tpm_is_read_do_not_hold_its_connection() {
    let swtpm = Swtpm::start().unwrap();
    let config = swtpm.config();
    let stop = Arc::new(AtomicBool::new(false));
    let (done_tx, done) = std::sync::mpsc::channel();
    {
        let (config, stop) = (config.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut tpm = Tpm::open(&config).unwrap();
            let mut reads = 0u32;
            while !stop.load(Ordering::SeqCst) {
                tpm.read_pcrs(&PcrSelection::all()).unwrap();
                reads += 1;
            }
            let _ = done_tx.send(reads);
        });
    }
    let mut children: Vec<Child> = Vec::new();
    for _ in 0..CHILDREN {
        let mut sleep = Command::new("sleep");
        sleep.arg("120").stdin(Stdio::null());
        children.push(asterism_children::spawn(&mut sleep).unwrap());
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::SeqCst);
    // The reader's last command, and then a fresh read on a thread of its own: a stopped
    // swtpm fails the test instead of hanging it.
    let reads = done.recv_timeout(Duration::from_secs(20));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let read = Tpm::open(&config).and_then(|mut tpm| tpm.read_pcrs(&PcrSelection::all()));
        let _ = tx.send(read.is_ok());
    });
    let answered = rx.recv_timeout(Duration::from_secs(20));
    for child in &mut children {
        let _ = child.kill();
        let _ = child.wait();
    }
    let reads = reads.expect("the reader's command did not finish while the children lived");
    assert!(reads > 0, "the TPM was read while the children started");
    assert_eq!(
        answered,
        Ok(true),
        "swtpm did not answer while the children lived: one holds its connection"
    );
}

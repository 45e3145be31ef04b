//! The request against a stand-in for the kernel. configfs-tsm needs a confidential VM, so a
//! plain directory laid out as `Documentation/ABI/testing/configfs-tsm` documents it plays
//! the kernel's part: when an entry is made, the stand-in creates its attributes (configfs
//! does so with the directory), `outblob` as a FIFO, so that reading it blocks like the
//! kernel generating the report; a thread per entry then reads `inblob` (and `privlevel`),
//! writes `auxblob` and `generation` and answers the report through the FIFO. When the
//! entry is removed, the stand-in removes its attributes (configfs does so with `rmdir`).

use std::fs;
use std::io::Write as _;
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use super::*;

struct StandIn {
    provider: &'static str,
    auxblob: Option<Vec<u8>>,
    /// Replaces the report, for size tests.
    outblob: Option<Vec<u8>>,
    /// How many of the first entries another writer races.
    raced_entries: u32,
    entries: AtomicU32,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl StandIn {
    fn new(provider: &'static str) -> Self {
        Self {
            provider,
            auxblob: None,
            outblob: None,
            raced_entries: 0,
            entries: AtomicU32::new(0),
            threads: Mutex::new(Vec::new()),
        }
    }
}

impl Entries for StandIn {
    fn created(&self, entry: &Path) -> io::Result<()> {
        let number = self.entries.fetch_add(1, Ordering::SeqCst) + 1;
        fs::write(entry.join("provider"), format!("{}\n", self.provider))?;
        fs::write(entry.join("generation"), "0\n")?;
        fs::write(entry.join("privlevel_floor"), "0\n")?;
        let status = asterism_children::status(Command::new("mkfifo").arg(entry.join("outblob")))?;
        assert!(status.success(), "mkfifo failed");

        let entry = entry.to_owned();
        let raced = number <= self.raced_entries;
        let auxblob = self.auxblob.clone();
        let outblob = self.outblob.clone();
        let thread = std::thread::spawn(move || {
            // Blocks until the request opens outblob, after it wrote inblob.
            let mut fifo = fs::OpenOptions::new()
                .write(true)
                .open(entry.join("outblob"))
                .unwrap();
            let inblob = fs::read(entry.join("inblob")).unwrap();
            assert_eq!(inblob.len(), INBLOB_SIZE);
            let privlevel = fs::read_to_string(entry.join("privlevel")).ok();
            let mut writes = 1 + u32::from(privlevel.is_some());
            let mut report = match &privlevel {
                Some(level) => format!("report:{}:", level.trim()).into_bytes(),
                None => b"report:".to_vec(),
            };
            if raced {
                // Another writer put its own report data in between.
                writes += 1;
                report = b"someone else's report".to_vec();
            } else {
                report.extend_from_slice(&inblob);
            }
            if let Some(aux) = auxblob {
                fs::write(entry.join("auxblob"), aux).unwrap();
            }
            fs::write(entry.join("generation"), format!("{writes}\n")).unwrap();
            // The reader may stop early (a report over the limit): ignore a broken pipe.
            let _ = fifo.write_all(&outblob.unwrap_or(report));
        });
        self.threads.lock().unwrap().push(thread);
        Ok(())
    }

    fn removing(&self, entry: &Path) -> io::Result<()> {
        for file in fs::read_dir(entry)? {
            fs::remove_file(file?.path())?;
        }
        Ok(())
    }
}

fn report_data() -> [u8; INBLOB_SIZE] {
    std::array::from_fn(|i| u8::try_from(i).unwrap())
}

fn expected_report(prefix: &[u8]) -> Vec<u8> {
    let mut out = prefix.to_vec();
    out.extend_from_slice(&report_data());
    out
}

fn is_empty(dir: &Path) -> bool {
    fs::read_dir(dir).unwrap().next().is_none()
}

/// A certificate table with one VCEK, as a `sev_guest` auxblob.
fn cert_table() -> Vec<u8> {
    let mut t = CertKind::Vcek.guid().to_vec();
    t.extend_from_slice(&48u32.to_le_bytes());
    t.extend_from_slice(&4u32.to_le_bytes());
    t.extend_from_slice(&[0; 24]);
    t.extend_from_slice(b"vcek");
    t
}

#[test]
fn returns_the_snp_report_and_certificates_and_removes_the_entry() {
    let root = tempfile::tempdir().unwrap();
    let kernel = StandIn {
        auxblob: Some(cert_table()),
        ..StandIn::new("sev_guest")
    };
    let tsm = ConfigfsTsm::new(root.path()).with_privlevel(1).unwrap();
    let report = tsm.report_with(&report_data(), &kernel).unwrap();
    assert_eq!(report.provider, Provider::SevGuest);
    assert_eq!(report.outblob, expected_report(b"report:1:"));
    let certs = parse_snp_cert_table(&report.auxblob.unwrap()).unwrap();
    assert_eq!(certs, vec![(CertKind::Vcek, b"vcek".to_vec())]);
    assert_eq!(kernel.entries.load(Ordering::SeqCst), 1);
    assert!(is_empty(root.path()), "the entry was not removed");
}

#[test]
fn a_provider_without_auxblob_gives_none() {
    let root = tempfile::tempdir().unwrap();
    let kernel = StandIn::new("tdx_guest");
    let report = ConfigfsTsm::new(root.path())
        .report_with(&report_data(), &kernel)
        .unwrap();
    assert_eq!(report.provider, Provider::TdxGuest);
    assert_eq!(report.outblob, expected_report(b"report:"));
    assert_eq!(report.auxblob, None);
    assert!(is_empty(root.path()));
}

#[test]
fn a_racing_writer_is_detected_by_generation_and_the_request_made_again() {
    let root = tempfile::tempdir().unwrap();
    let kernel = StandIn {
        raced_entries: 1,
        ..StandIn::new("sev_guest")
    };
    let report = ConfigfsTsm::new(root.path())
        .report_with(&report_data(), &kernel)
        .unwrap();
    // Not the report the other writer's data produced.
    assert_eq!(report.outblob, expected_report(b"report:"));
    assert_eq!(kernel.entries.load(Ordering::SeqCst), 2);
    assert!(is_empty(root.path()));
}

#[test]
fn gives_up_when_every_entry_is_raced() {
    let root = tempfile::tempdir().unwrap();
    let kernel = StandIn {
        raced_entries: u32::MAX,
        ..StandIn::new("sev_guest")
    };
    let err = ConfigfsTsm::new(root.path())
        .report_with(&report_data(), &kernel)
        .unwrap_err();
    assert!(
        matches!(err, TsmError::Raced { attempts: ATTEMPTS }),
        "{err:?}"
    );
    assert_eq!(kernel.entries.load(Ordering::SeqCst), ATTEMPTS);
    assert!(is_empty(root.path()));
}

#[test]
fn a_missing_root_means_no_configfs_tsm() {
    let root = tempfile::tempdir().unwrap();
    let missing = root.path().join("tsm/report");
    let err = ConfigfsTsm::new(&missing)
        .report(&report_data())
        .unwrap_err();
    assert!(matches!(&err, TsmError::NotAvailable { root } if *root == missing));
    let text = err.to_string();
    assert!(text.contains("no configfs-tsm at"), "{text}");
    assert!(text.contains("not a confidential VM"), "{text}");
}

#[test]
fn refuses_a_report_over_the_limit_and_an_empty_one_naming_outblob() {
    let root = tempfile::tempdir().unwrap();
    let kernel = StandIn {
        outblob: Some(vec![1; MAX_OUTBLOB + 1]),
        ..StandIn::new("tdx_guest")
    };
    let err = ConfigfsTsm::new(root.path())
        .report_with(&report_data(), &kernel)
        .unwrap_err();
    assert!(
        matches!(&err, TsmError::TooLarge { path, max: MAX_OUTBLOB } if path.ends_with("outblob")),
        "{err:?}"
    );
    assert!(is_empty(root.path()));

    let kernel = StandIn {
        outblob: Some(Vec::new()),
        ..StandIn::new("tdx_guest")
    };
    let err = ConfigfsTsm::new(root.path())
        .report_with(&report_data(), &kernel)
        .unwrap_err();
    assert!(
        matches!(&err, TsmError::Invalid { path, .. } if path.ends_with("outblob")),
        "{err:?}"
    );
}

#[test]
fn a_report_at_the_limit_is_read_whole() {
    let root = tempfile::tempdir().unwrap();
    let kernel = StandIn {
        outblob: Some(vec![7; MAX_OUTBLOB]),
        ..StandIn::new("tdx_guest")
    };
    let report = ConfigfsTsm::new(root.path())
        .report_with(&report_data(), &kernel)
        .unwrap();
    assert_eq!(report.outblob.len(), MAX_OUTBLOB);
}

#[test]
fn refuses_a_privilege_level_above_three_and_defaults_to_the_kernel_root() {
    assert!(matches!(
        ConfigfsTsm::default().with_privlevel(4),
        Err(TsmError::PrivlevelOutOfRange { level: 4 })
    ));
    assert_eq!(ConfigfsTsm::default().root(), Path::new(DEFAULT_ROOT));
}

//! `asterism-provision` as real processes: a platform CA, provisioned nodes whose quotes a
//! `TpmQuoteValidator` accepts with exactly the written files (and rejects with another CA
//! or changed PCRs), refusal to overwrite, and the PCR 15 node marker seen from separate
//! processes until the TPM resets. `enroll` (credential activation before a machine's AK is
//! certified) is tested in the `enroll` module.

#![cfg(test)] // all of it test code: clippy.toml's test allowances cover its helpers too

use std::fs;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use asterism_attestation::{
    AkFingerprint, AkTrust, Issuer, MeasurementMode, Measurements, PcrIndex, PlatformCa,
    ReportData, TpmQuoteValidator, ValidationError, Validator,
};
use asterism_swtpm::{SwtpmConfig, SwtpmProcess};
use asterism_tpm::marker::{expected_marker_pcr, read_marker_pcr};
use asterism_tpm::{AkAlgorithm, AkConfig, PcrSelection, Tpm, TpmIssuer};

mod enroll;

/// The upstream `HKDFClusterID` test vector's output (a cluster ID) and its PCR 15.
const CLUSTER_ID: &str = "128c164378fe8767f998fbdfe4b4d6463ec5ae1b664ea5999bc27417607ae9b6";
const MARKED_PCR15: &str = "23400370357e846478cce7cc0c76cdfe4da077cc57b36dee0f665ede2c8b3f2f";

/// What a finished process left.
struct Run {
    success: bool,
    stdout: String,
    stderr: String,
}

/// Runs `asterism-provision args…`, killing it after a minute.
fn provision(args: &[&str]) -> Run {
    let mut child = asterism_children::spawn(
        Command::new(env!("CARGO_BIN_EXE_asterism-provision"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("asterism-provision {args:?} did not finish within a minute");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stdout = String::new();
    let mut stderr = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    Run {
        success: status.success(),
        stdout,
        stderr,
    }
}

fn ok(args: &[&str]) -> Run {
    let run = provision(args);
    assert!(
        run.success,
        "asterism-provision {args:?} failed:\n{}",
        run.stderr
    );
    run
}

fn fails(args: &[&str]) -> String {
    let run = provision(args);
    assert!(!run.success, "asterism-provision {args:?} succeeded");
    run.stderr
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// A platform CA and one provisioned node in a temporary directory.
struct Provisioned {
    _dir: tempfile::TempDir,
    root: PathBuf,
    ca: PathBuf,
    state: PathBuf,
    out: PathBuf,
}

fn provisioned(ak: &str) -> Provisioned {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_owned();
    let ca = root.join("ca");
    let state = root.join("nodes/n1/tpm");
    let out = root.join("nodes/n1/attestation");
    ok(&["platform-ca", "init", "--dir", s(&ca)]);
    let run = ok(&[
        "node",
        "--state-dir",
        s(&state),
        "--ca-dir",
        s(&ca),
        "--ak",
        ak,
        "--out",
        s(&out),
    ]);
    assert!(run.stderr.contains("self-check passed"), "{}", run.stderr);
    assert!(run.stdout.is_empty(), "progress goes to stderr");
    Provisioned {
        _dir: dir,
        root,
        ca,
        state,
        out,
    }
}

impl Provisioned {
    fn file(&self, name: &str) -> Vec<u8> {
        fs::read(self.out.join(name)).unwrap()
    }

    /// Starts swtpm on the provisioned state directory, as the node's machine would boot.
    fn boot(&self) -> SwtpmProcess {
        SwtpmProcess::start(&SwtpmConfig::new(&self.state).unwrap()).unwrap()
    }

    fn validator(&self, ca_pem: &[u8]) -> TpmQuoteValidator {
        let measurements = Measurements::load(&self.out.join("measurements.json")).unwrap();
        TpmQuoteValidator::new(
            AkTrust::platform_ca(PlatformCa::from_pem(ca_pem).unwrap()),
            measurements.into_provider(),
        )
    }

    /// Evidence from the node's TPM over `report_data`, carrying the written AK certificate;
    /// checks on the way that the AK is the persisted one of `ak-public.bin`.
    fn evidence(
        &self,
        swtpm: &SwtpmProcess,
        algorithm: AkAlgorithm,
        report: &ReportData,
    ) -> Vec<u8> {
        let mut tpm = Tpm::open(&swtpm.tcti().parse().unwrap()).unwrap();
        let ak_config = AkConfig::new(algorithm);
        let ak = tpm.load_attestation_key(&ak_config).unwrap();
        assert!(!ak.was_created(), "the AK must be the persisted one");
        assert_eq!(ak.public_area(), self.file("ak-public.bin").as_slice());
        let issuer = TpmIssuer::new(
            tpm,
            &ak_config,
            PcrSelection::all(),
            vec![self.file("ak-cert.der")],
        )
        .unwrap();
        issuer.issue(report).unwrap()
    }
}

#[test]
fn platform_ca_init_writes_a_private_key_and_a_ca_certificate_and_never_overwrites() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    let run = ok(&["platform-ca", "init", "--dir", s(&ca)]);
    assert!(run.stdout.is_empty());
    assert!(!run.stderr.contains("PRIVATE KEY"), "no key in the output");
    assert_eq!(mode(&ca), 0o700);
    assert_eq!(mode(&ca.join("platform-ca.key")), 0o600);
    let key = fs::read(ca.join("platform-ca.key")).unwrap();
    let cert = fs::read(ca.join("platform-ca.pem")).unwrap();
    assert!(String::from_utf8_lossy(&key).contains("BEGIN PRIVATE KEY"));
    PlatformCa::from_pem(&cert).unwrap();

    let error = fails(&["platform-ca", "init", "--dir", s(&ca)]);
    assert!(error.contains("already exists"), "{error}");
    assert_eq!(fs::read(ca.join("platform-ca.key")).unwrap(), key);
    assert_eq!(fs::read(ca.join("platform-ca.pem")).unwrap(), cert);
}

#[test]
fn a_provisioned_node_is_accepted_with_the_written_files_and_rejected_otherwise() {
    let node = provisioned("ecc");
    for name in [
        "ak-cert.der",
        "ak-public.bin",
        "measurements.json",
        "platform-ca.pem",
    ] {
        assert_eq!(mode(&node.out.join(name)), 0o644, "{name}");
    }
    assert_eq!(mode(&node.state), 0o700);
    assert_eq!(
        node.file("platform-ca.pem"),
        fs::read(node.ca.join("platform-ca.pem")).unwrap()
    );

    // The measurements: boot PCRs enforced as read, 14 warn-only, 15 enforced all-zero, and
    // nothing for 10 or the resettable 16 and 23.
    let measurements = Measurements::load(&node.out.join("measurements.json")).unwrap();
    let listed: Vec<u8> = measurements.iter().map(|(i, _)| i.get()).collect();
    assert_eq!(
        listed,
        vec![0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 15]
    );
    let pcr15 = measurements.get(PcrIndex::new(15).unwrap()).unwrap();
    assert_eq!(
        (pcr15.expected, pcr15.mode),
        ([0; 32], MeasurementMode::Enforce)
    );
    let pcr14 = measurements.get(PcrIndex::new(14).unwrap()).unwrap();
    assert_eq!(pcr14.mode, MeasurementMode::WarnOnly);

    // The node boots: its quote is accepted with the platform CA and the measurements.
    let swtpm = node.boot();
    let report = ReportData::verify(b"a verifier's nonce");
    let evidence = node.evidence(&swtpm, AkAlgorithm::EccP256, &report);
    let verified = node
        .validator(&node.file("platform-ca.pem"))
        .validate(&evidence, &report)
        .unwrap();
    assert_eq!(
        verified.identity(),
        AkFingerprint::of_public_area(&node.file("ak-public.bin")).to_string()
    );

    // Another platform CA does not vouch for this AK.
    let other = node.root.join("other-ca");
    ok(&["platform-ca", "init", "--dir", s(&other)]);
    let other_pem = fs::read(other.join("platform-ca.pem")).unwrap();
    match node.validator(&other_pem).validate(&evidence, &report) {
        Err(ValidationError::UntrustedKey(_)) => {}
        other => panic!("expected an untrusted AK, got {other:?}"),
    }

    // An enforced PCR that changed after provisioning rejects, naming index and values.
    let mut tpm = Tpm::open(&swtpm.tcti().parse().unwrap()).unwrap();
    tpm.extend_pcr(4, &[0x44; 32]).unwrap();
    let observed = tpm.read_pcrs(&PcrSelection::new([4]).unwrap()).unwrap()[0].1;
    drop(tpm);
    let evidence = node.evidence(&swtpm, AkAlgorithm::EccP256, &report);
    match node
        .validator(&node.file("platform-ca.pem"))
        .validate(&evidence, &report)
    {
        Err(ValidationError::Measurement {
            index,
            expected,
            observed: seen,
        }) => {
            assert_eq!(index, 4);
            assert_eq!(expected, hex::encode([0u8; 32]));
            assert_eq!(seen, hex::encode(observed));
        }
        other => panic!("expected a measurement mismatch at PCR 4, got {other:?}"),
    }
}

#[test]
fn an_rsa_node_is_accepted_until_it_is_marked_bootstrapped() {
    let node = provisioned("rsa");
    let swtpm = node.boot();
    let report = ReportData::verify(b"nonce");
    let validator = node.validator(&node.file("platform-ca.pem"));
    let evidence = node.evidence(&swtpm, AkAlgorithm::Rsa2048, &report);
    validator.validate(&evidence, &report).unwrap();

    // Marked (by another process, as the bootstrapper's node lock does): PCR 15 is no longer
    // zero, so the node cannot pass the pre-bootstrap measurements any more.
    ok(&[
        "node-marker",
        "mark",
        "--tpm",
        &swtpm.tcti(),
        "--cluster-id",
        CLUSTER_ID,
    ]);
    let evidence = node.evidence(&swtpm, AkAlgorithm::Rsa2048, &report);
    match validator.validate(&evidence, &report) {
        Err(ValidationError::Measurement {
            index, observed, ..
        }) => {
            assert_eq!(index, 15);
            assert_eq!(observed, MARKED_PCR15);
        }
        other => panic!("expected a measurement mismatch at PCR 15, got {other:?}"),
    }
}

#[test]
fn node_refuses_to_overwrite_a_provisioned_node() {
    let node = provisioned("ecc");
    let state_before = fs::read(node.state.join("tpm2-00.permall")).unwrap();
    let cert_before = node.file("ak-cert.der");

    // The same state directory, new outputs: the TPM is kept.
    let elsewhere = node.root.join("elsewhere");
    let error = fails(&[
        "node",
        "--state-dir",
        s(&node.state),
        "--ca-dir",
        s(&node.ca),
        "--out",
        s(&elsewhere),
    ]);
    assert!(error.contains("not empty"), "{error}");
    assert!(!elsewhere.exists(), "nothing is left behind");

    // A new state directory, the same outputs: nothing is touched.
    let fresh = node.root.join("fresh-tpm");
    let error = fails(&[
        "node",
        "--state-dir",
        s(&fresh),
        "--ca-dir",
        s(&node.ca),
        "--out",
        s(&node.out),
    ]);
    assert!(error.contains("ak-cert.der already exists"), "{error}");
    assert!(!fresh.exists());

    assert_eq!(
        fs::read(node.state.join("tpm2-00.permall")).unwrap(),
        state_before
    );
    assert_eq!(node.file("ak-cert.der"), cert_before);
}

#[test]
fn node_without_a_platform_ca_fails_before_creating_anything() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("tpm");
    let out = dir.path().join("out");
    let error = fails(&[
        "node",
        "--state-dir",
        s(&state),
        "--ca-dir",
        s(&dir.path().join("no-ca")),
        "--out",
        s(&out),
    ]);
    assert!(error.contains("platform-ca init"), "{error}");
    assert!(!state.exists() && !out.exists());
}

#[test]
fn the_marker_is_seen_by_other_processes_until_the_tpm_resets() {
    let dir = tempfile::tempdir().unwrap();
    let mut swtpm = SwtpmProcess::start(&SwtpmConfig::new(dir.path()).unwrap()).unwrap();
    let tcti = swtpm.tcti();
    let mark = [
        "node-marker",
        "mark",
        "--tpm",
        &tcti,
        "--cluster-id",
        CLUSTER_ID,
    ];
    let status = |extra: &[&str]| {
        let mut args = vec!["node-marker", "status", "--tpm", tcti.as_str()];
        args.extend_from_slice(extra);
        ok(&args)
    };

    assert_eq!(status(&[]).stdout, "not-bootstrapped\n");
    let marked = ok(&mark);
    assert_eq!(marked.stdout, "bootstrapped\n");
    assert!(marked.stderr.contains(MARKED_PCR15), "{}", marked.stderr);

    // The process that marked has exited; a new one still sees the marker.
    let seen = status(&["--cluster-id", CLUSTER_ID]);
    assert_eq!(seen.stdout, "bootstrapped\n");
    assert!(
        seen.stderr.contains("is the marker of cluster"),
        "{}",
        seen.stderr
    );
    let other_cluster = status(&["--cluster-id", &"00".repeat(32)]);
    assert_eq!(other_cluster.stdout, "bootstrapped\n");
    assert!(other_cluster.stderr.contains("is not the marker"));
    {
        let mut tpm = Tpm::open(&swtpm.tcti().parse().unwrap()).unwrap();
        let cluster_id: [u8; 32] = hex::decode(CLUSTER_ID).unwrap().try_into().unwrap();
        assert_eq!(
            read_marker_pcr(&mut tpm).unwrap(),
            expected_marker_pcr(&cluster_id)
        );
    }

    // Marking is one-shot.
    let error = fails(&mark);
    assert!(error.contains("marked already"), "{error}");

    // Only a TPM reset (swtpm restart, a reboot) clears it.
    swtpm.restart().unwrap();
    let after_reset = ok(&["node-marker", "status", "--tpm", &swtpm.tcti()]);
    assert_eq!(after_reset.stdout, "not-bootstrapped\n");
}

#[test]
fn node_marker_rejects_malformed_input_with_a_reason() {
    let error = fails(&["node-marker", "status", "--tpm", "mssim:port=1"]);
    assert!(error.contains("unknown TCTI"), "{error}");
    let error = fails(&[
        "node-marker",
        "mark",
        "--tpm",
        "swtpm:port=2321",
        "--cluster-id",
        "abcd",
    ]);
    assert!(error.contains("expected 32"), "{error}");
}

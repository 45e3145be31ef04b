//! `asterism-node-settings` as the image's init would run it: settings from a fw_cfg tree
//! and an ESP file in temporary directories, printed as shell assignments or the settings
//! document, the blobs written as files; a hostile source leaves nothing written.

#![cfg(test)] // all of it test code: clippy.toml's test allowances cover its helpers too

use std::path::Path;
use std::process::{Command, Output};

const CLUSTER_ID: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
const CP_KEY: &str = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";
const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

fn put(root: &Path, name: &str, bytes: &[u8]) {
    let path = root.join("by_name").join(name).join("raw");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

fn fw_cfg(root: &Path) {
    let params = format!(
        "asterism.ip=10.0.2.15/24 asterism.gw=10.0.2.2 asterism.node-ip=10.0.3.7/24 \
         asterism.hostname=worker-7 asterism.cluster-id={CLUSTER_ID} \
         asterism.control-plane-key={CP_KEY}"
    );
    put(root, "opt/asterism/params", params.as_bytes());
    put(
        root,
        "opt/asterism/ak-cert",
        &[0x30, 0x03, 0x02, 0x01, 0x07],
    );
    put(root, "opt/asterism/join-trust/platform-ca", CA.as_bytes());
    put(
        root,
        "opt/asterism/join-trust/measurements",
        br#"{"pcrs":{}}"#,
    );
}

/// A temporary directory holding a fw_cfg tree with every setting (`fw_cfg/`), and the
/// tree's path.
fn fw_cfg_dir() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("fw_cfg");
    fw_cfg(&root);
    (dir, root.to_str().unwrap().to_owned())
}

/// The standard output of a run that must have succeeded (its standard error if not).
fn succeeded(out: Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Each of `lines` is a whole line of `stdout`.
fn assert_lines(stdout: &str, lines: &[&str]) {
    for line in lines {
        assert!(
            stdout.lines().any(|l| l == *line),
            "{line} not in:\n{stdout}"
        );
    }
}

/// [`run`] with `args`, writing the settings' files into `out_dir`.
fn run_writing_files(args: &[&str], out_dir: &Path) -> Output {
    run(&[args, &["--write-files", out_dir.to_str().unwrap()]].concat())
}

fn run(args: &[&str]) -> Output {
    asterism_children::output(
        Command::new(env!("CARGO_BIN_EXE_asterism-node-settings"))
            .args(args)
            .env("RUST_LOG", "info"),
    )
    .unwrap()
}

#[test]
fn fw_cfg_settings_print_as_the_inits_shell_variables_with_the_blobs_as_files() {
    let (dir, root) = fw_cfg_dir();
    let out_dir = dir.path().join("attestation");
    let out = run_writing_files(&["--source", "auto", "--fw-cfg-root", &root], &out_dir);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = succeeded(out);
    assert_lines(
        &stdout,
        &[
            "settings_source='fw-cfg'",
            "ip_addr='10.0.2.15/24'",
            "gw='10.0.2.2'",
            "node_ip='10.0.3.7/24'",
            "hostname_='worker-7'",
            &format!("cluster_id='{CLUSTER_ID}'"),
            &format!("control_plane_key='{CP_KEY}'"),
        ],
    );
    assert_eq!(
        std::fs::read_to_string(out_dir.join("join-platform-ca.pem")).unwrap(),
        CA
    );
    assert_eq!(
        std::fs::read(out_dir.join("ak-cert.der")).unwrap(),
        [0x30, 3, 2, 1, 7]
    );
    assert!(!stderr.contains("BEGIN CERTIFICATE"), "{stderr}");
}

#[test]
fn the_json_output_is_an_esp_settings_file_that_reads_back_the_same() {
    let (dir, root) = fw_cfg_dir();
    let out = run(&[
        "--source",
        "fw-cfg",
        "--fw-cfg-root",
        &root,
        "--format",
        "json",
    ]);
    let mut doc: serde_json::Value = serde_json::from_str(&succeeded(out)).unwrap();
    assert_eq!(doc["source"], "fw-cfg");
    doc.as_object_mut().unwrap().remove("source");
    let esp = dir.path().join("node-settings.json");
    std::fs::write(&esp, doc.to_string()).unwrap();
    let again = run(&[
        "--source",
        "esp",
        "--esp-file",
        esp.to_str().unwrap(),
        "--format",
        "json",
    ]);
    let mut doc2: serde_json::Value = serde_json::from_str(&succeeded(again)).unwrap();
    doc2.as_object_mut().unwrap().remove("source");
    assert_eq!(doc, doc2);
}

#[test]
fn a_hostile_source_prints_and_writes_nothing_and_names_the_field() {
    let (dir, root) = fw_cfg_dir();
    // A valid everything but one bad value, read after the blobs would have been.
    put(
        Path::new(&root),
        "opt/asterism/params",
        format!("asterism.hostname=worker-7 asterism.cluster-id={CLUSTER_ID} asterism.control-plane-key=zz")
            .as_bytes(),
    );
    let out_dir = dir.path().join("attestation");
    let out = run_writing_files(&["--source", "fw-cfg", "--fw-cfg-root", &root], &out_dir);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert!(!out_dir.exists(), "nothing written");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("fw_cfg: control-plane-key"), "{stderr}");
}

#[test]
fn shell_output_with_blobs_needs_a_directory_for_them() {
    let (_dir, root) = fw_cfg_dir();
    let out = run(&["--source", "fw-cfg", "--fw-cfg-root", &root]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
}

/// Arguments that point every source of settings at the path `none`, which does not
/// exist, but the SMBIOS entries at `entries`: the host's own sources are never read.
fn smbios_only<'a>(none: &'a str, entries: &'a str) -> Vec<&'a str> {
    vec![
        "--fw-cfg-root",
        none,
        "--dmi-id",
        none,
        "--dmi-entries",
        entries,
        "--esp-file",
        none,
    ]
}

/// A temporary directory, and the paths of `none` (never made) and `entries` in it.
fn smbios_dir() -> (tempfile::TempDir, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_owned();
    let (none, entries) = (path("none"), path("entries"));
    (dir, none, entries)
}

#[test]
fn no_detectable_source_is_an_error() {
    let (_dir, none, _) = smbios_dir();
    let out = run(&smbios_only(&none, &none));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no node settings source"));
}

/// An SMBIOS entries tree with one OEM strings structure, as sysfs shows it.
fn smbios(root: &Path, strings: &[&str]) {
    let entry = root.join("11-0");
    std::fs::create_dir_all(&entry).unwrap();
    let strings: Vec<&[u8]> = strings.iter().map(|s| s.as_bytes()).collect();
    std::fs::write(
        entry.join("raw"),
        asterism_metadata::node_settings::smbios::build(0x0b00, &strings),
    )
    .unwrap();
}

#[test]
fn detect_names_the_source_without_reading_it() {
    let (_dir, none, entries) = smbios_dir();
    // Not even valid settings: detection does not read them.
    smbios(Path::new(&entries), &["asterism.hostname=-bad-"]);
    let out = run(&[&["--detect"][..], &smbios_only(&none, &entries)].concat());
    assert_eq!(succeeded(out), "smbios\n");
    let out = run(&[&["--detect"][..], &smbios_only(&none, &none)].concat());
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
}

#[test]
fn smbios_oem_strings_print_the_settings_and_the_inits_flags() {
    let (dir, none, entries) = smbios_dir();
    smbios(
        Path::new(&entries),
        &[
            "asterism.node-ip=10.42.7.2/24",
            "asterism.hostname=worker-0",
            "asterism.keep-running=1",
            "asterism.ak-cert=MAMCAQc=",
        ],
    );
    let out_dir = dir.path().join("attestation");
    let out = run_writing_files(&smbios_only(&none, &entries), &out_dir);
    let stdout = succeeded(out);
    assert_lines(
        &stdout,
        &[
            "settings_source='smbios'",
            "node_ip='10.42.7.2/24'",
            "hostname_='worker-0'",
            "keep_running='1'",
        ],
    );
    assert!(!stdout.contains("reference="), "{stdout}");
    assert_eq!(
        std::fs::read(out_dir.join("ak-cert.der")).unwrap(),
        [0x30, 3, 2, 1, 7]
    );
}

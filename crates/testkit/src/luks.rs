//! What the cryptsetup program itself says about a LUKS2 image, independently of our
//! crates: whether a key opens it, its token 0, its UUID; and a blank image to make one.
//!
//! Tests that check a disk step ask the program, not `asterism-cryptsetup`, so that a bug
//! shared by our bindings and our checks cannot hide itself.

// Test helpers fail the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A temporary directory holding `state.img`, a sparse file of 32 MiB: room for a LUKS2
/// header (with integrity's) and a small file system, as a test's state disk.
pub fn blank_image() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.img");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(32 * 1024 * 1024)
        .unwrap();
    (dir, path)
}

/// Whether `key` opens the LUKS image at `image` (`cryptsetup open --test-passphrase`, the
/// key on stdin).
pub fn opens(image: &Path, key: &[u8]) -> bool {
    let mut child = asterism_children::spawn(
        Command::new("cryptsetup")
            .args(["open", "--test-passphrase", "--key-file", "-"])
            .arg(image)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
    .expect("running cryptsetup");
    child
        .stdin
        .take()
        .expect("cryptsetup's stdin")
        .write_all(key)
        .expect("writing the key to cryptsetup");
    child.wait().expect("waiting for cryptsetup").success()
}

/// Token 0 of the image, as `cryptsetup token export` prints it.
pub fn token0(image: &Path) -> String {
    let out = asterism_children::output(
        Command::new("cryptsetup")
            .args(["token", "export", "--token-id", "0"])
            .arg(image),
    )
    .expect("running cryptsetup");
    assert!(out.status.success(), "cryptsetup token export: {out:?}");
    String::from_utf8(out.stdout).expect("cryptsetup prints UTF-8")
}

/// The LUKS UUID of the image.
pub fn uuid(image: &Path) -> String {
    let out = asterism_children::output(Command::new("cryptsetup").arg("luksUUID").arg(image))
        .expect("running cryptsetup");
    String::from_utf8(out.stdout)
        .expect("cryptsetup prints UTF-8")
        .trim()
        .to_owned()
}

//! cryptsetup command lines as values, and the one place that runs them.
//!
//! [`CryptsetupCli`] builds an [`Invocation`] (program, arguments, standard input) for each
//! operation without running anything, so tests can check every command line, and in
//! particular that no passphrase ever lands in the arguments: passphrases travel only on
//! standard input (`--key-file -` with an exact `--keyfile-size`), which no other process
//! can read. A [`CommandRunner`] runs invocations; [`SystemRunner`] is the real one.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use asterism_kms::DataKey;
use zeroize::Zeroizing;

use crate::config::{Pbkdf, pbkdf_args};
use crate::header::KeySlot;

/// The most output kept from one stream of one invocation; the rest is read and dropped.
/// LUKS2 JSON metadata is at most 4 MiB, so a header dump always fits.
pub const MAX_CAPTURED_OUTPUT: usize = 8 * 1024 * 1024;

/// The step an invocation performs, for logs and errors: a cryptsetup action, or one of the
/// two programs of the state disk's file system ([`crate::StateFileSystem`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// `isLuks --type luks2`.
    IsLuks2,
    /// `luksFormat`.
    Format,
    /// `token import`.
    ImportToken,
    /// `luksHeaderBackup`.
    HeaderBackup,
    /// `luksDump --dump-json-metadata`.
    DumpHeader,
    /// `luksUUID`.
    Uuid,
    /// `open --test-passphrase`.
    TestPassphrase,
    /// `luksAddKey`.
    AddKey,
    /// `luksKillSlot`.
    KillSlot,
    /// `open` (device-mapper activation).
    Open,
    /// `mke2fs` on the mapping.
    MakeFileSystem,
    /// `mount` of the mapping.
    Mount,
}

impl Step {
    /// The cryptsetup action of this step (or the file-system program).
    #[must_use]
    pub fn action(self) -> &'static str {
        match self {
            Self::IsLuks2 => "isLuks",
            Self::Format => "luksFormat",
            Self::ImportToken => "token import",
            Self::HeaderBackup => "luksHeaderBackup",
            Self::DumpHeader => "luksDump",
            Self::Uuid => "luksUUID",
            Self::TestPassphrase => "open --test-passphrase",
            Self::AddKey => "luksAddKey",
            Self::KillSlot => "luksKillSlot",
            Self::Open => "open",
            Self::MakeFileSystem => "mke2fs",
            Self::Mount => "mount",
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.action())
    }
}

/// One cryptsetup run: program, arguments and the bytes for its standard input.
///
/// Standard input may hold passphrases: it is wiped on drop and `Debug` shows only its
/// length.
pub struct Invocation {
    pub(crate) step: Step,
    pub(crate) program: PathBuf,
    pub(crate) args: Vec<OsString>,
    pub(crate) stdin: Zeroizing<Vec<u8>>,
}

impl Invocation {
    /// The step this invocation performs.
    #[must_use]
    pub fn step(&self) -> Step {
        self.step
    }

    /// The program to run.
    #[must_use]
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// The arguments. They never contain a secret.
    #[must_use]
    pub fn args(&self) -> &[OsString] {
        &self.args
    }

    /// The bytes to write to the program's standard input, which may be passphrases. Only a
    /// [`CommandRunner`] should need them.
    #[must_use]
    pub fn expose_stdin(&self) -> &[u8] {
        &self.stdin
    }
}

impl fmt::Debug for Invocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Invocation")
            .field("step", &self.step)
            .field("program", &self.program)
            .field("args", &self.args)
            .field(
                "stdin",
                &format_args!("<{} bytes redacted>", self.stdin.len()),
            )
            .finish()
    }
}

/// What the device-mapper activation passes to the kernel: no read and no write workqueue,
/// so encryption runs in the context of the I/O instead of being queued to kernel workers.
const ACTIVATION_FLAGS: [&str; 2] = ["--perf-no_read_workqueue", "--perf-no_write_workqueue"];

/// Builds cryptsetup command lines. Pure: nothing here touches the system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CryptsetupCli {
    program: PathBuf,
}

/// The format parameters that are not secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FormatParams {
    /// Keyslot PBKDF.
    pub pbkdf: Pbkdf,
    /// Whether the data segment gets dm-integrity `hmac-sha256`.
    pub integrity: bool,
    /// Whether the integrity tags are initialised by wiping the device.
    pub integrity_wipe: bool,
    /// `--luks2-keyslots-size`, or cryptsetup's default.
    pub keyslots_area_bytes: Option<u64>,
}

impl CryptsetupCli {
    /// Command lines for the given cryptsetup program.
    #[must_use]
    pub fn new(program: impl Into<PathBuf>) -> Self {
        Self {
            program: program.into(),
        }
    }

    /// Starts an invocation of `action` with the options every invocation carries:
    /// `--batch-mode` (never prompt) and `--disable-external-tokens` (never load a token
    /// plugin named by a header, which an untrusted disk could choose).
    fn start(&self, step: Step, action: &[&str]) -> Invocation {
        let mut args: Vec<OsString> = action.iter().map(OsString::from).collect();
        args.push("--batch-mode".into());
        args.push("--disable-external-tokens".into());
        Invocation {
            step,
            program: self.program.clone(),
            args,
            stdin: Zeroizing::new(Vec::new()),
        }
    }

    /// `isLuks --type luks2 DEVICE`: exit status 0 if the device has a LUKS2 header.
    #[must_use]
    pub fn is_luks2(&self, device: &Path) -> Invocation {
        let mut inv = self.start(Step::IsLuks2, &["isLuks"]);
        inv.push(["--type", "luks2"]);
        inv.push_path(device);
        inv
    }

    /// `luksFormat`: LUKS2, aes-xts-plain64 with a 512-bit key (cryptsetup adds the 256-bit
    /// integrity key on top when integrity is on, 96 bytes in all), 4096-byte sectors, the
    /// passphrase in keyslot 0.
    #[must_use]
    pub fn format(&self, device: &Path, params: &FormatParams, passphrase: &DataKey) -> Invocation {
        let mut inv = self.start(Step::Format, &["luksFormat"]);
        inv.push([
            "--type",
            "luks2",
            "--cipher",
            "aes-xts-plain64",
            "--key-size",
            "512",
            "--sector-size",
            "4096",
            "--key-slot",
            "0",
        ]);
        if params.integrity {
            inv.push(["--integrity", "hmac-sha256"]);
            if !params.integrity_wipe {
                inv.push(["--integrity-no-wipe"]);
            }
        }
        if let Some(bytes) = params.keyslots_area_bytes {
            inv.push(["--luks2-keyslots-size".to_owned(), bytes.to_string()]);
        }
        inv.push(pbkdf_args(&params.pbkdf));
        inv.push_key_file(passphrase);
        inv.push_path(device);
        inv
    }

    /// `token import --token-id 0 --token-replace --json-file -`: writes `json` as token 0.
    #[must_use]
    pub fn import_token(&self, device: &Path, json: &str) -> Invocation {
        let mut inv = self.start(Step::ImportToken, &["token", "import"]);
        inv.push(["--token-id", "0", "--token-replace", "--json-file", "-"]);
        inv.push_path(device);
        inv.stdin = Zeroizing::new(json.as_bytes().to_vec());
        inv
    }

    /// `luksHeaderBackup DEVICE --header-backup-file FILE` (FILE must not exist).
    #[must_use]
    pub fn header_backup(&self, device: &Path, file: &Path) -> Invocation {
        let mut inv = self.start(Step::HeaderBackup, &["luksHeaderBackup"]);
        inv.push_path(device);
        inv.push(["--header-backup-file"]);
        inv.push_path(file);
        inv
    }

    /// `luksDump --dump-json-metadata HEADER`: the LUKS2 JSON metadata on standard output.
    #[must_use]
    pub fn dump_json(&self, header: &Path) -> Invocation {
        let mut inv = self.start(Step::DumpHeader, &["luksDump"]);
        inv.push(["--dump-json-metadata"]);
        inv.push_path(header);
        inv
    }

    /// `luksUUID HEADER`: the LUKS UUID on standard output.
    #[must_use]
    pub fn uuid(&self, header: &Path) -> Invocation {
        let mut inv = self.start(Step::Uuid, &["luksUUID"]);
        inv.push_path(header);
        inv
    }

    /// `open --test-passphrase [--header HEADER] [--key-slot N] --verbose DEVICE`: exit
    /// status 0 if the passphrase opens a keyslot (named on standard output as
    /// `Key slot N unlocked.`), 2 if it opens none.
    #[must_use]
    pub fn test_passphrase(
        &self,
        device: &Path,
        header: Option<&Path>,
        slot: Option<KeySlot>,
        passphrase: &DataKey,
    ) -> Invocation {
        let mut inv = self.start(Step::TestPassphrase, &["open"]);
        inv.push(["--test-passphrase", "--verbose", "--type", "luks2"]);
        if let Some(header) = header {
            inv.push(["--header"]);
            inv.push_path(header);
        }
        if let Some(slot) = slot {
            inv.push(["--key-slot".to_owned(), slot.to_string()]);
        }
        inv.push_key_file(passphrase);
        inv.push_path(device);
        inv
    }

    /// `luksAddKey --new-key-slot N`: adds `new` in slot N, authorised by `existing`.
    ///
    /// Both passphrases go through standard input, one after the other, each read with an
    /// exact size (`--keyfile-size`, `--new-keyfile-size`), so neither touches a file. Should
    /// a cryptsetup read them in the other order, the add fails (the new passphrase opens no
    /// slot) or, for equal lengths, the slot is checked afterwards with the new passphrase.
    #[must_use]
    pub fn add_key(
        &self,
        device: &Path,
        existing: &DataKey,
        new: &DataKey,
        slot: KeySlot,
        pbkdf: &Pbkdf,
    ) -> Invocation {
        let mut inv = self.start(Step::AddKey, &["luksAddKey"]);
        inv.push(["--new-key-slot".to_owned(), slot.to_string()]);
        inv.push(pbkdf_args(pbkdf));
        inv.push([
            "--key-file".to_owned(),
            "-".to_owned(),
            "--keyfile-size".to_owned(),
            existing.len().to_string(),
            "--new-keyfile".to_owned(),
            "-".to_owned(),
            "--new-keyfile-size".to_owned(),
            new.len().to_string(),
        ]);
        inv.push_path(device);
        let mut stdin = Zeroizing::new(Vec::with_capacity(existing.len() + new.len()));
        stdin.extend_from_slice(existing.expose_secret());
        stdin.extend_from_slice(new.expose_secret());
        inv.stdin = stdin;
        inv
    }

    /// `luksKillSlot DEVICE N` with `--key-file -`: cryptsetup removes slot N only if
    /// `remaining` opens another slot, so the disk can never be left without a working key.
    #[must_use]
    pub fn kill_slot(&self, device: &Path, slot: KeySlot, remaining: &DataKey) -> Invocation {
        let mut inv = self.start(Step::KillSlot, &["luksKillSlot"]);
        inv.push_key_file(remaining);
        inv.push_path(device);
        inv.push([slot.to_string()]);
        inv
    }

    /// `open --type luks2 --header HEADER DEVICE NAME` with the activation flags of
    /// Maps the disk at `/dev/mapper/NAME` using the validated header copy.
    #[must_use]
    pub fn open(
        &self,
        device: &Path,
        header: &Path,
        name: &str,
        passphrase: &DataKey,
    ) -> Invocation {
        let mut inv = self.start(Step::Open, &["open"]);
        inv.push(["--type", "luks2", "--header"]);
        inv.push_path(header);
        inv.push(ACTIVATION_FLAGS);
        inv.push_key_file(passphrase);
        inv.push_path(device);
        inv.push([name]);
        inv
    }
}

impl Invocation {
    pub(crate) fn push<I, S>(&mut self, args: I)
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_os_string()));
    }

    /// Paths go after `--` would be cleaner, but cryptsetup does not accept it everywhere;
    /// a path starting with `-` is made unambiguous by prefixing `./`.
    pub(crate) fn push_path(&mut self, path: &Path) {
        if path.as_os_str().as_encoded_bytes().starts_with(b"-") {
            self.args.push(Path::new(".").join(path).into_os_string());
        } else {
            self.args.push(path.as_os_str().to_os_string());
        }
    }

    /// The passphrase on standard input, read as binary with an exact length (a data key is
    /// never empty, and an empty size would mean "read everything").
    fn push_key_file(&mut self, passphrase: &DataKey) {
        self.push([
            "--key-file".to_owned(),
            "-".to_owned(),
            "--keyfile-size".to_owned(),
            passphrase.len().to_string(),
        ]);
        self.stdin = Zeroizing::new(passphrase.expose_secret().to_vec());
    }
}

/// What a finished invocation produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandOutput {
    /// The exit status, or `None` if the program was ended by a signal.
    pub status: Option<i32>,
    /// Standard output (at most [`MAX_CAPTURED_OUTPUT`] bytes).
    pub stdout: Vec<u8>,
    /// Standard error (at most [`MAX_CAPTURED_OUTPUT`] bytes).
    pub stderr: Vec<u8>,
}

impl CommandOutput {
    /// Whether the program exited with status 0.
    #[must_use]
    pub fn success(&self) -> bool {
        self.status == Some(0)
    }
}

/// Why an invocation did not produce a [`CommandOutput`].
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The program could not be started.
    #[error("could not start the program")]
    Spawn(#[source] io::Error),
    /// The program did not finish in time and was killed.
    #[error("did not finish within {0:?} and was killed")]
    Timeout(Duration),
    /// Waiting for the program or reading its output failed.
    #[error("lost track of the program")]
    Io(#[source] io::Error),
}

/// Runs cryptsetup and reports on the kernel: the narrow edge of this crate.
pub trait CommandRunner: Send + Sync {
    /// Runs `invocation` to completion, killing it after `timeout`.
    fn run(&self, invocation: &Invocation, timeout: Duration) -> Result<CommandOutput, RunError>;

    /// Whether the kernel offers device-mapper (so a disk can be mapped and dm-integrity
    /// formatted).
    fn device_mapper_available(&self) -> bool;
}

/// Runs the real program with an environment of its own (`LC_ALL=C`, so messages are
/// stable, and [`CHILD_PATH`], so a bare program name is found in the usual system
/// directories whatever the caller's `PATH`), its standard input fed from the invocation and
/// closed, and its output captured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemRunner {
    device_mapper_control: PathBuf,
}

impl SystemRunner {
    /// A runner that takes `device_mapper_control` (normally `/dev/mapper/control`) as the
    /// sign that the kernel has device-mapper, provided the kernel also lists device-mapper
    /// among its misc devices (`/proc/misc`): a container can see a control node that its
    /// kernel does not back.
    #[must_use]
    pub fn new(device_mapper_control: impl Into<PathBuf>) -> Self {
        Self {
            device_mapper_control: device_mapper_control.into(),
        }
    }
}

impl CommandRunner for SystemRunner {
    fn run(&self, invocation: &Invocation, timeout: Duration) -> Result<CommandOutput, RunError> {
        run_with_timeout(invocation, timeout)
    }

    fn device_mapper_available(&self) -> bool {
        if !self.device_mapper_control.exists() {
            return false;
        }
        // Without /proc (or where it cannot be read), the control node is all there is to go by.
        std::fs::read_to_string("/proc/misc").map_or(true, |misc| lists_device_mapper(&misc))
    }
}

/// Whether a `/proc/misc` listing (`<minor> <name>` per line) has the device-mapper device.
fn lists_device_mapper(misc: &str) -> bool {
    misc.lines()
        .any(|line| line.split_whitespace().nth(1) == Some("device-mapper"))
}

/// The `PATH` a bare program name is looked up in.
pub const CHILD_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Spawns the program, feeds standard input and drains both output streams on scoped
/// threads (so a full pipe can never block it), and polls for its exit until the deadline.
fn run_with_timeout(inv: &Invocation, timeout: Duration) -> Result<CommandOutput, RunError> {
    let mut command = Command::new(&inv.program);
    command
        .args(&inv.args)
        .env_clear()
        .env("LC_ALL", "C")
        .env("PATH", CHILD_PATH)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = asterism_children::spawn(&mut command).map_err(RunError::Spawn)?;
    let stdin = child.stdin.take();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let input: &[u8] = &inv.stdin;

    thread::scope(|scope| {
        let writer = scope.spawn(move || {
            if let Some(mut pipe) = stdin {
                // The program may exit without reading everything (EPIPE): its exit status
                // tells what happened, so a failed write is not an error of its own.
                let _ = pipe.write_all(input);
            }
        });
        let out = scope.spawn(move || read_capped(stdout));
        let err = scope.spawn(move || read_capped(stderr));

        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_millis(2);
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Ok(status),
                Ok(None) => {}
                Err(e) => break Err(RunError::Io(e)),
            }
            let now = Instant::now();
            if now >= deadline {
                // Kill and reap, so the output threads see the pipes close.
                let _ = child.kill();
                let _ = child.wait();
                break Err(RunError::Timeout(timeout));
            }
            thread::sleep(pause.min(deadline - now));
            pause = (pause * 2).min(Duration::from_millis(50));
        };

        let _ = writer.join();
        let stdout = out.join();
        let stderr = err.join();
        let status = status?;
        let lost = || RunError::Io(io::Error::other("an output reader thread failed"));
        let stdout = stdout.map_err(|_| lost())?.map_err(RunError::Io)?;
        let stderr = stderr.map_err(|_| lost())?.map_err(RunError::Io)?;
        Ok(CommandOutput {
            status: status.code(),
            stdout,
            stderr,
        })
    })
}

/// Reads a stream to its end, keeping at most [`MAX_CAPTURED_OUTPUT`] bytes.
fn read_capped<R: Read>(stream: Option<R>) -> io::Result<Vec<u8>> {
    let Some(mut stream) = stream else {
        return Ok(Vec::new());
    };
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = match stream.read(&mut buf) {
            Ok(0) => return Ok(kept),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let room = MAX_CAPTURED_OUTPUT.saturating_sub(kept.len());
        kept.extend_from_slice(buf.get(..n.min(room)).unwrap_or_default());
    }
}

/// The most characters of a program's standard error kept in an error.
pub const MAX_STDERR_CHARS: usize = 512;

/// Runs of at least this many characters that could be key material (hexadecimal or
/// base64) are replaced in standard error before it goes into an error or a log.
const SECRET_LOOKING_RUN: usize = 32;

/// Makes a program's standard error fit for an error message and a log: valid UTF-8, one
/// line, control characters replaced, anything that looks like key material (a long run of
/// hexadecimal or base64 characters) replaced by `<redacted>`, at most
/// [`MAX_STDERR_CHARS`] characters. cryptsetup does not print passphrases, but this keeps
/// that a property of this crate rather than of cryptsetup's messages.
#[must_use]
pub fn sanitize_stderr(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let mut out = String::new();
    let mut run = String::new();
    let flush = |run: &mut String, out: &mut String| {
        if run.chars().count() >= SECRET_LOOKING_RUN {
            out.push_str("<redacted>");
        } else {
            out.push_str(run);
        }
        run.clear();
    };
    for c in text.chars() {
        if c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '=') {
            run.push(c);
            continue;
        }
        flush(&mut run, &mut out);
        if c.is_control() {
            if !out.ends_with(' ') {
                out.push(' ');
            }
        } else {
            out.push(c);
        }
    }
    flush(&mut run, &mut out);
    let trimmed = out.trim();
    if trimmed.chars().count() <= MAX_STDERR_CHARS {
        return trimmed.to_owned();
    }
    let mut cut: String = trimmed.chars().take(MAX_STDERR_CHARS).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(bytes: &[u8]) -> DataKey {
        DataKey::new(bytes.to_vec()).unwrap()
    }

    fn args_contain(inv: &Invocation, needle: &[u8]) -> bool {
        inv.args().iter().any(|a| {
            a.as_encoded_bytes()
                .windows(needle.len())
                .any(|w| w == needle)
        })
    }

    /// Every builder that takes a passphrase puts it on standard input and nowhere in the
    /// arguments. The passphrases are printable so that a leak into argv would be visible.
    #[test]
    fn passphrases_never_appear_in_arguments() {
        let cli = CryptsetupCli::new("cryptsetup");
        let old = key(b"OLD-k3y-material-0123456789abcde");
        let new = key(b"NEW-k3y-material-0123456789abcde");
        let dev = Path::new("/dev/vdb");
        let hdr = Path::new("/run/x/header");
        let slot = KeySlot::new(1).unwrap();
        let params = FormatParams {
            pbkdf: Pbkdf::SPEC,
            integrity: true,
            integrity_wipe: true,
            keyslots_area_bytes: None,
        };
        let with_old = [
            cli.format(dev, &params, &old),
            cli.test_passphrase(dev, Some(hdr), Some(slot), &old),
            cli.kill_slot(dev, slot, &old),
            cli.open(dev, hdr, "state", &old),
        ];
        for inv in &with_old {
            assert!(!args_contain(inv, b"k3y"), "{inv:?}");
            assert_eq!(inv.expose_stdin(), old.expose_secret(), "{inv:?}");
            let size = old.len().to_string();
            let pos = inv.args().iter().position(|a| a == "--key-file").unwrap();
            assert_eq!(inv.args()[pos + 1], "-");
            assert_eq!(inv.args()[pos + 2], "--keyfile-size");
            assert_eq!(inv.args()[pos + 3], size.as_str());
        }
        let add = cli.add_key(dev, &old, &new, slot, &Pbkdf::SPEC);
        assert!(!args_contain(&add, b"k3y"), "{add:?}");
        assert_eq!(
            add.expose_stdin(),
            [old.expose_secret(), new.expose_secret()].concat()
        );
        // Debug of an invocation never shows standard input.
        let debug = format!("{add:?}");
        assert!(!debug.contains("k3y"), "{debug}");
        assert!(debug.contains("<64 bytes redacted>"), "{debug}");
    }

    #[test]
    fn every_invocation_is_batch_mode_without_token_plugins() {
        let cli = CryptsetupCli::new("cryptsetup");
        let dev = Path::new("/dev/vdb");
        let k = key(b"k");
        for inv in [
            cli.is_luks2(dev),
            cli.dump_json(dev),
            cli.uuid(dev),
            cli.header_backup(dev, Path::new("/run/h")),
            cli.import_token(dev, "{}"),
            cli.test_passphrase(dev, None, None, &k),
            cli.kill_slot(dev, KeySlot::new(0).unwrap(), &k),
        ] {
            assert!(inv.args().iter().any(|a| a == "--batch-mode"), "{inv:?}");
            assert!(
                inv.args().iter().any(|a| a == "--disable-external-tokens"),
                "{inv:?}"
            );
        }
    }

    #[test]
    fn format_command_matches_the_reference_parameters() {
        let cli = CryptsetupCli::new("/usr/sbin/cryptsetup");
        let params = FormatParams {
            pbkdf: Pbkdf::FAST_FOR_TESTS,
            integrity: true,
            integrity_wipe: false,
            keyslots_area_bytes: None,
        };
        let inv = cli.format(Path::new("/dev/vdb"), &params, &key(b"k"));
        let args: Vec<&str> = inv.args().iter().map(|a| a.to_str().unwrap()).collect();
        // The whole command line, word by word.
        let expected: Vec<&str> = concat!(
            "luksFormat --batch-mode --disable-external-tokens ",
            "--type luks2 --cipher aes-xts-plain64 --key-size 512 --sector-size 4096 ",
            "--key-slot 0 --integrity hmac-sha256 --integrity-no-wipe ",
            "--pbkdf argon2id --pbkdf-force-iterations 4 --pbkdf-memory 32 --pbkdf-parallel 1 ",
            "--key-file - --keyfile-size 1 /dev/vdb",
        )
        .split(' ')
        .collect();
        assert_eq!(args, expected);
    }

    #[test]
    fn paths_starting_with_a_dash_are_not_taken_for_options() {
        let inv = CryptsetupCli::new("cryptsetup").uuid(Path::new("-rf"));
        assert_eq!(inv.args().last().unwrap(), "./-rf");
    }

    #[test]
    fn stderr_is_bounded_single_line_and_key_material_is_redacted() {
        let hex = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
        let b64 = "q21h4JMkV9RdvzBR1JN3KSqw/A5uyP1VOc+7y0PV0Nc=";
        let raw = format!("Device /dev/vdb is busy.\nkey {hex}\nsalt {b64}\x1b[0m\n");
        let clean = sanitize_stderr(raw.as_bytes());
        assert!(!clean.contains(hex), "{clean}");
        assert!(!clean.contains(b64), "{clean}");
        assert!(clean.contains("Device /dev/vdb is busy."), "{clean}");
        assert!(!clean.contains('\n') && !clean.contains('\x1b'), "{clean}");

        let long = "No key available. ".repeat(100);
        let clean = sanitize_stderr(long.as_bytes());
        assert_eq!(clean.chars().count(), MAX_STDERR_CHARS + 1);
        assert!(clean.ends_with('…'));

        assert_eq!(sanitize_stderr(b"\xff\xfe bad"), "\u{fffd}\u{fffd} bad");
    }

    #[test]
    fn a_program_that_hangs_is_killed_at_the_timeout() {
        let inv = Invocation {
            step: Step::TestPassphrase,
            program: PathBuf::from("sleep"),
            args: vec!["30".into()],
            stdin: Zeroizing::new(Vec::new()),
        };
        let started = Instant::now();
        let result = SystemRunner::new("/nonexistent").run(&inv, Duration::from_millis(200));
        assert!(matches!(result, Err(RunError::Timeout(_))), "{result:?}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn runs_a_program_feeding_stdin_and_capturing_both_streams() {
        let inv = Invocation {
            step: Step::DumpHeader,
            program: PathBuf::from("sh"),
            args: vec!["-c".into(), "cat; echo oops >&2; exit 3".into()],
            stdin: Zeroizing::new(b"hello".to_vec()),
        };
        let out = SystemRunner::new("/nonexistent")
            .run(&inv, Duration::from_secs(10))
            .unwrap();
        assert_eq!(out.status, Some(3));
        assert_eq!(out.stdout, b"hello");
        assert_eq!(out.stderr, b"oops\n");
        assert!(!out.success());
    }

    #[test]
    fn device_mapper_is_read_from_the_kernel_misc_device_list() {
        assert!(lists_device_mapper("183 hw_random\n236 device-mapper\n"));
        assert!(!lists_device_mapper("183 hw_random\n229 fuse\n"));
        assert!(!lists_device_mapper(""));
        // Not there at all: no device-mapper, whatever the kernel says.
        assert!(!SystemRunner::new("/nonexistent/control").device_mapper_available());
    }

    #[test]
    fn a_missing_program_is_a_spawn_error() {
        let inv = CryptsetupCli::new("/nonexistent/cryptsetup").uuid(Path::new("/dev/vdb"));
        let result = SystemRunner::new("/nonexistent").run(&inv, Duration::from_secs(5));
        assert!(matches!(result, Err(RunError::Spawn(_))), "{result:?}");
    }
}

//! The state disk against the real cryptsetup program, each test on its own 32 MiB sparse
//! image file. Keys are checked with the cryptsetup program directly wherever the claim is
//! about the disk rather than about this crate.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use asterism_disk::{
    Backend, CommandOutput, CommandRunner, DataKey, DiskConfig, DiskError, Integrity, Invocation,
    KeySlot, MissingDeviceMapper, Pbkdf, RunError, StateDisk, Step, SystemRunner, TokenState,
    Unlocked, generate_initial_passphrase,
};
use tempfile::TempDir;

struct Image {
    dir: TempDir,
    path: PathBuf,
}

impl Image {
    fn new() -> Self {
        let (dir, path) = asterism_testkit::luks::blank_image();
        Self { dir, path }
    }

    /// Local mode with cheap PBKDF parameters; the device-mapper control node is a path
    /// that does not exist, so the disk behaves as on a kernel without device-mapper.
    fn config(&self) -> DiskConfig {
        DiskConfig {
            pbkdf: Pbkdf::FAST_FOR_TESTS,
            scratch_dir: self.scratch(),
            device_mapper_control: self.dir.path().join("no-such-control-node"),
            ..DiskConfig::local()
        }
    }

    fn scratch(&self) -> PathBuf {
        let scratch = self.dir.path().join("scratch");
        fs::create_dir_all(&scratch).unwrap();
        scratch
    }

    fn disk(&self) -> StateDisk {
        StateDisk::open(&self.path, self.config()).unwrap()
    }

    fn disk_with(&self, backend: Backend) -> StateDisk {
        let config = DiskConfig {
            backend,
            ..self.config()
        };
        StateDisk::open(&self.path, config).unwrap()
    }
}

/// The tests that say what a state disk does run with both ways of reaching cryptsetup.
const BACKENDS: [Backend; 2] = [Backend::Library, Backend::Program];

fn key(text: &str) -> DataKey {
    DataKey::new(text.as_bytes().to_vec()).unwrap()
}

/// Runs the cryptsetup program directly with `stdin`.
fn cryptsetup(args: &[&str], device: &Path, stdin: &[u8]) -> std::process::Output {
    let mut child = asterism_children::spawn(
        Command::new("cryptsetup")
            .args(args)
            .arg(device)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    )
    .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

/// Whether `passphrase` opens the image, asked of the cryptsetup program directly.
fn opens(image: &Image, passphrase: &DataKey) -> bool {
    asterism_testkit::luks::opens(&image.path, passphrase.expose_secret())
}

/// Token 0 as the cryptsetup program reports it.
fn token0(image: &Image) -> String {
    asterism_testkit::luks::token0(&image.path)
}

fn scratch_is_empty(image: &Image) -> bool {
    fs::read_dir(image.scratch()).unwrap().next().is_none()
}

#[test]
fn a_fresh_format_has_a_lower_case_uuid_and_is_not_initialized() {
    for backend in BACKENDS {
        a_fresh_format_has_a_lower_case_uuid_and_is_not_initialized_with(backend);
    }
}

fn a_fresh_format_has_a_lower_case_uuid_and_is_not_initialized_with(backend: Backend) {
    let image = Image::new();
    let disk = image.disk_with(backend);
    assert!(
        !disk.is_initialized().unwrap(),
        "an empty image is a new disk"
    );

    let passphrase = generate_initial_passphrase().unwrap();
    assert_eq!(passphrase.len(), 32);
    let formatted = disk.format_new(&passphrase).unwrap();

    let uuid = disk.uuid().unwrap();
    assert_eq!(formatted.uuid, uuid);
    let text = uuid.as_str();
    assert_eq!(text.len(), 36);
    assert!(
        text.chars()
            .all(|c| c == '-' || c.is_ascii_digit() || ('a'..='f').contains(&c))
    );
    let program = cryptsetup(&["luksUUID"], &image.path, b"");
    assert_eq!(
        String::from_utf8(program.stdout)
            .unwrap()
            .trim()
            .to_ascii_lowercase(),
        text
    );

    assert!(!disk.is_initialized().unwrap());
    assert_eq!(
        token0(&image),
        r#"{"type":"constellation-state-disk","keyslots":[],"diskIsInitialized":false}"#
    );
    let header = disk.validated_header().unwrap();
    assert_eq!(header.keyslots(), [KeySlot::FIRST]);
    assert_eq!(header.token(), TokenState::NotInitialized);
    // No device-mapper here: local mode formats without integrity and says so.
    assert!(!formatted.integrity);
    assert!(scratch_is_empty(&image), "header copies are removed");
}

#[test]
fn the_initial_passphrase_opens_the_disk_and_a_wrong_one_does_not() {
    for backend in BACKENDS {
        the_initial_passphrase_opens_the_disk_and_a_wrong_one_does_not_with(backend);
    }
}

fn the_initial_passphrase_opens_the_disk_and_a_wrong_one_does_not_with(backend: Backend) {
    let image = Image::new();
    let disk = image.disk_with(backend);
    let passphrase = generate_initial_passphrase().unwrap();
    disk.format_new(&passphrase).unwrap();

    assert!(disk.check_key(&passphrase).unwrap());
    assert!(opens(&image, &passphrase));
    let wrong = generate_initial_passphrase().unwrap();
    assert!(!disk.check_key(&wrong).unwrap());
    assert!(!opens(&image, &wrong));
}

#[test]
fn replace_passphrase_leaves_only_the_new_key_and_marks_the_disk_initialized() {
    for backend in BACKENDS {
        replace_passphrase_leaves_only_the_new_key_and_marks_the_disk_initialized_with(backend);
    }
}

fn replace_passphrase_leaves_only_the_new_key_and_marks_the_disk_initialized_with(
    backend: Backend,
) {
    let image = Image::new();
    let disk = image.disk_with(backend);
    let old = generate_initial_passphrase().unwrap();
    let new = generate_initial_passphrase().unwrap();
    disk.format_new(&old).unwrap();
    let uuid = disk.uuid().unwrap();

    disk.replace_passphrase(&old, &new).unwrap();

    assert!(opens(&image, &new));
    assert!(!opens(&image, &old));
    assert!(disk.check_key(&new).unwrap());
    assert!(!disk.check_key(&old).unwrap());
    assert!(disk.is_initialized().unwrap());
    assert_eq!(
        token0(&image),
        r#"{"type":"constellation-state-disk","keyslots":[],"diskIsInitialized":true}"#
    );
    assert_eq!(disk.validated_header().unwrap().keyslots().len(), 1);
    assert_eq!(disk.uuid().unwrap(), uuid, "re-keying keeps the UUID");
    assert!(scratch_is_empty(&image));

    // Running it again changes nothing and succeeds (the old key no longer works, the new
    // one does).
    disk.replace_passphrase(&old, &new).unwrap();
    assert!(opens(&image, &new));
    assert!(disk.is_initialized().unwrap());
}

#[test]
fn replace_passphrase_with_a_wrong_old_passphrase_changes_nothing() {
    for backend in BACKENDS {
        replace_passphrase_with_a_wrong_old_passphrase_changes_nothing_with(backend);
    }
}

fn replace_passphrase_with_a_wrong_old_passphrase_changes_nothing_with(backend: Backend) {
    let image = Image::new();
    let disk = image.disk_with(backend);
    let old = key("the real old passphrase");
    disk.format_new(&old).unwrap();

    let result = disk.replace_passphrase(&key("not the old passphrase"), &key("new"));
    assert!(
        matches!(result, Err(DiskError::WrongPassphrase { .. })),
        "{result:?}"
    );
    assert!(opens(&image, &old));
    assert!(!opens(&image, &key("new")));
    assert!(!disk.is_initialized().unwrap());
    assert_eq!(
        disk.validated_header().unwrap().keyslots(),
        [KeySlot::FIRST]
    );
}

#[test]
fn mark_for_reset_flips_the_token_and_lets_the_disk_be_formatted_again() {
    for backend in BACKENDS {
        mark_for_reset_flips_the_token_and_lets_the_disk_be_formatted_again_with(backend);
    }
}

fn mark_for_reset_flips_the_token_and_lets_the_disk_be_formatted_again_with(backend: Backend) {
    let image = Image::new();
    let disk = image.disk_with(backend);
    let (old, new) = (key("old"), key("new"));
    disk.format_new(&old).unwrap();
    disk.replace_passphrase(&old, &new).unwrap();
    assert!(disk.is_initialized().unwrap());

    // An initialized disk is never formatted over.
    let refused = disk.format_new(&key("another"));
    assert!(
        matches!(refused, Err(DiskError::AlreadyInitialized { .. })),
        "{refused:?}"
    );
    assert!(opens(&image, &new));

    disk.mark_for_reset().unwrap();
    assert!(!disk.is_initialized().unwrap());
    assert_eq!(
        token0(&image),
        r#"{"type":"constellation-state-disk","keyslots":[],"diskIsInitialized":false}"#
    );
    assert!(opens(&image, &new), "a reset mark keeps the key");

    let again = key("next boot");
    disk.format_new(&again).unwrap();
    assert!(opens(&image, &again));
    assert!(!opens(&image, &new));
}

#[test]
fn unlock_without_device_mapper_checks_the_key_and_says_so() {
    let image = Image::new();
    let disk = image.disk();
    let passphrase = key("passphrase");
    disk.format_new(&passphrase).unwrap();

    assert_eq!(disk.unlock(&passphrase).unwrap(), Unlocked::KeyChecked);
    let wrong = disk.unlock(&key("wrong"));
    assert!(
        matches!(wrong, Err(DiskError::WrongPassphrase { .. })),
        "{wrong:?}"
    );

    // Without the explicit local-mode fallback, no mapping is a failure.
    let strict = StateDisk::open(
        &image.path,
        DiskConfig {
            missing_device_mapper: MissingDeviceMapper::Fail,
            ..image.config()
        },
    )
    .unwrap();
    let result = strict.unlock(&passphrase);
    assert!(
        matches!(result, Err(DiskError::DeviceMapperUnavailable { .. })),
        "{result:?}"
    );
}

/// Claims device-mapper is there, so that `unlock` really runs `cryptsetup open`; on this
/// kernel that fails with a device-mapper error, which must lead to the same fallback.
struct ClaimsDeviceMapper(SystemRunner);

impl CommandRunner for ClaimsDeviceMapper {
    fn run(&self, inv: &Invocation, timeout: Duration) -> Result<CommandOutput, RunError> {
        self.0.run(inv, timeout)
    }

    fn device_mapper_available(&self) -> bool {
        true
    }
}

/// Whether the kernel has device-mapper or could load it on demand. These tests are about
/// kernels without it; elsewhere they skip rather than map real devices.
fn kernel_has_device_mapper() -> bool {
    if Path::new("/sys/class/misc/device-mapper").exists() {
        return true;
    }
    // dm_mod as a module that the first open of /dev/mapper/control would load.
    asterism_children::status(
        Command::new("modprobe")
            .args(["--dry-run", "--quiet", "dm_mod"])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
    .is_ok_and(|s| s.success())
}

#[test]
fn unlock_falls_back_when_cryptsetup_cannot_initialise_device_mapper() {
    if kernel_has_device_mapper() {
        eprintln!("skipped: this kernel has device-mapper, the mapping would succeed");
        return;
    }
    let image = Image::new();
    let passphrase = key("passphrase");
    image.disk().format_new(&passphrase).unwrap();
    // Should a mapping succeed after all, it must not collide with a real "state" mapping.
    let config = DiskConfig {
        mapper_name: format!("asterism-test-{}", std::process::id()),
        ..image.config()
    };

    let disk = StateDisk::with_runner(
        &image.path,
        config.clone(),
        ClaimsDeviceMapper(SystemRunner::new("/dev/mapper/control")),
    )
    .unwrap();
    assert_eq!(disk.unlock(&passphrase).unwrap(), Unlocked::KeyChecked);

    let strict = StateDisk::with_runner(
        &image.path,
        DiskConfig {
            missing_device_mapper: MissingDeviceMapper::Fail,
            ..config
        },
        ClaimsDeviceMapper(SystemRunner::new("/dev/mapper/control")),
    )
    .unwrap();
    let result = strict.unlock(&passphrase);
    assert!(
        matches!(result, Err(DiskError::DeviceMapperUnavailable { .. })),
        "{result:?}"
    );
}

#[test]
fn required_integrity_is_not_silently_dropped() {
    if kernel_has_device_mapper() {
        eprintln!("skipped: this kernel has device-mapper, integrity would work");
        return;
    }
    let image = Image::new();
    let required = DiskConfig {
        integrity: Integrity::HmacSha256,
        ..image.config()
    };
    let disk = StateDisk::open(&image.path, required.clone()).unwrap();
    let result = disk.format_new(&key("passphrase"));
    assert!(
        matches!(result, Err(DiskError::IntegrityUnavailable { .. })),
        "{result:?}"
    );

    // Also when the control node exists and only cryptsetup finds out.
    let disk = StateDisk::with_runner(
        &image.path,
        required.clone(),
        ClaimsDeviceMapper(SystemRunner::new("/dev/mapper/control")),
    )
    .unwrap();
    let result = disk.format_new(&key("passphrase"));
    assert!(
        matches!(result, Err(DiskError::IntegrityUnavailable { .. })),
        "{result:?}"
    );

    // The local fallback formats without integrity...
    let local = StateDisk::with_runner(
        &image.path,
        image.config(),
        ClaimsDeviceMapper(SystemRunner::new("/dev/mapper/control")),
    )
    .unwrap();
    let formatted = local.format_new(&key("passphrase")).unwrap();
    assert!(!formatted.integrity);

    // ...and a disk configured to require integrity refuses that header.
    let disk = StateDisk::open(&image.path, required).unwrap();
    let result = disk.check_key(&key("passphrase"));
    assert!(
        matches!(result, Err(DiskError::InvalidHeader { .. })),
        "{result:?}"
    );
}

/// Formats the image with the cryptsetup program directly, with `extra` options, and
/// writes the state-disk token with `initialized`.
fn format_by_hand(image: &Image, passphrase: &DataKey, extra: &[&str], initialized: bool) {
    let mut args = vec![
        "luksFormat",
        "--batch-mode",
        "--type",
        "luks2",
        "--key-file",
        "-",
    ];
    if !extra.contains(&"--pbkdf") {
        args.extend([
            "--pbkdf",
            "argon2id",
            "--pbkdf-force-iterations",
            "4",
            "--pbkdf-memory",
            "32",
            "--pbkdf-parallel",
            "1",
        ]);
    }
    args.extend_from_slice(extra);
    let out = cryptsetup(&args, &image.path, passphrase.expose_secret());
    assert!(out.status.success(), "{out:?}");
    let token = format!(
        r#"{{"type":"constellation-state-disk","keyslots":[],"diskIsInitialized":{initialized}}}"#
    );
    let out = cryptsetup(
        &["token", "import", "--token-id", "0", "--json-file", "-"],
        &image.path,
        token.as_bytes(),
    );
    assert!(out.status.success(), "{out:?}");
}

#[test]
fn refuses_to_use_a_header_that_fails_validation() {
    // Each of these opens with the right passphrase but breaks a rule.
    let weak: &[&[&str]] = &[
        &["--cipher", "aes-cbc-essiv:sha256", "--sector-size", "4096"],
        &["--cipher", "aes-xts-plain64", "--sector-size", "512"],
        &[
            "--cipher",
            "aes-xts-plain64",
            "--key-size",
            "256",
            "--sector-size",
            "4096",
        ],
        &[
            "--cipher",
            "aes-xts-plain64",
            "--sector-size",
            "4096",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
        ],
    ];
    for (extra, backend) in weak
        .iter()
        .flat_map(|extra| BACKENDS.map(|backend| (extra, backend)))
    {
        let image = Image::new();
        let passphrase = key("passphrase");
        format_by_hand(&image, &passphrase, extra, true);
        assert!(opens(&image, &passphrase));
        let disk = image.disk_with(backend);

        let is_init = disk.is_initialized();
        assert!(
            matches!(is_init, Err(DiskError::InvalidHeader { .. })),
            "{extra:?}: a disk that claims to be initialized but fails validation is an error, not a new disk: {is_init:?}"
        );
        let check = disk.check_key(&passphrase);
        assert!(
            matches!(check, Err(DiskError::InvalidHeader { .. })),
            "{extra:?}: {check:?}"
        );
        let unlock = disk.unlock(&passphrase);
        assert!(
            matches!(unlock, Err(DiskError::InvalidHeader { .. })),
            "{extra:?}: {unlock:?}"
        );
        let rekey = disk.replace_passphrase(&passphrase, &key("new"));
        assert!(
            matches!(rekey, Err(DiskError::InvalidHeader { .. })),
            "{extra:?}: {rekey:?}"
        );
        let reset = disk.mark_for_reset();
        assert!(
            matches!(reset, Err(DiskError::InvalidHeader { .. })),
            "{extra:?}: {reset:?}"
        );
        assert!(!opens(&image, &key("new")), "{extra:?}: nothing was added");
        assert!(scratch_is_empty(&image));
    }
}

#[test]
fn an_invalid_header_marked_new_is_a_new_disk_and_is_formatted_over() {
    let image = Image::new();
    let old = key("old");
    format_by_hand(&image, &old, &["--cipher", "aes-cbc-essiv:sha256"], false);
    let disk = image.disk();
    assert!(!disk.is_initialized().unwrap());
    let new = key("fresh");
    disk.format_new(&new).unwrap();
    assert!(disk.check_key(&new).unwrap());
    assert!(!opens(&image, &old));
}

#[test]
fn a_device_without_luks2_header_is_new_and_has_no_key() {
    for backend in BACKENDS {
        a_device_without_luks2_header_is_new_and_has_no_key_with(backend);
    }
}

fn a_device_without_luks2_header_is_new_and_has_no_key_with(backend: Backend) {
    let image = Image::new();
    let disk = image.disk_with(backend);
    assert!(!disk.is_initialized().unwrap());
    let result = disk.check_key(&key("anything"));
    assert!(
        matches!(result, Err(DiskError::NotLuks2 { .. })),
        "{result:?}"
    );
    assert!(disk.uuid().is_err());

    // LUKS1 is not LUKS2.
    let out = cryptsetup(
        &[
            "luksFormat",
            "--batch-mode",
            "--type",
            "luks1",
            "--pbkdf-force-iterations",
            "1000",
            "--key-file",
            "-",
        ],
        &image.path,
        b"passphrase",
    );
    assert!(out.status.success(), "{out:?}");
    assert!(!disk.is_initialized().unwrap());
}

#[test]
fn a_missing_device_is_an_error() {
    let image = Image::new();
    let result = StateDisk::open(image.dir.path().join("absent.img"), image.config());
    assert!(
        matches!(result, Err(DiskError::Device { .. })),
        "{:?}",
        result.err()
    );
}

/// Plays a host that replaces the header with one of its own (another volume key) right after
/// the new keyslot is written.
struct SwapsHeaderAfterAddKey {
    inner: SystemRunner,
    image: PathBuf,
    new_passphrase: Vec<u8>,
    done: AtomicBool,
}

impl CommandRunner for SwapsHeaderAfterAddKey {
    fn run(&self, inv: &Invocation, timeout: Duration) -> Result<CommandOutput, RunError> {
        let out = self.inner.run(inv, timeout)?;
        if inv.step() == Step::AddKey && out.success() && !self.done.swap(true, Ordering::SeqCst) {
            // The replacement header opens with the same new passphrase (as if the host knew
            // it), and is otherwise exactly what this crate formats.
            let args = [
                "luksFormat",
                "--batch-mode",
                "--type",
                "luks2",
                "--cipher",
                "aes-xts-plain64",
                "--sector-size",
                "4096",
                "--pbkdf-force-iterations",
                "4",
                "--pbkdf-memory",
                "32",
                "--pbkdf-parallel",
                "1",
                "--key-slot",
                "1",
                "--key-size",
                "512",
                "--key-file",
                "-",
            ];
            let swap = cryptsetup(&args, &self.image, &self.new_passphrase);
            assert!(swap.status.success(), "{swap:?}");
            let token =
                br#"{"type":"constellation-state-disk","keyslots":[],"diskIsInitialized":false}"#;
            let imported = cryptsetup(
                &["token", "import", "--token-id", "0", "--json-file", "-"],
                &self.image,
                token,
            );
            assert!(imported.status.success(), "{imported:?}");
        }
        Ok(out)
    }

    fn device_mapper_available(&self) -> bool {
        false
    }
}

#[test]
fn a_header_replaced_during_the_re_key_is_detected() {
    let image = Image::new();
    let old = key("old");
    image.disk().format_new(&old).unwrap();
    // The program backend: a test can act between its runs.
    let disk = StateDisk::with_runner(
        &image.path,
        image.disk_with(Backend::Program).config().clone(),
        SwapsHeaderAfterAddKey {
            inner: SystemRunner::new("/nonexistent"),
            image: image.path.clone(),
            new_passphrase: b"new".to_vec(),
            done: AtomicBool::new(false),
        },
    )
    .unwrap();

    let result = disk.replace_passphrase(&old, &key("new"));
    assert!(
        matches!(
            result,
            Err(DiskError::VolumeKeyChanged {
                step: Step::AddKey,
                ..
            })
        ),
        "{result:?}"
    );
    assert!(!disk.is_initialized().unwrap(), "the token was not set");
}

#[test]
fn every_cryptsetup_run_is_bounded_in_time() {
    let image = Image::new();
    // The reference's PBKDF benchmarks for 2 s: far longer than this bound.
    let disk = StateDisk::open(
        &image.path,
        DiskConfig {
            // Library calls have no timeout; every run of the program has one.
            backend: Backend::Program,
            pbkdf: Pbkdf::SPEC,
            command_timeout: Duration::from_millis(1500),
            ..image.config()
        },
    )
    .unwrap();
    let started = std::time::Instant::now();
    let result = disk.format_new(&key("passphrase"));
    // The format is the step that runs out of time (unless the machine is so loaded that an
    // earlier, quick step already did): either way the run was killed at the bound.
    assert!(
        matches!(
            result,
            Err(DiskError::Run {
                source: RunError::Timeout(_),
                ..
            })
        ),
        "{result:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn errors_and_debug_output_never_show_a_passphrase() {
    for backend in BACKENDS {
        errors_and_debug_output_never_show_a_passphrase_with(backend);
    }
}

fn errors_and_debug_output_never_show_a_passphrase_with(backend: Backend) {
    let image = Image::new();
    let disk = image.disk_with(backend);
    let passphrase = key("SECRET-passphrase-material");
    disk.format_new(&passphrase).unwrap();
    let err = disk
        .replace_passphrase(&key("SECRET-wrong-old"), &key("SECRET-new"))
        .unwrap_err();
    let text = format!("{err} {err:?}");
    assert!(!text.contains("SECRET"), "{text}");
    assert!(!format!("{passphrase:?}").contains("SECRET"));
}

/// A device that starts with the LUKS2 magic but whose header the library cannot load (both
/// JSON areas destroyed) is refused, never taken for a new disk and formatted over.
#[test]
fn a_damaged_luks2_header_is_an_error_not_a_new_disk() {
    use std::io::{Seek as _, SeekFrom};

    let image = Image::new();
    let disk = image.disk_with(Backend::Library);
    let passphrase = key("passphrase");
    disk.format_new(&passphrase).unwrap();
    // LUKS2 with 16 KiB metadata: primary binary header at 0, its JSON at 4 KiB; the
    // secondary header at 16 KiB, its JSON at 20 KiB.
    let mut file = fs::OpenOptions::new()
        .write(true)
        .open(&image.path)
        .unwrap();
    for json_area in [4096u64, 16384 + 4096] {
        file.seek(SeekFrom::Start(json_area)).unwrap();
        file.write_all(&[0x5a; 12 * 1024]).unwrap();
    }
    file.sync_all().unwrap();
    drop(file);

    let is_init = disk.is_initialized();
    assert!(
        matches!(is_init, Err(DiskError::DamagedHeader { .. })),
        "{is_init:?}"
    );
    let format = disk.format_new(&key("another"));
    assert!(
        matches!(format, Err(DiskError::DamagedHeader { .. })),
        "{format:?}"
    );
}

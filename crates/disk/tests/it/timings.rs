//! How long a format and a re-key take with the reference PBKDF parameters and with the test
//! parameters. Ignored by default (it takes about half a minute); run it with
//! `cargo test -p asterism-disk --test it timings -- --ignored --nocapture`.

use std::time::Instant;

use asterism_disk::{Backend, DiskConfig, Pbkdf, StateDisk, generate_initial_passphrase};

fn measure(name: &str, backend: Backend, pbkdf: Pbkdf) {
    let (dir, image) = asterism_testkit::luks::blank_image();
    let config = DiskConfig {
        backend,
        pbkdf,
        scratch_dir: dir.path().to_path_buf(),
        device_mapper_control: dir.path().join("no-control"),
        ..DiskConfig::local()
    };
    let disk = StateDisk::open(&image, config).unwrap();
    let old = generate_initial_passphrase().unwrap();
    let new = generate_initial_passphrase().unwrap();

    let t = Instant::now();
    disk.format_new(&old).unwrap();
    let format = t.elapsed();
    let t = Instant::now();
    disk.replace_passphrase(&old, &new).unwrap();
    let rekey = t.elapsed();
    let t = Instant::now();
    assert!(disk.check_key(&new).unwrap());
    let check = t.elapsed();
    println!("{backend:?}, {name}: format {format:?}, re-key {rekey:?}, key check {check:?}");
}

#[test]
#[ignore = "timing report, slow with the reference parameters"]
fn format_and_rekey_timings() {
    for backend in [Backend::Library, Backend::Program] {
        measure(
            "test parameters (argon2id 4 iterations, 32 KiB, 1 thread)",
            backend,
            Pbkdf::FAST_FOR_TESTS,
        );
    }
    measure(
        "reference parameters (argon2id 2000 ms, 64 MiB, 4 threads)",
        Backend::Library,
        Pbkdf::SPEC,
    );
}

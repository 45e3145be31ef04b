//! The measurements file watcher: a good change is put in force, a bad or vanished file
//! keeps the previous measurements and is logged once.

#![cfg(test)] // all of it test code: clippy.toml's test allowances cover its helpers too

use asterism_attestation::MeasurementsProvider;
use asterism_binkit::fs::FileError;
use asterism_binkit::measurements::{MeasurementsWatcher, WatchError};
use asterism_testkit::measurements::{
    HEX_AA as A, HEX_ZERO as Z, measurements_file as doc, pcr as idx,
};
use std::time::Duration;

fn write(path: &std::path::Path, s: &str) {
    // Write then rename, as a config-map update does, so a reader never sees half a file.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, s).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[test]
fn hot_reload_picks_up_a_change_and_a_bad_file_keeps_the_previous_value() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("measurements.json");
    write(&path, &doc(&format!(r#""4": "{A}""#)));
    let (logs, _guard) = asterism_testkit::logs::capture_from_now();
    {
        let watcher = MeasurementsWatcher::open(&path).unwrap();
        let src = watcher.measurements();
        assert_eq!(src.current().get(idx(4)).unwrap().expected, [0xaa; 32]);

        // Reading the measurements never looks at the file: a change waits for the watcher.
        write(&path, &doc(&format!(r#""4": "{Z}""#)));
        assert_eq!(src.current().get(idx(4)).unwrap().expected, [0xaa; 32]);

        // A good change is put in force by the next check.
        assert!(watcher.check_now().unwrap());
        assert_eq!(src.current().get(idx(4)).unwrap().expected, [0; 32]);

        // A bad change keeps the previous value and logs an error, once.
        write(&path, &doc(&format!(r#""4": "{}""#, &Z[2..])));
        assert!(matches!(watcher.check_now(), Err(WatchError::Parse { .. })));
        assert_eq!(src.current().get(idx(4)).unwrap().expected, [0; 32]);
        // The same bad bytes are not parsed (nor logged) again.
        assert!(watcher.check_now().is_ok_and(|changed| !changed));
        assert_eq!(src.current().get(idx(4)).unwrap().expected, [0; 32]);
        let errors: Vec<_> = logs
            .all()
            .into_iter()
            .filter(|(level, _)| *level == tracing::Level::ERROR)
            .collect();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].1.contains("31 bytes"), "{errors:?}");

        // A vanished file, too.
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(
            watcher.check_now(),
            Err(WatchError::Read(FileError::Io(_)))
        ));
        assert_eq!(src.current().get(idx(4)).unwrap().expected, [0; 32]);

        // Fixing the file recovers.
        write(&path, &doc(&format!(r#""4": "{A}", "9": "{A}""#)));
        assert!(watcher.check_now().unwrap());
        assert_eq!(src.current().len(), 2);
    }
}

#[tokio::test]
async fn a_spawned_watcher_puts_a_change_in_force_without_a_validation_asking() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.json");
    write(&path, &doc(&format!(r#""4": "{A}""#)));
    let watcher = MeasurementsWatcher::open(&path).unwrap();
    let src = watcher.measurements();
    let task = watcher.spawn(Duration::from_millis(20)).unwrap();
    write(&path, &doc(&format!(r#""4": "{Z}""#)));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while src.current().get(idx(4)).unwrap().expected != [0; 32] {
        assert!(tokio::time::Instant::now() < deadline, "never reloaded");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    task.abort();
}

#[test]
fn spawning_outside_a_runtime_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.json");
    write(&path, &doc(&format!(r#""4": "{A}""#)));
    let watcher = MeasurementsWatcher::open(&path).unwrap();
    assert!(matches!(
        watcher.spawn(Duration::from_secs(1)),
        Err(WatchError::NoRuntime)
    ));
}

#[test]
fn opening_a_bad_file_fails() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.json");
    assert!(matches!(
        MeasurementsWatcher::open(&path),
        Err(WatchError::Read(FileError::Io(_)))
    ));
    write(&path, r#"{"measurements": {}}"#);
    assert!(matches!(
        MeasurementsWatcher::open(&path),
        Err(WatchError::Parse { .. })
    ));
    write(&path, &" ".repeat(1024 * 1024 + 1));
    assert!(matches!(
        MeasurementsWatcher::open(&path),
        Err(WatchError::Read(FileError::TooLarge { .. }))
    ));
}

//! Watching an expected-measurements file: the validator reads a [`SharedMeasurements`]
//! from memory, and this watcher, at the binary's edge, re-reads the file and swaps in the
//! new map when its content changes. Validation never touches the file.
//!
//! A good change replaces the measurements (logged at info). A bad or unreadable file keeps
//! the previous measurements in force and is logged at error, once per distinct failure;
//! the same bad bytes are not parsed again. The first load must succeed.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use asterism_attestation::measurements::MAX_FILE_SIZE;
use asterism_attestation::{Measurements, MeasurementsError, SharedMeasurements};

use crate::fs::{FileError, read_capped};

/// How often [`MeasurementsWatcher::spawn`] looks at the file by default.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);

/// Why a measurements file could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// The file could not be read (or is larger than 1 MiB).
    #[error("reading the measurements file")]
    Read(#[from] FileError),
    /// The file is not a valid measurements document (docs/attestation.md).
    #[error("measurements file {}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: MeasurementsError,
    },
    /// [`MeasurementsWatcher::spawn`] was called outside a Tokio runtime.
    #[error("watching the measurements file needs a Tokio runtime")]
    NoRuntime,
}

/// Re-reads one measurements file and swaps good new content into its
/// [`SharedMeasurements`].
pub struct MeasurementsWatcher {
    path: PathBuf,
    shared: SharedMeasurements,
    state: Mutex<State>,
}

struct State {
    /// The bytes last read, good or bad: unchanged bytes are not parsed again.
    last_seen: Vec<u8>,
    /// The last failure logged, so that each distinct failure is logged once.
    last_error: Option<String>,
}

impl MeasurementsWatcher {
    /// Loads `path`; fails if this first load fails.
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, WatchError> {
        let path = path.into();
        let bytes = read_capped(&path, MAX_FILE_SIZE)?;
        let measurements = parse(&path, &bytes)?;
        tracing::info!(path = %path.display(), pcrs = measurements.len(), "loaded expected measurements");
        Ok(Self {
            path,
            shared: SharedMeasurements::new(measurements),
            state: Mutex::new(State {
                last_seen: bytes,
                last_error: None,
            }),
        })
    }

    /// The measurements in force, for the validator; the watcher replaces them.
    pub fn measurements(&self) -> SharedMeasurements {
        self.shared.clone()
    }

    /// The file being watched.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Checks the file now: `Ok(true)` if new measurements were put in force, `Ok(false)`
    /// if the content is what was last seen. On error the previous measurements stay in
    /// force (and the error is logged, once per distinct failure).
    pub fn check_now(&self) -> Result<bool, WatchError> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let result = self.refresh(&mut state);
        match &result {
            Ok(_) => state.last_error = None,
            Err(e) => {
                let message = crate::error_chain(e);
                if state.last_error.as_deref() != Some(message.as_str()) {
                    tracing::error!(
                        path = %self.path.display(),
                        error = %message,
                        "measurements reload failed; keeping the previous measurements"
                    );
                    state.last_error = Some(message);
                }
            }
        }
        result
    }

    fn refresh(&self, state: &mut State) -> Result<bool, WatchError> {
        let bytes = read_capped(&self.path, MAX_FILE_SIZE)?;
        if bytes == state.last_seen {
            return Ok(false);
        }
        let parsed = parse(&self.path, &bytes);
        state.last_seen = bytes;
        let measurements = parsed?;
        let pcrs = measurements.len();
        self.shared.replace(measurements);
        tracing::info!(path = %self.path.display(), pcrs, "reloaded expected measurements");
        Ok(true)
    }

    /// Checks the file every `interval` on the current Tokio runtime, on a blocking
    /// thread, until the runtime shuts down or the returned task is aborted.
    pub fn spawn(self, interval: Duration) -> Result<tokio::task::JoinHandle<()>, WatchError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| WatchError::NoRuntime)?;
        let watcher = Arc::new(self);
        Ok(runtime.spawn(async move {
            let mut ticks = tokio::time::interval(interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // The first tick completes at once; the file was just loaded.
            ticks.tick().await;
            loop {
                ticks.tick().await;
                let watcher = Arc::clone(&watcher);
                // Logged inside; the previous measurements stay in force on error.
                let _ = tokio::task::spawn_blocking(move || watcher.check_now()).await;
            }
        }))
    }
}

/// Loads `path` and watches it every [`DEFAULT_INTERVAL`] on the current Tokio runtime;
/// returns the measurements for the validator. The watch ends with the runtime.
pub fn watch(path: &Path) -> Result<SharedMeasurements, WatchError> {
    let watcher = MeasurementsWatcher::open(path)?;
    let shared = watcher.measurements();
    // Detached: it runs as long as the runtime, as the validator does.
    drop(watcher.spawn(DEFAULT_INTERVAL)?);
    Ok(shared)
}

fn parse(path: &Path, bytes: &[u8]) -> Result<Measurements, WatchError> {
    Measurements::from_json(bytes).map_err(|source| WatchError::Parse {
        path: path.to_owned(),
        source,
    })
}

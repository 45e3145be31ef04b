//! What the code under test logs, captured for the test to read: every event and every
//! span's fields, with their levels, from every crate and at every level.

// Test helpers fail the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt as _};

/// Captured log records: (level, the message and fields as `name=value` text). A span's
/// fields are a record of their own, so that what a span carries is searched too.
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<(Level, String)>>>);

impl Logs {
    /// How many records at `level` contain `needle`.
    pub fn count(&self, level: Level, needle: &str) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(l, m)| *l == level && m.contains(needle))
            .count()
    }

    /// Every record so far.
    pub fn all(&self) -> Vec<(Level, String)> {
        self.0.lock().unwrap().clone()
    }

    /// Every record so far, one a line (`LEVEL text`).
    pub fn text(&self) -> String {
        self.0
            .lock()
            .unwrap()
            .iter()
            .fold(String::new(), |mut out, (level, text)| {
                let _ = writeln!(out, "{level} {text}");
                out
            })
    }

    fn push(&self, level: Level, text: String) {
        self.0.lock().unwrap().push((level, text));
    }
}

struct Text(String);

impl Visit for Text {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, "{}={:?} ", field.name(), value);
    }
}

impl<S> Layer<S> for Logs
where
    S: Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut text = Text(String::new());
        event.record(&mut text);
        self.push(*event.metadata().level(), text.0);
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, _id: &Id, _ctx: Context<'_, S>) {
        let mut text = Text(format!("span {}: ", attrs.metadata().name()));
        attrs.record(&mut text);
        self.push(*attrs.metadata().level(), text.0);
    }

    fn on_record(&self, span: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(metadata) = ctx.metadata(span) else {
            return;
        };
        let mut text = Text(format!("span {}: ", metadata.name()));
        values.record(&mut text);
        self.push(*metadata.level(), text.0);
    }
}

/// Runs `f` with a subscriber that captures every record of this thread.
pub fn capture<R>(f: impl FnOnce() -> R) -> (R, Logs) {
    let logs = Logs::default();
    let subscriber = tracing_subscriber::registry().with(logs.clone());
    let r = tracing::subscriber::with_default(subscriber, f);
    (r, logs)
}

/// Captures every record of this thread from now until the guard is dropped (for async
/// tests on a current-thread runtime, where the subscriber sees every task's records).
pub fn capture_from_now() -> (Logs, tracing::subscriber::DefaultGuard) {
    let logs = Logs::default();
    let subscriber = tracing_subscriber::registry().with(logs.clone());
    (logs, tracing::subscriber::set_default(subscriber))
}

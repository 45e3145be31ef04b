//! The bootstrapper's own bounded log buffer: a `tracing` layer that keeps the last N KiB
//! of this process's log lines, so that a failed Init can stream them to its
//! (authenticated) caller.
//!
//! Only this process's own lines are kept, in memory, and only a caller that presented the
//! right init secret receives them: the host journal is not this caller's to read, and a
//! wrong secret gets nothing.
//! Nothing secret is ever logged by this crate, so nothing secret is in the buffer.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// The default capacity: the last 256 KiB of log lines.
pub const DEFAULT_LOG_BUFFER_BYTES: usize = 256 * 1024;
/// The longest single line kept (longer lines are cut and marked).
const MAX_LINE: usize = 4096;

#[derive(Debug, Default)]
struct Inner {
    lines: VecDeque<String>,
    bytes: usize,
    dropped: u64,
}

/// A bounded, shared buffer of log lines. Cheap to clone; clones share the buffer.
#[derive(Debug, Clone)]
pub struct LogBuffer {
    inner: Arc<Mutex<Inner>>,
    capacity: usize,
}

impl Default for LogBuffer {
    fn default() -> Self {
        Self::new(DEFAULT_LOG_BUFFER_BYTES)
    }
}

impl LogBuffer {
    /// A buffer that keeps the most recent `capacity` bytes of lines.
    #[must_use]
    pub fn new(capacity: usize) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Inner::default())),
            capacity: capacity.max(MAX_LINE),
        }
    }

    /// Appends one line (a newline is added), dropping the oldest lines beyond the capacity.
    pub fn push(&self, mut line: String) {
        if line.len() > MAX_LINE {
            let mut cut = MAX_LINE;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
            line.push_str(" …");
        }
        line.push('\n');
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        inner.bytes += line.len();
        inner.lines.push_back(line);
        while inner.bytes > self.capacity {
            match inner.lines.pop_front() {
                Some(old) => {
                    inner.bytes -= old.len();
                    inner.dropped += 1;
                }
                None => break,
            }
        }
    }

    /// The buffered lines, oldest first, with a note when older lines were dropped.
    #[must_use]
    pub fn snapshot(&self) -> Vec<u8> {
        let Ok(inner) = self.inner.lock() else {
            return Vec::new();
        };
        let mut out = Vec::with_capacity(inner.bytes + 64);
        if inner.dropped > 0 {
            out.extend_from_slice(
                format!("[{} older log lines were dropped]\n", inner.dropped).as_bytes(),
            );
        }
        for line in &inner.lines {
            out.extend_from_slice(line.as_bytes());
        }
        out
    }

    /// The layer that feeds this buffer with events at `max_level` and above.
    #[must_use]
    pub fn layer(&self, max_level: Level) -> LogBufferLayer {
        LogBufferLayer {
            buffer: self.clone(),
            max_level,
        }
    }
}

/// A `tracing` layer that writes one line per event into a [`LogBuffer`].
#[derive(Debug, Clone)]
pub struct LogBufferLayer {
    buffer: LogBuffer,
    max_level: Level,
}

struct LineVisitor {
    message: String,
    fields: String,
}

impl Visit for LineVisitor {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }
}

impl<S: Subscriber> Layer<S> for LogBufferLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        if *meta.level() > self.max_level {
            return;
        }
        let mut visitor = LineVisitor {
            message: String::new(),
            fields: String::new(),
        };
        event.record(&mut visitor);
        self.buffer.push(format!(
            "{} {:>5} {}: {}{}",
            utc_now(),
            meta.level(),
            meta.target(),
            visitor.message,
            visitor.fields
        ));
    }
}

/// The current time as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
fn utc_now() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(i64::try_from(days).unwrap_or(0));
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        now.subsec_millis()
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    (
        y,
        u32::try_from(m).unwrap_or(1),
        u32::try_from(d).unwrap_or(1),
    )
}

/// Splits `bytes` into chunks of at most `size` bytes (the InitServer sends 1024-byte
/// chunks).
pub fn chunks(bytes: &[u8], size: usize) -> impl Iterator<Item = Vec<u8>> + '_ {
    bytes.chunks(size.max(1)).map(<[u8]>::to_vec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt as _;

    #[test]
    fn keeps_only_the_most_recent_lines_within_the_capacity() {
        let buffer = LogBuffer::new(8192);
        for i in 0..2000 {
            buffer.push(format!("line {i}"));
        }
        let text = String::from_utf8(buffer.snapshot()).unwrap();
        assert!(text.len() <= 8192 + 64);
        assert!(text.contains("line 1999\n"));
        assert!(!text.contains("line 0\n"));
        assert!(text.starts_with('['), "{text:.60}");
    }

    #[test]
    fn the_layer_records_events_with_their_fields() {
        let buffer = LogBuffer::new(8192);
        let subscriber = tracing_subscriber::registry().with(buffer.layer(Level::INFO));
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(step = "disk", "re-keyed the state disk");
            tracing::debug!("not kept");
        });
        let text = String::from_utf8(buffer.snapshot()).unwrap();
        assert!(text.contains("INFO"), "{text}");
        assert!(
            text.contains("re-keyed the state disk step=\"disk\""),
            "{text}"
        );
        assert!(!text.contains("not kept"));
    }

    #[test]
    fn dates_are_gregorian() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_454), (2026, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    #[test]
    fn chunks_are_at_most_the_given_size() {
        let data = vec![7u8; 2500];
        let sizes: Vec<usize> = chunks(&data, 1024).map(|c| c.len()).collect();
        assert_eq!(sizes, [1024, 1024, 452]);
    }
}

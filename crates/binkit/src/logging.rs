//! The log subscriber of a binary: human-readable lines or one JSON object per line, on
//! stderr, colour only on a terminal.
//!
//! What is logged is chosen by tracing filter directives (`warn,asterism_kms=debug`). The
//! environment variable [`ENV`] (`ASTERISM_LOG`), when set and not blank, replaces a
//! service's default directives: a level or a tracing filter, as for the `asterism` CLI;
//! the end-to-end tests run every process at `trace` with it.

use std::io::IsTerminal as _;

use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer, Registry};

/// The environment variable whose directives replace a binary's defaults.
pub const ENV: &str = "ASTERISM_LOG";

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Human,
    /// One JSON object per line.
    Json,
}

/// The log flags of a service: `--log-format` and `-v`.
#[derive(Debug, Clone, clap::Args)]
pub struct LogArgs {
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,

    /// More log output: -v for debug, -vv for trace.
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

/// The log flag of the operator's command-line tools (`asterism`, `asterism-mini`,
/// `asterism-provision`): `--log`, or [`ENV`], default warn.
#[derive(Debug, Clone, clap::Args)]
pub struct ToolLogArgs {
    /// Log verbosity (error, warn, info, debug, trace) or a tracing filter.
    #[arg(long, global = true, default_value = "warn", env = ENV)]
    pub log: String,
}

impl ToolLogArgs {
    /// Installs the subscriber: human-readable lines selected by `--log`.
    pub fn init(&self) {
        init(LogFormat::Human, &self.log);
    }
}

/// The exit of a command-line tool: its own code, or failure after the error and its causes
/// on stderr.
pub fn tool_exit(result: anyhow::Result<std::process::ExitCode>) -> std::process::ExitCode {
    result.unwrap_or_else(|e| {
        eprintln!("error: {e:#}");
        std::process::ExitCode::FAILURE
    })
}

impl LogArgs {
    /// The level `-v` asks for: info, debug (`-v`) or trace (`-vv`).
    pub fn level(&self) -> &'static str {
        match self.verbose {
            0 => "info",
            1 => "debug",
            _ => "trace",
        }
    }

    /// Installs the subscriber: `crates` (our own) at [`LogArgs::level`], dependencies
    /// (HTTP/2 framing and the like) only at warn, unless [`ENV`] says otherwise.
    pub fn init(&self, crates: &[&str]) {
        init(
            self.log_format,
            &directives(&crate_directives(self.level(), crates)),
        );
    }
}

/// `warn,<crate>=<level>,…`: `crates` and this crate (which logs the signals and the
/// measurement reloads it handles for the binary) at `level`, everything else at warn.
pub fn crate_directives(level: &str, crates: &[&str]) -> String {
    let mut out = String::from("warn");
    for name in crates.iter().chain(&[env!("CARGO_CRATE_NAME")]) {
        out.push_str(&format!(",{name}={level}"));
    }
    out
}

/// The directives in [`ENV`] when set and not blank, else `default`.
pub fn directives(default: &str) -> String {
    match std::env::var(ENV) {
        Ok(env) if !env.trim().is_empty() => env,
        _ => default.to_owned(),
    }
}

/// Installs the process's subscriber, writing what `directives` select in `format` to
/// stderr. A second installation (or a malformed directive, which selects nothing) is
/// reported on stderr, never fatal.
pub fn init(format: LogFormat, directives: &str) {
    // The filter is global here, not the output layer's own: with one, a span or event the
    // directives leave out is never built (no registry entry per request span), where a
    // per-layer filter lets the registry create every span and only then asks the filter.
    // That was about 5 % of the join service's CPU under load (docs/performance.md).
    let filter = EnvFilter::new(directives);
    let fmt = stderr_layer();
    let registry = tracing_subscriber::registry().with(filter);
    let installed = match format {
        LogFormat::Human => registry.with(fmt).try_init(),
        LogFormat::Json => registry.with(fmt.json().flatten_event(true)).try_init(),
    };
    if let Err(err) = installed {
        eprintln!("cannot install the log subscriber: {err}");
    }
}

/// [`init`] with one more layer (with its own filter, if it needs one), for a binary that
/// also keeps log lines elsewhere (the bootstrapper's buffer for failed inits).
pub fn init_with<L>(format: LogFormat, directives: &str, extra: L)
where
    L: Layer<Registry> + Send + Sync + 'static,
{
    let filter = EnvFilter::new(directives);
    let fmt = stderr_layer();
    let registry = tracing_subscriber::registry().with(extra);
    let installed = match format {
        LogFormat::Human => registry.with(fmt.with_filter(filter)).try_init(),
        LogFormat::Json => registry
            .with(fmt.json().flatten_event(true).with_filter(filter))
            .try_init(),
    };
    if let Err(err) = installed {
        eprintln!("cannot install the log subscriber: {err}");
    }
}

/// The output layer: lines on stderr, coloured only on a terminal.
fn stderr_layer<S>() -> tracing_subscriber::fmt::Layer<
    S,
    tracing_subscriber::fmt::format::DefaultFields,
    tracing_subscriber::fmt::format::Format,
    fn() -> std::io::Stderr,
> {
    tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr as fn() -> std::io::Stderr)
        .with_ansi(std::io::stderr().is_terminal())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_crates_get_the_chosen_level_and_the_rest_warn() {
        assert_eq!(
            crate_directives("debug", &["asterism_kms", "asterism_atls"]),
            "warn,asterism_kms=debug,asterism_atls=debug,asterism_binkit=debug"
        );
    }

    #[test]
    fn each_v_raises_the_level() {
        let level = |verbose| {
            LogArgs {
                log_format: LogFormat::Human,
                verbose,
            }
            .level()
        };
        assert_eq!(
            [level(0), level(1), level(2), level(3)],
            ["info", "debug", "trace", "trace"]
        );
    }
}

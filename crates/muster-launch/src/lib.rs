//! Start-up shared by Muster's programs (`muster`, `muster-master`, `muster-agent`, and the
//! examples): logging to stderr, with a tap live monitors open ([`monitor`]), the tokio runtime, the wait for SIGINT or SIGTERM, the
//! settings of the two servers from flags, a config file and defaults
//! ([`settings`](mod@settings)), and their TLS settings ([`security`]).
//!
//! ```no_run
//! use std::process::ExitCode;
//!
//! fn main() -> ExitCode {
//!     muster_launch::init_logging();
//!     let outcome = muster_launch::block_on(async {
//!         let signal = muster_launch::shutdown_signal()?;
//!         // ... start serving ...
//!         let which = signal.await;
//!         tracing::info!(signal = which, "shutting down");
//!         anyhow::Ok(())
//!     });
//!     match outcome {
//!         Ok(()) => ExitCode::SUCCESS,
//!         Err(error) => {
//!             eprintln!("program: {error:#}");
//!             ExitCode::FAILURE
//!         }
//!     }
//! }
//! ```

pub mod monitor;
pub mod security;
pub mod settings;

use std::ffi::OsStr;
use std::future::Future;
use std::io::IsTerminal as _;

use anyhow::Context as _;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

/// The log filter when `RUST_LOG` is unset: `info`, except openraft and sled, whose info lines
/// (every election, vote and snapshot step) would drown the program's own; they log from `warn`.
pub const DEFAULT_FILTER: &str = "info,openraft=warn,sled=warn";

/// The filter to log with: `rust_log` (the value of `RUST_LOG`) if it is set, not blank and
/// valid, else `default`. The second value says why a set `rust_log` was not used.
pub fn filter(rust_log: Option<&str>, default: &str) -> (EnvFilter, Option<String>) {
    match rust_log
        .map(str::trim)
        .filter(|directives| !directives.is_empty())
    {
        None => (EnvFilter::new(default), None),
        Some(directives) => match EnvFilter::try_new(directives) {
            Ok(filter) => (filter, None),
            Err(error) => (
                EnvFilter::new(default),
                Some(format!(
                    "RUST_LOG={directives:?} is not a valid filter ({error}); using {default:?}"
                )),
            ),
        },
    }
}

/// Whether to colour log lines: only on a terminal, and not when `NO_COLOR` is set to a
/// non-empty value (<https://no-color.org>). A pipe or a file gets plain text, never escape
/// codes.
pub fn colour(is_terminal: bool, no_color: Option<&OsStr>) -> bool {
    is_terminal && no_color.is_none_or(OsStr::is_empty)
}

/// The subscriber [`init_logging_with`] installs: lines to `writer` as `filter` lets them
/// through, and events to `tap`'s monitors at their own level.
fn subscriber<W>(
    filter: EnvFilter,
    ansi: bool,
    writer: W,
    tap: &monitor::LogTap,
) -> impl tracing::Subscriber + Send + Sync
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_ansi(ansi)
                .with_writer(writer)
                .with_filter(filter),
        )
        .with(tap.layer())
}

/// Logs to stderr with `RUST_LOG`'s filter, or [`DEFAULT_FILTER`] when it is unset. See
/// [`init_logging_with`].
pub fn init_logging() {
    init_logging_with(DEFAULT_FILTER);
}

/// Logs to stderr with `RUST_LOG`'s filter, or `default` when it is unset (an invalid
/// `RUST_LOG` is reported, then `default` is used). Colour only when stderr is a terminal (see
/// [`colour`]). Live monitors open on [`monitor::tap`]. Does nothing if this process already
/// has a global subscriber.
pub fn init_logging_with(default: &str) {
    let rust_log = std::env::var("RUST_LOG").ok();
    let (filter, ignored) = filter(rust_log.as_deref(), default);
    let ansi = colour(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let tap = monitor::LogTap::default();
    if tracing::subscriber::set_global_default(subscriber(filter, ansi, std::io::stderr, &tap))
        .is_ok()
    {
        monitor::install(tap);
        if let Some(why) = ignored {
            tracing::warn!("{why}");
        }
    }
}

/// A multi-threaded tokio runtime with every driver (I/O, time, signals) enabled.
///
/// # Errors
/// If the runtime cannot be built (the OS refused threads or an event queue).
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")
}

/// Runs `future` to its end on a new [`runtime`].
///
/// # Errors
/// If the runtime cannot be built, or what `future` returns.
pub fn block_on<T>(future: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    runtime()?.block_on(future)
}

/// Waits for SIGINT (Ctrl-C) or SIGTERM and says which came (`"SIGINT"` or `"SIGTERM"`).
///
/// The handlers are installed when this is called, not when the future is first polled: a
/// signal that arrives in between is not lost. Call it inside a tokio runtime.
///
/// # Errors
/// If a handler cannot be installed (no runtime, or the OS refused).
pub fn shutdown_signal() -> anyhow::Result<impl Future<Output = &'static str> + Send + 'static> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => "SIGINT",
            _ = terminate.recv() => "SIGTERM",
        }
    })
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex, PoisonError};
    use std::time::Duration;

    use super::*;

    /// Log output kept in memory.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Captured {
        fn text(&self) -> String {
            let bytes = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            String::from_utf8_lossy(&bytes).into_owned()
        }
    }

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Captured {
        type Writer = Captured;

        fn make_writer(&'w self) -> Captured {
            self.clone()
        }
    }

    /// What `filter` lets through of a few events, logged as their crates would log them.
    fn logged(filter: EnvFilter, ansi: bool) -> String {
        let out = Captured::default();
        let tap = monitor::LogTap::default();
        tracing::subscriber::with_default(subscriber(filter, ansi, out.clone(), &tap), || {
            tracing::info!(target: "openraft::core::raft_core", "openraft info");
            tracing::warn!(target: "openraft::core::raft_core", "openraft warn");
            tracing::info!(target: "sled::pagecache", "sled info");
            tracing::warn!(target: "sled::pagecache", "sled warn");
            tracing::info!(target: "muster_master::master", "muster info");
            tracing::debug!(target: "muster_master::master", "muster debug");
        });
        out.text()
    }

    #[test]
    fn the_default_filter_keeps_openraft_and_sled_at_warn() {
        let (filter, ignored) = filter(None, DEFAULT_FILTER);
        assert_eq!(ignored, None);
        let text = logged(filter, false);
        assert!(!text.contains("openraft info"), "{text}");
        assert!(text.contains("openraft warn"), "{text}");
        assert!(!text.contains("sled info"), "{text}");
        assert!(text.contains("sled warn"), "{text}");
        assert!(text.contains("muster info"), "{text}");
        assert!(!text.contains("muster debug"), "{text}");
    }

    #[test]
    fn rust_log_replaces_the_default() {
        let (filter, ignored) = filter(Some("openraft=info"), DEFAULT_FILTER);
        assert_eq!(ignored, None);
        let text = logged(filter, false);
        assert!(text.contains("openraft info"), "{text}");
        assert!(!text.contains("muster info"), "{text}");
    }

    #[test]
    fn a_blank_rust_log_is_unset_and_an_invalid_one_is_reported() {
        let (filter_blank, ignored) = filter(Some("  "), DEFAULT_FILTER);
        assert_eq!(ignored, None);
        assert!(!logged(filter_blank, false).contains("openraft info"));

        let (fallback, ignored) = filter(Some("muster=loud"), DEFAULT_FILTER);
        let why = ignored.unwrap_or_default();
        assert!(why.contains("muster=loud"), "{why}");
        let text = logged(fallback, false);
        assert!(text.contains("muster info"), "{text}");
        assert!(!text.contains("openraft info"), "{text}");
    }

    #[test]
    fn plain_output_has_no_escape_codes() {
        let (plain, _) = filter(None, DEFAULT_FILTER);
        let text = logged(plain, false);
        assert!(text.contains("muster info"), "{text}");
        assert!(!text.contains('\x1b'), "{text:?}");
        // The check above can fail: coloured output has them.
        let (coloured, _) = filter(None, DEFAULT_FILTER);
        assert!(logged(coloured, true).contains('\x1b'));
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(colour(true, None));
        assert!(colour(true, Some(OsStr::new(""))));
        assert!(!colour(true, Some(OsStr::new("1"))));
        assert!(!colour(false, None));
        assert!(!colour(false, Some(OsStr::new(""))));
    }

    #[test]
    fn block_on_runs_the_future_and_passes_its_error_on() {
        assert_eq!(block_on(async { anyhow::Ok(7) }).ok(), Some(7));
        let failed = block_on(async { Err::<(), _>(anyhow::anyhow!("boom")) });
        assert_eq!(
            failed.map_err(|e| e.to_string()).err().as_deref(),
            Some("boom")
        );
    }

    #[tokio::test]
    async fn sigterm_ends_the_wait() -> anyhow::Result<()> {
        let signal = shutdown_signal()?;
        // Sent before the future is first polled: the handler is already in place.
        let status = std::process::Command::new("kill")
            .args(["-TERM", &std::process::id().to_string()])
            .status()?;
        anyhow::ensure!(status.success(), "kill failed: {status}");
        let which = tokio::time::timeout(Duration::from_secs(20), signal).await?;
        assert_eq!(which, "SIGTERM");
        Ok(())
    }
}

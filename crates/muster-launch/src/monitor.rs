//! Live logs: a tap on this process's log that monitors (`muster monitor`, Nomad's `monitor`)
//! open, each at a level of its own.
//!
//! The tap logs nothing while no monitor is open. Opening one at `debug` raises the tap (not the
//! log on stderr) to `debug` for as long as it is open; when the last monitor closes, the tap
//! goes back to nothing. The level is a per-layer filter whose hint tracing reads: changing it
//! rebuilds tracing's callsite cache, so a `debug!` in a hot path costs nothing while no one
//! monitors at `debug`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::broadcast;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::{Context, Filter, Layer};

/// How many lines a monitor may fall behind before it is told it lost some.
const BACKLOG: usize = 1024;

/// Libraries whose debug and trace events a monitor never gets: the HTTP/2, TLS and I/O
/// stacks that carry the monitor's own stream would log every line they send, and each of
/// those lines again.
const TRANSPORT_TARGETS: &[&str] = &[
    "h2",
    "hyper",
    "hyper_util",
    "tower",
    "tonic",
    "rustls",
    "tokio_util",
    "mio",
    "want",
];

/// One log event, as a monitor receives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogLine {
    /// Its level.
    pub level: Level,
    /// As the log on stderr shows it: `2026-11-29T10:00:00.000000Z DEBUG target: message k=v`.
    pub text: String,
    /// As one JSON object: `timestamp`, `level`, `target`, and the event's fields (`message`
    /// among them).
    pub json: String,
}

/// The tap: where monitors open, and the layer and filter the logger installs.
#[derive(Clone, Debug)]
pub struct LogTap {
    inner: Arc<TapState>,
}

#[derive(Debug)]
struct TapState {
    lines: broadcast::Sender<Arc<LogLine>>,
    /// The open monitors' levels, by monitor.
    monitors: Mutex<BTreeMap<u64, Level>>,
    next_monitor: AtomicU64,
    /// The tap's level: 0 nothing, then error (1) to trace (5).
    level: AtomicUsize,
}

static TAP: OnceLock<LogTap> = OnceLock::new();

/// The tap of this process's logger, if it logs through [`init_logging`](crate::init_logging).
pub fn tap() -> Option<&'static LogTap> {
    TAP.get()
}

/// Makes `tap` the process's tap ([`tap`]); false if it already has one.
pub(crate) fn install(tap: LogTap) -> bool {
    TAP.set(tap).is_ok()
}

/// A level's place in the tap's order: error 1 .. trace 5.
fn rank(level: Level) -> usize {
    match level {
        Level::ERROR => 1,
        Level::WARN => 2,
        Level::INFO => 3,
        Level::DEBUG => 4,
        Level::TRACE => 5,
    }
}

fn filter_of(rank: usize) -> LevelFilter {
    match rank {
        0 => LevelFilter::OFF,
        1 => LevelFilter::ERROR,
        2 => LevelFilter::WARN,
        3 => LevelFilter::INFO,
        4 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    }
}

/// A level by name (`trace`, `debug`, `info`, `warn`, `error`, any case).
///
/// # Errors
/// A message naming the word and the levels there are.
pub fn parse_level(name: &str) -> Result<Level, String> {
    name.trim()
        .parse::<Level>()
        .map_err(|_| format!("log level {name:?} is not one of trace, debug, info, warn, error"))
}

/// A monitor's level as a request gives it: empty means `info`, else as [`parse_level`].
///
/// # Errors
/// As [`parse_level`].
pub fn requested_level(name: &str) -> Result<Level, String> {
    match name.trim() {
        "" => Ok(Level::INFO),
        named => parse_level(named),
    }
}

impl Default for LogTap {
    fn default() -> Self {
        LogTap {
            inner: Arc::new(TapState {
                lines: broadcast::channel(BACKLOG).0,
                monitors: Mutex::new(BTreeMap::new()),
                next_monitor: AtomicU64::new(0),
                level: AtomicUsize::new(0),
            }),
        }
    }
}

impl LogTap {
    /// Opens a monitor that receives every event at `level` or above from now until it is
    /// dropped.
    pub fn open(&self, level: Level) -> Monitor {
        let id = self.inner.next_monitor.fetch_add(1, Ordering::Relaxed);
        let receiver = self.inner.lines.subscribe();
        lock(&self.inner.monitors).insert(id, level);
        self.retune();
        Monitor {
            tap: self.clone(),
            id,
            level,
            receiver,
        }
    }

    /// The tap's level now: the most verbose of the open monitors', or `OFF` with none open.
    pub fn level(&self) -> LevelFilter {
        filter_of(self.inner.level.load(Ordering::Acquire))
    }

    /// Sets the tap's level from the open monitors, and has tracing ask again which events
    /// are wanted.
    fn retune(&self) {
        let most = lock(&self.inner.monitors)
            .values()
            .map(|level| rank(*level))
            .max()
            .unwrap_or(0);
        if self.inner.level.swap(most, Ordering::AcqRel) != most {
            tracing::callsite::rebuild_interest_cache();
        }
    }

    /// The layer that hands events to the monitors, with the filter that holds it to the
    /// tap's level: add it to the process's subscriber.
    pub fn layer<S>(&self) -> impl Layer<S> + Send + Sync + 'static
    where
        S: Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        TapLayer { tap: self.clone() }.with_filter(TapFilter { tap: self.clone() })
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// One open monitor. Dropping it closes it, and the tap's level follows.
#[derive(Debug)]
pub struct Monitor {
    tap: LogTap,
    id: u64,
    level: Level,
    receiver: broadcast::Receiver<Arc<LogLine>>,
}

/// What a monitor receives next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Received {
    /// A line at its level or above.
    Line(Arc<LogLine>),
    /// It fell behind and this many lines were dropped.
    Dropped(u64),
}

impl Received {
    /// What a reader is shown: the line as text, or as `json`, or a note of the lines lost.
    pub fn render(&self, json: bool) -> String {
        match self {
            Received::Line(line) if json => line.json.clone(),
            Received::Line(line) => line.text.clone(),
            Received::Dropped(n) => {
                format!("({n} lines dropped: this monitor fell behind the log)")
            }
        }
    }

    /// The line's level (`DEBUG`), or `""` for a note of lines lost.
    pub fn level_name(&self) -> &'static str {
        match self {
            Received::Line(line) => line.level.as_str(),
            Received::Dropped(_) => "",
        }
    }
}

impl Monitor {
    /// The next line at this monitor's level, or how many it missed; `None` once the tap is
    /// gone.
    pub async fn next(&mut self) -> Option<Received> {
        loop {
            match self.receiver.recv().await {
                Ok(line) if line.level <= self.level => return Some(Received::Line(line)),
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(n)) => return Some(Received::Dropped(n)),
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }

    /// The next line if one is already waiting, without waiting for one.
    pub fn try_next(&mut self) -> Option<Received> {
        loop {
            match self.receiver.try_recv() {
                Ok(line) if line.level <= self.level => return Some(Received::Line(line)),
                Ok(_) => {}
                Err(broadcast::error::TryRecvError::Lagged(n)) => {
                    return Some(Received::Dropped(n));
                }
                Err(_) => return None,
            }
        }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        lock(&self.tap.inner.monitors).remove(&self.id);
        self.tap.retune();
    }
}

/// Holds the tap's layer to its level.
struct TapFilter {
    tap: LogTap,
}

impl TapFilter {
    fn allows(&self, metadata: &Metadata<'_>) -> bool {
        let level = rank(*metadata.level());
        level <= self.tap.inner.level.load(Ordering::Acquire)
            && (level <= rank(Level::INFO) || !is_transport(metadata.target()))
    }
}

impl<S> Filter<S> for TapFilter {
    fn enabled(&self, metadata: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        self.allows(metadata)
    }

    fn callsite_enabled(
        &self,
        metadata: &'static Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        if self.allows(metadata) {
            tracing::subscriber::Interest::always()
        } else {
            tracing::subscriber::Interest::never()
        }
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(self.tap.level())
    }
}

/// Whether `target` is one of [`TRANSPORT_TARGETS`] or a module of one.
fn is_transport(target: &str) -> bool {
    let root = target.split("::").next().unwrap_or(target);
    TRANSPORT_TARGETS.contains(&root)
}

/// Formats each event it sees and sends it to the open monitors.
struct TapLayer {
    tap: LogTap,
}

impl<S: Subscriber> Layer<S> for TapLayer {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        if self.tap.inner.lines.receiver_count() == 0 {
            return;
        }
        let metadata = event.metadata();
        let mut fields = Fields::default();
        event.record(&mut fields);
        let timestamp = humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string();
        let mut text = format!(
            "{timestamp} {:>5} {}: {}",
            metadata.level(),
            metadata.target(),
            fields.message
        );
        let mut json = serde_json::Map::new();
        json.insert("timestamp".into(), timestamp.into());
        json.insert("level".into(), metadata.level().as_str().into());
        json.insert("target".into(), metadata.target().into());
        json.insert("message".into(), fields.message.clone().into());
        for (name, value) in fields.others {
            let _ = write!(text, " {name}={value}");
            json.insert(name, value.into());
        }
        let line = LogLine {
            level: *metadata.level(),
            text,
            json: serde_json::Value::Object(json).to_string(),
        };
        let _ = self.tap.inner.lines.send(Arc::new(line));
    }
}

/// An event's fields as text: its message, and the others in order.
#[derive(Default)]
struct Fields {
    message: String,
    others: Vec<(String, String)>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_owned();
        } else {
            self.others
                .push((field.name().to_owned(), value.to_owned()));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        } else {
            self.others
                .push((field.name().to_owned(), format!("{value:?}")));
        }
    }
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::layer::SubscriberExt as _;

    use super::*;

    #[tokio::test]
    async fn a_monitor_sees_its_level_and_the_tap_returns_to_nothing_when_it_closes() {
        let tap = LogTap::default();
        let subscriber = tracing_subscriber::registry().with(tap.layer());
        let _default = tracing::subscriber::set_default(subscriber);
        assert_eq!(
            tap.level(),
            LevelFilter::OFF,
            "nothing while no one monitors"
        );

        let mut debug = tap.open(Level::DEBUG);
        let mut warn = tap.open(Level::WARN);
        assert_eq!(
            tap.level(),
            LevelFilter::DEBUG,
            "the most verbose monitor's level"
        );
        tracing::debug!(agent = "a-1", "heartbeat late");
        tracing::warn!("disk nearly full");
        tracing::trace!("never seen: above every monitor's level");
        tracing::debug!(target: "h2::codec", "never seen: the transport's own debug lines");

        let Some(Received::Line(line)) = debug.next().await else {
            panic!("the debug monitor saw nothing");
        };
        assert_eq!(line.level, Level::DEBUG);
        assert!(line.text.contains("DEBUG"), "{}", line.text);
        assert!(
            line.text.ends_with("heartbeat late agent=a-1"),
            "{}",
            line.text
        );
        let json: serde_json::Value = serde_json::from_str(&line.json).expect("JSON");
        assert_eq!(json["message"], "heartbeat late");
        assert_eq!(json["agent"], "a-1");
        assert_eq!(json["level"], "DEBUG");
        let Some(Received::Line(line)) = debug.next().await else {
            panic!("the debug monitor missed the warning");
        };
        assert_eq!(line.level, Level::WARN);
        let Some(Received::Line(line)) = warn.next().await else {
            panic!("the warn monitor saw nothing");
        };
        assert_eq!(
            line.level,
            Level::WARN,
            "the warn monitor skipped the debug line"
        );

        drop(debug);
        assert_eq!(
            tap.level(),
            LevelFilter::WARN,
            "back to the open monitor's level"
        );
        drop(warn);
        assert_eq!(tap.level(), LevelFilter::OFF, "back to nothing");
    }

    #[test]
    fn levels_are_read_by_name_and_a_wrong_one_is_named() {
        assert_eq!(parse_level("DEBUG"), Ok(Level::DEBUG));
        assert_eq!(parse_level(" warn "), Ok(Level::WARN));
        let refused = parse_level("loud").expect_err("not a level");
        assert!(
            refused.contains("\"loud\"") && refused.contains("trace, debug"),
            "{refused}"
        );
    }
}

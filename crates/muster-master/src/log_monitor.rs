//! `Operator/Monitor`: this master's log, streamed as it happens from the process's log tap
//! (`muster_launch::monitor`), at the level the caller asks for.

use muster_launch::monitor::{self, Received};
use muster_proto::cluster as pb;
use tonic::Status;

/// The lines of this master's log from `log_level` (empty: info) up, as text or `json`, until
/// the stream is dropped.
///
/// # Errors
/// `INVALID_ARGUMENT` for a level that is not one; `FAILED_PRECONDITION` when this process
/// does not log through Muster's logger (a master run inside another program).
pub(crate) fn stream(
    log_level: &str,
    json: bool,
) -> Result<impl futures_util::Stream<Item = Result<pb::LogLine, Status>> + Send + 'static, Status>
{
    let level = match log_level.trim() {
        "" => tracing::Level::INFO,
        named => monitor::parse_level(named).map_err(Status::invalid_argument)?,
    };
    let tap = monitor::tap().ok_or_else(|| {
        Status::failed_precondition(
            "this master runs inside a program that installed its own logger: it has no log \
             to monitor",
        )
    })?;
    tracing::info!(%level, json, "a monitor opened");
    let monitor = tap.open(level);
    Ok(futures_util::stream::unfold(
        monitor,
        move |mut monitor| async move {
            let line = match monitor.next().await? {
                Received::Line(line) => pb::LogLine {
                    line: if json {
                        line.json.clone()
                    } else {
                        line.text.clone()
                    },
                    level: line.level.as_str().to_owned(),
                },
                Received::Dropped(n) => pb::LogLine {
                    line: format!("({n} lines dropped: this monitor fell behind the log)"),
                    level: String::new(),
                },
            };
            Some((Ok(line), monitor))
        },
    ))
}

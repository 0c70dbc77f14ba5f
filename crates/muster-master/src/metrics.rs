//! The master's metrics in Prometheus's formats, encoded by `prometheus-client`.
//!
//! Two kinds of figures make up a rendering:
//! - **Instruments** observed where things happen ([`MasterInstruments`], in `instruments`):
//!   the latency histograms of scheduler runs, plans and registry writes, and the counters of
//!   evaluations, placements, heartbeats and leader changes. The master process owns them and
//!   shares them (an `Arc`) with its scheduler workers; they are registered once, in one
//!   [`Registry`](prometheus_client::registry::Registry) per master.
//! - **Figures** read at each rendering: one ask to the master process answers its own
//!   counters, agents, tasks by state and the handles to the rest ([`MetricsSnapshot`]); the
//!   broker's and the blocked-queue's queues, the registrar's writes, the raft member's
//!   indexes and the actor runtime's counters are then read beside the master, which goes on
//!   handling messages, and the whole is encoded on the caller's task, off the actor's
//!   thread.
//!
//! Every master answers, leading or not ([`render`]). Counters never go back: they count since
//! the master process started, across leadership changes. Gauges are what is current.
//!
//! [`Format`] picks the encoding: OpenMetrics 1.0 (what [`render`] gives) or the Prometheus
//! text format 0.0.4, which `promtool check metrics` and scrapers that do not ask for
//! OpenMetrics read (an OpenMetrics counter's family is named without its `_total` suffix,
//! which the 0.0.4 parsers read as two families).

use std::time::Duration;

use muster_actor::{Pid, Process};
use prometheus_client::encoding::prometheus_text;

use crate::error::ServiceError;
use snapshot::GetMetricsSnapshot;

mod encode;
pub(crate) mod instruments;
pub(crate) mod snapshot;

pub use instruments::MasterInstruments;
pub use snapshot::MetricsSnapshot;

/// One label and its value.
type Label = (&'static str, &'static str);

/// The `Content-Type` of [`Format::OpenMetrics`].
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The `Content-Type` of [`Format::PrometheusText`].
pub const PROMETHEUS_TEXT_CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// How long a rendering waits for each process it asks (the master, its broker, its
/// blocked-queue, its registrar).
pub const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// The master's metrics in OpenMetrics text 1.0, as `prometheus-client` writes it, ending in
/// `# EOF` (serve it as [`OPENMETRICS_CONTENT_TYPE`]).
///
/// # Errors
/// [`ServiceError::Unavailable`] if the master, its broker or its blocked-queue did not
/// answer within [`ASK_TIMEOUT`] (they have ended, or are stuck).
pub async fn render<P>(master: &Pid<P>) -> Result<String, ServiceError>
where
    P: Process,
    P::Message: From<GetMetricsSnapshot>,
{
    render_as(master, Format::OpenMetrics).await
}

/// The master's metrics in `format`.
///
/// # Errors
/// As [`render`].
pub async fn render_as<P>(master: &Pid<P>, format: Format) -> Result<String, ServiceError>
where
    P: Process,
    P::Message: From<GetMetricsSnapshot>,
{
    let snapshot = master
        .ask_timeout(ASK_TIMEOUT, |reply| GetMetricsSnapshot { reply }.into())
        .await?;
    let figures = snapshot.gather().await?;
    encode::encode(&snapshot.instruments, &figures, format)
        .map_err(|e| ServiceError::Unavailable(format!("the metrics did not encode: {e}")))
}

/// The text formats a rendering can take.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics text 1.0, ending in `# EOF`: what Prometheus asks for first.
    #[default]
    OpenMetrics,
    /// The Prometheus text format 0.0.4: what `promtool check metrics` reads, and scrapers
    /// that do not ask for OpenMetrics.
    PrometheusText,
}

impl Format {
    /// The format an HTTP request's `Accept` header asks for: OpenMetrics if it names
    /// `application/openmetrics-text`, else the Prometheus text format (also for a missing
    /// header, as Prometheus's own exporters answer).
    pub fn from_accept(accept: Option<&str>) -> Format {
        let asks_openmetrics = accept.is_some_and(|accept| {
            accept.split(',').any(|range| {
                range
                    .split(';')
                    .next()
                    .is_some_and(|media| media.trim() == "application/openmetrics-text")
            })
        });
        if asks_openmetrics {
            Format::OpenMetrics
        } else {
            Format::PrometheusText
        }
    }

    /// The `Content-Type` to serve it with.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
            Format::PrometheusText => PROMETHEUS_TEXT_CONTENT_TYPE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_accept_header_picks_the_format() {
        let openmetrics = "application/openmetrics-text;version=1.0.0,text/plain;q=0.5";
        assert_eq!(Format::from_accept(Some(openmetrics)), Format::OpenMetrics);
        assert_eq!(
            Format::from_accept(Some("text/plain; version=0.0.4")),
            Format::PrometheusText
        );
        assert_eq!(Format::from_accept(None), Format::PrometheusText);
        assert_eq!(
            Format::OpenMetrics.content_type(),
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
        );
    }
}

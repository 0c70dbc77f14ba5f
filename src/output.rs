//! How a command prints its answer: as text for people, or with `--json` as the JSON document
//! the HTTP API answers for the same thing (`muster_api`), one per line, for scripts; and the
//! pieces of text several commands print alike (a stale read's line, a task state's name).

use std::io::Write;

use muster::model::TaskState;
use muster::proto::cluster as pb;

use crate::when;

/// Text or JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    /// Tables and sentences.
    Text,
    /// One JSON document.
    Json,
}

impl Format {
    /// `--json` given or not.
    pub(crate) fn from_flag(json: bool) -> Format {
        if json { Format::Json } else { Format::Text }
    }

    /// Whether to print JSON.
    pub(crate) fn is_json(self) -> bool {
        self == Format::Json
    }
}

/// Prints `document` as one line of JSON on stdout.
pub(crate) fn print_json<T: serde::Serialize>(document: &T) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, document)?;
    writeln!(out)?;
    out.flush()?;
    Ok(())
}

/// One line saying how stale a stale read may be; nothing for a linearizable one.
pub(crate) fn staleness(read: Option<&pb::ReadInfo>) -> Option<String> {
    let read = read.filter(|r| r.stale)?;
    let contact = match read.last_contact_ms {
        0 => "it leads".to_owned(),
        u64::MAX => "it has not heard from a leader".to_owned(),
        ms => format!(
            "last heard from the leader {} ago",
            humantime::format_duration(std::time::Duration::from_millis(ms))
        ),
    };
    Some(format!(
        "stale read: registry index {}, {contact}{}",
        read.applied_index,
        if read.known_leader {
            ""
        } else {
            ", no leader known"
        }
    ))
}

/// A task state's name (`running`), or its number if it is not one this CLI knows.
pub(crate) fn state_name(state: i32) -> String {
    TaskState::try_from(state).map_or_else(|_| state.to_string(), |s| s.name().to_owned())
}

/// An agent's scheduling in words: `draining, deadline 2026-... (in 59m)`, `eligible`, ...
pub(crate) fn describe_scheduling(doc: &muster_api::AgentScheduling) -> String {
    let eligibility = if doc.eligible {
        "eligible"
    } else {
        "ineligible"
    };
    match doc.drain.as_str() {
        "draining" if doc.drain_deadline_ms == 0 => "draining, no deadline".to_owned(),
        "draining" => format!(
            "draining, deadline {}",
            when::rfc3339(doc.drain_deadline_ms)
        ),
        "stopping" => "draining, deadline passed: stopping what is left".to_owned(),
        "drained" => "drained (ineligible)".to_owned(),
        _ => eligibility.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_read_says_how_stale_and_a_linearizable_one_nothing() {
        let read = |last_contact_ms, known_leader| pb::ReadInfo {
            stale: true,
            applied_index: 42,
            last_contact_ms,
            known_leader,
        };
        assert_eq!(
            staleness(Some(&read(0, true))).as_deref(),
            Some("stale read: registry index 42, it leads")
        );
        assert_eq!(
            staleness(Some(&read(1_500, true))).as_deref(),
            Some("stale read: registry index 42, last heard from the leader 1s 500ms ago")
        );
        assert_eq!(
            staleness(Some(&read(u64::MAX, false))).as_deref(),
            Some("stale read: registry index 42, it has not heard from a leader, no leader known")
        );
        let linearizable = pb::ReadInfo {
            stale: false,
            ..read(0, true)
        };
        assert_eq!(staleness(Some(&linearizable)), None);
        assert_eq!(staleness(None), None);
    }

    #[test]
    fn a_task_state_is_named_or_numbered() {
        let running = muster::proto::model::TaskState::Running as i32;
        assert_eq!(state_name(running), "RUNNING");
        assert_eq!(state_name(999), "999");
    }
}

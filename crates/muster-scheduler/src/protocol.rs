//! What the scheduling API's two sides agree on beyond the messages: size and time limits,
//! metadata keys, and the statuses with a meaning of their own.
//!
//! # Not the leader
//! Every Muster gRPC API (operator and scheduling) answers a call that only the leading master
//! serves the same way when it reaches a standby: `FAILED_PRECONDITION`, the message
//! "not the leading master; the leader is HOST:PORT", and the leader's `host:port` (where its
//! operator and scheduling APIs are served) in the [`LEADER_METADATA`] (`muster-leader`) ASCII
//! metadata ([`not_leader`]). While no leader is known the answer is `UNAVAILABLE`: try again
//! later, or another master. Callers (the `muster` CLI, remote workers) call any master and,
//! on an answer naming a leader ([`leader_hint`]), retry there. `GetState` and `GetMetrics`
//! answer on every master (they are how one finds the leader); every other operator call and
//! every scheduling call is leader-only. Agents, which talk to masters over the actor
//! transport rather than gRPC, get the same answer as a `muster.model.v1.NotLeader` reply
//! naming the leader's process address.
//!
//! # Errors on the wire
//! | status | meaning |
//! |---|---|
//! | `FAILED_PRECONDITION` | a standby; the leader in the `muster-leader` metadata and the message |
//! | `UNAVAILABLE` | no leader known yet, or the master cannot be reached |
//! | `ABORTED` | the broker or the master refused (stale token, failed write) |
//! | `OUT_OF_RANGE` | a snapshot older than asked for ([`stale_snapshot`]) |
//! | `INVALID_ARGUMENT` | a malformed request, naming the field |
//! | `NOT_FOUND` | an unknown job |

use std::time::Duration;

use tonic::metadata::MetadataValue;
use tonic::{Code, Status};

use crate::worker::WorkerError;

/// The longest a dequeue long-polls; the master caps longer requests to it.
pub const MAX_DEQUEUE_TIMEOUT: Duration = Duration::from_secs(30);

/// The default largest message either side sends or accepts: snapshots of big clusters are big.
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 64 * 1024 * 1024;

/// How often a leader's `WatchCluster` stream carries a message when nothing changes (the
/// index as it is), so that a watcher can tell a quiet cluster from a silent leader.
pub const WATCH_KEEPALIVE: Duration = Duration::from_secs(1);

/// How long a watcher waits for a message before it takes the leader as gone and watches
/// again, at the leader it finds then.
pub const WATCH_SILENCE: Duration = Duration::from_secs(5);

/// Metadata key of a standby's answer: the leading master's `host:port`.
pub const LEADER_METADATA: &str = "muster-leader";

/// Metadata key of a stale-snapshot answer: the index of the master's state.
pub const SNAPSHOT_INDEX_METADATA: &str = "muster-snapshot-index";

/// The words before the leader's address in a standby's answer.
const LEADER_IS: &str = "the leader is ";

/// The message of a "not the leader" answer: naming `leader` (`host:port`) if known.
pub fn not_leader_message(leader: Option<&str>) -> String {
    match leader.filter(|leader| !leader.is_empty()) {
        Some(leader) => format!("not the leading master; {LEADER_IS}{leader}"),
        None => "not the leading master, and no leader is known yet".to_owned(),
    }
}

/// The answer of a master that does not lead: `FAILED_PRECONDITION` naming `leader`
/// (`host:port`) in the message and in the [`LEADER_METADATA`] metadata, or `UNAVAILABLE` if
/// no leader is known (`None` or empty).
pub fn not_leader(leader: Option<&str>) -> Status {
    let Some(leader) = leader.filter(|leader| !leader.is_empty()) else {
        return Status::unavailable(not_leader_message(None));
    };
    let mut status = Status::failed_precondition(not_leader_message(Some(leader)));
    if let Ok(value) = MetadataValue::try_from(leader) {
        status.metadata_mut().insert(LEADER_METADATA, value);
    }
    status
}

/// The leader a [`not_leader`] answer names, if `status` is one and names one.
pub fn leader_hint(status: &Status) -> Option<String> {
    if status.code() != Code::FailedPrecondition {
        return None;
    }
    let from_metadata = status
        .metadata()
        .get(LEADER_METADATA)
        .and_then(|value| value.to_str().ok())
        .map(str::trim)
        .filter(|leader| !leader.is_empty());
    let from_message = || {
        status
            .message()
            .rsplit_once(LEADER_IS)
            .map(|(_, leader)| leader.trim())
            .filter(|leader| !leader.is_empty() && !leader.contains(char::is_whitespace))
    };
    from_metadata.or_else(from_message).map(str::to_owned)
}

/// A stale-snapshot answer: `OUT_OF_RANGE`, with the index the master has in the
/// [`SNAPSHOT_INDEX_METADATA`] metadata.
pub fn stale_snapshot(min_index: u64, got: u64) -> Status {
    let mut status =
        Status::out_of_range(WorkerError::StaleSnapshot { min_index, got }.to_string());
    if let Ok(value) = MetadataValue::try_from(got.to_string()) {
        status.metadata_mut().insert(SNAPSHOT_INDEX_METADATA, value);
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_standby_answer_names_the_leader() {
        let status = not_leader(Some("10.0.0.7:5050"));
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert_eq!(
            status.message(),
            "not the leading master; the leader is 10.0.0.7:5050"
        );
        assert_eq!(leader_hint(&status).as_deref(), Some("10.0.0.7:5050"));
        // The message alone is enough (a proxy may drop metadata).
        let bare = Status::failed_precondition(status.message());
        assert_eq!(leader_hint(&bare).as_deref(), Some("10.0.0.7:5050"));
        // Other answers name none.
        assert_eq!(leader_hint(&Status::failed_precondition("nope")), None);
        assert_eq!(
            leader_hint(&Status::unavailable("the leader is 1.2.3.4:5")),
            None
        );

        // No leader known: try again later, or another master.
        for status in [not_leader(None), not_leader(Some(""))] {
            assert_eq!(status.code(), Code::Unavailable);
            assert_eq!(status.message(), not_leader_message(None));
            assert_eq!(leader_hint(&status), None);
        }

        let stale = stale_snapshot(10, 7);
        assert_eq!(stale.code(), Code::OutOfRange);
        assert_eq!(
            stale
                .metadata()
                .get(SNAPSHOT_INDEX_METADATA)
                .and_then(|v| v.to_str().ok()),
            Some("7")
        );
    }
}

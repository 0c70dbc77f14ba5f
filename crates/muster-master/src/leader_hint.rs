//! Where the leader is: the one "not the leader" convention of every gRPC API a master serves
//! (operator and scheduling).
//!
//! # The convention
//! A master that does not lead answers a leader-only call with
//! - `FAILED_PRECONDITION`, the message `not the leading master; the leader is HOST:PORT`, and
//!   the leader's address (`HOST:PORT`, where its operator and scheduling APIs are served) in
//!   the [`METADATA_KEY`] (`muster-leader`) ASCII metadata, when it knows the leader;
//! - `UNAVAILABLE` and `not the leading master, and no leader is known yet` when it knows none
//!   (an election is under way): try again later, or another master.
//!
//! A caller calls any master and, on `FAILED_PRECONDITION` naming a leader ([`leader_of`]),
//! retries once at that address. `GetState` and `GetMetrics` answer on every master (they are
//! how one finds the leader); `SubmitJob`, `StopJob`, `JobStatus`, `LaunchTask` and every
//! scheduling call are leader-only.
//!
//! The scheduler SDK's remote backend reads the same answers
//! ([`muster_scheduler::remote::leader_hint`]); this module builds and reads them with the SDK's
//! own definitions, so the two cannot drift apart.

use muster_scheduler::remote;
use tonic::Status;

/// The ASCII metadata key carrying the leader's address (`host:port`) in a standby's answer.
pub const METADATA_KEY: &str = remote::LEADER_METADATA;

/// The message of a "not the leader" answer: naming `leader` (`host:port`) if known.
pub fn message(leader: Option<&str>) -> String {
    match leader {
        Some(leader) => format!("not the leading master; the leader is {leader}"),
        None => "not the leading master, and no leader is known yet".to_owned(),
    }
}

/// The answer of a master that does not lead: `FAILED_PRECONDITION` naming `leader` in the
/// message and the [`METADATA_KEY`] metadata, or `UNAVAILABLE` if no leader is known.
pub fn not_leader(leader: Option<&str>) -> Status {
    match leader.filter(|leader| !leader.is_empty()) {
        Some(leader) => remote::not_leader(leader),
        None => Status::unavailable(message(None)),
    }
}

/// The leader's address (`host:port`) a [`not_leader`] answer names, if `status` is one and
/// names one.
pub fn leader_of(status: &Status) -> Option<String> {
    remote::leader_hint(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_standby_answer_names_the_leader_in_message_and_metadata() {
        let status = not_leader(Some("10.0.0.2:5050"));
        assert_eq!(status.code(), tonic::Code::FailedPrecondition);
        assert_eq!(status.message(), message(Some("10.0.0.2:5050")));
        assert_eq!(
            status
                .metadata()
                .get(METADATA_KEY)
                .and_then(|v| v.to_str().ok()),
            Some("10.0.0.2:5050")
        );
        assert_eq!(leader_of(&status).as_deref(), Some("10.0.0.2:5050"));
    }

    #[test]
    fn no_known_leader_is_unavailable_and_names_none() {
        for status in [not_leader(None), not_leader(Some(""))] {
            assert_eq!(status.code(), tonic::Code::Unavailable);
            assert_eq!(status.message(), message(None));
            assert_eq!(leader_of(&status), None);
        }
    }
}

//! The document of the event stream: one change on the leading master.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The event stream's topics, as `?topic=` and `muster events --topic` name them.
pub const EVENT_TOPICS: [&str; 4] = ["job", "evaluation", "task", "agent"];

/// One change on the leading master, as the event stream carries it (`GET /v1/event/stream`,
/// `muster events`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Event {
    /// Its place in this master's stream, from 1; resume after it with `?index=`. A new
    /// leader starts a stream of its own (see `term`).
    pub index: u64,
    /// The raft term of the leader that published it.
    pub term: u64,
    /// When, in milliseconds since the Unix epoch.
    pub time_ms: u64,
    /// `job`, `evaluation`, `task` or `agent`.
    pub topic: String,
    /// What happened: `job-registered`, `job-stopped`, `evaluation-updated`, `task-updated`,
    /// `agent-registered`, `agent-reregistered`, `agent-updated`, `agent-unreachable`,
    /// `agent-scheduling` (its eligibility or drain changed).
    pub kind: String,
    /// What it is about: the job's name, the evaluation's, task's or agent's id.
    pub key: String,
    /// The thing as it is now: a [`JobSummary`]-like object for jobs (name, version,
    /// stopped), an [`EvaluationInfo`], a [`TaskInfo`], or an agent's id and status.
    #[schema(value_type = Object)]
    pub payload: serde_json::Value,
}

//! The JSON documents the HTTP API answers with (and the CLI prints with `--json`), each made
//! from the operator API's reply it stands for. Enumerations are lower-case words
//! (`running`, `complete`, `service`), times are milliseconds since the Unix epoch, and a read
//! says how it was answered in its `read` field.

mod agents;
mod cluster;
mod deployments;
mod evaluations;
mod jobs;
mod namespaces;
mod tasks;

use muster_proto::cluster as cluster_pb;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

pub use agents::{
    AgentDetail, AgentList, AgentScheduling, AgentSummary, DrainRequest, EligibilityRequest,
};
pub use cluster::{ClusterStatus, Member, RaftConfiguration, RaftServer};
pub use deployments::{
    DeploymentGroupInfo, DeploymentInfo, DeploymentList, deployment_status_name,
};
pub use evaluations::{EvaluationInfo, EvaluationList};
pub use jobs::{
    JobDetail, JobList, JobPlan, JobSummary, JobVersion, JobVersions, PlannedTask, Submitted,
    TaskCounts, job_status,
};
pub use namespaces::NamespaceInfo;
pub use tasks::{TaskInfo, TaskLogs, task_state_name};

/// A job's namespace and name as a document shows them, from a message's namespace (empty:
/// `default`, or carried by the job's id, `team-a:web`) and job.
pub(crate) fn namespace_and_job(namespace: String, job: String) -> (String, String) {
    if !namespace.is_empty() {
        return (namespace, job);
    }
    match job.split_once(':') {
        Some((namespace, name)) => (namespace.to_owned(), name.to_owned()),
        None => ("default".to_owned(), job),
    }
}

/// Every error the API answers: a stable code and a message naming the problem.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ApiError {
    /// `bad_request`, `invalid_argument`, `unauthenticated`, `permission_denied`,
    /// `not_found`, `not_leader`, `failed_precondition`, `aborted`, `unavailable`,
    /// `out_of_range`, `payload_too_large` or `internal`.
    pub code: String,
    /// What went wrong, naming the field, job, agent or token concerned.
    pub message: String,
}

/// How a read was answered, and how stale it may be (Nomad's `X-Nomad-KnownLeader` and
/// `X-Nomad-LastContact`; also sent as `X-Muster-*` headers).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ReadInfo {
    /// True when answered from the master's own state without confirming leadership
    /// (`?stale=true`).
    pub stale: bool,
    /// The registry index the answering master had applied.
    pub applied_index: u64,
    /// Milliseconds since the answering master last heard from the leader (0 on the leader);
    /// `null` if it never has.
    pub last_contact_ms: Option<u64>,
    /// Whether the answering master knows a leader.
    pub known_leader: bool,
}

impl From<Option<cluster_pb::ReadInfo>> for ReadInfo {
    fn from(read: Option<cluster_pb::ReadInfo>) -> Self {
        read.map(|r| ReadInfo {
            stale: r.stale,
            applied_index: r.applied_index,
            last_contact_ms: (r.last_contact_ms != u64::MAX).then_some(r.last_contact_ms),
            known_leader: r.known_leader,
        })
        .unwrap_or_default()
    }
}

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
    /// What it is about: the job's id (its name, `namespace:name` outside `default`), the
    /// evaluation's, task's or agent's id.
    pub key: String,
    /// The namespace of its job, evaluation or task; absent for an agent's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The thing as it is now: a [`JobSummary`]-like object for jobs (name, version,
    /// stopped), an [`EvaluationInfo`], a [`TaskInfo`], or an agent's id and status.
    #[schema(value_type = Object)]
    pub payload: serde_json::Value,
}

/// What an environment value reads as to a caller who may not read secrets.
pub const REDACTED: &str = "<redacted>";

impl Event {
    /// The event with every environment value in its payload (each `env` object, at any
    /// depth: a task's, or each group's of a job) read as [`REDACTED`]: what a caller who
    /// may not read secrets is sent.
    pub fn redact_secrets(&mut self) {
        redact_env(&mut self.payload);
    }
}

fn redact_env(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(fields) => {
            for (name, field) in fields.iter_mut() {
                match field {
                    serde_json::Value::Object(env) if name == "env" => {
                        for value in env.values_mut() {
                            *value = serde_json::Value::from(REDACTED);
                        }
                    }
                    other => redact_env(other),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(redact_env),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_standby_that_never_heard_a_leader_says_so_with_nulls() {
        let state = cluster_pb::ClusterState {
            term: 0,
            read: Some(cluster_pb::ReadInfo {
                stale: true,
                applied_index: 0,
                last_contact_ms: u64::MAX,
                known_leader: false,
            }),
            ..cluster_pb::ClusterState::default()
        };
        let json = serde_json::to_value(ClusterStatus::from(&state)).expect("a document");
        assert_eq!(json["term"], serde_json::Value::Null, "{json}");
        assert_eq!(
            json["read"]["last_contact_ms"],
            serde_json::Value::Null,
            "{json}"
        );
        let heard = cluster_pb::ClusterState {
            term: 3,
            read: Some(cluster_pb::ReadInfo {
                last_contact_ms: 40,
                ..cluster_pb::ReadInfo::default()
            }),
            ..cluster_pb::ClusterState::default()
        };
        let json = serde_json::to_value(ClusterStatus::from(&heard)).expect("a document");
        assert_eq!(
            (
                json["term"].as_u64(),
                json["read"]["last_contact_ms"].as_u64()
            ),
            (Some(3), Some(40))
        );
    }

    #[test]
    fn every_environment_in_an_events_payload_is_redacted() {
        let mut event = Event {
            index: 1,
            term: 1,
            time_ms: 0,
            topic: "job".into(),
            kind: "job-registered".into(),
            key: "web".into(),
            namespace: Some("default".into()),
            payload: serde_json::json!({
                "name": "web",
                "env": "not an object: left alone",
                "groups": [
                    { "name": "a", "env": { "SECRET": "s1", "OTHER": "s2" } },
                    { "name": "b", "tasks": [{ "env": { "TOKEN": "s3" } }] }
                ]
            }),
        };
        event.redact_secrets();
        let text = event.payload.to_string();
        for secret in ["s1", "s2", "s3"] {
            assert!(!text.contains(&format!("\"{secret}\"")), "{text}");
        }
        assert_eq!(event.payload["groups"][0]["env"]["SECRET"], REDACTED);
        assert_eq!(
            event.payload["groups"][1]["tasks"][0]["env"]["TOKEN"],
            REDACTED
        );
        assert_eq!(event.payload["env"], "not an object: left alone");
    }
}

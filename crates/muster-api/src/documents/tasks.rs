//! The documents of tasks: a task and what it printed.

use std::collections::BTreeMap;

use muster_proto::cluster as cluster_pb;
use muster_proto::model as pb;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A task: what it runs, where, and how it stands.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TaskInfo {
    /// Its id, unique in the cluster.
    pub id: String,
    /// Its slot: `<job>.<group>[<index>]` (the job named `namespace:job` outside `default`).
    pub name: String,
    /// Its job (empty for a task launched directly).
    pub job: String,
    /// Its job's namespace.
    pub namespace: String,
    /// Its group.
    pub group: String,
    /// The job version it runs.
    pub job_version: u64,
    /// The agent it was placed on (empty if not known to the answer).
    pub agent_id: String,
    /// `staging`, `starting`, `running`, `finished`, `failed`, `killed`, `lost` or `unknown`
    /// (its agent is unreachable: it may still run there).
    pub state: String,
    /// Its exit code once ended (128 + signal when killed by one).
    pub exit_code: i32,
    /// Why it ended or could not start, if it did.
    pub message: String,
    /// Its program.
    pub command: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Its environment (values redacted unless the token may read secrets).
    pub env: BTreeMap<String, String>,
    /// CPUs it was given.
    pub cpus: f64,
    /// Memory it was given, in MiB.
    pub mem_mb: u64,
    /// The user it runs as (empty: the agent's task user).
    pub user: String,
    /// The ports it holds on its agent, by label (`{"http": 20417}`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ports: BTreeMap<String, u32>,
    /// What its health checks say: `starting`, `healthy` or `unhealthy`; absent for a task
    /// without checks (or not running).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub health: String,
    /// How many times its agent restarted it in place.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restarts: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The API's word for a task state.
pub fn task_state_name(state: i32) -> &'static str {
    match pb::TaskState::try_from(state) {
        Ok(pb::TaskState::Staging) => "staging",
        Ok(pb::TaskState::Starting) => "starting",
        Ok(pb::TaskState::Running) => "running",
        Ok(pb::TaskState::Finished) => "finished",
        Ok(pb::TaskState::Failed) => "failed",
        Ok(pb::TaskState::Killed) => "killed",
        Ok(pb::TaskState::Lost) => "lost",
        Ok(pb::TaskState::Unknown) => "unknown",
        _ => "unspecified",
    }
}

impl TaskInfo {
    /// The document for `task`, placed on `agent_id`.
    pub fn new(agent_id: &str, task: pb::Task) -> TaskInfo {
        let resources = task.resources.unwrap_or_default();
        let (namespace, job) = if task.job.is_empty() {
            let namespace = task.id.split_once(':').map_or("default", |(ns, _)| ns);
            (namespace.to_owned(), String::new())
        } else {
            super::namespace_and_job(task.namespace, task.job)
        };
        TaskInfo {
            id: task.id,
            name: task.name,
            job,
            namespace,
            group: task.group,
            job_version: task.job_version,
            agent_id: agent_id.to_owned(),
            state: task_state_name(task.state).to_owned(),
            exit_code: task.exit_code,
            message: task.message,
            command: task.command,
            args: task.args,
            env: task.env.into_iter().collect(),
            cpus: resources.cpus,
            mem_mb: resources.mem_mb,
            user: task.user,
            ports: task.ports.into_iter().map(|p| (p.label, p.port)).collect(),
            health: muster_model::TaskHealth::from_wire(task.health)
                .as_str()
                .to_owned(),
            restarts: task.restarts,
        }
    }
}

/// `GET /v1/task/{id}/logs`: a piece of a task's stdout or stderr, read across the agent's
/// rotations. Follow a stream by asking again from `next_offset`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TaskLogs {
    /// The task.
    pub task_id: String,
    /// `stdout` or `stderr`.
    pub stream: String,
    /// The bytes from `offset` on, as text (invalid UTF-8 replaced).
    pub data: String,
    /// The absolute offset of the first byte of `data` in the task's stream.
    pub offset: u64,
    /// Where the next read continues.
    pub next_offset: u64,
    /// The oldest byte the agent still keeps; older output was rotated away.
    pub first_offset: u64,
    /// Whether the task still runs, so more may come.
    pub task_running: bool,
}

impl TaskLogs {
    /// The document for `chunk` of `task_id`'s stdout (or stderr).
    pub fn new(task_id: &str, stderr: bool, chunk: cluster_pb::TaskOutputChunk) -> TaskLogs {
        TaskLogs {
            task_id: task_id.to_owned(),
            stream: if stderr { "stderr" } else { "stdout" }.to_owned(),
            data: String::from_utf8_lossy(&chunk.data).into_owned(),
            offset: chunk.offset,
            next_offset: chunk.next_offset,
            first_offset: chunk.first_offset,
            task_running: chunk.task_running,
        }
    }
}

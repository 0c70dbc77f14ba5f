//! The JSON documents the HTTP API answers with (and the CLI prints with `--json`), each made
//! from the operator API's reply it stands for. Enumerations are lower-case words
//! (`running`, `complete`, `service`), times are milliseconds since the Unix epoch, and a read
//! says how it was answered in its `read` field.

use std::collections::BTreeMap;

use muster_proto::cluster as cluster_pb;
use muster_proto::model as pb;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::job_spec::{JobSpec, scheduler_name};

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
    /// Milliseconds since the answering master last heard from the leader (0 on the leader).
    pub last_contact_ms: u64,
    /// Whether the answering master knows a leader.
    pub known_leader: bool,
}

impl From<Option<cluster_pb::ReadInfo>> for ReadInfo {
    fn from(read: Option<cluster_pb::ReadInfo>) -> Self {
        read.map(|r| ReadInfo {
            stale: r.stale,
            applied_index: r.applied_index,
            last_contact_ms: r.last_contact_ms,
            known_leader: r.known_leader,
        })
        .unwrap_or_default()
    }
}

/// Tasks counted by state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TaskCounts {
    /// Placed, not yet started by the agent.
    pub staging: u64,
    /// Being started.
    pub starting: u64,
    /// Running.
    pub running: u64,
    /// Ended with exit code 0.
    pub finished: u64,
    /// Ended otherwise, or could not start.
    pub failed: u64,
    /// Stopped on request.
    pub killed: u64,
    /// On an agent that was lost.
    pub lost: u64,
    /// On an agent marked unreachable: they may still run there.
    #[serde(default)]
    pub unknown: u64,
}

/// One job of a list: what it asks for and how its tasks stand.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct JobSummary {
    /// Its name.
    pub name: String,
    /// `service`, `batch` or `system`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Its priority.
    pub priority: u32,
    /// Its current version.
    pub version: u64,
    /// Whether it was stopped.
    pub stopped: bool,
    /// The tasks it asks for (a system job: per agent).
    pub desired: u64,
    /// Its tasks by state, as the answering master knows them (a standby knows none).
    pub tasks: TaskCounts,
    /// Its evaluations pending or blocked.
    pub evaluations_in_flight: u64,
}

/// `GET /v1/jobs`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct JobList {
    /// By name.
    pub jobs: Vec<JobSummary>,
    /// How the read was answered.
    pub read: ReadInfo,
}

impl From<cluster_pb::JobList> for JobList {
    fn from(list: cluster_pb::JobList) -> Self {
        JobList {
            jobs: list
                .jobs
                .into_iter()
                .map(|j| JobSummary {
                    name: j.name,
                    kind: scheduler_name(j.scheduler).to_owned(),
                    priority: j.priority,
                    version: j.version,
                    stopped: j.stopped,
                    desired: j.desired,
                    tasks: TaskCounts {
                        staging: j.staging,
                        starting: j.starting,
                        running: j.running,
                        finished: j.finished,
                        failed: j.failed,
                        killed: j.killed,
                        lost: j.lost,
                        unknown: j.unknown,
                    },
                    evaluations_in_flight: j.evals_in_flight,
                })
                .collect(),
            read: list.read.into(),
        }
    }
}

/// A task: what it runs, where, and how it stands.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TaskInfo {
    /// Its id, unique in the cluster.
    pub id: String,
    /// Its slot: `<job>.<group>[<index>]`.
    pub name: String,
    /// Its job (empty for a task launched directly).
    pub job: String,
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
        TaskInfo {
            id: task.id,
            name: task.name,
            job: task.job,
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
        }
    }
}

/// An evaluation: why a job was looked at, and how that ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EvaluationInfo {
    /// Its id.
    pub id: String,
    /// The job evaluated.
    pub job: String,
    /// The job's priority when it was made.
    pub priority: u32,
    /// The scheduler that handles it: `service`, `batch` or `system`.
    #[serde(rename = "type")]
    pub kind: String,
    /// What made it: `job-register`, `job-deregister`, `agent-unreachable`, `agent-update`,
    /// `unblocked`, `task-ended`, `failed-follow-up` or `reconcile`.
    pub triggered_by: String,
    /// The agent or task the trigger names, if any.
    pub trigger_detail: String,
    /// `pending`, `blocked`, `complete`, `failed` or `canceled`.
    pub status: String,
    /// Why it has that status.
    pub status_description: String,
    /// The registry index that created it.
    pub create_index: u64,
    /// The registry index that last changed it.
    pub modify_index: u64,
    /// Not to be handed out before this time (ms since the epoch); 0: at once.
    pub wait_until_ms: u64,
}

impl From<pb::Evaluation> for EvaluationInfo {
    fn from(eval: pb::Evaluation) -> Self {
        use pb::trigger::Kind;
        let (triggered_by, trigger_detail) = match eval.trigger.and_then(|t| t.kind) {
            Some(Kind::JobRegister(_)) => ("job-register", String::new()),
            Some(Kind::JobDeregister(_)) => ("job-deregister", String::new()),
            Some(Kind::AgentUnreachable(agent)) => ("agent-unreachable", agent),
            Some(Kind::AgentUpdate(agent)) => ("agent-update", agent),
            Some(Kind::Unblocked(_)) => ("unblocked", String::new()),
            Some(Kind::TaskEnded(task)) => ("task-ended", task),
            Some(Kind::FailedFollowUp(eval)) => ("failed-follow-up", eval),
            Some(Kind::Reconcile(_)) => ("reconcile", String::new()),
            Some(Kind::AgentDrain(agent)) => ("agent-drain", agent),
            None => ("unknown", String::new()),
        };
        let status = match pb::EvalStatus::try_from(eval.status) {
            Ok(pb::EvalStatus::Pending) => "pending",
            Ok(pb::EvalStatus::Blocked) => "blocked",
            Ok(pb::EvalStatus::Complete) => "complete",
            Ok(pb::EvalStatus::Failed) => "failed",
            Ok(pb::EvalStatus::Canceled) => "canceled",
            _ => "unknown",
        };
        EvaluationInfo {
            id: eval.id,
            job: eval.job,
            priority: eval.priority,
            kind: scheduler_name(eval.scheduler).to_owned(),
            triggered_by: triggered_by.to_owned(),
            trigger_detail,
            status: status.to_owned(),
            status_description: eval.status_description,
            create_index: eval.create_index,
            modify_index: eval.modify_index,
            wait_until_ms: eval.wait_until_ms,
        }
    }
}

/// `GET /v1/evaluations` and `GET /v1/job/{name}/evaluations`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EvaluationList {
    /// Newest first.
    pub evaluations: Vec<EvaluationInfo>,
    /// How many matched, before the limit.
    pub total: u64,
    /// How the read was answered.
    pub read: ReadInfo,
}

impl From<cluster_pb::EvaluationList> for EvaluationList {
    fn from(list: cluster_pb::EvaluationList) -> Self {
        EvaluationList {
            evaluations: list.evals.into_iter().map(EvaluationInfo::from).collect(),
            total: list.total,
            read: list.read.into(),
        }
    }
}

/// `GET /v1/job/{name}`: the job as submitted, its tasks and its evaluations.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JobDetail {
    /// The job document of its current version.
    pub job: JobSpec,
    /// Its current version.
    pub version: u64,
    /// Whether it was stopped.
    pub stopped: bool,
    /// Its tasks, with their agents (a standby knows none).
    pub tasks: Vec<TaskInfo>,
    /// Its evaluations.
    pub evaluations: Vec<EvaluationInfo>,
    /// How the read was answered.
    pub read: ReadInfo,
}

impl From<cluster_pb::JobStatusReply> for JobDetail {
    fn from(reply: cluster_pb::JobStatusReply) -> Self {
        let job = reply.job.unwrap_or_default();
        JobDetail {
            job: JobSpec::from_proto(&job),
            version: reply.version,
            stopped: reply.stopped,
            tasks: reply
                .tasks
                .into_iter()
                .filter_map(|t| t.task.map(|task| TaskInfo::new(&t.agent_id, task)))
                .collect(),
            evaluations: reply.evals.into_iter().map(EvaluationInfo::from).collect(),
            read: reply.read.into(),
        }
    }
}

/// What a submission or a stop made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Submitted {
    /// The evaluation created for the change.
    pub eval_id: String,
    /// The job's version after the change.
    pub version: u64,
}

impl From<cluster_pb::SubmitJobReply> for Submitted {
    fn from(reply: cluster_pb::SubmitJobReply) -> Self {
        Submitted {
            eval_id: reply.eval_id,
            version: reply.version,
        }
    }
}

/// An agent: what it offers, what its tasks use, and how it stands.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AgentSummary {
    /// Its id.
    pub id: String,
    /// Its hostname.
    pub hostname: String,
    /// Its actor-transport address.
    pub address: String,
    /// `ready`, `disconnected` (admitted, not re-registered since a failover) or
    /// `unreachable` (its heartbeats stopped; its tasks were replaced).
    pub status: String,
    /// CPUs it offers.
    pub cpus: f64,
    /// Memory it offers, in MiB.
    pub mem_mb: u64,
    /// CPUs its live tasks were given.
    pub cpus_used: f64,
    /// Memory its live tasks were given, in MiB.
    pub mem_mb_used: u64,
    /// Its live tasks (not yet ended).
    pub tasks: u64,
    /// Its attributes.
    pub attributes: BTreeMap<String, String>,
    /// Whether new tasks may be placed on it (false while it drains and after, or as an
    /// operator set it with `muster agent eligibility`).
    pub eligible: bool,
    /// `none`, `draining` (its tasks move or end), `stopping` (the drain's deadline passed:
    /// whatever is left stops) or `drained` (its last drain completed, and it was not made
    /// eligible since).
    pub drain: String,
    /// The deadline of the drain under way, in milliseconds since the Unix epoch; 0 if none.
    pub drain_deadline_ms: u64,
}

/// `POST /v1/agent/{id}/drain`: start, change or cancel an agent's drain.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DrainRequest {
    /// How long batch tasks may run on before whatever is left is stopped, as a duration
    /// (`90s`, `30m`, `1h`); absent: one hour.
    #[serde(default)]
    pub deadline: Option<String>,
    /// No deadline: tasks are left to end or move.
    #[serde(default)]
    pub no_deadline: bool,
    /// Stop every task now.
    #[serde(default)]
    pub force: bool,
    /// Cancel the drain under way instead; the agent becomes eligible again unless
    /// `keep_ineligible`.
    #[serde(default)]
    pub cancel: bool,
    /// With `cancel`: leave the agent ineligible.
    #[serde(default)]
    pub keep_ineligible: bool,
}

/// `POST /v1/agent/{id}/eligibility`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EligibilityRequest {
    /// Whether schedulers may place new tasks on the agent.
    pub eligible: bool,
}

/// The answer to a drain or eligibility change: the agent's scheduling now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AgentScheduling {
    /// The agent.
    pub agent_id: String,
    /// Whether new tasks may be placed on it.
    pub eligible: bool,
    /// `none`, `draining`, `stopping` or `drained` (as in [`AgentSummary`]).
    pub drain: String,
    /// The drain's deadline, in milliseconds since the Unix epoch; 0 if none.
    pub drain_deadline_ms: u64,
}

impl AgentScheduling {
    /// The agent `agent_id`'s scheduling as the wire carries it (absent: eligible, never
    /// drained).
    pub fn new(agent_id: &str, scheduling: Option<&pb::AgentScheduling>) -> Self {
        let (eligible, drain, drain_deadline_ms) = scheduling_fields(scheduling);
        AgentScheduling {
            agent_id: agent_id.to_owned(),
            eligible,
            drain,
            drain_deadline_ms,
        }
    }
}

impl From<cluster_pb::AgentSchedulingReply> for AgentScheduling {
    fn from(reply: cluster_pb::AgentSchedulingReply) -> Self {
        AgentScheduling::new(&reply.agent_id, reply.scheduling.as_ref())
    }
}

/// An agent's eligibility, drain state and deadline, as the documents show them.
fn scheduling_fields(scheduling: Option<&pb::AgentScheduling>) -> (bool, String, u64) {
    let scheduling = scheduling.cloned().unwrap_or_default();
    let drain = match &scheduling.drain {
        Some(drain) if drain.past_deadline => "stopping",
        Some(_) => "draining",
        None if scheduling.drained_at_ms != 0 && scheduling.ineligible => "drained",
        None => "none",
    };
    let deadline = scheduling
        .drain
        .as_ref()
        .map_or(0, |drain| drain.deadline_ms);
    (!scheduling.ineligible, drain.to_owned(), deadline)
}

/// `GET /v1/agents`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AgentList {
    /// Connected and disconnected agents by id, then unreachable ones.
    pub agents: Vec<AgentSummary>,
    /// How the read was answered.
    pub read: ReadInfo,
}

/// `GET /v1/agent/{id}`: an agent and its tasks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AgentDetail {
    /// The agent.
    pub agent: AgentSummary,
    /// Its live tasks.
    pub tasks: Vec<TaskInfo>,
    /// The ended tasks it remembers.
    pub completed_tasks: Vec<TaskInfo>,
    /// How the read was answered.
    pub read: ReadInfo,
}

/// `GET /v1/status`: who leads and how the cluster stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ClusterStatus {
    /// The leading master's gRPC address, empty if unknown.
    pub leader: String,
    /// Whether the answering master leads.
    pub is_leader: bool,
    /// The registry's raft term.
    pub term: u64,
    /// The registry's raft commit index as the answering master knows it: on the leader, the
    /// highest index a majority of the masters hold; on a standby, the index it applied (a
    /// lower bound). The index it applied is in `read`.
    pub commit_index: u64,
    /// True while a new leader waits for admitted agents to re-register.
    pub recovering: bool,
    /// True on a cluster run with `--insecure`.
    pub insecure: bool,
    /// Agents connected.
    pub agents_ready: u64,
    /// Agents admitted but not re-registered since a failover.
    pub agents_disconnected: u64,
    /// Agents marked unreachable.
    pub agents_unreachable: u64,
    /// The registry's raft members (filled in by the HTTP API from the master's config).
    #[serde(default)]
    pub members: Vec<Member>,
    /// How the read was answered.
    pub read: ReadInfo,
}

/// A master of the registry's raft group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Member {
    /// Its raft id.
    pub id: u64,
    /// Its gRPC address (agents, raft, the CLI).
    pub address: String,
    /// Its HTTP API's address, as this master reaches it.
    pub http_address: String,
    /// Whether it leads.
    pub leader: bool,
}

fn live(task: &pb::Task) -> bool {
    matches!(
        pb::TaskState::try_from(task.state),
        Ok(pb::TaskState::Staging | pb::TaskState::Starting | pb::TaskState::Running)
    )
}

fn summary(
    id: &str,
    info: Option<&pb::AgentInfo>,
    scheduling: Option<&pb::AgentScheduling>,
    status: &str,
    tasks: &[pb::Task],
) -> AgentSummary {
    let info = info.cloned().unwrap_or_default();
    let (eligible, drain, drain_deadline_ms) = scheduling_fields(scheduling);
    let offered = info.resources.unwrap_or_default();
    let live: Vec<&pb::Task> = tasks.iter().filter(|t| live(t)).collect();
    AgentSummary {
        id: id.to_owned(),
        hostname: info.hostname,
        address: info.address,
        status: status.to_owned(),
        cpus: offered.cpus,
        mem_mb: offered.mem_mb,
        cpus_used: live
            .iter()
            .filter_map(|t| t.resources.as_ref())
            .map(|r| r.cpus)
            .sum(),
        mem_mb_used: live
            .iter()
            .filter_map(|t| t.resources.as_ref())
            .map(|r| r.mem_mb)
            .sum(),
        tasks: live.len() as u64,
        attributes: info.attributes.into_iter().collect(),
        eligible,
        drain,
        drain_deadline_ms,
    }
}

impl From<&cluster_pb::ClusterState> for AgentList {
    fn from(state: &cluster_pb::ClusterState) -> Self {
        let mut agents: Vec<AgentSummary> = state
            .agents
            .iter()
            .map(|a| {
                let status = if a.connected { "ready" } else { "disconnected" };
                summary(
                    &a.id,
                    a.info.as_ref(),
                    a.scheduling.as_ref(),
                    status,
                    &a.tasks,
                )
            })
            .collect();
        agents.sort_by(|a, b| a.id.cmp(&b.id));
        let mut unreachable: Vec<AgentSummary> = state
            .unreachable
            .iter()
            .map(|a| {
                summary(
                    &a.id,
                    a.info.as_ref(),
                    a.scheduling.as_ref(),
                    "unreachable",
                    &[],
                )
            })
            .collect();
        unreachable.sort_by(|a, b| a.id.cmp(&b.id));
        agents.extend(unreachable);
        AgentList {
            agents,
            read: state.read.into(),
        }
    }
}

impl AgentDetail {
    /// The agent `id` of `state`, if the state holds it (connected, disconnected or
    /// unreachable).
    pub fn find(state: &cluster_pb::ClusterState, id: &str) -> Option<AgentDetail> {
        let read: ReadInfo = state.read.into();
        if let Some(a) = state.agents.iter().find(|a| a.id == id) {
            let status = if a.connected { "ready" } else { "disconnected" };
            return Some(AgentDetail {
                agent: summary(
                    &a.id,
                    a.info.as_ref(),
                    a.scheduling.as_ref(),
                    status,
                    &a.tasks,
                ),
                tasks: a
                    .tasks
                    .iter()
                    .map(|t| TaskInfo::new(&a.id, t.clone()))
                    .collect(),
                completed_tasks: a
                    .completed_tasks
                    .iter()
                    .map(|t| TaskInfo::new(&a.id, t.clone()))
                    .collect(),
                read,
            });
        }
        state
            .unreachable
            .iter()
            .find(|a| a.id == id)
            .map(|a| AgentDetail {
                agent: summary(
                    &a.id,
                    a.info.as_ref(),
                    a.scheduling.as_ref(),
                    "unreachable",
                    &[],
                ),
                // What it ran when it was marked: unknown while it is away.
                tasks: a
                    .tasks
                    .iter()
                    .map(|t| TaskInfo::new(&a.id, t.clone()))
                    .collect(),
                completed_tasks: Vec::new(),
                read,
            })
    }
}

impl From<&cluster_pb::ClusterState> for ClusterStatus {
    fn from(state: &cluster_pb::ClusterState) -> Self {
        ClusterStatus {
            leader: state.leader.clone(),
            is_leader: state.is_leader,
            term: state.term,
            commit_index: state.commit_index,
            recovering: state.recovering,
            insecure: state.insecure,
            agents_ready: state.agents.iter().filter(|a| a.connected).count() as u64,
            agents_disconnected: state.agents.iter().filter(|a| !a.connected).count() as u64,
            agents_unreachable: state.unreachable.len() as u64,
            members: Vec::new(),
            read: state.read.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_counts_only_its_live_tasks_as_used() {
        let task = |state: pb::TaskState, cpus: f64| pb::Task {
            state: state as i32,
            resources: Some(pb::Resources { cpus, mem_mb: 10 }),
            ..pb::Task::default()
        };
        let state = cluster_pb::ClusterState {
            agents: vec![cluster_pb::AgentState {
                id: "a1".into(),
                connected: true,
                tasks: vec![
                    task(pb::TaskState::Running, 0.5),
                    task(pb::TaskState::Finished, 2.0),
                ],
                ..cluster_pb::AgentState::default()
            }],
            unreachable: vec![cluster_pb::UnreachableAgent {
                id: "a0".into(),
                ..cluster_pb::UnreachableAgent::default()
            }],
            ..cluster_pb::ClusterState::default()
        };
        let list = AgentList::from(&state);
        assert_eq!(list.agents.len(), 2);
        assert_eq!(list.agents[0].status, "ready");
        assert_eq!(list.agents[0].tasks, 1);
        assert!((list.agents[0].cpus_used - 0.5).abs() < 1e-9);
        assert_eq!(list.agents[0].mem_mb_used, 10);
        assert_eq!(list.agents[1].status, "unreachable");
        let detail = AgentDetail::find(&state, "a1").map(|d| d.tasks.len());
        assert_eq!(detail, Some(2));
        assert!(AgentDetail::find(&state, "nobody").is_none());
    }

    #[test]
    fn an_evaluation_names_its_trigger_and_status_in_words() {
        let eval = pb::Evaluation {
            id: "e1".into(),
            trigger: Some(pb::Trigger {
                kind: Some(pb::trigger::Kind::AgentUnreachable("a1".into())),
            }),
            status: pb::EvalStatus::Blocked as i32,
            scheduler: pb::SchedulerType::Batch as i32,
            ..pb::Evaluation::default()
        };
        let doc = EvaluationInfo::from(eval);
        assert_eq!(
            (
                doc.triggered_by.as_str(),
                doc.trigger_detail.as_str(),
                doc.status.as_str(),
                doc.kind.as_str()
            ),
            ("agent-unreachable", "a1", "blocked", "batch")
        );
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
    /// What it is about: the job's name, the evaluation's, task's or agent's id.
    pub key: String,
    /// The thing as it is now: a [`JobSummary`]-like object for jobs (name, version,
    /// stopped), an [`EvaluationInfo`], a [`TaskInfo`], or an agent's id and status.
    #[schema(value_type = Object)]
    pub payload: serde_json::Value,
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

/// One version of a job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JobVersion {
    /// Its version number.
    pub version: u64,
    /// Whether this version stopped the job.
    pub stopped: bool,
    /// The job document of that version.
    pub job: JobSpec,
}

/// `GET /v1/job/{name}/versions`: the current version and the earlier ones kept, newest first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JobVersions {
    /// Newest first.
    pub versions: Vec<JobVersion>,
    /// How the read was answered.
    pub read: ReadInfo,
}

impl From<cluster_pb::JobVersionList> for JobVersions {
    fn from(list: cluster_pb::JobVersionList) -> Self {
        JobVersions {
            versions: list
                .versions
                .iter()
                .map(|job| JobVersion {
                    version: job.version,
                    stopped: job.stopped,
                    job: JobSpec::from_proto(job),
                })
                .collect(),
            read: list.read.into(),
        }
    }
}

/// A task a plan would start or stop.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PlannedTask {
    /// Its slot (`web.frontend[0]`).
    pub name: String,
    /// The agent.
    pub agent_id: String,
    /// The task's id (stops only).
    pub task_id: String,
}

/// `POST /v1/job/{name}/plan`: what submitting the job would do now (Nomad's job plan).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct JobPlan {
    /// The version the job would get.
    pub version: u64,
    /// Tasks that would start.
    pub place: Vec<PlannedTask>,
    /// Tasks that would stop.
    pub stop: Vec<PlannedTask>,
    /// Slots whose task would be replaced (its definition changed).
    pub replaced: Vec<String>,
    /// What would not fit, one line per task group left short.
    pub unplaced: Vec<String>,
}

impl From<cluster_pb::JobPlan> for JobPlan {
    fn from(plan: cluster_pb::JobPlan) -> Self {
        let task = |t: cluster_pb::PlannedTask| PlannedTask {
            name: t.name,
            agent_id: t.agent_id,
            task_id: t.task_id,
        };
        JobPlan {
            version: plan.version,
            place: plan.place.into_iter().map(task).collect(),
            stop: plan.stop.into_iter().map(task).collect(),
            replaced: plan.replaced,
            unplaced: plan.unplaced,
        }
    }
}

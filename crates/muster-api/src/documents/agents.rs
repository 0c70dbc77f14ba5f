//! The documents of agents: what each offers and runs, and the requests that drain it or
//! change its eligibility.

use std::collections::BTreeMap;

use muster_proto::cluster as cluster_pb;
use muster_proto::model as pb;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{ReadInfo, TaskInfo};

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
    /// Its build, as it said when it last registered; empty if not known (not registered
    /// since a failover, unreachable, or from before versions were said).
    #[serde(default)]
    pub version: String,
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
        version: String::new(),
    }
}

/// A connected or disconnected agent (one the leader's in-memory table holds).
fn connected_summary(a: &cluster_pb::AgentState) -> AgentSummary {
    let status = if a.connected { "ready" } else { "disconnected" };
    AgentSummary {
        version: a.version.clone(),
        ..summary(
            &a.id,
            a.info.as_ref(),
            a.scheduling.as_ref(),
            status,
            &a.tasks,
        )
    }
}

impl From<&cluster_pb::ClusterState> for AgentList {
    fn from(state: &cluster_pb::ClusterState) -> Self {
        let mut agents: Vec<AgentSummary> = state.agents.iter().map(connected_summary).collect();
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
            return Some(AgentDetail {
                agent: connected_summary(a),
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
}

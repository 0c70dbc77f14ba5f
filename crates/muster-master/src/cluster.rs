//! The leading master's in-memory view of the cluster: agents with their tasks, and
//! frameworks. None of it is in the registry; a new leader rebuilds it from re-registrations.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use muster_model::convert::sorted;
use muster_model::{AgentInfo, Resources, Task, TaskState};
use muster_proto::cluster as pb;
use muster_proto::model as model_pb;
use muster_scheduler::AgentView;

/// An agent the leading master knows.
#[derive(Debug)]
pub(crate) struct AgentEntry {
    pub(crate) info: AgentInfo,
    pub(crate) tasks: Vec<Task>,
    pub(crate) completed_tasks: Vec<Task>,
    /// False for an admitted agent that has not re-registered with this master yet.
    pub(crate) connected: bool,
    pub(crate) missed_pings: u32,
    pub(crate) ping_in_flight: bool,
    /// What schedulers see of it, built on demand and dropped whenever its tasks or info
    /// change (go through [`Cluster::agent_mut`] to change them), so a snapshot shares the
    /// views of every agent that did not change.
    pub(crate) view: Option<Arc<AgentView>>,
}

impl AgentEntry {
    /// An admitted agent not heard from yet.
    pub(crate) fn awaiting(info: &AgentInfo) -> Self {
        AgentEntry {
            info: info.clone(),
            tasks: Vec::new(),
            completed_tasks: Vec::new(),
            connected: false,
            missed_pings: 0,
            ping_in_flight: false,
            view: None,
        }
    }

    /// A connected agent with what it runs.
    pub(crate) fn connected(info: AgentInfo, tasks: Vec<Task>, completed_tasks: Vec<Task>) -> Self {
        AgentEntry {
            info,
            tasks,
            completed_tasks,
            connected: true,
            missed_pings: 0,
            ping_in_flight: false,
            view: None,
        }
    }
}

/// Agents by id and frameworks by id.
#[derive(Debug, Default)]
pub(crate) struct Cluster {
    pub(crate) agents: HashMap<String, AgentEntry>,
    pub(crate) frameworks: HashMap<String, pb::Framework>,
    /// Frameworks known only from completed tasks.
    pub(crate) completed_frameworks: HashSet<String>,
}

impl Cluster {
    pub(crate) fn add_frameworks(&mut self, frameworks: Vec<pb::Framework>) {
        for framework in frameworks {
            if !self.frameworks.contains_key(&framework.id) {
                self.frameworks.insert(framework.id.clone(), framework);
            }
        }
    }

    /// The agent, to change its tasks or info: its scheduler view is rebuilt on next use.
    pub(crate) fn agent_mut(&mut self, id: &str) -> Option<&mut AgentEntry> {
        let agent = self.agents.get_mut(id)?;
        agent.view = None;
        Some(agent)
    }

    pub(crate) fn connected_agents(&self) -> usize {
        self.agents.values().filter(|a| a.connected).count()
    }
}

/// An agent's info as it arrives from the agent. Lenient where the agent's own view cannot be
/// refused without losing it: missing resources are none.
pub(crate) fn registry_info(info: &model_pb::AgentInfo) -> AgentInfo {
    AgentInfo {
        hostname: info.hostname.clone(),
        address: info.address.clone(),
        resources: info.resources.map(resources).unwrap_or_default(),
        attributes: sorted(info.attributes.clone()),
    }
}

fn resources(r: model_pb::Resources) -> Resources {
    Resources {
        cpus: r.cpus,
        mem_mb: r.mem_mb,
    }
}

/// A task as an agent reports it, in the master's form. Lenient, as the master always was with
/// what agents report: missing resources are none, and an unknown state counts as not started
/// (it holds its resources until the agent says more).
pub(crate) fn task_from_agent(task: model_pb::Task) -> Task {
    Task {
        state: TaskState::try_from(task.state).unwrap_or(TaskState::Staging),
        resources: task.resources.map(resources).unwrap_or_default(),
        id: task.id,
        name: task.name,
        job: task.job,
        group: task.group,
        job_version: task.job_version,
        framework_id: task.framework_id,
        labels: task
            .labels
            .into_iter()
            .map(|label| (label.key, label.value))
            .collect(),
        exit_code: task.exit_code,
        command: task.command,
        args: task.args,
        env: sorted(task.env),
        message: task.message,
    }
}

/// The jobs an agent reports live (not ended) tasks of.
pub(crate) fn live_jobs_reported(tasks: &[model_pb::Task]) -> HashSet<&str> {
    tasks
        .iter()
        .filter(|t| !TaskState::try_from(t.state).is_ok_and(TaskState::is_terminal))
        .map(|t| t.job.as_str())
        .filter(|job| !job.is_empty())
        .collect()
}

/// Tasks as an agent reports them.
pub(crate) fn tasks_from_agent(tasks: Vec<model_pb::Task>) -> Vec<Task> {
    tasks.into_iter().map(task_from_agent).collect()
}

/// Whether `wire` describes the same agent as the registry's `stored` record, without
/// building a registry record (the re-registration hot path).
pub(crate) fn same_info(wire: &model_pb::AgentInfo, stored: &AgentInfo) -> bool {
    let resources = wire.resources.unwrap_or_default();
    wire.hostname == stored.hostname
        && wire.address == stored.address
        && resources.cpus == stored.resources.cpus
        && resources.mem_mb == stored.resources.mem_mb
        && wire.attributes.len() == stored.attributes.len()
        && wire
            .attributes
            .iter()
            .all(|(k, v)| stored.attributes.get(k) == Some(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_round_trips_and_compares_equal() {
        let wire = model_pb::AgentInfo {
            hostname: "h".into(),
            address: "agent@127.0.0.1:1".into(),
            resources: Some(model_pb::Resources {
                cpus: 20.0,
                mem_mb: 10240,
            }),
            attributes: [("rack".to_owned(), "r1".to_owned())].into(),
        };
        let stored = registry_info(&wire);
        assert!(same_info(&wire, &stored));
        assert_eq!(model_pb::AgentInfo::from(stored.clone()), wire);
        let mut moved = wire.clone();
        moved.attributes.insert("rack".into(), "r2".into());
        assert!(!same_info(&moved, &stored));
    }

    #[test]
    fn a_reported_task_keeps_its_job_and_an_odd_one_is_not_lost() {
        let task = Task {
            id: "web.fe[0]-1".into(),
            name: "web.fe[0]".into(),
            job: "web".into(),
            group: "fe".into(),
            job_version: 4,
            state: TaskState::Running,
            ..Task::default()
        };
        assert_eq!(task_from_agent(task.clone().into()), task);
        let odd = model_pb::Task {
            id: "t".into(),
            state: 42,
            resources: None,
            ..model_pb::Task::default()
        };
        let read = task_from_agent(odd);
        assert_eq!(
            (read.state, read.resources),
            (TaskState::Staging, Resources::default())
        );
    }
}

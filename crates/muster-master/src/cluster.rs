//! The leading master's in-memory view of the cluster: agents with their tasks, and
//! frameworks. None of it is in the registry; a new leader rebuilds it from re-registrations.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use muster_actor::Upid;
use muster_model::convert::sorted;
use muster_model::{AgentInfo, Resources, TaskState};
use muster_proto::cluster as pb;
use muster_proto::model as model_pb;
use muster_scheduler::AgentView;
use muster_transport::{Node, RemotePid};

use crate::task_record::{TaskInterner, TaskRecord};

/// An agent the leading master knows.
#[derive(Debug)]
pub(crate) struct AgentEntry {
    pub(crate) info: AgentInfo,
    /// Its live tasks (and those being killed), each sharing what its group's tasks share.
    pub(crate) tasks: Vec<TaskRecord>,
    /// Its ended tasks, oldest first.
    pub(crate) completed_tasks: Vec<TaskRecord>,
    /// False for an admitted agent that has not re-registered with this master yet.
    pub(crate) connected: bool,
    pub(crate) missed_pings: u32,
    pub(crate) ping_in_flight: bool,
    /// Whether a check of its launches is coming (see `Master::send_launch`).
    pub(crate) launch_check_due: bool,
    /// The agent's registration number, as it registered or re-registered with this master
    /// (0: an agent that does not fence launches by it): every launch to it is stamped with
    /// it, and the agent refuses one stamped with another.
    pub(crate) registration: u64,
    /// Its build, as it said when it registered or re-registered with this master.
    pub(crate) version: String,
    /// What schedulers see of it, built on demand and dropped whenever its tasks or info
    /// change (go through [`Cluster::agent_mut`] to change them; a task placed here is added
    /// to it in place, [`AgentEntry::add_task`]), so a snapshot shares the views of every
    /// agent that did not change.
    pub(crate) view: Option<Arc<AgentView>>,
    /// A handle on its process, made on first use from the address it was made for:
    /// launches, kills and pings reuse it (and its link) instead of parsing the address
    /// and finding the link again for every message.
    remote: Option<(Box<str>, RemotePid)>,
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
            launch_check_due: false,
            registration: 0,
            version: String::new(),
            view: None,
            remote: None,
        }
    }

    /// A connected agent with what it runs.
    pub(crate) fn connected(
        info: AgentInfo,
        registration: u64,
        tasks: Vec<TaskRecord>,
        completed_tasks: Vec<TaskRecord>,
    ) -> Self {
        AgentEntry {
            info,
            tasks,
            completed_tasks,
            connected: true,
            missed_pings: 0,
            ping_in_flight: false,
            launch_check_due: false,
            registration,
            version: String::new(),
            view: None,
            remote: None,
        }
    }
}

impl AgentEntry {
    /// A handle, through `node`, on the agent's process at its current address; `None` if
    /// that address is not a process address (`name@host:port`).
    pub(crate) fn remote(&mut self, node: &Node) -> Option<&RemotePid> {
        let address = self.info.address.as_str();
        if self
            .remote
            .as_ref()
            .is_none_or(|(made_for, _)| **made_for != *address)
        {
            let upid = address.parse::<Upid>().ok()?;
            self.remote = Some((address.into(), node.remote(upid)));
        }
        self.remote.as_ref().map(|(_, remote)| remote)
    }

    /// Takes `task`, just placed here. Its scheduler view, if built, takes the task in place
    /// rather than being rebuilt for the next snapshot: a rebuild sorts the agent's tasks
    /// again, and spread placement adds a task of every job to every agent.
    pub(crate) fn add_task(&mut self, task: TaskRecord) {
        if let Some(view) = &mut self.view {
            Arc::make_mut(view).add_task(Arc::clone(&task.view));
        }
        // Grown by a quarter rather than doubled: a master holds every task of the cluster,
        // and a doubled list is a quarter empty on average.
        if self.tasks.len() == self.tasks.capacity() {
            self.tasks.reserve_exact((self.tasks.len() / 4).max(4));
        }
        self.tasks.push(task);
    }

    /// The ports its live tasks hold.
    pub(crate) fn ports_in_use(&self) -> std::collections::BTreeSet<u16> {
        self.tasks
            .iter()
            .filter(|t| !t.is_terminal())
            .flat_map(|t| t.view.ports().iter().copied())
            .collect()
    }

    /// What is left for new tasks: its resources less what its non-terminal tasks hold, never
    /// below zero.
    pub(crate) fn free(&self) -> Resources {
        // A view is dropped whenever the tasks change, so one still here has it worked out.
        if let Some(view) = &self.view {
            return view.free();
        }
        let used = self
            .tasks
            .iter()
            .filter(|t| !t.is_terminal())
            .fold(Resources::default(), |sum, t| {
                sum.saturating_add(t.resources())
            });
        self.info.resources.saturating_sub(&used)
    }
}

/// Agents by id and frameworks by id.
#[derive(Debug, Default)]
pub(crate) struct Cluster {
    /// Ordered by id, as schedulers read them: a snapshot lists them without sorting.
    pub(crate) agents: BTreeMap<String, AgentEntry>,
    pub(crate) frameworks: HashMap<String, pb::Framework>,
    /// Frameworks known only from completed tasks.
    pub(crate) completed_frameworks: HashSet<String>,
    /// The one copy of what tasks share.
    pub(crate) interner: TaskInterner,
}

impl Cluster {
    /// Records the frameworks not known yet; copies only those.
    pub(crate) fn add_frameworks(&mut self, frameworks: &[pb::Framework]) {
        for framework in frameworks {
            if !self.frameworks.contains_key(&framework.id) {
                self.frameworks
                    .insert(framework.id.clone(), framework.clone());
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
pub(crate) fn registry_info(info: &model_pb::AgentInfo, identity: &str) -> AgentInfo {
    AgentInfo {
        hostname: info.hostname.clone(),
        address: info.address.clone(),
        resources: info.resources.map(resources).unwrap_or_default(),
        attributes: sorted(info.attributes.clone()),
        dynamic_ports: registry_info_ports(info),
        identity: identity.to_owned(),
    }
}

fn resources(r: model_pb::Resources) -> Resources {
    Resources {
        cpus: r.cpus,
        mem_mb: r.mem_mb,
    }
}

/// A task's state by the model's rules. Lenient, as the master always was with what agents
/// report: an unknown state counts as not started (it holds its resources until the agent
/// says more).
pub(crate) fn state_of(task: &model_pb::Task) -> TaskState {
    TaskState::try_from(task.state).unwrap_or(TaskState::Staging)
}

/// The running tasks a re-registering agent reports: `tasks`, then those it sent grouped by
/// the labels they share (whose own labels are then empty).
pub(crate) fn running_reported(
    request: &pb::ReregisterAgent,
) -> impl Iterator<Item = &model_pb::Task> {
    request.tasks.iter().chain(
        request
            .tasks_sharing_labels
            .iter()
            .flat_map(|group| &group.tasks),
    )
}

/// The jobs an agent reports live (not ended) tasks of.
pub(crate) fn live_jobs_reported<'a>(
    tasks: impl IntoIterator<Item = &'a model_pb::Task>,
) -> HashSet<&'a str> {
    tasks
        .into_iter()
        .filter(|t| !state_of(t).is_terminal())
        .map(|t| t.job.as_str())
        .filter(|job| !job.is_empty())
        .collect()
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
        && registry_info_ports(wire) == stored.dynamic_ports
}

/// The dynamic port range an agent's info names, as the registry keeps it: one that does not
/// read (zero, or backwards), or none, is the default range.
fn registry_info_ports(info: &model_pb::AgentInfo) -> muster_model::PortRange {
    info.dynamic_ports
        .and_then(|range| muster_model::PortRange::try_from(range).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_round_trips_and_compares_equal() {
        let wire = model_pb::AgentInfo {
            dynamic_ports: Some(model_pb::PortRange {
                min: 40_000,
                max: 40_999,
            }),
            hostname: "h".into(),
            address: "agent@127.0.0.1:1".into(),
            resources: Some(model_pb::Resources {
                cpus: 20.0,
                mem_mb: 10240,
            }),
            attributes: [("rack".to_owned(), "r1".to_owned())].into(),
        };
        let stored = registry_info(&wire, "");
        assert!(same_info(&wire, &stored));
        assert_eq!(model_pb::AgentInfo::from(stored.clone()), wire);
        let mut moved = wire.clone();
        moved.attributes.insert("rack".into(), "r2".into());
        assert!(!same_info(&moved, &stored));
        let mut ranged = wire.clone();
        ranged.dynamic_ports = None;
        assert!(!same_info(&ranged, &stored), "a new range is a new info");
    }

    #[tokio::test]
    async fn an_agents_handle_follows_its_address() -> anyhow::Result<()> {
        let system = muster_actor::System::new();
        let security = muster_security::testing::TestPki::shared()
            .security(muster_security::Role::Master, "master");
        let node = Node::bind(&system, "127.0.0.1:0", security).await?;
        let mut info = registry_info(
            &model_pb::AgentInfo {
                address: "agent@127.0.0.1:1".into(),
                ..model_pb::AgentInfo::default()
            },
            "",
        );
        let mut agent = AgentEntry::awaiting(&info);
        let first = agent.remote(&node).map(|r| r.upid().to_string());
        assert_eq!(first.as_deref(), Some("agent@127.0.0.1:1"));

        info.address = "agent@127.0.0.1:2".into();
        agent.info = info.clone();
        let moved = agent.remote(&node).map(|r| r.upid().to_string());
        assert_eq!(
            moved.as_deref(),
            Some("agent@127.0.0.1:2"),
            "remade when it moves"
        );

        info.address = "not a process address".into();
        agent.info = info;
        assert!(agent.remote(&node).is_none());
        node.shutdown();
        Ok(())
    }

    #[test]
    fn an_odd_task_is_read_as_not_started_and_holding_nothing() {
        let odd = model_pb::Task {
            id: "t".into(),
            state: 42,
            resources: None,
            ..model_pb::Task::default()
        };
        assert_eq!(state_of(&odd), TaskState::Staging);
        let record = crate::task_record::TaskInterner::default().task(&odd);
        assert_eq!(record.state(), TaskState::Staging);
        assert_eq!(*record.resources(), Resources::default());
        let running = model_pb::Task {
            state: TaskState::Finished.into(),
            job: "web".into(),
            ..odd
        };
        assert_eq!(state_of(&running), TaskState::Finished);
        assert!(live_jobs_reported(&[running]).is_empty());
    }
}

//! The leading master's in-memory view of the cluster: agents with their tasks, and
//! frameworks. None of it is in the registry; a new leader rebuilds it from re-registrations.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use muster_proto::cluster as pb;
use muster_registry::{AgentInfo, Resources};
use muster_scheduler::AgentView;

/// An agent the leading master knows.
#[derive(Debug)]
pub(crate) struct AgentEntry {
    pub(crate) info: pb::AgentInfo,
    pub(crate) tasks: Vec<pb::Task>,
    pub(crate) completed_tasks: Vec<pb::Task>,
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
            info: wire_info(info),
            tasks: Vec::new(),
            completed_tasks: Vec::new(),
            connected: false,
            missed_pings: 0,
            ping_in_flight: false,
            view: None,
        }
    }

    /// A connected agent with what it runs.
    pub(crate) fn connected(
        info: pb::AgentInfo,
        tasks: Vec<pb::Task>,
        completed_tasks: Vec<pb::Task>,
    ) -> Self {
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

/// The registry's form of an agent's info.
pub(crate) fn registry_info(info: &pb::AgentInfo) -> AgentInfo {
    let resources = info.resources.unwrap_or_default();
    AgentInfo {
        hostname: info.hostname.clone(),
        address: info.address.clone(),
        resources: Resources {
            cpus: resources.cpus,
            mem_mb: resources.mem_mb,
        },
        attributes: info
            .attributes
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<BTreeMap<_, _>>(),
    }
}

/// The wire form of an agent's info.
pub(crate) fn wire_info(info: &AgentInfo) -> pb::AgentInfo {
    pb::AgentInfo {
        hostname: info.hostname.clone(),
        address: info.address.clone(),
        resources: Some(pb::Resources {
            cpus: info.resources.cpus,
            mem_mb: info.resources.mem_mb,
        }),
        attributes: info
            .attributes
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    }
}

/// Whether `wire` describes the same agent as the registry's `stored` record, without
/// building a registry record (the re-registration hot path).
pub(crate) fn same_info(wire: &pb::AgentInfo, stored: &AgentInfo) -> bool {
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
        let wire = pb::AgentInfo {
            hostname: "h".into(),
            address: "agent@127.0.0.1:1".into(),
            resources: Some(pb::Resources {
                cpus: 20.0,
                mem_mb: 10240,
            }),
            attributes: [("rack".to_owned(), "r1".to_owned())].into(),
        };
        let stored = registry_info(&wire);
        assert!(same_info(&wire, &stored));
        assert_eq!(wire_info(&stored), wire);
        let mut moved = wire.clone();
        moved.attributes.insert("rack".into(), "r2".into());
        assert!(!same_info(&moved, &stored));
    }
}

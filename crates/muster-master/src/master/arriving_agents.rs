//! Arriving agents: what an agent joining or coming back sets off (its capacity to the
//! blocked-queue, an evaluation for each system job and each job it runs).

use std::collections::HashSet;

use muster_actor::Context;
use muster_broker::blocked::{BlockedMsg, CapacityChange};
use muster_proto::cluster as pb;
use muster_registry::AgentId;
use muster_registry::jobs::{Evaluation, SchedulerType, Trigger};

use super::Master;
use super::tasks::{free, is_terminal, task_job, used};
use crate::cluster::registry_info;

impl Master {
    /// A newly registered agent: its capacity may unblock evaluations, and every system job
    /// gets an evaluation to place a task on it (written once the registry has named it).
    pub(super) fn agent_joined(&mut self, agent_id: &str, ctx: &mut Context<Self>) {
        self.capacity_joined(agent_id);
        let evals = self.evals_for_arriving_agent(agent_id, &[]);
        if !evals.is_empty() {
            self.write_with_evals(Vec::new(), evals, ctx, |_master, _ctx, written| {
                if let Err(e) = written {
                    tracing::warn!(error = %e, "could not write system-job evaluations");
                }
            });
        }
    }

    /// For an agent that joined or came back: one evaluation for each system job (to place a
    /// task on it) and each job it reports a live task of (replacements may have been placed
    /// while it was away). A returning agent's are written with its return in one raft entry.
    pub(super) fn evals_for_arriving_agent(
        &self,
        agent_id: &str,
        tasks: &[pb::Task],
    ) -> Vec<Evaluation> {
        let running: HashSet<&str> = tasks
            .iter()
            .filter(|t| !is_terminal(t))
            .filter_map(task_job)
            .collect();
        self.registry.reader().read(|state| {
            state
                .jobs
                .values()
                .filter(|j| {
                    !j.stopped
                        && (j.scheduler == SchedulerType::System
                            || running.contains(j.name.as_str()))
                })
                .map(|j| Evaluation::new(j, Trigger::AgentUpdate(AgentId(agent_id.to_owned()))))
                .collect()
        })
    }

    /// An agent's capacity is news for the blocked-queue (it joined or came back).
    pub(super) fn capacity_joined(&mut self, agent_id: &str) {
        let index = self.next_index();
        let Some(agent) = self.cluster.agents.get(agent_id) else {
            return;
        };
        let info = registry_info(&agent.info);
        let change = CapacityChange {
            agent: AgentId(agent_id.to_owned()),
            attributes: info.attributes,
            free: free(&info.resources, &used(&agent.tasks)),
            index,
        };
        let _ = self.blocked.tell(BlockedMsg::CapacityChanged(change));
    }
}

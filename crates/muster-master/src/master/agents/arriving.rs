//! Arriving agents: what an agent joining or coming back sets off (its capacity to the
//! blocked-queue, an evaluation for each system job and each job it runs).

use std::collections::HashSet;

use muster_actor::Context;
use muster_broker::blocked::{BlockedMsg, CapacityChange};
use muster_model::AgentId;
use muster_model::{Evaluation, SchedulerType, Trigger};

use crate::master::Master;

impl Master {
    /// A newly registered agent: its capacity may unblock evaluations, and every system job
    /// gets an evaluation to place a task on it (written once the registry has named it).
    pub(in crate::master) fn agent_joined(&mut self, agent_id: &str, ctx: &mut Context<Self>) {
        self.capacity_joined(agent_id);
        let evals = self.evals_for_arriving_agent(agent_id, &HashSet::new());
        if !evals.is_empty() {
            self.write_with_evals(Vec::new(), evals, ctx, |_master, _ctx, written| {
                if let Err(e) = written {
                    tracing::warn!(error = %e, "could not write system-job evaluations");
                }
            });
        }
    }

    /// For an agent that joined or came back: one evaluation for each system job (to place a
    /// task on it) and each job it reports a live task of (`running`) (replacements may have been placed
    /// while it was away). A returning agent's are written with its return in one raft entry.
    pub(in crate::master) fn evals_for_arriving_agent(
        &self,
        agent_id: &str,
        running: &HashSet<&str>,
    ) -> Vec<Evaluation> {
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
    pub(in crate::master) fn capacity_joined(&mut self, agent_id: &str) {
        let index = self.next_index();
        let Some(agent) = self.cluster.agents.get(agent_id) else {
            return;
        };
        let change = CapacityChange {
            agent: AgentId(agent_id.to_owned()),
            attributes: agent.info.attributes.clone(),
            free: agent.free(),
            index,
        };
        let _ = self.blocked.tell(BlockedMsg::CapacityChanged(change));
    }
}

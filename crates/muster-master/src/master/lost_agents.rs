//! Lost agents: moving the agents found gone together (one heartbeat sweep, one
//! re-registration deadline, too many missed pings) to unreachable, with the evaluations that
//! replace what they ran, in one raft entry.

use std::collections::HashMap;

use muster_actor::Context;
use muster_model::AgentId;
use muster_model::{Evaluation, SchedulerType, Trigger};
use muster_registry::Op;

use super::Master;
use super::registry_writes::now_ms;
use crate::task_record::TaskRecord;

impl Master {
    /// Moves agents found gone together (one heartbeat sweep, one deadline) to unreachable,
    /// with one evaluation for each job any of them ran a task of (and each system job; with
    /// `unknown_tasks`, each service job too), all in one raft entry: 500 agents lost at once
    /// make one evaluation per job, not one per job per agent.
    pub(super) fn mark_unreachable(
        &mut self,
        ids: Vec<String>,
        unknown_tasks: bool,
        ctx: &mut Context<Self>,
    ) {
        if ids.is_empty() {
            return;
        }
        let evals = self.evals_for_lost_agents(&ids, unknown_tasks);
        let at_ms = now_ms();
        let ops = ids
            .iter()
            .map(|id| Op::MarkUnreachable {
                id: AgentId(id.clone()),
                at_ms,
            })
            .collect();
        self.write_with_evals(ops, evals, ctx, move |master, _ctx, written| match written {
            Ok(_) => {
                for id in &ids {
                    master.metrics.unreachable += 1;
                    if let Some(agent) = master.cluster.agents.remove(id) {
                        // Every task not reported ended: running, or being killed.
                        let lost: Vec<_> = agent
                            .tasks
                            .into_iter()
                            .map(|mut t| {
                                t.set_state(muster_model::TaskState::Lost);
                                t.exit_code = 0;
                                t.message = "given up: its agent was marked unreachable".into();
                                t
                            })
                            .collect();
                        master.cluster.given_up.insert(id.clone(), lost);
                    }
                    master.heartbeats.remove(id);
                    tracing::warn!(agent = %id, "agent marked unreachable");
                }
                master.next_index();
            }
            Err(e) => {
                tracing::warn!(agents = ids.len(), error = %e, "could not mark agents unreachable")
            }
        });
    }

    /// One evaluation for every job with a task on any of the agents, and every system job
    /// (with `all_service_jobs`, every service job too): written in the same raft entry as the
    /// agents' move to unreachable. Each names the first of the agents that ran the job (the
    /// first agent, for a system job).
    fn evals_for_lost_agents(
        &self,
        agent_ids: &[String],
        all_service_jobs: bool,
    ) -> Vec<Evaluation> {
        let Some(first) = agent_ids.first() else {
            return Vec::new();
        };
        // Each job with a task on them, and the first of them it ran on.
        let mut ran_on: HashMap<&str, &str> = HashMap::new();
        for agent_id in agent_ids {
            let Some(agent) = self.cluster.agents.get(agent_id) else {
                continue;
            };
            for job in agent
                .tasks
                .iter()
                .filter(|t| !t.is_terminal())
                .filter_map(TaskRecord::job_name)
            {
                ran_on.entry(job).or_insert(agent_id);
            }
        }
        self.registry.reader().read(|state| {
            state
                .jobs
                .values()
                .filter(|j| !j.stopped)
                .filter_map(|j| {
                    let agent = match ran_on.get(j.name.as_str()) {
                        Some(agent) => *agent,
                        None if j.scheduler == SchedulerType::System => first.as_str(),
                        None if all_service_jobs && j.scheduler == SchedulerType::Service => {
                            first.as_str()
                        }
                        None => return None,
                    };
                    Some(Evaluation::new(
                        j,
                        Trigger::AgentUnreachable(AgentId(agent.to_owned())),
                    ))
                })
                .collect()
        })
    }
}

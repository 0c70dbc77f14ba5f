//! Lost agents: moving the agents found gone together (one heartbeat sweep, one
//! re-registration deadline, too many missed pings) to unreachable, with what they ran
//! (UNKNOWN while they are away) and the evaluations that replace it, in one raft entry.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use muster_actor::Context;
use muster_model::{
    AgentId, DisconnectPolicy, Evaluation, SchedulerType, Task, TaskState, Trigger, task_namespace,
};
use muster_registry::{Op, RegistryState};

use crate::master::Master;
use crate::master::registry_writes::now_ms;
use crate::task_record::TaskRecord;

impl Master {
    /// Moves agents found gone together (one heartbeat sweep, one deadline) to unreachable,
    /// with what each ran (the registry keeps it, UNKNOWN, for whichever master leads when it
    /// comes back) and one evaluation for each job any of them ran a task of (and each system
    /// job; with `unknown_tasks`, each service job too), all in one raft entry: 500 agents
    /// lost at once make one evaluation per job, not one per job per agent. A group that does
    /// not replace such tasks (`disconnect.replace = false`) keeps their slots until its
    /// `lost_after`; a convergence check is due then, and places their replacements.
    pub(in crate::master) fn mark_unreachable(
        &mut self,
        ids: Vec<String>,
        unknown_tasks: bool,
        ctx: &mut Context<Self>,
    ) {
        if ids.is_empty() {
            return;
        }
        let at_ms = now_ms();
        let evals = self.evals_for_lost_agents(&ids, unknown_tasks);
        let ops = ids
            .iter()
            .map(|id| Op::MarkUnreachable {
                id: AgentId(id.clone()),
                at_ms,
                tasks: self.tasks_given_up(id),
            })
            .collect();
        self.write_with_evals(ops, evals, ctx, move |master, ctx, written| match written {
            Ok(_) => {
                // Their tasks no longer count against their namespaces' quotas.
                let freed: BTreeSet<String> = ids
                    .iter()
                    .filter_map(|id| master.cluster.agents.get(id))
                    .flat_map(|agent| agent.tasks.iter().filter(|task| !task.is_terminal()))
                    .map(|task| task_namespace(task.job(), task.name()).to_owned())
                    .collect();
                for id in &ids {
                    master.metrics.unreachable += 1;
                    master.cluster.agents.remove(id);
                    master.heartbeats.remove(id);
                    tracing::warn!(agent = %id, "agent marked unreachable");
                }
                let index = master.next_index();
                for namespace in &freed {
                    master.quota_freed(namespace, false, index);
                }
                master.check_when_kept_slots_go(ctx);
            }
            Err(e) => {
                tracing::warn!(agents = ids.len(), error = %e, "could not mark agents unreachable")
            }
        });
    }

    /// What the agent runs (or is starting, or being told to kill), as the registry keeps it
    /// while the agent is away: without program, arguments, environment and labels.
    fn tasks_given_up(&self, agent_id: &str) -> Vec<Task> {
        let Some(agent) = self.cluster.agents.get(agent_id) else {
            return Vec::new();
        };
        agent
            .tasks
            .iter()
            .filter_map(|record| {
                let task = Task::try_from(record.to_wire()).ok()?;
                Some(Task {
                    command: String::new(),
                    args: Vec::new(),
                    env: Default::default(),
                    labels: Vec::new(),
                    ..task
                })
            })
            .collect()
    }

    /// Schedules a convergence check (`master/convergence.rs`) for each moment a slot kept
    /// for a task of an unreachable agent (`disconnect.replace = false`) is let go, its task
    /// lost for good: the check finds the job below its count and evaluates it, which places
    /// the replacement. The registry holds what to compute it from, so a new leader schedules
    /// the same checks. (Nothing waits in the registry or the broker meanwhile: an agent that
    /// comes back first leaves nothing behind.)
    pub(in crate::master) fn check_when_kept_slots_go(&mut self, ctx: &mut Context<Self>) {
        let now = now_ms();
        let due: BTreeSet<u64> = self.registry.reader().read(|state| {
            state
                .unreachable
                .values()
                .flat_map(|agent| {
                    agent.tasks.iter().filter_map(|task| {
                        let policy = disconnect_of(state, &task.job, &task.group)?;
                        (!policy.replace && policy.lost_after_ms > 0)
                            .then(|| agent.marked_at_ms.saturating_add(policy.lost_after_ms))
                    })
                })
                .filter(|due| *due > now)
                // One check per tenth of a second is enough.
                .map(|due| due.div_ceil(100) * 100)
                .collect()
        });
        for due in due {
            let wait = std::time::Duration::from_millis(due - now + KEEP_MARGIN_MS);
            let _ = ctx.delay(wait, crate::master::evaluations::CheckConvergence.into());
        }
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

/// The `disconnect` policy of `job`'s group `group`, with the job type's defaults, if the job
/// and group are registered.
pub(in crate::master) fn disconnect_of(
    state: &RegistryState,
    job: &str,
    group: &str,
) -> Option<DisconnectPolicy> {
    let job = state.jobs.get(job)?;
    job.groups
        .iter()
        .find(|g| g.name == group)
        .map(|g| g.disconnect.policy(job.scheduler))
}

/// The policy for a task of a job or group no longer registered: a service's defaults.
pub(in crate::master) fn default_disconnect() -> DisconnectPolicy {
    muster_model::Disconnect::default().policy(SchedulerType::Service)
}

/// How much later than the moment an unreachable agent's kept slots are let go (their tasks
/// lost for good) the convergence check that replaces them runs: it never finds them still
/// kept, and nothing is placed in them before then.
const KEEP_MARGIN_MS: u64 = 100;

impl Master {
    /// The tasks of agents marked unreachable, as operators see them: each UNKNOWN, or LOST
    /// once its group's `disconnect.lost_after` has passed; by agent.
    pub(in crate::master) fn tasks_away_by_agent(&self) -> BTreeMap<AgentId, Vec<Task>> {
        let now = now_ms();
        self.registry.reader().read(|state| {
            state
                .unreachable
                .iter()
                .map(|(id, agent)| {
                    let tasks = agent
                        .tasks
                        .iter()
                        .map(|task| {
                            let policy = disconnect_of(state, &task.job, &task.group)
                                .unwrap_or_else(default_disconnect);
                            let state = if policy.lost_for_good(agent.marked_at_ms, now) {
                                TaskState::Lost
                            } else {
                                TaskState::Unknown
                            };
                            Task {
                                state,
                                ..task.clone()
                            }
                        })
                        .collect();
                    (id.clone(), tasks)
                })
                .collect()
        })
    }

    /// Every task of agents marked unreachable, as [`tasks_away_by_agent`](Self::tasks_away_by_agent).
    pub(in crate::master) fn tasks_away(&self) -> Vec<Task> {
        self.tasks_away_by_agent().into_values().flatten().collect()
    }

    /// The slots whose task is on an unreachable agent and keeps them
    /// (`disconnect.replace = false`) until it is lost for good: schedulers leave them empty.
    pub(in crate::master) fn slots_kept_while_away(&self) -> BTreeSet<String> {
        self.tasks_kept_while_away()
            .into_iter()
            .map(|task| task.name)
            .collect()
    }

    /// The batch slots the registry records as finished: schedulers leave them empty (their
    /// task ran; its agent may be away, or not yet back after a failover).
    pub(in crate::master) fn batch_slots_finished(&self) -> BTreeSet<String> {
        self.registry.reader().read(|state| {
            state
                .jobs
                .values()
                .filter(|job| job.scheduler == SchedulerType::Batch)
                .flat_map(|job| state.finished_slots(job).map(|(_, slot)| slot.to_owned()))
                .collect()
        })
    }

    /// The tasks on unreachable agents that keep their slots (`disconnect.replace = false`)
    /// until they are lost for good: the convergence check counts them as running.
    pub(in crate::master) fn tasks_kept_while_away(&self) -> Vec<Task> {
        let now = now_ms();
        self.registry.reader().read(|state| {
            let mut kept = Vec::new();
            for agent in state.unreachable.values() {
                for task in &agent.tasks {
                    let Some(policy) = disconnect_of(state, &task.job, &task.group) else {
                        continue;
                    };
                    if !policy.replace && !policy.lost_for_good(agent.marked_at_ms, now) {
                        kept.push(task.clone());
                    }
                }
            }
            kept
        })
    }
}

//! The leading master's plan applier and the views schedulers plan against.
//!
//! Schedulers plan optimistically and concurrently against a [`ClusterSnapshot`]; the master
//! applies their plans one at a time (it is one process), checking each placement against the
//! agents as they are now: what fits is committed and launched, what no longer fits goes back
//! rejected so the scheduler can refresh and try again (Nomad's plan applier, seed 003).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use muster_actor::{Context, Reply, Upid};
use muster_broker::blocked::{BlockedEval, BlockedMsg, CapacityChange, Demand as BlockedDemand};
use muster_proto::cluster as pb;
use muster_registry::jobs::{EvalStatus, Evaluation, SchedulerType, Trigger};
use muster_registry::{AgentId, Resources};
use muster_scheduler::{
    AgentView, ClusterSnapshot, Demand, Placement, Plan, PlanResult, Stop, TaskState, TaskView,
};

use super::scheduling::{GROUP_LABEL, JOB_LABEL, VERSION_LABEL, task_job};
use super::{Master, MasterMsg};
use crate::cluster::{AgentEntry, registry_info};

/// How many ended tasks an agent's entry keeps for `muster job status`.
const COMPLETED_HISTORY: usize = 1_000;

fn resources_of(task: &pb::Task) -> Resources {
    let r = task.resources.unwrap_or_default();
    Resources {
        cpus: r.cpus,
        mem_mb: r.mem_mb,
    }
}

fn task_state(state: i32) -> TaskState {
    match pb::TaskState::try_from(state) {
        Ok(pb::TaskState::Running) => TaskState::Running,
        Ok(pb::TaskState::Finished) => TaskState::Finished,
        Ok(pb::TaskState::Failed) => TaskState::Failed,
        Ok(pb::TaskState::Killed) => TaskState::Killed,
        Ok(pb::TaskState::Lost) => TaskState::Lost,
        _ => TaskState::Pending,
    }
}

/// Whether the task ended (finished, failed, killed, lost).
pub(super) fn is_terminal(task: &pb::Task) -> bool {
    task_state(task.state).is_terminal()
}

fn view(task: &pb::Task) -> TaskView {
    let label = |key: &str| {
        task.labels
            .iter()
            .find(|l| l.key == key)
            .map(|l| l.value.clone())
            .unwrap_or_default()
    };
    TaskView {
        id: task.id.clone(),
        name: task.name.clone(),
        job: label(JOB_LABEL),
        group: label(GROUP_LABEL),
        resources: resources_of(task),
        state: task_state(task.state),
        // Missing or malformed (a task not launched by the plan applier): unknown, current.
        job_version: label(VERSION_LABEL).parse().unwrap_or(0),
    }
}

/// What an agent offers in all.
fn total_of(info: &pb::AgentInfo) -> Resources {
    let r = info.resources.unwrap_or_default();
    Resources {
        cpus: r.cpus,
        mem_mb: r.mem_mb,
    }
}

fn used(tasks: &[pb::Task]) -> Resources {
    tasks
        .iter()
        .filter(|t| !is_terminal(t))
        .fold(Resources::default(), |sum, t| {
            let r = resources_of(t);
            Resources {
                cpus: sum.cpus + r.cpus,
                mem_mb: sum.mem_mb + r.mem_mb,
            }
        })
}

fn free(total: &Resources, used: &Resources) -> Resources {
    Resources {
        cpus: (total.cpus - used.cpus).max(0.0),
        mem_mb: total.mem_mb.saturating_sub(used.mem_mb),
    }
}

impl Master {
    /// The index the cluster state is at: it counts changes to agents and tasks, and never
    /// falls behind the registry's applied index, so snapshots, plans, evaluations and the
    /// blocked-queue's capacity changes share one order.
    pub(super) fn current_index(&self) -> u64 {
        self.state_index.max(self.registry.reader().applied_index())
    }

    /// Records a change to agents or tasks and returns its index.
    pub(super) fn next_index(&mut self) -> u64 {
        self.state_index = self.current_index() + 1;
        self.state_index
    }

    /// The cluster as schedulers see it: connected agents with their tasks, and the jobs.
    /// Agents whose tasks did not change since the last snapshot share their views with it.
    pub(super) fn snapshot(&mut self) -> ClusterSnapshot {
        let jobs = self.registry.reader().read(|state| state.jobs.clone());
        let mut agents: Vec<Arc<AgentView>> = self
            .cluster
            .agents
            .iter_mut()
            .filter(|(_, agent)| agent.connected)
            .map(|(id, agent)| {
                let view = agent.view.get_or_insert_with(|| {
                    let info = registry_info(&agent.info);
                    Arc::new(AgentView {
                        id: AgentId(id.clone()),
                        attributes: info.attributes,
                        total: info.resources,
                        tasks: agent
                            .tasks
                            .iter()
                            .chain(agent.completed_tasks.iter().rev().take(100))
                            .map(view)
                            .collect(),
                    })
                });
                Arc::clone(view)
            })
            .collect();
        agents.sort_unstable_by(|a, b| a.id.cmp(&b.id));
        ClusterSnapshot {
            index: self.current_index(),
            agents,
            jobs,
            held: self.crash_loops.held(tokio::time::Instant::now()),
        }
    }

    /// Applies one plan: stops first, then each placement that still fits.
    pub(super) fn apply_plan(
        &mut self,
        plan: Plan,
        reply: Reply<Result<PlanResult, String>>,
        ctx: &mut Context<Self>,
    ) {
        if self.leading_term().is_none() {
            return reply.send(Err(self.not_leading()));
        }
        let mut result = PlanResult::default();
        for stop in plan.stop {
            if self.stop_task(&stop, ctx) {
                result.stopped.push(stop);
            }
        }
        // One launch message per agent for the whole plan.
        let mut launches: HashMap<String, Vec<pb::RunTask>> = HashMap::new();
        for placement in plan.place {
            let fits = self
                .cluster
                .agents
                .get(&placement.agent.0)
                .is_some_and(|agent| {
                    let free = free(&total_of(&agent.info), &used(&agent.tasks));
                    agent.connected
                        && placement.resources.cpus <= free.cpus + 1e-9
                        && placement.resources.mem_mb <= free.mem_mb
                });
            if fits {
                if let Some(run) = self.stage_placement(&placement) {
                    launches
                        .entry(placement.agent.0.clone())
                        .or_default()
                        .push(run);
                }
                result.committed.push(placement);
            } else {
                result.rejected.push(placement);
            }
        }
        let staged: Vec<(String, String)> = launches
            .iter()
            .flat_map(|(agent_id, runs)| {
                runs.iter().filter_map(|run| {
                    let task = run.task.as_ref()?;
                    Some((agent_id.clone(), task.id.clone()))
                })
            })
            .collect();
        for (agent_id, tasks) in launches {
            self.send_launch(agent_id, tasks, ctx);
        }
        if !staged.is_empty() && self.node.is_some() {
            ctx.delay(
                self.config.launch_timeout,
                MasterMsg::LaunchesTimedOut(staged),
            );
        }
        result.index = if !result.committed.is_empty() || !result.stopped.is_empty() {
            self.next_index()
        } else {
            self.current_index()
        };
        self.metrics.plans += 1;
        reply.send(Ok(result));
    }

    /// Records a placement's task on its agent, staging; returns what to send the agent.
    fn stage_placement(&mut self, placement: &Placement) -> Option<pb::RunTask> {
        let framework = pb::Framework {
            id: placement.job.clone(),
            name: placement.job.clone(),
        };
        let task = pb::Task {
            id: placement.task_id.clone(),
            name: placement.name.clone(),
            framework_id: placement.job.clone(),
            resources: Some(pb::Resources {
                cpus: placement.resources.cpus,
                mem_mb: placement.resources.mem_mb,
            }),
            labels: vec![
                pb::Label {
                    key: JOB_LABEL.into(),
                    value: placement.job.clone(),
                },
                pb::Label {
                    key: GROUP_LABEL.into(),
                    value: placement.group.clone(),
                },
                pb::Label {
                    key: VERSION_LABEL.into(),
                    value: placement.job_version.to_string(),
                },
            ],
            state: pb::TaskState::Staging as i32,
            exit_code: 0,
            command: placement.command.clone(),
            args: placement.args.clone(),
            env: placement
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            message: String::new(),
        };
        if !self.cluster.frameworks.contains_key(&framework.id) {
            self.cluster.add_frameworks(vec![framework.clone()]);
        }
        let agent = self.cluster.agent_mut(&placement.agent.0)?;
        agent.tasks.push(task.clone());
        Some(pb::RunTask {
            framework: Some(framework),
            task: Some(task),
        })
    }

    /// Tells an agent to run `tasks` (one message, no answer: each task's start or failure
    /// comes back as a status update). Tasks that cannot even be sent fail now.
    fn send_launch(&mut self, agent_id: String, tasks: Vec<pb::RunTask>, ctx: &mut Context<Self>) {
        let Some(agent) = self.cluster.agents.get(&agent_id) else {
            return;
        };
        let (Some(node), Ok(upid)) = (&self.node, agent.info.address.parse::<Upid>()) else {
            // No way to reach it (in-process benches): the tasks stay staged.
            return;
        };
        let staged: Vec<pb::Task> = tasks.iter().filter_map(|run| run.task.clone()).collect();
        let Err(e) = node.remote(upid).tell(pb::LaunchTasks { tasks }) else {
            return;
        };
        tracing::warn!(agent = %agent_id, error = %e, tasks = staged.len(), "launch failed");
        for mut failed in staged {
            failed.state = pb::TaskState::Failed as i32;
            failed.exit_code = -1;
            failed.message = format!("could not send the launch to the agent: {e}");
            self.task_updated(agent_id.clone(), failed, ctx);
        }
    }

    /// Marks a task killed (it frees its resources now) and tells its agent to stop it.
    fn stop_task(&mut self, stop: &Stop, ctx: &mut Context<Self>) -> bool {
        let Some(agent) = self.cluster.agent_mut(&stop.agent.0) else {
            return false;
        };
        let Some(task) = agent.tasks.iter_mut().find(|t| t.id == stop.task_id) else {
            return false;
        };
        task.state = pb::TaskState::Killed as i32;
        let (Some(node), Ok(upid)) = (&self.node, agent.info.address.parse::<Upid>()) else {
            return true;
        };
        let remote = node.remote(upid);
        let kill = pb::KillTask {
            task_id: stop.task_id.clone(),
        };
        let timeout = self.config.ping_timeout;
        ctx.defer(
            async move {
                remote
                    .ask_timeout::<pb::KillTask, pb::KillTaskReply>(timeout, kill)
                    .await
            },
            |_master: &mut Master, _ctx, answered| {
                if let Err(e) = answered {
                    tracing::warn!(error = %e, "could not ask an agent to kill a task");
                }
            },
        );
        true
    }

    /// An agent reports a task's state (or a launch failed). Ended tasks move to the history,
    /// their capacity goes to the blocked-queue, and a service job whose task ended on its own
    /// gets an evaluation to replace it (held back when the same slot keeps failing: see
    /// [`MasterConfig::reschedule_delay`](crate::MasterConfig::reschedule_delay)).
    pub(super) fn task_updated(
        &mut self,
        agent_id: String,
        task: pb::Task,
        ctx: &mut Context<Self>,
    ) {
        let Some(agent) = self.cluster.agent_mut(&agent_id) else {
            return;
        };
        let ended = is_terminal(&task);
        let position = agent.tasks.iter().position(|t| t.id == task.id);
        let was_killed = position
            .and_then(|i| agent.tasks.get(i))
            .is_some_and(|t| t.state == pb::TaskState::Killed as i32);
        match (position, ended) {
            // Being killed: only its end counts (a RUNNING sent before the kill arrived must
            // not bring it back).
            (Some(_), false) if was_killed => return,
            (Some(i), false) => agent.tasks[i] = task.clone(),
            (Some(i), true) => {
                agent.tasks.swap_remove(i);
                agent.completed_tasks.push(task.clone());
                if agent.completed_tasks.len() > COMPLETED_HISTORY {
                    agent.completed_tasks.remove(0);
                }
            }
            (None, false) => {
                let given_up = agent
                    .completed_tasks
                    .iter()
                    .any(|t| t.id == task.id && t.state == pb::TaskState::Lost as i32);
                let mut adopted = task.clone();
                if given_up {
                    // Reported after this master gave it up as lost and replaced it: it
                    // must not run beside its replacement.
                    adopted.state = pb::TaskState::Killed as i32;
                }
                agent.tasks.push(adopted);
                if given_up {
                    let stop = Stop {
                        agent: AgentId(agent_id.clone()),
                        task_id: task.id.clone(),
                    };
                    tracing::warn!(agent = %agent_id, task = %task.id, "a task given up as lost reports in: killing it");
                    self.stop_task(&stop, ctx);
                    return;
                }
            }
            (None, true) => return,
        }
        // What an ended task freed goes to the blocked-queue.
        let freed = ended.then(|| {
            let info = registry_info(&agent.info);
            (info.attributes, free(&info.resources, &used(&agent.tasks)))
        });
        let index = self.next_index();
        let Some((attributes, free_now)) = freed else {
            return;
        };
        let change = CapacityChange {
            agent: AgentId(agent_id.clone()),
            attributes,
            free: free_now,
            index,
        };
        let _ = self.blocked.tell(BlockedMsg::CapacityChanged(change));
        let replace = !was_killed
            && task.state != pb::TaskState::Finished as i32
            && task_job(&task).is_some_and(|job| {
                self.registry.reader().read(|s| {
                    s.jobs.get(job).is_some_and(|j| {
                        // A batch task that failed has run; one lost never did.
                        !j.stopped
                            && (j.scheduler != SchedulerType::Batch
                                || task.state == pb::TaskState::Lost as i32)
                    })
                })
            });
        if replace && let Some(job) = task_job(&task).map(str::to_owned) {
            let Some(job) = self.registry.reader().read(|s| s.jobs.get(&job).cloned()) else {
                return;
            };
            let mut eval = Evaluation::new(&job, Trigger::TaskEnded(task.id.clone()));
            // A task lost with its agent or its launch did not crash: no back-off.
            let (failures, wait) = if task.state == pb::TaskState::Lost as i32 {
                (0, Duration::ZERO)
            } else {
                self.crash_loops.failed(
                    &task.name,
                    tokio::time::Instant::now(),
                    self.config.reschedule_delay,
                    self.config.reschedule_max_delay,
                )
            };
            if !wait.is_zero() {
                let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
                eval.wait_until_ms = super::now_ms().saturating_add(wait_ms);
                eval.status_description = format!(
                    "{} ended {failures} times in a row: replaced after {wait:?}",
                    task.name
                );
                tracing::warn!(slot = %task.name, failures, ?wait, "task crash-looping: its replacement backs off");
            }
            let slot = task.name.clone();
            self.write_with_evals(Vec::new(), vec![eval], ctx, move |master, _ctx, written| {
                if let Err(e) = written {
                    tracing::warn!(error = %e, "could not write the replacement evaluation");
                    // No evaluation will come to place it: let the next one of the job.
                    master.crash_loops.release(&slot);
                }
            });
        }
    }

    /// An agent re-registered with what it runs; `previous` is what this master had for it.
    /// - A task the master had running there that the agent ended while away (it is in the
    ///   agent's completed tasks) is updated as ended: its job may get a replacement.
    /// - One the agent does not report at all (its launch was lost on the way, or the agent
    ///   lost its state) is LOST, and its job gets an evaluation to replace it.
    /// - One the agent runs that this master gave up on (marked LOST and replaced), or was
    ///   killing, is killed (again), so its slot does not end up with two tasks.
    pub(super) fn settle_reregistered(
        &mut self,
        agent_id: &str,
        previous: AgentEntry,
        ctx: &mut Context<Self>,
    ) {
        let Some(agent) = self.cluster.agents.get(agent_id) else {
            return;
        };
        // Given up as lost (and replaced), or being killed: neither may run on.
        let given_up: HashSet<&str> = previous
            .completed_tasks
            .iter()
            .filter(|t| t.state == pb::TaskState::Lost as i32)
            .chain(
                previous
                    .tasks
                    .iter()
                    .filter(|t| t.state == pb::TaskState::Killed as i32),
            )
            .map(|t| t.id.as_str())
            .collect();
        let to_kill: Vec<Stop> = agent
            .tasks
            .iter()
            .filter(|t| given_up.contains(t.id.as_str()))
            .map(|t| Stop {
                agent: AgentId(agent_id.to_owned()),
                task_id: t.id.clone(),
            })
            .collect();
        let mut ended_away = Vec::new();
        let mut lost = Vec::new();
        for known in previous.tasks.into_iter().filter(|t| !is_terminal(t)) {
            if agent.tasks.iter().any(|t| t.id == known.id) {
                continue;
            }
            match agent.completed_tasks.iter().find(|t| t.id == known.id) {
                Some(ended) => ended_away.push((known, ended.clone())),
                None => lost.push(known),
            }
        }
        for stop in to_kill {
            tracing::warn!(agent = %agent_id, task = %stop.task_id, "the agent runs a task already given up as lost: killing it");
            self.stop_task(&stop, ctx);
        }
        for (known, ended) in ended_away {
            if let Some(agent) = self.cluster.agent_mut(agent_id) {
                agent.completed_tasks.retain(|t| t.id != ended.id);
                agent.tasks.push(known);
            }
            self.task_updated(agent_id.to_owned(), ended, ctx);
        }
        for mut task in lost {
            tracing::warn!(agent = %agent_id, task = %task.id, "the re-registered agent does not know a task launched on it");
            if let Some(agent) = self.cluster.agent_mut(agent_id) {
                agent.tasks.push(task.clone());
            }
            task.state = pb::TaskState::Lost as i32;
            task.message = "the agent did not report it when it re-registered".into();
            self.task_updated(agent_id.to_owned(), task, ctx);
        }
    }

    /// Launches in `staged` (agent id, task id) that are still STAGING: no word from the agent
    /// since (a one-way launch can be lost with a broken link): LOST, and replaced.
    pub(super) fn launches_timed_out(
        &mut self,
        staged: Vec<(String, String)>,
        ctx: &mut Context<Self>,
    ) {
        for (agent_id, task_id) in staged {
            let Some(task) = self.cluster.agents.get(&agent_id).and_then(|agent| {
                agent
                    .tasks
                    .iter()
                    .find(|t| t.id == task_id && t.state == pb::TaskState::Staging as i32)
                    .cloned()
            }) else {
                continue;
            };
            tracing::warn!(agent = %agent_id, task = %task_id, "no word from the agent about a launched task: lost");
            let mut lost = task;
            lost.state = pb::TaskState::Lost as i32;
            lost.message = format!(
                "no word from the agent within {:?} of the launch",
                self.config.launch_timeout
            );
            self.task_updated(agent_id, lost, ctx);
        }
    }

    /// A worker could not place everything: the evaluation is recorded blocked and waits in
    /// the blocked-queue for capacity.
    pub(super) fn block_eval(
        &mut self,
        mut eval: Evaluation,
        unplaced: Vec<Demand>,
        snapshot_index: u64,
        reply: Reply<Result<(), String>>,
        ctx: &mut Context<Self>,
    ) {
        eval.status = EvalStatus::Blocked;
        eval.status_description = format!("{} task groups did not fit", unplaced.len());
        eval.snapshot_index = snapshot_index;
        let demands = unplaced
            .into_iter()
            .map(|d| BlockedDemand {
                resources: d.resources,
                constraints: d.constraints,
            })
            .collect();
        self.write_status(eval.clone(), ctx, move |master, written| {
            if written.is_ok() {
                let _ = master
                    .blocked
                    .tell(BlockedMsg::Block(BlockedEval { eval, demands }));
            }
            reply.send(written);
        });
    }

    /// A worker planned the evaluation fully.
    pub(super) fn complete_eval(
        &mut self,
        mut eval: Evaluation,
        reply: Reply<Result<(), String>>,
        ctx: &mut Context<Self>,
    ) {
        eval.status = EvalStatus::Complete;
        self.write_status(eval, ctx, move |_master, written| reply.send(written));
    }

    /// Records an evaluation's new status (complete, blocked) in the registry.
    fn write_status(
        &mut self,
        eval: Evaluation,
        ctx: &mut Context<Self>,
        done: impl FnOnce(&mut Master, Result<(), String>) + Send + 'static,
    ) {
        if self.leading_term().is_none() {
            let why = self.not_leading();
            return done(self, Err(why));
        }
        self.write_with_evals(Vec::new(), vec![eval], ctx, move |master, _ctx, written| {
            done(master, written.map(drop).map_err(|e| e.to_string()));
        });
    }

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

    /// One evaluation for every job with a task on any of the agents, and every system job
    /// (with `all_service_jobs`, every service job too): written in the same raft entry as the
    /// agents' move to unreachable. Each names the first of the agents that ran the job (the
    /// first agent, for a system job).
    pub(super) fn evals_for_lost_agents(
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
                .filter(|t| !is_terminal(t))
                .filter_map(task_job)
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

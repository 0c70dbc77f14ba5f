//! Re-registration: rebuilding an agent from what it reports when it comes back (after a
//! failover or a broken link), settling that with what this master knew of it, and the
//! recovery a new leader waits through until every admitted agent is back (its deadline is
//! handled in `internal`).

use std::collections::{BTreeMap, HashMap, HashSet};

use muster_actor::Context;
use muster_model::{
    AgentId, Evaluation, Job, Reconcile, Resources, SchedulerType, Task, TaskState, Trigger,
    UnreachableAgent, utilization,
};
use muster_proto::cluster as pb;
use muster_proto::model as model_pb;
use muster_scheduler::Stop;

use crate::cluster::{AgentEntry, registry_info, state_of};
use crate::master::Master;
use crate::master::agents::lost::{default_disconnect, disconnect_of};
use crate::master::leadership::Role;
use crate::master::registry_writes::now_ms;
use crate::task_record::TaskRecord;

impl Master {
    /// Rebuilds an agent, its tasks and frameworks from its re-registration, then settles what
    /// this master knew of it with what it reports (see `settle_reregistered`). With `away`
    /// (the agent comes back from unreachable, and the registry says what it ran then), each
    /// task it reports is settled by its group's `disconnect` policy (see `settle_returning`):
    /// a task to stop is recorded as being killed and returned, and the agent kills it before
    /// anything else; a copy elsewhere that loses to it is stopped. A healed partition does not
    /// leave a service below its count, nor a slot with two copies.
    pub(in crate::master) fn readmit(
        &mut self,
        request: pb::ReregisterAgent,
        identity: &str,
        away: Option<UnreachableAgent>,
        ctx: &mut Context<Self>,
    ) -> (String, Vec<String>) {
        let pb::ReregisterAgent {
            agent_id,
            info,
            frameworks,
            tasks,
            completed_frameworks,
            completed_tasks,
            tasks_sharing_labels,
            registration,
            version,
        } = request;
        let (mut tasks, mut tasks_sharing_labels) = (tasks, tasks_sharing_labels);
        let mut kill = Vec::new();
        // Copies elsewhere of the slots whose returning task stays: stopped.
        let mut superseded = Vec::new();
        if let Some(away) = &away {
            let total = info
                .as_ref()
                .and_then(|info| info.resources.as_ref())
                .and_then(|r| Resources::try_from(*r).ok())
                .unwrap_or_default();
            let grouped = tasks_sharing_labels
                .iter_mut()
                .flat_map(|group| &mut group.tasks);
            let mut returning: Vec<&mut model_pb::Task> = tasks
                .iter_mut()
                .chain(grouped)
                .filter(|t| !state_of(t).is_terminal())
                .collect();
            let used = returning.iter().fold(Resources::default(), |sum, t| {
                let held = t.resources.and_then(|r| Resources::try_from(r).ok());
                sum.saturating_add(&held.unwrap_or_default())
            });
            let fullness = utilization(&used, &total);
            let (stop, kept) = self.settle_returning(&agent_id, away, &returning, fullness);
            for task in returning
                .iter_mut()
                .filter(|t| stop.contains(t.id.as_str()))
            {
                task.state = TaskState::Killed.into();
                kill.push(task.id.clone());
            }
            superseded = self
                .cluster
                .agents
                .iter()
                .filter(|(id, _)| **id != agent_id)
                .flat_map(|(id, agent)| agent.tasks.iter().map(move |t| (id, t)))
                .filter(|(_, t)| !t.is_terminal() && kept.contains(t.name()))
                .map(|(id, t)| Stop {
                    agent: AgentId(id.clone()),
                    task_id: t.id().to_owned(),
                })
                .collect();
            self.metrics.given_up_killed += kill.len() as u64;
        }
        self.cluster.add_frameworks(&frameworks);
        for framework in completed_frameworks {
            if !self.cluster.frameworks.contains_key(&framework.id) {
                self.cluster.completed_frameworks.insert(framework.id);
            }
        }
        let interner = &mut self.cluster.interner;
        let wire = (tasks, tasks_sharing_labels, completed_tasks, frameworks);
        let grouped: usize = wire.1.iter().map(|group| group.tasks.len()).sum();
        let mut tasks: Vec<TaskRecord> = Vec::with_capacity(wire.0.len() + grouped);
        tasks.extend(wire.0.iter().map(|t| interner.task(t)));
        for group in &wire.1 {
            // Read once for the group's tasks.
            let labels = interner.wire_labels(&group.labels);
            tasks.extend(
                group
                    .tasks
                    .iter()
                    .map(|t| interner.task_sharing(t, &labels)),
            );
        }
        let mut completed_tasks: Vec<TaskRecord> =
            wire.2.iter().map(|t| interner.task(t)).collect();
        // Their strings are freed beside the master, not by it.
        crate::drop_later::drop_later(wire);
        // What it ran when it was marked unreachable and does not report now: remembered as
        // LOST, so that a late start of one is killed when it reports in. The jobs whose slots
        // such a task kept while the agent was away (`disconnect.replace = false`) are
        // evaluated: nothing else places those slots now.
        let mut kept_and_forgotten = Vec::new();
        if let Some(away) = away {
            let reported: HashSet<&str> = tasks
                .iter()
                .chain(&completed_tasks)
                .map(TaskRecord::id)
                .collect();
            let forgotten: Vec<Task> = away
                .tasks
                .into_iter()
                .filter(|t| !reported.contains(t.id.as_str()))
                .collect();
            kept_and_forgotten = self.jobs_with_kept_slots(&forgotten);
            let forgotten: Vec<TaskRecord> = forgotten
                .into_iter()
                .map(|t| {
                    let mut wire = model_pb::Task::from(t);
                    wire.state = TaskState::Lost.into();
                    wire.message = "given up: its agent was unreachable and did not report it \
                                    when it came back"
                        .into();
                    self.cluster.interner.task(&wire)
                })
                .collect();
            completed_tasks.extend(forgotten);
        }
        let mut entry = AgentEntry::connected(
            registry_info(&info.unwrap_or_default(), identity),
            registration,
            tasks,
            completed_tasks,
        );
        entry.version = version;
        let previous = self.cluster.agents.insert(agent_id.clone(), entry);
        // A re-registration counts as a heartbeat, but does not cut short the long first TTL
        // a new leader gave the agent.
        self.heartbeat_received_not_earlier(&agent_id);
        self.metrics.reregistered += 1;
        if let Role::Leading { recovery, .. } = &mut self.role
            && let Some(progress) = recovery
        {
            progress.awaiting.remove(&agent_id);
            if progress.awaiting.is_empty() {
                let took = progress.started.elapsed();
                tracing::info!(
                    agents = progress.admitted,
                    took = ?took,
                    "every admitted agent re-registered; recovery done"
                );
                self.metrics.recovery = Some(took);
                progress.deadline.cancel();
                self.release_placements("every admitted agent is back");
                if let Role::Leading { recovery, .. } = &mut self.role {
                    *recovery = None;
                }
            }
        }
        // Its capacity is news to the blocked-queue: evaluations blocked while it was away
        // (a job submitted during a failover's recovery, say) may fit now.
        self.capacity_joined(&agent_id);
        // The answer names them, but it may be lost on the way (the agent then asks again and
        // hears nothing of them, as they are no longer given up): the kills are also sent,
        // and sent again until each task reports its end.
        for task_id in &kill {
            self.send_kill(agent_id.clone(), task_id.clone(), 0, ctx);
        }
        for stop in superseded {
            tracing::info!(agent = %stop.agent.0, task = %stop.task_id, "another copy of a slot whose original is back and stays: stopped");
            self.stop_task(&stop, ctx);
        }
        if let Some(previous) = previous {
            self.settle_reregistered(&agent_id, previous, ctx);
        }
        self.record_reported_batch_finishes(&agent_id, ctx);
        if !kept_and_forgotten.is_empty() {
            let evals = kept_and_forgotten
                .iter()
                .map(|job| Evaluation::new(job, Trigger::AgentUpdate(AgentId(agent_id.clone()))))
                .collect();
            self.write_with_evals(Vec::new(), evals, ctx, |_master, _ctx, written| {
                if let Err(error) = written {
                    tracing::warn!(%error, "could not evaluate the jobs of tasks a returning agent forgot");
                }
            });
        }
        (agent_id, kill)
    }

    /// The jobs (each once) with a slot among `forgotten` that its group kept while the
    /// agent was away (`disconnect.replace = false`) and that the job still wants.
    fn jobs_with_kept_slots(&self, forgotten: &[Task]) -> Vec<Job> {
        self.registry.reader().read(|state| {
            let mut jobs: BTreeMap<&str, &Job> = BTreeMap::new();
            for task in forgotten {
                let Some(job) = state.jobs.get(&task.job) else {
                    continue;
                };
                let kept = disconnect_of(state, &task.job, &task.group)
                    .is_some_and(|policy| !policy.replace);
                if kept && muster_scheduler::wants_counted_slot(job, &task.group, &task.name) {
                    jobs.insert(&job.name, job);
                }
            }
            jobs.into_values().cloned().collect()
        })
    }

    /// The batch tasks a re-registering agent reports finished whose slots the registry does
    /// not record yet (their finish reached a leader that is gone, or none at all): recorded
    /// now, one write per job, so no later leader runs them again.
    fn record_reported_batch_finishes(&mut self, agent_id: &str, ctx: &mut Context<Self>) {
        let Some(agent) = self.cluster.agents.get(agent_id) else {
            return;
        };
        let by_job: BTreeMap<String, Vec<(String, u64)>> = self.registry.reader().read(|state| {
            let mut by_job: BTreeMap<String, Vec<(String, u64)>> = BTreeMap::new();
            for task in agent
                .completed_tasks
                .iter()
                .filter(|t| t.state() == TaskState::Finished)
            {
                let Some(job) = task.job_name() else {
                    continue;
                };
                let batch = state
                    .jobs
                    .get(job)
                    .is_some_and(|j| j.scheduler == SchedulerType::Batch);
                let recorded = state
                    .batch_finished
                    .get(job)
                    .and_then(|slots| slots.get(task.name()))
                    .is_some_and(|version| *version >= task.view.job_version);
                if batch && !recorded {
                    by_job
                        .entry(job.to_owned())
                        .or_default()
                        .push((task.name().to_owned(), task.view.job_version));
                }
            }
            by_job
        });
        for (job, slots) in by_job {
            self.write_batch_finishes(job, slots, ctx);
        }
    }

    /// Which of the tasks an agent back from unreachable reports (`returning`, on an agent
    /// `fullness` full) are stopped, and the slots whose returning task stays (their copies
    /// elsewhere are stopped), by each task's group's `disconnect` policy:
    /// - lost for good (`lost_after` passed since the agent was marked): stopped;
    /// - its slot's work done elsewhere (a batch replacement finished): stopped;
    /// - a replacement runs: the one `reconcile` names stays (`best_score`: the copy on the
    ///   fuller agent, the original on a tie; `longest_running`: the original if it was
    ///   running when its agent was lost);
    /// - otherwise (nothing replaced it, or its replacement has not started): it stays.
    fn settle_returning(
        &self,
        agent_id: &str,
        away: &UnreachableAgent,
        returning: &[&mut model_pb::Task],
        fullness: f64,
    ) -> (HashSet<String>, HashSet<String>) {
        // The slots a replacement runs in, with the fullest agent running one; and those a
        // replacement finished.
        let mut running: HashMap<&str, f64> = HashMap::new();
        let mut finished: HashSet<&str> = HashSet::new();
        let others = self.cluster.agents.iter().filter(|(id, _)| *id != agent_id);
        for agent in others.map(|(_, agent)| agent) {
            let agent_fullness = utilization(
                &agent.info.resources.saturating_sub(&agent.free()),
                &agent.info.resources,
            );
            for task in &agent.tasks {
                if task.state() == TaskState::Running {
                    let best = running.entry(task.name()).or_insert(agent_fullness);
                    *best = best.max(agent_fullness);
                }
            }
            for task in &agent.completed_tasks {
                if task.state() == TaskState::Finished {
                    finished.insert(task.name());
                }
            }
        }
        let was_running: HashSet<&str> = away
            .tasks
            .iter()
            .filter(|t| t.state == TaskState::Running)
            .map(|t| t.id.as_str())
            .collect();
        let now = now_ms();
        let mut stop = HashSet::new();
        let mut kept = HashSet::new();
        self.registry.reader().read(|state| {
            for task in returning {
                let policy = disconnect_of(state, &task.job, &task.group)
                    .unwrap_or_else(default_disconnect);
                let batch = state
                    .jobs
                    .get(&task.job)
                    .is_some_and(|j| j.scheduler == SchedulerType::Batch);
                let stays = if policy.lost_for_good(away.marked_at_ms, now) {
                    tracing::warn!(agent = %agent_id, task = %task.id, "the agent comes back with a task lost for good (disconnect.lost_after passed): it is stopped");
                    false
                } else if batch && finished.contains(task.name.as_str()) {
                    tracing::warn!(agent = %agent_id, task = %task.id, "the agent comes back with a batch task whose replacement finished: it is stopped");
                    false
                } else if let Some(&best) = running.get(task.name.as_str()) {
                    let original = match policy.reconcile {
                        Reconcile::KeepOriginal => true,
                        Reconcile::KeepReplacement => false,
                        Reconcile::LongestRunning => was_running.contains(task.id.as_str()),
                        Reconcile::BestScore => fullness >= best,
                    };
                    tracing::info!(agent = %agent_id, task = %task.id, reconcile = policy.reconcile.name(), original, "the agent comes back with a task that was replaced: one copy stays");
                    original
                } else {
                    tracing::info!(agent = %agent_id, task = %task.id, "the agent comes back with a task nothing replaced: kept");
                    true
                };
                if stays {
                    kept.insert(task.name.clone());
                } else {
                    stop.insert(task.id.clone());
                }
            }
        });
        (stop, kept)
    }

    /// An agent re-registered with what it runs; `previous` is what this master had for it.
    /// - A task the master had running there that the agent ended while away (it is in the
    ///   agent's completed tasks) is updated as ended: its job may get a replacement.
    /// - One the agent does not report at all (its launch was lost on the way, or the agent
    ///   lost its state) is LOST, and its job gets an evaluation to replace it.
    /// - One the agent runs that this master gave up on (marked LOST and replaced), or was
    ///   killing, is killed (again), so its slot does not end up with two tasks.
    pub(in crate::master) fn settle_reregistered(
        &mut self,
        agent_id: &str,
        previous: AgentEntry,
        ctx: &mut Context<Self>,
    ) {
        self.publish_agent(agent_id, "agent-reregistered");
        let Some(agent) = self.cluster.agents.get(agent_id) else {
            return;
        };
        // Given up as lost (and replaced), or being killed: neither may run on.
        let given_up: HashSet<&str> = previous
            .completed_tasks
            .iter()
            .filter(|t| t.state() == TaskState::Lost)
            .chain(
                previous
                    .tasks
                    .iter()
                    .filter(|t| t.state() == TaskState::Killed),
            )
            .map(TaskRecord::id)
            .collect();
        let to_kill: Vec<Stop> = agent
            .tasks
            .iter()
            .filter(|t| given_up.contains(t.id()))
            .map(|t| Stop {
                agent: AgentId(agent_id.to_owned()),
                task_id: t.id().to_owned(),
            })
            .collect();
        let mut ended_away = Vec::new();
        let mut lost = Vec::new();
        for known in previous.tasks.into_iter().filter(|t| !t.is_terminal()) {
            if agent.tasks.iter().any(|t| t.id() == known.id()) {
                continue;
            }
            match agent.completed_tasks.iter().find(|t| t.id() == known.id()) {
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
                agent.completed_tasks.retain(|t| t.id() != ended.id());
                agent.tasks.push(known);
            }
            self.record_updated(agent_id.to_owned(), ended, ctx);
        }
        for mut task in lost {
            tracing::warn!(agent = %agent_id, task = %task.id(), "the re-registered agent does not know a task launched on it");
            if let Some(agent) = self.cluster.agent_mut(agent_id) {
                agent.tasks.push(task.clone());
            }
            task.set_state(TaskState::Lost);
            task.message = "the agent did not report it when it re-registered".into();
            self.record_updated(agent_id.to_owned(), task, ctx);
        }
    }
}

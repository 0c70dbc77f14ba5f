//! The plan applier: scheduler workers (in this process or through the scheduling API) ask
//! for snapshots of the cluster and submit plans; what they report of evaluations is in
//! `evaluations.rs`.
//!
//! Schedulers plan optimistically and concurrently against a [`ClusterSnapshot`]; the master
//! applies their plans one at a time (it is one process), checking each placement against the
//! agents as they are now: what fits is committed and launched, what no longer fits goes back
//! rejected so the scheduler can refresh and try again (Nomad's plan applier). So does what
//! would take the job's namespace over its quota, counted here against the tasks the master
//! knows (`quota_usage`), whatever the scheduler counted: a custom scheduler may ignore quotas.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use muster_actor::{Context, Pid, Reply};
use muster_broker::EvalBroker;
use muster_broker::blocked::BlockedEvals;
use muster_model::{
    AgentId, DrainPhase, Quota, QuotaUsage, Resources, TaskGroup, TaskState, namespace_of,
    task_namespace,
};
use muster_proto::cluster as pb;

use muster_scheduler::replica::{JobVersions, same_job_versions};
use muster_scheduler::{
    AgentView, ClusterSnapshot, JobGroup, JobIndex, Placement, Plan, PlanResult, Preemption, Stop,
    TaskView,
};

use super::Master;
use super::tasks::CheckLaunches;
use super::{answered_request, notice};
use crate::cluster::Cluster;
use crate::error::ServiceError;
use crate::launch_wire::{GroupWire, LAUNCH_MESSAGE_BUDGET, LaunchFence, LaunchWire, RunWire};
use crate::metrics::instruments::MasterInstruments;
use crate::task_record::{LaunchDeadline, TaskDetail, TaskInterner, TaskRecord};

/// The master's eval broker and blocked-queue, for the scheduler workers beside it.
#[derive(Debug)]
pub struct GetSchedulingPids {
    /// The pids.
    pub reply: Reply<SchedulingPids>,
}

/// The cluster as schedulers see it.
#[derive(Debug)]
pub struct GetSnapshot {
    /// The snapshot.
    pub reply: Reply<ClusterSnapshot>,
}

/// The cluster as schedulers see it, for a watch that has the jobs as of registry index
/// `jobs_seen_at` already: they are left out if no registry write was applied since, or if
/// every job is at the version (and stopped or not) `jobs_seen` says.
#[derive(Debug)]
pub struct WatchSnapshot {
    /// The registry index the caller's jobs are as of, if it has any.
    pub jobs_seen_at: Option<u64>,
    /// The caller's jobs, by name: their versions and whether they were stopped.
    pub jobs_seen: Option<Arc<JobVersions>>,
    /// The snapshot.
    pub reply: Reply<WatchedSnapshot>,
}

/// A snapshot for a watch.
#[derive(Debug)]
pub struct WatchedSnapshot {
    /// The snapshot; its jobs are empty when `jobs_unchanged`.
    pub snapshot: ClusterSnapshot,
    /// The registry index its jobs are as of (they may be newer).
    pub jobs_at: u64,
    /// The jobs are those the caller has: none were read.
    pub jobs_unchanged: bool,
}

/// Follow the master's changes: a watch of [`ClusterPulse`], for a feed of snapshots to
/// remote schedulers (`Scheduling/WatchCluster`).
#[derive(Debug)]
pub struct WatchChanges {
    /// The watch.
    pub reply: Reply<tokio::sync::watch::Receiver<ClusterPulse>>,
}

/// What a watcher of the master's state needs to know to take the next snapshot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClusterPulse {
    /// Counts the requests, timers and continuations handled, but for reads (snapshots,
    /// state, metrics): a snapshot
    /// taken after this moves may differ from one taken before.
    pub changes: u64,
    /// Whether this master leads (caught up with the registry or not).
    pub leading: bool,
    /// The master's state index: a snapshot taken after this pulse is at least this new,
    /// and holds every registry write this master has seen applied.
    pub index: u64,
    /// Whether this master leads and schedules: caught up, and not holding placements back
    /// while the agents of a failover re-register.
    pub scheduling: bool,
}

/// Apply a scheduler's plan: stops, then each placement that still fits.
#[derive(Debug)]
pub struct SubmitPlan {
    /// The plan.
    pub plan: Plan,
    /// What was committed, and what no longer fit.
    pub reply: Reply<Result<PlanResult, ServiceError>>,
}

notice!(GetSchedulingPids, GetSnapshot, WatchChanges, WatchSnapshot);
answered_request!(SubmitPlan);

/// The processes beside the master that hold its scheduling state.
#[derive(Clone, Debug)]
pub struct SchedulingPids {
    /// The eval broker.
    pub broker: Pid<EvalBroker>,
    /// The blocked-queue.
    pub blocked: Pid<BlockedEvals>,
    /// The master's instruments, for workers to observe their runs in.
    pub instruments: Arc<MasterInstruments>,
}

/// The most tasks a plan may preempt per placement it makes.
const MAX_VICTIMS_PER_PLACEMENT: usize = 64;

impl Master {
    /// [`GetSchedulingPids`].
    pub(super) fn get_scheduling_pids(
        &mut self,
        GetSchedulingPids { reply }: GetSchedulingPids,
        _ctx: &mut Context<Self>,
    ) {
        reply.send(SchedulingPids {
            broker: self.broker.clone(),
            blocked: self.blocked.clone(),
            instruments: Arc::clone(&self.instruments),
        });
    }

    /// [`GetSnapshot`].
    pub(super) fn get_snapshot(
        &mut self,
        GetSnapshot { reply }: GetSnapshot,
        _ctx: &mut Context<Self>,
    ) {
        // Taking a snapshot changes nothing a watcher follows.
        self.quiet = true;
        reply.send(self.snapshot(true));
    }

    /// [`WatchSnapshot`].
    pub(super) fn watch_snapshot(
        &mut self,
        WatchSnapshot {
            jobs_seen_at,
            jobs_seen,
            reply,
        }: WatchSnapshot,
        _ctx: &mut Context<Self>,
    ) {
        self.quiet = true;
        // Read before the jobs: they are at least this new, and unchanged while the registry
        // applies nothing after it. Most writes (evaluations, agents) change no job: comparing
        // versions is cheaper than copying every job for the watch to compare.
        let jobs_at = self.registry.reader().applied_index();
        let jobs_unchanged = jobs_seen_at == Some(jobs_at)
            || jobs_seen.is_some_and(|seen| {
                self.registry
                    .reader()
                    .read(|state| same_job_versions(&seen, &state.jobs))
            });
        reply.send(WatchedSnapshot {
            // A watch sends views, not the schedulers' index of jobs by agent.
            snapshot: self.cluster_snapshot(!jobs_unchanged, false),
            jobs_at,
            jobs_unchanged,
        });
    }

    /// [`WatchChanges`].
    pub(super) fn watch_changes(
        &mut self,
        WatchChanges { reply }: WatchChanges,
        _ctx: &mut Context<Self>,
    ) {
        self.quiet = true;
        reply.send(self.pulse.subscribe());
    }

    /// [`SubmitPlan`]: applied only by a master a quorum still follows (a leader paused and
    /// resumed must not launch or kill on its stale view).
    pub(super) fn submit_plan(
        &mut self,
        SubmitPlan { plan, reply }: SubmitPlan,
        ctx: &mut Context<Self>,
    ) {
        let arrived = std::time::Instant::now();
        self.with_quorum_leadership(ctx, move |master, ctx, confirmed| match confirmed {
            Ok(()) => master.apply_plan(plan, arrived, reply, ctx),
            Err(refusal) => reply.send(Err(refusal)),
        });
    }

    /// The cluster as schedulers see it: connected agents with their tasks, the jobs (unless
    /// not `with_jobs`), and the namespaces' quotas. Agents whose tasks did not change since the last snapshot share
    /// their views with it.
    pub(super) fn snapshot(&mut self, with_jobs: bool) -> ClusterSnapshot {
        self.cluster_snapshot(with_jobs, true)
    }

    /// [`snapshot`](Self::snapshot), with the [`JobIndex`] (by agent, for the in-master
    /// schedulers) only if `with_job_index`.
    fn cluster_snapshot(&mut self, with_jobs: bool, with_job_index: bool) -> ClusterSnapshot {
        let (jobs, quotas, deployments) = self.registry.reader().read(|state| {
            (
                if with_jobs {
                    state.jobs.clone()
                } else {
                    std::collections::BTreeMap::new()
                },
                limited_quotas(&state.namespaces),
                current_deployments(state),
            )
        });
        let scheduling = self.agent_scheduling();
        let agents: Vec<Arc<AgentView>> = self
            .cluster
            .agents
            .iter_mut()
            .filter(|(_, agent)| agent.connected)
            .map(|(id, agent)| {
                let (eligible, drain) = scheduling
                    .get(id)
                    .map_or((true, DrainPhase::None), |s| (s.eligible, s.phase()));
                // A view of an older scheduling (a restored registry) is rebuilt.
                if agent
                    .view
                    .as_ref()
                    .is_some_and(|view| (view.eligible, view.drain) != (eligible, drain))
                {
                    agent.view = None;
                }
                let view = agent.view.get_or_insert_with(|| {
                    let mut built = AgentView::new(
                        AgentId(id.clone()),
                        agent.info.attributes.clone(),
                        agent.info.resources.clone(),
                        agent
                            .tasks
                            .iter()
                            .chain(agent.completed_tasks.iter().rev().take(100))
                            .map(|task| Arc::clone(&task.view)),
                    );
                    built.eligible = eligible;
                    built.drain = drain;
                    built.dynamic_ports = agent.info.dynamic_ports;
                    Arc::new(built)
                });
                Arc::clone(view)
            })
            .collect();
        debug_assert!(agents.is_sorted_by(|a, b| a.id < b.id));
        let job_index = with_job_index.then(|| {
            let job_index = JobIndex::update(self.job_index.as_ref(), &agents);
            self.job_index = Some(Arc::clone(&job_index));
            job_index
        });
        ClusterSnapshot {
            index: self.current_index(),
            agents,
            jobs,
            held: {
                let mut held = self.crash_loops.held(tokio::time::Instant::now());
                held.extend(self.slots_kept_while_away());
                held.extend(self.batch_slots_finished());
                held.extend(self.batch_slots_stopping());
                held
            },
            job_index,
            quotas,
            deployments,
            preemption: self.config.preemption,
        }
    }

    /// Applies one plan, which `arrived` then: stops first, then each placement that still
    /// fits.
    fn apply_plan(
        &mut self,
        plan: Plan,
        arrived: std::time::Instant,
        reply: Reply<Result<PlanResult, ServiceError>>,
        ctx: &mut Context<Self>,
    ) {
        if self.leading_term().is_none() {
            return reply.send(Err(self.not_leading()));
        }
        // What a task runs comes from the stored job, never from the plan.
        let namespace = namespace_of(&plan.job);
        let (job, quota) = self.registry.reader().read(|s| {
            let quota = s.namespaces.get(namespace).map(|ns| ns.quota.clone());
            (s.jobs.get(&plan.job).cloned(), quota)
        });
        if let Err(refusal) = self.plan_in_bounds(&plan) {
            return reply.send(Err(refusal));
        }
        let mut result = PlanResult {
            committed: Vec::with_capacity(plan.place.len()),
            ..PlanResult::default()
        };
        // The tasks of lower-priority jobs it may preempt: their room counts as free where it
        // places, and they stop only where a placement is committed.
        let victims = self.victims(&plan, job.as_ref());
        for stop in plan.stop {
            if self.stop_task(&stop, ctx) {
                result.stopped.push(stop);
            }
        }
        // The namespace's live tasks, less those this plan stops, then each placement
        // committed: a placement past the quota is rejected.
        let mut quota = quota
            .filter(|quota| !plan.place.is_empty() && !quota.is_unlimited())
            .map(|quota| self.quota_usage(namespace, quota, &result.stopped));
        // A plan made before an agent was drained or made ineligible places nothing there.
        let scheduling = self.agent_scheduling();
        // Per agent the plan places on: what is free there (worked out once, then reduced by
        // each placement committed there), and its one launch message for the whole plan.
        let mut per_agent: HashMap<String, AgentLaunch> = HashMap::new();
        let mut shared = HashMap::new();
        // Without a node (in-process benches) nothing is sent: the tasks stay staged.
        let launch_deadline = self.node.is_some().then(|| {
            let now = tokio::time::Instant::now();
            let counted_lost_after = self.config.launch_timeout + LAUNCH_CLOCK_MARGIN;
            LaunchDeadline::after(self.launch_clock, now, counted_lost_after)
        });
        let Cluster {
            agents,
            frameworks,
            interner,
            ..
        } = &mut self.cluster;
        // The placements that fit, with their tasks: committed below, all of them or (for an
        // atomic plan with one refused) none.
        let mut accepted = Vec::with_capacity(plan.place.len());
        for placement in plan.place {
            // Of the job as it is now: a group it still has, at its current version (a plan
            // made before an update, or a stop, is rejected and planned again).
            let Some(group) = job
                .as_ref()
                .filter(|job| !job.stopped && job.version == placement.job_version)
                .and_then(|job| job.groups.iter().find(|g| g.name == placement.group))
            else {
                result.rejected.push(placement);
                continue;
            };
            if let Some(over) = quota.as_ref().and_then(|q| q.refusal(&group.resources)) {
                result.over_quota.insert(placement.task_id.clone(), over);
                result.rejected.push(placement);
                continue;
            }
            let eligible = scheduling
                .get(&placement.agent.0)
                .is_none_or(|s| s.eligible);
            let agent = agents
                .get_mut(&placement.agent.0)
                .filter(|agent| agent.connected);
            let launch = match per_agent.get_mut(&placement.agent.0) {
                Some(launch) => launch,
                None => per_agent
                    .entry(placement.agent.0.clone())
                    .or_insert_with(|| AgentLaunch {
                        free: agent.as_ref().map(|agent| {
                            victims
                                .iter()
                                .filter(|(victim, _)| victim.agent == placement.agent)
                                .fold(agent.free(), |free, (_, held)| free.saturating_add(held))
                        }),
                        ports: None,
                        runs: Vec::with_capacity(1),
                    }),
            };
            // The model's one fit rule, as the schedulers and the blocked-queue use it.
            let fits = launch
                .free
                .as_ref()
                .is_some_and(|left| eligible && group.resources.fits_in(left));
            let (Some(agent), true) = (agent, fits) else {
                result.rejected.push(placement);
                continue;
            };
            // No two live tasks on one agent with one port, whatever the scheduler did.
            if !(group.ports.is_empty() && placement.ports.is_empty()) {
                let taken = launch.ports.get_or_insert_with(|| agent.ports_in_use());
                if !ports_right(group, &placement, agent.info.dynamic_ports, taken) {
                    result.rejected.push(placement);
                    continue;
                }
                taken.extend(placement.ports.iter().map(|p| p.port));
            }
            if let Some(left) = &mut launch.free {
                *left = left.saturating_sub(&group.resources);
            }
            if let Some(usage) = &mut quota {
                usage.add(&group.resources);
            }
            let resources = group.resources.clone();
            let group = GroupShared::of(&plan.job, group, &mut shared, interner, frameworks);
            let task = TaskRecord {
                view: Arc::new(
                    TaskView::new(
                        &placement.task_id,
                        &placement.name,
                        group.job_group,
                        resources,
                        TaskState::Staging,
                        placement.job_version,
                    )
                    .with_ports(placement.ports.iter().map(|p| p.port).collect::<Vec<_>>()),
                ),
                detail: group.detail,
                exit_code: 0,
                launch_deadline,
                message: Box::default(),
            };
            accepted.push((placement, task, group.wire));
        }
        // An atomic plan with any placement refused commits none of them.
        if plan.atomic && !result.rejected.is_empty() {
            result
                .rejected
                .extend(accepted.drain(..).map(|(placement, _, _)| placement));
        }
        // The victims on agents that take placements stop first; the others keep running.
        let placing: HashSet<&AgentId> = accepted.iter().map(|(p, _, _)| &p.agent).collect();
        let victims: Vec<Preemption> = victims
            .into_iter()
            .filter(|(victim, _)| placing.contains(&victim.agent))
            .map(|(victim, _)| victim)
            .collect();
        result.preempted = self.stop_victims(victims, job.as_ref(), ctx);
        let agents = &mut self.cluster.agents;
        for (placement, task, wire) in accepted {
            let (Some(agent), Some(launch)) = (
                agents.get_mut(&placement.agent.0),
                per_agent.get_mut(&placement.agent.0),
            ) else {
                result.rejected.push(placement);
                continue;
            };
            launch.runs.push(RunWire {
                task: task.clone(),
                group: wire,
            });
            agent.add_task(task);
            result.committed.push(placement);
        }
        for (agent_id, launch) in per_agent {
            if !launch.runs.is_empty() {
                self.send_launch(agent_id, launch.runs, ctx);
            }
        }
        result.index = if !result.committed.is_empty()
            || !result.stopped.is_empty()
            || !result.preempted.is_empty()
        {
            self.next_index()
        } else {
            self.current_index()
        };
        self.metrics.plans += 1;
        self.instruments.plan_applied(
            arrived.elapsed(),
            result.committed.len(),
            result.rejected.len(),
        );
        reply.send(Ok(result));
    }

    /// What `namespace`'s live tasks hold, counted against `quota`, as this master knows
    /// them: on every agent it holds (one marked unreachable is not held: its tasks count no
    /// more, so that their replacements may be placed), staging ones and this plan's earlier
    /// placements included, this plan's stops (`stopped`, killed as they were applied) not.
    fn quota_usage(&self, namespace: &str, quota: Quota, stopped: &[Stop]) -> QuotaUsage {
        let stopped: HashSet<&str> = stopped.iter().map(|s| s.task_id.as_str()).collect();
        let mut usage = QuotaUsage::new(namespace, quota);
        let tasks = self.cluster.agents.values().flat_map(|agent| &agent.tasks);
        for task in tasks {
            if !task.is_terminal()
                && task_namespace(task.job(), task.name()) == namespace
                && !stopped.contains(task.id())
            {
                usage.add(task.resources());
            }
        }
        usage
    }

    /// Whether `plan` keeps to its own job: it places only that job's tasks and stops only
    /// that job's tasks (a stop of a task this master does not know is left to `stop_task`,
    /// which does nothing). A scheduler answers one evaluation of one job; a plan that
    /// reaches past it is refused whole, whoever sent it.
    fn plan_in_bounds(&self, plan: &Plan) -> Result<(), ServiceError> {
        // A victim makes room for a placement on its agent: never more victims than that.
        if plan.preempt.len() > plan.place.len().saturating_mul(MAX_VICTIMS_PER_PLACEMENT) {
            return Err(ServiceError::InvalidArgument {
                field: "preempt".into(),
                message: format!(
                    "preempt: {} tasks for {} placements; a plan preempts at most \
                     {MAX_VICTIMS_PER_PLACEMENT} tasks per placement",
                    plan.preempt.len(),
                    plan.place.len()
                ),
            });
        }
        if let Some((i, placement)) = plan
            .place
            .iter()
            .enumerate()
            .find(|(_, placement)| placement.job != plan.job)
        {
            return Err(ServiceError::InvalidArgument {
                field: format!("place[{i}].job"),
                message: format!(
                    "place[{i}].job: a plan for job {:?} places a task of job {:?}; a plan \
                     places only its own job's tasks",
                    plan.job, placement.job
                ),
            });
        }
        // A task's name and id begin with its job's id, which carries its namespace: what
        // reads, logs and the event stream decide visibility by.
        let prefix = format!("{}.", plan.job);
        if let Some((i, placement)) = plan.place.iter().enumerate().find(|(_, placement)| {
            !placement.name.starts_with(&prefix) || !placement.task_id.starts_with(&placement.name)
        }) {
            return Err(ServiceError::InvalidArgument {
                field: format!("place[{i}].task_id"),
                message: format!(
                    "place[{i}]: task {:?} in slot {:?} is not named for job {:?} (a slot is \
                     `{prefix}GROUP[INDEX]`, a task id the slot and a suffix)",
                    placement.task_id, placement.name, plan.job
                ),
            });
        }
        for (i, stop) in plan.stop.iter().enumerate() {
            let owner = self
                .cluster
                .agents
                .get(&stop.agent.0)
                .and_then(|agent| agent.tasks.iter().find(|t| t.id() == stop.task_id))
                .map(|task| task.job_name().unwrap_or_default());
            if let Some(owner) = owner.filter(|owner| *owner != plan.job) {
                return Err(ServiceError::InvalidArgument {
                    field: format!("stop[{i}]"),
                    message: format!(
                        "stop[{i}]: task {:?} belongs to job {owner:?}, not to the plan's job \
                         {:?}; a plan stops only its own job's tasks",
                        stop.task_id, plan.job
                    ),
                });
            }
        }
        Ok(())
    }

    /// Tells an agent to run `tasks` (one message per [`LAUNCH_MESSAGE_BUDGET`] bytes of them,
    /// no answer: each task's start or failure comes back as a status update), and makes sure
    /// a check of its launches is coming: one timer per agent with launches waiting, not one
    /// per launch. Tasks that cannot even be sent fail now.
    fn send_launch(&mut self, agent_id: String, runs: Vec<RunWire>, ctx: &mut Context<Self>) {
        let (Some(node), Some(agent)) = (&self.node, self.cluster.agents.get_mut(&agent_id)) else {
            return;
        };
        if !agent.launch_check_due {
            agent.launch_check_due = true;
            let check = CheckLaunches {
                agent_id: agent_id.clone(),
            };
            ctx.delay(self.config.launch_timeout, check.into());
        }
        // They are the agent's last tasks: the plan just added them, in order.
        let first = agent.tasks.len().saturating_sub(runs.len());
        let fence = LaunchFence {
            registration: agent.registration,
            deadline_unix_ms: unix_ms_after(self.config.launch_timeout),
        };
        // The link drops a launch it could not write by the deadline, or queued for a
        // connection that broke: it is not carried to a later one (the agent would refuse it
        // by its fence anyway, but after the master may have counted it lost).
        let deadline = tokio::time::Instant::now() + self.config.launch_timeout;
        let Some(remote) = agent.remote(node).cloned() else {
            // No way to reach it (in-process benches): the tasks stay staged.
            return;
        };
        let mut sent = 0;
        let mut failed: Vec<(TaskRecord, String)> = Vec::new();
        for launch in LaunchWire::packed(runs, self.term, fence, LAUNCH_MESSAGE_BUDGET) {
            let count = launch.runs.len();
            if let Err(e) = remote.tell_until(launch, deadline) {
                tracing::warn!(agent = %agent_id, error = %e, tasks = count, "launch failed");
                let staged = agent.tasks.iter().skip(first + sent).take(count);
                failed.extend(staged.map(|record| (record.clone(), e.to_string())));
            }
            sent += count;
        }
        for (mut record, error) in failed {
            record.set_state(TaskState::Failed);
            record.exit_code = -1;
            record.message = format!("could not send the launch to the agent: {error}").into();
            self.record_updated(agent_id.clone(), record, ctx);
        }
    }
}

/// The quotas of `namespaces` that set a limit, by namespace: what schedulers count against.
fn limited_quotas(
    namespaces: &BTreeMap<String, muster_model::Namespace>,
) -> BTreeMap<String, Quota> {
    namespaces
        .iter()
        .filter(|(_, ns)| !ns.quota.is_unlimited())
        .map(|(name, ns)| (name.clone(), ns.quota.clone()))
        .collect()
}

/// What the tasks one plan places of one group share: interned once per plan.
#[derive(Clone, Debug)]
struct GroupShared {
    job_group: Arc<JobGroup>,
    detail: Arc<TaskDetail>,
    /// Their launches' shared fields, encoded.
    wire: Arc<GroupWire>,
}

/// What one agent gets from a plan: what is free there as placements are committed (`None`
/// for an agent that is gone or not connected), and the tasks to launch.
struct AgentLaunch {
    free: Option<Resources>,
    /// The ports its live tasks and this plan's placements hold, worked out when the first
    /// placement with ports comes.
    ports: Option<BTreeSet<u16>>,
    runs: Vec<RunWire>,
}

/// Whether `placement` holds the ports its group asks for, in order (each static one as
/// asked, each dynamic one from the agent's range `range`), none of them in `taken`.
fn ports_right(
    group: &TaskGroup,
    placement: &Placement,
    range: muster_model::PortRange,
    taken: &BTreeSet<u16>,
) -> bool {
    let mut seen = BTreeSet::new();
    group.ports.len() == placement.ports.len()
        && group
            .ports
            .iter()
            .zip(&placement.ports)
            .all(|(asked, given)| {
                asked.label == given.label
                    && match asked.static_port {
                        0 => range.contains(given.port),
                        port => given.port == port,
                    }
                    && !taken.contains(&given.port)
                    && seen.insert(given.port)
            })
}

impl GroupShared {
    /// What `group` of `job` shares, interned once per plan and group (kept in `shared`);
    /// the job becomes a known framework.
    fn of(
        job: &str,
        group: &TaskGroup,
        shared: &mut HashMap<String, GroupShared>,
        interner: &mut TaskInterner,
        frameworks: &mut HashMap<String, pb::Framework>,
    ) -> GroupShared {
        if let Some(known) = shared.get(&group.name) {
            return known.clone();
        }
        if !frameworks.contains_key(job) {
            frameworks.insert(
                job.to_owned(),
                pb::Framework {
                    id: job.to_owned(),
                    name: job.to_owned(),
                },
            );
        }
        // A BTreeMap's pairs come sorted.
        let env: Vec<(String, String)> = group
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let no_labels = interner.labels(&[]);
        let job_group = interner.job_group(job, &group.name);
        let detail = interner.detail(TaskDetail {
            framework_id: job.to_owned(),
            command: group.command.clone(),
            args: group.args.clone(),
            env,
            user: group.user.clone(),
            labels: no_labels,
            port_labels: group.ports.iter().map(|p| p.label.clone()).collect(),
        });
        let wire = GroupShared {
            wire: Arc::new(GroupWire::new(
                &job_group,
                &detail,
                muster_model::convert::task_lifecycle(group),
            )),
            job_group,
            detail,
        };
        shared.insert(group.name.clone(), wire.clone());
        wire
    }
}

/// The newest deployment of each job, if it deploys the job's current version: what
/// schedulers roll its groups by.
fn current_deployments(
    state: &muster_registry::RegistryState,
) -> std::collections::BTreeMap<String, muster_model::Deployment> {
    state
        .deployments
        .iter()
        .filter_map(|(job, kept)| {
            let newest = kept.back()?;
            let current = state.jobs.get(job)?.version == newest.job_version;
            current.then(|| (job.clone(), newest.clone()))
        })
        .collect()
}

/// How much later than a launch's deadline (on the agent's clock) the master counts a task
/// whose start it has not heard of lost: the agent refuses the launch after the deadline, so
/// the task cannot start after it is counted lost and replaced, as long as the two clocks
/// agree within this margin (as NTP keeps them).
pub(crate) const LAUNCH_CLOCK_MARGIN: std::time::Duration = std::time::Duration::from_secs(5);

/// Milliseconds since the Unix epoch, `after` from now: a launch's deadline on the agent's
/// clock (see [`LaunchFence`]).
fn unix_ms_after(after: std::time::Duration) -> u64 {
    let after = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
    muster_model::clock::unix_ms().saturating_add(after)
}

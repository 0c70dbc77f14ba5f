//! Tasks: the states agents report (ended tasks to the history, their capacity and their
//! namespace's quota to the blocked-queue, a replacement evaluation with crash-loop back-off,
//! `tasks/crash_loops.rs`), killing tasks, launch deadlines, operators' manual launches, and
//! task output.

use std::time::Duration;

use muster_actor::{Context, Reply, Upid};
use muster_broker::blocked::{BlockedMsg, CapacityChange};
use muster_model::{AgentId, Evaluation, SchedulerType, TaskState, Trigger, task_namespace};
use muster_proto::cluster as pb;
use muster_proto::model::{self as model_pb, Task};
use muster_registry::Op;
use muster_scheduler::Stop;
use muster_security::Peer;
use muster_transport::RemotePid;
use tokio::time::Instant;

pub(super) mod crash_loops;

use crash_loops::Reschedule;

use super::agents::identity;
use super::registry_writes::now_ms;
use super::{Master, Request, answered_request, notice};
use crate::error::ServiceError;
use crate::task_record::TaskRecord;

/// An agent reports a task's state (`TaskStatusUpdate`).
#[derive(Debug)]
pub struct TaskStatus {
    /// The agent and the task as it is now.
    pub update: pb::TaskStatusUpdate,
    /// The sender's verified certificate (`None` from this process or on an insecure cluster).
    pub sender: Option<Peer>,
}

/// An operator launches a task by hand, on the agent it names.
#[derive(Debug)]
pub struct LaunchTask {
    /// The agent, the framework and the task.
    pub request: Box<pb::LaunchTaskRequest>,
    /// Done once sent.
    pub reply: Reply<Result<(), ServiceError>>,
}

/// A piece of a task's stdout or stderr, read from its agent.
#[derive(Debug)]
pub struct TaskLogs {
    /// The task, the stream, where to read.
    pub request: pb::ReadTaskOutput,
    /// The piece.
    pub reply: Reply<Result<pb::TaskOutputChunk, ServiceError>>,
}

/// The way to an agent's actor (`muster monitor --agent`), with how long it may take to
/// answer a ping.
#[derive(Debug)]
pub struct AgentLink {
    /// The agent.
    pub agent_id: String,
    /// Its actor and the ping timeout, or why it cannot be reached.
    pub reply: Reply<Result<(RemotePid, Duration), ServiceError>>,
}

/// The master's timer: the launches on an agent still STAGING past their deadline are lost.
#[derive(Debug)]
pub struct CheckLaunches {
    /// The agent.
    pub agent_id: String,
}

impl Request for TaskStatus {
    fn waits_for_registry(&self) -> bool {
        false
    }
    fn refuse(self, _error: ServiceError) {}
}

answered_request!(LaunchTask, TaskLogs, AgentLink);
notice!(CheckLaunches);

/// The first wait before a kill that did not arrive is sent again.
pub(super) const KILL_RETRY_FIRST: Duration = Duration::from_secs(1);
/// The longest wait between two sends of one kill.
pub(super) const KILL_RETRY_MAX: Duration = Duration::from_secs(30);

/// How many ended tasks an agent's entry keeps for `muster job status`.
const COMPLETED_HISTORY: usize = 1_000;

impl Master {
    /// [`TaskStatus`]: from the agent the task runs on, and only from it.
    pub(super) fn task_status(
        &mut self,
        TaskStatus { update, sender }: TaskStatus,
        ctx: &mut Context<Self>,
    ) {
        if let Err(why) = self.speaks_for(&update.agent_id, identity(sender.as_ref())) {
            self.metrics.impersonations += 1;
            tracing::warn!(agent = %update.agent_id, %why, "task update refused");
            return;
        }
        if let Some(task) = update.task {
            self.task_updated(update.agent_id, task, ctx);
        }
    }

    /// Marks a task killed (it frees its resources now) and tells its agent to stop it. A
    /// batch task's slot stays empty until its end is reported ([`Master::batch_stops`]).
    pub(super) fn stop_task(&mut self, stop: &Stop, ctx: &mut Context<Self>) -> bool {
        let Some(agent) = self.cluster.agent_mut(&stop.agent.0) else {
            return false;
        };
        let Some(task) = agent.tasks.iter_mut().find(|t| t.id() == stop.task_id) else {
            return false;
        };
        task.set_state(TaskState::Killed);
        let slot = task.name().to_owned();
        let job = task.job_name().map(str::to_owned);
        if job.is_some_and(|job| self.is_batch(&job)) {
            let stopping = (stop.agent.0.clone(), stop.task_id.clone());
            self.batch_stops.insert(slot, stopping);
        }
        self.send_kill(stop.agent.0.clone(), stop.task_id.clone(), 0, ctx);
        true
    }

    /// Whether the registry holds `job` as a batch job.
    fn is_batch(&self, job: &str) -> bool {
        self.registry.reader().read(|s| {
            s.jobs
                .get(job)
                .is_some_and(|j| j.scheduler == SchedulerType::Batch)
        })
    }

    /// The batch slots whose stopped task has not reported its end: they stay empty. Entries
    /// whose task is no longer marked killed on its agent (it went with its agent, or a new
    /// leader rebuilt the cluster) are dropped; an agent that is away keeps its tasks' slots
    /// by itself (`slots_kept_while_away`).
    pub(super) fn batch_slots_stopping(&mut self) -> Vec<String> {
        let agents = &self.cluster.agents;
        self.batch_stops.retain(|_, (agent, task)| {
            agents.get(agent).is_some_and(|agent| {
                agent
                    .tasks
                    .iter()
                    .any(|t| t.id() == task && t.state() == TaskState::Killed)
            })
        });
        self.batch_stops.keys().cloned().collect()
    }

    /// Whether `task`'s end, reported by `agent_id`, is that of a batch task this master
    /// stopped (which it forgets now), in a slot its job still wants: that slot is placed
    /// anew now, unless the task finished first.
    fn batch_stop_ended(&mut self, agent_id: &str, task: &TaskRecord) -> bool {
        let stopped_here = self
            .batch_stops
            .get(task.name())
            .is_some_and(|(agent, id)| agent == agent_id && id == task.id());
        if !stopped_here {
            return false;
        }
        self.batch_stops.remove(task.name());
        let Some(job) = task.job_name() else {
            return false;
        };
        let group = task.view.group();
        self.registry.reader().read(|s| {
            s.jobs
                .get(job)
                .is_some_and(|j| muster_scheduler::wants_counted_slot(j, group, task.name()))
        })
    }

    /// Tells an agent to kill a task this master has marked killed. A kill that does not
    /// arrive (a broken link, a silent agent) is sent again after a back-off
    /// ([`KILL_RETRY_FIRST`], doubling up to [`KILL_RETRY_MAX`]) for as long as this master
    /// leads in the same term, the agent is connected and the task, still marked killed, has
    /// not reported its end: otherwise it would run on beside its replacement with nothing to
    /// notice it. An agent that answers it runs no such task ends it here.
    pub(super) fn send_kill(
        &mut self,
        agent_id: String,
        task_id: String,
        retry: u32,
        ctx: &mut Context<Self>,
    ) {
        let (Some(node), Some(agent)) = (&self.node, self.cluster.agents.get_mut(&agent_id)) else {
            return;
        };
        let Some(remote) = agent.remote(node).cloned() else {
            return;
        };
        let kill = pb::KillTask {
            task_id: task_id.clone(),
            term: self.term,
        };
        let term = self.term;
        let timeout = self.config.ping_timeout;
        ctx.defer(
            async move {
                remote
                    .ask_timeout::<pb::KillTask, pb::KillTaskReply>(timeout, kill)
                    .await
            },
            move |master: &mut Master, ctx, answered| match answered {
                Ok(reply) if reply.error.is_empty() => {}
                Ok(reply) if reply.follows_term > term => {
                    // Fenced: the kill said nothing about the task. If this master leads
                    // again, in a newer term, the kill goes again with that term.
                    master.metrics.kills_fenced += 1;
                    tracing::warn!(agent = %agent_id, task = %task_id, sent_in = term, agent_follows = reply.follows_term, "an agent refused a kill of an older term");
                    if master.leading_term().is_some_and(|now| now >= reply.follows_term)
                        && master.kill_pending(&agent_id, &task_id)
                    {
                        master.send_kill(agent_id, task_id, 0, ctx);
                    }
                }
                Ok(reply) => master.kill_refused(agent_id, task_id, reply, ctx),
                Err(e) => {
                    let wait = KILL_RETRY_FIRST
                        .saturating_mul(1 << retry.min(16))
                        .min(KILL_RETRY_MAX);
                    tracing::warn!(agent = %agent_id, task = %task_id, error = %e, retry_in = ?wait, "could not ask an agent to kill a task");
                    master.metrics.kill_retries += 1;
                    ctx.defer(tokio::time::sleep(wait), move |master: &mut Master, ctx, ()| {
                        if master.leading_term() == Some(term)
                            && master.kill_pending(&agent_id, &task_id)
                        {
                            master.send_kill(agent_id, task_id, retry.saturating_add(1), ctx);
                        }
                    });
                }
            },
        );
    }

    /// Whether `task_id` is still marked killed on `agent_id`, connected, with no end reported.
    fn kill_pending(&self, agent_id: &str, task_id: &str) -> bool {
        self.cluster.agents.get(agent_id).is_some_and(|agent| {
            agent.connected
                && agent
                    .tasks
                    .iter()
                    .any(|t| t.id() == task_id && t.state() == TaskState::Killed)
        })
    }

    /// The agent answered a kill with an error: it runs no such task (any more). The task ends
    /// here, so it is not counted as running for good: as the agent says it ended by itself
    /// (a batch task that finished just before the kill came ran to completion), otherwise
    /// killed, with the agent's answer. (A refusal of the kill's term says nothing about the
    /// task: `send_kill` handles it.)
    fn kill_refused(
        &mut self,
        agent_id: String,
        task_id: String,
        answer: pb::KillTaskReply,
        ctx: &mut Context<Self>,
    ) {
        let Some(task) = self
            .cluster
            .agents
            .get(&agent_id)
            .and_then(|a| a.tasks.iter().find(|t| t.id() == task_id))
        else {
            return;
        };
        let error = answer.error;
        let ended_as = match TaskState::try_from(answer.ended_as) {
            Ok(state @ (TaskState::Finished | TaskState::Failed | TaskState::Lost)) => state,
            _ => TaskState::Killed,
        };
        tracing::info!(agent = %agent_id, task = %task_id, %error, "the agent runs no task to kill: counted as ended");
        let mut ended = task.clone();
        ended.set_state(ended_as);
        ended.message = format!("the kill was answered: {error}").into();
        self.record_updated(agent_id, ended, ctx);
    }

    /// An agent reports a task's state (or a launch failed). Ended tasks move to the history,
    /// their capacity goes to the blocked-queue, and a service job whose task ended on its own
    /// gets an evaluation to replace it (held back when the same slot keeps failing: see
    /// [`MasterConfig::reschedule_delay`](crate::MasterConfig::reschedule_delay)).
    pub(super) fn task_updated(&mut self, agent_id: String, task: Task, ctx: &mut Context<Self>) {
        let task = self.cluster.interner.task(&task);
        self.record_updated(agent_id, task, ctx);
    }

    /// [`Master::task_updated`], with the task as the master keeps it.
    pub(super) fn record_updated(
        &mut self,
        agent_id: String,
        task: TaskRecord,
        ctx: &mut Context<Self>,
    ) {
        let stopped_batch_slot = task.is_terminal()
            && task.state() != TaskState::Finished
            && self.batch_stop_ended(&agent_id, &task);
        let Some(agent) = self.cluster.agent_mut(&agent_id) else {
            return;
        };
        let ended = task.is_terminal();
        let position = agent.tasks.iter().position(|t| t.id() == task.id());
        let was_killed = position
            .and_then(|i| agent.tasks.get(i))
            .is_some_and(|t| t.state() == TaskState::Killed);
        match (position, ended) {
            // Being killed: only its end counts (a RUNNING sent before the kill arrived must
            // not bring it back).
            (Some(_), false) if was_killed => return,
            (Some(i), false) => agent.tasks[i] = keeping_ports(&agent.tasks[i], &task),
            (Some(i), true) => {
                agent.tasks.swap_remove(i);
                agent.completed_tasks.push(task.clone());
                if agent.completed_tasks.len() > COMPLETED_HISTORY {
                    agent.completed_tasks.remove(0);
                }
            }
            (None, false) => {
                let recorded_end = agent
                    .completed_tasks
                    .iter()
                    .find(|t| t.id() == task.id())
                    .map(TaskRecord::state);
                match recorded_end {
                    // Ended by itself, as the agent said (in a status, or in the answer to a
                    // kill, which travels apart from status updates): this report was sent
                    // before that and arrived after it. A task id is never launched twice, so
                    // the task runs no more.
                    Some(TaskState::Finished | TaskState::Failed) => {
                        tracing::debug!(agent = %agent_id, task = %task.id(), state = ?task.state(), "a status sent before the task's end arrived after it: ignored");
                        return;
                    }
                    // Given up as lost (and replaced), or counted killed: if it runs after
                    // all, it must not run beside its replacement. (A kill answered "no such
                    // task" may have overtaken the launch.)
                    Some(recorded) => {
                        if recorded == TaskState::Killed {
                            agent.completed_tasks.retain(|t| t.id() != task.id());
                        }
                        let mut adopted = task.clone();
                        adopted.set_state(TaskState::Killed);
                        agent.tasks.push(adopted);
                        let stop = Stop {
                            agent: AgentId(agent_id.clone()),
                            task_id: task.id().to_owned(),
                        };
                        tracing::warn!(agent = %agent_id, task = %task.id(), ended_as = ?recorded, "a task recorded as ended reports in: killing it");
                        self.stop_task(&stop, ctx);
                        return;
                    }
                    // Never launched there by this master (whatever this master launches, it
                    // records first; what ran before a failover comes with the agent's
                    // re-registration): an agent speaks only of what it was given.
                    None => {
                        tracing::warn!(agent = %agent_id, task = %task.id(), state = ?task.state(), "an update for a task this master never launched on that agent: refused");
                        return;
                    }
                }
            }
            (None, true) => return,
        }
        // What an ended task freed goes to the blocked-queue.
        let freed = ended.then(|| (agent.info.attributes.clone(), agent.free()));
        let index = self.next_index();
        self.publish_task(&agent_id, &task);
        if (ended || task.state() == TaskState::Running)
            && let Some(job) = task.job_name().map(str::to_owned)
        {
            // A replacement running, or a task ending, lets a drain take its next step.
            self.drain_progressed(&job, ctx);
        }
        let Some((attributes, free_now)) = freed else {
            return;
        };
        if task.state() == TaskState::Finished {
            self.record_batch_finished(&task, ctx);
        }
        let change = CapacityChange {
            agent: AgentId(agent_id.clone()),
            attributes,
            free: free_now,
            index,
        };
        let _ = self.blocked.tell(BlockedMsg::CapacityChanged(change));
        // So may its namespace's quota.
        self.quota_freed(task_namespace(task.job(), task.name()), false, index);
        // A batch slot stopped for an update (or a resubmission) is placed once its task has
        // stopped, if it did not finish first.
        let replace = stopped_batch_slot
            || (!was_killed
                && task.state() != TaskState::Finished
                && task.job_name().is_some_and(|job| {
                    self.registry.reader().read(|s| {
                        s.jobs.get(job).is_some_and(|j| {
                            // A batch task that failed has run (unless its group asks for it
                            // to be placed again); one lost never did.
                            let rescheduled = j
                                .groups
                                .iter()
                                .any(|g| g.name == task.view.group() && g.reschedule.is_some());
                            !j.stopped
                                && (j.scheduler != SchedulerType::Batch
                                    || task.state() == TaskState::Lost
                                    || rescheduled)
                        })
                    })
                }));
        if replace && let Some(job) = task.job_name().map(str::to_owned) {
            let Some(job) = self.registry.reader().read(|s| s.jobs.get(&job).cloned()) else {
                return;
            };
            let mut eval = Evaluation::new(&job, Trigger::TaskEnded(task.id().to_owned()));
            // A task lost with its agent or its launch did not crash: no back-off.
            let (failures, wait) = if task.state() == TaskState::Lost || stopped_batch_slot {
                (0, Duration::ZERO)
            } else {
                let policy = job
                    .groups
                    .iter()
                    .find(|g| g.name == task.view.group())
                    .and_then(|g| g.reschedule);
                match self.crash_loops.rescheduled(
                    task.name(),
                    tokio::time::Instant::now(),
                    policy.as_ref(),
                    self.config.reschedule_delay,
                    self.config.reschedule_max_delay,
                ) {
                    Reschedule::After { failures, wait } => (failures, wait),
                    Reschedule::GiveUp(why) => {
                        tracing::warn!(slot = %task.name(), %why, "task failed: not placed again");
                        return;
                    }
                }
            };
            if !wait.is_zero() {
                let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
                eval.wait_until_ms = now_ms().saturating_add(wait_ms);
                eval.status_description = format!(
                    "{} ended {failures} times in a row: replaced after {wait:?}",
                    task.name()
                );
                tracing::warn!(slot = %task.name(), failures, ?wait, "task crash-looping: its replacement backs off");
            }
            let slot = task.name().to_owned();
            self.write_with_evals(Vec::new(), vec![eval], ctx, move |master, _ctx, written| {
                if let Err(e) = written {
                    tracing::warn!(error = %e, "could not write the replacement evaluation");
                    // No evaluation will come to place it: let the next one of the job.
                    master.crash_loops.release(&slot);
                }
            });
        }
    }

    /// A task of a batch job ran to completion: its slot is recorded in the registry, so that
    /// whichever master leads never runs it again, even while its agent is away or before
    /// the agent is back after a failover.
    fn record_batch_finished(&mut self, task: &TaskRecord, ctx: &mut Context<Self>) {
        let Some(job) = task.job_name().filter(|job| self.is_batch(job)) else {
            return;
        };
        let slots = vec![(task.name().to_owned(), task.view.job_version)];
        self.write_batch_finishes(job.to_owned(), slots, ctx);
    }

    /// Writes that `job`'s `slots` (each with the job version its task ran at) finished.
    pub(super) fn write_batch_finishes(
        &mut self,
        job: String,
        slots: Vec<(String, u64)>,
        ctx: &mut Context<Self>,
    ) {
        let op = Op::BatchSlotsFinished { job, slots };
        self.write_with_evals(vec![op], Vec::new(), ctx, |_master, _ctx, written| {
            if let Err(e) = written {
                tracing::warn!(error = %e, "could not record finished batch slots");
            }
        });
    }

    /// Tasks on `agent_id` still STAGING past their launch deadline, with no word from the
    /// agent since (a one-way launch can be lost with a broken link): LOST, and replaced. One
    /// walk over the agent's tasks; the next check comes at the earliest deadline left.
    pub(super) fn check_launches(
        &mut self,
        CheckLaunches { agent_id }: CheckLaunches,
        ctx: &mut Context<Self>,
    ) {
        let now = Instant::now();
        let origin = self.launch_clock;
        let Some(agent) = self.cluster.agents.get_mut(&agent_id) else {
            return;
        };
        agent.launch_check_due = false;
        let mut next: Option<Duration> = None;
        let mut silent = Vec::new();
        for task in agent
            .tasks
            .iter()
            .filter(|t| t.state() == TaskState::Staging)
        {
            let Some(deadline) = task.launch_deadline else {
                continue;
            };
            match deadline.remaining(origin, now) {
                Duration::ZERO => silent.push(task.clone()),
                left => next = Some(next.map_or(left, |next| next.min(left))),
            }
        }
        if let Some(wait) = next {
            agent.launch_check_due = true;
            ctx.delay(
                wait,
                CheckLaunches {
                    agent_id: agent_id.clone(),
                }
                .into(),
            );
        }
        for mut lost in silent {
            tracing::warn!(agent = %agent_id, task = %lost.id(), "no word from the agent about a launched task: lost");
            lost.set_state(TaskState::Lost);
            lost.message = format!(
                "no word from the agent within {:?} of the launch",
                self.config.launch_timeout
            )
            .into();
            self.record_updated(agent_id.clone(), lost, ctx);
        }
    }

    /// Reads a piece of a task's output from the agent it was placed on; the ask runs beside
    /// the process, which goes on handling messages.
    pub(super) fn task_logs(
        &mut self,
        TaskLogs { request, reply }: TaskLogs,
        _ctx: &mut Context<Self>,
    ) {
        if self.leading_term().is_none() {
            return reply.send(Err(self.not_leading()));
        }
        let found = self.cluster.agents.iter().find(|(_, agent)| {
            agent
                .tasks
                .iter()
                .chain(&agent.completed_tasks)
                .any(|t| t.id() == request.task_id)
        });
        let Some((agent_id, _)) = found else {
            return reply.send(Err(ServiceError::UnknownTask(request.task_id)));
        };
        let agent_id = agent_id.clone();
        let remote = match self.reach_agent(&agent_id) {
            Ok(remote) => remote,
            Err(error) => return reply.send(Err(error)),
        };
        let timeout = self.config.ping_timeout;
        tokio::spawn(async move {
            let answer = remote
                .ask_timeout::<pb::ReadTaskOutput, pb::TaskOutputChunk>(timeout, request)
                .await;
            reply.send(match answer {
                Ok(chunk) if chunk.error.is_empty() => Ok(chunk),
                Ok(chunk) => Err(ServiceError::FailedPrecondition(format!(
                    "agent {agent_id}: {}",
                    chunk.error
                ))),
                Err(e) => Err(ServiceError::Unavailable(format!(
                    "agent {agent_id} did not answer: {e}"
                ))),
            });
        });
    }

    /// [`AgentLink`]: the way to a connected agent, for a monitor of its log.
    pub(super) fn agent_link(
        &mut self,
        AgentLink { agent_id, reply }: AgentLink,
        _ctx: &mut Context<Self>,
    ) {
        if self.leading_term().is_none() {
            return reply.send(Err(self.not_leading()));
        }
        reply.send(
            self.reach_agent(&agent_id)
                .map(|remote| (remote, self.config.ping_timeout)),
        );
    }

    /// The agent `agent_id`'s actor, if it is known, connected and has an address this master
    /// can reach.
    fn reach_agent(&self, agent_id: &str) -> Result<RemotePid, ServiceError> {
        let Some(agent) = self.cluster.agents.get(agent_id) else {
            return Err(ServiceError::UnknownAgent(agent_id.to_owned()));
        };
        // FAILED_PRECONDITION, not UNAVAILABLE: the leader answered, and another master
        // would not do better.
        if !agent.connected {
            return Err(ServiceError::FailedPrecondition(format!(
                "agent {agent_id} is not connected"
            )));
        }
        let (Some(node), Ok(upid)) = (&self.node, agent.info.address.parse::<muster_actor::Upid>())
        else {
            return Err(ServiceError::FailedPrecondition(format!(
                "agent {agent_id} has no usable address {:?}",
                agent.info.address
            )));
        };
        Ok(node.remote(upid))
    }

    /// [`LaunchTask`]: an operator's task, launched on the agent it names as it is.
    pub(super) fn launch_task(
        &mut self,
        LaunchTask { request, reply }: LaunchTask,
        ctx: &mut Context<Self>,
    ) {
        let request = *request;
        if self.leading_term().is_none() {
            return reply.send(Err(self.not_leading()));
        }
        let Some(node) = &self.node else {
            return reply.send(Err(ServiceError::Unavailable(
                "this master has no transport to reach agents".into(),
            )));
        };
        let Some(agent) = self.cluster.agents.get(&request.agent_id) else {
            return reply.send(Err(ServiceError::UnknownAgent(request.agent_id)));
        };
        if !agent.connected {
            return reply.send(Err(ServiceError::FailedPrecondition(format!(
                "agent {} is not connected",
                request.agent_id
            ))));
        }
        let (Some(framework), Some(mut task)) = (request.framework, request.task) else {
            return reply.send(Err(ServiceError::InvalidArgument {
                field: "framework, task".into(),
                message: "LaunchTask needs a framework and a task".into(),
            }));
        };
        if task.id.is_empty() {
            return reply.send(Err(ServiceError::InvalidArgument {
                field: "task.id".into(),
                message: "the task has no id".into(),
            }));
        }
        let upid = match agent.info.address.parse::<Upid>() {
            Ok(upid) => upid,
            Err(e) => {
                return reply.send(Err(ServiceError::FailedPrecondition(format!(
                    "agent address: {e}"
                ))));
            }
        };
        if agent.tasks.iter().any(|t| t.id() == task.id) {
            return reply.send(Err(ServiceError::FailedPrecondition(format!(
                "task {:?} already runs there",
                task.id
            ))));
        }
        task.framework_id = framework.id.clone();
        task.state = model_pb::TaskState::Staging as i32;
        let run = pb::RunTask {
            framework: Some(framework.clone()),
            task: Some(task.clone()),
            term: self.term,
        };
        let remote = node.remote(upid);
        let timeout = self.config.ping_timeout;
        let agent_id = request.agent_id;
        let task_id = task.id.clone();
        // Recorded before it is sent: the agent's first status update may come before the
        // answer to the launch.
        let task = self.cluster.interner.task(&task);
        if let Some(agent) = self.cluster.agent_mut(&agent_id) {
            agent.tasks.push(task);
        }
        self.cluster
            .add_frameworks(std::slice::from_ref(&framework));
        ctx.defer(
            async move {
                remote
                    .ask_timeout::<pb::RunTask, pb::RunTaskReply>(timeout, run)
                    .await
            },
            move |master: &mut Master, _ctx, answered| {
                let refused = match answered {
                    Ok(answer) if answer.error.is_empty() => return reply.send(Ok(())),
                    Ok(answer) => ServiceError::FailedPrecondition(format!(
                        "agent refused the task: {}",
                        answer.error
                    )),
                    Err(e) => ServiceError::Unavailable(format!("agent unreachable: {e}")),
                };
                if let Some(agent) = master.cluster.agent_mut(&agent_id) {
                    agent.tasks.retain(|t| t.id() != task_id);
                }
                reply.send(Err(refused));
            },
        );
    }
}

/// `reported`, an agent's word on a task the master holds as `held`, with the ports the master
/// gave it when the report carries none (an agent of a build before ports drops them): a task
/// keeps its ports for its life, and a report must not free them for another task.
fn keeping_ports(held: &TaskRecord, reported: &TaskRecord) -> TaskRecord {
    if !reported.view.ports().is_empty() || held.view.ports().is_empty() {
        return reported.clone();
    }
    let view = (*reported.view)
        .clone()
        .with_ports(held.view.ports().to_vec());
    TaskRecord {
        view: std::sync::Arc::new(view),
        detail: std::sync::Arc::clone(&held.detail),
        ..reported.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task_record::TaskInterner;

    fn wire(state: model_pb::TaskState, ports: &[(&str, u32)]) -> Task {
        Task {
            id: "web.fe[0]-00000001".into(),
            name: "web.fe[0]".into(),
            job: "web".into(),
            group: "fe".into(),
            state: state as i32,
            ports: ports
                .iter()
                .map(|(label, port)| model_pb::AssignedPort {
                    label: (*label).into(),
                    port: *port,
                })
                .collect(),
            ..Task::default()
        }
    }

    #[test]
    fn a_report_without_ports_keeps_those_the_task_was_given() {
        let mut interner = TaskInterner::default();
        let held = interner.task(&wire(model_pb::TaskState::Staging, &[("http", 20_001)]));
        let reported = interner.task(&wire(model_pb::TaskState::Running, &[]));
        let kept = keeping_ports(&held, &reported);
        assert_eq!(kept.state(), TaskState::Running);
        assert_eq!(kept.view.ports(), [20_001]);
        assert_eq!(kept.wire_ports()[0].label, "http");
        // A report that carries ports is taken as it is.
        let moved = interner.task(&wire(model_pb::TaskState::Running, &[("http", 20_002)]));
        assert_eq!(keeping_ports(&held, &moved).view.ports(), [20_002]);
    }

    #[test]
    fn a_report_with_a_port_that_is_not_one_holds_none_and_keeps_labels_aligned() {
        let mut interner = TaskInterner::default();
        let bad = interner.task(&wire(
            model_pb::TaskState::Running,
            &[("a", 70_000), ("b", 8_080)],
        ));
        assert!(bad.view.ports().is_empty());
        assert!(bad.wire_ports().is_empty());
    }
}

//! The [`Agent`] process: its state, the messages it takes ([`AgentMsg`]) and their dispatch.
//! What it does with them is split by job:
//!
//! - [`handle`]: [`start`] (spawning the process and registering it on the node) and the
//!   [`AgentHandle`] it returns, with [`AgentStatus`] and [`AgentSnapshot`];
//! - [`fencing`]: the leader term the agent follows, and refusing commands of older ones;
//! - [`master_link`]: finding the leading master and registering (or re-registering) with it,
//!   following `NotLeader` hints, heartbeats, and noticing the master is gone;
//! - [`task_lifecycle`]: launching and killing tasks, recording how they ended, and reporting
//!   their states to the master;
//! - [`supervision`]: what the agent does for a running task beyond waiting for its end:
//!   health checks, restarts in place, its longest run, its kill signal and timeout;
//! - [`recovery`]: taking back the tasks an earlier run of the agent left (re-attaching to
//!   those still running, recording the real end of the others);
//! - [`task_output`]: answering the masters' reads of a task's output, and having the runner
//!   check now and then the output files of running tasks whose executors do not bound them.
//!
//! The task table is [`crate::tasks`], what runs the tasks [`crate::runner`] (the one
//! [`TaskRunner`] the agent holds, whichever it is), the files under the data directory
//! [`crate::store`].

mod fencing;
mod handle;
mod log_sessions;
mod master_link;
mod recovery;
mod supervision;
mod task_lifecycle;
mod task_output;

use std::collections::{HashSet, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use muster_actor::{AskError, Context, ExitReason, Process, ProcessRef, Reply, TimerHandle, Upid};
use muster_proto::cluster::Framework;
use muster_proto::cluster::{
    AgentLogLines, KillTask, KillTaskReply, LaunchTasks, LeaderAnnouncement, Ping, Pong,
    ReadAgentLog, ReadTaskOutput, RegistrationReply, RunTask, RunTaskReply, TaskOutputChunk,
};
use muster_proto::model::{AgentInfo, Task};
use muster_transport::Node;
use tokio::sync::watch;
use tokio::time::Instant;

pub use handle::{AgentHandle, AgentSnapshot, AgentStatus, ISOLATION_ATTRIBUTE, start};

use crate::metrics::AgentFigures;
use crate::runner::{RunnerTask, TaskEnd, TaskRunner};
use crate::store::{self, blocking};
use crate::task_user::TaskUsers;
use crate::tasks::Tasks;
use crate::{AgentConfig, backoff};
use master_link::{Connection, Heartbeats};

/// A message to the [`Agent`] process. Built by the node for remote asks, or with
/// [`AgentMsg::ping`], [`AgentMsg::run_task`] and [`AgentMsg::kill_task`] for local ones.
pub struct AgentMsg(Msg);

impl AgentMsg {
    /// A master's ping; answered with the agent's id.
    pub fn ping(ping: Ping, reply: Reply<Pong>) -> Self {
        AgentMsg(Msg::Ping(ping, reply))
    }

    /// A master's request to run a task; answered with an empty error on success.
    pub fn run_task(request: RunTask, reply: Reply<RunTaskReply>) -> Self {
        AgentMsg(Msg::RunTask(Box::new(request), reply))
    }

    /// A new leader's announcement that it leads: the agent re-registers with it unless it
    /// is registered there already (or the announcement is of an older term).
    pub fn leader_announced(announcement: LeaderAnnouncement) -> Self {
        AgentMsg(Msg::LeaderAnnounced(announcement))
    }

    /// A master's one-way request to run the tasks of one plan. Each task's start or refusal
    /// (FAILED, with the reason in its `message`) follows as a `TaskStatusUpdate`.
    pub fn launch_tasks(launch: LaunchTasks) -> Self {
        AgentMsg(Msg::LaunchTasks(launch))
    }

    /// A master's request to stop a running task (its group's kill signal to its process
    /// group, SIGTERM by default, then SIGKILL after its kill timeout or the agent's
    /// [`kill_grace`](AgentConfig::kill_grace)); answered at once, with an empty error if the
    /// task runs. Its end follows as a `TaskStatusUpdate` in state KILLED.
    pub fn kill_task(request: KillTask, reply: Reply<KillTaskReply>) -> Self {
        AgentMsg(Msg::KillTask(request, reply))
    }

    /// A master's request for a piece of a task's stdout or stderr (running, or in the
    /// completed history), by absolute offset across rotations; answered with the bytes, or
    /// an error naming an unknown or invalid task id or a failed read.
    pub fn read_task_output(request: ReadTaskOutput, reply: Reply<TaskOutputChunk>) -> Self {
        AgentMsg(Msg::ReadTaskOutput(request, reply))
    }

    /// A master's read of this agent's log for `muster monitor --agent`: opens a session at a
    /// level, returns the lines since the last read, or closes it (see [`ReadAgentLog`]).
    pub fn read_log(request: ReadAgentLog, reply: Reply<AgentLogLines>) -> Self {
        AgentMsg(Msg::ReadLog(request, reply))
    }

    /// A local ask for what the agent counts ([`AgentFigures`]): answered at once, with the
    /// running tasks' processes and cgroups but not their usage, which the asker reads off the
    /// agent's thread (see [`crate::metrics::gather`]).
    pub fn figures(reply: Reply<AgentFigures>) -> Self {
        AgentMsg(Msg::Figures(reply))
    }
}

impl fmt::Debug for AgentMsg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.0 {
            Msg::Ping(..) => "Ping",
            Msg::RunTask(..) => "RunTask",
            Msg::LaunchTasks(..) => "LaunchTasks",
            Msg::KillTask(..) => "KillTask",
            Msg::ReadTaskOutput(..) => "ReadTaskOutput",
            Msg::ReadLog(..) => "ReadLog",
            Msg::CheckOutput => "CheckOutput",
            Msg::Start => "Start",
            Msg::Round { .. } => "Round",
            Msg::Replied { .. } => "Replied",
            Msg::CheckSilence { .. } => "CheckSilence",
            Msg::SendHeartbeat { .. } => "SendHeartbeat",
            Msg::TaskExited { .. } => "TaskExited",
            Msg::TaskHealth { .. } => "TaskHealth",
            Msg::RestartTask { .. } => "RestartTask",
            Msg::RunTooLong { .. } => "RunTooLong",
            Msg::Alive => "Alive",
            Msg::LeaderAnnounced(_) => "LeaderAnnounced",
            Msg::AgentId(_) => "AgentId",
            Msg::Snapshot(_) => "Snapshot",
            Msg::Figures(_) => "Figures",
        };
        f.debug_tuple("AgentMsg").field(&kind).finish()
    }
}

enum Msg {
    Ping(Ping, Reply<Pong>),
    RunTask(Box<RunTask>, Reply<RunTaskReply>),
    LaunchTasks(LaunchTasks),
    KillTask(KillTask, Reply<KillTaskReply>),
    ReadTaskOutput(ReadTaskOutput, Reply<TaskOutputChunk>),
    ReadLog(ReadAgentLog, Reply<AgentLogLines>),
    /// Time to rotate the running tasks' output files that are past their limit.
    CheckOutput,
    /// Sent once by [`start`] after the process is registered on the node.
    Start,
    /// Time for a registration round (after the initial delay or a backoff).
    Round {
        generation: u64,
    },
    /// A master answered a registration request, or the ask failed.
    Replied {
        generation: u64,
        master: Upid,
        result: Result<RegistrationReply, AskError>,
    },
    /// Has the master been silent for too long?
    CheckSilence {
        generation: u64,
    },
    /// Time for the next heartbeat.
    SendHeartbeat {
        generation: u64,
    },
    /// A task ended (or waiting for it failed).
    TaskExited {
        task_id: String,
        ended: TaskEnd,
    },
    /// A run of a task has a new health (see `supervision`).
    TaskHealth {
        task_id: String,
        run: u64,
        health: muster_model::TaskHealth,
        why: String,
    },
    /// Time to restart a task that failed in run `run`.
    RestartTask {
        task_id: String,
        run: u64,
    },
    /// Run `run` of a task reached its longest run.
    RunTooLong {
        task_id: String,
        run: u64,
    },
    /// Time to record that the agent is alive (see `store::touch_alive`).
    Alive,
    /// A new leader says it leads.
    LeaderAnnounced(LeaderAnnouncement),
    AgentId(Reply<Option<String>>),
    Snapshot(Reply<AgentSnapshot>),
    Figures(Reply<AgentFigures>),
}

/// The agent process. Start it with [`start`]; it lives on the node's system, registered as
/// `agent`.
pub struct Agent {
    node: Node,
    config: AgentConfig,
    /// What runs its tasks: the machine's processes, or the runner its config gives.
    runner: Arc<dyn TaskRunner>,
    /// Whom its tasks run as.
    task_users: TaskUsers,
    /// The masters a registration round tries: the configured ones, then those the leader
    /// named last (`learned_masters`) that are not among them.
    masters: Vec<Upid>,
    /// The masters the agent was configured with (`--master`).
    configured_masters: Vec<Upid>,
    /// The raft group's masters as the leader last named them in a heartbeat reply, kept in
    /// the data directory across restarts.
    learned_masters: Vec<Upid>,
    info: AgentInfo,
    agent_id: Option<String>,
    status: watch::Sender<AgentStatus>,
    // The link to the master (see `master_link`).
    /// Bumped whenever the agent starts looking for a master anew, so that the answers, timers
    /// and checks of an earlier search are ignored.
    generation: u64,
    connection: Connection,
    /// Rounds in a row that found no master, for the backoff.
    failed_rounds: u32,
    /// The master lost last: tried last in the next rounds, since it is probably down.
    lost: Option<Upid>,
    /// When the current master was last heard from: it pinged, answered a heartbeat, or took
    /// the registration.
    last_ping: Instant,
    silence_timer: Option<TimerHandle>,
    /// Whether the current master takes heartbeats.
    heartbeats: Heartbeats,
    /// The TTL the master last gave a heartbeat: past it the master counts the agent late, so
    /// a heartbeat is not waited for longer (see `master_link::send_heartbeat`).
    heartbeat_ttl: Option<Duration>,
    /// The master to try first in the next round (one that refused a heartbeat: it leads, but
    /// wants the agent to re-register).
    preferred: Option<Upid>,
    /// Masters this process is linked to (until their link's loss is reported).
    linked: HashSet<Upid>,
    /// The master that said, in its latest announcement or admission, that it reads running
    /// tasks grouped by their labels (see [`crate::reregistration`]); forgotten when the link
    /// to it breaks, as what answers there next may be an older master.
    reads_tasks_sharing_labels: Option<Upid>,
    // Tasks (see `task_lifecycle`).
    /// Running tasks and the completed history.
    tasks: Tasks,
    /// Tasks an earlier run left running, re-attached by [`start`], watched from `Start` on.
    recovered: Vec<(Framework, Task, Box<dyn RunnerTask>)>,
    /// The highest leader term the agent has heard from (see `fencing`), kept in `meta/term`.
    term: u64,
    /// The agent's registration number (see `fencing`), raised before every registration
    /// round and kept in `meta/registration`: launches stamped with another are refused.
    registration: u64,
    /// While the agent waits out a back-off with no master reachable, the task that looks
    /// for one coming back (see `master_link::probe_masters`).
    probe: Option<tokio::task::AbortHandle>,
    /// Commands refused for coming from an older term.
    stale_commands_refused: u64,
    /// What the agent counts for its metrics (see [`AgentFigures`]).
    counts: Counts,
    /// Set when the master did not know the agent's id: the next admission sets the term
    /// (see `fencing::rebase_term_to`).
    rebase_term: bool,
    /// Task status updates not yet sent to a master (the agent was not registered), oldest
    /// first, the latest per task only; bounded (see [`Agent::report`]).
    unsent_updates: VecDeque<Task>,
    /// The masters' reads of this agent's log (`muster monitor --agent`).
    log_sessions: log_sessions::LogSessions,
}

impl fmt::Debug for Agent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Agent")
            .field("address", &self.info.address)
            .field("agent_id", &self.agent_id)
            .field("connection", &self.connection)
            .finish_non_exhaustive()
    }
}

impl Process for Agent {
    type Message = AgentMsg;

    async fn handle(&mut self, AgentMsg(msg): AgentMsg, ctx: &mut Context<Self>) {
        match msg {
            Msg::Ping(ping, reply) => self.on_ping(&ping, reply),
            Msg::RunTask(request, reply) => {
                if let Err(refused) = self.admit_term(request.term, "a RunTask") {
                    return reply.send(RunTaskReply {
                        error: refused.to_string(),
                    });
                }
                let error = match self.run_task(*request, ctx).await {
                    Ok(()) => String::new(),
                    Err(error) => {
                        tracing::warn!(%error, "refused a task");
                        error.to_string()
                    }
                };
                reply.send(RunTaskReply { error });
            }
            Msg::LaunchTasks(launch) => {
                if self.admit_term(launch.term, "a LaunchTasks").is_err() {
                    return;
                }
                if let Err(why) = self.admit_launch(launch.registration, launch.deadline_unix_ms) {
                    for request in launch.tasks {
                        self.refuse_launch(request, &why);
                    }
                    return;
                }
                for request in launch.tasks {
                    if let Err(error) = self.run_task(request, ctx).await {
                        tracing::warn!(%error, "refused a task");
                    }
                }
            }
            Msg::KillTask(request, reply) => {
                if let Err(refused) = self.admit_term(request.term, "a KillTask") {
                    return reply.send(KillTaskReply {
                        error: refused.to_string(),
                        follows_term: self.term,
                        ..KillTaskReply::default()
                    });
                }
                let answer = self.kill_task(&request.task_id, request.term, ctx);
                if !answer.error.is_empty() {
                    tracing::warn!(error = %answer.error, "cannot kill a task");
                }
                reply.send(answer);
            }
            Msg::ReadTaskOutput(request, reply) => self.read_task_output(request, reply),
            Msg::ReadLog(request, reply) => self.log_sessions.answer(request, reply),
            Msg::CheckOutput => self.check_output(ctx),
            Msg::Start => {
                for (framework, task, process) in std::mem::take(&mut self.recovered) {
                    self.watch(framework, task, process, ctx);
                }
                // Re-attached tasks included: the first check rotates what grew meanwhile.
                self.schedule_output_check(ctx);
                self.keep_alive(ctx).await;
                let delay = backoff::initial_delay(
                    self.config.registration_backoff_initial,
                    fastrand::f64(),
                );
                tracing::info!(
                    agent = %self.info.address,
                    id = self.agent_id.as_deref().unwrap_or("(none yet)"),
                    ?delay,
                    "looking for the leading master"
                );
                self.schedule_round(ctx, delay);
            }
            Msg::Round { generation } => {
                if generation == self.generation && matches!(self.connection, Connection::Waiting) {
                    self.begin_round(ctx);
                }
            }
            Msg::Replied {
                generation,
                master,
                result,
            } => {
                if generation == self.generation
                    && matches!(self.connection, Connection::Trying { .. })
                {
                    self.on_reply(ctx, master, result).await;
                }
            }
            Msg::CheckSilence { generation } => {
                if generation == self.generation {
                    self.check_silence(ctx);
                }
            }
            Msg::SendHeartbeat { generation } => {
                if generation == self.generation {
                    self.send_heartbeat(ctx);
                }
            }
            Msg::TaskExited { task_id, ended } => self.task_exited(&task_id, ended, ctx).await,
            Msg::TaskHealth {
                task_id,
                run,
                health,
                why,
            } => self.task_health(&task_id, run, health, why),
            Msg::RestartTask { task_id, run } => self.restart_task(&task_id, run, ctx).await,
            Msg::RunTooLong { task_id, run } => self.run_too_long(&task_id, run),
            Msg::Alive => self.keep_alive(ctx).await,
            Msg::LeaderAnnounced(announcement) => self.on_announcement(&announcement, ctx),
            Msg::AgentId(reply) => reply.send(self.agent_id.clone()),
            Msg::Snapshot(reply) => reply.send(self.snapshot()),
            Msg::Figures(reply) => reply.send(self.figures()),
        }
    }

    fn exited(&mut self, who: ProcessRef, reason: ExitReason, ctx: &mut Context<Self>) {
        if let ProcessRef::Remote(upid) = &who {
            self.linked.remove(upid);
            if self.reads_tasks_sharing_labels.as_ref() == Some(upid) {
                self.reads_tasks_sharing_labels = None;
            }
        }
        let Connection::Registered { master } = &self.connection else {
            return;
        };
        if who == ProcessRef::Remote(master.clone()) {
            tracing::warn!(%master, %reason, "lost the master; re-registering");
            self.lose_master(ctx);
        }
    }

    fn stopped(&mut self, reason: &ExitReason) {
        let kill = self.config.stop_tasks_on_exit;
        let stopped = self.tasks.stop_all(kill);
        if kill {
            // Their processes are SIGKILLed; their cgroups go once empty.
            self.runner.sweep(&HashSet::new());
            // Synchronously: the agent is going away, and a restart must find them ended.
            for (framework, task) in &stopped {
                if let Err(error) = store::write_checkpoint(&self.config.data_dir, framework, task)
                {
                    tracing::warn!(task = %task.id, %error, "cannot checkpoint a killed task");
                }
            }
        } else if !stopped.is_empty() {
            tracing::info!(
                tasks = stopped.len(),
                "the tasks keep running, for the agent's next run to take back"
            );
        }
        tracing::info!(agent = %self.info.address, %reason, "agent stopped");
        self.runner.release();
        self.status.send_replace(AgentStatus::Stopped);
    }
}

/// What the agent counts for its metrics, beside what its state already says.
#[derive(Debug, Default)]
struct Counts {
    /// Heartbeats sent.
    heartbeats_sent: u64,
    /// Admissions under the id the agent already had.
    reregistrations: u64,
    /// Tasks it was asked to run, started or not.
    launches: u64,
    /// Of those, the ones that did not start.
    launch_failures: u64,
}

/// How often a running agent records that it is alive, at most.
const ALIVE_INTERVAL: Duration = Duration::from_secs(30);

impl Agent {
    /// Records that the agent is alive, and does it again after a while: a quarter of the
    /// recovery timeout, at most [`ALIVE_INTERVAL`].
    async fn keep_alive(&mut self, ctx: &mut Context<Self>) {
        let data_dir = self.config.data_dir.clone();
        let touched = blocking(move || {
            store::touch_alive(&data_dir).map_err(|source| crate::AgentError::StateFile {
                path: data_dir.join("meta"),
                source,
            })
        })
        .await;
        if let Err(error) = touched {
            tracing::warn!(%error, "cannot record that the agent is alive");
        }
        let every = (self.config.recovery_timeout / 4).min(ALIVE_INTERVAL);
        ctx.delay(every, AgentMsg(Msg::Alive));
    }

    /// What the agent knows now.
    fn snapshot(&self) -> AgentSnapshot {
        AgentSnapshot {
            agent_id: self.agent_id.clone(),
            status: self.status.borrow().clone(),
            info: self.info.clone(),
            frameworks: self.tasks.frameworks(),
            tasks: self.tasks.running(),
            completed_frameworks: self.tasks.completed_frameworks(),
            completed_tasks: self.tasks.completed(),
            term: self.term,
            stale_commands_refused: self.stale_commands_refused,
        }
    }

    /// What the agent counts now, for its metrics.
    fn figures(&self) -> AgentFigures {
        AgentFigures {
            registered: matches!(self.connection, master_link::Connection::Registered { .. }),
            term: self.term,
            stale_commands_refused: self.stale_commands_refused,
            heartbeats_sent: self.counts.heartbeats_sent,
            reregistrations: self.counts.reregistrations,
            launches: self.counts.launches,
            launch_failures: self.counts.launch_failures,
            running: self.tasks.running_for_metrics(),
            completed: self.tasks.completed_by_state(),
        }
    }
}

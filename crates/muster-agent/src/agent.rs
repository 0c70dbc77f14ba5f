//! The [`Agent`] process: finds the leading master and registers with it, heartbeats to it
//! within the TTL it gives, re-registers with its full state when it loses the master (or the
//! master refuses a heartbeat), answers pings, runs tasks as child processes, stops them when
//! asked, and tells the master whenever a task changes state.

use std::collections::{HashSet, VecDeque};
use std::fmt;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use muster_actor::{
    AskError, Context, ExitReason, Node, Pid, Process, ProcessRef, RemoteError, Reply, TimerHandle,
    Upid,
};
use muster_proto::cluster::{
    AgentInfo, Framework, Heartbeat, HeartbeatReply, KillTask, KillTaskReply, LaunchTasks, Ping,
    Pong, RegisterAgent, RegistrationReply, ReregisterAgent, Resources, RunTask, RunTaskReply,
    Task, TaskState, TaskStatusUpdate, heartbeat_reply, registration_reply,
};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::store;
use crate::tasks::{KillRequest, Tasks};
use crate::{AgentConfig, AgentError, backoff};

/// How many `NotLeader` redirects one registration round follows before it gives up on them
/// (standbys that point at each other must not keep the agent busy forever).
const MAX_REDIRECTS: u32 = 8;

/// The shortest wait between two heartbeats, whatever TTL the master gives.
const MIN_HEARTBEAT_INTERVAL: Duration = Duration::from_millis(10);

/// Where the agent stands with the masters.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AgentStatus {
    /// Looking for the leading master: at start, or after losing the master.
    Registering,
    /// Registered with `master` under `agent_id`.
    Registered {
        /// The id the master gave the agent.
        agent_id: String,
        /// The master's process address, `master@host:port`.
        master: Upid,
    },
    /// The agent process has ended.
    Stopped,
}

/// What the agent knows, as of one moment: for tests and operators.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentSnapshot {
    /// The id the master gave the agent, once it has one.
    pub agent_id: Option<String>,
    /// Where the agent stands with the masters.
    pub status: AgentStatus,
    /// What the agent reports about itself.
    pub info: AgentInfo,
    /// Frameworks with running tasks.
    pub frameworks: Vec<Framework>,
    /// Running tasks.
    pub tasks: Vec<Task>,
    /// Frameworks whose tasks have all completed, oldest first.
    pub completed_frameworks: Vec<Framework>,
    /// Completed tasks, oldest first (at most the configured history).
    pub completed_tasks: Vec<Task>,
}

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

    /// A master's one-way request to run the tasks of one plan. Each task's start or refusal
    /// (FAILED, with the reason in its `message`) follows as a `TaskStatusUpdate`.
    pub fn launch_tasks(launch: LaunchTasks) -> Self {
        AgentMsg(Msg::LaunchTasks(launch))
    }

    /// A master's request to stop a running task (SIGTERM to its process group, SIGKILL after
    /// [`kill_grace`](AgentConfig::kill_grace)); answered at once, with an empty error if the
    /// task runs. Its end follows as a `TaskStatusUpdate` in state KILLED.
    pub fn kill_task(request: KillTask, reply: Reply<KillTaskReply>) -> Self {
        AgentMsg(Msg::KillTask(request, reply))
    }
}

impl fmt::Debug for AgentMsg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.0 {
            Msg::Ping(..) => "Ping",
            Msg::RunTask(..) => "RunTask",
            Msg::LaunchTasks(..) => "LaunchTasks",
            Msg::KillTask(..) => "KillTask",
            Msg::Start => "Start",
            Msg::Round { .. } => "Round",
            Msg::Replied { .. } => "Replied",
            Msg::CheckSilence { .. } => "CheckSilence",
            Msg::SendHeartbeat { .. } => "SendHeartbeat",
            Msg::TaskExited { .. } => "TaskExited",
            Msg::AgentId(_) => "AgentId",
            Msg::Snapshot(_) => "Snapshot",
        };
        f.debug_tuple("AgentMsg").field(&kind).finish()
    }
}

enum Msg {
    Ping(Ping, Reply<Pong>),
    RunTask(Box<RunTask>, Reply<RunTaskReply>),
    LaunchTasks(LaunchTasks),
    KillTask(KillTask, Reply<KillTaskReply>),
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
    /// A task's child process ended (or waiting for it failed).
    TaskExited {
        task_id: String,
        ended: Ended,
    },
    AgentId(Reply<Option<String>>),
    Snapshot(Reply<AgentSnapshot>),
}

/// Where the agent is in finding a master.
#[derive(Debug)]
enum Connection {
    /// Waiting for the delay before the next round.
    Waiting,
    /// A round is on: a request to one master is out, `queue` are the ones left to try.
    Trying {
        queue: VecDeque<Upid>,
        redirects: u32,
    },
    /// Registered with this master.
    Registered { master: Upid },
}

/// Whether the current master takes heartbeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Heartbeats {
    /// Not known yet: the first heartbeat is out.
    Unknown,
    /// It answers them with TTLs: its answers (within the master-silence timeout) say it is
    /// there.
    Active,
    /// It does not (a master from before heartbeats): its pings say it is there.
    Unsupported,
}

/// The agent process. Start it with [`start`]; it lives on the node's system, registered as
/// `agent`.
pub struct Agent {
    node: Node,
    config: AgentConfig,
    masters: Vec<Upid>,
    info: AgentInfo,
    agent_id: Option<String>,
    status: watch::Sender<AgentStatus>,
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
    /// The master to try first in the next round (one that refused a heartbeat: it leads, but
    /// wants the agent to re-register).
    preferred: Option<Upid>,
    /// Masters this process is linked to (until their link's loss is reported).
    linked: HashSet<Upid>,
    tasks: Tasks,
    /// Task status updates not yet sent to a master (the agent was not registered), oldest
    /// first, the latest per task only; bounded (see [`Agent::report`]).
    unsent_updates: VecDeque<Task>,
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

/// A handle to a started agent.
#[derive(Debug, Clone)]
pub struct AgentHandle {
    pid: Pid<Agent>,
    upid: Upid,
    status: watch::Receiver<AgentStatus>,
}

impl AgentHandle {
    /// The agent process.
    pub fn pid(&self) -> &Pid<Agent> {
        &self.pid
    }

    /// The agent's process address, `agent@host:port`.
    pub fn upid(&self) -> &Upid {
        &self.upid
    }

    /// The id the master gave the agent, once it has one.
    ///
    /// # Errors
    /// [`AgentError::Stopped`] if the agent process has ended.
    pub async fn agent_id(&self) -> Result<Option<String>, AgentError> {
        self.pid
            .ask(|reply| AgentMsg(Msg::AgentId(reply)))
            .await
            .map_err(|_| AgentError::Stopped)
    }

    /// Where the agent stands with the masters, as a watch: `borrow()` for now,
    /// `wait_for(..)` to wait for a state.
    pub fn status(&self) -> watch::Receiver<AgentStatus> {
        self.status.clone()
    }

    /// Waits until the agent is registered with a master (returns at once if it is) and
    /// returns its id and the master's address.
    ///
    /// # Errors
    /// [`AgentError::Stopped`] if the agent process ends first.
    pub async fn registered(&self) -> Result<(String, Upid), AgentError> {
        let mut status = self.status.clone();
        let seen = status
            .wait_for(|s| matches!(s, AgentStatus::Registered { .. } | AgentStatus::Stopped))
            .await
            .map_err(|_| AgentError::Stopped)?;
        match &*seen {
            AgentStatus::Registered { agent_id, master } => Ok((agent_id.clone(), master.clone())),
            _ => Err(AgentError::Stopped),
        }
    }

    /// What the agent knows now.
    ///
    /// # Errors
    /// [`AgentError::Stopped`] if the agent process has ended.
    pub async fn snapshot(&self) -> Result<AgentSnapshot, AgentError> {
        self.pid
            .ask(|reply| AgentMsg(Msg::Snapshot(reply)))
            .await
            .map_err(|_| AgentError::Stopped)
    }

    /// Stops the agent process (which kills the tasks' child processes) and waits for it to
    /// end.
    pub async fn stop(&self) -> ExitReason {
        self.pid.terminate();
        self.pid.wait().await
    }
}

/// Starts an agent on `node`: checks the data directory, reads the stored id and task
/// checkpoints, spawns the [`Agent`] process on the node's system, registers it as `agent` with
/// the asks `Ping -> Pong`, `RunTask -> RunTaskReply` and `KillTask -> KillTaskReply` and the
/// tell `LaunchTasks`, and lets
/// it look for the leading master (after a random delay below
/// [`registration_backoff_initial`](AgentConfig::registration_backoff_initial)).
///
/// Whenever a task changes state (RUNNING once its process started; FINISHED, FAILED or
/// KILLED when it ended) the agent tells the master it is registered with a
/// `TaskStatusUpdate`; updates that find it unregistered are sent after the next successful
/// (re-)registration, the latest per task only.
///
/// An agent with a stored id re-registers under it with its full state; one without registers
/// anew and stores the id the master gives it.
///
/// After every (re-)registration the agent sends the master a `Heartbeat` at once and then
/// again at half of each TTL the master answers with. A refused heartbeat makes it re-register
/// (that master first); `NotLeader`, a failed heartbeat, or one unanswered for
/// [`master_silence_timeout`](AgentConfig::master_silence_timeout) with no ping meanwhile
/// counts the master as lost. A master that does not take heartbeats is watched by its pings.
///
/// # Errors
/// [`AgentError::InvalidConfig`], [`AgentError::DataDir`] if the data directory cannot be
/// created or written, [`AgentError::StateFile`]/[`AgentError::InvalidStoredId`] for a stored id
/// that cannot be read, [`AgentError::Node`] if a process named `agent` is already registered on
/// the node.
pub async fn start(node: &Node, config: AgentConfig) -> Result<AgentHandle, AgentError> {
    config.validate()?;
    let masters = config.master_upids()?;
    let upid = Upid::new("agent", node.address())
        .map_err(|e| AgentError::Node(muster_actor::NodeError::InvalidName(e)))?;

    let data_dir = config.data_dir.clone();
    let (agent_id, checkpoints) = blocking(move || {
        store::check_data_dir(&data_dir)?;
        Ok((
            store::read_agent_id(&data_dir)?,
            store::read_checkpoints(&data_dir)?,
        ))
    })
    .await?;

    let mut tasks = Tasks::new(config.completed_task_history);
    let recovered = checkpoints.len();
    let (changed, evicted) = tasks.recover(checkpoints);
    if recovered > 0 {
        tracing::info!(
            tasks = recovered,
            lost = changed.len(),
            "recovered task checkpoints of an earlier run"
        );
    }
    let data_dir = config.data_dir.clone();
    blocking(move || {
        for (framework, task) in &changed {
            store::write_checkpoint(&data_dir, framework, task).map_err(|source| {
                AgentError::StateFile {
                    path: data_dir.join("meta"),
                    source,
                }
            })?;
        }
        for id in &evicted {
            if let Err(error) = store::remove_checkpoint(&data_dir, id) {
                tracing::warn!(task = %id, %error, "cannot remove an old task checkpoint");
            }
        }
        Ok(())
    })
    .await?;

    let (cpus, mem_mb) = config.resources;
    let info = AgentInfo {
        hostname: config.hostname.clone(),
        address: upid.to_string(),
        resources: Some(Resources { cpus, mem_mb }),
        attributes: config
            .attributes
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    };
    let (status_tx, status_rx) = watch::channel(AgentStatus::Registering);
    let agent = Agent {
        node: node.clone(),
        config,
        masters,
        info,
        agent_id,
        status: status_tx,
        generation: 0,
        connection: Connection::Waiting,
        failed_rounds: 0,
        lost: None,
        last_ping: Instant::now(),
        silence_timer: None,
        heartbeats: Heartbeats::Unknown,
        preferred: None,
        linked: HashSet::new(),
        tasks,
        unsent_updates: VecDeque::new(),
    };
    let pid = node.system().spawn(agent);
    match node.register("agent", &pid) {
        Ok(registration) => {
            registration
                .install_ask::<Ping, Pong>(AgentMsg::ping)
                .install_ask::<RunTask, RunTaskReply>(AgentMsg::run_task)
                .install::<LaunchTasks>(AgentMsg::launch_tasks)
                .install_ask::<KillTask, KillTaskReply>(AgentMsg::kill_task);
        }
        Err(e) => {
            pid.terminate();
            return Err(e.into());
        }
    }
    if pid.tell(AgentMsg(Msg::Start)).is_err() {
        return Err(AgentError::Stopped);
    }
    Ok(AgentHandle {
        pid,
        upid,
        status: status_rx,
    })
}

/// Runs blocking file work off the runtime's threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, AgentError> + Send + 'static,
) -> Result<T, AgentError> {
    tokio::task::spawn_blocking(work).await.unwrap_or_else(|e| {
        Err(AgentError::StateFile {
            path: PathBuf::new(),
            source: std::io::Error::other(format!("file work did not finish: {e}")),
        })
    })
}

impl Process for Agent {
    type Message = AgentMsg;

    async fn handle(&mut self, AgentMsg(msg): AgentMsg, ctx: &mut Context<Self>) {
        match msg {
            Msg::Ping(ping, reply) => self.on_ping(&ping, reply),
            Msg::RunTask(request, reply) => {
                let error = match self.run_task(*request, ctx).await {
                    Ok(()) => String::new(),
                    Err(error) => {
                        tracing::warn!(%error, "refused a task");
                        error
                    }
                };
                reply.send(RunTaskReply { error });
            }
            Msg::LaunchTasks(launch) => {
                for request in launch.tasks {
                    if let Err(error) = self.run_task(request, ctx).await {
                        tracing::warn!(%error, "refused a task");
                    }
                }
            }
            Msg::KillTask(request, reply) => {
                let error = self.kill_task(&request.task_id);
                if !error.is_empty() {
                    tracing::warn!(%error, "cannot kill a task");
                }
                reply.send(KillTaskReply { error });
            }
            Msg::Start => {
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
            Msg::TaskExited { task_id, ended } => self.task_exited(&task_id, ended).await,
            Msg::AgentId(reply) => reply.send(self.agent_id.clone()),
            Msg::Snapshot(reply) => reply.send(self.snapshot()),
        }
    }

    fn exited(&mut self, who: ProcessRef, reason: ExitReason, ctx: &mut Context<Self>) {
        if let ProcessRef::Remote(upid) = &who {
            self.linked.remove(upid);
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
        tracing::info!(agent = %self.info.address, %reason, "agent stopped");
        self.tasks.kill_all();
        self.status.send_replace(AgentStatus::Stopped);
    }
}

impl Agent {
    fn snapshot(&self) -> AgentSnapshot {
        AgentSnapshot {
            agent_id: self.agent_id.clone(),
            status: self.status.borrow().clone(),
            info: self.info.clone(),
            frameworks: self.tasks.frameworks(),
            tasks: self.tasks.running(),
            completed_frameworks: self.tasks.completed_frameworks(),
            completed_tasks: self.tasks.completed(),
        }
    }

    /// Any ping while registered counts as the master being there: the address a master
    /// names itself by may differ from the one the agent reached it at (`localhost` against
    /// `127.0.0.1`), and strictness would make the agent re-register for nothing. A master that
    /// is really gone is noticed by its link.
    fn on_ping(&mut self, ping: &Ping, reply: Reply<Pong>) {
        if let Connection::Registered { master } = &self.connection {
            if !ping.master.is_empty() && ping.master != master.to_string() {
                tracing::debug!(from = %ping.master, %master, "ping from another master address");
            }
            self.last_ping = Instant::now();
        }
        reply.send(Pong {
            agent_id: self.agent_id.clone().unwrap_or_default(),
        });
    }

    // ---- finding a master -------------------------------------------------------------------

    /// Sends `Round` for the current generation after `delay`.
    fn schedule_round(&mut self, ctx: &mut Context<Self>, delay: std::time::Duration) {
        self.connection = Connection::Waiting;
        let generation = self.generation;
        ctx.delay(delay, AgentMsg(Msg::Round { generation }));
    }

    /// Starts a round over the configured masters, the one lost last at the end.
    fn begin_round(&mut self, ctx: &mut Context<Self>) {
        let mut queue: VecDeque<Upid> = self
            .masters
            .iter()
            .filter(|m| Some(*m) != self.lost.as_ref())
            .cloned()
            .collect();
        if let Some(lost) = &self.lost
            && self.masters.contains(lost)
        {
            queue.push_back(lost.clone());
        }
        if let Some(preferred) = self.preferred.take() {
            queue.retain(|m| *m != preferred);
            queue.push_front(preferred);
        }
        self.connection = Connection::Trying {
            queue,
            redirects: 0,
        };
        self.try_next(ctx);
    }

    /// Asks the next master of the round, or ends the round with a backoff if none is left.
    fn try_next(&mut self, ctx: &mut Context<Self>) {
        let Connection::Trying { queue, .. } = &mut self.connection else {
            return;
        };
        let Some(master) = queue.pop_front() else {
            self.round_failed(ctx, "no master accepted the agent");
            return;
        };
        let remote = self.node.remote(master.clone());
        let timeout = self.config.ask_timeout;
        let generation = self.generation;
        let reply_to = master.clone();
        let ask: std::pin::Pin<
            Box<dyn Future<Output = Result<RegistrationReply, AskError>> + Send>,
        > = match &self.agent_id {
            Some(agent_id) => {
                let request = self.reregister_request(agent_id);
                tracing::info!(
                    %master,
                    agent_id,
                    tasks = request.tasks.len(),
                    completed_tasks = request.completed_tasks.len(),
                    "re-registering"
                );
                Box::pin(async move {
                    remote
                        .ask_timeout::<ReregisterAgent, RegistrationReply>(timeout, request)
                        .await
                })
            }
            None => {
                tracing::info!(%master, "registering");
                let request = RegisterAgent {
                    info: Some(self.info.clone()),
                };
                Box::pin(async move {
                    remote
                        .ask_timeout::<RegisterAgent, RegistrationReply>(timeout, request)
                        .await
                })
            }
        };
        ctx.defer(ask, move |_agent: &mut Agent, ctx, result| {
            let _ = ctx.pid().tell(AgentMsg(Msg::Replied {
                generation,
                master: reply_to,
                result,
            }));
        });
    }

    fn reregister_request(&self, agent_id: &str) -> ReregisterAgent {
        ReregisterAgent {
            agent_id: agent_id.to_owned(),
            info: Some(self.info.clone()),
            frameworks: self.tasks.frameworks(),
            tasks: self.tasks.running(),
            completed_frameworks: self.tasks.completed_frameworks(),
            completed_tasks: self.tasks.completed(),
        }
    }

    /// No master took the agent this round: wait (capped exponential backoff with jitter)
    /// and try again.
    fn round_failed(&mut self, ctx: &mut Context<Self>, why: &str) {
        self.failed_rounds = self.failed_rounds.saturating_add(1);
        let delay = backoff::round_delay(
            self.config.registration_backoff_initial,
            self.config.registration_backoff_max,
            self.failed_rounds,
            fastrand::f64(),
        );
        tracing::warn!(
            rounds = self.failed_rounds,
            retry_in = ?delay,
            "{why}; trying again later"
        );
        self.schedule_round(ctx, delay);
    }

    async fn on_reply(
        &mut self,
        ctx: &mut Context<Self>,
        master: Upid,
        result: Result<RegistrationReply, AskError>,
    ) {
        let reply = match result {
            Ok(reply) => reply,
            Err(error) => {
                tracing::info!(%master, %error, "master did not answer; trying the next");
                self.try_next(ctx);
                return;
            }
        };
        match reply.result {
            Some(registration_reply::Result::AgentId(id)) if !id.is_empty() => {
                self.registered(ctx, master, id).await;
            }
            Some(registration_reply::Result::AgentId(_)) => {
                tracing::warn!(%master, "master admitted the agent under an empty id; trying the next");
                self.try_next(ctx);
            }
            Some(registration_reply::Result::NotLeader(hint)) => {
                self.follow(ctx, &master, &hint.leader)
            }
            Some(registration_reply::Result::Refused(reason)) => {
                tracing::warn!(%master, %reason, "master refused the registration");
                self.round_failed(ctx, &format!("{master} refused the agent: {reason}"));
            }
            None => {
                tracing::warn!(%master, "registration reply without a result; trying the next");
                self.try_next(ctx);
            }
        }
    }

    /// A standby answered `NotLeader`: go to the leader it names, or to the next master if it
    /// names none (or too many redirects happened this round).
    fn follow(&mut self, ctx: &mut Context<Self>, from: &Upid, leader: &str) {
        let Connection::Trying { queue, redirects } = &mut self.connection else {
            return;
        };
        if leader.is_empty() {
            tracing::info!(%from, "master is not the leader and knows no leader; trying the next");
        } else if *redirects >= MAX_REDIRECTS {
            tracing::warn!(%from, %leader, "too many redirects this round; trying the next master");
        } else {
            // A bare `host:port` is taken as that node's master process.
            let hint = leader
                .parse::<Upid>()
                .or_else(|_| Upid::new("master", leader));
            match hint {
                Ok(upid) if upid == *from => {
                    tracing::warn!(%from, "master says it is not the leader but names itself");
                }
                Ok(upid) => {
                    tracing::info!(%from, leader = %upid, "master is not the leader; following its hint");
                    *redirects += 1;
                    queue.retain(|m| *m != upid);
                    queue.push_front(upid);
                }
                Err(error) => {
                    tracing::warn!(%from, %leader, %error, "ignoring an unusable leader hint");
                }
            }
        }
        self.try_next(ctx);
    }

    /// A master admitted the agent: remember it, store a new id, link to it and watch for its
    /// pings.
    async fn registered(&mut self, ctx: &mut Context<Self>, master: Upid, id: String) {
        // One link per master: a link's notice comes once, and re-registering with a master
        // whose link still stands must not pile up watchers on it.
        if self.linked.insert(master.clone()) {
            ctx.link_remote(&self.node.remote(master.clone()));
        }
        self.connection = Connection::Registered {
            master: master.clone(),
        };
        self.failed_rounds = 0;
        self.lost = None;
        self.last_ping = Instant::now();
        self.heartbeats = Heartbeats::Unknown;
        self.arm_silence_timer(ctx, self.config.master_silence_timeout);

        if self.agent_id.as_deref() != Some(id.as_str()) {
            if let Some(old) = &self.agent_id {
                tracing::warn!(%master, old, new = %id, "master gave the agent a new id");
            }
            self.agent_id = Some(id.clone());
            let data_dir = self.config.data_dir.clone();
            let stored = id.clone();
            if let Err(error) = blocking(move || store::write_agent_id(&data_dir, &stored)).await {
                tracing::error!(%error, "cannot store the agent id; a restarted agent will register anew");
            }
        }
        tracing::info!(%master, agent_id = %id, "registered");
        self.status.send_replace(AgentStatus::Registered {
            agent_id: id,
            master,
        });
        self.send_updates();
        self.send_heartbeat(ctx);
    }

    // ---- heartbeats -------------------------------------------------------------------------

    /// Sends a heartbeat to the master the agent is registered with; the answer comes back as
    /// a continuation. It may wait up to the master-silence timeout.
    fn send_heartbeat(&mut self, ctx: &mut Context<Self>) {
        let (Connection::Registered { master }, Some(agent_id)) =
            (&self.connection, &self.agent_id)
        else {
            return;
        };
        let remote = self.node.remote(master.clone());
        let timeout = self.config.master_silence_timeout;
        let heartbeat = Heartbeat {
            agent_id: agent_id.clone(),
        };
        let generation = self.generation;
        ctx.defer(
            async move {
                remote
                    .ask_timeout::<Heartbeat, HeartbeatReply>(timeout, heartbeat)
                    .await
            },
            move |agent: &mut Agent, ctx, answered| {
                if generation == agent.generation {
                    agent.on_heartbeat_answer(ctx, answered);
                }
            },
        );
    }

    /// The master answered a heartbeat (or did not): heartbeat again at half the TTL it gave,
    /// re-register if it refused, look for the leader if it is no longer it or cannot be
    /// reached.
    fn on_heartbeat_answer(
        &mut self,
        ctx: &mut Context<Self>,
        answered: Result<HeartbeatReply, AskError>,
    ) {
        let Connection::Registered { master } = &self.connection else {
            return;
        };
        let master = master.clone();
        match answered.map(|reply| reply.result) {
            Ok(Some(heartbeat_reply::Result::TtlMs(ttl_ms))) => {
                if self.heartbeats != Heartbeats::Active {
                    tracing::debug!(%master, ttl_ms, "the master takes heartbeats");
                    self.heartbeats = Heartbeats::Active;
                    // From now on a heartbeat that stays unanswered says the master is gone;
                    // a long TTL must not look like silence.
                    if let Some(timer) = self.silence_timer.take() {
                        timer.cancel();
                    }
                }
                self.last_ping = Instant::now();
                let next = (Duration::from_millis(ttl_ms) / 2).max(MIN_HEARTBEAT_INTERVAL);
                let generation = self.generation;
                ctx.delay(next, AgentMsg(Msg::SendHeartbeat { generation }));
            }
            Ok(Some(heartbeat_reply::Result::Refused(reason))) => {
                tracing::warn!(%master, %reason, "master refused the heartbeat; re-registering");
                self.reregister_with(ctx, master);
            }
            Ok(Some(heartbeat_reply::Result::NotLeader(hint))) => {
                tracing::warn!(%master, leader = %hint.leader, "master no longer leads; re-registering");
                self.lose_master(ctx);
            }
            Ok(None) => {
                tracing::warn!(%master, "heartbeat reply without a result; re-registering");
                self.lose_master(ctx);
            }
            Err(AskError::Remote(RemoteError::UnknownType(_))) => {
                tracing::info!(%master, "master does not take heartbeats; going by its pings");
                self.heartbeats = Heartbeats::Unsupported;
            }
            Err(AskError::Timeout(waited)) if self.last_ping.elapsed() < waited => {
                // It still pings, so it is there: try again.
                tracing::debug!(%master, "heartbeat unanswered but the master pings; again");
                self.send_heartbeat(ctx);
            }
            Err(error) => {
                tracing::warn!(%master, %error, "heartbeat failed; counting the master as lost");
                self.lose_master(ctx);
            }
        }
    }

    /// The master leads but wants the agent to re-register: do so, with it first, after a
    /// short random delay (a master that lost many agents at once must not get them all
    /// back at once).
    fn reregister_with(&mut self, ctx: &mut Context<Self>, master: Upid) {
        self.generation += 1;
        if let Some(timer) = self.silence_timer.take() {
            timer.cancel();
        }
        self.failed_rounds = 0;
        self.lost = None;
        self.preferred = Some(master);
        self.status.send_replace(AgentStatus::Registering);
        let delay =
            backoff::initial_delay(self.config.registration_backoff_initial, fastrand::f64());
        self.schedule_round(ctx, delay);
    }

    // ---- task status updates ----------------------------------------------------------------

    /// Tells the master that `task` changed state (the task as the agent now has it), now if
    /// the agent is registered, else after its next registration. Kept updates are bounded:
    /// one per task, at most as many as the agent has running tasks plus completed history;
    /// beyond that the oldest go (the master rebuilds from the re-registration anyway).
    fn report(&mut self, task: Task) {
        self.unsent_updates.retain(|t| t.id != task.id);
        self.unsent_updates.push_back(task);
        let bound = self
            .tasks
            .running_count()
            .saturating_add(1)
            .saturating_add(self.config.completed_task_history);
        while self.unsent_updates.len() > bound {
            if let Some(dropped) = self.unsent_updates.pop_front() {
                tracing::debug!(task = %dropped.id, "dropping an old unsent task status update");
            }
        }
        self.send_updates();
    }

    /// Sends the kept task status updates to the master, if the agent is registered; an update
    /// that cannot be queued for the master stays for the next registration.
    fn send_updates(&mut self) {
        let (Connection::Registered { master }, Some(agent_id)) =
            (&self.connection, &self.agent_id)
        else {
            return;
        };
        if self.unsent_updates.is_empty() {
            return;
        }
        let remote = self.node.remote(master.clone());
        let mut kept = VecDeque::new();
        for task in self.unsent_updates.drain(..) {
            let update = TaskStatusUpdate {
                agent_id: agent_id.clone(),
                task: Some(task.clone()),
            };
            if let Err(error) = remote.tell(update) {
                tracing::warn!(%master, task = %task.id, %error, "cannot send a task status update; keeping it");
                kept.push_back(task);
            }
        }
        self.unsent_updates = kept;
    }

    fn arm_silence_timer(&mut self, ctx: &mut Context<Self>, after: std::time::Duration) {
        if let Some(timer) = self.silence_timer.take() {
            timer.cancel();
        }
        let generation = self.generation;
        self.silence_timer = Some(ctx.delay(after, AgentMsg(Msg::CheckSilence { generation })));
    }

    fn check_silence(&mut self, ctx: &mut Context<Self>) {
        let Connection::Registered { master } = &self.connection else {
            return;
        };
        if self.heartbeats == Heartbeats::Active {
            // Unanswered heartbeats are what count now.
            return;
        }
        let silent = self.last_ping.elapsed();
        let limit = self.config.master_silence_timeout;
        if silent >= limit {
            tracing::warn!(%master, ?silent, "no ping from the master; re-registering");
            self.lose_master(ctx);
        } else {
            self.arm_silence_timer(ctx, limit - silent);
        }
    }

    /// The master is gone (link lost, or silent): look for a master again, after a random
    /// delay so that the agents that lost it together do not all come back at once.
    fn lose_master(&mut self, ctx: &mut Context<Self>) {
        if let Connection::Registered { master } = &self.connection {
            self.lost = Some(master.clone());
        }
        self.generation += 1;
        if let Some(timer) = self.silence_timer.take() {
            timer.cancel();
        }
        self.failed_rounds = 0;
        self.status.send_replace(AgentStatus::Registering);
        let delay =
            backoff::initial_delay(self.config.registration_backoff_initial, fastrand::f64());
        self.schedule_round(ctx, delay);
    }

    // ---- tasks ------------------------------------------------------------------------------

    /// Starts a task's child process, or says why not. A refused task (one not already running
    /// under its id) is also reported FAILED, with the reason in its `message`, so the master
    /// hears of it whether it asked or told.
    async fn run_task(&mut self, request: RunTask, ctx: &mut Context<Self>) -> Result<(), String> {
        let refused = request.task.clone();
        let started = self.start_task(request, ctx).await;
        if let Err(error) = &started
            && let Some(mut task) = refused
            && !self.tasks.knows(&task.id)
        {
            task.state = TaskState::Failed as i32;
            task.exit_code = -1;
            task.message.clone_from(error);
            self.report(task);
        }
        started
    }

    /// Starts a task's child process (reporting STARTING, then RUNNING), or says why not.
    async fn start_task(
        &mut self,
        request: RunTask,
        ctx: &mut Context<Self>,
    ) -> Result<(), String> {
        let Some(mut task) = request.task else {
            return Err("the request carries no task".into());
        };
        store::check_task_id(&task.id)?;
        let id = task.id.clone();
        if self.tasks.knows(&id) {
            return Err(format!("task {id:?} already exists on this agent"));
        }
        let framework = self.framework_of(&mut task, request.framework)?;
        if task.command.trim().is_empty() {
            return Err(format!("task {id:?} has no command"));
        }
        // Accepted: STARTING until its process runs.
        task.state = TaskState::Starting as i32;
        self.report(task.clone());

        let dir = store::task_dir(&self.config.data_dir, &id);
        let (stdout, stderr) = open_sandbox(&dir).await.map_err(|e| {
            format!(
                "task {id:?}: cannot prepare working directory {}: {e}",
                dir.display()
            )
        })?;
        let mut command = tokio::process::Command::new(&task.command);
        command
            .args(&task.args)
            .envs(&task.env)
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            // Its own process group, so that what it starts ends with it.
            .process_group(0)
            .kill_on_drop(true);
        let child = match command.spawn() {
            Ok(child) => TaskProcess::new(child),
            Err(e) => {
                let _ = tokio::fs::remove_dir_all(&dir).await;
                return Err(format!(
                    "task {id:?}: cannot start command {:?}: {e}",
                    task.command
                ));
            }
        };
        task.state = TaskState::Running as i32;
        task.exit_code = 0;
        tracing::info!(task = %id, framework = %framework.id, pid = ?child.group, command = %task.command, "task running");

        let data_dir = self.config.data_dir.clone();
        let (checkpoint_framework, checkpoint_task) = (framework.clone(), task.clone());
        if let Err(error) = blocking(move || {
            store::write_checkpoint(&data_dir, &checkpoint_framework, &checkpoint_task).map_err(
                |source| AgentError::StateFile {
                    path: data_dir.join("meta"),
                    source,
                },
            )
        })
        .await
        {
            tracing::warn!(task = %id, %error, "cannot checkpoint the task");
        }

        let task_id = id.clone();
        let (kill, killed) = oneshot::channel();
        let waiter = ctx.defer(child.wait(killed), move |_agent: &mut Agent, ctx, ended| {
            let _ = ctx.pid().tell(AgentMsg(Msg::TaskExited { task_id, ended }));
        });
        self.report(task.clone());
        self.tasks
            .add_running(framework, task, Some(waiter), Some(kill));
        Ok(())
    }

    /// Starts stopping a running task; an empty string if it runs, else why not.
    fn kill_task(&mut self, task_id: &str) -> String {
        let grace = self.config.kill_grace;
        match self.tasks.kill(task_id, grace) {
            KillRequest::Stopping => {
                tracing::info!(task = %task_id, ?grace, "killing the task");
                String::new()
            }
            KillRequest::Ended(state) => format!(
                "task {task_id:?} has already ended ({})",
                state.as_str_name()
            ),
            KillRequest::Unknown => format!("no task {task_id:?} runs on this agent"),
        }
    }

    /// The framework a task belongs to: the request's, checked against the task's
    /// `framework_id` (filled in if empty), or the one the task names.
    fn framework_of(
        &self,
        task: &mut Task,
        framework: Option<Framework>,
    ) -> Result<Framework, String> {
        let id = &task.id;
        match framework.filter(|f| !f.id.is_empty()) {
            Some(framework) => {
                if task.framework_id.is_empty() {
                    task.framework_id = framework.id.clone();
                } else if task.framework_id != framework.id {
                    return Err(format!(
                        "task {id:?} names framework {:?} but the request is for framework {:?}",
                        task.framework_id, framework.id
                    ));
                }
                Ok(framework)
            }
            None if task.framework_id.is_empty() => Err(format!("task {id:?} names no framework")),
            None => Ok(self
                .tasks
                .framework(&task.framework_id)
                .cloned()
                .unwrap_or_else(|| Framework {
                    id: task.framework_id.clone(),
                    name: String::new(),
                })),
        }
    }

    async fn task_exited(&mut self, task_id: &str, ended: Ended) {
        let (state, exit_code) = match &ended.status {
            Ok(status) => {
                let code = exit_code(status);
                let state = if ended.killed {
                    TaskState::Killed
                } else if status.success() {
                    TaskState::Finished
                } else {
                    TaskState::Failed
                };
                (state, code)
            }
            Err(error) => {
                tracing::warn!(task = %task_id, %error, "cannot wait for the task's process");
                let state = if ended.killed {
                    TaskState::Killed
                } else {
                    TaskState::Failed
                };
                (state, -1)
            }
        };
        let Some(finished) = self.tasks.finish(task_id, state, exit_code) else {
            return;
        };
        tracing::info!(task = %task_id, state = ?state, exit_code, "task completed");
        self.report(finished.task.clone());
        let data_dir = self.config.data_dir.clone();
        let task_id = task_id.to_owned();
        let done = blocking(move || {
            for old in &finished.evicted {
                if let Err(error) = store::remove_checkpoint(&data_dir, old) {
                    tracing::warn!(task = %old, %error, "cannot remove an old task checkpoint");
                }
            }
            store::write_checkpoint(&data_dir, &finished.framework, &finished.task).map_err(
                |source| AgentError::StateFile {
                    path: data_dir.join("meta"),
                    source,
                },
            )
        })
        .await;
        if let Err(error) = done {
            tracing::warn!(task = %task_id, %error, "cannot checkpoint the completed task");
        }
    }
}

/// How a task's child process ended.
struct Ended {
    /// Its exit status, or why waiting for it failed.
    status: std::io::Result<ExitStatus>,
    /// True if it was asked to stop (and signalled) before it ended.
    killed: bool,
}

/// A task's child process, leader of its own process group. When the leader ends, or the
/// process is dropped before that (the agent stopped), the whole group is killed: a task's
/// processes do not outlive it.
struct TaskProcess {
    child: tokio::process::Child,
    /// The process group (the child's pid) while it may still have members to kill.
    group: Option<i32>,
}

impl TaskProcess {
    fn new(child: tokio::process::Child) -> Self {
        let group = child.id().and_then(|pid| i32::try_from(pid).ok());
        TaskProcess { child, group }
    }

    /// Waits for the leader, then kills whatever it left behind in its group. A grace period
    /// arriving on `kill` first stops the group: SIGTERM, then SIGKILL if the leader is still
    /// there when the grace period is over.
    ///
    /// The signals are sent from here, before the leader is reaped, so that the group id
    /// cannot have been reused by then.
    async fn wait(mut self, mut kill: oneshot::Receiver<Duration>) -> Ended {
        let grace = tokio::select! {
            biased;
            status = self.child.wait() => {
                self.kill_group();
                return Ended { status, killed: false };
            }
            Ok(grace) = &mut kill => grace,
        };
        self.signal_group(libc::SIGTERM);
        let status = match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => status,
            Err(_) => {
                tracing::info!(group = ?self.group, ?grace, "task still runs after its grace period; sending SIGKILL");
                self.signal_group(libc::SIGKILL);
                self.child.wait().await
            }
        };
        self.kill_group();
        Ended {
            status,
            killed: true,
        }
    }

    /// Sends `signal` to the group while it may still have members.
    fn signal_group(&self, signal: libc::c_int) {
        if let Some(group) = self.group {
            // SAFETY: killpg takes two integers and touches no memory of ours. The id cannot
            // name another group: before the leader is reaped its pid is not reused, and after
            // that (the one SIGKILL of `kill_group`) the group's remaining members keep it in
            // use; an empty group gives ESRCH, which there is nothing to do about.
            unsafe {
                libc::killpg(group, signal);
            }
        }
    }

    /// Kills the whole group, once: the leader has been reaped, or is about to be dropped.
    fn kill_group(&mut self) {
        self.signal_group(libc::SIGKILL);
        self.group = None;
    }
}

impl Drop for TaskProcess {
    fn drop(&mut self) {
        // Before the leader was reaped (the wait was cancelled: the agent stopped). The child
        // itself is also killed and reaped by tokio (`kill_on_drop`).
        self.kill_group();
    }
}

/// Creates a task's working directory with its `stdout` and `stderr` files.
async fn open_sandbox(dir: &std::path::Path) -> std::io::Result<(Stdio, Stdio)> {
    tokio::fs::create_dir_all(dir).await?;
    let stdout = tokio::fs::File::create(dir.join("stdout")).await?;
    let stderr = tokio::fs::File::create(dir.join("stderr")).await?;
    Ok((
        Stdio::from(stdout.into_std().await),
        Stdio::from(stderr.into_std().await),
    ))
}

/// The exit code, or 128 + the signal number for a process killed by a signal (as shells do).
fn exit_code(status: &ExitStatus) -> i32 {
    if let Some(code) = status.code() {
        return code;
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt as _;
        if let Some(signal) = status.signal() {
            return 128 + signal;
        }
    }
    -1
}

//! Starting an agent and talking to it from outside: [`start`] reads what an earlier run left
//! in the data directory, spawns the [`Agent`] process and registers it on the node;
//! [`AgentHandle`] asks it for its id or a [`AgentSnapshot`] and watches its [`AgentStatus`].

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use muster_actor::{ExitReason, Pid, Upid};
use muster_proto::cluster::{
    AgentLogLines, Framework, KillTask, KillTaskReply, LaunchTasks, LeaderAnnouncement, Ping, Pong,
    ReadAgentLog, ReadTaskOutput, RunTask, RunTaskReply, TaskOutputChunk,
};
use muster_proto::model::{AgentInfo, Resources, Task};
use muster_transport::Node;
use tokio::sync::watch;
use tokio::time::Instant;

use super::master_link::{Connection, Heartbeats};
use super::{Agent, AgentMsg, Msg, recovery};
use crate::metrics::AgentFigures;
use crate::process_runner::ProcessRunner;
use crate::runner::TaskRunner;
use crate::store::{self, blocking};
use crate::task_user::TaskUsers;
use crate::tasks::Tasks;
use crate::{AgentConfig, AgentError};

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
    /// The highest leader term the agent follows: it refuses commands of lower terms.
    pub term: u64,
    /// Commands refused because they came from an older leader term.
    pub stale_commands_refused: u64,
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

    /// Keeps `serving` true while the agent is registered with a master, false otherwise (the
    /// gRPC health service of the agent's node follows it: see
    /// [`muster_transport::health`]). Ends when the agent stops.
    pub fn report_registered(&self, serving: watch::Sender<bool>) {
        let mut status = self.status.clone();
        tokio::spawn(async move {
            loop {
                let registered =
                    matches!(*status.borrow_and_update(), AgentStatus::Registered { .. });
                serving.send_if_modified(|now| {
                    let changed = *now != registered;
                    *now = registered;
                    changed
                });
                if status.changed().await.is_err() {
                    serving.send_replace(false);
                    return;
                }
            }
        });
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

    /// What the agent counts now, for its metrics: its link to the masters, its launches, its
    /// running tasks (with where to read their usage: see [`crate::metrics::sample_usage`])
    /// and its completed history by state.
    ///
    /// # Errors
    /// [`AgentError::Stopped`] if the agent process has ended.
    pub async fn figures(&self) -> Result<AgentFigures, AgentError> {
        self.pid
            .ask(AgentMsg::figures)
            .await
            .map_err(|_| AgentError::Stopped)
    }

    /// Stops the agent process and waits for it to end. Its tasks are killed with it if its
    /// config says [`stop_tasks_on_exit`](AgentConfig::stop_tasks_on_exit), else they keep
    /// running for its next run to take back.
    pub async fn stop(&self) -> ExitReason {
        self.pid.terminate();
        self.pid.wait().await
    }
}

/// Starts an agent on `node`: checks the data directory, reads the stored id and task
/// checkpoints, spawns the [`Agent`] process on the node's system, registers it as `agent` with
/// the asks `Ping -> Pong`, `RunTask -> RunTaskReply`, `KillTask -> KillTaskReply` and
/// `ReadTaskOutput -> TaskOutputChunk` and the tell `LaunchTasks`, and lets
/// it look for the leading master (after a random delay below
/// [`registration_backoff_initial`](AgentConfig::registration_backoff_initial)).
///
/// Each task's executor keeps the task's output files within
/// [`task_output_max_bytes`](AgentConfig::task_output_max_bytes) and
/// [`task_output_files`](AgentConfig::task_output_files) as it writes them, whether the agent
/// runs or not. Every [`task_output_check_interval`](AgentConfig::task_output_check_interval)
/// the agent rotates, off its own thread, the files past that size of the running tasks whose
/// executors an agent from before this rule started (see `crate::output`).
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
#[inline(never)]
pub fn start<'a>(
    node: &'a Node,
    config: AgentConfig,
) -> Pin<Box<dyn Future<Output = Result<AgentHandle, AgentError>> + Send + 'a>> {
    // A plain function that boxes the start: the whole start-up, and every future it awaits, is
    // compiled here once rather than again in each crate that awaits it (an `async fn` is
    // compiled where it is first polled, and release builds share no generic code).
    Box::pin(start_here(node, config))
}

async fn start_here(node: &Node, config: AgentConfig) -> Result<AgentHandle, AgentError> {
    config.validate()?;
    let masters = config.master_upids()?;
    let upid = Upid::new("agent", node.address())
        .map_err(|e| AgentError::Node(muster_transport::NodeError::InvalidName(e)))?;

    let data_dir = config.data_dir.clone();
    let (agent_id, checkpoints, term, registration, learned_masters) = blocking(move || {
        store::check_data_dir(&data_dir)?;
        Ok((
            store::read_agent_id(&data_dir)?,
            store::read_checkpoints(&data_dir)?,
            store::read_term(&data_dir)?,
            store::read_registration(&data_dir)?,
            store::read_learned_masters(&data_dir),
        ))
    })
    .await?;

    // The one choice of runner: the config's, or the machine's processes.
    let runner: Arc<dyn TaskRunner> = match &config.task_runner {
        Some(custom) => {
            tracing::info!("tasks are run by the configured task runner, not as processes");
            custom.shared()
        }
        None => Arc::new(ProcessRunner::new(&config).await?),
    };
    let task_users = TaskUsers::new(
        config.task_user.clone(),
        config.allowed_task_users.clone(),
        runner.default_user(),
    );

    let checkpoints_found = checkpoints.len();
    let recovery = recovery::recover(&config, runner.as_ref(), checkpoints).await;
    let keep: HashSet<String> = recovery
        .running
        .iter()
        .map(|(_, task, _)| task.id.clone())
        .collect();
    let sweeper = Arc::clone(&runner);
    let swept = blocking(move || Ok(sweeper.sweep(&keep))).await?;
    if swept > 0 {
        tracing::info!(
            cgroups = swept,
            "removed task cgroups an earlier run left behind"
        );
    }
    let mut tasks = Tasks::new(config.completed_task_history);
    let mut evicted = Vec::new();
    for (framework, task) in recovery.completed {
        evicted.extend(tasks.add_completed(framework, task));
    }
    if checkpoints_found > 0 {
        tracing::info!(
            tasks = checkpoints_found,
            running = recovery.running.len(),
            ended = recovery.changed.len(),
            "took back the tasks of an earlier run"
        );
    }
    let data_dir = config.data_dir.clone();
    let changed = recovery.changed;
    blocking(move || {
        for (framework, task) in &changed {
            store::write_checkpoint(&data_dir, framework, task)
                .and_then(|()| store::executor_files(&data_dir, &task.id).remove())
                .map_err(|source| AgentError::StateFile {
                    path: store::checkpoint_dir(&data_dir),
                    source,
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
    let mut attributes: std::collections::HashMap<String, String> = config
        .attributes
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    attributes.insert(ISOLATION_ATTRIBUTE.into(), runner.isolation().into());
    let info = AgentInfo {
        hostname: config.hostname.clone(),
        address: upid.to_string(),
        resources: Some(Resources { cpus, mem_mb }),
        attributes,
        dynamic_ports: Some(config.dynamic_ports.into()),
    };
    let (status_tx, status_rx) = watch::channel(AgentStatus::Registering);
    let agent = Agent {
        node: node.clone(),
        config,
        runner,
        task_users,
        masters: super::master_link::with_learned(&masters, &learned_masters),
        configured_masters: masters,
        learned_masters,
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
        heartbeat_ttl: None,
        preferred: None,
        linked: HashSet::new(),
        reads_tasks_sharing_labels: None,
        tasks,
        recovered: recovery.running,
        term,
        registration,
        probe: None,
        stale_commands_refused: 0,
        counts: super::Counts::default(),
        rebase_term: false,
        unsent_updates: VecDeque::new(),
        log_sessions: super::log_sessions::LogSessions::new(muster_launch::monitor::tap().cloned()),
    };
    let pid = node.system().spawn(agent);
    const MASTERS: &[muster_security::Role] = &[muster_security::Role::Master];
    match node.register("agent", &pid) {
        Ok(registration) => {
            // Launches, kills, pings and output reads come from masters only.
            registration
                .install_ask_from::<Ping, Pong>(MASTERS, |m, r, _| AgentMsg::ping(m, r))
                .install_ask_from::<RunTask, RunTaskReply>(MASTERS, |m, r, _| {
                    AgentMsg::run_task(m, r)
                })
                .install_from::<LaunchTasks>(MASTERS, |m, _| AgentMsg::launch_tasks(m))
                .install_from::<LeaderAnnouncement>(MASTERS, |m, _| AgentMsg::leader_announced(m))
                .install_ask_from::<KillTask, KillTaskReply>(MASTERS, |m, r, _| {
                    AgentMsg::kill_task(m, r)
                })
                .install_ask_from::<ReadTaskOutput, TaskOutputChunk>(MASTERS, |m, r, _| {
                    AgentMsg::read_task_output(m, r)
                })
                .install_ask_from::<ReadAgentLog, AgentLogLines>(MASTERS, |m, r, _| {
                    AgentMsg::read_log(m, r)
                });
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

/// The attribute an agent reports its task isolation in, as its runner says
/// ([`TaskRunner::isolation`]): `cgroup-v2`, `cgroup-v1`, `process-group`, or `none` for tasks
/// that are no processes of this machine; as Nomad reports its drivers.
pub const ISOLATION_ATTRIBUTE: &str = "muster.isolation";

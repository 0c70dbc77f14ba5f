//! What runs a task: the one [`TaskRunner`] an agent holds. By default that is this machine's
//! processes (each task a child process under its executor, see `crate::process_runner`); in a
//! deterministic simulation, the runner the test gives the agent
//! ([`AgentConfig::task_runner`](crate::AgentConfig::task_runner)), such as
//! [`SimulatedTasks`](crate::simulated::SimulatedTasks).
//!
//! Everything else about a task is the agent's own, the same code whatever runs it: checking the
//! request and whom it may run as, checkpoints, states and their reports, kills and their grace
//! periods, fencing, and recovery after a restart. The agent asks its runner to admit a task,
//! to start it, to find one an earlier run of the agent started, and how it ended; and to look
//! after what its tasks leave on the machine (cgroups, output files). The trait mirrors what
//! the process runner does: [`TaskRunner::start`] is its spawn, [`RunnerTask::wait`] its wait
//! (with the [`Stop`] that sends the task's kill signal, then SIGKILL), [`RunnerTask::kill_switch`] its SIGKILL to
//! every process, and [`TaskRunner::reattach`] with [`Reattached`] its re-attach.
//!
//! A runner other than the processes touches none of the machine's processes: no fork, no
//! signals, no pidfds, no `/proc`, no cgroups (its isolation is `none`), no user database; the
//! agent's own files (id, checkpoints, term) stay in its data directory.

use std::collections::HashSet;
use std::error::Error;
use std::fmt;
use std::future::Future;
use std::io;
use std::os::unix::process::ExitStatusExt as _;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use muster_proto::model::Task;
use tokio::sync::oneshot;

use crate::AgentError;
use crate::metrics::CgroupPaths;

/// A boxed future, as runners return them.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The agent asks a running task to stop: what a `KillTask` (or the agent itself) asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stop {
    /// How long the task has between its kill signal and SIGKILL; zero sends SIGKILL at once.
    pub grace: Duration,
    /// The signal that asks it to stop (`libc::SIGTERM` unless its group names another).
    pub signal: i32,
    /// The raft term of the leader whose command stops it (the term the agent follows as it
    /// obeys); `None` when the agent stops it on its own: it could not checkpoint the task it
    /// just started, or it was down longer than its recovery timeout.
    pub term: Option<u64>,
}

/// How a runner's task ended: what the agent turns into its final state and exit code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskEnd {
    /// Its wait status, as a process's would be; or why it is not known (the task FAILED, or
    /// was KILLED, with this as its message).
    pub status: Result<ExitStatus, String>,
    /// Whether it ended because the agent stopped it (the task was KILLED).
    pub killed: bool,
    /// Whether it was killed for going past its memory limit (the task FAILED "out of
    /// memory").
    pub out_of_memory: bool,
}

impl TaskEnd {
    /// It exited by itself with exit code `code` (0 to 255).
    pub fn exited(code: u8) -> Self {
        TaskEnd {
            status: Ok(ExitStatus::from_raw(i32::from(code) << 8)),
            killed: false,
            out_of_memory: false,
        }
    }

    /// Signal `signal` ended it; `killed` if the agent sent it.
    pub fn signalled(signal: i32, killed: bool) -> Self {
        TaskEnd {
            status: Ok(ExitStatus::from_raw(signal & 0x7f)),
            killed,
            out_of_memory: false,
        }
    }
}

/// Ends a runner's task at once, without waiting for it, as SIGKILL to every process of a
/// task does: what an agent that stops does to its running tasks when its config says
/// [`stop_tasks_on_exit`](crate::AgentConfig::stop_tasks_on_exit). Clones end the same task.
#[derive(Clone)]
pub struct KillSwitch(Arc<dyn Fn() + Send + Sync>);

impl KillSwitch {
    /// A switch that runs `kill` when pulled (possibly more than once: it must not mind).
    pub fn new(kill: impl Fn() + Send + Sync + 'static) -> Self {
        KillSwitch(Arc::new(kill))
    }

    /// Ends the task now.
    pub fn pull(&self) {
        (self.0)();
    }
}

impl fmt::Debug for KillSwitch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KillSwitch")
    }
}

/// A task a [`TaskRunner`] runs, as the agent holds it while it runs.
pub trait RunnerTask: Send + Sync + fmt::Debug {
    /// Its process on this machine (the leader of its process group), if it is one: for the
    /// agent's logs and metrics. `None` (the default) for a task that is no process.
    fn pid(&self) -> Option<i32> {
        None
    }

    /// The user id its processes run as, if it is a process of this machine: for the agent's
    /// logs. `None` (the default) where there is none, or it is not known.
    fn uid(&self) -> Option<u32> {
        None
    }

    /// Where its CPU and memory use is accounted (its cgroup), for the agent's metrics; `None`
    /// (the default) where nothing is.
    fn cgroup(&self) -> Option<CgroupPaths> {
        None
    }

    /// What ends it at once when the agent stops (see [`KillSwitch`]); asked for once, as the
    /// agent starts watching the task.
    fn kill_switch(&self) -> KillSwitch;

    /// Resolves when the task ends. A [`Stop`] arriving on `stop` stops it as the agent stops
    /// a process: SIGTERM, then SIGKILL once the grace period is over (at once for zero); the
    /// end then says `killed`. A `stop` whose sender is dropped asks nothing.
    ///
    /// Dropping the future (the agent stops, or its process is killed) leaves the task as it
    /// is: running, for the agent's next run to [`reattach`](TaskRunner::reattach).
    fn wait(self: Box<Self>, stop: oneshot::Receiver<Stop>) -> BoxFuture<'static, TaskEnd>;
}

/// Stops `task` at once (SIGKILL) and waits for its end: the agent gives it up on its own.
pub(crate) async fn kill_and_wait(task: Box<dyn RunnerTask>) -> TaskEnd {
    let (stop, stopped) = oneshot::channel();
    let _ = stop.send(Stop {
        grace: Duration::ZERO,
        signal: libc::SIGKILL,
        term: None,
    });
    task.wait(stopped).await
}

/// What a runner found of a task an earlier run of the agent started.
#[derive(Debug)]
pub enum Reattached {
    /// It still runs: the agent watches it again.
    Running(Box<dyn RunnerTask>),
    /// It ended while the agent was down, so.
    Ended(TaskEnd),
    /// Nothing of it is left and how it ended is not known (the task is LOST): why.
    Gone(String),
}

/// Why a runner cannot run a task: the task FAILED, with this (after the task's id) as its
/// message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// It cannot run as the user the agent's rule gives it, for this reason.
    #[error(transparent)]
    User(Box<dyn Error + Send + Sync>),
    /// Its working directory could not be made.
    #[error("cannot prepare working directory {}: {error}", dir.display())]
    WorkingDir {
        /// The directory.
        dir: PathBuf,
        /// What the operating system said.
        error: io::Error,
    },
    /// Its cgroup could not be made.
    #[error("cannot make its cgroup: {0}")]
    Cgroup(io::Error),
    /// Its command could not be started.
    #[error("cannot start command {command:?}: {reason}")]
    Command {
        /// The command.
        command: String,
        /// Why not.
        reason: Box<dyn Error + Send + Sync>,
    },
    /// What finds it again after a restart of the agent could not be written: it does not
    /// run.
    #[error("cannot checkpoint it: {0}")]
    Record(AgentError),
}

impl StartError {
    /// `command` could not be started, for `reason`.
    pub fn command(command: &str, reason: impl Into<Box<dyn Error + Send + Sync>>) -> Self {
        StartError::Command {
            command: command.to_owned(),
            reason: reason.into(),
        }
    }
}

/// Which part of a task's output the agent reads (the masters' `ReadTaskOutput`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutputRead {
    /// Its stderr if true, else its stdout.
    pub stderr: bool,
    /// The absolute offset to read from, across rotations.
    pub offset: u64,
    /// The most bytes to read.
    pub limit: u64,
}

/// A piece of a task's stdout or stderr.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputChunk {
    /// The bytes from `offset` on.
    pub data: Vec<u8>,
    /// The absolute offset of `data`'s first byte.
    pub offset: u64,
    /// Where a next read continues: `offset` + `data.len()`.
    pub next_offset: u64,
    /// The oldest byte still kept.
    pub first_offset: u64,
}

/// Why a task's output cannot be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutputError {
    /// The runner keeps no output files for its tasks.
    #[error("task {task_id:?} is run by the agent's task runner, which keeps no output files")]
    NotKept {
        /// The task.
        task_id: String,
    },
    /// The files could not be read.
    #[error("task {task_id:?}: cannot read its {stream}: {error}")]
    Read {
        /// The task.
        task_id: String,
        /// `stdout` or `stderr`.
        stream: &'static str,
        /// What went wrong.
        error: io::Error,
    },
}

/// Runs an agent's tasks. One runner serves every run of an agent (its tasks outlive a restart
/// of the agent, as processes under their executors do), so that the next run can
/// [`reattach`](TaskRunner::reattach) them.
///
/// Only [`start`](TaskRunner::start) and [`reattach`](TaskRunner::reattach) must be written:
/// the other methods' defaults are those of a runner that keeps nothing on the machine (no
/// cgroups, no users, no output files), as a simulation's.
pub trait TaskRunner: Send + Sync + fmt::Debug + 'static {
    /// How the runner bounds its tasks, as the agent reports it in its
    /// [`ISOLATION_ATTRIBUTE`](crate::ISOLATION_ATTRIBUTE): `cgroup-v2`, `cgroup-v1` or
    /// `process-group` for processes; `none` (the default) for tasks that are not processes of
    /// this machine.
    fn isolation(&self) -> &'static str {
        "none"
    }

    /// The user a task runs as when neither it nor the agent's config names one; `None` (the
    /// default): the runner chooses as it starts the task (see [`start`](TaskRunner::start)).
    fn default_user(&self) -> Option<&str> {
        None
    }

    /// Checks, before the agent accepts `task`, that it can run as `user` (the user the
    /// agent's rule gives it; `None` for the runner's default, see
    /// [`start`](TaskRunner::start)); the default admits it. A task refused here is not
    /// checkpointed: it FAILED before it was STARTING.
    ///
    /// # Errors
    /// Why `task` cannot run here.
    fn admit(&self, task: &Task, user: Option<&str>) -> Result<(), StartError> {
        let _ = (task, user);
        Ok(())
    }

    /// Starts `task` (its `command`, `args` and `env`) as `user`, which the agent admitted on
    /// the command of a leader of raft term `term` and checkpointed as STARTING; resolves to
    /// the running task, or why it could not start (the task FAILED, with that message).
    /// `user` is `None` when neither the task, the agent's config nor
    /// [`default_user`](TaskRunner::default_user) names one: the runner's choice (for
    /// processes: the agent's own user, or a uid of the task's own when the agent is root).
    fn start<'a>(
        &'a self,
        task: &'a Task,
        user: Option<&'a str>,
        term: u64,
    ) -> BoxFuture<'a, Result<Box<dyn RunnerTask>, StartError>>;

    /// Finds task `task_id`, which an earlier run of the agent started (its checkpoint says
    /// it was STARTING or RUNNING when that run ended).
    fn reattach<'a>(&'a self, task_id: &'a str) -> BoxFuture<'a, Reattached>;

    /// Task `task_id`, which an earlier run of the agent started, had ended by the time that
    /// run stopped (it was killed as the agent stopped): whatever of it is left on the machine
    /// goes. The default has nothing to do.
    fn clean_up<'a>(&'a self, task_id: &'a str) -> BoxFuture<'a, ()> {
        let _ = task_id;
        Box::pin(std::future::ready(()))
    }

    /// Removes what tasks of earlier runs of the agent left on the machine (their cgroups),
    /// but for the tasks of `keep` (those the agent took back); how many it removed. May
    /// block: the agent calls it off its own thread, or as it stops. The default removes
    /// nothing.
    fn sweep(&self, keep: &HashSet<String>) -> usize {
        let _ = keep;
        0
    }

    /// The agent stops: what the runner holds on the machine for the agent itself (its own
    /// cgroup directories) goes, unless tasks still use it. The default holds nothing.
    fn release(&self) {}

    /// How often the agent has the runner [`check_output`](TaskRunner::check_output) of its
    /// running tasks; `None` (the default): never, its tasks keep no output files.
    fn output_check_interval(&self) -> Option<Duration> {
        None
    }

    /// Keeps the output files of the `running` tasks within their bounds where nothing else
    /// does (rotating them), and says in the log what it did. Blocks: the agent calls it off
    /// its own thread, every [`output_check_interval`](TaskRunner::output_check_interval).
    fn check_output(&self, running: Vec<String>) {
        let _ = running;
    }

    /// Reads a piece of task `task_id`'s stdout or stderr (running, or ended and remembered by
    /// the agent), by absolute offset across rotations. Blocks: the agent calls it off its own
    /// thread.
    ///
    /// # Errors
    /// [`OutputError::NotKept`] (the default) for a runner that keeps no output files, else
    /// why the files could not be read.
    fn read_output(&self, task_id: &str, read: OutputRead) -> Result<OutputChunk, OutputError> {
        let _ = read;
        Err(OutputError::NotKept {
            task_id: task_id.to_owned(),
        })
    }
}

/// The [`TaskRunner`] an agent uses instead of processes, as its config holds it (configs
/// compare equal when they hold the same runner).
#[derive(Clone, Debug)]
pub struct CustomRunner(Arc<dyn TaskRunner>);

impl CustomRunner {
    /// Wraps `runner`.
    pub fn new(runner: impl TaskRunner) -> Self {
        CustomRunner(Arc::new(runner))
    }

    /// Wraps a runner already shared.
    pub fn from_arc(runner: Arc<dyn TaskRunner>) -> Self {
        CustomRunner(runner)
    }

    /// The runner.
    pub fn runner(&self) -> &dyn TaskRunner {
        self.0.as_ref()
    }

    /// The runner, shared: what the agent holds.
    pub fn shared(&self) -> Arc<dyn TaskRunner> {
        Arc::clone(&self.0)
    }
}

impl PartialEq for CustomRunner {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

//! What runs a task: by default a process of this machine under an executor
//! ([`crate::child_process`]); in a deterministic simulation, a [`TaskRunner`] the test gives
//! the agent ([`AgentConfig::task_runner`](crate::AgentConfig::task_runner)), such as
//! [`SimulatedTasks`](crate::simulated::SimulatedTasks).
//!
//! Everything else about a task is the agent's own, the same code for both: checking the
//! request, checkpoints, states and their reports, kills and their grace periods, fencing, and
//! recovery after a restart. The agent only asks the runner to start a task, to stop it, to
//! find one an earlier run of the agent started, and how it ended. The trait mirrors what the
//! process runner does: [`TaskRunner::start`] is its spawn, [`RunnerTask::wait`] its wait (with
//! the [`Stop`] that SIGTERMs, then SIGKILLs), [`RunnerTask::kill_switch`] its SIGKILL to every
//! process, and [`TaskRunner::reattach`] with [`Reattached`] its re-attach.
//!
//! With a runner the agent touches none of the machine's processes: no fork, no signals, no
//! pidfds, no `/proc`, no cgroups (its isolation is [`Isolation::None`](crate::Isolation::None)),
//! no user database; its own files (id, checkpoints, term) stay in its data directory.

use std::fmt;
use std::future::Future;
use std::io;
use std::os::unix::process::ExitStatusExt as _;
use std::pin::Pin;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use muster_proto::model::Task;
use tokio::sync::oneshot;

use crate::child_process::{Ended, Signaller, TaskProcess};

/// A boxed future, as runners return them.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// The agent asks a running task to stop: what a `KillTask` (or the agent itself) asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stop {
    /// How long the task has between SIGTERM and SIGKILL; zero sends SIGKILL at once.
    pub grace: Duration,
    /// The raft term of the leader whose command stops it (the term the agent follows as it
    /// obeys); `None` when the agent stops it on its own: it could not checkpoint the task it
    /// just started, or it was down longer than its recovery timeout.
    pub term: Option<u64>,
}

/// How a runner's task ended: what the agent turns into its final state and exit code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskEnd {
    /// Its wait status, as a process's would be; or why it is not known (the task FAILED).
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
    /// What ends it at once when the agent stops (see [`KillSwitch`]); asked for once, as the
    /// agent starts watching the task.
    fn kill_switch(&self) -> KillSwitch;

    /// Resolves when the task ends. A [`Stop`] arriving on `stop` stops it as the agent stops
    /// a process: SIGTERM, then SIGKILL once the grace period is over (at once for zero); the
    /// end then says `killed`. A `stop` whose sender is dropped asks nothing.
    ///
    /// Dropping the future (the agent stops, or its process is killed) leaves the task as it
    /// is: running, for the agent's next run to [`reattach`](TaskRunner::reattach).
    fn wait(self: Box<Self>, stop: oneshot::Receiver<Stop>) -> BoxFuture<TaskEnd>;
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

/// Runs an agent's tasks some other way than as processes of this machine. One runner serves
/// every run of an agent (its tasks outlive a restart of the agent, as processes under their
/// executors do), so that the next run can [`reattach`](TaskRunner::reattach) them.
pub trait TaskRunner: Send + Sync + fmt::Debug + 'static {
    /// Starts `task` (its `command`, `args` and `env`), which the agent accepted from a leader
    /// of raft term `term` and checkpointed as STARTING; or says why it could not (the task
    /// FAILED, with that message).
    ///
    /// # Errors
    /// Why the task could not start.
    fn start(&self, task: &Task, term: u64) -> Result<Box<dyn RunnerTask>, String>;

    /// Finds task `task_id`, which an earlier run of the agent started (its checkpoint says
    /// it was STARTING or RUNNING when that run ended).
    fn reattach(&self, task_id: &str) -> Reattached;
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
}

impl PartialEq for CustomRunner {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// A running task, whichever way it runs.
#[derive(Debug)]
pub(crate) enum Running {
    /// A process of this machine under its executor.
    Process(Box<TaskProcess>),
    /// A task of the configured [`TaskRunner`].
    Runner(Box<dyn RunnerTask>),
}

/// What ends a running task at once when the agent stops.
#[derive(Clone, Debug)]
pub(crate) enum Stopper {
    /// Signals to its processes.
    Process(Signaller),
    /// Its runner's switch.
    Runner(KillSwitch),
}

impl Stopper {
    /// The task's process and cgroup, where its usage can be read: none for a runner's task.
    pub(crate) fn usage_source(&self) -> (Option<i32>, Option<crate::metrics::CgroupPaths>) {
        match self {
            Stopper::Process(signaller) => (
                Some(signaller.pid()),
                signaller
                    .cgroup()
                    .map(crate::isolation::TaskCgroup::usage_paths),
            ),
            Stopper::Runner(_) => (None, None),
        }
    }

    /// Ends the task at once: SIGKILL to every process of it, or its runner's switch.
    pub(crate) fn kill_now(&self) {
        match self {
            Stopper::Process(signaller) => signaller.signal(libc::SIGKILL),
            Stopper::Runner(switch) => switch.pull(),
        }
    }
}

impl Running {
    /// What ends it at once when the agent stops.
    pub(crate) fn stopper(&self) -> Stopper {
        match self {
            Running::Process(process) => Stopper::Process(process.signaller()),
            Running::Runner(task) => Stopper::Runner(task.kill_switch()),
        }
    }

    /// The task's pid, if it is a process of this machine.
    pub(crate) fn pid(&self) -> Option<i32> {
        match self {
            Running::Process(process) => Some(process.pid()),
            Running::Runner(_) => None,
        }
    }

    /// Resolves when it ends; a [`Stop`] on `stop` stops it.
    pub(crate) fn wait(self, stop: oneshot::Receiver<Stop>) -> BoxFuture<Ended> {
        match self {
            Running::Process(process) => Box::pin(process.wait(stop)),
            Running::Runner(task) => {
                let ended = task.wait(stop);
                Box::pin(async move { ended_of(ended.await) })
            }
        }
    }

    /// Stops it at once (SIGKILL) and waits for its end: the agent gives it up on its own.
    pub(crate) async fn kill_and_wait(self) -> Ended {
        let (stop, stopped) = oneshot::channel();
        let _ = stop.send(Stop {
            grace: Duration::ZERO,
            term: None,
        });
        self.wait(stopped).await
    }
}

/// A runner's end as the agent records a process's.
pub(crate) fn ended_of(end: TaskEnd) -> Ended {
    Ended {
        status: end.status.map_err(io::Error::other),
        killed: end.killed,
        out_of_memory: end.out_of_memory,
    }
}

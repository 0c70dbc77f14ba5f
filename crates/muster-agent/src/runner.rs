//! What runs a task: by default a process of this machine under an executor
//! ([`crate::child_process`]); in a deterministic simulation, a [`TaskRunner`] the test gives
//! the agent ([`AgentConfig::task_runner`](crate::AgentConfig::task_runner)), such as
//! [`SimulatedTasks`](crate::simulated::SimulatedTasks).
//!
//! Everything else about a task is the agent's own, the same for both: checkpoints, states and
//! their reports, kills, fencing, and recovery after a restart. The agent only asks the runner
//! to start a task, to find one an earlier run of the agent started, and how it ended.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use muster_proto::model::Task;
use tokio::sync::oneshot;

use crate::child_process::{Ended, Signaller, TaskProcess};

/// A boxed future, as runners return them.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// How a runner's task ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskEnd {
    /// Its wait status, as a process's would be.
    pub status: ExitStatus,
    /// Whether it ended because the agent stopped it.
    pub killed: bool,
}

/// A task a [`TaskRunner`] runs.
pub trait RunnerTask: Send + Sync + fmt::Debug {
    /// Resolves when the task ends. A grace period arriving on `stop` stops it, as the agent
    /// stops a process: SIGTERM, then SIGKILL once the grace period is over (at once for zero).
    fn wait(self: Box<Self>, stop: oneshot::Receiver<Duration>) -> BoxFuture<TaskEnd>;
}

/// What a runner found of a task an earlier run of the agent started.
#[derive(Debug)]
pub enum Reattached {
    /// It still runs.
    Running(Box<dyn RunnerTask>),
    /// It ended meanwhile, with this status.
    Ended(ExitStatus),
    /// Nothing of it is left: why.
    Gone(String),
}

/// Runs an agent's tasks some other way than as processes of this machine.
pub trait TaskRunner: Send + Sync + fmt::Debug + 'static {
    /// Starts `task`, which a leader of raft term `term` launched; or says why not.
    ///
    /// # Errors
    /// Why the task could not start (reported as the task's failure).
    fn start(&self, task: &Task, term: u64) -> Result<Box<dyn RunnerTask>, String>;

    /// The task `task_id` an earlier run of the agent started with this runner.
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

impl Running {
    /// What reaches its processes, if it has any.
    pub(crate) fn signaller(&self) -> Option<Signaller> {
        match self {
            Running::Process(process) => Some(process.signaller()),
            Running::Runner(_) => None,
        }
    }

    /// Resolves when it ends; a grace period on `kill` stops it.
    pub(crate) fn wait(self, kill: oneshot::Receiver<Duration>) -> BoxFuture<Ended> {
        match self {
            Running::Process(process) => Box::pin(process.wait(kill)),
            Running::Runner(task) => {
                let ended = task.wait(kill);
                Box::pin(async move {
                    let end = ended.await;
                    Ended {
                        status: Ok(end.status),
                        killed: end.killed,
                        out_of_memory: false,
                    }
                })
            }
        }
    }
}

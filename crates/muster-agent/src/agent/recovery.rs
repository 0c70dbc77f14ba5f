//! Taking back what an earlier run of the agent left, before the agent registers: each task
//! its checkpoints name as started is re-attached if it still runs (what its
//! [`TaskRunner`] re-attaches), or recorded with its real exit status if it ended while the
//! agent was down, or LOST if nothing of it is left. An agent that was down longer than its
//! recovery timeout kills what it finds still running first: the cluster has replaced those
//! tasks by then. How long it was down is measured on the wall clock of
//! [`muster_model::clock`] (a simulation's, in a simulation).

use std::time::Duration;

use muster_proto::cluster::Framework;
use muster_proto::model::{Task, TaskState};

use super::task_lifecycle::final_state;
use crate::AgentConfig;
use crate::runner::{self, Reattached, RunnerTask, TaskRunner};
use crate::store::{self, Checkpoint};
use crate::tasks::is_terminal;

/// What the agent found of an earlier run's tasks.
#[derive(Debug, Default)]
pub(super) struct Recovery {
    /// Still running: re-attached, to watch once the agent process runs.
    pub(super) running: Vec<(Framework, Task, Box<dyn RunnerTask>)>,
    /// Completed (before, or found so now), oldest first.
    pub(super) completed: Vec<(Framework, Task)>,
    /// Of those, the ones whose state changed now: their checkpoints are rewritten.
    pub(super) changed: Vec<(Framework, Task)>,
}

/// Takes back the tasks of `checkpoints` (oldest first) from `runner`, as the module says.
pub(super) async fn recover(
    config: &AgentConfig,
    runner: &dyn TaskRunner,
    checkpoints: Vec<Checkpoint>,
) -> Recovery {
    let mut recovery = Recovery::default();
    if checkpoints.is_empty() {
        return recovery;
    }
    let down_for = store::last_alive_ms(&config.data_dir)
        .ok()
        .flatten()
        .and_then(|alive| muster_model::clock::unix_ms().checked_sub(alive))
        .map(Duration::from_millis);
    let expired = down_for.is_some_and(|down| down > config.recovery_timeout);
    if expired {
        tracing::warn!(
            down_for = ?down_for.unwrap_or_default(),
            recovery_timeout = ?config.recovery_timeout,
            "the agent was down longer than its recovery timeout: killing the tasks it left running"
        );
    }
    for Checkpoint {
        framework,
        mut task,
        ..
    } in checkpoints
    {
        if is_terminal(task.state) {
            // Killed as the agent stopped: what it left goes now.
            runner.clean_up(&task.id).await;
            recovery.completed.push((framework, task));
            continue;
        }
        let (state, exit_code, message) = match runner.reattach(&task.id).await {
            Reattached::Running(running) if expired => {
                let ended = runner::kill_and_wait(running).await;
                let (_, exit_code, _) = final_state(&ended);
                (
                    TaskState::Killed,
                    exit_code,
                    "the agent was down longer than its recovery timeout".to_owned(),
                )
            }
            Reattached::Running(running) => {
                match running.pid() {
                    Some(pid) => {
                        tracing::info!(task = %task.id, pid, "re-attached to a running task")
                    }
                    None => tracing::info!(task = %task.id, "re-attached to a running task"),
                }
                recovery.running.push((framework, task, running));
                continue;
            }
            Reattached::Ended(ended) => {
                let (state, exit_code, message) = final_state(&ended);
                let message = message.unwrap_or_else(|| "it ended while the agent was down".into());
                (state, exit_code, message)
            }
            Reattached::Gone(why) => (TaskState::Lost, -1, why),
        };
        tracing::info!(task = %task.id, ?state, exit_code, %message, "a task of the earlier run has ended");
        task.state = state as i32;
        task.exit_code = exit_code;
        task.message = message;
        recovery.changed.push((framework.clone(), task.clone()));
        recovery.completed.push((framework, task));
    }
    recovery
}

//! Taking back what an earlier run of the agent left, before the agent registers: each task
//! its checkpoints name as started is re-attached if its executor still runs, or recorded with
//! its real exit status if it ended while the agent was down, or LOST if nothing of it is
//! left. An agent that was down longer than its recovery timeout kills what it finds still
//! running first: the cluster has replaced those tasks by then.

use std::path::Path;
use std::time::{Duration, SystemTime};

use muster_proto::cluster::Framework;
use muster_proto::model::{Task, TaskState};
use tokio::sync::oneshot;

use super::task_lifecycle::final_state;
use crate::AgentConfig;
use crate::child_process::{Ended, Recovered, TaskProcess};
use crate::executor::{self, Files, Record};
use crate::isolation::{Isolation, TaskCgroup};
use crate::runner::{Reattached, Running};
use crate::store::{self, Checkpoint};
use crate::tasks::is_terminal;

/// What the agent found of an earlier run's tasks.
#[derive(Debug, Default)]
pub(super) struct Recovery {
    /// Still running: re-attached, to watch once the agent process runs.
    pub(super) running: Vec<(Framework, Task, Running)>,
    /// Completed (before, or found so now), oldest first.
    pub(super) completed: Vec<(Framework, Task)>,
    /// Of those, the ones whose state changed now: their checkpoints are rewritten.
    pub(super) changed: Vec<(Framework, Task)>,
}

/// Takes back the tasks of `checkpoints` (oldest first), as the module says.
pub(super) async fn recover(
    config: &AgentConfig,
    isolation: &Isolation,
    checkpoints: Vec<Checkpoint>,
) -> Recovery {
    let mut recovery = Recovery::default();
    if checkpoints.is_empty() {
        return recovery;
    }
    let boot_id = executor::boot_id().unwrap_or_default();
    let down_for = store::last_alive(&config.data_dir)
        .ok()
        .flatten()
        .and_then(|alive| SystemTime::now().duration_since(alive).ok());
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
        let files = store::executor_files(&config.data_dir, &task.id);
        if is_terminal(task.state) {
            // Killed as the agent stopped: what it left goes now.
            if let Ok(Some(record)) = Record::read(&files) {
                settle_leftovers(&record).await;
                if let Err(error) = files.remove() {
                    tracing::warn!(task = %task.id, %error, "cannot remove a task's executor files");
                }
            }
            recovery.completed.push((framework, task));
            continue;
        }
        if let Some(runner) = &config.task_runner {
            let (state, exit_code, message) = match runner.runner().reattach(&task.id) {
                Reattached::Running(running) if expired => {
                    let (kill, killed) = oneshot::channel();
                    let _ = kill.send(Duration::ZERO);
                    let ended = Running::Runner(running).wait(killed).await;
                    let (_, exit_code, _) = final_state(&ended);
                    (
                        TaskState::Killed,
                        exit_code,
                        "the agent was down longer than its recovery timeout".to_owned(),
                    )
                }
                Reattached::Running(running) => {
                    tracing::info!(task = %task.id, "re-attached to a running task");
                    recovery
                        .running
                        .push((framework, task, Running::Runner(running)));
                    continue;
                }
                Reattached::Ended(status) => {
                    let ended = Ended {
                        status: Ok(status),
                        killed: false,
                        out_of_memory: false,
                    };
                    let (state, exit_code, message) = final_state(&ended);
                    let message =
                        message.unwrap_or_else(|| "it ended while the agent was down".into());
                    (state, exit_code, message)
                }
                Reattached::Gone(why) => (TaskState::Lost, -1, why),
            };
            task.state = state as i32;
            task.exit_code = exit_code;
            task.message = message;
            recovery.changed.push((framework.clone(), task.clone()));
            recovery.completed.push((framework, task));
            continue;
        }
        let found = match Record::read(&files) {
            Ok(Some(record)) => Found::Record(
                TaskProcess::reattach(files.clone(), &record, &boot_id),
                Box::new(record),
            ),
            Ok(None) => Found::NoRecord,
            Err(e) => Found::Unreadable(e.to_string()),
        };
        let outcome = match found {
            Found::Record(Recovered::Running(process), _) if expired => {
                let (kill, killed) = oneshot::channel();
                let _ = kill.send(Duration::ZERO);
                let ended = process.wait(killed).await;
                let (_, exit_code, _) = final_state(&ended);
                (
                    TaskState::Killed,
                    exit_code,
                    "the agent was down longer than its recovery timeout".to_owned(),
                )
            }
            Found::Record(Recovered::Running(process), _) => {
                tracing::info!(task = %task.id, pid = process.pid(), "re-attached to a running task");
                recovery
                    .running
                    .push((framework, task, Running::Process(process)));
                continue;
            }
            Found::Record(Recovered::Ended(status), record) => {
                let out_of_memory = settle_leftovers(&record).await;
                let ended = Ended {
                    status: Ok(status),
                    killed: false,
                    out_of_memory,
                };
                let (state, exit_code, message) = final_state(&ended);
                let message = message.unwrap_or_else(|| "it ended while the agent was down".into());
                (state, exit_code, message)
            }
            Found::Record(Recovered::Gone(why), record) => {
                settle_leftovers(&record).await;
                (TaskState::Lost, -1, why)
            }
            Found::NoRecord => {
                abandon_start(isolation, &config.data_dir, &task.id, &files).await;
                (
                    TaskState::Lost,
                    -1,
                    "the agent stopped while it was starting the task".to_owned(),
                )
            }
            Found::Unreadable(why) => (
                TaskState::Lost,
                -1,
                format!("its executor record is unreadable: {why}"),
            ),
        };
        let (state, exit_code, message) = outcome;
        tracing::info!(task = %task.id, ?state, exit_code, %message, "a task of the earlier run has ended");
        task.state = state as i32;
        task.exit_code = exit_code;
        task.message = message;
        recovery.changed.push((framework.clone(), task.clone()));
        recovery.completed.push((framework, task));
    }
    recovery
}

/// What the files of a started task say.
enum Found {
    /// Its executor record, and what it led to.
    Record(Recovered, Box<Record>),
    /// No record: the agent stopped before it got there.
    NoRecord,
    /// A record that cannot be read, and why.
    Unreadable(String),
}

/// Kills what a task that ended (or vanished) while the agent was down left in its cgroup,
/// and removes the cgroup; whether the kernel killed a process of it for memory.
async fn settle_leftovers(record: &Record) -> bool {
    let Some(cgroup) = &record.cgroup else {
        return false;
    };
    let cgroup = TaskCgroup::from_record(cgroup);
    cgroup.kill_all().await;
    let out_of_memory = cgroup.oom_killed();
    cgroup.remove();
    out_of_memory
}

/// A task whose start the earlier run did not see through (no executor record): whatever of it
/// runs is killed. Its cgroup, if it has one, holds all of it; else its process group, if the
/// executor recorded its pid and that process still works in the task's directory.
async fn abandon_start(isolation: &Isolation, data_dir: &Path, task_id: &str, files: &Files) {
    if let Some(cgroup) = isolation.existing_for(task_id) {
        cgroup.kill_all().await;
        cgroup.remove();
    }
    if let Ok(Some(pid)) = files.read_task_pid() {
        let dir = store::task_dir(data_dir, task_id);
        let works_there = std::fs::read_link(format!("/proc/{pid}/cwd"))
            .is_ok_and(|cwd| std::fs::canonicalize(&dir).is_ok_and(|dir| dir == cwd));
        if works_there {
            // SAFETY: killpg takes two integers; the process was just seen working in the
            // task's own directory, so the group is the task's.
            unsafe {
                libc::killpg(pid, libc::SIGKILL);
            }
        }
    }
    if let Err(error) = files.remove() {
        tracing::warn!(task = %task_id, %error, "cannot remove a task's executor files");
    }
}

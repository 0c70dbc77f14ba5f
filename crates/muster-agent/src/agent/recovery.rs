//! Taking back what an earlier run of the agent left, before the agent registers: each task
//! its checkpoints name as started is re-attached if it still runs (its executor, or what the
//! configured [`TaskRunner`](crate::runner::TaskRunner) re-attaches), or recorded with its
//! real exit status if it ended while the agent was down, or LOST if nothing of it is left.
//! An agent that was down longer than its recovery timeout kills what it finds still running
//! first: the cluster has replaced those tasks by then. How long it was down is measured on
//! the wall clock of [`muster_model::clock`] (a simulation's, in a simulation).

use std::path::Path;
use std::time::Duration;

use muster_proto::cluster::Framework;
use muster_proto::model::{Task, TaskState};

use super::task_lifecycle::final_state;
use crate::AgentConfig;
use crate::child_process::{Ended, Recovered, TaskProcess};
use crate::executor::{self, Files, Record};
use crate::isolation::{Isolation, TaskCgroup};
use crate::runner::{Reattached, Running, ended_of};
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
    let runner = config.task_runner.as_ref();
    let boot_id = match runner {
        Some(_) => String::new(),
        None => executor::boot_id().unwrap_or_default(),
    };
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
        let files = store::executor_files(&config.data_dir, &task.id);
        if is_terminal(task.state) {
            // Killed as the agent stopped: what it left goes now.
            if runner.is_none()
                && let Ok(Some(record)) = Record::read(&files)
            {
                settle_leftovers(&record).await;
                if let Err(error) = files.remove() {
                    tracing::warn!(task = %task.id, %error, "cannot remove a task's executor files");
                }
            }
            recovery.completed.push((framework, task));
            continue;
        }
        let found = match runner {
            Some(runner) => match runner.runner().reattach(&task.id) {
                Reattached::Running(running) => Found::Running(Running::Runner(running)),
                Reattached::Ended(end) => Found::Ended(ended_of(end)),
                Reattached::Gone(why) => Found::Gone(why),
            },
            None => find_process(isolation, &config.data_dir, &task.id, files, &boot_id).await,
        };
        let (state, exit_code, message) = match found {
            Found::Running(running) if expired => {
                let ended = running.kill_and_wait().await;
                let (_, exit_code, _) = final_state(&ended);
                (
                    TaskState::Killed,
                    exit_code,
                    "the agent was down longer than its recovery timeout".to_owned(),
                )
            }
            Found::Running(running) => {
                match running.pid() {
                    Some(pid) => {
                        tracing::info!(task = %task.id, pid, "re-attached to a running task")
                    }
                    None => tracing::info!(task = %task.id, "re-attached to a running task"),
                }
                recovery.running.push((framework, task, running));
                continue;
            }
            Found::Ended(ended) => {
                let (state, exit_code, message) = final_state(&ended);
                let message = message.unwrap_or_else(|| "it ended while the agent was down".into());
                (state, exit_code, message)
            }
            Found::Gone(why) => (TaskState::Lost, -1, why),
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

/// What became of a task an earlier run started, whichever way it ran.
enum Found {
    /// It still runs: re-attached.
    Running(Running),
    /// It ended while the agent was down, so.
    Ended(Ended),
    /// Nothing of it is left, and how it ended is not known: why.
    Gone(String),
}

/// Finds task `task_id`'s process from its executor's files: still running under the same
/// executor, ended with the status its executor wrote (what it left in its cgroup is killed),
/// or gone (a start the earlier run did not see through is killed).
async fn find_process(
    isolation: &Isolation,
    data_dir: &Path,
    task_id: &str,
    files: Files,
    boot_id: &str,
) -> Found {
    let record = match Record::read(&files) {
        Ok(Some(record)) => record,
        Ok(None) => {
            return started_without_record(isolation, data_dir, task_id, files, boot_id).await;
        }
        Err(e) => return Found::Gone(format!("its executor record is unreadable: {e}")),
    };
    reattach(files, &record, boot_id).await
}

/// Re-attaches to the executor `record` names: running, or ended (what it left in its cgroup
/// is killed), or gone.
async fn reattach(files: Files, record: &Record, boot_id: &str) -> Found {
    match TaskProcess::reattach(files, record, boot_id) {
        Recovered::Running(process) => Found::Running(Running::Process(process)),
        Recovered::Ended(status) => {
            let out_of_memory = settle_leftovers(record).await;
            Found::Ended(Ended {
                status: Ok(status),
                killed: false,
                out_of_memory,
            })
        }
        Recovered::Gone(why) => {
            settle_leftovers(record).await;
            Found::Gone(why)
        }
    }
}

/// A task whose start the earlier run did not see through: the agent stopped between forking
/// its executor and writing the executor's record. If the executor had forked the task, the
/// task has run, or runs: the executor wrote its pid, and writes its wait status when it ends,
/// whatever became of the agent. Such a task is taken back (re-attached through a record
/// rebuilt from `/proc`: the executor is the task's parent) or reported with the status it
/// ended with, never as a task that did not start: its replacement would run it a second
/// time. Only a task its executor never forked is gone.
async fn started_without_record(
    isolation: &Isolation,
    data_dir: &Path,
    task_id: &str,
    files: Files,
    boot_id: &str,
) -> Found {
    if let Ok(Some(status)) = files.read_status() {
        let out_of_memory = match isolation.existing_for(task_id) {
            Some(cgroup) => settle_cgroup(&cgroup).await,
            None => false,
        };
        tracing::info!(task = %task_id, "a task started as the agent stopped has ended: its status is kept");
        return Found::Ended(Ended {
            status: Ok(status),
            killed: false,
            out_of_memory,
        });
    }
    if let Some(record) = rebuilt_record(isolation, data_dir, task_id, &files, boot_id) {
        if let Err(error) = record.write(&files) {
            tracing::warn!(task = %task_id, %error, "cannot write a rebuilt executor record");
        }
        tracing::info!(task = %task_id, executor = record.executor_pid, "a task started as the agent stopped runs: taken back");
        return reattach(files, &record, boot_id).await;
    }
    abandon_start(isolation, data_dir, task_id, &files).await;
    Found::Gone("the agent stopped while it was starting the task, before the task ran".to_owned())
}

/// The executor record of a task started without one: its pid (written by its executor), its
/// executor (the task's parent), their start time and the task's cgroup. `None` unless the
/// task still runs in its own directory under a live parent.
fn rebuilt_record(
    isolation: &Isolation,
    data_dir: &Path,
    task_id: &str,
    files: &Files,
    boot_id: &str,
) -> Option<Record> {
    let task_pid = files.read_task_pid().ok()??;
    if !works_in(task_pid, data_dir, task_id) {
        return None;
    }
    let executor_pid = executor::parent_pid(task_pid).ok()??;
    if executor_pid <= 1 {
        // Its executor is gone: the task was handed to init, and nothing records its end.
        return None;
    }
    Some(Record {
        executor_pid,
        executor_start: executor::start_time(executor_pid).ok()??,
        boot_id: boot_id.to_owned(),
        task_pid,
        output_captured: true,
        cgroup: isolation
            .existing_for(task_id)
            .map(|cgroup| cgroup.record()),
    })
}

/// Kills what a task that ended (or vanished) while the agent was down left in its cgroup,
/// and removes the cgroup; whether the kernel killed a process of it for memory.
async fn settle_leftovers(record: &Record) -> bool {
    match &record.cgroup {
        Some(cgroup) => settle_cgroup(&TaskCgroup::from_record(cgroup)).await,
        None => false,
    }
}

/// Kills what is left in `cgroup` and removes it; whether the kernel killed a process of it
/// for memory.
async fn settle_cgroup(cgroup: &TaskCgroup) -> bool {
    cgroup.kill_all().await;
    let out_of_memory = cgroup.oom_killed();
    cgroup.remove();
    out_of_memory
}

/// Whether process `pid` works in task `task_id`'s directory: it is the task's (a pid a file
/// names may have been reused since).
fn works_in(pid: i32, data_dir: &Path, task_id: &str) -> bool {
    let dir = store::task_dir(data_dir, task_id);
    std::fs::read_link(format!("/proc/{pid}/cwd"))
        .is_ok_and(|cwd| std::fs::canonicalize(&dir).is_ok_and(|dir| dir == cwd))
}

/// A task whose start the earlier run did not see through (no executor record): whatever of it
/// runs is killed. Its cgroup, if it has one, holds all of it; else its process group, if the
/// executor recorded its pid and that process still works in the task's directory.
async fn abandon_start(isolation: &Isolation, data_dir: &Path, task_id: &str, files: &Files) {
    if let Some(cgroup) = isolation.existing_for(task_id) {
        settle_cgroup(&cgroup).await;
    }
    if let Ok(Some(pid)) = files.read_task_pid()
        && works_in(pid, data_dir, task_id)
    {
        // SAFETY: killpg takes two integers; the process was just seen working in the task's
        // own directory, so the group is the task's.
        unsafe {
            libc::killpg(pid, libc::SIGKILL);
        }
    }
    if let Err(error) = files.remove() {
        tracing::warn!(task = %task_id, %error, "cannot remove a task's executor files");
    }
}

//! Finding a task an earlier run of the agent started, from its executor's files (see
//! [`crate::executor`]): still running under the same executor (re-attached), ended with the
//! status its executor wrote (what it left in its cgroup is killed), or gone (a start the
//! earlier run did not see through is killed). And settling what a task that had ended left.
//! A task found running holds its dynamic uid again (read back from the owner of its working
//! directory), so that no new task is given it; the directory of one found ended goes back to
//! root (see [`crate::task_uids`]).

use super::ProcessRunner;
use crate::child_process::{Recovered, TaskProcess};
use crate::executor::{self, Files, Record};
use crate::isolation::TaskCgroup;
use crate::runner::{Reattached, TaskEnd};
use crate::store;

impl ProcessRunner {
    /// Finds task `task_id`'s process from its executor's files, as the module says.
    pub(super) async fn find(&self, task_id: &str) -> Reattached {
        let found = self.find_process(task_id).await;
        if !matches!(found, Reattached::Running(_))
            && let Some(uids) = &self.uids
        {
            uids.close_dir(&store::task_dir(&self.data_dir, task_id));
        }
        found
    }

    /// Finds task `task_id`'s process, as [`find`](Self::find) does, but for its uid.
    async fn find_process(&self, task_id: &str) -> Reattached {
        let files = store::executor_files(&self.data_dir, task_id);
        let record = match Record::read(&files) {
            Ok(Some(record)) => record,
            Ok(None) => return self.started_without_record(task_id, files).await,
            Err(e) => return Reattached::Gone(format!("its executor record is unreadable: {e}")),
        };
        self.reattach_to(task_id, files, &record).await
    }

    /// Task `task_id` had ended (killed as the agent stopped): what it left in its cgroup is
    /// killed, and its executor's files go.
    pub(super) async fn settle_ended(&self, task_id: &str) {
        if let Some(uids) = &self.uids {
            uids.close_dir(&store::task_dir(&self.data_dir, task_id));
        }
        let files = store::executor_files(&self.data_dir, task_id);
        if let Ok(Some(record)) = Record::read(&files) {
            settle_leftovers(&record).await;
            if let Err(error) = files.remove() {
                tracing::warn!(task = %task_id, %error, "cannot remove a task's executor files");
            }
        }
    }

    /// Re-attaches to the executor `record` names: running (holding its uid again), or ended
    /// (what it left in its cgroup is killed), or gone.
    async fn reattach_to(&self, task_id: &str, files: Files, record: &Record) -> Reattached {
        match TaskProcess::reattach(files, record, &self.boot_id) {
            Recovered::Running(process) => {
                let dir = store::task_dir(&self.data_dir, task_id);
                let lease = self.uids.as_ref().and_then(|uids| {
                    uids.owner_in_range(&dir)
                        .and_then(|uid| uids.hold(uid, &dir))
                });
                if let Some(lease) = &lease {
                    tracing::info!(task = %task_id, uid = lease.uid(), "a re-attached task keeps its uid");
                }
                Reattached::Running(Box::new(process.holding(lease)))
            }
            Recovered::Ended(status) => {
                let out_of_memory = settle_leftovers(record).await;
                Reattached::Ended(TaskEnd {
                    status: Ok(status),
                    killed: false,
                    out_of_memory,
                })
            }
            Recovered::Gone(why) => {
                settle_leftovers(record).await;
                Reattached::Gone(why)
            }
        }
    }

    /// A task whose start the earlier run did not see through: the agent stopped between
    /// forking its executor and writing the executor's record. If the executor had forked the
    /// task, the task has run, or runs: the executor wrote its pid, and writes its wait status
    /// when it ends, whatever became of the agent. Such a task is taken back (re-attached
    /// through a record rebuilt from `/proc`: the executor is the task's parent) or reported
    /// with the status it ended with, never as a task that did not start: its replacement
    /// would run it a second time. Only a task its executor never forked is gone.
    async fn started_without_record(&self, task_id: &str, files: Files) -> Reattached {
        if let Ok(Some(status)) = files.read_status() {
            let out_of_memory = match self.isolation.existing_for(task_id) {
                Some(cgroup) => settle_cgroup(&cgroup).await,
                None => false,
            };
            tracing::info!(task = %task_id, "a task started as the agent stopped has ended: its status is kept");
            return Reattached::Ended(TaskEnd {
                status: Ok(status),
                killed: false,
                out_of_memory,
            });
        }
        if let Some(record) = self.rebuilt_record(task_id, &files) {
            if let Err(error) = record.write(&files) {
                tracing::warn!(task = %task_id, %error, "cannot write a rebuilt executor record");
            }
            tracing::info!(task = %task_id, executor = record.executor_pid, "a task started as the agent stopped runs: taken back");
            return self.reattach_to(task_id, files, &record).await;
        }
        self.abandon_start(task_id, &files).await;
        Reattached::Gone(
            "the agent stopped while it was starting the task, before the task ran".to_owned(),
        )
    }

    /// The executor record of a task started without one: its pid (written by its executor),
    /// its executor (the task's parent), their start time and the task's cgroup. `None` unless
    /// the task still runs in its own directory under a live parent.
    fn rebuilt_record(&self, task_id: &str, files: &Files) -> Option<Record> {
        let task_pid = files.read_task_pid().ok()??;
        if !self.works_in(task_pid, task_id) {
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
            boot_id: self.boot_id.clone(),
            task_pid,
            output_captured: true,
            cgroup: self
                .isolation
                .existing_for(task_id)
                .map(|cgroup| cgroup.record()),
        })
    }

    /// Whether process `pid` works in task `task_id`'s directory: it is the task's (a pid a
    /// file names may have been reused since).
    fn works_in(&self, pid: i32, task_id: &str) -> bool {
        let dir = store::task_dir(&self.data_dir, task_id);
        std::fs::read_link(format!("/proc/{pid}/cwd"))
            .is_ok_and(|cwd| std::fs::canonicalize(&dir).is_ok_and(|dir| dir == cwd))
    }

    /// A task whose start the earlier run did not see through (no executor record): whatever
    /// of it runs is killed. Its cgroup, if it has one, holds all of it; else its process
    /// group, if the executor recorded its pid and that process still works in the task's
    /// directory.
    async fn abandon_start(&self, task_id: &str, files: &Files) {
        if let Some(cgroup) = self.isolation.existing_for(task_id) {
            settle_cgroup(&cgroup).await;
        }
        if let Ok(Some(pid)) = files.read_task_pid()
            && self.works_in(pid, task_id)
        {
            // SAFETY: killpg takes two integers; the process was just seen working in the
            // task's own directory, so the group is the task's.
            unsafe {
                libc::killpg(pid, libc::SIGKILL);
            }
        }
        if let Err(error) = files.remove() {
            tracing::warn!(task = %task_id, %error, "cannot remove a task's executor files");
        }
    }
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

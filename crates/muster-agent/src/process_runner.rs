//! The agent's default [`TaskRunner`]: each task a process of this machine, started under its
//! executor ([`TaskProcess`], see [`crate::executor`]) in its own working directory
//! (`tasks/<id>` under the data directory), cgroup ([`Isolation`]) and user
//! ([`Credentials`]), with its stdout and stderr in files there ([`crate::output`]). A task
//! that names no user, of an agent running as root whose config names none either, runs as a
//! uid of its own ([`TaskUids`]).
//!
//! - `reattach`: finding, after a restart of the agent, the tasks an earlier run started,
//!   from their executors' records; settling what ended ones left in their cgroups.
//! - `output_files`: the masters' reads of a task's output files, and the copy-truncate
//!   rotation of those of tasks whose executors do not rotate them.

mod output_files;
mod reattach;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use muster_proto::model::Task;

use crate::child_process::{self, Sandbox, TaskProcess};
use crate::isolation::{self, Isolation};
use crate::output::{self, Limits as OutputLimits};
use crate::runner::{
    self, BoxFuture, OutputChunk, OutputError, OutputRead, Reattached, RunnerTask, StartError,
    TaskRunner,
};
use crate::store::{self, blocking};
use crate::task_uids::{TaskUids, UidLease};
use crate::task_user::{self, Credentials};
use crate::{AgentConfig, AgentError};

/// Runs tasks as processes of this machine (see the module).
#[derive(Debug)]
pub(crate) struct ProcessRunner {
    /// The agent's data directory: the tasks' working directories and executor files.
    data_dir: PathBuf,
    /// How tasks are bounded: cgroups, or process groups.
    isolation: Isolation,
    /// Whether the agent runs as root, and so can (and must) run tasks as other users.
    root: bool,
    /// The dynamic uids of tasks that name no user, when the agent runs as root.
    uids: Option<TaskUids>,
    /// The machine's boot as the agent started: a task started in another boot is gone.
    boot_id: String,
    /// Most processes and threads one task may run at once, with cgroups.
    pids_max: u64,
    /// How large a task's output files grow, and how many are kept.
    output_limits: OutputLimits,
    /// How often the agent has the output files of tasks of older agents rotated.
    output_check_interval: Duration,
    /// The tasks' output files (see `output_files`).
    output: output_files::OutputFiles,
}

impl ProcessRunner {
    /// The runner for an agent of `config`: finds how it can bound tasks (cgroups where the
    /// machine allows and the config wants them, else process groups) and whom tasks run as,
    /// and says both in the log.
    ///
    /// # Errors
    /// [`AgentError::StateFile`] if the work of finding the cgroups does not finish.
    pub(crate) async fn new(config: &AgentConfig) -> Result<ProcessRunner, AgentError> {
        let isolation = if config.cgroups {
            let scope = isolation_scope(&config.data_dir);
            blocking(move || Ok(Isolation::detect(&scope))).await?
        } else {
            Isolation::ProcessGroup {
                reason: "cgroups turned off in the agent's config".into(),
            }
        };
        match &isolation {
            Isolation::ProcessGroup { reason } => tracing::warn!(
                %reason,
                "tasks are bounded by process groups only: memory, CPU and process limits are \
                 not enforced, and a task's processes that leave its group survive a kill"
            ),
            other => tracing::info!(isolation = other.name(), "each task runs in its own cgroup"),
        }
        let root = task_user::agent_is_root();
        match (&config.task_user, root) {
            (Some(user), _) => {
                tracing::info!(%user, "tasks run as this user unless their job names another");
            }
            (None, true) => tracing::info!(
                uids = %config.task_uid_range,
                "each task runs as a uid of its own from this range unless its job names a user"
            ),
            (None, false) => tracing::info!(
                user = %task_user::name_or_own(None),
                "tasks run as the agent's user"
            ),
        }
        Ok(ProcessRunner {
            data_dir: config.data_dir.clone(),
            isolation,
            root,
            uids: root.then(|| TaskUids::new(config.task_uid_range)),
            boot_id: crate::executor::boot_id().unwrap_or_default(),
            pids_max: config.task_pids_max,
            output_limits: OutputLimits {
                max_bytes: config.task_output_max_bytes,
                files: config.task_output_files,
            },
            output_check_interval: config.task_output_check_interval,
            output: output_files::OutputFiles::default(),
        })
    }

    /// Whom a task that runs as `user` (as the agent's rule says: `None` for the runner's
    /// default) runs as here, with the lease on its uid if it is a dynamic one: a free uid of
    /// the range for a task of a root agent that comes to no user, taken now if `take`, else
    /// only checked for.
    fn credentials(
        &self,
        task: &Task,
        user: Option<&str>,
        take: bool,
    ) -> Result<(Option<Credentials>, Option<UidLease>), StartError> {
        if user.is_none()
            && let Some(uids) = &self.uids
        {
            if !take {
                uids.check_free()
                    .map_err(|e| StartError::User(Box::new(e)))?;
                return Ok((None, None));
            }
            let lease = uids
                .take(&store::task_dir(&self.data_dir, &task.id))
                .map_err(|e| StartError::User(Box::new(e)))?;
            return Ok((Some(Credentials::dynamic(lease.uid())), Some(lease)));
        }
        let credentials =
            Credentials::for_task(user, self.root).map_err(|e| StartError::User(Box::new(e)))?;
        Ok((credentials, None))
    }

    /// Starts `task`'s process as `credentials`, holding `lease` on its uid while it runs (a
    /// start that fails gives the uid and the directory up at once): its working directory, its
    /// cgroup, its executor, and the record a restarted agent finds it by (written before
    /// anyone hears it runs).
    async fn spawn(
        &self,
        task: &Task,
        credentials: Option<Credentials>,
        lease: Option<UidLease>,
    ) -> Result<TaskProcess, StartError> {
        let (process, record) = match self.spawn_process(task, credentials).await {
            Ok(spawned) => spawned,
            Err(error) => {
                if let Some(lease) = lease {
                    lease.end();
                }
                return Err(error);
            }
        };
        let process = process.holding(lease);
        // What a restarted agent needs to find it again, before anyone hears it runs.
        let files = store::executor_files(&self.data_dir, &task.id);
        let written = blocking(move || {
            record
                .write(&files)
                .map_err(|source| AgentError::StateFile {
                    path: files.record.clone(),
                    source,
                })
        })
        .await;
        if let Err(error) = written {
            runner::kill_and_wait(Box::new(process)).await;
            return Err(StartError::Record(error));
        }
        Ok(process)
    }

    /// [`spawn`](Self::spawn)'s working directory, cgroup and executor, with the executor's
    /// record to write.
    async fn spawn_process(
        &self,
        task: &Task,
        credentials: Option<Credentials>,
    ) -> Result<(TaskProcess, crate::executor::Record), StartError> {
        let id = &task.id;
        let dir = store::task_dir(&self.data_dir, id);
        let output = child_process::open_sandbox(&dir, credentials)
            .await
            .map_err(|error| StartError::WorkingDir {
                dir: dir.clone(),
                error,
            })?;
        let resources = task.resources.unwrap_or_default();
        let limits = isolation::Limits {
            mem_mb: resources.mem_mb,
            cpus: resources.cpus,
            pids: self.pids_max,
        };
        let cgroup = self
            .isolation
            .for_task(id, limits)
            .map_err(StartError::Cgroup)?;
        let sandbox = Sandbox {
            output,
            output_limits: self.output_limits,
            cgroup: cgroup.clone(),
            credentials,
        };
        let files = store::executor_files(&self.data_dir, id);
        match TaskProcess::spawn(task, &dir, files, sandbox) {
            Ok(spawned) => Ok(spawned),
            Err(e) => {
                if let Some(cgroup) = cgroup {
                    cgroup.remove();
                }
                let _ = blocking(move || {
                    let _ = std::fs::remove_dir_all(&dir);
                    Ok(())
                })
                .await;
                Err(StartError::command(&task.command, e))
            }
        }
    }
}

impl TaskRunner for ProcessRunner {
    fn isolation(&self) -> &'static str {
        self.isolation.name()
    }

    /// Checks that the named user can be looked up (and switched to), or, for a task that
    /// names none of a root agent, that a uid of the range is free.
    fn admit(&self, task: &Task, user: Option<&str>) -> Result<(), StartError> {
        self.credentials(task, user, false).map(drop)
    }

    /// Looks the user up again (as [`admit`](TaskRunner::admit) did) or takes a free uid of
    /// the range, then spawns the task; the uid is free again once the task's processes are
    /// reaped (or if it does not start).
    fn start<'a>(
        &'a self,
        task: &'a Task,
        user: Option<&'a str>,
        _term: u64,
    ) -> BoxFuture<'a, Result<Box<dyn RunnerTask>, StartError>> {
        Box::pin(async move {
            let (credentials, lease) = self.credentials(task, user, true)?;
            let process = self.spawn(task, credentials, lease).await?;
            Ok(Box::new(process) as Box<dyn RunnerTask>)
        })
    }

    fn reattach<'a>(&'a self, task_id: &'a str) -> BoxFuture<'a, Reattached> {
        Box::pin(self.find(task_id))
    }

    fn clean_up<'a>(&'a self, task_id: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(self.settle_ended(task_id))
    }

    fn sweep(&self, keep: &HashSet<String>) -> usize {
        self.isolation.sweep(keep)
    }

    fn release(&self) {
        self.isolation.release();
    }

    fn output_check_interval(&self) -> Option<Duration> {
        Some(self.output_check_interval)
    }

    fn check_output(&self, running: Vec<String>) {
        self.rotate_uncaptured(&running);
    }

    fn read_output(&self, task_id: &str, read: OutputRead) -> Result<OutputChunk, OutputError> {
        let limit = usize::try_from(read.limit).unwrap_or(output::READ_LIMIT_MAX);
        self.read(task_id, read.stderr, read.offset, limit)
    }
}

/// The agent's own cgroup directory name, stable across its restarts: `muster/agent-<hash of
/// its data dir>`.
fn isolation_scope(data_dir: &Path) -> String {
    let path = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_owned());
    // FNV-1a: short, stable, and no dependency for a directory name.
    let hash = path
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
        });
    format!("muster/agent-{hash:016x}")
}

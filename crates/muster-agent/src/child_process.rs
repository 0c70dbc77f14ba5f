//! A task's processes on this machine: starting its command under an executor (see
//! [`crate::executor`]) in its own process group and cgroup, as its user; re-attaching to the
//! executor of a task an earlier run of the agent started; stopping the task with signals
//! (SIGTERM, then SIGKILL after a grace period); and turning how it ended into an exit code.
//! Kept apart from the agent's bookkeeping because this is the only place that deals with the
//! operating system's processes and signals.
//!
//! A task outlives the agent: dropping a [`TaskProcess`] (the agent stops, or is killed)
//! leaves it running under its executor, for the next run of the agent to re-attach. The agent
//! holds it as any runner's task ([`RunnerTask`]); the runner that makes them is
//! [`crate::process_runner`].

use std::io;
use std::path::Path;
use std::process::{ExitStatus, Stdio};

use muster_proto::model::Task;
use tokio::io::unix::AsyncFd;
use tokio::sync::oneshot;

use crate::executor::{self, CgroupRecord, Files, Plan, Record};
use crate::isolation::TaskCgroup;
use crate::metrics::CgroupPaths;
use crate::output::{Capture, Limits, TaskFiles};
use crate::runner::{BoxFuture, KillSwitch, RunnerTask, Stop, TaskEnd};
use crate::task_uids::UidLease;
use crate::task_user::Credentials;

/// The task's executor, whose end says the task ended.
#[derive(Debug)]
enum Executor {
    /// Started by this run of the agent: its child, reaped by tokio.
    Child(tokio::process::Child),
    /// Started by an earlier run: watched through a pidfd (readable once it ended); the
    /// machine's init reaps it.
    Adopted(AsyncFd<std::os::fd::OwnedFd>),
}

impl Executor {
    /// Waits until the executor has ended.
    async fn ended(&mut self) {
        match self {
            Executor::Child(child) => {
                if let Err(error) = child.wait().await {
                    tracing::warn!(%error, "cannot wait for a task's executor");
                }
            }
            Executor::Adopted(pidfd) => {
                if let Err(error) = pidfd.readable().await {
                    tracing::warn!(%error, "cannot watch an adopted task's executor");
                }
            }
        }
    }
}

/// Sends signals to a task's processes: its process group and, with cgroups, every process in
/// its cgroup, whatever group or session it made for itself.
#[derive(Clone, Debug)]
struct Signaller {
    /// The task's pid, which is its process group.
    group: i32,
    cgroup: Option<TaskCgroup>,
}

impl Signaller {
    /// Sends `signal` to every process of the task.
    fn signal(&self, signal: libc::c_int) {
        if let Some(cgroup) = &self.cgroup {
            cgroup.signal(signal);
        }
        // SAFETY: killpg takes two integers and touches no memory of ours. The group cannot
        // be another's while the task runs (its leader is not reaped before the executor
        // sees it end); an empty group gives ESRCH, which there is nothing to do about.
        unsafe {
            libc::killpg(self.group, signal);
        }
    }
}

/// A task's processes: its executor and, under it, the task, leader of its own process group.
#[derive(Debug)]
pub(crate) struct TaskProcess {
    executor: Executor,
    signaller: Signaller,
    files: Files,
    /// The uid it runs as, where known.
    uid: Option<libc::uid_t>,
    /// Its hold on a dynamic uid, ended with it (see [`crate::task_uids`]).
    lease: Option<UidLease>,
}

/// What a restarted agent found of a task an earlier run started.
#[derive(Debug)]
pub(crate) enum Recovered {
    /// It still runs: re-attached.
    Running(Box<TaskProcess>),
    /// It ended while the agent was down, with this status.
    Ended(ExitStatus),
    /// Nothing of it is left, and its status is not known: why.
    Gone(String),
}

/// What a task runs as and where its output goes.
#[derive(Debug)]
pub(crate) struct Sandbox {
    /// Its working directory and output files, which its executor writes.
    pub(crate) output: TaskFiles,
    /// How large its output files may grow, and how many are kept.
    pub(crate) output_limits: Limits,
    /// Its cgroup, if the agent uses cgroups.
    pub(crate) cgroup: Option<TaskCgroup>,
    /// Its user, if not the agent's.
    pub(crate) credentials: Option<Credentials>,
}

impl TaskProcess {
    /// Starts `task`'s command (with its arguments and environment) in `dir` under a new
    /// executor, with no stdin, its stdout and stderr piped to the executor, which writes them
    /// to the sandbox's output files within the sandbox's limits, and with the sandbox's cgroup
    /// and user. Returns it with the [`Record`] a restarted agent needs to find it again (not
    /// written yet).
    pub(crate) fn spawn(
        task: &Task,
        dir: &Path,
        files: Files,
        sandbox: Sandbox,
    ) -> io::Result<(Self, Record)> {
        files.remove()?;
        let (capture, task_ends) = Capture::new(
            sandbox.output,
            &files.output_lock,
            sandbox.output_limits,
            sandbox.credentials.map(|owner| (owner.uid, owner.gid)),
        )?;
        let mut plan = Plan::new(
            &files,
            sandbox.cgroup.as_ref().map(TaskCgroup::join_handle),
            sandbox.credentials,
            capture,
            task_ends,
        )?;
        let mut command = tokio::process::Command::new(&task.command);
        command
            .args(&task.args)
            .envs(&task.env)
            .current_dir(dir)
            .stdin(Stdio::null())
            // Replaced by the pipes in the task (see `Plan::run_in_child`).
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // The task outlives the agent: its executor is not killed with it.
            .kill_on_drop(false);
        // SAFETY: the closure runs in the child between fork and exec and only makes raw
        // system calls on data prepared before the fork (see `Plan::run_in_child`).
        unsafe {
            command.pre_exec(move || plan.run_in_child());
        }
        // Returns once the task has exec'd (or failed to): the executor has written its pid.
        let child = command.spawn();
        // The agent's copies of the pipes and files (in the plan) go: the executor and the
        // task hold theirs.
        drop(command);
        let child = child?;
        let executor_pid = child
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .ok_or_else(|| io::Error::other("the executor has no pid"))?;
        let task_pid = files
            .read_task_pid()?
            .ok_or_else(|| io::Error::other("the executor did not record the task's pid"))?;
        let record = Record {
            executor_pid,
            executor_start: executor::start_time(executor_pid)?.unwrap_or_default(),
            boot_id: executor::boot_id()?,
            task_pid,
            // Its executor writes and rotates its output files: the agent must not.
            output_captured: true,
            cgroup: sandbox.cgroup.as_ref().map(TaskCgroup::record),
        };
        let process = TaskProcess {
            executor: Executor::Child(child),
            signaller: Signaller {
                group: task_pid,
                cgroup: sandbox.cgroup,
            },
            files,
            uid: Some(sandbox.credentials.map_or_else(
                // SAFETY: geteuid has no preconditions.
                || unsafe { libc::geteuid() },
                |credentials| credentials.uid,
            )),
            lease: None,
        };
        Ok((process, record))
    }

    /// The task holds `lease` on its uid (if any) until it ends: the uid is free, and its
    /// working directory goes back to root, once its processes are reaped.
    pub(crate) fn holding(mut self, lease: Option<UidLease>) -> Self {
        if let Some(lease) = &lease {
            self.uid = Some(lease.uid());
        }
        self.lease = lease;
        self
    }

    /// Finds a task an earlier run of the agent started, from its executor's `record`: still
    /// running under the same executor (same pid, same start time, same boot), ended with the
    /// status its executor wrote, or gone.
    pub(crate) fn reattach(files: Files, record: &Record, boot_id: &str) -> Recovered {
        let ended = |files: &Files| match files.read_status() {
            Ok(Some(status)) => Some(Recovered::Ended(status)),
            Ok(None) => None,
            Err(e) => Some(Recovered::Gone(format!(
                "its exit status is unreadable: {e}"
            ))),
        };
        if let Some(ended) = ended(&files) {
            return ended;
        }
        if record.boot_id != boot_id {
            return Recovered::Gone("the machine restarted since it was started".into());
        }
        // The pidfd first, then the start time: if the start time matches after the pidfd is
        // open, the pidfd is the executor's.
        let pidfd = match executor::pidfd(record.executor_pid) {
            Ok(Some(pidfd))
                if executor::start_time(record.executor_pid)
                    .is_ok_and(|start| start == Some(record.executor_start)) =>
            {
                pidfd
            }
            Ok(_) => {
                // Ended since the status was read, or gone without writing it.
                return ended(&files).unwrap_or_else(|| {
                    Recovered::Gone("its executor is gone and left no exit status".into())
                });
            }
            Err(e) => return Recovered::Gone(format!("cannot watch its executor: {e}")),
        };
        // SAFETY: the AsyncFd owns the OwnedFd, which stays open, and is the same descriptor,
        // until the AsyncFd is dropped.
        let pidfd = match unsafe {
            AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE)
        } {
            Ok(pidfd) => pidfd,
            Err(e) => return Recovered::Gone(format!("cannot watch its executor: {e}")),
        };
        Recovered::Running(Box::new(TaskProcess {
            executor: Executor::Adopted(pidfd),
            signaller: Signaller {
                group: record.task_pid,
                cgroup: record.cgroup.as_ref().map(TaskCgroup::from_record),
            },
            files,
            uid: None,
            lease: None,
        }))
    }

    /// Waits for the task to end, then kills whatever it left behind in its group and cgroup.
    /// A [`Stop`] arriving on `kill` first stops the task: its kill signal, then SIGKILL if it
    /// is still there when its grace period is over (a zero grace period: SIGKILL at once).
    async fn wait_for_end(mut self, mut kill: oneshot::Receiver<Stop>) -> TaskEnd {
        let (grace, signal) = tokio::select! {
            biased;
            () = self.executor.ended() => return self.end(false).await,
            Ok(stop) = &mut kill => (stop.grace, stop.signal),
        };
        if grace.is_zero() {
            self.signaller.signal(libc::SIGKILL);
            self.executor.ended().await;
            return self.end(true).await;
        }
        self.signaller.signal(signal);
        if tokio::time::timeout(grace, self.executor.ended())
            .await
            .is_err()
        {
            tracing::info!(
                task_pid = self.signaller.group,
                ?grace,
                "task still runs after its grace period; sending SIGKILL"
            );
            self.signaller.signal(libc::SIGKILL);
            self.executor.ended().await;
        }
        self.end(true).await
    }

    /// The task has ended: kill what is left of it, read its status, remove its cgroup, and
    /// end its hold on its uid.
    async fn end(self, killed: bool) -> TaskEnd {
        self.signaller.signal(libc::SIGKILL);
        let status = match self.files.read_status() {
            Ok(Some(status)) => Ok(status),
            Ok(None) => Err("its executor ended without recording its exit status".to_owned()),
            Err(e) => Err(e.to_string()),
        };
        let out_of_memory = match &self.signaller.cgroup {
            Some(cgroup) => {
                cgroup.kill_all().await;
                let out_of_memory = cgroup.oom_killed();
                cgroup.remove();
                out_of_memory
            }
            None => false,
        };
        if let Some(lease) = self.lease {
            lease.end();
        }
        TaskEnd {
            status,
            killed,
            out_of_memory,
        }
    }
}

impl RunnerTask for TaskProcess {
    fn pid(&self) -> Option<i32> {
        Some(self.signaller.group)
    }

    fn uid(&self) -> Option<u32> {
        self.uid
    }

    fn cgroup(&self) -> Option<CgroupPaths> {
        self.signaller.cgroup.as_ref().map(TaskCgroup::usage_paths)
    }

    fn kill_switch(&self) -> KillSwitch {
        let signaller = self.signaller.clone();
        KillSwitch::new(move || signaller.signal(libc::SIGKILL))
    }

    fn wait(self: Box<Self>, stop: oneshot::Receiver<Stop>) -> BoxFuture<'static, TaskEnd> {
        Box::pin(self.wait_for_end(stop))
    }
}

impl TaskCgroup {
    /// Where it is, for the executor record.
    pub(crate) fn record(&self) -> CgroupRecord {
        let (dirs, memory, v2) = self.parts();
        CgroupRecord {
            dirs: dirs.to_vec(),
            memory: memory.to_owned(),
            v2,
        }
    }

    /// The cgroup a record names.
    pub(crate) fn from_record(record: &CgroupRecord) -> TaskCgroup {
        TaskCgroup::existing(record.dirs.clone(), record.memory.clone(), record.v2)
    }
}

/// Creates a task's working directory with its `stdout` and `stderr` files, all owned by
/// `owner` if given, for its executor to write (see [`crate::output`]).
pub(crate) async fn open_sandbox(dir: &Path, owner: Option<Credentials>) -> io::Result<TaskFiles> {
    let dir = dir.to_owned();
    let opened = tokio::task::spawn_blocking(move || {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::create_dir_all(&dir)?;
        // `tasks/`: a task passes through it to its own directory, but lists no one's.
        if let Some(tasks) = dir.parent() {
            std::fs::set_permissions(
                tasks,
                std::fs::Permissions::from_mode(crate::store::DATA_DIR_MODE),
            )?;
        }
        // The task's alone (and the agent's): no other task lists, reads or writes it.
        std::fs::set_permissions(
            &dir,
            std::fs::Permissions::from_mode(crate::store::PRIVATE_DIR_MODE),
        )?;
        let files = TaskFiles::create(&dir)?;
        if let Some(owner) = owner {
            for path in [dir.clone(), dir.join("stdout"), dir.join("stderr")] {
                owner.own(&path)?;
            }
        }
        Ok::<_, io::Error>(files)
    })
    .await;
    opened.unwrap_or_else(|e| {
        Err(io::Error::other(format!(
            "opening the task's files did not finish: {e}"
        )))
    })
}

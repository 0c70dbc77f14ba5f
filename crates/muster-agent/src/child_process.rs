//! A task's child process on this machine: starting its command in its own process group,
//! stopping that group with signals (SIGTERM, then SIGKILL after a grace period), reaping it,
//! and turning how it ended into an exit code. Kept apart from the agent's bookkeeping because
//! this is the only place that deals with the operating system's processes and signals.

use std::io;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use muster_proto::model::Task;
use tokio::sync::oneshot;

use crate::isolation::TaskCgroup;

/// How a task's child process ended.
pub(crate) struct Ended {
    /// Its exit status, or why waiting for it failed.
    pub(crate) status: io::Result<ExitStatus>,
    /// True if it was asked to stop (and signalled) before it ended.
    pub(crate) killed: bool,
    /// True if the kernel killed one of its processes for going past its memory limit.
    pub(crate) out_of_memory: bool,
}

/// A task's child process, leader of its own process group. When the leader ends, or the
/// process is dropped before that (the agent stopped), the whole group is killed: a task's
/// processes do not outlive it.
pub(crate) struct TaskProcess {
    child: tokio::process::Child,
    /// The process group (the child's pid) while it may still have members to kill.
    group: Option<i32>,
    /// The task's cgroup, when the agent uses cgroups: every process the task starts is in
    /// it, whatever group or session it makes for itself.
    cgroup: Option<TaskCgroup>,
}

impl TaskProcess {
    /// Starts `task`'s command (with its arguments and environment) in `dir`, with no stdin and
    /// the given `stdout` and `stderr`, as the leader of its own process group, inside
    /// `cgroup` if given (it joins before its command runs).
    pub(crate) fn spawn(
        task: &Task,
        dir: &Path,
        stdout: Stdio,
        stderr: Stdio,
        cgroup: Option<TaskCgroup>,
    ) -> io::Result<Self> {
        let mut command = tokio::process::Command::new(&task.command);
        command
            .args(&task.args)
            .envs(&task.env)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            // Its own process group, so that what it starts ends with it.
            .process_group(0)
            .kill_on_drop(true);
        if let Some(cgroup) = &cgroup {
            let procs = cgroup.join_handle();
            // SAFETY: the closure runs in the child between fork and exec and only makes
            // system calls (open, write, close, getpid) on data prepared before the fork.
            unsafe {
                command.pre_exec(move || procs.join_in_child());
            }
        }
        let child = command.spawn()?;
        let group = child.id().and_then(|pid| i32::try_from(pid).ok());
        Ok(TaskProcess {
            child,
            group,
            cgroup,
        })
    }

    /// The process group (the leader's pid), while it may still have members.
    pub(crate) fn group(&self) -> Option<i32> {
        self.group
    }

    /// Waits for the leader, then kills whatever it left behind in its group. A grace period
    /// arriving on `kill` first stops the group: SIGTERM, then SIGKILL if the leader is still
    /// there when the grace period is over.
    ///
    /// The signals are sent from here, before the leader is reaped, so that the group id
    /// cannot have been reused by then.
    pub(crate) async fn wait(mut self, mut kill: oneshot::Receiver<Duration>) -> Ended {
        let grace = tokio::select! {
            biased;
            status = self.child.wait() => {
                self.kill_group();
                let out_of_memory = self.end_cgroup().await;
                return Ended { status, killed: false, out_of_memory };
            }
            Ok(grace) = &mut kill => grace,
        };
        self.signal_group(libc::SIGTERM);
        let status = match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => status,
            Err(_) => {
                tracing::info!(group = ?self.group, ?grace, "task still runs after its grace period; sending SIGKILL");
                self.signal_group(libc::SIGKILL);
                self.child.wait().await
            }
        };
        self.kill_group();
        let out_of_memory = self.end_cgroup().await;
        Ended {
            status,
            killed: true,
            out_of_memory,
        }
    }

    /// Kills what is left in the task's cgroup; whether the kernel killed a process of it for
    /// memory. The cgroup is removed when it is dropped, here.
    async fn end_cgroup(&mut self) -> bool {
        let Some(cgroup) = self.cgroup.take() else {
            return false;
        };
        cgroup.kill_all().await;
        cgroup.oom_killed()
    }

    /// Sends `signal` to the group while it may still have members, and to every process in
    /// the task's cgroup.
    fn signal_group(&self, signal: libc::c_int) {
        if let Some(cgroup) = &self.cgroup {
            cgroup.signal(signal);
        }
        if let Some(group) = self.group {
            // SAFETY: killpg takes two integers and touches no memory of ours. The id cannot
            // name another group: before the leader is reaped its pid is not reused, and after
            // that (the one SIGKILL of `kill_group`) the group's remaining members keep it in
            // use; an empty group gives ESRCH, which there is nothing to do about.
            unsafe {
                libc::killpg(group, signal);
            }
        }
    }

    /// Kills the whole group, once: the leader has been reaped, or is about to be dropped.
    fn kill_group(&mut self) {
        self.signal_group(libc::SIGKILL);
        self.group = None;
    }
}

impl Drop for TaskProcess {
    fn drop(&mut self) {
        // Before the leader was reaped (the wait was cancelled: the agent stopped). The child
        // itself is also killed and reaped by tokio (`kill_on_drop`).
        self.kill_group();
    }
}

/// Creates a task's working directory with its `stdout` and `stderr` files.
pub(crate) async fn open_sandbox(dir: &Path) -> io::Result<(Stdio, Stdio)> {
    tokio::fs::create_dir_all(dir).await?;
    let stdout = tokio::fs::File::create(dir.join("stdout")).await?;
    let stderr = tokio::fs::File::create(dir.join("stderr")).await?;
    Ok((
        Stdio::from(stdout.into_std().await),
        Stdio::from(stderr.into_std().await),
    ))
}

/// The exit code, or 128 + the signal number for a process killed by a signal (as shells do).
pub(crate) fn exit_code(status: &ExitStatus) -> i32 {
    if let Some(code) = status.code() {
        return code;
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt as _;
        if let Some(signal) = status.signal() {
            return 128 + signal;
        }
    }
    -1
}

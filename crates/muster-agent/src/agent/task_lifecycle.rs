//! What the agent process does with tasks: starts them (checks the request, prepares the working
//! directory, spawns the child, checkpoints), stops them when the master asks, records how they
//! ended, and reports every change of state to the master as a `TaskStatusUpdate`, keeping the
//! updates it cannot send yet for its next registration. The task table itself is
//! [`Tasks`](crate::tasks::Tasks); the child processes are [`crate::child_process`].

use std::collections::VecDeque;

use muster_actor::Context;
use muster_proto::cluster::{Framework, RunTask, TaskStatusUpdate};
use muster_proto::model::{Task, TaskState};
use tokio::sync::oneshot;

use super::master_link::Connection;
use super::{Agent, AgentMsg, Msg};
use crate::AgentError;
use crate::child_process::{self, Ended, TaskProcess};
use crate::isolation::Limits;
use crate::store::{self, blocking};
use crate::tasks::KillRequest;

impl Agent {
    /// Starts a task's child process, or says why not. A refused task (one not already running
    /// under its id) is also reported FAILED, with the reason in its `message`, so the master
    /// hears of it whether it asked or told.
    pub(super) async fn run_task(
        &mut self,
        request: RunTask,
        ctx: &mut Context<Self>,
    ) -> Result<(), String> {
        let refused = request.task.clone();
        let started = self.start_task(request, ctx).await;
        if let Err(error) = &started
            && let Some(mut task) = refused
            && !self.tasks.knows(&task.id)
        {
            task.state = TaskState::Failed as i32;
            task.exit_code = -1;
            task.message.clone_from(error);
            self.report(task);
        }
        started
    }

    /// Starts a task's child process (reporting STARTING, then RUNNING), or says why not.
    async fn start_task(
        &mut self,
        request: RunTask,
        ctx: &mut Context<Self>,
    ) -> Result<(), String> {
        let Some(mut task) = request.task else {
            return Err("the request carries no task".into());
        };
        store::check_task_id(&task.id)?;
        let id = task.id.clone();
        if self.tasks.knows(&id) {
            return Err(format!("task {id:?} already exists on this agent"));
        }
        let framework = self.framework_of(&mut task, request.framework)?;
        if task.command.trim().is_empty() {
            return Err(format!("task {id:?} has no command"));
        }
        // Accepted: STARTING until its process runs.
        task.state = TaskState::Starting as i32;
        self.report(task.clone());

        let dir = store::task_dir(&self.config.data_dir, &id);
        let (stdout, stderr) = child_process::open_sandbox(&dir).await.map_err(|e| {
            format!(
                "task {id:?}: cannot prepare working directory {}: {e}",
                dir.display()
            )
        })?;
        let resources = task.resources.unwrap_or_default();
        let limits = Limits {
            mem_mb: resources.mem_mb,
            cpus: resources.cpus,
            pids: self.config.task_pids_max,
        };
        let cgroup = self
            .isolation
            .for_task(&id, limits)
            .map_err(|e| format!("task {id:?}: cannot make its cgroup: {e}"))?;
        let child = match TaskProcess::spawn(&task, &dir, stdout, stderr, cgroup) {
            Ok(child) => child,
            Err(e) => {
                let _ = tokio::fs::remove_dir_all(&dir).await;
                return Err(format!(
                    "task {id:?}: cannot start command {:?}: {e}",
                    task.command
                ));
            }
        };
        task.state = TaskState::Running as i32;
        task.exit_code = 0;
        tracing::info!(task = %id, framework = %framework.id, pid = ?child.group(), command = %task.command, "task running");

        let data_dir = self.config.data_dir.clone();
        let (checkpoint_framework, checkpoint_task) = (framework.clone(), task.clone());
        if let Err(error) = blocking(move || {
            store::write_checkpoint(&data_dir, &checkpoint_framework, &checkpoint_task).map_err(
                |source| AgentError::StateFile {
                    path: data_dir.join("meta"),
                    source,
                },
            )
        })
        .await
        {
            tracing::warn!(task = %id, %error, "cannot checkpoint the task");
        }

        let task_id = id.clone();
        let (kill, killed) = oneshot::channel();
        let waiter = ctx.defer(child.wait(killed), move |_agent: &mut Agent, ctx, ended| {
            let _ = ctx.pid().tell(AgentMsg(Msg::TaskExited { task_id, ended }));
        });
        self.report(task.clone());
        self.tasks
            .add_running(framework, task, Some(waiter), Some(kill));
        Ok(())
    }

    /// Starts stopping a running task; an empty string if it runs, else why not.
    pub(super) fn kill_task(&mut self, task_id: &str) -> String {
        let grace = self.config.kill_grace;
        match self.tasks.kill(task_id, grace) {
            KillRequest::Stopping => {
                tracing::info!(task = %task_id, ?grace, "killing the task");
                String::new()
            }
            KillRequest::Ended(state) => format!(
                "task {task_id:?} has already ended ({})",
                state.as_str_name()
            ),
            KillRequest::Unknown => format!("no task {task_id:?} runs on this agent"),
        }
    }

    /// The framework a task belongs to: the request's, checked against the task's
    /// `framework_id` (filled in if empty), or the one the task names.
    fn framework_of(
        &self,
        task: &mut Task,
        framework: Option<Framework>,
    ) -> Result<Framework, String> {
        let id = &task.id;
        match framework.filter(|f| !f.id.is_empty()) {
            Some(framework) => {
                if task.framework_id.is_empty() {
                    task.framework_id = framework.id.clone();
                } else if task.framework_id != framework.id {
                    return Err(format!(
                        "task {id:?} names framework {:?} but the request is for framework {:?}",
                        task.framework_id, framework.id
                    ));
                }
                Ok(framework)
            }
            None if task.framework_id.is_empty() => Err(format!("task {id:?} names no framework")),
            None => Ok(self
                .tasks
                .framework(&task.framework_id)
                .cloned()
                .unwrap_or_else(|| Framework {
                    id: task.framework_id.clone(),
                    name: String::new(),
                })),
        }
    }

    /// A task's child process ended: move the task to the completed history in its final
    /// state, report it and checkpoint it.
    pub(super) async fn task_exited(&mut self, task_id: &str, ended: Ended) {
        let mut message = None;
        let (state, exit_code) = match &ended.status {
            Ok(status) if ended.out_of_memory => {
                message = Some("out of memory".to_owned());
                (TaskState::Failed, child_process::exit_code(status))
            }
            Ok(status) => {
                let code = child_process::exit_code(status);
                let state = if ended.killed {
                    TaskState::Killed
                } else if status.success() {
                    TaskState::Finished
                } else {
                    TaskState::Failed
                };
                (state, code)
            }
            Err(error) => {
                tracing::warn!(task = %task_id, %error, "cannot wait for the task's process");
                let state = if ended.killed {
                    TaskState::Killed
                } else {
                    TaskState::Failed
                };
                (state, -1)
            }
        };
        let Some(finished) = self.tasks.finish(task_id, state, exit_code, message) else {
            return;
        };
        tracing::info!(task = %task_id, state = ?state, exit_code, "task completed");
        self.report(finished.task.clone());
        let data_dir = self.config.data_dir.clone();
        let task_id = task_id.to_owned();
        let done = blocking(move || {
            for old in &finished.evicted {
                if let Err(error) = store::remove_checkpoint(&data_dir, old) {
                    tracing::warn!(task = %old, %error, "cannot remove an old task checkpoint");
                }
            }
            store::write_checkpoint(&data_dir, &finished.framework, &finished.task).map_err(
                |source| AgentError::StateFile {
                    path: data_dir.join("meta"),
                    source,
                },
            )
        })
        .await;
        if let Err(error) = done {
            tracing::warn!(task = %task_id, %error, "cannot checkpoint the completed task");
        }
    }

    /// Tells the master that `task` changed state (the task as the agent now has it), now if
    /// the agent is registered, else after its next registration. Kept updates are bounded:
    /// one per task, at most as many as the agent has running tasks plus completed history;
    /// beyond that the oldest go (the master rebuilds from the re-registration anyway).
    pub(super) fn report(&mut self, task: Task) {
        self.unsent_updates.retain(|t| t.id != task.id);
        self.unsent_updates.push_back(task);
        let bound = self
            .tasks
            .running_count()
            .saturating_add(1)
            .saturating_add(self.config.completed_task_history);
        while self.unsent_updates.len() > bound {
            if let Some(dropped) = self.unsent_updates.pop_front() {
                tracing::debug!(task = %dropped.id, "dropping an old unsent task status update");
            }
        }
        self.send_updates();
    }

    /// Sends the kept task status updates to the master, if the agent is registered; an update
    /// that cannot be queued for the master stays for the next registration.
    pub(super) fn send_updates(&mut self) {
        let (Connection::Registered { master }, Some(agent_id)) =
            (&self.connection, &self.agent_id)
        else {
            return;
        };
        if self.unsent_updates.is_empty() {
            return;
        }
        let remote = self.node.remote(master.clone());
        let mut kept = VecDeque::new();
        for task in self.unsent_updates.drain(..) {
            let update = TaskStatusUpdate {
                agent_id: agent_id.clone(),
                task: Some(task.clone()),
            };
            if let Err(error) = remote.tell(update) {
                tracing::warn!(%master, task = %task.id, %error, "cannot send a task status update; keeping it");
                kept.push_back(task);
            }
        }
        self.unsent_updates = kept;
    }
}

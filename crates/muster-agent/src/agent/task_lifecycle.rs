//! What the agent process does with tasks: starts them (checks the request, checkpoints, has
//! the task run: a child process in its working directory, or a task of the configured
//! [`TaskRunner`](crate::runner::TaskRunner)), stops them when the master asks, records how
//! they ended, and reports every change of state to the master as a `TaskStatusUpdate`, keeping
//! the updates it cannot send yet for its next registration. The task table itself is
//! [`Tasks`](crate::tasks::Tasks); the child processes are [`crate::child_process`].

use std::collections::VecDeque;

use muster_actor::Context;
use muster_proto::cluster::{Framework, KillTaskReply, RunTask, TaskStatusUpdate};
use muster_proto::model::{Task, TaskState};
use tokio::sync::oneshot;

use super::master_link::Connection;
use super::{Agent, AgentMsg, Msg};
use crate::AgentError;
use crate::child_process::{self, Ended, Sandbox, TaskProcess};
use crate::isolation::Limits;
use crate::output::Limits as OutputLimits;
use crate::runner::{Running, Stop};
use crate::store::{self, blocking};
use crate::task_user::Credentials;
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
        self.counts.launches += 1;
        let started = self.start_task(request, ctx).await;
        if started.is_err() {
            self.counts.launch_failures += 1;
        }
        if let Err(error) = &started
            && let Some(mut task) = refused
            && !self.tasks.knows(&task.id)
        {
            if store::check_task_id(&task.id).is_ok() {
                // A start that failed after its STARTING checkpoint leaves nothing to recover.
                let (data_dir, id) = (self.config.data_dir.clone(), task.id.clone());
                let removed = blocking(move || {
                    store::remove_checkpoint(&data_dir, &id).map_err(|source| {
                        AgentError::StateFile {
                            path: store::checkpoint_dir(&data_dir),
                            source,
                        }
                    })
                })
                .await;
                if let Err(error) = removed {
                    tracing::warn!(task = %task.id, %error, "cannot remove a refused task's checkpoint");
                }
            }
            task.state = TaskState::Failed as i32;
            task.exit_code = -1;
            task.message.clone_from(error);
            self.report(task);
        }
        started
    }

    /// Starts a task (reporting STARTING, then RUNNING): a child process under its executor,
    /// or a task of the configured runner. Or says why not.
    async fn start_task(
        &mut self,
        request: RunTask,
        ctx: &mut Context<Self>,
    ) -> Result<(), String> {
        let Some(mut task) = request.task else {
            return Err("the request carries no task".into());
        };
        store::check_task_id(&task.id).map_err(|e| e.to_string())?;
        let id = task.id.clone();
        if self.tasks.knows(&id) {
            return Err(format!("task {id:?} already exists on this agent"));
        }
        let framework = self.framework_of(&mut task, request.framework)?;
        if task.command.trim().is_empty() {
            return Err(format!("task {id:?} has no command"));
        }
        let runner = self.config.task_runner.clone();
        let credentials = match &runner {
            // Whom it may run as is the agent's rule; the machine's users are the runner's.
            Some(_) => self.task_users.admit(&task.user).map(|()| None),
            None => self.task_users.resolve(&task.user),
        }
        .map_err(|e| format!("task {id:?}: {e}"))?;
        // Accepted: STARTING until it runs. Checkpointed as such first, so that an agent
        // stopped in the middle of the start finds (and ends) what it had started.
        task.state = TaskState::Starting as i32;
        self.checkpoint(&framework, &task).await?;
        self.report(task.clone());

        let running = match &runner {
            Some(runner) => runner
                .runner()
                .start(&task, self.term)
                .map(Running::Runner)
                .map_err(|e| {
                    format!("task {id:?}: cannot start command {:?}: {e}", task.command)
                })?,
            None => self.spawn_process(&task, credentials).await?,
        };
        task.state = TaskState::Running as i32;
        task.exit_code = 0;
        if let Err(error) = self.checkpoint(&framework, &task).await {
            // Untracked, it would outlive a restart unseen: it does not run at all.
            running.kill_and_wait().await;
            return Err(format!("task {id:?}: cannot checkpoint it: {error}"));
        }
        match running.pid() {
            Some(pid) => {
                tracing::info!(task = %id, framework = %framework.id, pid, user = %self.task_users.name_for(&task.user), command = %task.command, "task running");
            }
            None => {
                tracing::info!(task = %id, framework = %framework.id, command = %task.command, term = self.term, "task running");
            }
        }
        self.report(task.clone());
        self.watch(framework, task, running, ctx);
        Ok(())
    }

    /// Starts `task`'s child process: its working directory, its cgroup, its executor, and
    /// the record a restarted agent finds it by (written before anyone hears it runs).
    async fn spawn_process(
        &self,
        task: &Task,
        credentials: Option<Credentials>,
    ) -> Result<Running, String> {
        let id = &task.id;
        let dir = store::task_dir(&self.config.data_dir, id);
        let output = child_process::open_sandbox(&dir, credentials)
            .await
            .map_err(|e| {
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
            .for_task(id, limits)
            .map_err(|e| format!("task {id:?}: cannot make its cgroup: {e}"))?;
        let sandbox = Sandbox {
            output,
            output_limits: OutputLimits {
                max_bytes: self.config.task_output_max_bytes,
                files: self.config.task_output_files,
            },
            cgroup: cgroup.clone(),
            credentials,
        };
        let files = store::executor_files(&self.config.data_dir, id);
        let (process, record) = match TaskProcess::spawn(task, &dir, files.clone(), sandbox) {
            Ok(spawned) => spawned,
            Err(e) => {
                if let Some(cgroup) = cgroup {
                    cgroup.remove();
                }
                let _ = blocking(move || {
                    let _ = std::fs::remove_dir_all(&dir);
                    Ok(())
                })
                .await;
                return Err(format!(
                    "task {id:?}: cannot start command {:?}: {e}",
                    task.command
                ));
            }
        };
        let running = Running::Process(Box::new(process));
        // What a restarted agent needs to find it again, before anyone hears it runs.
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
            running.kill_and_wait().await;
            return Err(format!("task {id:?}: cannot checkpoint it: {error}"));
        }
        Ok(running)
    }

    /// Records `task` of `framework` (its latest state) in its checkpoint.
    async fn checkpoint(&self, framework: &Framework, task: &Task) -> Result<(), String> {
        let data_dir = self.config.data_dir.clone();
        let (framework, task) = (framework.clone(), task.clone());
        blocking(move || {
            store::write_checkpoint(&data_dir, &framework, &task).map_err(|source| {
                AgentError::StateFile {
                    path: store::checkpoint_dir(&data_dir),
                    source,
                }
            })
        })
        .await
        .map_err(|e| format!("cannot checkpoint the task: {e}"))
    }

    /// Watches a running task until it ends, and records it as running.
    pub(super) fn watch(
        &mut self,
        framework: Framework,
        task: Task,
        running: Running,
        ctx: &mut Context<Self>,
    ) {
        let task_id = task.id.clone();
        let stopper = running.stopper();
        let (kill, killed) = oneshot::channel();
        let waiter = ctx.defer(
            running.wait(killed),
            move |_agent: &mut Agent, ctx, ended| {
                let _ = ctx.pid().tell(AgentMsg(Msg::TaskExited { task_id, ended }));
            },
        );
        self.tasks
            .add_running(framework, task, Some(waiter), Some(kill), Some(stopper));
    }

    /// Starts stopping a running task, as a leader of `term` commands. The answer's error is
    /// empty if it runs, else says why not; a task that already ended by itself says how.
    pub(super) fn kill_task(&mut self, task_id: &str, term: u64) -> KillTaskReply {
        let grace = self.config.kill_grace;
        let stop = Stop {
            grace,
            term: Some(term),
        };
        let (error, ended_as) = match self.tasks.kill(task_id, stop) {
            KillRequest::Stopping => {
                tracing::info!(task = %task_id, ?grace, "killing the task");
                (String::new(), TaskState::Unspecified)
            }
            KillRequest::Ended(state) => (
                format!(
                    "task {task_id:?} has already ended ({})",
                    state.as_str_name()
                ),
                state,
            ),
            KillRequest::Unknown => (
                format!("no task {task_id:?} runs on this agent"),
                TaskState::Unspecified,
            ),
        };
        KillTaskReply {
            error,
            follows_term: 0,
            ended_as: ended_as.into(),
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

    /// A task ended: move the task to the completed history in its final state,
    /// report it and checkpoint it; its executor's files go.
    pub(super) async fn task_exited(&mut self, task_id: &str, ended: Ended) {
        if let Err(error) = &ended.status {
            tracing::warn!(task = %task_id, %error, "the task's exit status is not known");
        }
        let (state, exit_code, message) = final_state(&ended);
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
            store::write_checkpoint(&data_dir, &finished.framework, &finished.task)
                .and_then(|()| store::executor_files(&data_dir, &finished.task.id).remove())
                .map_err(|source| AgentError::StateFile {
                    path: store::checkpoint_dir(&data_dir),
                    source,
                })
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

/// A task's final state, exit code and, if there is more to say, why, from how its process
/// ended: FAILED "out of memory" if the kernel killed it for memory; KILLED if it was asked to
/// stop; else FINISHED on a zero exit, FAILED otherwise (or if the status is not known).
pub(super) fn final_state(ended: &Ended) -> (TaskState, i32, Option<String>) {
    match &ended.status {
        Ok(status) if ended.out_of_memory => (
            TaskState::Failed,
            child_process::exit_code(status),
            Some("out of memory".to_owned()),
        ),
        Ok(status) => {
            let state = if ended.killed {
                TaskState::Killed
            } else if status.success() {
                TaskState::Finished
            } else {
                TaskState::Failed
            };
            (state, child_process::exit_code(status), None)
        }
        Err(error) if ended.killed => (TaskState::Killed, -1, Some(error.to_string())),
        Err(error) => (TaskState::Failed, -1, Some(error.to_string())),
    }
}

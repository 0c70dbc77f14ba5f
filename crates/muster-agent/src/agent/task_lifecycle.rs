//! What the agent process does with tasks: starts them (checks the request, checkpoints, has
//! its [`TaskRunner`](crate::runner::TaskRunner) run the task: a child process in its working
//! directory, or a task of the runner its config gives), stops them when the master asks,
//! records how they ended, and reports every change of state to the master as a
//! `TaskStatusUpdate`, keeping the updates it cannot send yet for its next registration. The
//! task table itself is [`Tasks`](crate::tasks::Tasks).

use std::collections::VecDeque;
use std::os::unix::process::ExitStatusExt as _;
use std::process::ExitStatus;

use muster_actor::Context;
use muster_proto::cluster::{Framework, KillTaskReply, RunTask, TaskStatusUpdate};
use muster_proto::model::{Task, TaskState};

use super::master_link::Connection;
use super::{Agent, AgentMsg, Msg};
use crate::AgentError;
use crate::runner::{self, RunnerTask, StartError, TaskEnd};
use crate::store::{self, TaskIdError, blocking};
use crate::task_user::{self, UserError};
use crate::tasks::KillRequest;

/// Why the agent did not start a task: the task FAILED, with this as its message, and the
/// master that asked hears it as the answer's error.
#[derive(Debug, thiserror::Error)]
pub(super) enum Refused {
    /// The request holds no task.
    #[error("the request carries no task")]
    NoTask,
    /// The task's id cannot be used.
    #[error(transparent)]
    TaskId(#[from] TaskIdError),
    /// A task of this id runs, or ran, here.
    #[error("task {0:?} already exists on this agent")]
    Exists(String),
    /// The task names another framework than the request.
    #[error("task {id:?} names framework {named:?} but the request is for framework {requested:?}")]
    OtherFramework {
        /// The task.
        id: String,
        /// The framework the task names.
        named: String,
        /// The request's framework.
        requested: String,
    },
    /// Neither the task nor the request names a framework.
    #[error("task {0:?} names no framework")]
    NoFramework(String),
    /// The task has no command.
    #[error("task {0:?} has no command")]
    NoCommand(String),
    /// How it is to be restarted, checked or stopped cannot be read.
    #[error("task {id:?}: lifecycle.{error}")]
    Lifecycle {
        /// The task.
        id: String,
        /// What is wrong.
        error: muster_model::FieldError,
    },
    /// The task names a user the agent does not allow.
    #[error("task {id:?}: {error}")]
    User {
        /// The task.
        id: String,
        /// Why.
        error: UserError,
    },
    /// The runner cannot run the task, or could not start it.
    #[error("task {id:?}: {error}")]
    Runner {
        /// The task.
        id: String,
        /// Why.
        error: StartError,
    },
    /// The task could not be checkpointed as STARTING: it did not start.
    #[error(transparent)]
    Starting(CheckpointError),
    /// The task started but could not be checkpointed as RUNNING: it was killed.
    #[error("task {id:?}: cannot checkpoint it: {error}")]
    Running {
        /// The task.
        id: String,
        /// Why.
        error: CheckpointError,
    },
}

/// A task's checkpoint could not be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot checkpoint the task: {0}")]
pub(super) struct CheckpointError(AgentError);

impl Agent {
    /// Starts a task, or says why not. A refused task (one not already running under its id)
    /// is also reported FAILED, with the reason in its `message`, so the master hears of it
    /// whether it asked or told.
    pub(super) async fn run_task(
        &mut self,
        request: RunTask,
        ctx: &mut Context<Self>,
    ) -> Result<(), Refused> {
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
            task.message = error.to_string();
            self.report(task);
        }
        started
    }

    /// Starts a task (reporting STARTING, then RUNNING) on the agent's runner, or says why
    /// not.
    async fn start_task(
        &mut self,
        request: RunTask,
        ctx: &mut Context<Self>,
    ) -> Result<(), Refused> {
        let Some(mut task) = request.task else {
            return Err(Refused::NoTask);
        };
        store::check_task_id(&task.id)?;
        let id = task.id.clone();
        if self.tasks.knows(&id) {
            return Err(Refused::Exists(id));
        }
        let framework = self.framework_of(&mut task, request.framework)?;
        if task.command.trim().is_empty() {
            return Err(Refused::NoCommand(id));
        }
        if let Some(lifecycle) = task.lifecycle.clone()
            && let Err(error) = muster_model::convert::Lifecycle::try_from(*lifecycle)
        {
            return Err(Refused::Lifecycle { id, error });
        }
        // Whom it may run as is the agent's rule; whether the machine can run it so, its
        // runner's.
        let user = match self.task_users.named(&task.user) {
            Ok(user) => user.map(str::to_owned),
            Err(error) => return Err(Refused::User { id, error }),
        };
        let runner = self.runner.clone();
        if let Err(error) = runner.admit(&task, user.as_deref()) {
            return Err(Refused::Runner { id, error });
        }
        // Accepted: STARTING until it runs. Checkpointed as such first, so that an agent
        // stopped in the middle of the start finds (and ends) what it had started.
        task.state = TaskState::Starting as i32;
        self.checkpoint(&framework, &task)
            .await
            .map_err(Refused::Starting)?;
        self.report(task.clone());

        // Its ports reach it in its environment, not in what the agent keeps and reports.
        let started = with_port_variables(&task, &self.info.address);
        let running = match runner.start(&started, user.as_deref(), self.term).await {
            Ok(running) => running,
            Err(error) => return Err(Refused::Runner { id, error }),
        };
        task.state = TaskState::Running as i32;
        task.exit_code = 0;
        if let Err(error) = self.checkpoint(&framework, &task).await {
            // Untracked, it would outlive a restart unseen: it does not run at all.
            runner::kill_and_wait(running).await;
            return Err(Refused::Running { id, error });
        }
        match running.pid() {
            Some(pid) => {
                let user = running.uid().map(task_user::name_of).unwrap_or_default();
                tracing::info!(task = %id, framework = %framework.id, pid, %user, command = %task.command, "task running");
            }
            None => {
                tracing::info!(task = %id, framework = %framework.id, command = %task.command, term = self.term, "task running");
            }
        }
        self.report(task.clone());
        self.watch(framework, task, running, ctx);
        Ok(())
    }

    /// Records `task` of `framework` (its latest state) in its checkpoint.
    pub(super) async fn checkpoint(
        &self,
        framework: &Framework,
        task: &Task,
    ) -> Result<(), CheckpointError> {
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
        .map_err(CheckpointError)
    }

    /// Watches a running task until it ends, and records it as running; its health checks and
    /// longest-run timer start.
    pub(super) fn watch(
        &mut self,
        framework: Framework,
        task: Task,
        running: Box<dyn RunnerTask>,
        ctx: &mut Context<Self>,
    ) {
        let task_id = task.id.clone();
        let pid = running.pid();
        let (waiter, kill, stopper) = Self::wait_for(&task_id, running, ctx);
        self.tasks
            .add_running(framework, task, Some(waiter), Some(kill), Some(stopper));
        self.supervise_run(&task_id, pid, ctx);
    }

    /// Starts stopping a running task, as a leader of `term` commands: its group's kill signal,
    /// then SIGKILL after its kill timeout (the agent's `kill_grace` if it names none). The
    /// answer's error is empty if it runs, else says why not; a task that already ended by
    /// itself says how. A task waiting to restart ends at once.
    pub(super) fn kill_task(
        &mut self,
        task_id: &str,
        term: u64,
        ctx: &mut Context<Self>,
    ) -> KillTaskReply {
        let default_grace = self.config.kill_grace;
        let stop = match self.tasks.supervised(task_id) {
            Some((_, supervision)) => {
                super::supervision::stop_of(&supervision.lifecycle, default_grace, Some(term))
            }
            None => super::supervision::stop_of(&Default::default(), default_grace, Some(term)),
        };
        let (error, ended_as) = match self.tasks.kill(task_id, stop) {
            KillRequest::Stopping => {
                tracing::info!(task = %task_id, grace = ?stop.grace, signal = stop.signal, "killing the task");
                (String::new(), TaskState::Unspecified)
            }
            KillRequest::Waiting(ended) => {
                tracing::info!(task = %task_id, "killing a task that waits to restart");
                let exited = Msg::TaskExited {
                    task_id: task_id.to_owned(),
                    ended,
                };
                let _ = ctx.pid().tell(AgentMsg(exited));
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
    ) -> Result<Framework, Refused> {
        let id = &task.id;
        match framework.filter(|f| !f.id.is_empty()) {
            Some(framework) => {
                if task.framework_id.is_empty() {
                    task.framework_id = framework.id.clone();
                } else if task.framework_id != framework.id {
                    return Err(Refused::OtherFramework {
                        id: id.clone(),
                        named: task.framework_id.clone(),
                        requested: framework.id,
                    });
                }
                Ok(framework)
            }
            None if task.framework_id.is_empty() => Err(Refused::NoFramework(id.clone())),
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

    /// A task ended: unless its restart policy starts it again in place, move the task to the
    /// completed history in its final state, report it and checkpoint it; its executor's files
    /// go.
    pub(super) async fn task_exited(
        &mut self,
        task_id: &str,
        ended: TaskEnd,
        ctx: &mut Context<Self>,
    ) {
        if let Err(error) = &ended.status {
            tracing::warn!(task = %task_id, %error, "the task's exit status is not known");
        }
        let Some((state, exit_code, message)) = self.settle_end(task_id, &ended, ctx).await else {
            return;
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
    pub(super) fn report(&mut self, mut task: Task) {
        // The master has it from the job: the agent's word on it is not needed.
        task.lifecycle = None;
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

/// A task's final state, exit code and, if there is more to say, why, from how it ended:
/// FAILED "out of memory" if the kernel killed it for memory; KILLED if it was asked to stop;
/// else FINISHED on a zero exit, FAILED otherwise (or if the status is not known).
pub(super) fn final_state(ended: &TaskEnd) -> (TaskState, i32, Option<String>) {
    match &ended.status {
        Ok(status) if ended.out_of_memory => (
            TaskState::Failed,
            exit_code(status),
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
            (state, exit_code(status), None)
        }
        Err(error) if ended.killed => (TaskState::Killed, -1, Some(error.clone())),
        Err(error) => (TaskState::Failed, -1, Some(error.clone())),
    }
}

/// The exit code, or 128 + the signal number for a process killed by a signal (as shells do).
fn exit_code(status: &ExitStatus) -> i32 {
    if let Some(code) = status.code() {
        return code;
    }
    if let Some(signal) = status.signal() {
        return 128 + signal;
    }
    -1
}

/// `task` with its ports in its environment (see [`muster_model::ports::port_variables`]):
/// borrowed as it is when it has none. The host is the one in the agent's own address
/// (`agent@host:port`), where masters and other agents reach it.
pub(super) fn with_port_variables<'a>(
    task: &'a Task,
    agent_address: &str,
) -> std::borrow::Cow<'a, Task> {
    if task.ports.is_empty() {
        return std::borrow::Cow::Borrowed(task);
    }
    let ports: Vec<muster_model::AssignedPort> = task
        .ports
        .iter()
        .filter_map(|port| {
            Some(muster_model::AssignedPort {
                label: port.label.clone(),
                port: u16::try_from(port.port).ok()?,
            })
        })
        .collect();
    let mut started = task.clone();
    started.env.extend(muster_model::ports::port_variables(
        host_of(agent_address),
        &ports,
    ));
    std::borrow::Cow::Owned(started)
}

/// The host of a process address, `name@host:port` (`[::1]` as `::1`).
pub(super) fn host_of(address: &str) -> &str {
    let authority = address.rsplit_once('@').map_or(address, |(_, at)| at);
    let host = authority
        .rsplit_once(':')
        .map_or(authority, |(host, _)| host);
    host.trim_start_matches('[').trim_end_matches(']')
}

#[cfg(test)]
mod port_tests {
    use super::*;

    #[test]
    fn a_task_finds_its_ports_at_the_agents_host() {
        assert_eq!(host_of("agent@10.0.0.7:5051"), "10.0.0.7");
        assert_eq!(host_of("agent@[::1]:5051"), "::1");
        let mut task = Task {
            env: [("A".to_owned(), "1".to_owned())].into(),
            ..Task::default()
        };
        assert!(matches!(
            with_port_variables(&task, "agent@h:1"),
            std::borrow::Cow::Borrowed(_)
        ));
        task.ports.push(muster_proto::model::AssignedPort {
            label: "http".into(),
            port: 20_123,
        });
        let started = with_port_variables(&task, "agent@127.0.0.9:5051");
        assert_eq!(started.env["MUSTER_ADDR_HTTP"], "127.0.0.9:20123");
        assert_eq!(started.env["A"], "1");
        assert!(
            !task.env.contains_key("MUSTER_PORT_HTTP"),
            "the kept task is unchanged"
        );
    }
}

//! What the agent does for a running task beyond waiting for its end, as its group's lifecycle
//! says (see [`Supervision`](crate::tasks::Supervision)): it runs the task's health checks and
//! reports its health, stops it when it turns unhealthy or runs past its longest run, restarts
//! it in place when it fails (its restart policy), and stops it with its own signal and grace.

use std::sync::Arc;
use std::time::Duration;

use muster_actor::Context;
use muster_model::convert::Lifecycle;
use muster_model::{KillSignal, TaskHealth};
use muster_proto::model::{Task, TaskState};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::task_lifecycle::{final_state, host_of, with_port_variables};
use super::{Agent, AgentMsg, Msg};
use crate::health::{self, Target};
use crate::restarts::Restart;
use crate::runner::{RunnerTask, Stop, TaskEnd};
use crate::store::{self, blocking};
use crate::tasks::{AgentStop, Stopper};

/// The signal number of a kill signal.
pub(super) fn signal_number(signal: KillSignal) -> i32 {
    match signal {
        KillSignal::Term => libc::SIGTERM,
        KillSignal::Int => libc::SIGINT,
        KillSignal::Quit => libc::SIGQUIT,
        KillSignal::Hup => libc::SIGHUP,
        KillSignal::Usr1 => libc::SIGUSR1,
        KillSignal::Usr2 => libc::SIGUSR2,
    }
}

/// How a task of `lifecycle` is stopped: its signal, then SIGKILL after its kill timeout (the
/// agent's `default_grace` if its group names none).
pub(super) fn stop_of(lifecycle: &Lifecycle, default_grace: Duration, term: Option<u64>) -> Stop {
    Stop {
        grace: lifecycle
            .kill_timeout_ms
            .map_or(default_grace, Duration::from_millis),
        signal: signal_number(lifecycle.kill_signal),
        term,
    }
}

impl Agent {
    /// Waits for `running`, a run of task `task_id`, to end (a `TaskExited` follows): the
    /// waiter, what asks it to stop, and what ends it at once.
    pub(super) fn wait_for(
        task_id: &str,
        running: Box<dyn RunnerTask>,
        ctx: &mut Context<Self>,
    ) -> (muster_actor::TimerHandle, oneshot::Sender<Stop>, Stopper) {
        let stopper = Stopper::of(running.as_ref());
        let (kill, killed) = oneshot::channel();
        let task_id = task_id.to_owned();
        let waiter = ctx.defer(
            running.wait(killed),
            move |_agent: &mut Agent, ctx, ended| {
                let _ = ctx.pid().tell(AgentMsg(Msg::TaskExited { task_id, ended }));
            },
        );
        (waiter, kill, stopper)
    }

    /// A run of task `task_id` began (its process is `pid`, if it is one): its health checks
    /// start, and the timer of its longest run.
    pub(super) fn supervise_run(
        &mut self,
        task_id: &str,
        pid: Option<i32>,
        ctx: &mut Context<Self>,
    ) {
        let host = host_of(&self.info.address).to_owned();
        let address = self.info.address.clone();
        let data_dir = self.config.data_dir.clone();
        let Some((task, supervision)) = self.tasks.supervised(task_id) else {
            return;
        };
        supervision.run += 1;
        let run = supervision.run;
        let lifecycle = Arc::clone(&supervision.lifecycle);
        if let Some(ms) = lifecycle.max_run_duration_ms {
            let too_long = Msg::RunTooLong {
                task_id: task_id.to_owned(),
                run,
            };
            supervision.hold(ctx.delay(Duration::from_millis(ms), AgentMsg(too_long)));
        }
        if lifecycle.checks.is_empty() {
            return;
        }
        task.health = TaskHealth::Starting.into();
        let target = Target {
            host,
            ports: task
                .ports
                .iter()
                .filter_map(|p| Some((p.label.clone(), u16::try_from(p.port).ok()?)))
                .collect(),
            env: with_port_variables(task, &address)
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            // A process's checks run where it runs, as whom it runs.
            dir: pid.map(|_| store::task_dir(&data_dir, task_id)),
            credentials: None,
            no_command: None,
        };
        let mut target = target;
        if crate::task_user::agent_is_root() {
            target.credentials = pid.and_then(health::process_credentials);
            if target.credentials.is_none() {
                target.no_command = Some(
                    "the task's user is not known: a root agent runs no check command as root"
                        .into(),
                );
            }
        }
        let me = ctx.pid().clone();
        let id = task_id.to_owned();
        let watching = health::watch(
            lifecycle.checks.clone(),
            target,
            Instant::now(),
            move |health, why| {
                let said = Msg::TaskHealth {
                    task_id: id.clone(),
                    run,
                    health,
                    why,
                };
                let _ = me.tell(AgentMsg(said));
            },
        );
        supervision.hold(ctx.defer(watching, |_, _, ()| {}));
    }

    /// Task `task_id`'s checks, in run `run`, say `health` (`why`: what the last probe said):
    /// reported; an unhealthy task is stopped, and its restart policy answers the failure.
    pub(super) fn task_health(&mut self, task_id: &str, run: u64, health: TaskHealth, why: String) {
        let default_grace = self.config.kill_grace;
        let Some((task, supervision)) = self.tasks.supervised(task_id) else {
            return;
        };
        if supervision.run != run
            || supervision.killed
            || supervision.waiting_to_restart
            || supervision.stopping_for.is_some()
        {
            return;
        }
        let stop = stop_of(&supervision.lifecycle, default_grace, None);
        let wire: i32 = health.into();
        if task.health != wire {
            task.health = wire;
            match health {
                TaskHealth::Unhealthy => task.message = format!("unhealthy: {why}"),
                TaskHealth::Healthy => task.message.clear(),
                TaskHealth::Starting | TaskHealth::None => {}
            }
            tracing::info!(task = %task_id, health = health.as_str(), %why, "task health changed");
            let reported = task.clone();
            self.report(reported);
        }
        if health == TaskHealth::Unhealthy {
            tracing::warn!(task = %task_id, %why, "task unhealthy: stopping it");
            self.tasks
                .stop_for(task_id, AgentStop::Unhealthy(why), stop);
        }
    }

    /// Run `run` of task `task_id` reached its group's longest run: it is stopped, and FAILED.
    pub(super) fn run_too_long(&mut self, task_id: &str, run: u64) {
        let default_grace = self.config.kill_grace;
        let Some((_, supervision)) = self.tasks.supervised(task_id) else {
            return;
        };
        if supervision.run != run || supervision.killed || supervision.waiting_to_restart {
            return;
        }
        let limit = Duration::from_millis(supervision.lifecycle.max_run_duration_ms.unwrap_or(0));
        let why = format!(
            "it ran past its max_run_duration of {}",
            humantime::format_duration(limit)
        );
        let stop = stop_of(&supervision.lifecycle, default_grace, None);
        tracing::warn!(task = %task_id, %why, "stopping the task");
        self.tasks
            .stop_for(task_id, AgentStop::RanTooLong(why), stop);
    }

    /// How a run of task `task_id` that ended so comes out: its state, exit code and message,
    /// or `None` when it is restarted in place instead (it then waits, STARTING, and its end
    /// is not final).
    pub(super) async fn settle_end(
        &mut self,
        task_id: &str,
        ended: &TaskEnd,
        ctx: &mut Context<Self>,
    ) -> Option<(TaskState, i32, Option<String>)> {
        let Some((task, supervision)) = self.tasks.supervised(task_id) else {
            return Some(final_state(ended));
        };
        let (state, exit_code, message) = final_state(ended);
        let stopped_for = supervision.stopping_for.take();
        if supervision.killed {
            return Some((state, exit_code, message));
        }
        let (state, message) = match stopped_for {
            Some(AgentStop::RanTooLong(why)) => {
                return Some((TaskState::Failed, exit_code, Some(why)));
            }
            Some(AgentStop::Unhealthy(why)) => {
                (TaskState::Failed, Some(format!("unhealthy: {why}")))
            }
            None => (state, message),
        };
        if state != TaskState::Failed {
            return Some((state, exit_code, message));
        }
        let how = message
            .clone()
            .unwrap_or_else(|| format!("it exited with {exit_code}"));
        let policy = supervision.lifecycle.restart;
        let (wait, attempt) = match supervision.restarts.failed(policy.as_ref(), Instant::now()) {
            Restart::After { wait, attempt } => (wait, attempt),
            Restart::GiveUp(why) => {
                let message = match policy {
                    Some(_) => Some(format!("{how}; {why}")),
                    None => message,
                };
                return Some((state, exit_code, message));
            }
        };
        supervision.waiting_to_restart = true;
        supervision.last_end = Some(ended.clone());
        supervision.cancel_timers();
        // What the ended run's checks and timers still say is about a run that is over.
        supervision.run += 1;
        let attempts = policy.map_or(0, |p| p.attempts);
        task.state = TaskState::Starting.into();
        task.exit_code = exit_code;
        task.restarts = task.restarts.saturating_add(1);
        task.health = if supervision.lifecycle.checks.is_empty() {
            TaskHealth::None
        } else {
            TaskHealth::Starting
        }
        .into();
        let which = if attempt <= attempts {
            format!("restart {attempt} of {attempts}")
        } else {
            "its restart interval waited out".to_owned()
        };
        task.message = format!(
            "{how}: restarting in {} ({which})",
            humantime::format_duration(wait)
        );
        let restart = Msg::RestartTask {
            task_id: task_id.to_owned(),
            run: supervision.run,
        };
        supervision.hold(ctx.delay(wait, AgentMsg(restart)));
        let task = task.clone();
        // Nothing of the ended run is left to stop or watch.
        self.tasks.forget_run(task_id);
        tracing::warn!(task = %task_id, message = %task.message, "task failed: restarting it in place");
        self.checkpoint_restarting(&task).await;
        self.report(task);
        None
    }

    /// Records a task that waits to restart; its last run's executor files go, so that the
    /// next run's are its own.
    async fn checkpoint_restarting(&self, task: &Task) {
        let Some(framework) = self.tasks.framework(&task.framework_id).cloned() else {
            return;
        };
        let (data_dir, task) = (self.config.data_dir.clone(), task.clone());
        let written = blocking(move || {
            store::executor_files(&data_dir, &task.id)
                .remove()
                .and_then(|()| store::write_checkpoint(&data_dir, &framework, &task))
                .map_err(|source| crate::AgentError::StateFile {
                    path: store::checkpoint_dir(&data_dir),
                    source,
                })
        })
        .await;
        if let Err(error) = written {
            tracing::warn!(%error, "cannot checkpoint a task waiting to restart");
        }
    }

    /// Time to start task `task_id` again (it waited since run `run` ended): started, RUNNING,
    /// watched and checked anew; or, if it cannot start, FAILED.
    pub(super) async fn restart_task(&mut self, task_id: &str, run: u64, ctx: &mut Context<Self>) {
        let Some((task, supervision)) = self.tasks.supervised(task_id) else {
            return;
        };
        if supervision.run != run || !supervision.waiting_to_restart || supervision.killed {
            return;
        }
        let mut task = task.clone();
        let user = match self.task_users.named(&task.user) {
            Ok(user) => user.map(str::to_owned),
            Err(error) => return self.restart_failed(task_id, error.to_string(), ctx).await,
        };
        let started = with_port_variables(&task, &self.info.address).into_owned();
        let running = match self
            .runner
            .start(&started, user.as_deref(), self.term)
            .await
        {
            Ok(running) => running,
            Err(error) => return self.restart_failed(task_id, error.to_string(), ctx).await,
        };
        task.state = TaskState::Running.into();
        task.message.clear();
        let pid = running.pid();
        tracing::info!(task = %task_id, restarts = task.restarts, ?pid, "task restarted in place");
        let (waiter, kill, stopper) = Self::wait_for(task_id, running, ctx);
        self.tasks.resume(task_id, waiter, kill, stopper);
        if let Some((kept, _)) = self.tasks.supervised(task_id) {
            kept.clone_from(&task);
        }
        self.supervise_run(task_id, pid, ctx);
        let task = self
            .tasks
            .supervised(task_id)
            .map_or(task, |(kept, _)| kept.clone());
        // Its executor's files are this run's now: only the checkpoint is written.
        if let Some(framework) = self.tasks.framework(&task.framework_id).cloned()
            && let Err(error) = self.checkpoint(&framework, &task).await
        {
            tracing::warn!(task = %task_id, %error, "cannot checkpoint a restarted task");
        }
        self.report(task);
    }

    /// A restart could not start the task: it FAILED, with `why`.
    async fn restart_failed(&mut self, task_id: &str, why: String, ctx: &mut Context<Self>) {
        tracing::warn!(task = %task_id, %why, "cannot restart the task");
        if let Some((_, supervision)) = self.tasks.supervised(task_id) {
            supervision.waiting_to_restart = false;
            supervision.killed = true;
        }
        let ended = TaskEnd {
            status: Err(format!("cannot restart it: {why}")),
            killed: false,
            out_of_memory: false,
        };
        self.task_exited(task_id, ended, ctx).await;
    }
}

//! The agent's book of tasks: the running ones with their frameworks and what the agent keeps
//! of each one's life ([`Supervision`]), and a bounded history of completed tasks and
//! frameworks.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use muster_actor::TimerHandle;
use muster_model::convert::Lifecycle;
use muster_proto::cluster::Framework;
use muster_proto::model::{Task, TaskState};
use tokio::sync::oneshot;

use crate::metrics::{CgroupPaths, RunningTask};
use crate::restarts::RestartCount;
use crate::runner::{KillSwitch, RunnerTask, Stop, TaskEnd};

/// What ends a running task at once when the agent stops, and where its usage is read.
#[derive(Clone, Debug)]
pub(crate) struct Stopper {
    switch: KillSwitch,
    /// The task's process, if it is one.
    pid: Option<i32>,
    /// Its cgroup's accounting, if it has one.
    cgroup: Option<CgroupPaths>,
}

impl Stopper {
    /// The stopper of `task`, which the agent starts watching.
    pub(crate) fn of(task: &dyn RunnerTask) -> Stopper {
        Stopper {
            switch: task.kill_switch(),
            pid: task.pid(),
            cgroup: task.cgroup(),
        }
    }

    /// The task's process and cgroup, where its usage can be read.
    fn usage_source(&self) -> (Option<i32>, Option<CgroupPaths>) {
        (self.pid, self.cgroup.clone())
    }

    /// Ends the task at once: SIGKILL to every process of it, or its runner's switch.
    fn kill_now(&self) {
        self.switch.pull();
    }
}

/// What the agent keeps of a running task's life beyond its current process: how its group
/// wants it restarted, checked and stopped, its restarts so far, and the checks and timers of
/// its current run.
#[derive(Debug, Default)]
pub(crate) struct Supervision {
    /// Its restart policy, checks and stop, as its launch carried them.
    pub(crate) lifecycle: Arc<Lifecycle>,
    /// Its restarts in the current window.
    pub(crate) restarts: RestartCount,
    /// The number of its current run (each restart is a new one): what its checks and timers
    /// say they are about.
    pub(crate) run: u64,
    /// The current run's health checks and longest-run timer, or the wait before a restart:
    /// cancelled when the run ends or the task is stopped.
    timers: Vec<TimerHandle>,
    /// It ended and waits to be started again.
    pub(crate) waiting_to_restart: bool,
    /// Why the agent itself is stopping it, if it is: it turned unhealthy (restarted by its
    /// policy), or ran past its longest run (FAILED).
    pub(crate) stopping_for: Option<AgentStop>,
    /// A master asked for it to be killed: it is not restarted.
    pub(crate) killed: bool,
    /// How its last run ended, while it waits to start again.
    pub(crate) last_end: Option<TaskEnd>,
}

/// Why the agent stops a task of its own accord.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum AgentStop {
    /// A health check failed, as this says: a failure its restart policy answers.
    Unhealthy(String),
    /// It ran past its group's longest run, as this says: FAILED, not restarted.
    RanTooLong(String),
}

impl Supervision {
    /// The supervision of a task launched with `lifecycle`.
    pub(crate) fn new(lifecycle: Lifecycle) -> Self {
        Supervision {
            lifecycle: Arc::new(lifecycle),
            ..Supervision::default()
        }
    }

    /// Keeps `timer` until the current run ends.
    pub(crate) fn hold(&mut self, timer: TimerHandle) {
        self.timers.retain(|t| !t.is_finished());
        self.timers.push(timer);
    }

    /// Cancels the current run's checks and timers.
    pub(crate) fn cancel_timers(&mut self) {
        for timer in self.timers.drain(..) {
            timer.cancel();
        }
    }
}

/// A task that runs.
#[derive(Debug)]
struct Active {
    task: Task,
    supervision: Supervision,
    /// The future that waits for the task's end; cancelling it leaves the task running.
    waiter: Option<TimerHandle>,
    /// Ends the task at once (to kill it when the agent stops, if it should).
    stopper: Option<Stopper>,
    /// Asks that future to stop the task (SIGTERM, then SIGKILL after the grace period);
    /// taken by the first kill request.
    kill: Option<oneshot::Sender<Stop>>,
}

/// What became of a request to kill a task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KillRequest {
    /// The task runs: its process is being stopped (or was already, or has just ended and
    /// its end is on its way).
    Stopping,
    /// The task has already ended, in this state.
    Ended(TaskState),
    /// The task waits to be restarted: nothing runs, so it ends now, as it last ended.
    Waiting(TaskEnd),
    /// No such task.
    Unknown,
}

/// What finishing a task changed, for the checkpoints.
#[derive(Debug)]
pub(crate) struct Finished {
    /// The framework and the task in its final state.
    pub(crate) framework: Framework,
    pub(crate) task: Task,
    /// Completed tasks dropped from the history to make room.
    pub(crate) evicted: Vec<String>,
}

/// Running and completed tasks and frameworks.
#[derive(Debug)]
pub(crate) struct Tasks {
    history: usize,
    /// Frameworks with at least one running task, by id.
    frameworks: BTreeMap<String, Framework>,
    active: BTreeMap<String, Active>,
    /// Oldest first.
    completed: VecDeque<Task>,
    /// Frameworks whose tasks all completed, oldest first.
    completed_frameworks: VecDeque<Framework>,
}

impl Tasks {
    pub(crate) fn new(history: usize) -> Self {
        Tasks {
            history,
            frameworks: BTreeMap::new(),
            active: BTreeMap::new(),
            completed: VecDeque::new(),
            completed_frameworks: VecDeque::new(),
        }
    }

    /// True if a task with this id runs or is in the completed history.
    pub(crate) fn knows(&self, task_id: &str) -> bool {
        self.active.contains_key(task_id) || self.completed.iter().any(|t| t.id == task_id)
    }

    /// A framework this agent has seen (running tasks first, then completed).
    pub(crate) fn framework(&self, id: &str) -> Option<&Framework> {
        self.frameworks
            .get(id)
            .or_else(|| self.completed_frameworks.iter().find(|f| f.id == id))
    }

    /// Records a task that runs: `waiter` waits for it, `kill` asks the waiter to stop it,
    /// `stopper` ends it at once.
    pub(crate) fn add_running(
        &mut self,
        framework: Framework,
        task: Task,
        waiter: Option<TimerHandle>,
        kill: Option<oneshot::Sender<Stop>>,
        stopper: Option<Stopper>,
    ) {
        self.completed_frameworks.retain(|f| f.id != framework.id);
        self.frameworks.insert(framework.id.clone(), framework);
        // Checked when it was launched; what a checkpoint of an older agent holds may be none.
        let lifecycle = task
            .lifecycle
            .clone()
            .and_then(|l| Lifecycle::try_from(*l).ok())
            .unwrap_or_default();
        self.active.insert(
            task.id.clone(),
            Active {
                task,
                supervision: Supervision::new(lifecycle),
                waiter,
                kill,
                stopper,
            },
        );
    }

    /// A task that runs, and what the agent keeps of its life.
    pub(crate) fn supervised(&mut self, task_id: &str) -> Option<(&mut Task, &mut Supervision)> {
        self.active
            .get_mut(task_id)
            .map(|active| (&mut active.task, &mut active.supervision))
    }

    /// A task restarted in place runs again: `waiter` waits for it, `kill` asks the waiter to
    /// stop it, `stopper` ends it at once.
    pub(crate) fn resume(
        &mut self,
        task_id: &str,
        waiter: TimerHandle,
        kill: oneshot::Sender<Stop>,
        stopper: Stopper,
    ) {
        if let Some(active) = self.active.get_mut(task_id) {
            active.waiter = Some(waiter);
            active.kill = Some(kill);
            active.stopper = Some(stopper);
            active.supervision.waiting_to_restart = false;
            active.supervision.last_end = None;
        }
    }

    /// The run of a task that waits to restart is over: nothing of it (its waiter, its stop,
    /// its kill switch, its process for the metrics) is kept.
    pub(crate) fn forget_run(&mut self, task_id: &str) {
        if let Some(active) = self.active.get_mut(task_id) {
            active.waiter = None;
            active.kill = None;
            active.stopper = None;
        }
    }

    /// The agent stops a running task of its own accord, for `why`; false if it does not run
    /// (or is already being stopped).
    pub(crate) fn stop_for(&mut self, task_id: &str, why: AgentStop, stop: Stop) -> bool {
        let Some(active) = self.active.get_mut(task_id) else {
            return false;
        };
        let Some(kill) = active.kill.take() else {
            return false;
        };
        active.supervision.cancel_timers();
        active.supervision.stopping_for = Some(why);
        let _ = kill.send(stop);
        true
    }

    /// Adds a task that had already completed (found so by a restarted agent); returns the ids
    /// dropped from the history to make room.
    pub(crate) fn add_completed(&mut self, framework: Framework, task: Task) -> Vec<String> {
        if self.knows(&task.id) {
            return Vec::new();
        }
        if !self.frameworks.contains_key(&framework.id) {
            self.push_completed_framework(framework);
        }
        self.push_completed(task)
    }

    /// Asks a running task's waiter to stop it (its kill signal, SIGKILL after the stop's
    /// grace period). A second request for the same task changes nothing (the first one
    /// stands). A task that waits to restart ends at once ([`KillRequest::Waiting`], once).
    pub(crate) fn kill(&mut self, task_id: &str, stop: Stop) -> KillRequest {
        if let Some(active) = self.active.get_mut(task_id) {
            let supervision = &mut active.supervision;
            supervision.killed = true;
            supervision.cancel_timers();
            if supervision.waiting_to_restart {
                let mut ended = supervision.last_end.take().unwrap_or(TaskEnd {
                    status: Err("killed while waiting to restart".into()),
                    killed: true,
                    out_of_memory: false,
                });
                // Killed, whatever ended its last run.
                ended.killed = true;
                ended.out_of_memory = false;
                supervision.waiting_to_restart = false;
                return KillRequest::Waiting(ended);
            }
            if let Some(kill) = active.kill.take() {
                // An error means the waiter is done: the task ended by itself just now, and
                // its end is already on its way to the agent.
                let _ = kill.send(stop);
            }
            return KillRequest::Stopping;
        }
        match self.completed.iter().rev().find(|t| t.id == task_id) {
            Some(task) => KillRequest::Ended(
                TaskState::try_from(task.state).unwrap_or(TaskState::Unspecified),
            ),
            None => KillRequest::Unknown,
        }
    }

    /// How many tasks run.
    pub(crate) fn running_count(&self) -> usize {
        self.active.len()
    }

    /// Moves a running task to the completed history with its final state. `None` if no such
    /// task runs.
    pub(crate) fn finish(
        &mut self,
        task_id: &str,
        state: TaskState,
        exit_code: i32,
        message: Option<String>,
    ) -> Option<Finished> {
        let Active {
            mut task,
            mut supervision,
            ..
        } = self.active.remove(task_id)?;
        supervision.cancel_timers();
        task.state = state as i32;
        task.exit_code = exit_code;
        if let Some(message) = message {
            task.message = message;
        }
        let framework_id = task.framework_id.clone();
        let framework = self
            .frameworks
            .get(&framework_id)
            .cloned()
            .unwrap_or_else(|| Framework {
                id: framework_id.clone(),
                name: String::new(),
            });
        let framework_done = !self
            .active
            .values()
            .any(|a| a.task.framework_id == framework_id);
        if framework_done && let Some(done) = self.frameworks.remove(&framework_id) {
            self.push_completed_framework(done);
        }
        let evicted = self.push_completed(task.clone());
        Some(Finished {
            framework,
            task,
            evicted,
        })
    }

    /// Adds a completed task, dropping the oldest beyond the history; returns the dropped ids.
    fn push_completed(&mut self, task: Task) -> Vec<String> {
        self.completed.push_back(task);
        let mut evicted = Vec::new();
        while self.completed.len() > self.history {
            if let Some(old) = self.completed.pop_front() {
                evicted.push(old.id);
            }
        }
        evicted
    }

    fn push_completed_framework(&mut self, framework: Framework) {
        self.completed_frameworks.retain(|f| f.id != framework.id);
        self.completed_frameworks.push_back(framework);
        while self.completed_frameworks.len() > self.history.max(1) {
            self.completed_frameworks.pop_front();
        }
    }

    /// Frameworks with running tasks.
    pub(crate) fn frameworks(&self) -> Vec<Framework> {
        self.frameworks.values().cloned().collect()
    }

    /// Running tasks.
    pub(crate) fn running(&self) -> Vec<Task> {
        self.active.values().map(|a| a.task.clone()).collect()
    }

    /// Frameworks whose tasks all completed, oldest first.
    pub(crate) fn completed_frameworks(&self) -> Vec<Framework> {
        self.completed_frameworks.iter().cloned().collect()
    }

    /// Completed tasks, oldest first.
    pub(crate) fn completed(&self) -> Vec<Task> {
        self.completed.iter().cloned().collect()
    }

    /// The running tasks, with where their usage can be read (for the metrics).
    pub(crate) fn running_for_metrics(&self) -> Vec<RunningTask> {
        self.active
            .values()
            .map(|active| {
                let (pid, cgroup) = active
                    .stopper
                    .as_ref()
                    .map_or((None, None), Stopper::usage_source);
                let mut task = RunningTask::default();
                task.task_id.clone_from(&active.task.id);
                task.job.clone_from(&active.task.job);
                task.pid = pid;
                task.cgroup = cgroup;
                task
            })
            .collect()
    }

    /// The completed history's tasks counted by final state (`finished`, `failed`, ...).
    pub(crate) fn completed_by_state(&self) -> BTreeMap<String, u64> {
        let mut counts = BTreeMap::new();
        for task in &self.completed {
            let state = TaskState::try_from(task.state).unwrap_or(TaskState::Unspecified);
            let name = state
                .as_str_name()
                .trim_start_matches("TASK_STATE_")
                .to_ascii_lowercase();
            *counts.entry(name).or_insert(0) += 1;
        }
        counts
    }

    /// The ids of the running tasks.
    pub(crate) fn running_ids(&self) -> Vec<String> {
        self.active.keys().cloned().collect()
    }

    /// The agent stops: stops waiting for the running tasks and, with `kill`, ends each of
    /// them at once (SIGKILL). Returns the running tasks with their frameworks, in state KILLED if
    /// killed, for the checkpoints.
    pub(crate) fn stop_all(&mut self, kill: bool) -> Vec<(Framework, Task)> {
        let mut stopped = Vec::new();
        for active in self.active.values_mut() {
            if let Some(waiter) = active.waiter.take() {
                waiter.cancel();
            }
            active.supervision.cancel_timers();
            let mut task = active.task.clone();
            if kill && let Some(stopper) = &active.stopper {
                stopper.kill_now();
                task.state = TaskState::Killed as i32;
                task.exit_code = 128 + libc::SIGKILL;
                task.message = "the agent stopped, and killed its tasks".into();
            }
            let framework = self
                .frameworks
                .get(&task.framework_id)
                .cloned()
                .unwrap_or_else(|| Framework {
                    id: task.framework_id.clone(),
                    name: String::new(),
                });
            stopped.push((framework, task));
        }
        stopped
    }
}

/// True for a state a task does not leave.
pub(crate) fn is_terminal(state: i32) -> bool {
    matches!(
        TaskState::try_from(state),
        Ok(TaskState::Finished | TaskState::Failed | TaskState::Killed | TaskState::Lost)
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn stop(grace: Duration) -> Stop {
        Stop {
            grace,
            signal: libc::SIGTERM,
            term: Some(1),
        }
    }

    fn task(id: &str, framework: &str) -> Task {
        Task {
            id: id.into(),
            framework_id: framework.into(),
            state: TaskState::Running as i32,
            ..Task::default()
        }
    }

    fn framework(id: &str) -> Framework {
        Framework {
            id: id.into(),
            name: format!("{id}-name"),
        }
    }

    #[test]
    fn history_is_bounded_and_frameworks_complete_with_their_last_task() {
        let mut tasks = Tasks::new(2);
        for id in ["a", "b", "c"] {
            tasks.add_running(framework("f"), task(id, "f"), None, None, None);
        }
        tasks.add_running(framework("g"), task("d", "g"), None, None, None);
        let Some(done) = tasks.finish("a", TaskState::Finished, 0, None) else {
            panic!("a runs")
        };
        assert_eq!(done.framework.name, "f-name");
        assert!(done.evicted.is_empty());
        assert_eq!(tasks.frameworks().len(), 2, "f still has b and c");
        assert!(tasks.finish("b", TaskState::Failed, 3, None).is_some());
        let Some(done) = tasks.finish("c", TaskState::Finished, 0, None) else {
            panic!("c runs")
        };
        assert_eq!(done.evicted, vec!["a".to_owned()]);
        assert_eq!(tasks.frameworks(), vec![framework("g")]);
        assert_eq!(tasks.completed_frameworks(), vec![framework("f")]);
        assert!(tasks.knows("b") && tasks.knows("d") && !tasks.knows("a"));
        assert!(tasks.finish("zz", TaskState::Finished, 0, None).is_none());
    }

    #[test]
    fn a_kill_reaches_the_waiter_once_and_ended_or_unknown_tasks_are_told_apart() {
        let mut tasks = Tasks::new(10);
        let (kill, mut killed) = oneshot::channel();
        tasks.add_running(framework("f"), task("a", "f"), None, Some(kill), None);
        let grace = Duration::from_millis(250);
        assert_eq!(tasks.kill("a", stop(grace)), KillRequest::Stopping);
        assert_eq!(killed.try_recv(), Ok(stop(grace)));
        // Asked again while it is still stopping: nothing more is sent, still fine.
        assert_eq!(tasks.kill("a", stop(Duration::ZERO)), KillRequest::Stopping);
        assert!(tasks.finish("a", TaskState::Killed, 143, None).is_some());
        assert_eq!(
            tasks.kill("a", stop(grace)),
            KillRequest::Ended(TaskState::Killed)
        );
        assert_eq!(tasks.kill("b", stop(grace)), KillRequest::Unknown);
        // A waiter that is already done (its process ended by itself): still stopping, its
        // end is on its way.
        let (kill, done) = oneshot::channel::<Stop>();
        drop(done);
        tasks.add_running(framework("f"), task("c", "f"), None, Some(kill), None);
        assert_eq!(tasks.kill("c", stop(grace)), KillRequest::Stopping);
    }
}

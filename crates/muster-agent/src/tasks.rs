//! The agent's book of tasks: the running ones with their frameworks, and a bounded history of
//! completed tasks and frameworks.

use std::collections::{BTreeMap, VecDeque};

use muster_actor::TimerHandle;
use muster_proto::cluster::Framework;
use muster_proto::model::{Task, TaskState};
use tokio::sync::oneshot;

use crate::metrics::{CgroupPaths, RunningTask};
use crate::runner::{KillSwitch, RunnerTask, Stop};

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

/// A task that runs.
#[derive(Debug)]
struct Active {
    task: Task,
    /// The future that waits for the task's end; cancelling it leaves the task running.
    waiter: Option<TimerHandle>,
    /// Ends the task at once (to kill it when the agent stops, if it should).
    stopper: Option<Stopper>,
    /// Asks that future to stop the task (SIGTERM, then SIGKILL after the grace period);
    /// taken by the first kill request.
    kill: Option<oneshot::Sender<Stop>>,
}

/// What became of a request to kill a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KillRequest {
    /// The task runs: its process is being stopped (or was already, or has just ended and
    /// its end is on its way).
    Stopping,
    /// The task has already ended, in this state.
    Ended(TaskState),
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
        self.active.insert(
            task.id.clone(),
            Active {
                task,
                waiter,
                kill,
                stopper,
            },
        );
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

    /// Asks a running task's waiter to stop it (SIGTERM, SIGKILL after the stop's grace
    /// period). A second request for the same task changes nothing (the first one stands).
    pub(crate) fn kill(&mut self, task_id: &str, stop: Stop) -> KillRequest {
        if let Some(active) = self.active.get_mut(task_id) {
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
        let Active { mut task, .. } = self.active.remove(task_id)?;
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

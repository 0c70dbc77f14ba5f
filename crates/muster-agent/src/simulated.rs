//! Simulated tasks, for deterministic simulation tests: a [`TaskRunner`] whose tasks are
//! entries in an in-memory "machine" instead of processes.
//!
//! A simulation makes one [`SimulatedTasks`] per agent host and hands it to every incarnation
//! of that host's agent: tasks outlive an agent restart and are re-attached by its recovery,
//! as real tasks under their executors are, and [`reboot`](SimulatedTasks::reboot) models the
//! machine crashing, which takes its tasks with it. What tasks do: `exit N` ends at once with
//! exit code N; `sleep N` ends with 0 after N seconds of the simulation's clock; anything else
//! runs until the agent stops it. The machine also keeps what the invariant checks need: every
//! launch with the term of the leader that sent it, and what runs now.
//!
//! Nothing here uses threads, the wall clock or hash order: a seed replays exactly.

use std::collections::BTreeMap;
use std::fmt;
use std::os::unix::process::ExitStatusExt as _;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use muster_proto::model::Task;
use tokio::sync::{Notify, oneshot};

use crate::runner::{BoxFuture, Reattached, RunnerTask, TaskEnd, TaskRunner};

/// One launch the machine carried out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// The task's id.
    pub task_id: String,
    /// Its name (`job.group[index]`).
    pub name: String,
    /// The raft term of the leader whose command launched it.
    pub term: u64,
    /// When, on the simulation's clock.
    pub at: Duration,
}

#[derive(Clone, Debug)]
enum State {
    Running { ends_at: Option<Duration> },
    Ended(TaskEnd),
}

#[derive(Debug)]
struct SimTask {
    name: String,
    state: State,
}

#[derive(Debug, Default)]
struct Machine {
    tasks: BTreeMap<String, SimTask>,
    launches: Vec<Launch>,
}

struct Shared {
    machine: Mutex<Machine>,
    changed: Notify,
    clock: fn() -> Duration,
}

/// A simulated machine's tasks (see the module). Clones share the machine.
#[derive(Clone)]
pub struct SimulatedTasks {
    shared: Arc<Shared>,
}

impl fmt::Debug for SimulatedTasks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimulatedTasks")
            .field("tasks", &self.lock().tasks.len())
            .finish()
    }
}

fn exited(code: i32) -> ExitStatus {
    ExitStatus::from_raw((code & 0xff) << 8)
}

fn signalled(signal: i32) -> ExitStatus {
    ExitStatus::from_raw(signal & 0x7f)
}

impl SimulatedTasks {
    /// A machine with no tasks, whose time is `clock` (the simulation's elapsed time, the
    /// same for every host and every incarnation of a host).
    pub fn new(clock: fn() -> Duration) -> Self {
        SimulatedTasks {
            shared: Arc::new(Shared {
                machine: Mutex::new(Machine::default()),
                changed: Notify::new(),
                clock,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Machine> {
        self.shared
            .machine
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    fn now(&self) -> Duration {
        (self.shared.clock)()
    }

    /// The machine crashed: every task is gone, with no exit status.
    pub fn reboot(&self) {
        self.lock().tasks.clear();
        self.shared.changed.notify_waiters();
    }

    /// Every launch so far, in order.
    pub fn launches(&self) -> Vec<Launch> {
        self.lock().launches.clone()
    }

    /// The terms of the commands that launched tasks, in the order they were obeyed.
    pub fn obeyed_terms(&self) -> Vec<u64> {
        self.lock().launches.iter().map(|l| l.term).collect()
    }

    /// The names of the tasks running now, in task id order.
    pub fn running_names(&self) -> Vec<String> {
        let now = self.now();
        self.lock()
            .tasks
            .values()
            .filter(|t| matches!(t.state, State::Running { ends_at } if ends_at.is_none_or(|end| end > now)))
            .map(|t| t.name.clone())
            .collect()
    }

    /// Ends `task_id` if it is still running, with `end`; answers how it ended.
    fn end(&self, task_id: &str, end: TaskEnd) -> Option<TaskEnd> {
        let mut machine = self.lock();
        let task = machine.tasks.get_mut(task_id)?;
        if let State::Ended(earlier) = task.state {
            return Some(earlier);
        }
        task.state = State::Ended(end);
        drop(machine);
        self.shared.changed.notify_waiters();
        Some(end)
    }

    fn handle(&self, task_id: &str) -> Box<dyn RunnerTask> {
        Box::new(SimulatedTask {
            tasks: self.clone(),
            task_id: task_id.to_owned(),
        })
    }
}

impl TaskRunner for SimulatedTasks {
    fn start(&self, task: &Task, term: u64) -> Result<Box<dyn RunnerTask>, String> {
        let now = self.now();
        let number = |what: &str| {
            task.args
                .first()
                .and_then(|a| a.parse::<u64>().ok())
                .ok_or_else(|| format!("{what} needs a number"))
        };
        let state = match task.command.as_str() {
            "exit" => State::Ended(TaskEnd {
                status: exited(i32::try_from(number("exit")?).unwrap_or(255)),
                killed: false,
            }),
            "sleep" => State::Running {
                ends_at: Some(now + Duration::from_secs(number("sleep")?)),
            },
            _ => State::Running { ends_at: None },
        };
        let mut machine = self.lock();
        if machine
            .tasks
            .get(&task.id)
            .is_some_and(|t| matches!(t.state, State::Running { .. }))
        {
            return Err(format!("task {:?} already runs on this machine", task.id));
        }
        machine.tasks.insert(
            task.id.clone(),
            SimTask {
                name: task.name.clone(),
                state,
            },
        );
        machine.launches.push(Launch {
            task_id: task.id.clone(),
            name: task.name.clone(),
            term,
            at: now,
        });
        drop(machine);
        Ok(self.handle(&task.id))
    }

    fn reattach(&self, task_id: &str) -> Reattached {
        let state = self.lock().tasks.get(task_id).map(|t| t.state.clone());
        match state {
            Some(State::Running { .. }) => Reattached::Running(self.handle(task_id)),
            Some(State::Ended(end)) => Reattached::Ended(end.status),
            None => Reattached::Gone("the machine restarted since it was started".into()),
        }
    }
}

/// One simulated task, as the agent holds it.
#[derive(Debug)]
struct SimulatedTask {
    tasks: SimulatedTasks,
    task_id: String,
}

impl RunnerTask for SimulatedTask {
    fn wait(self: Box<Self>, mut stop: oneshot::Receiver<Duration>) -> BoxFuture<TaskEnd> {
        Box::pin(async move {
            let SimulatedTask { tasks, task_id } = *self;
            loop {
                let changed = tasks.shared.changed.notified();
                let state = tasks.lock().tasks.get(&task_id).map(|t| t.state.clone());
                let ends_at = match state {
                    Some(State::Ended(end)) => return end,
                    // The machine rebooted under it: as a process whose machine vanished.
                    None => {
                        return TaskEnd {
                            status: signalled(libc::SIGKILL),
                            killed: false,
                        };
                    }
                    Some(State::Running { ends_at }) => ends_at,
                };
                let until_end = ends_at.map(|end| end.saturating_sub(tasks.now()));
                tokio::select! {
                    () = changed => {}
                    () = async {
                        match until_end {
                            Some(wait) => tokio::time::sleep(wait).await,
                            None => std::future::pending().await,
                        }
                    } => {
                        let finished = TaskEnd { status: exited(0), killed: false };
                        if let Some(end) = tasks.end(&task_id, finished) {
                            return end;
                        }
                    }
                    Ok(grace) = &mut stop => {
                        // It honours SIGTERM at once; a zero grace period is SIGKILL.
                        let signal = if grace.is_zero() { libc::SIGKILL } else { libc::SIGTERM };
                        let killed = TaskEnd { status: signalled(signal), killed: true };
                        if let Some(end) = tasks.end(&task_id, killed) {
                            return end;
                        }
                    }
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clock() -> Duration {
        // The tests run on a paused current-thread runtime: its elapsed time is the clock.
        thread_local! {
            static START: tokio::time::Instant = tokio::time::Instant::now();
        }
        START.with(|start| start.elapsed())
    }

    fn task(id: &str, command: &str, args: &[&str]) -> Task {
        Task {
            id: id.into(),
            name: format!("web.main[{id}]"),
            command: command.into(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            ..Task::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_sleep_ends_with_zero_on_time_and_a_kill_ends_a_server() -> Result<(), String> {
        let _ = clock();
        let tasks = SimulatedTasks::new(clock);
        let sleeper = tasks.start(&task("t1", "sleep", &["5"]), 3)?;
        let server = tasks.start(&task("t2", "serve", &[]), 4)?;
        let (_keep, never) = oneshot::channel();
        let started = tokio::time::Instant::now();
        let end = sleeper.wait(never).await;
        assert_eq!(end.status.code(), Some(0));
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        assert_eq!(tasks.running_names(), vec!["web.main[t2]".to_owned()]);

        let (stop, stopped) = oneshot::channel();
        let waiting = tokio::spawn(server.wait(stopped));
        let _ = stop.send(Duration::from_secs(1));
        let end = waiting.await.map_err(|e| e.to_string())?;
        assert!(end.killed);
        assert_eq!(end.status.signal(), Some(libc::SIGTERM));
        assert!(tasks.running_names().is_empty());
        assert_eq!(tasks.obeyed_terms(), vec![3, 4]);
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn tasks_outlive_the_agent_but_not_a_reboot() -> Result<(), String> {
        let _ = clock();
        let tasks = SimulatedTasks::new(clock);
        drop(tasks.start(&task("t1", "serve", &[]), 1)?);
        drop(tasks.start(&task("t2", "exit", &["3"]), 1)?);
        // The agent that started them is gone; a new one finds them.
        assert!(matches!(tasks.reattach("t1"), Reattached::Running(_)));
        match tasks.reattach("t2") {
            Reattached::Ended(status) => assert_eq!(status.code(), Some(3)),
            other => return Err(format!("t2: {other:?}")),
        }
        tasks.reboot();
        assert!(matches!(tasks.reattach("t1"), Reattached::Gone(_)));
        assert!(tasks.running_names().is_empty());
        Ok(())
    }
}

//! Simulated tasks, for deterministic simulation tests: a [`TaskRunner`] whose tasks are
//! entries in an in-memory "machine" instead of processes, and whose time is the simulation's.
//!
//! A simulation makes one [`SimulatedTasks`] per agent host and hands it to every incarnation
//! of that host's agent (in [`AgentConfig::task_runner`](crate::AgentConfig::task_runner)):
//! tasks outlive an agent restart and are re-attached by its recovery, as real tasks under
//! their executors are (one that ended meanwhile reports how), and
//! [`reboot`](SimulatedTasks::reboot) models the machine crashing, which takes its tasks with
//! it (recovery then finds them gone: LOST).
//!
//! What a task does, by its command and first argument:
//! - `exit N`: ends at once with exit code N (modulo 256, as a shell's `exit`);
//! - `sleep N`: ends with exit code 0 after N seconds (fractions allowed) of the clock;
//! - anything else runs until the agent stops it.
//!
//! A stop ends a task as a process that honours SIGTERM would be reported: killed by SIGTERM
//! (exit code 143), or by SIGKILL (137) for a zero grace period or when the agent stops and
//! kills its tasks.
//!
//! The machine keeps what the invariant checks need: every [`Launch`] with the term of the
//! leader whose command the agent obeyed, every [`Kill`], every [`End`] (how and when each
//! run of a task ended: by itself, stopped, or lost with the machine), and what runs now.
//!
//! Nothing here uses threads, the system's clock or hash order: a seed replays exactly. Its
//! time is a clock the simulation gives (the same for every host and every incarnation of a
//! host: a restarted host has a new runtime, whose `tokio::time::Instant`s do not compare
//! with the old one's), and its waits are `tokio::time` sleeps on the agent's runtime.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use muster_proto::model::Task;
use tokio::sync::{Notify, oneshot};

use crate::runner::{
    BoxFuture, KillSwitch, Reattached, RunnerTask, StartError, Stop, TaskEnd, TaskRunner,
};

/// A task the machine started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// The task's id.
    pub task_id: String,
    /// Its name (`job.group[index]`).
    pub name: String,
    /// The raft term of the leader whose command the agent obeyed to launch it.
    pub term: u64,
    /// The job version it was placed at (the task's `job_version`; 0 if unknown).
    pub job_version: u64,
    /// When, on the simulation's clock.
    pub at: Duration,
}

/// How one run of a task on the machine ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// It ended by itself with this exit code (`exit N`, or a `sleep` whose time was up: 0).
    Exited(i32),
    /// The agent stopped it, with this signal (`SIGTERM`, or `SIGKILL`).
    Stopped(i32),
    /// The machine crashed under it.
    Lost,
}

/// One run of a task that ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct End {
    /// The task's id.
    pub task_id: String,
    /// Its name (`job.group[index]`).
    pub name: String,
    /// How it ended.
    pub how: Ending,
    /// When, on the simulation's clock (a `sleep`'s end is when its time was up, whenever it
    /// was noticed).
    pub at: Duration,
}

/// A task the agent stopped (that still ran until then).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kill {
    /// The task's id.
    pub task_id: String,
    /// Its name (`job.group[index]`).
    pub name: String,
    /// The raft term of the leader whose command the agent obeyed to stop it; `None` when
    /// the agent stopped it on its own (see [`Stop::term`]), or killed it as it stopped.
    pub term: Option<u64>,
    /// The signal that ended it: `SIGTERM`, or `SIGKILL`.
    pub signal: i32,
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

impl SimTask {
    /// Its state at `now`: a sleep whose time is up has ended (recorded so, and in `ends` as
    /// ended when its time was up).
    fn settle(&mut self, task_id: &str, now: Duration, ends: &mut Vec<End>) -> &State {
        if let State::Running {
            ends_at: Some(end), ..
        } = self.state
            && end <= now
        {
            self.state = State::Ended(TaskEnd::exited(0));
            ends.push(End {
                task_id: task_id.to_owned(),
                name: self.name.clone(),
                how: Ending::Exited(0),
                at: end,
            });
        }
        &self.state
    }
}

#[derive(Debug, Default)]
struct Machine {
    tasks: BTreeMap<String, SimTask>,
    launches: Vec<Launch>,
    kills: Vec<Kill>,
    ends: Vec<End>,
}

impl Machine {
    /// The state of `task_id` at `now`, settled (see [`SimTask::settle`]).
    fn settle(&mut self, task_id: &str, now: Duration) -> Option<&State> {
        let Machine { tasks, ends, .. } = self;
        tasks.get_mut(task_id).map(|t| t.settle(task_id, now, ends))
    }
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
        let machine = self.lock();
        f.debug_struct("SimulatedTasks")
            .field("tasks", &machine.tasks.len())
            .field("launches", &machine.launches.len())
            .field("kills", &machine.kills.len())
            .finish()
    }
}

impl SimulatedTasks {
    /// A machine with no tasks, whose time is `clock`: the simulation's elapsed time, the
    /// same for every host and every incarnation of a host (in a turmoil simulation,
    /// `turmoil::sim_elapsed`), advancing with the agent's `tokio::time`.
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

    /// The machine crashed: every task is gone, with no exit status. The agent that ran them
    /// is expected to crash with it; its next run finds them LOST.
    pub fn reboot(&self) {
        let now = self.now();
        let mut machine = self.lock();
        let Machine { tasks, ends, .. } = &mut *machine;
        for (id, task) in tasks.iter_mut() {
            // A sleep whose time was up before the crash had finished.
            if matches!(task.settle(id, now, ends), State::Running { .. }) {
                ends.push(End {
                    task_id: id.clone(),
                    name: task.name.clone(),
                    how: Ending::Lost,
                    at: now,
                });
            }
        }
        tasks.clear();
        drop(machine);
        self.shared.changed.notify_waiters();
    }

    /// Every launch so far, in order.
    pub fn launches(&self) -> Vec<Launch> {
        self.lock().launches.clone()
    }

    /// Every kill so far, in order.
    pub fn kills(&self) -> Vec<Kill> {
        self.lock().kills.clone()
    }

    /// How every run that ended so far ended, in the order the machine noticed (settling
    /// first every `sleep` whose time is up).
    pub fn ends(&self) -> Vec<End> {
        let now = self.now();
        let mut machine = self.lock();
        let Machine { tasks, ends, .. } = &mut *machine;
        for (id, task) in tasks.iter_mut() {
            task.settle(id, now, ends);
        }
        machine.ends.clone()
    }

    /// The terms of the commands that launched tasks, in the order they were obeyed.
    pub fn obeyed_terms(&self) -> Vec<u64> {
        self.lock().launches.iter().map(|l| l.term).collect()
    }

    /// The names of the tasks running now, in task id order.
    pub fn running_names(&self) -> Vec<String> {
        self.running().into_iter().map(|(_, name)| name).collect()
    }

    /// The tasks that run now, as (task id, name), by task id.
    pub fn running(&self) -> Vec<(String, String)> {
        let now = self.now();
        let mut machine = self.lock();
        let Machine { tasks, ends, .. } = &mut *machine;
        tasks
            .iter_mut()
            .filter_map(|(id, t)| {
                matches!(t.settle(id, now, ends), State::Running { .. })
                    .then(|| (id.clone(), t.name.clone()))
            })
            .collect()
    }

    /// The state of `task_id` now, settled.
    fn state(&self, task_id: &str) -> Option<State> {
        let now = self.now();
        self.lock().settle(task_id, now).cloned()
    }

    /// Ends `task_id` with `end` if it is still running (a stop: recorded, with its term);
    /// answers how it ended, `None` if the machine lost it.
    fn end(&self, task_id: &str, end: TaskEnd, stop: Option<Option<u64>>) -> Option<TaskEnd> {
        use std::os::unix::process::ExitStatusExt as _;
        let now = self.now();
        let mut machine = self.lock();
        if let State::Ended(earlier) = machine.settle(task_id, now)? {
            return Some(earlier.clone());
        }
        let task = machine.tasks.get_mut(task_id)?;
        task.state = State::Ended(end.clone());
        let name = task.name.clone();
        let how = match (&end.status, stop) {
            (Ok(status), Some(_)) => Ending::Stopped(status.signal().unwrap_or_default()),
            (Ok(status), None) => Ending::Exited(status.code().unwrap_or_default()),
            (Err(_), _) => Ending::Lost,
        };
        machine.ends.push(End {
            task_id: task_id.to_owned(),
            name: name.clone(),
            how,
            at: now,
        });
        if let (Some(term), Ok(status)) = (stop, &end.status) {
            machine.kills.push(Kill {
                task_id: task_id.to_owned(),
                name,
                term,
                signal: status.signal().unwrap_or_default(),
                at: now,
            });
        }
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

    /// Starts `task` on the machine, as a leader of `term` commanded (see the module), or says
    /// why it cannot.
    fn launch(&self, task: &Task, term: u64) -> Result<Box<dyn RunnerTask>, Refused> {
        let now = self.now();
        let state = match task.command.as_str() {
            "exit" => {
                let code = argument(task, "exit", |a| a.parse::<u64>().ok())?;
                State::Ended(TaskEnd::exited(u8::try_from(code % 256).unwrap_or(u8::MAX)))
            }
            "sleep" => {
                let seconds = argument(task, "sleep", |a| {
                    a.parse::<f64>()
                        .ok()
                        .and_then(|s| Duration::try_from_secs_f64(s).ok())
                })?;
                State::Running {
                    ends_at: Some(now.saturating_add(seconds)),
                }
            }
            _ => State::Running { ends_at: None },
        };
        let mut machine = self.lock();
        if let Some(State::Running { .. }) = machine.settle(&task.id, now) {
            return Err(Refused::AlreadyRuns(task.id.clone()));
        }
        if let State::Ended(end) = &state {
            machine.ends.push(End {
                task_id: task.id.clone(),
                name: task.name.clone(),
                how: Ending::Exited(
                    end.status
                        .as_ref()
                        .ok()
                        .and_then(|s| s.code())
                        .unwrap_or_default(),
                ),
                at: now,
            });
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
            job_version: task.job_version,
            at: now,
        });
        drop(machine);
        Ok(self.handle(&task.id))
    }

    /// Finds `task_id` on the machine, as the agent's next run does.
    fn find(&self, task_id: &str) -> Reattached {
        match self.state(task_id) {
            Some(State::Running { .. }) => Reattached::Running(self.handle(task_id)),
            Some(State::Ended(end)) => Reattached::Ended(end),
            None => Reattached::Gone("the machine restarted since it was started".into()),
        }
    }
}

/// Why the machine does not start a task.
#[derive(Debug, thiserror::Error)]
enum Refused {
    /// `exit` or `sleep` needs a number as its first argument: this is not one.
    #[error("{what} needs a number, not {argument:?}")]
    NotANumber {
        /// The command.
        what: &'static str,
        /// Its first argument, if it has one.
        argument: Option<String>,
    },
    /// A task of this id still runs.
    #[error("task {0:?} already runs on this machine")]
    AlreadyRuns(String),
}

/// The first argument of `task` as what `what` needs, or why not.
fn argument<T>(
    task: &Task,
    what: &'static str,
    parse: impl Fn(&str) -> Option<T>,
) -> Result<T, Refused> {
    task.args
        .first()
        .and_then(|a| parse(a.trim()))
        .ok_or_else(|| Refused::NotANumber {
            what,
            argument: task.args.first().cloned(),
        })
}

/// A simulated machine runs no process, and bounds, owns and keeps nothing of the machine's:
/// only [`start`](TaskRunner::start) and [`reattach`](TaskRunner::reattach) are its own.
impl TaskRunner for SimulatedTasks {
    fn start<'a>(
        &'a self,
        task: &'a Task,
        _user: Option<&'a str>,
        term: u64,
    ) -> BoxFuture<'a, Result<Box<dyn RunnerTask>, StartError>> {
        let started = self
            .launch(task, term)
            .map_err(|refused| StartError::command(&task.command, refused));
        Box::pin(std::future::ready(started))
    }

    fn reattach<'a>(&'a self, task_id: &'a str) -> BoxFuture<'a, Reattached> {
        Box::pin(std::future::ready(self.find(task_id)))
    }
}

/// One simulated task, as the agent holds it.
#[derive(Debug)]
struct SimulatedTask {
    tasks: SimulatedTasks,
    task_id: String,
}

impl RunnerTask for SimulatedTask {
    fn kill_switch(&self) -> KillSwitch {
        let (tasks, task_id) = (self.tasks.clone(), self.task_id.clone());
        KillSwitch::new(move || {
            tasks.end(
                &task_id,
                TaskEnd::signalled(libc::SIGKILL, true),
                Some(None),
            );
        })
    }

    fn wait(self: Box<Self>, mut stop: oneshot::Receiver<Stop>) -> BoxFuture<'static, TaskEnd> {
        Box::pin(async move {
            let SimulatedTask { tasks, task_id } = *self;
            // A oneshot must not be polled again once it has answered.
            let mut stop_answered = false;
            loop {
                let changed = tasks.shared.changed.notified();
                let ends_at = match tasks.state(&task_id) {
                    Some(State::Ended(end)) => return end,
                    // The machine crashed under it: as a process whose machine vanished.
                    None => return TaskEnd::signalled(libc::SIGKILL, false),
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
                        // Its time is up (by the agent's clock, which may run a hair ahead
                        // of the simulation's).
                        if let Some(end) = tasks.end(&task_id, TaskEnd::exited(0), None) {
                            return end;
                        }
                    }
                    asked = &mut stop, if !stop_answered => {
                        stop_answered = true;
                        // A dropped sender asks nothing.
                        if let Ok(Stop { grace, term, signal }) = asked {
                            // It honours its kill signal at once; a zero grace period is
                            // SIGKILL.
                            let signal = if grace.is_zero() { libc::SIGKILL } else { signal };
                            let killed = TaskEnd::signalled(signal, true);
                            if let Some(end) = tasks.end(&task_id, killed, Some(term)) {
                                return end;
                            }
                        }
                    }
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt as _;

    use super::*;

    /// The tests' clock: the elapsed time of the current-thread runtime they run on, paused.
    fn clock() -> Duration {
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
            job_version: 7,
            ..Task::default()
        }
    }

    /// A stop already asked for.
    fn stop(grace: Duration, term: u64) -> oneshot::Receiver<Stop> {
        let (sender, receiver) = oneshot::channel();
        let _ = sender.send(Stop {
            grace,
            signal: libc::SIGTERM,
            term: Some(term),
        });
        receiver
    }

    fn code(end: &TaskEnd) -> Option<i32> {
        end.status.as_ref().ok().and_then(|s| s.code())
    }

    fn signal(end: &TaskEnd) -> Option<i32> {
        end.status.as_ref().ok().and_then(|s| s.signal())
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_sleep_ends_with_zero_on_time_an_exit_at_once_with_its_code()
    -> Result<(), Box<dyn std::error::Error>> {
        let tasks = SimulatedTasks::new(clock);
        let started = clock();
        let sleeper = tasks.start(&task("t1", "sleep", &["5"]), None, 3).await?;
        let quitter = tasks.start(&task("t2", "exit", &["3"]), None, 3).await?;
        let (_keep, never) = oneshot::channel();
        let end = quitter.wait(never).await;
        assert_eq!(code(&end), Some(3));
        assert!(!end.killed);
        assert_eq!(clock(), started, "an exit takes no time");

        let (_keep, never) = oneshot::channel();
        let waiting = tokio::spawn(sleeper.wait(never));
        tokio::time::sleep(Duration::from_millis(4_999)).await;
        assert_eq!(tasks.running_names(), vec!["web.main[t1]".to_owned()]);
        let end = waiting.await.map_err(|e| e.to_string())?;
        assert_eq!(code(&end), Some(0));
        assert!(!end.killed);
        assert_eq!(clock() - started, Duration::from_secs(5));
        assert!(tasks.running_names().is_empty());
        assert_eq!(tasks.obeyed_terms(), vec![3, 3]);
        assert!(tasks.kills().is_empty());

        // Nonsense arguments are refused, as a start that fails.
        assert!(
            tasks
                .start(&task("t3", "sleep", &["soon"]), None, 3)
                .await
                .is_err()
        );
        assert!(
            tasks
                .start(&task("t4", "exit", &[]), None, 3)
                .await
                .is_err()
        );
        Ok(())
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_stop_ends_a_task_as_sigterm_or_sigkill_would()
    -> Result<(), Box<dyn std::error::Error>> {
        let tasks = SimulatedTasks::new(clock);
        let server = tasks.start(&task("t1", "serve", &[]), None, 4).await?;
        let hard = tasks.start(&task("t2", "serve", &[]), None, 4).await?;
        let switched = tasks.start(&task("t3", "serve", &[]), None, 4).await?;
        let sleeper = tasks.start(&task("t4", "sleep", &["100"]), None, 4).await?;
        assert_eq!(tasks.running_names().len(), 4);

        // Nothing ends a server by itself.
        let (_keep, never) = oneshot::channel();
        let waiting = tokio::spawn(server.wait(never));
        tokio::time::sleep(Duration::from_secs(3_600)).await;
        assert!(!waiting.is_finished());
        waiting.abort();
        let Reattached::Running(server) = tasks.reattach("t1").await else {
            return Err("t1 does not run".into());
        };

        let stopping = stop(Duration::from_secs(5), 6);
        let end = server.wait(stopping).await;
        assert!(end.killed);
        assert_eq!(signal(&end), Some(libc::SIGTERM));
        let stopping = stop(Duration::ZERO, 6);
        let end = hard.wait(stopping).await;
        assert!(end.killed);
        assert_eq!(signal(&end), Some(libc::SIGKILL));

        // The agent stops and kills its tasks: the switch ends one without waiting for it.
        switched.kill_switch().pull();
        match tasks.reattach("t3").await {
            Reattached::Ended(end) => {
                assert!(end.killed);
                assert_eq!(signal(&end), Some(libc::SIGKILL));
            }
            other => return Err(format!("t3: {other:?}").into()),
        }
        // A kill switch pulled twice, or a stop for an ended task, changes nothing.
        switched.kill_switch().pull();
        let stopping = stop(Duration::ZERO, 7);
        assert!(signal(&switched.wait(stopping).await) == Some(libc::SIGKILL));

        // A stop whose sender is gone asks nothing: the sleep ends by itself.
        let (sender, receiver) = oneshot::channel();
        drop(sender);
        let end = sleeper.wait(receiver).await;
        assert_eq!(code(&end), Some(0));
        assert!(!end.killed);

        let kills: Vec<(String, Option<u64>, i32)> = tasks
            .kills()
            .into_iter()
            .map(|k| (k.task_id, k.term, k.signal))
            .collect();
        assert_eq!(
            kills,
            vec![
                ("t1".to_owned(), Some(6), libc::SIGTERM),
                ("t2".to_owned(), Some(6), libc::SIGKILL),
                ("t3".to_owned(), None, libc::SIGKILL),
            ]
        );
        assert!(tasks.running_names().is_empty());
        Ok(())
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn tasks_outlive_the_agent_but_not_a_reboot() -> Result<(), Box<dyn std::error::Error>> {
        let tasks = SimulatedTasks::new(clock);
        let t0 = clock();
        drop(tasks.start(&task("t1", "serve", &[]), None, 1).await?);
        drop(tasks.start(&task("t2", "exit", &["3"]), None, 1).await?);
        drop(tasks.start(&task("t3", "sleep", &["10"]), None, 1).await?);
        drop(tasks.start(&task("t4", "sleep", &["60"]), None, 2).await?);
        // The agent that started them is gone for 30 s; its next run finds them.
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(matches!(tasks.reattach("t1").await, Reattached::Running(_)));
        match tasks.reattach("t2").await {
            Reattached::Ended(end) => assert_eq!(code(&end), Some(3)),
            other => return Err(format!("t2: {other:?}").into()),
        }
        match tasks.reattach("t3").await {
            Reattached::Ended(end) => assert_eq!((code(&end), end.killed), (Some(0), false)),
            other => return Err(format!("t3 ended while the agent was down: {other:?}").into()),
        }
        let Reattached::Running(t4) = tasks.reattach("t4").await else {
            return Err("t4 still sleeps".into());
        };
        // Watched again, it ends when it was due, not 60 s after the re-attach.
        let (_keep, never) = oneshot::channel();
        assert_eq!(code(&t4.wait(never).await), Some(0));
        assert_eq!(clock() - t0, Duration::from_secs(60));
        assert!(matches!(
            tasks.reattach("unknown").await,
            Reattached::Gone(_)
        ));

        // A task id that still runs cannot start twice; one that ended can start anew.
        assert!(
            tasks
                .start(&task("t1", "serve", &[]), None, 2)
                .await
                .is_err()
        );
        drop(tasks.start(&task("t2", "serve", &[]), None, 2).await?);

        tasks.reboot();
        for id in ["t1", "t2", "t3", "t4"] {
            assert!(
                matches!(tasks.reattach(id).await, Reattached::Gone(_)),
                "{id} survived the reboot"
            );
        }
        assert!(tasks.running_names().is_empty());
        assert_eq!(tasks.obeyed_terms(), vec![1, 1, 1, 2, 2]);
        let at: Vec<Duration> = tasks.launches().iter().map(|l| l.at - t0).collect();
        assert_eq!(at, [0, 0, 0, 0, 60].map(Duration::from_secs));
        Ok(())
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn each_run_s_end_is_recorded_with_how_and_when() -> Result<(), Box<dyn std::error::Error>>
    {
        let tasks = SimulatedTasks::new(clock);
        let t0 = clock();
        let short = tasks.start(&task("t1", "sleep", &["2"]), None, 1).await?;
        drop(tasks.start(&task("t2", "exit", &["3"]), None, 1).await?);
        let stopped = tasks.start(&task("t3", "serve", &[]), None, 1).await?;
        drop(tasks.start(&task("t4", "sleep", &["5"]), None, 1).await?);
        drop(tasks.start(&task("t5", "serve", &[]), None, 1).await?);
        let (_keep, never) = oneshot::channel();
        assert_eq!(code(&short.wait(never).await), Some(0));
        let end = stopped.wait(stop(Duration::from_secs(1), 2)).await;
        assert_eq!(signal(&end), Some(libc::SIGTERM));
        // Nobody watches t4: its end is noticed late, and recorded when its time was up.
        tokio::time::sleep(Duration::from_secs(10)).await;
        tasks.reboot();
        let ends: Vec<(String, Ending, Duration)> = tasks
            .ends()
            .into_iter()
            .map(|e| (e.task_id, e.how, e.at - t0))
            .collect();
        let secs = Duration::from_secs;
        assert_eq!(
            ends,
            vec![
                ("t2".to_owned(), Ending::Exited(3), secs(0)),
                ("t1".to_owned(), Ending::Exited(0), secs(2)),
                ("t3".to_owned(), Ending::Stopped(libc::SIGTERM), secs(2)),
                ("t4".to_owned(), Ending::Exited(0), secs(5)),
                ("t5".to_owned(), Ending::Lost, secs(12)),
            ]
        );
        let versions: Vec<u64> = tasks.launches().iter().map(|l| l.job_version).collect();
        assert_eq!(versions, [7; 5]);
        Ok(())
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_reboot_under_a_watched_task_ends_its_wait() -> Result<(), Box<dyn std::error::Error>>
    {
        let tasks = SimulatedTasks::new(clock);
        let server = tasks.start(&task("t1", "serve", &[]), None, 1).await?;
        let (_keep, never) = oneshot::channel();
        let waiting = tokio::spawn(server.wait(never));
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "it waits for the server");
        tasks.reboot();
        let end = waiting.await.map_err(|e| e.to_string())?;
        assert_eq!(signal(&end), Some(libc::SIGKILL));
        assert!(!end.killed);
        Ok(())
    }
}

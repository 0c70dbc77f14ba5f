//! The agent's metrics, as Prometheus scrapes them from `GET /metrics` on its HTTP port (see
//! [`crate::http`]).
//!
//! The figures come from three places: the agent process counts what it does and answers an
//! ask for them ([`AgentHandle::figures`], an [`AgentFigures`]); each running task's CPU time
//! and memory are read from the machine ([`sample_usage`]: its cgroup where the agent uses
//! cgroups, else `/proc/<pid>` of its process), off the agent's thread; and the node's
//! transport counts its traffic ([`Node::stats`]). [`render`] turns them into the Prometheus
//! text exposition format (version 0.0.4) with `prometheus-client`'s encoder; [`gather`] does
//! all of it for the HTTP handler.
//!
//! Every metric is named `muster_agent_*`, with its unit in its name and counters ending in
//! `_total`. `tasks` counts the running tasks and, by final state, the completed history (the
//! last `completed_task_history` tasks); the per-task families (`task_cpu_seconds`,
//! `task_memory_bytes`) have a series per running task whose usage could be read, and are
//! left out, HELP and TYPE too, while there is none:
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `muster_agent_tasks` | gauge | `state`: `running`, `finished`, `failed`, `killed`, `lost` |
//! | `muster_agent_task_launches_total` | counter | |
//! | `muster_agent_task_launch_failures_total` | counter | |
//! | `muster_agent_task_cpu_seconds` | gauge | `task`, `job` |
//! | `muster_agent_task_memory_bytes` | gauge | `task`, `job` |
//! | `muster_agent_registered` | gauge | |
//! | `muster_agent_leader_term` | gauge | |
//! | `muster_agent_stale_commands_refused_total` | counter | |
//! | `muster_agent_heartbeats_sent_total` | counter | |
//! | `muster_agent_reregistrations_total` | counter | |
//! | `muster_agent_transport_sent_bytes_total` | counter | |
//! | `muster_agent_transport_received_bytes_total` | counter | |
//! | `muster_agent_transport_received_frames_total` | counter | |
//! | `muster_agent_transport_received_envelopes_total` | counter | |
//! | `muster_agent_transport_reconnects_total` | counter | |
//! | `muster_agent_transport_late_replies_total` | counter | |
//! | `muster_agent_transport_dead_letters_total` | counter | `reason` |

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use muster_transport::{Node, TransportStats};
use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use crate::{AgentError, AgentHandle};

/// The `Content-Type` of what [`render`] returns (Prometheus text, version 0.0.4).
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// The final states a completed task can be in, as the `state` label names them: always
/// rendered, at zero if the history holds none, so that each series exists from the start.
const FINAL_STATES: [&str; 4] = ["finished", "failed", "killed", "lost"];

/// What the agent process counts, as of one moment: the answer to [`AgentHandle::figures`].
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct AgentFigures {
    /// True while the agent is registered with a master.
    pub registered: bool,
    /// The highest leader term the agent follows.
    pub term: u64,
    /// Commands refused because they came from an older leader term.
    pub stale_commands_refused: u64,
    /// Heartbeats sent to masters.
    pub heartbeats_sent: u64,
    /// Times a master admitted the agent again under the id it already had (after a restart,
    /// a lost master or a failover), as opposed to its first registration.
    pub reregistrations: u64,
    /// Tasks the agent was asked to run (by `RunTask` or `LaunchTasks` of a current term),
    /// started or not.
    pub launches: u64,
    /// Of [`launches`](Self::launches), those that did not start: refused (a bad request, a
    /// task id already known, a user the agent does not allow) or failed to (the command, its
    /// cgroup, its checkpoint).
    pub launch_failures: u64,
    /// The running tasks, and where their usage can be read.
    pub running: Vec<RunningTask>,
    /// The completed tasks in the agent's history, by final state (`finished`, `failed`,
    /// `killed`, `lost`; lower case).
    pub completed: BTreeMap<String, u64>,
}

/// A running task, and where its CPU time and memory can be read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunningTask {
    /// The task's id.
    pub task_id: String,
    /// The job it belongs to (empty for a task launched by hand).
    pub job: String,
    /// The task's process (the leader of its process group), if it is a process of this
    /// machine (not one of a [`TaskRunner`](crate::runner::TaskRunner)'s tasks).
    pub pid: Option<i32>,
    /// Its cgroup, if the agent runs it in one.
    pub cgroup: Option<CgroupPaths>,
}

/// The directories of a task's cgroup that hold its usage.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CgroupPaths {
    /// The directory with the CPU accounting files (`cpu.stat` on v2, `cpuacct.usage` on v1).
    pub cpu: PathBuf,
    /// The directory with the memory files (`memory.current` on v2, `memory.usage_in_bytes`
    /// on v1).
    pub memory: PathBuf,
    /// True for cgroup v2.
    pub v2: bool,
}

impl CgroupPaths {
    /// A task's cgroup directories.
    pub fn new(cpu: PathBuf, memory: PathBuf, v2: bool) -> Self {
        CgroupPaths { cpu, memory, v2 }
    }
}

/// What a running task has used, as read by [`sample_usage`].
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct TaskUsage {
    /// The task's id.
    pub task_id: String,
    /// The job it belongs to.
    pub job: String,
    /// CPU time used since it started, in seconds, if it could be read.
    pub cpu_seconds: Option<f64>,
    /// Memory it uses now, in bytes, if it could be read.
    pub memory_bytes: Option<u64>,
}

impl TaskUsage {
    /// The usage of task `task_id` of `job`.
    pub fn new(
        task_id: impl Into<String>,
        job: impl Into<String>,
        cpu_seconds: Option<f64>,
        memory_bytes: Option<u64>,
    ) -> Self {
        TaskUsage {
            task_id: task_id.into(),
            job: job.into(),
            cpu_seconds,
            memory_bytes,
        }
    }
}

/// Reads what each of `tasks` has used: from its cgroup (v2: `cpu.stat`'s `usage_usec` and
/// `memory.current`; v1: `cpuacct.usage` and `memory.usage_in_bytes`), else, or where those
/// cannot be read, from its process (`/proc/<pid>/stat`'s utime plus stime over the clock tick
/// rate, and `/proc/<pid>/status`'s `VmRSS`: the task's own process, not its children). A
/// figure that cannot be read is left out (the task may just have ended); a task with neither
/// figure is left out. Blocking: call it off the agent's thread (`spawn_blocking`), as
/// [`gather`] does.
pub fn sample_usage(tasks: &[RunningTask]) -> Vec<TaskUsage> {
    let ticks = clock_ticks();
    tasks
        .iter()
        .filter_map(|task| {
            let cgroup = task.cgroup.as_ref();
            let cpu_seconds = cgroup
                .and_then(cgroup_cpu_seconds)
                .or_else(|| process_cpu_seconds(task.pid?, ticks?));
            let memory_bytes = cgroup
                .and_then(cgroup_memory_bytes)
                .or_else(|| process_memory_bytes(task.pid?));
            (cpu_seconds.is_some() || memory_bytes.is_some()).then(|| {
                TaskUsage::new(
                    task.task_id.clone(),
                    task.job.clone(),
                    cpu_seconds,
                    memory_bytes,
                )
            })
        })
        .collect()
}

/// Asks the agent for its figures, reads its tasks' usage off the agent's thread, and renders
/// them with the node's transport counters: the body of `GET /metrics`.
///
/// # Errors
/// [`AgentError::Stopped`] if the agent process has ended.
pub async fn gather(agent: &AgentHandle, node: &Node) -> Result<String, AgentError> {
    let figures = agent.figures().await?;
    let running = figures.running.clone();
    // A failed read is one figure left out; a panicking one, all usage this time.
    let usage = tokio::task::spawn_blocking(move || sample_usage(&running))
        .await
        .unwrap_or_default();
    Ok(render(&figures, &usage, &node.stats()))
}

/// The figures in the Prometheus text exposition format (version 0.0.4): the agent's
/// `figures`, its tasks' `usage` and its node's `transport` counters, every metric with its
/// HELP and TYPE (see the module's table).
pub fn render(figures: &AgentFigures, usage: &[TaskUsage], transport: &TransportStats) -> String {
    let mut registry = Registry::with_prefix("muster_agent");
    register_tasks(&mut registry, figures, usage);
    register_master_link(&mut registry, figures);
    register_transport(&mut registry, transport);
    let mut text = String::new();
    // Writing to a String cannot fail; an encoder error would leave what was written so far.
    if let Err(error) = prometheus_text::encode(&mut text, &registry) {
        tracing::warn!(%error, "cannot encode the agent's metrics");
    }
    text
}

/// A counter at `value`.
fn counter(value: u64) -> Counter {
    let counter = Counter::default();
    counter.inc_by(value);
    counter
}

/// A gauge at `value`.
fn gauge(value: u64) -> Gauge {
    let gauge = Gauge::default();
    gauge.set(i64::try_from(value).unwrap_or(i64::MAX));
    gauge
}

type Labels = Vec<(&'static str, String)>;

fn register_tasks(registry: &mut Registry, figures: &AgentFigures, usage: &[TaskUsage]) {
    let tasks = Family::<Labels, Gauge>::default();
    tasks
        .get_or_create(&vec![("state", "running".to_owned())])
        .set(i64::try_from(figures.running.len()).unwrap_or(i64::MAX));
    for state in FINAL_STATES {
        tasks
            .get_or_create(&vec![("state", state.to_owned())])
            .set(0);
    }
    for (state, count) in &figures.completed {
        tasks
            .get_or_create(&vec![("state", state.clone())])
            .set(i64::try_from(*count).unwrap_or(i64::MAX));
    }
    registry.register(
        "tasks",
        "Tasks on this agent by state: running now, or in its completed history (the last \
         completed_task_history tasks) by final state",
        tasks,
    );
    registry.register(
        "task_launches",
        "Tasks the agent was asked to run by a master of the current term, started or not",
        counter(figures.launches),
    );
    registry.register(
        "task_launch_failures",
        "Tasks the agent was asked to run that did not start: refused (bad request, known id, \
         user not allowed) or failed to (command, cgroup, checkpoint)",
        counter(figures.launch_failures),
    );

    let cpu = Family::<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
    let memory = Family::<Labels, Gauge>::default();
    for task in usage {
        let labels = vec![("task", task.task_id.clone()), ("job", task.job.clone())];
        if let Some(seconds) = task.cpu_seconds {
            cpu.get_or_create(&labels).set(seconds);
        }
        if let Some(bytes) = task.memory_bytes {
            memory
                .get_or_create(&labels)
                .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
    }
    registry.register_with_unit(
        "task_cpu",
        "CPU time a running task has used since it started (its cgroup's, else its process's \
         user and system time)",
        Unit::Seconds,
        cpu,
    );
    registry.register_with_unit(
        "task_memory",
        "Memory a running task uses (its cgroup's memory.current or usage_in_bytes, else its \
         process's resident set)",
        Unit::Bytes,
        memory,
    );
}

fn register_master_link(registry: &mut Registry, figures: &AgentFigures) {
    registry.register(
        "registered",
        "1 while the agent is registered with a master, else 0",
        gauge(u64::from(figures.registered)),
    );
    registry.register(
        "leader_term",
        "The highest leader term the agent follows; it refuses commands of older terms",
        gauge(figures.term),
    );
    registry.register(
        "stale_commands_refused",
        "Commands (run, launch, kill) refused because they came from a leader of an older term",
        counter(figures.stale_commands_refused),
    );
    registry.register(
        "heartbeats_sent",
        "Heartbeats the agent sent to its master",
        counter(figures.heartbeats_sent),
    );
    registry.register(
        "reregistrations",
        "Times a master admitted the agent again under the id it had (after a restart, a lost \
         master or a failover)",
        counter(figures.reregistrations),
    );
}

fn register_transport(registry: &mut Registry, stats: &TransportStats) {
    registry.register_with_unit(
        "transport_sent",
        "Bytes of the actor transport's frames written to all links (protobuf, before gRPC, \
         HTTP/2 and TLS framing)",
        Unit::Bytes,
        counter(stats.bytes_sent),
    );
    registry.register_with_unit(
        "transport_received",
        "Bytes of the actor transport's frames read from all links (protobuf, before gRPC, \
         HTTP/2 and TLS framing)",
        Unit::Bytes,
        counter(stats.bytes_received),
    );
    registry.register(
        "transport_received_frames",
        "Frames the actor transport read from all links",
        counter(stats.frames_received),
    );
    registry.register(
        "transport_received_envelopes",
        "Envelopes (messages) the actor transport read from all links",
        counter(stats.envelopes_received),
    );
    registry.register(
        "transport_reconnects",
        "Connection attempts to a peer after its link was lost or the last attempt failed",
        counter(stats.reconnects),
    );
    registry.register(
        "transport_late_replies",
        "Answers that arrived after their asker gave up",
        counter(stats.late_replies),
    );
    let dead = Family::<Labels, Counter>::default();
    for (reason, count) in [
        ("unknown_process", stats.unknown_process),
        ("unknown_type", stats.unknown_type),
        ("malformed", stats.malformed),
        ("oversized", stats.oversized),
        ("rejected", stats.rejected),
        ("unauthorized", stats.unauthorized),
    ] {
        dead.get_or_create(&vec![("reason", reason.to_owned())])
            .inc_by(count);
    }
    registry.register(
        "transport_dead_letters",
        "Envelopes that arrived but were not delivered, by reason: no such process, a type it \
         does not take, undecodable, too large, refused by its mailbox, or from a role it does \
         not accept",
        dead,
    );
}

/// Clock ticks per second (`/proc/<pid>/stat`'s unit), if the system says.
fn clock_ticks() -> Option<f64> {
    // SAFETY: sysconf takes an integer and touches no memory of ours.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (ticks > 0).then_some(ticks as f64)
}

/// A cgroup's CPU time in seconds: `usage_usec` of `cpu.stat` (v2), `cpuacct.usage` in
/// nanoseconds (v1).
fn cgroup_cpu_seconds(cgroup: &CgroupPaths) -> Option<f64> {
    if cgroup.v2 {
        let text = std::fs::read_to_string(cgroup.cpu.join("cpu.stat")).ok()?;
        let usec = keyed_value(&text, "usage_usec")?;
        Some(usec as f64 / 1e6)
    } else {
        let nanos = read_number(&cgroup.cpu.join("cpuacct.usage"))?;
        Some(nanos as f64 / 1e9)
    }
}

/// A cgroup's memory in bytes: `memory.current` (v2), `memory.usage_in_bytes` (v1).
fn cgroup_memory_bytes(cgroup: &CgroupPaths) -> Option<u64> {
    let file = if cgroup.v2 {
        "memory.current"
    } else {
        "memory.usage_in_bytes"
    };
    read_number(&cgroup.memory.join(file))
}

/// A process's user plus system time in seconds, from `/proc/<pid>/stat`.
fn process_cpu_seconds(pid: i32, ticks: f64) -> Option<f64> {
    if pid <= 0 {
        return None;
    }
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_cpu_ticks(&text).map(|t| t as f64 / ticks)
}

/// utime + stime (fields 14 and 15) of a `/proc/<pid>/stat` line. The command (field 2) is in
/// parentheses and may hold spaces and parentheses itself: the fields are counted from the
/// last `)`.
fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    // `rest` starts with field 3 (the state): utime is field 14, the 12th here.
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    utime.checked_add(stime)
}

/// A process's resident set in bytes, from `/proc/<pid>/status`'s `VmRSS` (in kB).
fn process_memory_bytes(pid: i32) -> Option<u64> {
    if pid <= 0 {
        return None;
    }
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status_rss_bytes(&text)
}

/// `VmRSS:   1234 kB` of a `/proc/<pid>/status`, in bytes.
fn status_rss_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    let mut parts = line.split_whitespace();
    let value: u64 = parts.next()?.parse().ok()?;
    let multiplier = match parts.next() {
        Some("kB") | None => 1024,
        Some("mB") => 1024 * 1024,
        Some(_) => return None,
    };
    value.checked_mul(multiplier)
}

/// The number after `key ` on one of `text`'s lines (`cpu.stat`'s form).
fn keyed_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (name, value) = line.split_once(' ')?;
        (name == key).then(|| value.trim().parse().ok()).flatten()
    })
}

/// A file holding one number.
fn read_number(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_files_and_cgroup_files_are_parsed_and_bad_ones_give_nothing() {
        // A command with spaces and parentheses in it.
        let stat = "4242 (a (weird) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 \
                    250 50 3 4 20 0 1 0 12345 1000000 200 18446744073709551615";
        assert_eq!(stat_cpu_ticks(stat), Some(300));
        assert_eq!(stat_cpu_ticks("4242 (x) S 1 2"), None);
        assert_eq!(stat_cpu_ticks("no parenthesis"), None);
        assert_eq!(stat_cpu_ticks("1 (x) S 1 1 1 0 -1 0 0 0 0 0 -5 2"), None);

        let status = "Name:\tsleep\nVmPeak:\t    9000 kB\nVmRSS:\t     1024 kB\nThreads:\t1\n";
        assert_eq!(status_rss_bytes(status), Some(1024 * 1024));
        assert_eq!(status_rss_bytes("Name:\tkthreadd\n"), None);
        assert_eq!(status_rss_bytes("VmRSS:\t lots kB\n"), None);

        let cpu_stat = "usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n";
        assert_eq!(keyed_value(cpu_stat, "usage_usec"), Some(1_500_000));
        assert_eq!(keyed_value(cpu_stat, "nr_periods"), None);
    }

    #[test]
    fn usage_comes_from_the_cgroup_files_else_the_process_and_unreadable_tasks_are_left_out()
    -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("cpu.stat"), "usage_usec 2500000\n")?;
        std::fs::write(dir.path().join("memory.current"), "4096\n")?;
        let own_pid = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
        let tasks = [
            RunningTask {
                task_id: "in-a-cgroup".into(),
                job: "web".into(),
                pid: None,
                cgroup: Some(CgroupPaths::new(
                    dir.path().to_owned(),
                    dir.path().to_owned(),
                    true,
                )),
            },
            RunningTask {
                task_id: "a-process".into(),
                job: String::new(),
                pid: Some(own_pid),
                cgroup: None,
            },
            RunningTask {
                task_id: "gone".into(),
                job: "web".into(),
                // No process has a negative pid; no cgroup directory is there.
                pid: Some(-1),
                cgroup: Some(CgroupPaths::new(
                    dir.path().join("none"),
                    dir.path().join("none"),
                    false,
                )),
            },
        ];
        let usage = sample_usage(&tasks);
        assert_eq!(usage.len(), 2, "{usage:?}");
        assert_eq!(
            usage[0],
            TaskUsage::new("in-a-cgroup", "web", Some(2.5), Some(4096))
        );
        assert_eq!(usage[1].task_id, "a-process");
        assert!(
            usage[1].memory_bytes.is_some_and(|bytes| bytes > 0),
            "{usage:?}"
        );
        assert!(usage[1].cpu_seconds.is_some_and(|s| s >= 0.0), "{usage:?}");
        Ok(())
    }

    #[test]
    fn every_family_has_help_and_type_and_counters_end_in_total() {
        let mut figures = AgentFigures {
            registered: true,
            term: 7,
            stale_commands_refused: 2,
            heartbeats_sent: 40,
            reregistrations: 1,
            launches: 5,
            launch_failures: 1,
            ..AgentFigures::default()
        };
        figures.running.push(RunningTask {
            task_id: "t1".into(),
            job: "web".into(),
            ..RunningTask::default()
        });
        figures.completed.insert("finished".into(), 3);
        let usage = [TaskUsage::new("t1", "web", Some(1.25), Some(8192))];
        let mut stats = TransportStats::default();
        stats.bytes_sent = 100;
        stats.rejected = 2;
        let text = render(&figures, &usage, &stats);
        for line in [
            "muster_agent_tasks{state=\"running\"} 1",
            "muster_agent_tasks{state=\"finished\"} 3",
            "muster_agent_tasks{state=\"lost\"} 0",
            "muster_agent_task_launches_total 5",
            "muster_agent_task_launch_failures_total 1",
            "muster_agent_task_cpu_seconds{task=\"t1\",job=\"web\"} 1.25",
            "muster_agent_task_memory_bytes{task=\"t1\",job=\"web\"} 8192",
            "muster_agent_registered 1",
            "muster_agent_leader_term 7",
            "muster_agent_stale_commands_refused_total 2",
            "muster_agent_heartbeats_sent_total 40",
            "muster_agent_reregistrations_total 1",
            "muster_agent_transport_sent_bytes_total 100",
            "muster_agent_transport_dead_letters_total{reason=\"rejected\"} 2",
            "# TYPE muster_agent_transport_reconnects_total counter",
            "# TYPE muster_agent_task_memory_bytes gauge",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "no line {line:?} in:\n{text}"
            );
        }
        let mut families = 0;
        for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
            families += 1;
            let mut parts = line.split(' ').skip(2);
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                panic!("bad TYPE line {line:?}");
            };
            assert!(name.starts_with("muster_agent_"), "{line}");
            assert_eq!(kind == "counter", name.ends_with("_total"), "{line}");
            assert!(
                text.lines()
                    .any(|l| l.starts_with(&format!("# HELP {name} ")) && l.len() > 20),
                "no HELP for {name}"
            );
        }
        assert_eq!(families, 17, "{text}");
    }
}

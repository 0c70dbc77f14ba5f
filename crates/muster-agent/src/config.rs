//! [`AgentConfig`]: where the masters are, where the agent keeps its state, what it offers, and
//! the timing of registration.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use muster_actor::Upid;
use muster_model::PortRange;

use crate::AgentError;
use crate::task_uids::{DEFAULT_TASK_UID_RANGE, UidRange};

/// How an agent finds its masters, where it keeps its state and what it offers.
///
/// [`AgentConfig::new`] fills in everything but the masters and the data directory with
/// defaults (the machine's hostname, CPUs and memory; Mesos's timings).
#[derive(Debug, Clone, PartialEq)]
pub struct AgentConfig {
    /// The masters' addresses, `host:port`, tried in this order.
    pub masters: Vec<String>,
    /// Where the agent keeps its id (`agent_id`), task checkpoints (`meta/`) and the tasks'
    /// working directories (`tasks/<task id>`).
    pub data_dir: PathBuf,
    /// The hostname the agent reports.
    pub hostname: String,
    /// What the agent offers: CPUs and memory in MiB.
    pub resources: (f64, u64),
    /// Free-form attributes the agent reports (rack, zone, ...).
    pub attributes: BTreeMap<String, String>,
    /// Upper bound of the random delay before the first registration attempt and after losing a
    /// master, and the base of the exponential backoff between failed rounds (default 1 s).
    pub registration_backoff_initial: Duration,
    /// Cap on the backoff between failed registration rounds (default 60 s).
    pub registration_backoff_max: Duration,
    /// How long a heartbeat may go unanswered (and no ping come) before the agent counts its
    /// master as lost and re-registers; with a master that does not take heartbeats, how long
    /// the agent waits for a ping (default 75 s: Mesos's 15 s ping interval times 5).
    pub master_silence_timeout: Duration,
    /// How long one registration request may wait for an answer (default 5 s).
    pub ask_timeout: Duration,
    /// How many completed tasks the agent remembers (default 1000); the oldest go first.
    pub completed_task_history: usize,
    /// How long a task asked to stop (`KillTask`) has between SIGTERM to its process group and
    /// SIGKILL (default 5 s; zero sends SIGKILL at once).
    pub kill_grace: Duration,
    /// Whether to bound tasks with cgroups where the machine allows (default true). False, or
    /// no usable cgroups, leaves each task's process group only, which the agent says once at
    /// start and reports as its `muster.isolation` attribute.
    pub cgroups: bool,
    /// Most processes and threads one task may run at once, with cgroups (default 4096).
    pub task_pids_max: u64,
    /// The user tasks run as when they name none. `None` (the default): a uid of the task's
    /// own from `task_uid_range` when the agent runs as root, else the agent's own user.
    pub task_user: Option<String>,
    /// The uids a root agent runs its tasks as when neither their job nor `task_user` names a
    /// user: each running task holds one of its own, its group the same number (default
    /// [`DEFAULT_TASK_UID_RANGE`], systemd's 61184-65519). No user of the machine may have one
    /// of these ids; two agents on one machine need ranges of their own.
    pub task_uid_range: UidRange,
    /// Users a task (its job's group) may name to run as, besides `task_user`; none by default.
    pub allowed_task_users: Vec<String>,
    /// The ports the agent hands out to tasks that ask for a dynamic one (default
    /// 20000-32000, as Nomad's): no other program of the machine should listen in it.
    pub dynamic_ports: PortRange,
    /// How long the agent may be down and still take its running tasks back when it starts
    /// again (default 15 min, as Mesos's `--recovery_timeout`). An agent down longer kills
    /// what it finds still running before it does anything else: by then the cluster has
    /// replaced those tasks.
    pub recovery_timeout: Duration,
    /// Whether stopping the agent process kills its tasks (default true, for an agent embedded
    /// in another program or a test). The `muster-agent` binary sets it false: its tasks
    /// outlive it, for its next run to re-attach.
    pub stop_tasks_on_exit: bool,
    /// What runs the tasks: `None` (the default) for processes of this machine, each under
    /// its executor; a [`TaskRunner`](crate::runner::TaskRunner) otherwise, such as a
    /// deterministic simulation's [`SimulatedTasks`](crate::simulated::SimulatedTasks). With a
    /// runner the agent's own logic (checkpoints, states, kills, fencing, recovery) is the
    /// same, but it touches none of the machine's processes, cgroups (`cgroups` is ignored:
    /// its isolation is `none`) or users (`task_user` and `allowed_task_users` only decide
    /// whom a task may name). Give every run of an agent the same runner, as a machine keeps
    /// its processes across agent restarts.
    pub task_runner: Option<crate::runner::CustomRunner>,
    /// The most bytes one output file of a task holds (default 10 MiB). The task's executor
    /// writes what the task writes to its stdout and stderr (pipes) into `stdout` and `stderr`
    /// in 64 KiB chunks, and rotates a file before a chunk would take it past this size: it
    /// becomes `stdout.1`, the older ones shifting to `stdout.2`, ... So a stream takes at most
    /// (`task_output_files` + 1) × this on disk, however fast the task writes, while it runs
    /// (with or without an agent) and after; nothing is lost at a rotation. A running task
    /// keeps the limits of the agent that started it.
    pub task_output_max_bytes: u64,
    /// Rotated files kept per stream of a task, `stdout.1` (newest) to `stdout.<n>` (default
    /// 5); the oldest is dropped when a rotation would make one more.
    pub task_output_files: u32,
    /// How often the agent checks for rotation the output files of running tasks whose
    /// executors do not rotate them (tasks an agent from before the executors' pipes started,
    /// which hold their files themselves; default 1 s). Those it rotates as logrotate's
    /// `copytruncate` does: a write landing just between the copy and the truncation is lost,
    /// and a stream may grow past its bound by what the task writes in one interval. The check
    /// runs off the agent process's thread, so a large copy never delays it.
    pub task_output_check_interval: Duration,
}

/// Default of [`AgentConfig::recovery_timeout`].
pub const DEFAULT_RECOVERY_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// Default of [`AgentConfig::task_pids_max`].
pub const DEFAULT_TASK_PIDS_MAX: u64 = 4096;

/// Default of [`AgentConfig::registration_backoff_initial`].
pub const DEFAULT_BACKOFF_INITIAL: Duration = Duration::from_secs(1);
/// Default of [`AgentConfig::registration_backoff_max`].
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(60);
/// Default of [`AgentConfig::master_silence_timeout`]: 15 s pings, 5 missed.
pub const DEFAULT_MASTER_SILENCE_TIMEOUT: Duration = Duration::from_secs(75);
/// Default of [`AgentConfig::ask_timeout`].
pub const DEFAULT_ASK_TIMEOUT: Duration = Duration::from_secs(5);
/// Default of [`AgentConfig::completed_task_history`].
pub const DEFAULT_COMPLETED_TASK_HISTORY: usize = 1000;
/// Default of [`AgentConfig::kill_grace`].
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(5);
/// Default of [`AgentConfig::task_output_max_bytes`]: 10 MiB.
pub const DEFAULT_TASK_OUTPUT_MAX_BYTES: u64 = 10 * 1024 * 1024;
/// Default of [`AgentConfig::task_output_files`].
pub const DEFAULT_TASK_OUTPUT_FILES: u32 = 5;
/// Default of [`AgentConfig::task_output_check_interval`].
pub const DEFAULT_TASK_OUTPUT_CHECK_INTERVAL: Duration = Duration::from_secs(1);

impl AgentConfig {
    /// A config for the given masters (`host:port`) and data directory, with this machine's
    /// hostname, CPU count and memory, no attributes, and the default timings.
    pub fn new(masters: Vec<String>, data_dir: impl Into<PathBuf>) -> Self {
        AgentConfig {
            masters,
            data_dir: data_dir.into(),
            hostname: default_hostname(),
            resources: (default_cpus(), default_mem_mb()),
            attributes: BTreeMap::new(),
            registration_backoff_initial: DEFAULT_BACKOFF_INITIAL,
            registration_backoff_max: DEFAULT_BACKOFF_MAX,
            master_silence_timeout: DEFAULT_MASTER_SILENCE_TIMEOUT,
            ask_timeout: DEFAULT_ASK_TIMEOUT,
            completed_task_history: DEFAULT_COMPLETED_TASK_HISTORY,
            kill_grace: DEFAULT_KILL_GRACE,
            cgroups: true,
            task_pids_max: DEFAULT_TASK_PIDS_MAX,
            task_user: None,
            task_uid_range: DEFAULT_TASK_UID_RANGE,
            allowed_task_users: Vec::new(),
            dynamic_ports: PortRange::default(),
            recovery_timeout: DEFAULT_RECOVERY_TIMEOUT,
            stop_tasks_on_exit: true,
            task_runner: None,
            task_output_max_bytes: DEFAULT_TASK_OUTPUT_MAX_BYTES,
            task_output_files: DEFAULT_TASK_OUTPUT_FILES,
            task_output_check_interval: DEFAULT_TASK_OUTPUT_CHECK_INTERVAL,
        }
    }

    /// The masters' process addresses, `master@host:port`, in order.
    ///
    /// # Errors
    /// [`AgentError::InvalidConfig`] if there is no master, or one is not `host:port`.
    pub fn master_upids(&self) -> Result<Vec<Upid>, AgentError> {
        if self.masters.is_empty() {
            return Err(AgentError::InvalidConfig(
                "no master address given (expected at least one host:port)".into(),
            ));
        }
        self.masters
            .iter()
            .map(|address| {
                Upid::new("master", address.trim()).map_err(|e| {
                    AgentError::InvalidConfig(format!("master address {address:?}: {e}"))
                })
            })
            .collect()
    }

    /// Checks the values that the agent cannot work with.
    ///
    /// # Errors
    /// [`AgentError::InvalidConfig`] naming the field.
    pub fn validate(&self) -> Result<(), AgentError> {
        self.master_upids()?;
        let invalid = |what: &str| Err(AgentError::InvalidConfig(what.to_owned()));
        if self.data_dir.as_os_str().is_empty() {
            return invalid("data_dir is empty");
        }
        if self.hostname.trim().is_empty() {
            return invalid("hostname is empty");
        }
        let (cpus, mem_mb) = self.resources;
        if !cpus.is_finite() || cpus <= 0.0 {
            return Err(AgentError::InvalidConfig(format!(
                "cpus (--cpus) must be a positive number, not {cpus}: an agent with none can \
                 run no task"
            )));
        }
        if mem_mb == 0 {
            return invalid(
                "mem_mb (--mem-mb) must be greater than zero: an agent with none can run no task",
            );
        }
        if self.registration_backoff_initial.is_zero() {
            return invalid("registration_backoff_initial must be greater than zero");
        }
        if self.registration_backoff_max < self.registration_backoff_initial {
            return invalid(
                "registration_backoff_max must be at least registration_backoff_initial",
            );
        }
        if self.master_silence_timeout.is_zero() {
            return invalid("master_silence_timeout must be greater than zero");
        }
        if self.ask_timeout.is_zero() {
            return invalid("ask_timeout must be greater than zero");
        }
        if self.recovery_timeout.is_zero() {
            return invalid("recovery_timeout must be greater than zero");
        }
        if self.task_output_max_bytes == 0 {
            return invalid("task_output_max_bytes must be greater than zero");
        }
        if self.task_output_files == 0 {
            return invalid("task_output_files must be at least 1");
        }
        if self.task_output_check_interval.is_zero() {
            return invalid("task_output_check_interval must be greater than zero");
        }
        if let Some(user) = &self.task_user
            && user.trim().is_empty()
        {
            return invalid("task_user is empty (leave it out for the default)");
        }
        // A user this machine does not know would fail every task that runs as it.
        let named = self
            .task_user
            .iter()
            .map(|u| ("task_user (--task-user)", u));
        let allowed =
            (self.allowed_task_users.iter()).map(|u| ("allowed_task_users (--allow-task-user)", u));
        for (setting, user) in named.chain(allowed) {
            if let Err(error) = crate::task_user::Credentials::of(user) {
                return Err(AgentError::InvalidConfig(format!(
                    "{setting} names user {user:?}, which this machine cannot look up: {error}"
                )));
            }
        }
        Ok(())
    }
}

/// This machine's hostname, from the kernel or `$HOSTNAME`; `localhost` if neither says.
pub fn default_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .or_else(|| {
            std::env::var("HOSTNAME")
                .ok()
                .filter(|name| !name.is_empty())
        })
        .unwrap_or_else(|| "localhost".to_owned())
}

/// The CPUs this process may use (1 if unknown).
fn default_cpus() -> f64 {
    std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64)
}

/// The machine's memory in MiB from `/proc/meminfo` (1024 if unknown).
fn default_mem_mb() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|line| line.strip_prefix("MemTotal:"))
                .and_then(|rest| {
                    rest.trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<u64>()
                        .ok()
                })
        })
        .map_or(1024, |kib| kib / 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_mesos_timings_and_validate() {
        let config = AgentConfig::new(vec!["127.0.0.1:5050".into()], "/tmp/x");
        assert_eq!(config.registration_backoff_initial, Duration::from_secs(1));
        assert_eq!(config.registration_backoff_max, Duration::from_secs(60));
        assert_eq!(config.master_silence_timeout, Duration::from_secs(75));
        assert_eq!(config.ask_timeout, Duration::from_secs(5));
        assert_eq!(config.completed_task_history, 1000);
        assert_eq!(config.kill_grace, Duration::from_secs(5));
        assert_eq!(config.task_output_max_bytes, 10 * 1024 * 1024);
        assert_eq!(config.task_output_files, 5);
        assert_eq!(config.task_output_check_interval, Duration::from_secs(1));
        assert!(!config.hostname.is_empty());
        assert!(config.validate().is_ok());
    }

    #[test]
    fn bad_values_are_named() {
        let mut config = AgentConfig::new(vec![], "/tmp/x");
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("no master"), "{err}");
        config.masters = vec!["nohostport".into()];
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("nohostport"), "{err}");
        config.masters = vec!["h:1".into()];
        config.registration_backoff_initial = Duration::ZERO;
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("registration_backoff_initial"), "{err}");
    }

    #[test]
    fn no_resources_and_unknown_users_are_named() {
        let valid = AgentConfig::new(vec!["h:1".into()], "/tmp/x");
        let mut config = valid.clone();
        config.resources = (0.0, 1024);
        let err = config.validate().unwrap_err().to_string();
        assert!(
            err.contains("cpus (--cpus) must be a positive number"),
            "{err}"
        );
        let mut config = valid.clone();
        config.resources = (2.0, 0);
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("mem_mb (--mem-mb)"), "{err}");
        let mut config = valid.clone();
        config.task_user = Some("no-such-user-muster".into());
        let err = config.validate().unwrap_err().to_string();
        assert!(
            err.contains("task_user (--task-user) names user \"no-such-user-muster\""),
            "{err}"
        );
        let mut config = valid.clone();
        config.allowed_task_users = vec!["root".into(), "no-such-user-muster".into()];
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("--allow-task-user"), "{err}");
        let mut config = valid;
        config.task_user = Some("root".into());
        assert!(config.validate().is_ok());
    }

    #[test]
    fn zero_output_limits_are_named() {
        let valid = AgentConfig::new(vec!["h:1".into()], "/tmp/x");
        let mut config = valid.clone();
        config.task_output_max_bytes = 0;
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("task_output_max_bytes"), "{err}");
        let mut config = valid.clone();
        config.task_output_files = 0;
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("task_output_files"), "{err}");
        let mut config = valid;
        config.task_output_check_interval = Duration::ZERO;
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains("task_output_check_interval"), "{err}");
    }
}

/// A port range as the flag and the config file write it, `MIN-MAX` (`20000-32000`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DynamicPorts(pub PortRange);

impl std::str::FromStr for DynamicPorts {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        PortRange::parse(text).map(DynamicPorts)
    }
}

impl std::fmt::Display for DynamicPorts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.0.min, self.0.max)
    }
}

/// From the same text as the flag, `"20000-32000"`.
impl<'de> serde::Deserialize<'de> for DynamicPorts {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl From<DynamicPorts> for PortRange {
    fn from(ports: DynamicPorts) -> Self {
        ports.0
    }
}

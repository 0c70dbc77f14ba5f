//! Muster's agent: the process on every worker machine that joins it to the cluster.
//!
//! An agent registers with the leading master (following `NotLeader` hints from standbys),
//! stores the id it is given, heartbeats to the master within the TTL each answer gives (at
//! half of it), answers the master's pings, and runs the tasks the master sends as child
//! processes in their own working directories, each under a small executor process that
//! outlives the agent: a restarted agent (even one SIGKILLed) re-attaches to the tasks that
//! still run and reports the real exit code of those that ended meanwhile. When it loses its master — the link breaks, a
//! heartbeat goes unanswered (or, with a master that takes no heartbeats, no ping comes) for a
//! while, or the master says it no longer leads — or the master refuses a heartbeat, or the
//! agent restarts with a stored id, it re-registers with its full state in one message, after a
//! random delay and with capped exponential backoff, so that a master failover is not a
//! connection storm.
//!
//! # Layout
//! - `agent`: the [`Agent`] process, its messages ([`AgentMsg`]) and their dispatch, with
//!   - `agent::handle`: [`start`] and [`AgentHandle`] ([`AgentStatus`], [`AgentSnapshot`]);
//!   - `agent::master_link`: registration, re-registration, leader following, heartbeats,
//!     noticing a lost master;
//!   - `agent::task_lifecycle`: launching and killing tasks, their ends, status reports;
//!   - `agent::supervision`: health checks, restarts in place, a task's longest run and its
//!     kill signal.
//! - `tasks`: the task table (running tasks with their supervision, bounded completed
//!   history).
//! - `health`: health checks (HTTP, TCP, command) and what their streaks make of a task.
//! - `restarts`: what a restart policy says of a task that failed.
//! - [`runner`]: what runs a task, the one [`runner::TaskRunner`] the agent holds: processes
//!   by default, or one its config gives, such as [`simulated::SimulatedTasks`]
//!   (deterministic simulation tests), with the agent's logic (launches, kills, checkpoints,
//!   recovery, fencing) the same for both.
//! - `process_runner`: the processes' runner: a task's working directory, cgroup and user, its
//!   start, its re-attach after a restart, its output files, with
//!   - `child_process`: a task's processes (spawning under an executor, re-attaching after a
//!     restart, signals);
//!   - `executor`: the executor between the agent and a task, and its files;
//!   - `output`: a task's `stdout` and `stderr` files: rotation past a size, and reading them
//!     back by absolute offset across rotations;
//!   - [`isolation`]: cgroups (or process groups) bounding each task;
//!   - `task_user`: whom tasks run as (a uid of their own by default when the agent is
//!     root, the agent's user otherwise), and the users a job may name;
//!   - `task_uids`: those dynamic uids ([`UidRange`]): one per running task, held from its
//!     start (or re-attach) until its processes are reaped;
//!   - `decimal`: numbers written without allocating, between fork and exec.
//! - [`simulated`]: simulated tasks on the simulation's clock, for deterministic simulations.
//! - `backoff`: registration delays (random start, capped exponential backoff with jitter).
//! - [`AgentConfig`]: masters, data directory, resources, timings.
//! - [`store`]: the files under the data directory (the id, task checkpoints, working dirs),
//!   written whole or not at all (`atomic_file`).
//! - [`AgentError`]: why an agent could not start.
//! - [`metrics`]: the agent's figures (asked of the agent process), its tasks' CPU and memory
//!   (read from their cgroups or `/proc`) and its transport counters, as Prometheus text.
//! - [`http`]: the agent's HTTP port: `GET /metrics` and health, with the agent's TLS.
//!
//! The `muster-agent` binary wraps this for operators.

mod agent;
mod atomic_file;
mod backoff;
mod child_process;
mod config;
mod decimal;
mod error;
mod executor;
mod health;
pub mod http;
pub mod isolation;
pub mod metrics;
mod output;
mod process_runner;
pub mod reregistration;
mod restarts;
pub mod runner;
pub mod simulated;
pub mod store;
mod task_uids;
mod task_user;
mod tasks;

pub use agent::{
    Agent, AgentHandle, AgentMsg, AgentSnapshot, AgentStatus, ISOLATION_ATTRIBUTE, start,
};
pub use config::{
    AgentConfig, DEFAULT_ASK_TIMEOUT, DEFAULT_BACKOFF_INITIAL, DEFAULT_BACKOFF_MAX,
    DEFAULT_COMPLETED_TASK_HISTORY, DEFAULT_KILL_GRACE, DEFAULT_MASTER_SILENCE_TIMEOUT,
    DEFAULT_RECOVERY_TIMEOUT, DEFAULT_TASK_OUTPUT_CHECK_INTERVAL, DEFAULT_TASK_OUTPUT_FILES,
    DEFAULT_TASK_OUTPUT_MAX_BYTES, DEFAULT_TASK_PIDS_MAX, DynamicPorts, default_hostname,
};
pub use error::AgentError;
pub use isolation::Isolation;
pub use task_uids::{DEFAULT_TASK_UID_RANGE, UidRange, UidRangeError};

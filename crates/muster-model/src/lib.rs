//! Muster's domain model: what the cluster is made of, shared by every other crate.
//!
//! Agents offer [`Resources`]; users submit [`Job`]s of [`TaskGroup`]s; every change to a job
//! or to the agents it runs on becomes an [`Evaluation`], which a scheduler turns into tasks
//! placed on agents. These types carry no I/O, no raft and no runtime: a custom scheduler that
//! links the scheduler SDK gets them without openraft or sled.
//!
//! # Layout
//! - [`agent`]: [`AgentId`], [`AgentInfo`], [`UnreachableAgent`].
//! - [`clock`]: the wall clock records are stamped with (a simulation installs its own).
//! - [`resources`]: [`Resources`] and the one rule for whether a task fits
//!   ([`Resources::fits_in`]), used by schedulers, the blocked-queue and the plan applier alike.
//! - [`job`]: [`Job`], [`TaskGroup`], [`SchedulerType`], and [`Job::validate`], whose errors
//!   name the field.
//! - [`placement`]: where a group's tasks may run and would rather run: [`Constraint`]s,
//!   [`Affinity`]s and [`Spread`]s, and the one set of matching rules for them.
//! - [`ports`]: ports as resources: [`PortRequest`], [`AssignedPort`], an agent's
//!   [`PortRange`], and the environment a task finds its ports in.
//! - [`lifecycle`]: how a group's tasks are restarted in place ([`RestartPolicy`]), placed
//!   again ([`ReschedulePolicy`]), checked ([`Check`], [`TaskHealth`]) and stopped
//!   ([`KillSignal`]).
//! - [`update`]: a group's [`UpdatePolicy`] (how its tasks are replaced when its job changes).
//! - [`deployment`]: the [`Deployment`] of each version of a job with update policies: how
//!   many tasks a scheduler may replace now, canaries.
//! - [`eval`]: [`Evaluation`], [`EvalId`], [`EvalStatus`], [`Trigger`].
//! - [`task`]: [`Task`] and [`TaskState`], where a task is in its life.
//! - [`namespace`]: [`Namespace`], its [`Quota`] (and [`QuotaUsage`], a namespace's tasks
//!   counted against it), and job ids (`team-a:web`) that carry a
//!   job's namespace.
//! - [`preemption`]: which job types may stop lower-priority tasks to fit
//!   ([`PreemptionConfig`]).
//! - [`demand`]: [`Demand`], what a task group could not place, and
//!   [`blocked_description`](demand::blocked_description), why an evaluation is blocked.
//! - [`error`]: [`FieldError`], a value that is invalid, naming the field.
//! - [`convert`]: `From`/`TryFrom` to and from the `muster.model.v1` messages, and helpers
//!   for reading nested messages with errors that name the field path.

pub mod agent;
pub mod clock;
pub mod convert;
pub mod demand;
pub mod deployment;
pub mod error;
pub mod eval;
pub mod job;
pub mod lifecycle;
mod names;
pub mod namespace;
pub mod placement;
pub mod ports;
pub mod preemption;
pub mod resources;
pub mod task;
pub mod update;
mod validate;
pub use validate::check_scheduler_name;

pub use agent::{AgentId, AgentInfo, AgentScheduling, Drain, DrainPhase, UnreachableAgent};
pub use demand::Demand;
pub use deployment::{
    Deployment, DeploymentGroup, DeploymentStatus, HealthCriteria, UpdatePolicy, deployment_id,
};
pub use error::FieldError;
pub use eval::{EvalId, EvalStatus, Evaluation, Trigger};
pub use job::{
    BATCH_LOST_AFTER, BUILT_IN_SCHEDULERS, DEFAULT_MAX_JOB_BYTES, DEFAULT_PRIORITY, Disconnect,
    DisconnectPolicy, Job, JobLimits, MAX_ARGS, MAX_ENV, MAX_JOB_BYTES_CEILING, Reconcile,
    SchedulerType, TaskGroup,
};
pub use lifecycle::{
    Check, CheckKind, DelayFunction, KillSignal, ReschedulePolicy, RestartMode, RestartPolicy,
    TaskHealth,
};
pub use namespace::{
    DEFAULT_NAMESPACE, Namespace, Quota, QuotaUsage, job_id, namespace_of, split_job_id,
    task_namespace,
};
pub use placement::{
    Affinity, Constraint, ConstraintOp, DEFAULT_SPREAD_WEIGHT, Spread, SpreadTarget,
};
pub use ports::{AssignedPort, PortRange, PortRequest};
pub use preemption::PreemptionConfig;
pub use resources::{Resources, utilization};
pub use task::{Task, TaskState};

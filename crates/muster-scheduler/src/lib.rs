//! Muster's scheduler SDK: everything a program needs to turn evaluations into plans.
//!
//! Scheduling follows Nomad's optimistic model (as in HashiCorp's "Nomad 2 million container
//! challenge" write-up): many workers, in this process or
//! others, each pull an evaluation from the broker, plan against a snapshot of the cluster that
//! may already be stale, and submit the plan to the leading master, whose serial plan applier
//! commits the placements that still fit and rejects the others. A worker whose placements were
//! rejected refreshes its snapshot and plans again, a bounded number of times; what still does
//! not fit blocks the evaluation until capacity changes.
//!
//! Writing a scheduler is usually writing a [`Placer`]: given one task slot and the agents it
//! fits on, pick one. [`PlacingScheduler`] does the rest (reconciliation, resource accounting,
//! constraints, unplaced demands). The built-in [`binpack()`] fills agents one after another;
//! [`spread()`] evens a job out over all agents, which makes concurrent optimistic schedulers
//! collide far less.
//!
//! # Layout
//! - [`plan`]: what a scheduler sees ([`ClusterSnapshot`], [`AgentView`], [`TaskView`]) and what
//!   it produces ([`Plan`] of [`Placement`]s and [`Stop`]s, [`Demand`]s left unplaced), and the
//!   applier's answer ([`PlanResult`]). Jobs, evaluations and resources are
//!   [`muster_model`]'s, re-exported here as [`model`].
//! - [`reconcile`](mod@reconcile): [`reconcile()`], the slots a job wants, which are missing, and
//!   which tasks must stop; shared by every scheduler.
//! - [`scheduler`]: the [`Scheduler`] and [`Placer`] traits, [`PlacingScheduler`], and the
//!   built-in [`binpack()`] and [`spread()`].
//! - `search`: the search for a slot's candidates while a plan is built: the agents as the
//!   plan leaves them, and what each is to the slot's group.
//! - [`ranking`]: how candidates rank beyond fit: the job's anti-affinity, the group's
//!   affinities and spreads.
//! - `quota`: a namespace's tasks counted against its quota while a plan is built.
//! - [`worker`]: the [`Backend`] a worker talks to (broker, snapshots, plan applier, registry)
//!   and the [`Worker`] loop: dequeue, snapshot, schedule, submit, retry, block or complete,
//!   ack.
//! - [`wire`]: the SDK's types to and from their `muster.scheduling.v1` messages.
//! - [`protocol`]: what the scheduling API's two sides agree on beyond messages: limits,
//!   metadata keys, and the one "not the leader" convention every Muster API follows.
//! - [`remote`]: workers in their own program: [`RemoteBackend`] reaches the leading master
//!   over gRPC, following the leader.

mod candidate;
pub mod plan;
pub mod protocol;
mod quota;
pub mod ranking;
pub mod reconcile;
pub mod remote;
pub mod scheduler;
mod search;
pub mod wire;
pub mod worker;

pub use muster_model as model;
pub use muster_model::{Demand, TaskState, utilization};

pub use plan::{
    AgentView, ClusterSnapshot, JobGroup, JobIndex, Placement, Plan, PlanResult, Preemption, Stop,
    TaskView,
};
pub use reconcile::{
    CANARY_PREFIX, Reconciled, SlotRequest, counted_slot_index, reconcile, wants_counted_slot,
};
pub use remote::{RemoteBackend, RemoteConfig, RemoteError};
pub use scheduler::{
    BinPack, Candidate, FnPlacer, MIN_CANDIDATES, Placer, PlacingScheduler, Scheduler, Spread,
    binpack, sampled_candidates, spread,
};
pub use worker::{
    Assignment, Backend, DEFAULT_MAX_ATTEMPTS, DEFAULT_SETTLING, Outcome, Worker, WorkerConfig,
    WorkerError, WorkerStats,
};

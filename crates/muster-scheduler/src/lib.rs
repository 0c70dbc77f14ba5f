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
//! # Tutorial: a whole scheduler
//!
//! A scheduler serves a *name*: jobs that give it (`scheduler = "least-loaded"` in their
//! file) are handed only to workers serving it, beside the master's own workers for the
//! built-in `service`, `batch` and `system`. This one puts each task on the agent with the
//! most free memory. First its one decision, tried against a cluster made in memory:
//!
//! ```
//! use std::collections::BTreeMap;
//! use std::sync::Arc;
//!
//! use muster_scheduler::model::{
//!     AgentId, Evaluation, Job, Resources, SchedulerType, TaskGroup, Trigger,
//! };
//! use muster_scheduler::{
//!     AgentView, Candidate, ClusterSnapshot, PlacingScheduler, Scheduler, SlotRequest, TaskView,
//! };
//!
//! /// Of the agents the task fits on (never none), the one with the most memory free.
//! fn most_free_memory(_slot: &SlotRequest, candidates: &[Candidate<'_>]) -> Option<AgentId> {
//!     let best = candidates.iter().max_by_key(|c| c.free.mem_mb)?;
//!     Some(best.id().clone())
//! }
//!
//! let agent = |id: &str, mem_mb| {
//!     let total = Resources { cpus: 4.0, mem_mb };
//!     Arc::new(AgentView::new(AgentId(id.into()), BTreeMap::new(), total, Vec::<TaskView>::new()))
//! };
//! let job = Job {
//!     name: "web".into(),
//!     priority: 50,
//!     scheduler: SchedulerType::Service,
//!     named_scheduler: Some("least-loaded".into()),
//!     groups: vec![TaskGroup {
//!         name: "frontend".into(),
//!         count: 2,
//!         resources: Resources { cpus: 1.0, mem_mb: 512 },
//!         command: "server".into(),
//!         ..TaskGroup::default()
//!     }],
//!     stopped: false,
//!     version: 1,
//! };
//! let snapshot = ClusterSnapshot {
//!     agents: vec![agent("small", 1024), agent("big", 8192)],
//!     jobs: BTreeMap::from([(job.name.clone(), job.clone())]),
//!     ..ClusterSnapshot::default()
//! };
//! let mut scheduler = PlacingScheduler::from_fn("least-loaded", most_free_memory);
//! let plan = scheduler.schedule(&Evaluation::new(&job, Trigger::JobRegister), &snapshot);
//! // Both replicas go to `big`: after the first it still has the most memory free.
//! let agents: Vec<&str> = plan.place.iter().map(|p| p.agent.0.as_str()).collect();
//! assert_eq!(agents, ["big", "big"]);
//! ```
//!
//! [`PlacingScheduler`] did the rest: which of the job's slots are missing, which agents have
//! room and meet the constraints, the plan. Then the program: workers that serve the name,
//! reaching the leading master over gRPC with TLS and a token whose policy may serve it
//! (`[scheduler] names = ["least-loaded"]`; the built-in `schedule` policy serves any):
//!
//! ```no_run
//! # use muster_scheduler::model::AgentId;
//! # use muster_scheduler::{Candidate, PlacingScheduler, SlotRequest};
//! # fn most_free_memory(_: &SlotRequest, c: &[Candidate<'_>]) -> Option<AgentId> { None }
//! # async fn run(security: muster_security::Security, token: muster_security::TokenSecret)
//! # -> Result<(), Box<dyn std::error::Error>> {
//! use muster_scheduler::{RemoteBackend, Worker, WorkerConfig};
//!
//! let masters = vec!["10.0.0.1:5050".to_owned(), "10.0.0.2:5050".to_owned()];
//! let backend = RemoteBackend::connect(masters, security, Some(token))?;
//! let (stop, stopped) = tokio::sync::watch::channel(false);
//! let scheduler = PlacingScheduler::from_fn("least-loaded", most_free_memory);
//! let worker = Worker::new(backend, scheduler, WorkerConfig::serving(["least-loaded"]));
//! let stats = worker.run(stopped).await; // until `stop.send(true)`
//! println!("{} evaluations, {} placements", stats.dequeued, stats.placements_committed);
//! # drop(stop);
//! # Ok(())
//! # }
//! ```
//!
//! While no worker serves the name, its jobs wait and say so (`muster eval list`: `no
//! scheduler "least-loaded" connected since …`). A job that needs all of its tasks at once
//! sets `gang = true`; a scheduler that plans whole jobs itself implements [`Scheduler`]
//! directly (the repository's `examples/gang_scheduler.rs`).
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
pub mod replica;
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

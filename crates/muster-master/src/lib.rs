//! Muster's master: admits agents, watches their health, and after a failover rebuilds the
//! cluster from the agents as they re-register.
//!
//! Several masters form one registry raft group ([`muster_registry`]); the raft leader is the
//! leading master and the others stand by, answering agents with the leader's address. Agents
//! talk to the `master` process over the actor transport; operators use the gRPC
//! [`OperatorService`], and scheduler workers in other programs the [`SchedulingService`],
//! both served on the same port.
//!
//! # Layout
//! - [`MasterConfig`]: settings, with Mesos's defaults.
//! - [`Master`], [`MasterMsg`]: the process. Every request it handles is a struct with named
//!   fields in [`requests`]; `src/master/` has one module per resource (agents, tasks, jobs,
//!   evaluations, plans, ACL, the cluster's state, leadership), each with its requests and
//!   their handlers, and `master.rs` lists and dispatches them in one place.
//! - [`ServiceError`]: why the operator or scheduling API refused a request, and its gRPC
//!   status.
//! - [`OperatorService`]: cluster state, metrics and jobs over gRPC; `raft_peers`: the
//!   masters' raft group, listed and changed.
//! - [`MasterServer`]: port, registry, process and API started together ([`MasterError`]:
//!   why it could not start).
//! - [`Workers`], [`LocalBackend`]: scheduler workers inside the master process.
//! - [`http`]: the HTTP/JSON API on its own port, with its OpenAPI document.
//! - [`metrics`]: the master's Prometheus metrics ([`metrics::render`]) and the instruments
//!   observed where things happen ([`metrics::MasterInstruments`]).
//! - [`visibility`]: what each caller may see and touch, namespace by namespace (the checks
//!   and redaction every operator call and the event stream go through).
//! - [`SchedulingService`]: the broker and plan applier over gRPC, for workers in other
//!   programs (their side: [`muster_scheduler::RemoteBackend`]).

pub mod authorization;
mod cluster;
mod cluster_watch;
mod config;
mod drop_later;
mod error;
pub mod http;
mod launch_wire;
mod log_monitor;
mod master;
pub mod metrics;
mod operator;
mod raft_peers;
mod scheduling_service;
mod server;
mod task_record;
#[cfg(feature = "testing")]
pub mod testing;
pub mod visibility;
mod workers;

pub use config::{HTTP_PORT_OFFSET, MasterConfig, Placement, PreemptionSetting};
pub use drop_later::wait_for_background_frees;
pub use error::ServiceError;
pub use master::{
    ACL_BOOTSTRAP_RESET_FILE, EventFeed, KEPT_EVENTS, Lagged, LoggedEvent, Master, MasterMsg,
    SUBSCRIBER_BUFFER, SchedulingPids, Subscription, requests,
};
pub use operator::{MAX_OPERATOR_MESSAGE, OperatorService, REDACTED};
pub use scheduling_service::SchedulingService;
pub use server::{MasterError, MasterServer};
pub use workers::{LocalBackend, Workers};

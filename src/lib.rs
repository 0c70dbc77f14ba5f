//! Muster: a libprocess-style actor runtime and the cluster-coordination services built on it.
//!
//! This crate re-exports the workspace's crates under short names, so a program can depend on
//! `muster` alone:
//! - [`actor`]: processes, pids, mailboxes, links, timers, pools, supervision, remote nodes
//!   (`muster-actor`);
//! - [`model`]: the domain types: agents, resources, jobs, evaluations, tasks (`muster-model`);
//! - [`proto`]: the generated wire types (`muster-proto`);
//! - [`registry`]: the replicated registry, openraft on sled (`muster-registry`);
//! - [`master`]: the master process and server (`muster-master`);
//! - [`scheduler`]: the scheduler SDK: write a scheduler, run workers in your own program
//!   against the leading master (`muster-scheduler`);
//! - [`agent`]: the agent process (`muster-agent`);
//! - [`security`]: mutual TLS, tokens and policies (`muster-security`);
//! - [`launch`]: what the binaries share at start-up, for programs of your own: logging,
//!   and the TLS and token flags a client takes (`muster-launch`).
//!
//! Its binary, `muster`, runs a one-process dev cluster (`muster dev`) and shows a cluster's
//! state (`muster status`).

/// The actor runtime and its transport in one module: `muster-actor`'s local processes and
/// `muster-transport`'s nodes and remote pids (a program that wants only local processes can
/// depend on `muster-actor` alone).
pub mod actor {
    pub use muster_actor::*;
    pub use muster_transport::*;
}
pub use muster_agent as agent;
pub use muster_launch as launch;
pub use muster_master as master;
pub use muster_model as model;
pub use muster_proto as proto;
pub use muster_registry as registry;
pub use muster_scheduler as scheduler;
pub use muster_security as security;
pub use muster_transport as transport;

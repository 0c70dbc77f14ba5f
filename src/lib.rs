//! Muster: a libprocess-style actor runtime and the cluster-coordination services built on it.
//!
//! This crate re-exports the workspace's crates under short names, so a program can depend on
//! `muster` alone:
//! - [`actor`]: processes, pids, mailboxes, links, timers, pools, supervision, remote nodes
//!   (`muster-actor`);
//! - [`proto`]: the generated wire types (`muster-proto`).
//!
//! Start with `examples/README.md` and `cargo run --example ping_pong`.

pub use muster_actor as actor;
pub use muster_proto as proto;

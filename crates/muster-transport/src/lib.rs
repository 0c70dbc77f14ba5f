//! Muster's transport: processes of `muster-actor` on other nodes. A [`Node`] serves named
//! processes and keeps one link per peer (one tonic stream, mutual TLS); a [`RemotePid`]
//! tells and asks a process by its address ([`Upid`]); [`LinkRemote`] links a local process to
//! a remote one. Local processes need none of it: `muster-actor` alone links no network stack.
//!
//! # Layout
//! - `node`: the node itself: its tonic server, its named processes.
//! - `receive`: what the links share (`NodeInner`), and the frames they read, dispatched to
//!   the processes they name.
//! - `dial`: the links this node dials, reconnecting with backoff.
//! - `accept`: the links peers open to this node.
//! - `peer`: one peer's queue of encoded frames, pending asks, remote links; the roles that
//!   may link.
//! - `wire`: the frames on the wire, written and read without message structs, and tonic's
//!   codec for them.
//! - `inbox`: per-process decoders by proto type name (`install`) and remote replies.
//! - `remote_pid`: tell and ask a remote process; [`LinkRemote`].
//! - `message_type`: what is kept of each message type (its name, its replies' head).
//! - `sync`: the lock helpers the modules share.
//! - `config`, `stats`: limits and counters.
//! - `health`: the gRPC health service and server reflection a node serves for operators.

mod accept;
mod config;
mod dial;
pub mod health;
mod inbox;
mod message_type;
mod node;
mod peer;
mod receive;
mod remote_pid;
mod route_cache;
mod stats;
mod sync;
mod wire;

pub use config::NodeConfig;
pub use inbox::{MEMBERS, Registration};
pub use muster_actor::Upid;
pub use muster_security as security;
pub use node::{Node, NodeError};
pub use remote_pid::{LinkRemote, RemotePid};
pub use stats::TransportStats;

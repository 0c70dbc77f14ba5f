//! Processes on other nodes: addresses ([`Upid`]), the [`Node`] that serves named processes and
//! keeps one link per peer, and [`RemotePid`] handles.
//!
//! # Layout
//! - `upid`: `name@host:port` addresses.
//! - `node`: the tonic server, the reconnecting outbound links, envelope dispatch.
//! - `peer`: one peer's queue, pending asks, remote links, and the frame batching.
//! - `inbox`: per-process decoders by proto type name (`install`) and remote replies.
//! - `remote_pid`: tell and ask a remote process; `Context::link_remote`.
//! - `config`, `stats`: limits and counters.
//! - `health`: the gRPC health service and server reflection a node serves for operators.

mod config;
pub mod health;
mod inbox;
mod node;
mod peer;
mod remote_pid;
mod stats;
mod upid;

use std::any::TypeId;
use std::collections::HashMap;
use std::sync::RwLock;

use bytes::Bytes;

pub use config::NodeConfig;
pub use inbox::{MEMBERS, Registration};
pub use node::{Node, NodeError};
pub use remote_pid::RemotePid;
pub use stats::TransportStats;
pub use upid::Upid;

/// The proto full name of `M`, built once per type: `prost::Name::full_name` allocates a new
/// `String` on every call, too much for every envelope.
pub(crate) fn type_name<M: prost::Name + 'static>() -> Bytes {
    static NAMES: RwLock<Option<HashMap<TypeId, Bytes>>> = RwLock::new(None);
    let id = TypeId::of::<M>();
    if let Some(name) = NAMES
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .and_then(|names| names.get(&id))
    {
        return name.clone();
    }
    let name = Bytes::from(M::full_name());
    NAMES
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(id, name.clone());
    name
}

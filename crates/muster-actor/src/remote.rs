//! Processes on other nodes: addresses ([`Upid`]), the [`Node`] that serves named processes and
//! keeps one link per peer, and [`RemotePid`] handles.
//!
//! # Layout
//! - `upid`: `name@host:port` addresses.
//! - `node`: the tonic server, the reconnecting outbound links, envelope dispatch.
//! - `peer`: one peer's queue of encoded frames, pending asks, remote links.
//! - `wire`: the frames on the wire, written and read without message structs, and tonic's
//!   codec for them.
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
mod wire;

use std::any::TypeId;
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::RwLock;

pub use config::NodeConfig;
pub use inbox::{MEMBERS, Registration};
pub use node::{Node, NodeError};
pub use remote_pid::RemotePid;
pub use stats::TransportStats;
pub use upid::Upid;

/// The proto full name of `M`, built once per type and kept for the life of the program (one
/// string per message type a node sends): `prost::Name::full_name` allocates a new `String` on
/// every call, too much for every envelope. The type this thread asked for last is answered
/// from a thread-local slot, without the shared map's lock or hash.
pub(crate) fn type_name<M: prost::Name + 'static>() -> &'static [u8] {
    thread_local! {
        static LAST: Cell<Option<(TypeId, &'static [u8])>> = const { Cell::new(None) };
    }
    static NAMES: RwLock<Option<HashMap<TypeId, &'static [u8]>>> = RwLock::new(None);
    let id = TypeId::of::<M>();
    if let Some((last, name)) = LAST.get()
        && last == id
    {
        return name;
    }
    let known = NAMES
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .and_then(|names| names.get(&id).copied());
    let name = known.unwrap_or_else(|| {
        *NAMES
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(HashMap::new)
            .entry(id)
            .or_insert_with(|| M::full_name().leak().as_bytes())
    });
    LAST.set(Some((id, name)));
    name
}

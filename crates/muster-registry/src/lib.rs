//! Muster's replicated registry: what must survive a master failover, and nothing more.
//!
//! The masters of a cluster form one raft group (openraft 0.9, storage v2). The leading master
//! writes admitted and unreachable agents through a [`Registrar`], which packs the operations
//! queued while a write is in flight into the next raft entry. Every master keeps the log and
//! state machine in sled ([`store`]), and raft traffic travels over tonic ([`network`]).
//!
//! # Layout
//! - [`types`]: the raft type config, [`Op`]s and their outcomes. What they carry (agents,
//!   jobs, evaluations) is `muster-model`'s.
//! - [`RegistryState`]: the contents and the rules that change them.
//! - [`codec`]: the binary encoding of entries, snapshots and raft messages.
//! - [`election`]: elections after a pre-vote round, which openraft 0.9 lacks.
//! - [`membership`]: changing the group while it runs, and moving leadership.
//! - [`store`]: the log and state machine, on sled (or a [`MemoryDisk`] in simulations).
//! - [`network`]: the raft client and server over tonic.
//! - [`RegistryNode`]: one master's raft member, started from a [`RegistryConfig`].
//! - [`Registrar`]: the batching writer process.
//! - [`snapshot_file`]: the operator snapshot file (`muster operator snapshot save|restore`).

pub mod codec;
pub mod election;
pub mod membership;
pub mod network;
mod node;
mod peer_version;
mod registrar;
pub mod snapshot_file;
mod state;
pub mod store;
pub mod types;
mod write_error;

pub use membership::{MembershipError, Peer};
pub use network::LeaderContact;
pub use node::{Leadership, RegistryConfig, RegistryError, RegistryNode};
pub use registrar::{MAX_OPS_PER_ENTRY, Registrar, RegistrarMsg, RegistrarStats, WriteResult};
pub use state::{
    DEPLOYMENTS_KEPT, ENDED_EVALS_KEPT_PER_JOB, JOB_VERSION_BYTES_KEPT, JOB_VERSIONS_KEPT,
    RegistryState, next_version,
};
pub use store::{MemoryDisk, RegistryReader, StoreLocation};
pub use types::{DeploymentChange, Op, OpError, Outcome, StoredPolicy};
pub use write_error::WriteError;

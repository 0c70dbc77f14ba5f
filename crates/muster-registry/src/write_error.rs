//! [`WriteError`]: why a registry write did not happen, whether written through a
//! [`RegistryNode`](crate::RegistryNode) or a [`Registrar`](crate::Registrar).

use crate::types::{NodeId, OpError};

/// Why a registry write did not happen.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    /// The operation was written but changed nothing.
    #[error(transparent)]
    Rejected(#[from] OpError),
    /// This master does not lead the registry group.
    #[error("not the registry leader{}", match leader {
        Some((id, address)) => format!(" (the leader is {id} at {address})"),
        None => " (no leader known)".to_owned(),
    })]
    NotLeader {
        /// The leader's id and address, if known.
        leader: Option<(NodeId, String)>,
    },
    /// raft failed (shut down, storage error).
    #[error("registry write failed: {0}")]
    Failed(String),
}

//! The registry's durable storage: openraft's log and state machine on one sled database.
//!
//! One `sled::Db` per master, because a flush syncs the whole database. Trees:
//! - `log`: raft entries keyed by big-endian index;
//! - `raft`: the vote, the last purged log id and the committed log id;
//! - `snapshot`: the current snapshot, the only durable copy of the state machine (which lives
//!   in memory and is rebuilt on start from the snapshot plus the log).
//!
//! Every write that openraft is told is persisted has been flushed first: the vote, appended
//! entries, truncation, purge and snapshots.

mod log;
mod state_machine;

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

pub use log::LogStore;
pub use state_machine::{RegistryReader, StateMachineStore};

/// Why the store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// sled could not open the directory (it does not exist and cannot be made, it is not
    /// writable, or another process holds it).
    #[error("cannot open the registry store at {path}: {source}")]
    Open {
        /// The data directory.
        path: PathBuf,
        /// What sled said.
        source: sled::Error,
    },
    /// A stored value did not decode.
    #[error("the registry store at {path} holds an unreadable value under {key:?}: {reason}")]
    Corrupt {
        /// The data directory.
        path: PathBuf,
        /// The key.
        key: String,
        /// What went wrong.
        reason: String,
    },
}

/// Opens (or creates) the store in `path`: the log half and the state-machine half that
/// openraft drives, over one sled database.
///
/// # Errors
/// [`StoreError`] naming the path if sled cannot open it or a stored value does not decode.
pub fn open(path: &Path) -> Result<(LogStore, StateMachineStore), StoreError> {
    let db = sled::Config::new()
        .path(path)
        .open()
        .map_err(|source| StoreError::Open {
            path: path.to_owned(),
            source,
        })?;
    let tree = |name: &str| {
        db.open_tree(name).map_err(|source| StoreError::Open {
            path: path.to_owned(),
            source,
        })
    };
    // Before the state machine lived in memory it was also written to a `state` tree: the
    // snapshot and the log hold everything it had.
    db.drop_tree("state").map_err(|source| StoreError::Open {
        path: path.to_owned(),
        source,
    })?;
    let log = LogStore::new(db.clone(), tree("log")?, tree("raft")?);
    let state_machine =
        StateMachineStore::load(db.clone(), tree("snapshot")?).map_err(|(key, reason)| {
            StoreError::Corrupt {
                path: path.to_owned(),
                key,
                reason,
            }
        })?;
    Ok((log, state_machine))
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec(value)
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, serde_json::Error> {
    serde_json::from_slice(bytes)
}

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
mod marker;
mod state_machine;

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

pub use log::LogStore;
pub use marker::MARKER_FILE;
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
    /// The store holds less than its own integrity record says it has held (see
    /// [`MARKER_FILE`]): truncated, or replaced.
    #[error("{0}")]
    Damaged(String),
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
    let (log_tree, raft_tree, snapshot_tree) = (tree("log")?, tree("raft")?, tree("snapshot")?);
    let held = held(path, &log_tree, &raft_tree, &snapshot_tree)?;
    let marker = marker::Marker::check(path, held).map_err(StoreError::Damaged)?;
    let log = LogStore::new(db.clone(), log_tree, raft_tree, marker);
    let state_machine =
        StateMachineStore::load(db.clone(), snapshot_tree).map_err(|(key, reason)| {
            StoreError::Corrupt {
                path: path.to_owned(),
                key,
                reason,
            }
        })?;
    Ok((log, state_machine))
}

/// What the store holds, for the integrity check.
fn held(
    path: &Path,
    log: &sled::Tree,
    raft: &sled::Tree,
    snapshot: &sled::Tree,
) -> Result<marker::Held, StoreError> {
    let corrupt = |key: &str, reason: String| StoreError::Corrupt {
        path: path.to_owned(),
        key: key.to_owned(),
        reason,
    };
    let read = |tree: &sled::Tree, key: &[u8], name: &str| {
        tree.get(key).map_err(|e| corrupt(name, e.to_string()))
    };
    let vote_term = match read(raft, log::VOTE, "raft/vote")? {
        Some(bytes) => Some(
            decode::<openraft::Vote<crate::types::NodeId>>(&bytes)
                .map_err(|e| corrupt("raft/vote", e.to_string()))?
                .leader_id
                .term,
        ),
        None => None,
    };
    let purged_index = match read(raft, log::LAST_PURGED, "raft/last_purged")? {
        Some(bytes) => Some(
            decode::<openraft::LogId<crate::types::NodeId>>(&bytes)
                .map_err(|e| corrupt("raft/last_purged", e.to_string()))?
                .index,
        ),
        None => None,
    };
    let snapshot_index = match read(snapshot, state_machine::SNAPSHOT_META, "snapshot/meta")? {
        Some(bytes) => {
            decode::<openraft::SnapshotMeta<crate::types::NodeId, openraft::BasicNode>>(&bytes)
                .map_err(|e| corrupt("snapshot/meta", e.to_string()))?
                .last_log_id
                .map(|id| id.index)
        }
        None => None,
    };
    Ok(marker::Held {
        vote_term,
        purged_index,
        snapshot_index,
        log_entries: log.len(),
    })
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec(value)
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, serde_json::Error> {
    serde_json::from_slice(bytes)
}

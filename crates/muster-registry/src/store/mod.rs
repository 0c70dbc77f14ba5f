//! The registry's durable storage: openraft's log and state machine on one sled database
//! (or, in a deterministic simulation, on a [`MemoryDisk`] behind the same code: `disk`).
//!
//! One `sled::Db` per master, because a flush syncs the whole database. Trees:
//! - `log`: raft entries keyed by big-endian index; an entry over 7 KiB is stored in pieces
//!   under its index and a piece number, so no sled node holds large values;
//! - `raft`: the vote, the last purged log id and the committed log id;
//! - `snapshot`: the current snapshot, the only durable copy of the state machine (which lives
//!   in memory and is rebuilt on start from the snapshot plus the log).
//!
//! Every write that openraft is told is persisted has been flushed first: the vote, appended
//! entries, truncation, purge and snapshots.

mod disk;
mod log;
mod marker;
mod state_machine;

use std::path::{Path, PathBuf};

use crate::codec::{Encoding, decode, encode_as};

pub use disk::MemoryDisk;
pub use log::{LogStore, REPLICATION_BATCH_BYTES};
pub use marker::{Damage, MARKER_FILE};
pub use state_machine::{RegistryReader, StateMachineStore};

/// Where a registry store lives.
#[derive(Clone, Debug)]
pub enum StoreLocation {
    /// A sled database in this directory.
    Directory(PathBuf),
    /// An in-memory disk (deterministic simulations).
    Memory(MemoryDisk),
}

impl From<PathBuf> for StoreLocation {
    fn from(path: PathBuf) -> Self {
        StoreLocation::Directory(path)
    }
}

impl From<&Path> for StoreLocation {
    fn from(path: &Path) -> Self {
        StoreLocation::Directory(path.to_owned())
    }
}

impl StoreLocation {
    /// How errors name it: the directory, or "the in-memory store".
    pub fn name(&self) -> PathBuf {
        match self {
            StoreLocation::Directory(path) => path.clone(),
            StoreLocation::Memory(_) => PathBuf::from("the in-memory store"),
        }
    }
}

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
    Damaged(Damage),
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

/// Opens (or creates) the store at `location`: the log half and the state-machine half that
/// openraft drives, over one database.
///
/// # Errors
/// [`StoreError`] naming the location if sled cannot open it, the integrity record says it
/// lost data, or a stored value does not decode.
pub fn open(location: &StoreLocation) -> Result<(LogStore, StateMachineStore), StoreError> {
    open_with(location, Encoding::default())
}

/// As [`open`], writing entries, votes and snapshots in `encoding` (either is read).
///
/// # Errors
/// As [`open`].
pub fn open_with(
    location: &StoreLocation,
    encoding: Encoding,
) -> Result<(LogStore, StateMachineStore), StoreError> {
    let path = location.name();
    let open_error = |source| StoreError::Open {
        path: path.clone(),
        source,
    };
    let (db, marker_place) = match location {
        StoreLocation::Directory(dir) => {
            let db = sled::Config::new().path(dir).open().map_err(open_error)?;
            (disk::Db::Sled(db), marker::MarkerPlace::in_dir(dir))
        }
        StoreLocation::Memory(memory) => (
            disk::Db::Memory(memory.clone()),
            marker::MarkerPlace::Memory(memory.clone()),
        ),
    };
    let tree = |name: &str| db.open_tree(name).map_err(open_error);
    // Before the state machine lived in memory it was also written to a `state` tree: the
    // snapshot and the log hold everything it had.
    db.drop_tree("state").map_err(open_error)?;
    let (log_tree, raft_tree, snapshot_tree) = (tree("log")?, tree("raft")?, tree("snapshot")?);
    let held = held(&path, &log_tree, &raft_tree, &snapshot_tree)?;
    let marker = marker::Marker::check(&path.display().to_string(), marker_place, held)
        .map_err(StoreError::Damaged)?;
    let log = LogStore::new(db.clone(), log_tree, raft_tree, marker, encoding);
    let state_machine =
        StateMachineStore::load(db.clone(), snapshot_tree, encoding).map_err(|(key, reason)| {
            StoreError::Corrupt {
                path: path.clone(),
                key,
                reason,
            }
        })?;
    Ok((log, state_machine))
}

/// What the store holds, for the integrity check.
fn held(
    path: &Path,
    log: &disk::Tree,
    raft: &disk::Tree,
    snapshot: &disk::Tree,
) -> Result<marker::Held, StoreError> {
    let corrupt = |key: &str, reason: String| StoreError::Corrupt {
        path: path.to_owned(),
        key: key.to_owned(),
        reason,
    };
    let read = |tree: &disk::Tree, key: &[u8], name: &str| {
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
    let last_log_index = match log.last() {
        Ok(Some((key, _))) => key
            .get(..8)
            .and_then(|prefix| prefix.try_into().ok())
            .map(u64::from_be_bytes),
        Ok(None) => None,
        Err(e) => return Err(corrupt("log", e.to_string())),
    };
    Ok(marker::Held {
        vote_term,
        purged_index,
        snapshot_index,
        log_entries: log.len(),
        last_log_index,
    })
}

/// Runs `work`, a long stretch of CPU or disk (encoding, writing or decoding a snapshot of
/// tens of MB), without holding up the runtime's other tasks: on a multi-threaded runtime the
/// worker hands its other tasks to the rest first (`block_in_place`), so raft's heartbeats and
/// the master's messages go on meanwhile. On a current-thread runtime (a deterministic
/// simulation) it runs inline: there is no other worker to hand them to.
fn off_the_runtime<T>(work: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|handle| handle.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(work),
        _ => work(),
    }
}

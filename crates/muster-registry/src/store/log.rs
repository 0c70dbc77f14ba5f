//! openraft's log storage: entries, the vote, the purge point.

// openraft's error types are large by design and these functions return them as openraft asks.
#![allow(clippy::result_large_err)]

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{
    AnyError, Entry, LogId, LogState, OptionalSend, RaftLogId, RaftLogReader, StorageError,
    StorageIOError, Vote,
};

use super::disk::{Batch, Db, Tree};
use super::marker::Marker;
use super::{decode, encode};
use crate::types::{NodeId, TypeConfig};

pub(super) const VOTE: &[u8] = b"vote";
pub(super) const LAST_PURGED: &[u8] = b"last_purged";
const COMMITTED: &[u8] = b"committed";

/// The raft log half of the store. Clones share the same trees.
#[derive(Clone)]
pub struct LogStore {
    db: Db,
    log: Tree,
    raft: Tree,
    /// The store's integrity record, raised with each new vote and purge point.
    marker: Marker,
}

impl Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore")
            .field("entries", &self.log.len())
            .finish()
    }
}

type StoreResult<T> = Result<T, StorageError<NodeId>>;

impl LogStore {
    pub(super) fn new(db: Db, log: Tree, raft: Tree, marker: Marker) -> Self {
        LogStore {
            db,
            log,
            raft,
            marker,
        }
    }

    async fn flush(&self, error: fn(AnyError) -> StorageIOError<NodeId>) -> StoreResult<()> {
        match self.db.flush().await {
            Ok(()) => Ok(()),
            Err(e) => Err(error(AnyError::new(&e)).into()),
        }
    }

    fn read_meta<T: serde::de::DeserializeOwned>(&self, key: &[u8]) -> StoreResult<Option<T>> {
        let read = |e: AnyError| StorageIOError::read(e);
        match self.raft.get(key).map_err(|e| read(AnyError::new(&e)))? {
            None => Ok(None),
            Some(bytes) => Ok(Some(decode(&bytes).map_err(|e| read(AnyError::new(&e)))?)),
        }
    }

    fn write_meta<T: serde::Serialize>(
        &self,
        key: &[u8],
        value: &T,
        error: fn(AnyError) -> StorageIOError<NodeId>,
    ) -> StoreResult<()> {
        let bytes = encode(value).map_err(|e| error(AnyError::new(&e)))?;
        self.raft
            .insert(key, bytes)
            .map_err(|e| error(AnyError::new(&e)))?;
        Ok(())
    }

    fn last_entry_id(&self) -> StoreResult<Option<LogId<NodeId>>> {
        let Some((_, bytes)) = self.log.last().map_err(|e| StorageIOError::read_logs(&e))? else {
            return Ok(None);
        };
        let entry: Entry<TypeConfig> = decode(&bytes).map_err(|e| StorageIOError::read_logs(&e))?;
        Ok(Some(*entry.get_log_id()))
    }
}

fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StoreResult<Vec<Entry<TypeConfig>>> {
        let start = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => i.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let mut entries = Vec::new();
        let from = index_key(start);
        let end = match range.end_bound() {
            Bound::Included(&i) => Some(Bound::Included(index_key(i))),
            Bound::Excluded(&i) => Some(Bound::Excluded(index_key(i))),
            Bound::Unbounded => None,
        };
        let to = match &end {
            Some(Bound::Included(key)) => Bound::Included(key.as_slice()),
            Some(Bound::Excluded(key)) => Bound::Excluded(key.as_slice()),
            _ => Bound::Unbounded,
        };
        for item in self.log.range(Bound::Included(from.as_slice()), to) {
            let (key, bytes) = item.map_err(|e| StorageIOError::read_logs(&e))?;
            let index = u64::from_be_bytes(
                key.as_ref()
                    .try_into()
                    .map_err(|e| StorageIOError::read_logs(&e))?,
            );
            if !range.contains(&index) {
                break;
            }
            entries.push(decode(&bytes).map_err(|e| StorageIOError::read_logs(&e))?);
        }
        Ok(entries)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> StoreResult<LogState<TypeConfig>> {
        let last_purged_log_id: Option<LogId<NodeId>> = self.read_meta(LAST_PURGED)?;
        let last_log_id = self.last_entry_id()?.or(last_purged_log_id);
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> StoreResult<()> {
        self.write_meta(VOTE, vote, StorageIOError::write_vote)?;
        self.flush(|e: AnyError| StorageIOError::write_vote(e))
            .await?;
        self.marker
            .saw_vote(vote.leader_id.term)
            .map_err(|e| StorageIOError::write_vote(&e).into())
    }

    async fn read_vote(&mut self) -> StoreResult<Option<Vote<NodeId>>> {
        self.read_meta(VOTE)
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> StoreResult<()> {
        // Not flushed: openraft only uses it to apply sooner after a restart.
        self.write_meta(COMMITTED, &committed, StorageIOError::write)
    }

    async fn read_committed(&mut self) -> StoreResult<Option<LogId<NodeId>>> {
        Ok(self
            .read_meta::<Option<LogId<NodeId>>>(COMMITTED)?
            .flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StoreResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut batch = Batch::default();
        for entry in entries {
            let bytes = encode(&entry).map_err(|e| StorageIOError::write_logs(&e))?;
            batch.insert(&index_key(entry.get_log_id().index), bytes);
        }
        self.log
            .apply_batch(batch)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        let flushed = self.db.flush().await;
        let failed = flushed.as_ref().err().map(StorageIOError::write_logs);
        callback.log_io_completed(flushed.map_err(std::io::Error::other));
        match failed {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StoreResult<()> {
        let mut batch = Batch::default();
        let from = index_key(log_id.index);
        for pair in self
            .log
            .range(Bound::Included(from.as_slice()), Bound::Unbounded)
        {
            let (key, _) = pair.map_err(|e| StorageIOError::write_logs(&e))?;
            batch.remove(&key);
        }
        self.log
            .apply_batch(batch)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        self.flush(|e: AnyError| StorageIOError::write_logs(e))
            .await
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StoreResult<()> {
        // The purge point first: once it is on disk, get_log_state answers right whatever
        // part of the removal below a crash interrupts.
        self.write_meta(LAST_PURGED, &log_id, StorageIOError::write_logs)?;
        self.flush(|e: AnyError| StorageIOError::write_logs(e))
            .await?;
        self.marker
            .saw_purge(log_id.index)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        let mut batch = Batch::default();
        let to = index_key(log_id.index);
        for pair in self
            .log
            .range(Bound::Unbounded, Bound::Included(to.as_slice()))
        {
            let (key, _) = pair.map_err(|e| StorageIOError::write_logs(&e))?;
            batch.remove(&key);
        }
        self.log
            .apply_batch(batch)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        self.flush(|e: AnyError| StorageIOError::write_logs(e))
            .await
    }
}

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
use super::{Encoding, decode, encode_as};
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
    /// How entries and metadata are written.
    encoding: Encoding,
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
    pub(super) fn new(db: Db, log: Tree, raft: Tree, marker: Marker, encoding: Encoding) -> Self {
        LogStore {
            db,
            log,
            raft,
            marker,
            encoding,
        }
    }

    /// Makes this store, new and empty in place of a damaged one, remember what the damaged
    /// one may have promised: a vote of `vote_term` (saved as this member's own, so that it
    /// never grants another member a vote in a term it may have voted in already) and entries
    /// acknowledged up to `held_up_to`, which it withholds votes until it holds again.
    ///
    /// # Errors
    /// The store cannot be written.
    pub async fn rejoin(&mut self, id: NodeId, vote_term: u64, held_up_to: u64) -> StoreResult<()> {
        if vote_term > 0 {
            self.save_vote(&Vote::new(vote_term, id)).await?;
        }
        self.marker
            .rejoining_until(held_up_to)
            .map_err(|e| StorageIOError::write(&e).into())
    }

    /// The index this member's log must reach before it grants a vote or a pre-vote again,
    /// while it rejoins after starting over from a damaged store (see [`rejoin`](Self::rejoin))
    /// and its log, ending at `last_index`, has not reached it; `None` otherwise.
    pub fn votes_withheld(&self, last_index: Option<u64>) -> Option<u64> {
        match self.marker.votes_withheld(last_index) {
            Ok(until) => until,
            // The record could not be updated: keep withholding, which is always safe.
            Err(e) => {
                tracing::warn!(error = %e, "cannot update the store's record");
                Some(u64::MAX)
            }
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
        let bytes = encode_as(self.encoding, value).map_err(|e| error(AnyError::new(&e)))?;
        self.raft
            .insert(key, bytes)
            .map_err(|e| error(AnyError::new(&e)))?;
        Ok(())
    }

    fn last_entry_id(&self) -> StoreResult<Option<LogId<NodeId>>> {
        let Some((key, _)) = self.log.last().map_err(|e| StorageIOError::read_logs(&e))? else {
            return Ok(None);
        };
        let index = index_of(&key)?;
        let entry = self
            .read_entries(index..=index, usize::MAX)?
            .pop()
            .ok_or_else(|| {
                StorageIOError::read_logs(AnyError::error(format!(
                    "log entry {index} is missing its first piece"
                )))
            })?;
        Ok(Some(*entry.get_log_id()))
    }

    /// The entries in `range`, put together from their pieces, stopping after the entry that
    /// takes their encoded size to `budget` bytes (so the first entry is always read).
    fn read_entries<RB: RangeBounds<u64>>(
        &self,
        range: RB,
        budget: usize,
    ) -> StoreResult<Vec<Entry<TypeConfig>>> {
        let start = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => i.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&i) => key_after(i),
            Bound::Excluded(&i) => Some(index_key(i)),
            Bound::Unbounded => None,
        };
        let to = before(&end);
        let mut entries = Vec::new();
        let mut read_bytes = 0usize;
        let mut pieces: Option<Pieces> = None;
        let from = index_key(start);
        for item in self.log.range(Bound::Included(from.as_slice()), to) {
            let (key, bytes) = item.map_err(|e| StorageIOError::read_logs(&e))?;
            let index = index_of(&key)?;
            if !range.contains(&index) {
                break;
            }
            let whole = if key.len() == INDEX_KEY_LEN {
                if let Some(unfinished) = pieces.take() {
                    return Err(unfinished.cut_short());
                }
                match bytes.split_first() {
                    Some((&IN_PIECES, count)) => {
                        pieces = Some(Pieces::expect(index, count)?);
                        continue;
                    }
                    _ => bytes.to_vec(),
                }
            } else {
                let Some(collecting) = pieces.as_mut() else {
                    return Err(read_error(format!(
                        "log entry {index} has a piece but no first piece"
                    )));
                };
                match collecting.add(index, &key, &bytes)? {
                    Some(whole) => {
                        pieces = None;
                        whole
                    }
                    None => continue,
                }
            };
            entries.push(decode(&whole).map_err(|e| StorageIOError::read_logs(&e))?);
            read_bytes = read_bytes.saturating_add(whole.len());
            if read_bytes >= budget {
                return Ok(entries);
            }
        }
        if let Some(unfinished) = pieces {
            return Err(unfinished.cut_short());
        }
        Ok(entries)
    }
}

/// Bytes of an entry's key: its big-endian index.
const INDEX_KEY_LEN: usize = 8;

fn index_key(index: u64) -> [u8; INDEX_KEY_LEN] {
    index.to_be_bytes()
}

/// The first key past the entry at `index` and its pieces (which sort after its own key): the
/// next entry's key; `None` past the last index.
fn key_after(index: u64) -> Option<[u8; INDEX_KEY_LEN]> {
    index.checked_add(1).map(index_key)
}

/// The bound of a range that stops before `key` (`None`: at the end of the log).
fn before(key: &Option<[u8; INDEX_KEY_LEN]>) -> Bound<&[u8]> {
    match key {
        Some(key) => Bound::Excluded(key.as_slice()),
        None => Bound::Unbounded,
    }
}

/// The most bytes stored under one key. A longer entry is stored in pieces of this size, so
/// that no sled node holds large values: sled splits and rewrites whole nodes (up to 17
/// values), and a node of large entries would be rewritten, megabytes at a time, on some later
/// small write. 16 pieces stay under sled's blob threshold (a quarter of its 512 KiB segment).
const PIECE_LEN: usize = 7 * 1024;

/// The first byte of the value under an entry's key when the entry is stored in pieces,
/// followed by the number of pieces (big-endian u32). An entry stored whole starts with the
/// codec's format byte (or `{`, in JSON written before it), never 0.
const IN_PIECES: u8 = 0;

/// The key of piece `piece` of the entry at `index`: the entry's key, then the piece's
/// number, so an entry's pieces follow its key in order.
fn piece_key(index: u64, piece: u32) -> [u8; INDEX_KEY_LEN + 4] {
    let mut key = [0; INDEX_KEY_LEN + 4];
    key[..INDEX_KEY_LEN].copy_from_slice(&index_key(index));
    key[INDEX_KEY_LEN..].copy_from_slice(&piece.to_be_bytes());
    key
}

/// The index an entry's key or its piece's key belongs to.
fn index_of(key: &[u8]) -> StoreResult<u64> {
    key.get(..INDEX_KEY_LEN)
        .filter(|_| key.len() == INDEX_KEY_LEN || key.len() == INDEX_KEY_LEN + 4)
        .and_then(|prefix| prefix.try_into().ok())
        .map(u64::from_be_bytes)
        .ok_or_else(|| read_error(format!("a log key of {} bytes", key.len())))
}

fn read_error(message: String) -> StorageError<NodeId> {
    StorageIOError::read_logs(AnyError::error(message)).into()
}

/// An entry stored in pieces, being put together.
struct Pieces {
    index: u64,
    count: u32,
    bytes: Vec<u8>,
    next: u32,
}

impl Pieces {
    /// The entry at `index`, whose first piece says `count`.
    fn expect(index: u64, count: &[u8]) -> StoreResult<Pieces> {
        let count = <[u8; 4]>::try_from(count)
            .map(u32::from_be_bytes)
            .map_err(|_| read_error(format!("log entry {index} has a malformed first piece")))?;
        Ok(Pieces {
            index,
            count,
            // The count is read from disk: room for a few pieces at most is reserved up
            // front, so a corrupt count cannot ask for terabytes.
            bytes: Vec::with_capacity(count.min(16) as usize * PIECE_LEN),
            next: 0,
        })
    }

    /// Adds the piece under `key`; the entry's bytes once it is the last one.
    fn add(&mut self, index: u64, key: &[u8], bytes: &[u8]) -> StoreResult<Option<Vec<u8>>> {
        let expected = piece_key(self.index, self.next);
        if index != self.index || key != expected.as_slice() {
            return Err(self.cut_short());
        }
        self.bytes.extend_from_slice(bytes);
        self.next += 1;
        Ok((self.next == self.count).then(|| std::mem::take(&mut self.bytes)))
    }

    /// The error for an entry whose pieces stop before its count.
    fn cut_short(&self) -> StorageError<NodeId> {
        read_error(format!(
            "log entry {} has {} of its {} pieces",
            self.index, self.next, self.count
        ))
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StoreResult<Vec<Entry<TypeConfig>>> {
        self.read_entries(range, usize::MAX)
    }

    /// The entries from `start` up to `end` (exclusive), as many as fit in
    /// [`REPLICATION_BATCH_BYTES`] (at least one): what the leader sends a follower in one
    /// AppendEntries. openraft gives each AppendEntries one heartbeat interval to be sent,
    /// stored and answered; a batch bounded by bytes keeps a follower far behind catching up
    /// in steps that each fit, instead of retrying one batch of everything that never does.
    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> StoreResult<Vec<Entry<TypeConfig>>> {
        self.read_entries(start..end, REPLICATION_BATCH_BYTES)
    }
}

/// The most encoded bytes of entries the leader sends a follower in one AppendEntries (an
/// entry larger than this goes alone). Small enough to be sent, synced and answered within
/// one heartbeat interval on a loaded machine.
pub const REPLICATION_BATCH_BYTES: usize = 1024 * 1024;

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
        self.write_meta(COMMITTED, &committed, StorageIOError::write)?;
        if let Some(committed) = committed {
            self.marker
                .saw_committed(committed.index)
                .map_err(|e| StorageIOError::write(&e))?;
        }
        Ok(())
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
        let mut last = None;
        for entry in entries {
            let bytes =
                encode_as(self.encoding, &entry).map_err(|e| StorageIOError::write_logs(&e))?;
            let index = entry.get_log_id().index;
            last = Some(index);
            if bytes.len() <= PIECE_LEN {
                batch.insert(&index_key(index), bytes);
                continue;
            }
            let count = u32::try_from(bytes.len().div_ceil(PIECE_LEN)).map_err(|_| {
                StorageIOError::write_logs(AnyError::error(format!(
                    "log entry {index} is {} bytes",
                    bytes.len()
                )))
            })?;
            let mut first = vec![IN_PIECES];
            first.extend_from_slice(&count.to_be_bytes());
            batch.insert(&index_key(index), first);
            for (piece, bytes) in (0..count).zip(bytes.chunks(PIECE_LEN)) {
                batch.insert(&piece_key(index, piece), bytes);
            }
        }
        self.log
            .apply_batch(batch)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        let flushed = self.db.flush().await;
        if let (Ok(()), Some(last)) = (&flushed, last) {
            self.marker.saw_appended(last);
        }
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
        let to = key_after(log_id.index);
        for pair in self.log.range(Bound::Unbounded, before(&to)) {
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

#[cfg(test)]
mod tests {
    use openraft::storage::RaftLogStorageExt;
    use openraft::{CommittedLeaderId, EntryPayload};

    use super::*;
    use crate::types::{Batch as Ops, Op};
    use crate::{MemoryDisk, StoreLocation};

    /// An entry of about 70 KiB: 11 pieces of 7 KiB.
    fn long_entry(index: u64) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(Ops {
                ops: vec![Op::StopJob("x".repeat(70 * 1024))],
            }),
        }
    }

    #[tokio::test]
    async fn replication_reads_entries_in_batches_bounded_by_bytes_and_never_none() {
        let location = StoreLocation::Memory(MemoryDisk::default());
        let (mut log, _) = crate::store::open(&location).expect("opens");
        // 20 entries of about 70 KiB: 15 of them pass 1 MiB.
        log.blocking_append((1..=20).map(long_entry))
            .await
            .expect("appended");
        let batch = log.limited_get_log_entries(1, 21).await.expect("read");
        let indexes: Vec<u64> = batch.iter().map(|e| e.log_id.index).collect();
        assert_eq!(indexes, (1..=15).collect::<Vec<_>>());
        let rest = log.limited_get_log_entries(16, 21).await.expect("read");
        assert_eq!(rest.len(), 5);
        // One entry over the budget is still read, alone.
        let huge = Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), 21),
            payload: EntryPayload::Normal(Ops {
                ops: vec![Op::StopJob("y".repeat(REPLICATION_BATCH_BYTES + 1))],
            }),
        };
        log.blocking_append([huge, long_entry(22)])
            .await
            .expect("appended");
        let alone = log.limited_get_log_entries(21, 23).await.expect("read");
        assert_eq!(alone.len(), 1);
        assert_eq!(
            log.try_get_log_entries(1..23).await.expect("read").len(),
            22
        );
    }

    #[tokio::test]
    async fn an_entry_missing_a_piece_is_refused_with_an_error_that_names_it() {
        let location = StoreLocation::Memory(MemoryDisk::default());
        let (mut log, _) = crate::store::open(&location).expect("opens");
        log.blocking_append([long_entry(1), long_entry(2)])
            .await
            .expect("appended");
        assert_eq!(log.try_get_log_entries(..).await.expect("read").len(), 2);

        let mut batch = Batch::default();
        batch.remove(&piece_key(2, 4));
        log.log.apply_batch(batch).expect("removed");
        let error = log
            .try_get_log_entries(..)
            .await
            .expect_err("a piece is gone")
            .to_string();
        assert!(
            error.contains("log entry 2 has 4 of its 11 pieces"),
            "{error}"
        );
        // The entry before it still reads.
        assert_eq!(
            log.try_get_log_entries(1..2).await.expect("read").len(),
            1,
            "entry 1 is whole"
        );

        // A first piece claiming four billion pieces is an error too, not an allocation.
        let mut batch = Batch::default();
        batch.insert(&index_key(1), vec![IN_PIECES, 0xff, 0xff, 0xff, 0xff]);
        log.log.apply_batch(batch).expect("written");
        let error = log
            .try_get_log_entries(1..2)
            .await
            .expect_err("entry 1's count is corrupt")
            .to_string();
        assert!(
            error.contains("log entry 1 has 11 of its 4294967295 pieces"),
            "{error}"
        );
    }
}

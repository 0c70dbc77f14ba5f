//! openraft's state machine: the registry's contents in memory, snapshots on the disk.
//!
//! The contents live in memory ([`RegistryState`]), where `apply` changes them and readers see
//! them. What makes them durable is the raft log (every entry is flushed before it counts)
//! plus the snapshot, which openraft builds every few thousand entries and which is flushed
//! before the log behind it is purged. On start the store loads the snapshot; openraft then
//! re-applies the log from there up to the committed id it saved (openraft's recommended
//! design: no state machine write per entry).

// openraft's error types are large by design and these functions return them as openraft asks.
#![allow(clippy::result_large_err)]

use std::fmt;
use std::io::Cursor;
use std::sync::{Arc, RwLock, RwLockReadGuard};

use openraft::storage::RaftStateMachine;
use openraft::{
    AnyError, Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, Snapshot,
    SnapshotMeta, StorageError, StorageIOError, StoredMembership,
};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::disk::{Batch, Db, Tree};
use super::{Encoding, decode, encode_as};
use crate::state::RegistryState;
use crate::types::{BatchOutcome, NodeId, TypeConfig};

type StoreResult<T> = Result<T, StorageError<NodeId>>;
type Membership = StoredMembership<NodeId, openraft::BasicNode>;

pub(super) const SNAPSHOT_META: &[u8] = b"meta";
const SNAPSHOT_DATA: &[u8] = b"data";

/// The applied registry: contents, last applied log id, membership.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Applied {
    last_applied: Option<LogId<NodeId>>,
    membership: Membership,
    state: RegistryState,
}

struct Shared {
    applied: RwLock<Applied>,
    /// The last applied log index, for readers waiting on a write.
    applied_index: watch::Sender<u64>,
    snapshots_built: std::sync::atomic::AtomicU64,
    /// The last log id the stored snapshot covers. A build runs beside `apply` and
    /// `install_snapshot`, so an older snapshot may finish after a newer one was stored (an
    /// install from the leader, which purged the log behind it): it must not replace it, or
    /// the next start would have no log to re-apply from.
    stored_snapshot: std::sync::Mutex<Option<LogId<NodeId>>>,
}

/// The state-machine half of the store. Clones share the same state.
#[derive(Clone)]
pub struct StateMachineStore {
    db: Db,
    snapshot: Tree,
    /// How snapshots are written.
    encoding: Encoding,
    shared: Arc<Shared>,
}

impl fmt::Debug for StateMachineStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StateMachineStore")
            .field("last_applied", &self.read().last_applied)
            .finish()
    }
}

/// Read access to the applied registry, for the master.
#[derive(Clone)]
pub struct RegistryReader {
    shared: Arc<Shared>,
}

impl fmt::Debug for RegistryReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryReader").finish_non_exhaustive()
    }
}

impl RegistryReader {
    /// Runs `f` on the applied registry contents.
    pub fn read<T>(&self, f: impl FnOnce(&RegistryState) -> T) -> T {
        f(&self
            .shared
            .applied
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .state)
    }

    /// The index of the last applied raft entry (0 before any).
    pub fn applied_index(&self) -> u64 {
        *self.shared.applied_index.borrow()
    }

    /// Waits until the entry at `index` is applied.
    pub async fn wait_applied(&self, index: u64) {
        let mut applied = self.shared.applied_index.subscribe();
        // The sender lives in `self.shared`, so the channel cannot close while we wait.
        let _ = applied.wait_for(|&at| at >= index).await;
    }
}

impl StateMachineStore {
    /// Loads the current snapshot, if there is one: the state the log is re-applied onto.
    /// Errors name the key that did not decode.
    pub(super) fn load(
        db: Db,
        snapshot: Tree,
        encoding: Encoding,
    ) -> Result<Self, (String, String)> {
        let read = |key: &[u8]| {
            snapshot
                .get(key)
                .map_err(|e| (String::from_utf8_lossy(key).into_owned(), e.to_string()))
        };
        let mut applied = Applied::default();
        let mut stored_snapshot = None;
        if let (Some(meta), Some(data)) = (read(SNAPSHOT_META)?, read(SNAPSHOT_DATA)?) {
            let bad = |key: &[u8]| {
                let key = String::from_utf8_lossy(key).into_owned();
                move |e: crate::codec::CodecError| (format!("snapshot/{key}"), e.to_string())
            };
            let meta: SnapshotMeta<NodeId, openraft::BasicNode> =
                decode(&meta).map_err(bad(SNAPSHOT_META))?;
            stored_snapshot = meta.last_log_id;
            applied = Applied {
                last_applied: meta.last_log_id,
                membership: meta.last_membership,
                state: decode(&data).map_err(bad(SNAPSHOT_DATA))?,
            };
        }
        let index = applied.last_applied.map_or(0, |id| id.index);
        Ok(StateMachineStore {
            db,
            snapshot,
            encoding,
            shared: Arc::new(Shared {
                applied: RwLock::new(applied),
                applied_index: watch::Sender::new(index),
                snapshots_built: Default::default(),
                stored_snapshot: std::sync::Mutex::new(stored_snapshot),
            }),
        })
    }

    /// A read handle on the applied registry.
    pub fn reader(&self) -> RegistryReader {
        RegistryReader {
            shared: Arc::clone(&self.shared),
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, Applied> {
        self.shared
            .applied
            .read()
            .unwrap_or_else(|p| p.into_inner())
    }

    async fn flush(&self, error: fn(AnyError) -> StorageIOError<NodeId>) -> StoreResult<()> {
        match self.db.flush().await {
            Ok(()) => Ok(()),
            Err(e) => Err(error(AnyError::new(&e)).into()),
        }
    }

    fn save_snapshot(
        &self,
        meta: &SnapshotMeta<NodeId, openraft::BasicNode>,
        data: &[u8],
    ) -> StoreResult<()> {
        let error = |e: &dyn std::error::Error| {
            StorageIOError::write_snapshot(Some(meta.signature()), AnyError::error(e.to_string()))
        };
        let mut stored = self
            .shared
            .stored_snapshot
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if *stored > meta.last_log_id {
            // A newer snapshot is stored already; this one is only for openraft's use.
            return Ok(());
        }
        let mut batch = Batch::default();
        batch.insert(
            SNAPSHOT_META,
            encode_as(self.encoding, meta).map_err(|e| error(&e))?,
        );
        batch.insert(SNAPSHOT_DATA, data);
        self.snapshot.apply_batch(batch).map_err(|e| error(&e))?;
        *stored = meta.last_log_id;
        Ok(())
    }

    fn publish(&self, index: u64) {
        self.shared.applied_index.send_replace(index);
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> StoreResult<(Option<LogId<NodeId>>, Membership)> {
        let applied = self.read();
        Ok((applied.last_applied, applied.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> StoreResult<Vec<BatchOutcome>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut outcomes = Vec::new();
        let index = {
            let mut applied = self
                .shared
                .applied
                .write()
                .unwrap_or_else(|p| p.into_inner());
            for entry in entries {
                applied.last_applied = Some(entry.log_id);
                let outcome = match entry.payload {
                    EntryPayload::Blank => BatchOutcome::default(),
                    EntryPayload::Normal(batch) => BatchOutcome {
                        results: batch
                            .ops
                            .into_iter()
                            .map(|op| applied.state.apply(op, entry.log_id.index))
                            .collect(),
                    },
                    EntryPayload::Membership(membership) => {
                        applied.membership = StoredMembership::new(Some(entry.log_id), membership);
                        BatchOutcome::default()
                    }
                };
                outcomes.push(outcome);
            }
            applied.last_applied.map_or(0, |id| id.index)
        };
        self.publish(index);
        Ok(outcomes)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        // Copy now: building runs beside apply, and sled has no point-in-time view.
        SnapshotBuilder {
            store: self.clone(),
            applied: super::off_the_runtime(|| self.read().clone()),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> StoreResult<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, openraft::BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> StoreResult<()> {
        let data = snapshot.into_inner();
        let state: RegistryState = super::off_the_runtime(|| decode(&data)).map_err(|e| {
            StorageIOError::read_snapshot(Some(meta.signature()), AnyError::new(&e))
        })?;
        let applied = Applied {
            last_applied: meta.last_log_id,
            membership: meta.last_membership.clone(),
            state,
        };
        super::off_the_runtime(|| self.save_snapshot(meta, &data))?;
        self.flush(|e: AnyError| StorageIOError::write_state_machine(e))
            .await?;
        let index = applied.last_applied.map_or(0, |id| id.index);
        *self
            .shared
            .applied
            .write()
            .unwrap_or_else(|p| p.into_inner()) = applied;
        self.publish(index);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StoreResult<Option<Snapshot<TypeConfig>>> {
        let read = |e: &dyn std::error::Error| {
            StorageIOError::read_snapshot(None, AnyError::error(e.to_string()))
        };
        let meta = self.snapshot.get(SNAPSHOT_META).map_err(|e| read(&e))?;
        let data = self.snapshot.get(SNAPSHOT_DATA).map_err(|e| read(&e))?;
        let (Some(meta), Some(data)) = (meta, data) else {
            return Ok(None);
        };
        Ok(Some(Snapshot {
            meta: decode(&meta).map_err(|e| read(&e))?,
            snapshot: Box::new(Cursor::new(data.to_vec())),
        }))
    }
}

/// Builds a snapshot from the copy taken when openraft asked for the builder.
pub struct SnapshotBuilder {
    store: StateMachineStore,
    applied: Applied,
}

impl fmt::Debug for SnapshotBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SnapshotBuilder")
            .field("last_applied", &self.applied.last_applied)
            .finish()
    }
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> StoreResult<Snapshot<TypeConfig>> {
        let encoding = self.store.encoding;
        let data = super::off_the_runtime(|| encode_as(encoding, &self.applied.state))
            .map_err(|e| StorageIOError::read_state_machine(&e))?;
        let built = self
            .store
            .shared
            .snapshots_built
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let snapshot_id = match self.applied.last_applied {
            Some(id) => format!("{}-{}-{built}", id.leader_id, id.index),
            None => format!("none-{built}"),
        };
        let meta = SnapshotMeta {
            last_log_id: self.applied.last_applied,
            last_membership: self.applied.membership.clone(),
            snapshot_id,
        };
        super::off_the_runtime(|| self.store.save_snapshot(&meta, &data))?;
        // The applied state (at least up to this snapshot) and the snapshot reach disk before
        // openraft may purge the log behind it.
        self.store
            .flush(|e: AnyError| StorageIOError::write_state_machine(e))
            .await?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

/// API calls are authenticated against the applied tokens and policies: a token deleted is
/// refused, and a changed policy applies, on a master as soon as the change applies there.
impl muster_security::TokenSource for RegistryReader {
    fn authenticate(
        &self,
        secret: &muster_security::TokenSecret,
    ) -> Option<muster_security::Caller> {
        self.read(|state| state.caller_of(secret))
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, LogId, SnapshotMeta, StoredMembership};

    use crate::types::NodeId;

    fn meta(index: u64) -> SnapshotMeta<NodeId, openraft::BasicNode> {
        SnapshotMeta {
            last_log_id: Some(LogId::new(CommittedLeaderId::new(1, 1), index)),
            last_membership: StoredMembership::default(),
            snapshot_id: format!("snapshot-{index}"),
        }
    }

    #[test]
    fn an_older_snapshot_finishing_late_does_not_replace_a_newer_one() {
        let dir = tempfile::tempdir().expect("temp dir");
        {
            let (_log, sm) = super::super::open(&dir.path().into()).expect("opens");
            // The leader's snapshot at 500 is installed while a local build from 100 runs.
            let empty = crate::codec::encode(&crate::RegistryState::default()).expect("encodes");
            sm.save_snapshot(&meta(500), &empty).expect("stored");
            sm.save_snapshot(&meta(100), &empty)
                .expect("skipped, not an error");
        }
        // sled's flusher thread may hold the directory's lock a moment after the drop.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let (_log, sm) = loop {
            match super::super::open(&dir.path().into()) {
                Ok(opened) => break opened,
                Err(e)
                    if std::time::Instant::now() < deadline
                        && format!("{e:?}").contains("acquire lock") =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) => panic!("opens again: {e:?}"),
            }
        };
        let at = sm.read().last_applied.map(|id| id.index);
        assert_eq!(
            at,
            Some(500),
            "the start re-applies the log after the newer snapshot"
        );
    }
}

//! openraft's state machine on sled: the registry's contents, applied entries and snapshots.
//!
//! The contents live in memory ([`RegistryState`]) for readers and in the `state` tree for
//! restarts. An `apply` changes the memory copy, then writes what it touched and the new
//! last-applied id in one atomic sled batch and flushes before it returns.

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

use super::{decode, encode};
use crate::jobs::EvalId;
use crate::state::{RegistryState, Touched};
use crate::types::{AgentId, BatchOutcome, NodeId, TypeConfig};

type StoreResult<T> = Result<T, StorageError<NodeId>>;
type Membership = StoredMembership<NodeId, openraft::BasicNode>;

const LAST_APPLIED: &str = "meta/last_applied";
const MEMBERSHIP: &str = "meta/membership";
const LAST_AGENT_NUMBER: &str = "meta/last_agent_number";
const AGENT: &str = "agent/";
const UNREACHABLE: &str = "unreachable/";
const JOB: &str = "job/";
const EVAL: &str = "eval/";
const SNAPSHOT_META: &[u8] = b"meta";
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
}

/// The state-machine half of the store. Clones share the same state.
#[derive(Clone)]
pub struct StateMachineStore {
    db: sled::Db,
    state: sled::Tree,
    snapshot: sled::Tree,
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

fn key(prefix: &str, id: &impl std::fmt::Display) -> Vec<u8> {
    format!("{prefix}{id}").into_bytes()
}

/// Puts `value` under `key`, or removes the key when there is none.
fn put_or_remove<T: Serialize>(
    batch: &mut sled::Batch,
    key: Vec<u8>,
    value: Option<&T>,
) -> Result<(), serde_json::Error> {
    match value {
        Some(value) => batch.insert(key, encode(value)?),
        None => batch.remove(key),
    }
    Ok(())
}

impl StateMachineStore {
    /// Loads the applied state from the `state` tree. Errors name the key that did not decode.
    pub(super) fn load(
        db: sled::Db,
        state: sled::Tree,
        snapshot: sled::Tree,
    ) -> Result<Self, (String, String)> {
        let mut applied = Applied::default();
        for item in state.iter() {
            let (k, v) = item.map_err(|e| (String::new(), e.to_string()))?;
            let name = String::from_utf8_lossy(&k).into_owned();
            let bad = |e: serde_json::Error| (name.clone(), e.to_string());
            if name == LAST_APPLIED {
                applied.last_applied = decode(&v).map_err(bad)?;
            } else if name == MEMBERSHIP {
                applied.membership = decode(&v).map_err(bad)?;
            } else if name == LAST_AGENT_NUMBER {
                applied.state.last_agent_number = decode(&v).map_err(bad)?;
            } else if let Some(id) = name.strip_prefix(AGENT) {
                let info = decode(&v).map_err(bad)?;
                applied.state.agents.insert(AgentId(id.to_owned()), info);
            } else if let Some(id) = name.strip_prefix(UNREACHABLE) {
                let agent = decode(&v).map_err(bad)?;
                applied
                    .state
                    .unreachable
                    .insert(AgentId(id.to_owned()), agent);
            } else if let Some(job) = name.strip_prefix(JOB) {
                let value = decode(&v).map_err(bad)?;
                applied.state.jobs.insert(job.to_owned(), value);
            } else if let Some(id) = name.strip_prefix(EVAL) {
                let value = decode(&v).map_err(bad)?;
                applied.state.evals.insert(EvalId(id.to_owned()), value);
            }
        }
        let index = applied.last_applied.map_or(0, |id| id.index);
        Ok(StateMachineStore {
            db,
            state,
            snapshot,
            shared: Arc::new(Shared {
                applied: RwLock::new(applied),
                applied_index: watch::Sender::new(index),
                snapshots_built: Default::default(),
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

    /// Encodes the whole of `applied` as one sled batch that first removes every key.
    fn full_batch(&self, applied: &Applied) -> Result<sled::Batch, StorageIOError<NodeId>> {
        let write = |e: &dyn std::error::Error| {
            StorageIOError::write_state_machine(AnyError::error(e.to_string()))
        };
        let mut batch = sled::Batch::default();
        for k in self.state.iter().keys() {
            batch.remove(k.map_err(|e| write(&e))?);
        }
        put_meta(&mut batch, applied).map_err(|e| write(&e))?;
        for (id, info) in &applied.state.agents {
            batch.insert(key(AGENT, id), encode(info).map_err(|e| write(&e))?);
        }
        for (id, agent) in &applied.state.unreachable {
            batch.insert(key(UNREACHABLE, id), encode(agent).map_err(|e| write(&e))?);
        }
        for (name, job) in &applied.state.jobs {
            batch.insert(key(JOB, name), encode(job).map_err(|e| write(&e))?);
        }
        for (id, eval) in &applied.state.evals {
            batch.insert(key(EVAL, id), encode(eval).map_err(|e| write(&e))?);
        }
        Ok(batch)
    }

    async fn flush(&self, error: fn(AnyError) -> StorageIOError<NodeId>) -> StoreResult<()> {
        match self.db.flush_async().await {
            Ok(_) => Ok(()),
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
        let mut batch = sled::Batch::default();
        batch.insert(SNAPSHOT_META, encode(meta).map_err(|e| error(&e))?);
        batch.insert(SNAPSHOT_DATA, data);
        self.snapshot.apply_batch(batch).map_err(|e| error(&e))?;
        Ok(())
    }

    fn publish(&self, index: u64) {
        self.shared.applied_index.send_replace(index);
    }
}

fn put_meta(batch: &mut sled::Batch, applied: &Applied) -> Result<(), serde_json::Error> {
    batch.insert(LAST_APPLIED, encode(&applied.last_applied)?);
    batch.insert(MEMBERSHIP, encode(&applied.membership)?);
    batch.insert(LAST_AGENT_NUMBER, encode(&applied.state.last_agent_number)?);
    Ok(())
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
        let write = |e: &dyn std::error::Error| {
            StorageIOError::write_state_machine(AnyError::error(e.to_string()))
        };
        let mut outcomes = Vec::new();
        let (batch, index) = {
            let mut applied = self
                .shared
                .applied
                .write()
                .unwrap_or_else(|p| p.into_inner());
            let mut touched = Touched::default();
            for entry in entries {
                applied.last_applied = Some(entry.log_id);
                let outcome = match entry.payload {
                    EntryPayload::Blank => BatchOutcome::default(),
                    EntryPayload::Normal(batch) => BatchOutcome {
                        results: batch
                            .ops
                            .into_iter()
                            .map(|op| applied.state.apply(op, entry.log_id.index, &mut touched))
                            .collect(),
                    },
                    EntryPayload::Membership(membership) => {
                        applied.membership = StoredMembership::new(Some(entry.log_id), membership);
                        BatchOutcome::default()
                    }
                };
                outcomes.push(outcome);
            }
            let mut batch = sled::Batch::default();
            put_meta(&mut batch, &applied).map_err(|e| write(&e))?;
            let state = &applied.state;
            let mut put = || -> Result<(), serde_json::Error> {
                for id in &touched.agents {
                    put_or_remove(&mut batch, key(AGENT, id), state.agents.get(id))?;
                    put_or_remove(&mut batch, key(UNREACHABLE, id), state.unreachable.get(id))?;
                }
                for name in &touched.jobs {
                    put_or_remove(&mut batch, key(JOB, name), state.jobs.get(name))?;
                }
                for id in &touched.evals {
                    put_or_remove(&mut batch, key(EVAL, id), state.evals.get(id))?;
                }
                Ok(())
            };
            put().map_err(|e| write(&e))?;
            (batch, applied.last_applied.map_or(0, |id| id.index))
        };
        self.state.apply_batch(batch).map_err(|e| write(&e))?;
        self.flush(|e: AnyError| StorageIOError::write_state_machine(e))
            .await?;
        self.publish(index);
        Ok(outcomes)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        // Copy now: building runs beside apply, and sled has no point-in-time view.
        SnapshotBuilder {
            store: self.clone(),
            applied: self.read().clone(),
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
        let state: RegistryState = decode(&data).map_err(|e| {
            StorageIOError::read_snapshot(Some(meta.signature()), AnyError::new(&e))
        })?;
        let applied = Applied {
            last_applied: meta.last_log_id,
            membership: meta.last_membership.clone(),
            state,
        };
        let batch = self.full_batch(&applied)?;
        self.state
            .apply_batch(batch)
            .map_err(|e| StorageIOError::write_state_machine(&e))?;
        self.save_snapshot(meta, &data)?;
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
        let data =
            encode(&self.applied.state).map_err(|e| StorageIOError::read_state_machine(&e))?;
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
        self.store.save_snapshot(&meta, &data)?;
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

//! openraft's storage conformance suite against the store, on sled and on the in-memory disk
//! the deterministic simulation uses; and the in-memory disk's crash model.

use muster_registry::store::{self, LogStore, StateMachineStore};
use muster_registry::types::{NodeId, TypeConfig};
use muster_registry::{MemoryDisk, StoreLocation};
use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{CommittedLeaderId, LogId, StorageError, Vote};

struct SledBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, tempfile::TempDir> for SledBuilder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachineStore), StorageError<NodeId>> {
        let dir = tempfile::tempdir().map_err(|e| openraft::StorageIOError::write(&e))?;
        let (log, state_machine) =
            store::open(&dir.path().into()).map_err(|e| openraft::StorageIOError::write(&e))?;
        Ok((dir, log, state_machine))
    }
}

struct MemoryBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, MemoryDisk> for MemoryBuilder {
    async fn build(
        &self,
    ) -> Result<(MemoryDisk, LogStore, StateMachineStore), StorageError<NodeId>> {
        let disk = MemoryDisk::default();
        let (log, state_machine) = store::open(&StoreLocation::Memory(disk.clone()))
            .map_err(|e| openraft::StorageIOError::write(&e))?;
        Ok((disk, log, state_machine))
    }
}

#[test]
fn the_sled_store_passes_openrafts_storage_suite() -> anyhow::Result<()> {
    Suite::test_all(SledBuilder)?;
    Ok(())
}

#[test]
fn the_in_memory_store_passes_openrafts_storage_suite() -> anyhow::Result<()> {
    Suite::test_all(MemoryBuilder)?;
    Ok(())
}

fn log_id(term: u64, index: u64) -> LogId<NodeId> {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

#[tokio::test]
async fn a_crash_keeps_what_was_flushed_and_loses_the_rest() -> anyhow::Result<()> {
    let disk = MemoryDisk::default();
    let location = StoreLocation::Memory(disk.clone());
    {
        let (mut log, _) = store::open(&location)?;
        // The vote is flushed before save_vote returns; the committed id is not.
        log.save_vote(&Vote::new(3, 1)).await?;
        log.save_committed(Some(log_id(3, 7))).await?;
        assert_eq!(log.read_committed().await?, Some(log_id(3, 7)));
    }
    disk.crash();
    let (mut log, mut state_machine) = store::open(&location)?;
    assert_eq!(
        log.read_vote().await?,
        Some(Vote::new(3, 1)),
        "flushed: kept"
    );
    assert_eq!(log.read_committed().await?, None, "never flushed: lost");
    let (applied, _) = state_machine.applied_state().await?;
    assert_eq!(applied, None);
    Ok(())
}

#[tokio::test]
async fn an_in_memory_store_that_lost_its_contents_refuses_to_open() -> anyhow::Result<()> {
    let disk = MemoryDisk::default();
    let location = StoreLocation::Memory(disk.clone());
    {
        let (mut log, _) = store::open(&location)?;
        log.save_vote(&Vote::new(5, 2)).await?;
    }
    disk.lose_contents();
    let Err(refused) = store::open(&location) else {
        anyhow::bail!("a store that lost its vote opened as if new");
    };
    let message = refused.to_string();
    anyhow::ensure!(
        message.contains("the in-memory store") && message.contains("damaged"),
        "{message}"
    );
    Ok(())
}

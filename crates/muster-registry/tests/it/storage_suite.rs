//! openraft's storage conformance suite against the store, on sled and on the in-memory disk
//! the deterministic simulation uses; and the in-memory disk's crash model.

use muster_model::{EvalId, EvalStatus};
use muster_registry::store::{self, LogStore, StateMachineStore};
use muster_registry::types::{Batch, NodeId, Op, TypeConfig};
use muster_registry::{MemoryDisk, StoreLocation};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, RaftLogReader, StorageError, Vote};

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

fn blank(index: u64) -> Entry<TypeConfig> {
    Entry {
        log_id: log_id(1, index),
        payload: EntryPayload::Blank,
    }
}

async fn indexes(log: &mut LogStore) -> anyhow::Result<Vec<u64>> {
    let entries = log.try_get_log_entries(..).await?;
    Ok(entries.iter().map(|entry| entry.log_id.index).collect())
}

#[tokio::test]
async fn appended_truncated_and_purged_logs_survive_a_crash() -> anyhow::Result<()> {
    let disk = MemoryDisk::default();
    let location = StoreLocation::Memory(disk.clone());
    {
        let (mut log, mut state_machine) = store::open(&location)?;
        log.blocking_append((1..=6).map(blank)).await?;
        log.truncate(log_id(1, 5)).await?;
        // openraft purges only behind a snapshot (the integrity check insists).
        state_machine.apply((1..=4).map(blank)).await?;
        let mut builder = state_machine.get_snapshot_builder().await;
        openraft::RaftSnapshotBuilder::build_snapshot(&mut builder).await?;
        log.purge(log_id(1, 2)).await?;
    }
    disk.crash();
    let (mut log, _) = store::open(&location)?;
    assert_eq!(
        indexes(&mut log).await?,
        [3, 4],
        "appended, truncated, purged: kept"
    );
    let state = log.get_log_state().await?;
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 2)));
    assert_eq!(state.last_log_id, Some(log_id(1, 4)));

    // Once more after the reopen: the store keeps flushing on the same disk.
    log.blocking_append((5..=7).map(blank)).await?;
    drop(log);
    disk.crash();
    let (mut log, _) = store::open(&location)?;
    assert_eq!(indexes(&mut log).await?, [3, 4, 5, 6, 7]);
    Ok(())
}

#[tokio::test]
async fn a_snapshot_survives_a_crash_and_the_state_machine_starts_from_it() -> anyhow::Result<()> {
    let disk = MemoryDisk::default();
    let location = StoreLocation::Memory(disk.clone());
    {
        let (mut log, mut state_machine) = store::open(&location)?;
        log.blocking_append((1..=3).map(blank)).await?;
        state_machine.apply((1..=3).map(blank)).await?;
        let mut builder = state_machine.get_snapshot_builder().await;
        openraft::RaftSnapshotBuilder::build_snapshot(&mut builder).await?;
        state_machine.apply([blank(4)]).await?;
    }
    disk.crash();
    let (_, mut state_machine) = store::open(&location)?;
    let (applied, _) = state_machine.applied_state().await?;
    assert_eq!(
        applied,
        Some(log_id(1, 3)),
        "the snapshot's, not the later apply"
    );
    Ok(())
}

#[tokio::test]
async fn reads_of_crossed_ranges_are_empty_on_both_disks() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    for location in [
        StoreLocation::from(dir.path()),
        StoreLocation::Memory(MemoryDisk::default()),
    ] {
        let (mut log, _) = store::open(&location)?;
        log.blocking_append((1..=4).map(blank)).await?;
        #[allow(clippy::reversed_empty_ranges)]
        let crossed = log.try_get_log_entries(3..2).await?;
        assert!(crossed.is_empty(), "{location:?}");
        let none = log.try_get_log_entries(2..2).await?;
        assert!(none.is_empty(), "{location:?}");
        let middle = log.try_get_log_entries(2..=3).await?;
        assert_eq!(middle.len(), 2, "{location:?}");
    }
    Ok(())
}

/// An entry of `ids` evaluation ids: about 35 bytes of log per id.
fn cancellations(index: u64, ids: usize) -> Entry<TypeConfig> {
    Entry {
        log_id: log_id(1, index),
        payload: EntryPayload::Normal(Batch {
            ops: vec![Op::SetEvalStatus {
                ids: (0..ids).map(|n| EvalId(format!("{n:032x}"))).collect(),
                status: EvalStatus::Canceled,
                description: "canceled".into(),
            }],
        }),
    }
}

#[tokio::test]
async fn entries_longer_than_a_piece_read_back_whole_and_go_whole_on_both_disks()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    for location in [
        StoreLocation::from(dir.path()),
        StoreLocation::Memory(MemoryDisk::default()),
    ] {
        let (mut log, mut state_machine) = store::open(&location)?;
        // 2 and 4 are hundreds of kilobytes, 5 just over one piece (7 KiB).
        let written = vec![
            blank(1),
            cancellations(2, 10_000),
            blank(3),
            cancellations(4, 3_000),
            cancellations(5, 210),
        ];
        log.blocking_append(written.clone()).await?;
        assert_eq!(log.try_get_log_entries(..).await?, written, "{location:?}");
        assert_eq!(
            log.try_get_log_entries(2..=2).await?,
            written[1..2],
            "{location:?}"
        );
        assert_eq!(
            log.try_get_log_entries(2..4).await?,
            written[1..3],
            "{location:?}"
        );
        assert_eq!(
            log.get_log_state().await?.last_log_id,
            Some(log_id(1, 5)),
            "{location:?}: the last entry read from its pieces"
        );

        log.truncate(log_id(1, 4)).await?;
        assert_eq!(
            log.try_get_log_entries(..).await?,
            written[..3],
            "{location:?}"
        );
        assert_eq!(log.get_log_state().await?.last_log_id, Some(log_id(1, 3)));

        state_machine.apply(written[..3].to_vec()).await?;
        let mut builder = state_machine.get_snapshot_builder().await;
        openraft::RaftSnapshotBuilder::build_snapshot(&mut builder).await?;
        log.purge(log_id(1, 2)).await?;
        assert_eq!(
            log.try_get_log_entries(..).await?,
            written[2..3],
            "{location:?}: a purged entry's pieces go with it"
        );
        log.blocking_append([cancellations(4, 3_000)]).await?;
        assert_eq!(indexes(&mut log).await?, [3, 4], "{location:?}");
    }
    Ok(())
}

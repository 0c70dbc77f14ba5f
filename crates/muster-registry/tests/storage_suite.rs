//! openraft's storage conformance suite against the sled store.

use muster_registry::store::{self, LogStore, StateMachineStore};
use muster_registry::types::{NodeId, TypeConfig};
use openraft::StorageError;
use openraft::testing::{StoreBuilder, Suite};

struct SledBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, tempfile::TempDir> for SledBuilder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachineStore), StorageError<NodeId>> {
        let dir = tempfile::tempdir().map_err(|e| openraft::StorageIOError::write(&e))?;
        let (log, state_machine) =
            store::open(dir.path()).map_err(|e| openraft::StorageIOError::write(&e))?;
        Ok((dir, log, state_machine))
    }
}

#[test]
fn the_sled_store_passes_openrafts_storage_suite() -> anyhow::Result<()> {
    Suite::test_all(SledBuilder)?;
    Ok(())
}

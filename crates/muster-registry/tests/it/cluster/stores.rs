//! A member's store on disk: one that lost its state, or was truncated or bit-flipped, refuses
//! to start and says why, instead of starting empty.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_lost_its_state_refuses_to_start_instead_of_starting_empty()
-> anyhow::Result<()> {
    let system = System::new();
    let dir = tempfile::tempdir()?;
    let addresses = free_addresses(1).await?;
    let config = config(1, &addresses, dir.path());
    let member = start(&system, config.clone()).await?;
    let members = BTreeMap::from([(1, member)]);
    leader(&members).await?;
    let registrar = system.spawn(Registrar::new(members[&1].registry.clone()));
    // Past a snapshot and a purge (every 50 entries here).
    admit(&registrar, 120).await?;
    registrar.terminate();
    registrar.wait().await;
    for member in members.into_values() {
        member.stop().await;
    }

    // Everything but the store's own record goes, as a truncated or replaced database would.
    let muster_registry::StoreLocation::Directory(store) = config.store.clone() else {
        anyhow::bail!("the test's store is a directory");
    };
    wipe_all_but_the_record(&store)?;
    let deadline = Instant::now() + DEADLINE;
    let refusal = loop {
        match RegistryNode::start(config.clone()).await {
            Ok(_) => bail!("a store that lost its state started empty"),
            Err(RegistryError::Store(muster_registry::store::StoreError::Damaged(why))) => {
                break why.message;
            }
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => return Err(e.into()),
        }
    };
    assert!(
        refusal.contains(&store.display().to_string())
            && refusal.contains("damaged")
            && refusal.contains("move the directory aside"),
        "{refusal}"
    );
    // And again: it never becomes a valid empty store by being opened.
    assert!(matches!(
        RegistryNode::start(config).await,
        Err(RegistryError::Store(
            muster_registry::store::StoreError::Damaged(_)
        ))
    ));
    Ok(())
}

/// A single member with `entries` agents admitted one entry at a time, each admission
/// committed before the next, until its integrity record's log floor reaches `floor`; then
/// stopped. The store's directory.
async fn store_with_log_floor(
    dir: &Path,
    floor: u64,
) -> anyhow::Result<(RegistryConfig, std::path::PathBuf)> {
    let system = System::new();
    let addresses = free_addresses(1).await?;
    let mut config = config(1, &addresses, dir);
    // No snapshot: the log is all there is.
    config.snapshot_after_entries = 100_000;
    let member = start(&system, config.clone()).await?;
    let members = BTreeMap::from([(1, member)]);
    leader(&members).await?;
    let muster_registry::StoreLocation::Directory(store) = config.store.clone() else {
        bail!("the test's store is a directory");
    };
    let record = store.join(muster_registry::store::MARKER_FILE);
    let deadline = Instant::now() + DEADLINE;
    let mut n = 0;
    loop {
        members[&1].registry.write(one_agent(n)).await?;
        n += 1;
        let recorded: serde_json::Value = serde_json::from_slice(&std::fs::read(&record)?)?;
        if recorded["log_index"].as_u64().is_some_and(|at| at >= floor) {
            break;
        }
        if Instant::now() > deadline {
            bail!("the log floor never reached {floor}: {recorded}");
        }
    }
    for member in members.into_values() {
        member.stop().await;
    }
    Ok((config, store))
}

/// Starts a member on `config` until it is refused with anything but a busy store; the
/// refusal.
async fn refusal(config: &RegistryConfig) -> anyhow::Result<String> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        match RegistryNode::start(config.clone()).await {
            Ok(registry) => {
                let last = registry.raft().metrics().borrow().last_log_index;
                registry.shutdown().await;
                bail!("a damaged store started, its log ending at {last:?}");
            }
            Err(RegistryError::Store(muster_registry::store::StoreError::Open {
                source, ..
            })) if source.to_string().contains("lock") && Instant::now() < deadline => {
                // The stopped member's store is still closing.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => return Ok(e.to_string()),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_truncated_or_bit_flipped_refuses_to_start_and_says_why() -> anyhow::Result<()> {
    for damage in ["truncated", "bit-flipped"] {
        let dir = tempfile::tempdir()?;
        let (config, store) = store_with_log_floor(dir.path(), 30).await?;
        let db = store.join("db");
        let bytes = std::fs::read(&db)?;
        match damage {
            "truncated" => std::fs::write(&db, &bytes[..bytes.len() / 2])?,
            _ => {
                let mut flipped = bytes.clone();
                for at in (bytes.len() / 3..bytes.len()).step_by(97) {
                    flipped[at] ^= 0x5a;
                }
                std::fs::write(&db, flipped)?;
            }
        }
        // sled's own recovery stops at the damage and opens what came before it: the
        // store's record is what notices the committed entries it lost.
        let why = refusal(&config).await?;
        assert!(
            why.contains(&store.display().to_string())
                && why.contains("damaged")
                && why.contains("held committed entries up to index")
                && why.contains("move the directory aside"),
            "{damage}: {why}"
        );
    }
    Ok(())
}

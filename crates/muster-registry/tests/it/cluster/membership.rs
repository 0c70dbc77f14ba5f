//! The group changed while it runs: masters join (a learner that catches up by snapshot, then
//! a voter) and leave while writes go on, a removal that would lose the quorum is refused, a
//! dead member is replaced by a new id at a new address, and leadership is handed over.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail};
use muster_actor::{Pid, System};
use muster_registry::types::NodeId;
use muster_registry::{MembershipError, Registrar, RegistryNode};
use muster_transport::Node;
use tokio::time::{Instant, timeout};

use super::{DEADLINE, Member, admit, config, leader, start, three_members, wait_agents};

/// A free loopback address.
async fn free_address() -> anyhow::Result<String> {
    Ok(Node::listen("127.0.0.1:0").await?.local_addr().to_string())
}

/// Starts master `id` at a fresh address, asking `seed` to add it to the group.
async fn start_joining(
    system: &System,
    id: NodeId,
    seed: &str,
    dir: &Path,
) -> anyhow::Result<Member> {
    let address = free_address().await?;
    let mut config = config(id, &BTreeMap::from([(id, address)]), dir);
    config.join = vec![seed.to_owned()];
    start(system, config).await
}

/// The voters as `registry` knows them.
fn voters(registry: &RegistryNode) -> BTreeSet<NodeId> {
    registry
        .raft_peers()
        .into_iter()
        .filter(|peer| peer.voter)
        .map(|peer| peer.id)
        .collect()
}

/// Waits until every one of `members` sees exactly `expected` as the voters.
async fn until_voters(
    members: &BTreeMap<NodeId, Member>,
    expected: &[NodeId],
) -> anyhow::Result<()> {
    let expected: BTreeSet<NodeId> = expected.iter().copied().collect();
    let deadline = Instant::now() + DEADLINE;
    loop {
        let seen: Vec<(NodeId, BTreeSet<NodeId>)> = members
            .iter()
            .map(|(id, member)| (*id, voters(&member.registry)))
            .collect();
        if seen.iter().all(|(_, voters)| *voters == expected) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the members never all saw voters {expected:?}: {seen:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Admits agents through `registrar` one batch after another until `stop` is set; the ids
/// acknowledged.
fn keep_writing(
    registrar: Pid<Registrar>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<String>> {
    tokio::spawn(async move {
        let mut acknowledged = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            // A write may meet a membership change or a leader handing over: retried.
            if let Ok(Ok(ids)) = timeout(Duration::from_secs(5), admit(&registrar, 5)).await {
                acknowledged.extend(ids);
            }
        }
        acknowledged
    })
}

/// Every id in `acknowledged` is an agent on every one of `members`, once each has applied
/// what the leader, `leader`, has (an acknowledged write is applied there first).
async fn nothing_lost(
    members: &BTreeMap<NodeId, Member>,
    leader: NodeId,
    acknowledged: &[String],
) -> anyhow::Result<()> {
    let count = members[&leader].registry.reader().read(|s| s.agents.len());
    for member in members.values() {
        wait_agents(&member.registry, count).await?;
        let agents = member.registry.reader().read(|s| s.agents.clone());
        for id in acknowledged {
            assert!(
                agents.keys().any(|agent| agent.0 == *id),
                "acknowledged agent {id} is not on member {}",
                member.registry.id()
            );
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_grow_to_five_and_back_to_three_while_written_and_none_is_lost() -> anyhow::Result<()>
{
    let system = System::new();
    let dir = tempfile::tempdir()?;
    let (addresses, mut members) = three_members(&system, dir.path()).await?;
    let first = leader(&members).await?;
    let registrar = system.spawn(Registrar::new(members[&first].registry.clone()));
    // Enough entries, one by one, that the log behind a snapshot is purged (one every 50):
    // the joiners catch up by snapshot.
    for _ in 0..64 {
        timeout(DEADLINE, admit(&registrar, 1)).await??;
    }
    let mut metrics = members[&first].registry.raft().metrics();
    timeout(
        DEADLINE,
        metrics.wait_for(|m| m.purged.is_some_and(|id| id.index > 0)),
    )
    .await
    .context("the leader never purged its log behind a snapshot")??;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = keep_writing(registrar.clone(), Arc::clone(&stop));

    // Each joins through a follower, which names the leader.
    let follower = *addresses
        .keys()
        .find(|id| **id != first)
        .context("a follower")?;
    for id in [4, 5] {
        let joined = start_joining(&system, id, &addresses[&follower], dir.path()).await?;
        members.insert(id, joined);
        until_voters(&members, &(1..=id).collect::<Vec<_>>()).await?;
    }
    assert!(
        members[&4]
            .registry
            .raft()
            .metrics()
            .borrow()
            .snapshot
            .is_some(),
        "the first joiner caught up from the leader's snapshot"
    );
    let peers = members[&first].registry.raft_peers();
    assert_eq!(peers.len(), 5);
    assert!(
        peers.iter().all(|peer| peer.healthy == Some(true)),
        "the leader hears every member: {peers:?}"
    );

    // The leader cannot remove itself; two others leave.
    let refused = members[&first].registry.remove_peer(first, false).await;
    assert!(
        matches!(&refused, Err(MembershipError::Refused(why)) if why.contains("transfer-leadership")),
        "{refused:?}"
    );
    let leaving: Vec<NodeId> = [4, follower].into();
    for id in &leaving {
        members[&first].registry.remove_peer(*id, false).await?;
    }
    for id in &leaving {
        // It heard the configuration without it (it was a learner for that), so it stands
        // for no election with the old one.
        let gone = members.remove(id).context("leaving member")?;
        let deadline = Instant::now() + DEADLINE;
        while voters(&gone.registry).contains(id) {
            if Instant::now() > deadline {
                bail!("removed member {id} never saw itself removed");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        gone.stop().await;
    }
    let staying: Vec<NodeId> = members.keys().copied().collect();
    until_voters(&members, &staying).await?;
    assert_eq!(staying.len(), 3);

    stop.store(true, Ordering::Relaxed);
    let acknowledged = writer.await?;
    assert!(
        !acknowledged.is_empty(),
        "writes went on while the group changed"
    );
    nothing_lost(&members, leader(&members).await?, &acknowledged).await?;
    // The group of three still commits.
    timeout(DEADLINE, admit(&registrar, 1)).await??;
    for member in members.into_values() {
        member.stop().await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_that_would_lose_the_quorum_is_refused_and_a_dead_member_is_replaced()
-> anyhow::Result<()> {
    let system = System::new();
    let dir = tempfile::tempdir()?;
    let (addresses, mut members) = three_members(&system, dir.path()).await?;
    let first = leader(&members).await?;
    let registrar = system.spawn(Registrar::new(members[&first].registry.clone()));
    timeout(DEADLINE, admit(&registrar, 10)).await??;
    let mut followers = addresses.keys().copied().filter(|id| *id != first);
    let (dead, alive) = (
        followers.next().context("a follower")?,
        followers.next().context("another follower")?,
    );

    // A follower dies and its data is lost.
    members.remove(&dead).context("dead")?.stop().await;
    std::fs::remove_dir_all(dir.path().join(format!("m{dead}")))?;
    let leader_registry = members[&first].registry.clone();
    let deadline = Instant::now() + DEADLINE;
    while leader_registry
        .raft_peers()
        .iter()
        .any(|peer| peer.id == dead && peer.healthy != Some(false))
    {
        if Instant::now() > deadline {
            bail!("the leader never saw member {dead} go quiet");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Removing the other live follower would leave the leader and a dead member: refused.
    let refused = leader_registry.remove_peer(alive, false).await;
    assert!(
        matches!(&refused, Err(MembershipError::Refused(why)) if why.contains("quorum")),
        "{refused:?}"
    );
    assert_eq!(voters(&leader_registry).len(), 3, "nothing changed");

    // The dead one is removed, and a new master with a new id at a new address takes its
    // place; the group writes throughout.
    leader_registry.remove_peer(dead, false).await?;
    until_voters(&members, &[first, alive]).await?;
    timeout(DEADLINE, admit(&registrar, 10)).await??;
    let replacement = start_joining(&system, 6, &addresses[&first], dir.path()).await?;
    members.insert(6, replacement);
    until_voters(&members, &[first, alive, 6]).await?;
    timeout(DEADLINE, admit(&registrar, 10)).await??;
    wait_agents(&members[&6].registry, 30).await?;

    // Asking to add a taken id at another address names the member.
    let taken = leader_registry
        .add_peer(alive, "127.0.0.1:1", Duration::from_secs(1))
        .await;
    assert!(
        matches!(&taken, Err(MembershipError::Refused(why)) if why.contains("already a member")),
        "{taken:?}"
    );
    for member in members.into_values() {
        member.stop().await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_moves_to_the_member_named_and_then_to_the_best_other() -> anyhow::Result<()> {
    let system = System::new();
    let dir = tempfile::tempdir()?;
    let (_, members) = three_members(&system, dir.path()).await?;
    let first = leader(&members).await?;
    let registrar = system.spawn(Registrar::new(members[&first].registry.clone()));
    timeout(DEADLINE, admit(&registrar, 10)).await??;
    let target = *members
        .keys()
        .find(|id| **id != first)
        .context("a follower")?;

    let moved = members[&first]
        .registry
        .transfer_leadership(Some(target))
        .await?;
    assert_eq!(moved, target);
    assert_eq!(leader(&members).await?, target);
    // Asked of a member that does not lead: refused, naming the leader.
    let refused = members[&first].registry.transfer_leadership(None).await;
    assert!(
        matches!(&refused, Err(MembershipError::NotLeader { leader: Some((id, _)) }) if *id == target),
        "{refused:?}"
    );
    // The new leader writes.
    let registrar = system.spawn(Registrar::new(members[&target].registry.clone()));
    timeout(DEADLINE, admit(&registrar, 10)).await??;

    // Without a target, it goes to another voter.
    let next = members[&target].registry.transfer_leadership(None).await?;
    assert_ne!(next, target);
    assert_eq!(leader(&members).await?, next);
    for member in members.into_values() {
        member.stop().await;
    }
    Ok(())
}

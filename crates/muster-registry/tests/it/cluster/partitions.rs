//! The group behind links the test cuts (`Partitions`): a follower cut off keeps its term and
//! deposes no one when it returns; a leader cut from the others stands down within its lease,
//! and a write sent to it fails at once instead of hanging; a damaged follower told to rejoin
//! votes only once it has caught up.

use super::*;

/// After a heal: `follower` catches up with `first`, which still leads after one more write,
/// and no member's term moved from `term`; then every member stops.
async fn caught_up_under_the_same_leader(
    members: BTreeMap<NodeId, Member>,
    first: NodeId,
    follower: NodeId,
    term: u64,
    write: usize,
) -> anyhow::Result<()> {
    let applied = members[&first].registry.reader().applied_index();
    until("the follower catching up", || {
        members[&follower].registry.reader().applied_index() >= applied
    })
    .await?;
    members[&first].registry.write(one_agent(write)).await?;
    assert_eq!(leader(&members).await?, first, "the leader was deposed");
    for id in members.keys() {
        assert_eq!(term_of(&members, *id), term, "member {id} changed term");
    }
    for member in members.into_values() {
        member.stop().await;
    }
    Ok(())
}

/// Starts a group of three whose members reach each other only through `partitions`' links:
/// member `i` is told to reach `j` at the link `i → j`.
async fn three_linked_members(
    system: &System,
    dir: &Path,
    partitions: &Partitions,
) -> anyhow::Result<BTreeMap<NodeId, Member>> {
    let (_, configs) = three_linked_configs(dir, partitions).await?;
    let mut members = BTreeMap::new();
    for (id, config) in configs {
        members.insert(id, start(system, config).await?);
    }
    Ok(members)
}

/// The configs of a group of three on free loopback ports whose members reach each other
/// only through `partitions`' links (member `i` reaches `j` at the link `i → j`), and each
/// member's own address.
async fn three_linked_configs(
    dir: &Path,
    partitions: &Partitions,
) -> anyhow::Result<(BTreeMap<NodeId, String>, BTreeMap<NodeId, RegistryConfig>)> {
    let addresses = free_addresses(3).await?;
    let mut configs = BTreeMap::new();
    for &id in addresses.keys() {
        let mut view = BTreeMap::new();
        for (&peer, address) in &addresses {
            let reach = if peer == id {
                address.clone()
            } else {
                partitions
                    .link(id, peer, "127.0.0.1", address.clone())
                    .await?
            };
            view.insert(peer, reach);
        }
        configs.insert(id, config(id, &view, dir));
    }
    Ok((addresses, configs))
}

/// The raft term member `id` is in now.
fn term_of(members: &BTreeMap<NodeId, Member>, id: NodeId) -> u64 {
    term_of_member(&members[&id])
}

fn term_of_member(member: &Member) -> u64 {
    member.registry.raft().metrics().borrow().current_term
}

/// Waits until `done` holds, or fails naming `what`.
async fn until(what: &str, done: impl Fn() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + DEADLINE;
    while !done() {
        if Instant::now() > deadline {
            bail!("{what} did not happen within {DEADLINE:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_cut_off_and_healed_keeps_its_term_and_deposes_no_one() -> anyhow::Result<()> {
    let system = System::new();
    let dir = tempfile::tempdir()?;
    let partitions = Partitions::new();
    let members = three_linked_members(&system, dir.path(), &partitions).await?;
    let first = leader(&members).await?;
    let term = term_of(&members, first);
    let follower = *members
        .keys()
        .find(|id| **id != first)
        .context("a follower")?;

    let stats = members[&follower].registry.election_stats().clone();
    let (won, lost) = (stats.won(), stats.lost());
    partitions.isolate(follower, members.keys().copied());
    // Three rounds lost: without the pre-vote it would have stood, and raised its term, three
    // times.
    until("three lost pre-votes on the cut-off follower", || {
        stats.lost() >= lost + 3
    })
    .await?;
    assert_eq!(
        term_of(&members, follower),
        term,
        "the cut-off member's term rose"
    );
    assert_eq!(stats.won(), won, "the cut-off member won a pre-vote");
    // The leader goes on with the third member.
    members[&first].registry.write(one_agent(1)).await?;
    assert!(members[&first].registry.leadership().borrow().is_self);

    partitions.heal();
    caught_up_under_the_same_leader(members, first, follower, term, 2).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_from_both_followers_stands_down_and_a_write_to_it_fails_without_hanging()
-> anyhow::Result<()> {
    let system = System::new();
    let dir = tempfile::tempdir()?;
    let partitions = Partitions::new();
    let mut members = three_linked_members(&system, dir.path(), &partitions).await?;
    let first = leader(&members).await?;
    let term = term_of(&members, first);
    members[&first].registry.write(one_agent(1)).await?;

    let stats = members[&first].registry.election_stats().clone();
    let won = stats.won();
    partitions.isolate(first, members.keys().copied());
    // Sent right after the cut: it cannot commit, and it ends when the lease lapses instead
    // of waiting for a quorum that is not there.
    let in_flight = members[&first].registry.write(one_agent(2));
    match timeout(DEADLINE, in_flight).await {
        Ok(Err(muster_registry::WriteError::Failed(reason))) => {
            assert!(reason.contains("lost its quorum"), "{reason}");
        }
        other => bail!("a write to a cut-off leader: {other:?}"),
    }
    assert!(!members[&first].registry.leadership().borrow().is_self);
    // Once stood down it refuses at once, naming no leader.
    match members[&first].registry.write(one_agent(3)).await {
        Err(muster_registry::WriteError::NotLeader { .. }) => {}
        Err(muster_registry::WriteError::Failed(_)) => {}
        other => bail!("a stood-down leader took a write: {other:?}"),
    }

    // The other two elect one of themselves; the cut-off member takes no part.
    let cut_off = members.remove(&first).context("the old leader")?;
    let second = leader(&members).await?;
    assert_ne!(second, first);
    let new_term = term_of(&members, second);
    assert!(new_term > term);
    members[&second].registry.write(one_agent(4)).await?;
    assert_eq!(
        term_of_member(&cut_off),
        term,
        "the cut-off leader's term rose"
    );
    assert_eq!(stats.won(), won, "the cut-off leader won a pre-vote");

    // Healed, the old leader follows the new one, in its term.
    partitions.heal();
    members.insert(first, cut_off);
    let after = leader(&members).await?;
    let terms: Vec<(NodeId, u64, u64, u64)> = members
        .iter()
        .map(|(id, m)| {
            let stats = m.registry.election_stats();
            (*id, term_of(&members, *id), stats.won(), stats.lost())
        })
        .collect();
    assert_eq!(
        after, second,
        "first {first}, terms and pre-votes {terms:?}"
    );
    let applied = members[&second].registry.reader().applied_index();
    until("the old leader catching up", || {
        members[&first].registry.reader().applied_index() >= applied
    })
    .await?;
    for id in members.keys() {
        assert_eq!(term_of(&members, *id), new_term, "member {id}");
    }
    for member in members.into_values() {
        member.stop().await;
    }
    Ok(())
}

/// A follower whose store was damaged while it was stopped, started with `rejoin_damaged`:
/// the damaged directory is moved aside and it starts empty; while it has not caught up
/// (here, cut off from the others) it grants no vote, even to a candidate with a higher term
/// and a longer log, so its term does not move; once healed it catches up from the leader,
/// which keeps its lead and its term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_follower_told_to_rejoin_starts_empty_and_votes_only_once_caught_up()
-> anyhow::Result<()> {
    use muster_proto::registry::raft_client::RaftClient;

    let system = System::new();
    let dir = tempfile::tempdir()?;
    let partitions = Partitions::new();
    let (addresses, mut configs) = three_linked_configs(dir.path(), &partitions).await?;
    let mut members = BTreeMap::new();
    for (&id, config) in &mut configs {
        // No snapshot: the log is all there is to catch up from.
        config.snapshot_after_entries = 100_000;
        members.insert(id, start(&system, config.clone()).await?);
    }
    let first = leader(&members).await?;
    let term = term_of(&members, first);
    let follower = *members
        .keys()
        .find(|id| **id != first)
        .context("a follower")?;
    let muster_registry::StoreLocation::Directory(store) = configs[&follower].store.clone() else {
        bail!("the test's store is a directory");
    };
    // Writes until the follower's record says it held committed entries up to index 20.
    let record = store.join(muster_registry::store::MARKER_FILE);
    let deadline = Instant::now() + DEADLINE;
    let mut n = 0;
    loop {
        members[&first].registry.write(one_agent(n)).await?;
        n += 1;
        let recorded: serde_json::Value = serde_json::from_slice(&std::fs::read(&record)?)?;
        if recorded["log_index"].as_u64().is_some_and(|at| at >= 20) {
            break;
        }
        if Instant::now() > deadline {
            bail!("the follower's log floor never reached 20: {recorded}");
        }
    }
    let stopped = members.remove(&follower).context("the follower")?;
    stopped.stop().await;
    // Its database goes; its record stays.
    wipe_all_but_the_record(&store)?;
    partitions.isolate(follower, addresses.keys().copied());
    let mut rejoin = configs[&follower].clone();
    rejoin.rejoin_damaged = true;
    members.insert(follower, start(&system, rejoin).await?);
    let parent = store.parent().context("the store's parent")?;
    let name = store
        .file_name()
        .and_then(|n| n.to_str())
        .context("the store's name")?;
    let aside: Vec<String> = std::fs::read_dir(parent)?
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .filter(|n| n.starts_with(&format!("{name}.damaged-")))
        .collect();
    assert_eq!(aside.len(), 1, "the damaged store moved aside: {aside:?}");

    // A candidate of a higher term whose log is longer than anything: refused while the
    // rejoining member has not caught up, and its term stays where it was.
    let before = term_of(&members, follower);
    let security = TestPki::shared().security(Role::Master, "master-9");
    let endpoint =
        tonic::transport::Endpoint::from_shared(format!("http://{}", addresses[&follower]))?;
    let (channel, _) = security.channel(endpoint, &[Role::Master]).await?;
    let candidate: openraft::raft::VoteRequest<NodeId> = openraft::raft::VoteRequest {
        vote: openraft::Vote::new(term + 100, first),
        last_log_id: Some(openraft::LogId::new(
            openraft::CommittedLeaderId::new(term + 100, first),
            1_000_000,
        )),
    };
    let answer = RaftClient::new(channel)
        .vote(muster_proto::registry::RaftPayload {
            body: muster_registry::codec::encode(&candidate)?.into(),
        })
        .await?
        .into_inner();
    let answer: Result<openraft::raft::VoteResponse<NodeId>, serde_json::Value> =
        muster_registry::codec::decode(&answer.body)?;
    let answer = answer.map_err(|e| anyhow::anyhow!("the vote was answered with {e}"))?;
    assert!(!answer.vote_granted, "a rejoining member granted a vote");
    assert_eq!(term_of(&members, follower), before, "its term moved");

    partitions.heal();
    caught_up_under_the_same_leader(members, first, follower, term, n + 1).await
}

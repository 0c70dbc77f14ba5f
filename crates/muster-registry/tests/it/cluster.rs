//! Three registry members over tonic on loopback, each on its own sled store: election, batched
//! writes, losing the leader, and a member that returns after the log was purged catching up
//! by snapshot. And the same group behind links the test cuts (`Partitions`): a follower cut
//! off keeps its term and deposes no one when it returns; a leader cut from the others stands
//! down within its lease, and a write sent to it fails at once instead of hanging.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, bail};
use muster_actor::{Pid, System};
use muster_model::{AgentInfo, Evaluation, Job, SchedulerType, Trigger};
use muster_registry::types::NodeId;
use muster_registry::{
    Op, Outcome, Registrar, RegistrarMsg, RegistrarStats, RegistryConfig, RegistryError,
    RegistryNode,
};
use muster_security::Role;
use muster_security::testing::TestPki;
use muster_security::testing::partitions::Partitions;
use muster_transport::{Node, NodeConfig};
use tokio::time::{Instant, timeout};
use tonic::service::Routes;

const DEADLINE: Duration = Duration::from_secs(20);

/// One member: its raft and the tonic server that carries its raft traffic.
struct Member {
    registry: RegistryNode,
    server: Node,
}

impl Member {
    async fn stop(self) {
        self.registry.shutdown().await;
        self.server.shutdown();
    }
}

fn config(id: NodeId, members: &BTreeMap<NodeId, String>, dir: &Path) -> RegistryConfig {
    let security = TestPki::shared().security(Role::Master, &format!("master-{id}"));
    let mut config = RegistryConfig::single(id, "unused", dir.join(format!("m{id}")), security);
    config.members = members.clone();
    config.heartbeat_interval = Duration::from_millis(50);
    config.election_timeout = (Duration::from_millis(200), Duration::from_millis(400));
    config.snapshot_after_entries = 50;
    config.entries_kept_after_snapshot = 0;
    config
}

/// Starts member `id`, binding its address (again, after a stop, once the old server and
/// store have let go).
async fn start(system: &System, config: RegistryConfig) -> anyhow::Result<Member> {
    let address = config.members[&config.id].clone();
    let node_config = NodeConfig::new(config.security.clone());
    let deadline = Instant::now() + DEADLINE;
    let registry = loop {
        match RegistryNode::start(config.clone()).await {
            Ok(registry) => break registry,
            // The stopped member's store closes once its last handle is dropped.
            Err(RegistryError::Store(_)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => return Err(e.into()),
        }
    };
    let listener = loop {
        match Node::listen(&address).await {
            Ok(listener) => break listener,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => return Err(e).context("rebinding a member's address"),
        }
    };
    let routes = Routes::new(registry.raft_service());
    let server = Node::serve(system, listener, node_config, routes)?;
    Ok(Member { registry, server })
}

async fn free_addresses(n: u64) -> anyhow::Result<BTreeMap<NodeId, String>> {
    let mut members = BTreeMap::new();
    for id in 1..=n {
        let listener = Node::listen("127.0.0.1:0").await?;
        members.insert(id, listener.local_addr().to_string());
    }
    Ok(members)
}

/// Starts a group of three members on free loopback ports, data under `dir`.
async fn three_members(
    system: &System,
    dir: &Path,
) -> anyhow::Result<(BTreeMap<NodeId, String>, BTreeMap<NodeId, Member>)> {
    let addresses = free_addresses(3).await?;
    let mut members = BTreeMap::new();
    for id in addresses.keys() {
        members.insert(*id, start(system, config(*id, &addresses, dir)).await?);
    }
    Ok((addresses, members))
}

/// Waits until some member of `members` leads and the others agree on it.
async fn leader(members: &BTreeMap<NodeId, Member>) -> anyhow::Result<NodeId> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let views: Vec<_> = members
            .values()
            .map(|m| m.registry.leadership().borrow().clone())
            .collect();
        let leader_of = |v: &muster_registry::Leadership| v.leader.as_ref().map(|(id, _)| *id);
        let claimed = views.iter().find(|v| v.is_self).and_then(leader_of);
        if let Some(id) = claimed
            && views.iter().all(|v| leader_of(v) == Some(id))
        {
            return Ok(id);
        }
        if Instant::now() > deadline {
            bail!("no leader agreed on within {DEADLINE:?}: {views:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn agent(n: usize) -> AgentInfo {
    AgentInfo {
        hostname: format!("host-{n}"),
        address: format!("agent@10.0.0.{}:5051", n % 250),
        ..AgentInfo::default()
    }
}

/// Admits `count` agents through `registrar` at once and returns their ids.
async fn admit(registrar: &Pid<Registrar>, count: usize) -> anyhow::Result<Vec<String>> {
    let mut pending = Vec::new();
    for n in 0..count {
        let registrar = registrar.clone();
        pending.push(tokio::spawn(async move {
            registrar
                .ask(|reply| RegistrarMsg::Write(Op::AdmitAgent(agent(n)), reply))
                .await
        }));
    }
    let mut ids = Vec::new();
    for written in pending {
        match written.await?? {
            Ok(Outcome::Admitted(id)) => ids.push(id.0),
            other => bail!("admission failed: {other:?}"),
        }
    }
    Ok(ids)
}

async fn wait_agents(registry: &RegistryNode, count: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + DEADLINE;
    while registry.reader().read(|state| state.agents.len()) < count {
        if Instant::now() > deadline {
            bail!("member {} never applied {count} agents", registry.id());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_elect_replicate_and_survive_losing_the_leader() -> anyhow::Result<()> {
    let system = System::new();
    let dir = tempfile::tempdir()?;
    let (addresses, mut members) = three_members(&system, dir.path()).await?;

    // Concurrent writes through one registrar share raft entries, and each caller gets its
    // own result.
    let first = leader(&members).await?;
    let registrar = system.spawn(Registrar::new(members[&first].registry.clone()));
    let ids = timeout(DEADLINE, admit(&registrar, 500)).await??;
    let mut distinct = ids.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 500, "every caller got its own agent id");
    let stats: RegistrarStats = registrar.ask(RegistrarMsg::Stats).await?;
    assert_eq!(stats.ops, 500);
    assert!(
        stats.entries < 100,
        "500 concurrent writes went out in {} raft entries",
        stats.entries
    );
    for member in members.values() {
        wait_agents(&member.registry, 500).await?;
    }

    // A follower not the leader refuses writes and names the leader.
    let follower = *members
        .keys()
        .find(|id| **id != first)
        .context("a follower")?;
    let refused = members[&follower]
        .registry
        .write(muster_registry::types::Batch::default())
        .await;
    match refused {
        Err(muster_registry::WriteError::NotLeader {
            leader: Some((id, address)),
        }) => {
            assert_eq!(id, first);
            assert_eq!(address, addresses[&first]);
        }
        other => bail!("a follower accepted a write: {other:?}"),
    }

    // Lose the leader: the other two elect a new one that has every admitted agent.
    registrar.terminate();
    members.remove(&first).context("leader")?.stop().await;
    let second = leader(&members).await?;
    assert_ne!(second, first);
    members[&second].registry.catch_up().await?;
    assert_eq!(
        members[&second].registry.reader().read(|s| s.agents.len()),
        500
    );

    // Write past the snapshot threshold while the old leader is away, so the log it missed is
    // purged; back, it catches up by snapshot over tonic.
    let registrar = system.spawn(Registrar::new(members[&second].registry.clone()));
    for _ in 0..64 {
        timeout(DEADLINE, admit(&registrar, 1)).await??;
    }
    let mut metrics = members[&second].registry.raft().metrics();
    timeout(
        DEADLINE,
        metrics.wait_for(|m| m.purged.is_some_and(|id| id.index > 0)),
    )
    .await
    .context("the leader never purged its log behind a snapshot")??;
    let back = start(&system, config(first, &addresses, dir.path())).await?;
    wait_agents(&back.registry, 564).await?;
    assert!(
        back.registry.raft().metrics().borrow().snapshot.is_some(),
        "the returning member was sent the leader's snapshot"
    );
    let leader_state = members[&second].registry.reader().read(|s| s.clone());
    assert_eq!(back.registry.reader().read(|s| s.clone()), leader_state);
    members.insert(first, back);

    for member in members.into_values() {
        member.stop().await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_restarted_from_disk_keeps_what_it_applied() -> anyhow::Result<()> {
    let system = System::new();
    let dir = tempfile::tempdir()?;
    let addresses = free_addresses(1).await?;
    let mut members =
        BTreeMap::from([(1, start(&system, config(1, &addresses, dir.path())).await?)]);
    leader(&members).await?;
    let registrar = system.spawn(Registrar::new(members[&1].registry.clone()));
    let mut admitted = admit(&registrar, 120).await?;
    let job = Job {
        name: "web".into(),
        priority: 50,
        scheduler: SchedulerType::Service,
        groups: Vec::new(),
        stopped: false,
        version: 0,
    };
    let eval = Evaluation::new(&job, Trigger::JobRegister);
    let written = registrar
        .ask(|r| {
            RegistrarMsg::Write(
                Op::Together(vec![
                    Op::UpsertJob(job),
                    Op::UpsertEvals(vec![eval.clone()]),
                ]),
                r,
            )
        })
        .await?;
    assert!(matches!(written, Ok(Outcome::Together(_))), "{written:?}");
    registrar.terminate();
    registrar.wait().await;
    members.remove(&1).context("member")?.stop().await;

    let members = BTreeMap::from([(1, start(&system, config(1, &addresses, dir.path())).await?)]);
    leader(&members).await?;
    members[&1].registry.catch_up().await?;
    let mut recovered = members[&1]
        .registry
        .reader()
        .read(|s| s.agents.keys().map(|id| id.0.clone()).collect::<Vec<_>>());
    admitted.sort();
    recovered.sort();
    assert_eq!(recovered, admitted);
    let (jobs, evals) = members[&1]
        .registry
        .reader()
        .read(|s| (s.jobs.clone(), s.evals.clone()));
    assert_eq!(jobs["web"].version, 1);
    assert_eq!(evals[&eval.id].job, "web");
    assert!(evals[&eval.id].create_index > 0);
    for member in members.into_values() {
        member.stop().await;
    }
    Ok(())
}

/// A forged raft `Vote` with a higher term, as would make a leader step down.
fn forged_vote(term: u64) -> muster_proto::registry::RaftPayload {
    let vote: openraft::raft::VoteRequest<NodeId> = openraft::raft::VoteRequest {
        vote: openraft::Vote::new(term, 99),
        last_log_id: None,
    };
    muster_proto::registry::RaftPayload {
        body: muster_registry::codec::encode(&vote)
            .unwrap_or_default()
            .into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raft_is_served_to_master_certificates_only() -> anyhow::Result<()> {
    use muster_proto::registry::raft_client::RaftClient;
    use muster_security::Security;

    let system = System::new();
    let dir = tempfile::tempdir()?;
    let (addresses, members) = three_members(&system, dir.path()).await?;
    let first = leader(&members).await?;
    let term = members[&first].registry.leadership().borrow().term;
    let target = format!("http://{}", addresses[&first]);

    // An agent's and a client's certificate: refused by the guard, before raft sees it.
    for role in [Role::Agent, Role::Client] {
        let security = TestPki::shared().security(role, "intruder");
        let endpoint = tonic::transport::Endpoint::from_shared(target.clone())?;
        let (channel, _) = security.channel(endpoint, &[Role::Master]).await?;
        let refused = RaftClient::new(channel)
            .vote(forged_vote(term + 100))
            .await
            .expect_err("a vote from a non-master");
        assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
        assert!(refused.message().contains(role.as_str()), "{refused:?}");
    }
    // Another CA's master certificate, and plaintext: no connection at all.
    for security in [
        TestPki::foreign().security(Role::Master, "master-1"),
        Security::Insecure,
    ] {
        let endpoint = tonic::transport::Endpoint::from_shared(target.clone())?
            .connect_timeout(Duration::from_secs(5));
        let reached = match security.channel(endpoint, &[Role::Master]).await {
            Err(_) => false,
            Ok((channel, _)) => RaftClient::new(channel)
                .vote(forged_vote(term + 100))
                .await
                .is_ok(),
        };
        assert!(!reached, "a stranger's vote reached raft");
    }

    // The leader kept its lead and its term.
    assert_eq!(leader(&members).await?, first);
    assert_eq!(members[&first].registry.leadership().borrow().term, term);
    for member in members.into_values() {
        member.stop().await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_authenticates_on_every_member_until_its_deletion_applies() -> anyhow::Result<()> {
    use muster_security::{AclToken, Policy, TokenSecret, TokenSource as _};

    let system = System::new();
    let dir = tempfile::tempdir()?;
    let (_, members) = three_members(&system, dir.path()).await?;
    let first = leader(&members).await?;
    let secret = TokenSecret::generate().map_err(|_| anyhow::anyhow!("no randomness"))?;
    let token = AclToken {
        accessor: "acc-ci".into(),
        name: "ci".into(),
        policy: Policy::Submit,
        secret_hash: secret.hash(),
        created_ms: 1,
    };
    let written = members[&first]
        .registry
        .write(muster_registry::types::Batch {
            ops: vec![Op::BootstrapAcl(token)],
        })
        .await?;
    assert_eq!(written.results, [Ok(Outcome::TokenStored)]);

    let everywhere = |known: bool| {
        let members = &members;
        let secret = &secret;
        async move {
            let deadline = Instant::now() + DEADLINE;
            while !members
                .values()
                .all(|m| m.registry.reader().authenticate(secret).is_some() == known)
            {
                if Instant::now() > deadline {
                    bail!(
                        "the token's {} did not reach every member",
                        if known { "creation" } else { "deletion" }
                    );
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            anyhow::Ok(())
        }
    };
    everywhere(true).await?;
    members[&first]
        .registry
        .write(muster_registry::types::Batch {
            ops: vec![Op::DeleteToken {
                accessor: "acc-ci".into(),
            }],
        })
        .await?;
    everywhere(false).await?;
    for member in members.into_values() {
        member.stop().await;
    }
    Ok(())
}

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

/// Removes everything in a stopped member's `store` but its integrity record, as a truncated
/// or replaced database would.
fn wipe_all_but_the_record(store: &Path) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(store)? {
        let path = entry?.path();
        if path.file_name() == Some(std::ffi::OsStr::new(muster_registry::store::MARKER_FILE)) {
            continue;
        }
        if path.is_dir() {
            std::fs::remove_dir_all(&path)?;
        } else {
            std::fs::remove_file(&path)?;
        }
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

fn one_agent(n: usize) -> muster_registry::types::Batch {
    muster_registry::types::Batch {
        ops: vec![Op::AdmitAgent(agent(n))],
    }
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

/// A group whose members write different encodings (one JSON, the encoding before
/// MessagePack, as a member of an older build would): each answers a request in the request's
/// encoding and reads both, so the group elects, replicates and snapshots as one, whichever
/// member leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_writing_json_and_msgpack_replicate_as_one_group() -> anyhow::Result<()> {
    let system = System::new();
    let dir = tempfile::tempdir()?;
    let addresses = free_addresses(3).await?;
    let mut members = BTreeMap::new();
    for &id in addresses.keys() {
        let mut config = config(id, &addresses, dir.path());
        if id == 1 {
            config.encoding = muster_registry::codec::Encoding::Json;
        }
        members.insert(id, start(&system, config).await?);
    }
    let first = leader(&members).await?;
    let registrar = system.spawn(Registrar::new(members[&first].registry.clone()));
    // Past a snapshot (every 50 entries here), written in the leader's encoding.
    for _ in 0..60 {
        timeout(DEADLINE, admit(&registrar, 1)).await??;
    }
    for member in members.values() {
        wait_agents(&member.registry, 60).await?;
    }
    registrar.terminate();
    // The JSON member's store holds JSON, the others' MessagePack: each reads its own after a
    // restart, and every state is the same.
    let json_member = members.remove(&1).context("member 1")?;
    json_member.stop().await;
    let mut config = config(1, &addresses, dir.path());
    config.encoding = muster_registry::codec::Encoding::Json;
    members.insert(1, start(&system, config).await?);
    let leading = leader(&members).await?;
    members[&leading].registry.write(one_agent(1_000)).await?;
    for member in members.values() {
        wait_agents(&member.registry, 61).await?;
    }
    let states: Vec<_> = members
        .values()
        .map(|m| m.registry.reader().read(|s| s.agents.clone()))
        .collect();
    assert!(states.windows(2).all(|w| w[0] == w[1]));
    for member in members.into_values() {
        member.stop().await;
    }
    Ok(())
}

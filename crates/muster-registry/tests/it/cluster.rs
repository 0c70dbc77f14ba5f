//! Three registry members over tonic on loopback, each on its own sled store: election, batched
//! writes, losing the leader, and a member that returns after the log was purged catching up
//! by snapshot. And the same group behind links the test cuts (`Partitions`): a follower cut
//! off keeps its term and deposes no one when it returns; a leader cut from the others stands
//! down within its lease, and a write sent to it fails at once instead of hanging.
//!
//! This file holds the members and the cases of one healthy group; `membership` (the group
//! changed while it runs), `partitions`, `stores` (a member's damaged store) and `security`
//! (who a member serves) hold the rest.

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

mod membership;
mod partitions;
mod security;
mod stores;

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
        named_scheduler: None,
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

fn one_agent(n: usize) -> muster_registry::types::Batch {
    muster_registry::types::Batch {
        ops: vec![Op::AdmitAgent(agent(n))],
    }
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

//! Agents' heartbeats against a real master, agents played by the test over the real
//! transport: TTLs that grow with the number of agents, an agent that stops heartbeating marked
//! unreachable after its TTL and grace, unknown agents refused, and the long first TTL after a
//! failover.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use muster_actor::{System, Upid};
use muster_master::MasterConfig;
use muster_master::requests::{GetMetrics, GetState};
use muster_master::testing::{job_status, submit};
use muster_proto::cluster as pb;
use muster_proto::cluster::heartbeat_reply::Result as Beat;
use muster_proto::cluster::registration_reply::Result as Registration;
use muster_proto::model as model_pb;
use muster_transport::Node;
use tokio::time::Instant;

use crate::common::{
    agent_node, master_upid, member_config, playing_many_agents, register_played,
    start_leading_retrying, state_when, trigger_of,
};

const DEADLINE: Duration = Duration::from_secs(20);
const ASK: Duration = Duration::from_secs(5);

/// A single master at a free port ([`member_config`] of a group of one, its data in
/// `dir/master`) with short heartbeat timings: TTL 200 ms (no scaling), grace 100 ms.
async fn config(dir: &Path) -> anyhow::Result<MasterConfig> {
    let listener = Node::listen("127.0.0.1:0").await?;
    let address = listener.local_addr().to_string();
    drop(listener);
    Ok(MasterConfig {
        data_dir: dir.join("master"),
        heartbeat_min_ttl: Duration::from_millis(200),
        heartbeat_grace: Duration::from_millis(100),
        heartbeats_per_second: 1e9,
        workers: 0,
        ..playing_many_agents(member_config(1, &[(1, address)].into(), dir))
    })
}

fn info(n: usize, node: &Node) -> model_pb::AgentInfo {
    model_pb::AgentInfo {
        hostname: format!("host-{n}"),
        address: format!("agent-{n}@{}", node.address()),
        resources: Some(model_pb::Resources {
            cpus: 4.0,
            mem_mb: 4096,
        }),
        ..model_pb::AgentInfo::default()
    }
}

/// Registers agent `n` ([`info`]) from `node` with `master`; its id.
async fn register(node: &Node, master: &Upid, n: usize) -> anyhow::Result<String> {
    register_played(node, master, info(n, node), ASK).await
}

async fn heartbeat(node: &Node, master: &Upid, agent_id: &str) -> anyhow::Result<Beat> {
    let reply = node
        .remote(master.clone())
        .ask_timeout::<pb::Heartbeat, pb::HeartbeatReply>(
            ASK,
            pb::Heartbeat {
                agent_id: agent_id.to_owned(),
            },
        )
        .await?;
    reply.result.context("heartbeat reply without a result")
}

async fn ttl(node: &Node, master: &Upid, agent_id: &str) -> anyhow::Result<Duration> {
    match heartbeat(node, master, agent_id).await? {
        Beat::TtlMs(ms) => Ok(Duration::from_millis(ms)),
        other => bail!("heartbeat of {agent_id} not taken: {other:?}"),
    }
}

fn is_unreachable(state: &pb::ClusterState, id: &str) -> bool {
    state.unreachable.iter().any(|a| a.id == id)
}

fn connected(state: &pb::ClusterState, id: &str) -> bool {
    state.agents.iter().any(|a| a.id == id && a.connected)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_stops_heartbeating_is_marked_unreachable_after_its_ttl_and_grace()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = config(dir.path()).await?;
    let master = start_leading_retrying(config.clone()).await?;
    let to = master_upid(&master)?;
    let system = System::new();
    let node = agent_node(&system, "agent-1").await?;
    let healthy = register(&node, &to, 0).await?;
    let silent = register(&node, &to, 1).await?;

    // The healthy agent heartbeats at half of each TTL it is given (pacing, as the agent does).
    let stop = Arc::new(AtomicBool::new(false));
    let beats = Arc::new(AtomicUsize::new(0));
    let beating = tokio::spawn({
        let (node, to, id) = (node.clone(), to.clone(), healthy.clone());
        let (stop, beats) = (Arc::clone(&stop), Arc::clone(&beats));
        async move {
            while !stop.load(Ordering::SeqCst) {
                let ttl = ttl(&node, &to, &id).await?;
                ensure!(
                    ttl >= Duration::from_millis(200) && ttl < Duration::from_millis(400),
                    "TTL {ttl:?} is not the minimum plus a stagger below it"
                );
                beats.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(ttl / 2).await;
            }
            anyhow::Ok(())
        }
    });

    // The silent agent heartbeats once, then no more.
    let last = Instant::now();
    let given = ttl(&node, &to, &silent).await?;
    ensure!(given >= config.heartbeat_min_ttl, "TTL {given:?}");
    let state = state_when(&master, "the silent agent marked unreachable", |s| {
        is_unreachable(s, &silent)
    })
    .await?;
    let took = last.elapsed();
    ensure!(
        took >= config.heartbeat_min_ttl + config.heartbeat_grace,
        "marked unreachable after {took:?}, before its minimum TTL and grace"
    );
    ensure!(!state.agents.iter().any(|a| a.id == silent));
    ensure!(connected(&state, &healthy), "{state:?}");
    // Its heartbeats are refused now: it has to register again.
    let refused = heartbeat(&node, &to, &silent).await?;
    ensure!(
        matches!(&refused, Beat::Refused(why) if why.contains(&silent)),
        "{refused:?}"
    );

    // The healthy one stays connected over many of its TTLs.
    let since = Instant::now();
    let deadline = since + DEADLINE;
    while beats.load(Ordering::SeqCst) < 10 || since.elapsed() < Duration::from_secs(1) {
        ensure!(
            Instant::now() < deadline,
            "the healthy agent stopped beating"
        );
        ensure!(!beating.is_finished(), "{:?}", beating.await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let state = master.pid().ask(|reply| GetState { reply }.into()).await?;
    ensure!(connected(&state, &healthy), "{state:?}");
    ensure!(!is_unreachable(&state, &healthy), "{state:?}");
    let metrics = master
        .pid()
        .ask(|reply| GetMetrics { reply }.into())
        .await?;
    assert_eq!(metrics.agents_unreachable, 1);

    stop.store(true, Ordering::SeqCst);
    beating.await??;
    node.shutdown();
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ttl_grows_with_the_number_of_agents() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = MasterConfig {
        heartbeats_per_second: 2.0,
        heartbeat_grace: Duration::from_secs(30),
        ..config(dir.path()).await?
    };
    let master = start_leading_retrying(config.clone()).await?;
    let to = master_upid(&master)?;
    let system = System::new();
    let node = agent_node(&system, "agent-1").await?;
    let first = register(&node, &to, 0).await?;
    // One agent: the minimum TTL (1 / 2 per second is 500 ms, above the 200 ms minimum).
    let alone = ttl(&node, &to, &first).await?;
    ensure!(
        alone >= Duration::from_millis(500) && alone < Duration::from_secs(1),
        "TTL for one agent: {alone:?}"
    );
    let mut ids = vec![first];
    for n in 1..10 {
        ids.push(register(&node, &to, n).await?);
    }
    // Ten agents at two heartbeats per second: at least 5 s, staggered by up to as much again.
    for id in &ids {
        let ttl = ttl(&node, &to, id).await?;
        ensure!(
            ttl >= Duration::from_secs(5) && ttl < Duration::from_secs(10),
            "TTL for ten agents: {ttl:?}"
        );
    }
    node.shutdown();
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_from_an_unknown_agent_is_refused() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let master = start_leading_retrying(config(dir.path()).await?).await?;
    let to = master_upid(&master)?;
    let system = System::new();
    let node = agent_node(&system, "agent-1").await?;
    let refused = heartbeat(&node, &to, "no-such-agent").await?;
    ensure!(
        matches!(&refused, Beat::Refused(why) if why.contains("no-such-agent")),
        "{refused:?}"
    );
    let refused = heartbeat(&node, &to, "").await?;
    ensure!(matches!(refused, Beat::Refused(_)), "{refused:?}");
    node.shutdown();
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failover_every_agent_gets_the_long_first_ttl() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = MasterConfig {
        failover_heartbeat_ttl: Duration::from_secs(3),
        reregistration_timeout: Duration::from_secs(60),
        ..config(dir.path()).await?
    };
    let master = start_leading_retrying(config.clone()).await?;
    let system = System::new();
    let node = agent_node(&system, "agent-1").await?;
    let back = register(&node, &master_upid(&master)?, 0).await?;
    let away = register(&node, &master_upid(&master)?, 1).await?;
    master.shutdown().await;

    // The new leader gives both the failover TTL, counted from when it took the lead (after
    // `restarted`).
    let restarted = Instant::now();
    let master = start_leading_retrying(config.clone()).await?;
    let to = master_upid(&master)?;
    let reply = node
        .remote(to.clone())
        .ask_timeout::<pb::ReregisterAgent, pb::RegistrationReply>(
            ASK,
            pb::ReregisterAgent {
                agent_id: back.clone(),
                info: Some(info(0, &node)),
                ..pb::ReregisterAgent::default()
            },
        )
        .await?;
    ensure!(
        reply.result == Some(Registration::AgentId(back.clone())),
        "{reply:?}"
    );
    // A heartbeat from the one still away is refused: it must re-register first.
    let refused = heartbeat(&node, &to, &away).await?;
    ensure!(matches!(refused, Beat::Refused(_)), "{refused:?}");

    // The one that came back never heartbeats: it goes once the failover TTL and grace have
    // passed, not after the 200 ms minimum TTL.
    let state = state_when(&master, "the returned agent marked unreachable", |s| {
        is_unreachable(s, &back)
    })
    .await?;
    let took = restarted.elapsed();
    ensure!(
        took >= config.failover_heartbeat_ttl + config.heartbeat_grace,
        "marked unreachable {took:?} after the restart, before the failover TTL"
    );
    // The one still away is left to the re-registration deadline.
    ensure!(!is_unreachable(&state, &away), "{state:?}");
    ensure!(
        state.agents.iter().any(|a| a.id == away && !a.connected),
        "{state:?}"
    );
    ensure!(state.recovering, "{state:?}");

    node.shutdown();
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_coming_back_is_stored_with_its_jobs_evaluations_in_one_entry()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let master = start_leading_retrying(config(dir.path()).await?).await?;
    let to = master_upid(&master)?;
    let system = System::new();
    let node = agent_node(&system, "agent-1").await?;
    let daemon = model_pb::Job {
        name: "daemon".into(),
        scheduler: model_pb::SchedulerType::System as i32,
        groups: vec![model_pb::TaskGroup {
            name: "d".into(),
            resources: Some(model_pb::Resources {
                cpus: 0.1,
                mem_mb: 16,
            }),
            command: "sleep".into(),
            ..model_pb::TaskGroup::default()
        }],
        ..model_pb::Job::default()
    };
    submit(&master, daemon).await?;
    // It registers, heartbeats once, and goes silent: marked unreachable.
    let agent = register(&node, &to, 0).await?;
    ttl(&node, &to, &agent).await?;
    state_when(&master, "the agent marked unreachable", |s| {
        is_unreachable(s, &agent)
    })
    .await?;

    // It comes back: one raft entry stores its return and the system job's evaluation.
    let before = master
        .pid()
        .ask(|reply| GetMetrics { reply }.into())
        .await?
        .registry_entries;
    let reply = node
        .remote(to.clone())
        .ask_timeout::<pb::ReregisterAgent, pb::RegistrationReply>(
            ASK,
            pb::ReregisterAgent {
                agent_id: agent.clone(),
                info: Some(info(0, &node)),
                ..pb::ReregisterAgent::default()
            },
        )
        .await?;
    ensure!(
        reply.result == Some(Registration::AgentId(agent.clone())),
        "{reply:?}"
    );
    // Once its evaluation is there, only one entry was written (no worker runs here).
    let deadline = Instant::now() + DEADLINE;
    loop {
        let status = job_status(&master, "daemon").await?;
        let back = status
            .evals
            .iter()
            .any(|e| trigger_of(e).contains("AgentUpdate") && trigger_of(e).contains(&agent));
        if back {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "no evaluation: {:?}",
            status.evals
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let after = master
        .pid()
        .ask(|reply| GetMetrics { reply }.into())
        .await?
        .registry_entries;
    assert_eq!(
        after - before,
        1,
        "the return and its evaluations in one entry"
    );
    let state = master.pid().ask(|reply| GetState { reply }.into()).await?;
    ensure!(connected(&state, &agent), "{state:?}");
    node.shutdown();
    master.shutdown().await;
    Ok(())
}

//! A rolling restart of every node, in the order README gives for an upgrade: each standby,
//! then the leader (after handing its leadership over), then each agent, one at a time, with
//! a service job running and another submitted part-way. Nothing is lost: both jobs are in
//! the registry and run their tasks at the end, every agent is back, and `muster status`
//! shows every master's and agent's build.

use anyhow::{Context as _, ensure};
use muster::proto::cluster as pb;
use muster::proto::model as model_pb;
use muster_security::TokenSecret;
use tokio::process::Child;

use crate::common::{
    self, Masters, agent_command, cli_with_token, leader_state_when, spawn_listening, submit,
};

fn sleeper(name: &str, count: u32) -> model_pb::Job {
    model_pb::Job {
        name: name.into(),
        groups: vec![model_pb::TaskGroup {
            name: "main".into(),
            count,
            resources: Some(model_pb::Resources {
                cpus: 0.05,
                mem_mb: 16,
            }),
            command: "sleep".into(),
            args: vec!["600".into()],
            ..model_pb::TaskGroup::default()
        }],
        ..model_pb::Job::default()
    }
}

/// Every agent connected, with its build said, and `jobs` each running `count` tasks.
fn settled(state: &pb::ClusterState, agents: usize, jobs: &[&str], count: usize) -> bool {
    let running = |job: &str| {
        state
            .agents
            .iter()
            .flat_map(|a| &a.tasks)
            .filter(|t| {
                t.framework_id.ends_with(job) && t.state == model_pb::TaskState::Running as i32
            })
            .count()
    };
    state.agents.len() == agents
        && state
            .agents
            .iter()
            .all(|a| a.connected && !a.version.is_empty())
        && jobs.iter().all(|job| running(job) == count)
}

/// Agent `n` (again), on its own data directory and port.
async fn start_agent(
    dir: &std::path::Path,
    n: usize,
    port: &str,
    masters: &[String],
) -> anyhow::Result<Child> {
    let mut command = agent_command(dir, n, "127.0.0.1", masters)?;
    command
        .args(["--listen", port, "--stop-tasks-on-exit"])
        .args(["--hostname", &format!("host-{n}")]);
    spawn_listening(command, &format!("agent {n}")).await
}

/// Stops `child` with SIGTERM and waits for it.
async fn stop(child: &mut Child) -> anyhow::Result<()> {
    common::signal_child(child, libc::SIGTERM)?;
    tokio::time::timeout(common::DEADLINE, child.wait())
        .await
        .context("a node did not stop on SIGTERM")??;
    Ok(())
}

/// `muster status` against `masters` with `token`: its text.
async fn status(masters: &[String], token: &TokenSecret) -> anyhow::Result<String> {
    let output = cli_with_token(masters, token)?
        .arg("status")
        .output()
        .await?;
    ensure!(
        output.status.success(),
        "status: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_restarts_in_upgrade_order_and_nothing_is_lost() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut masters = Masters::new(dir.path(), 3).await?;
    masters.start_all().await?;
    let root = muster_master::testing::bootstrap(&masters.addresses[0]).await?;
    let ports = common::free_ports(2).await?;
    let mut agents = Vec::new();
    for (n, port) in ports.iter().enumerate() {
        agents.push(start_agent(dir.path(), n, port, &masters.addresses).await?);
    }
    let (leader, _) = leader_state_when(&masters.addresses, &root, "agents registered", |s| {
        settled(s, 2, &[], 0)
    })
    .await?;
    submit(&masters.addresses[leader], &root, sleeper("web", 2)).await?;
    leader_state_when(&masters.addresses, &root, "web runs", |s| {
        settled(s, 2, &["web"], 2)
    })
    .await?;

    // Each standby, one at a time; the cluster settles between restarts.
    for index in (0..3).filter(|i| *i != leader) {
        stop(masters.children[index].as_mut().context("a standby")?).await?;
        masters.start(index).await?;
        leader_state_when(&masters.addresses, &root, "a standby back", |s| {
            s.masters.iter().filter(|m| m.healthy == Some(true)).count() == 3
        })
        .await?;
    }
    // A job submitted part-way.
    let (now, _) = leader_state_when(&masters.addresses, &root, "a leader", |_| true).await?;
    submit(&masters.addresses[now], &root, sleeper("api", 1)).await?;

    // The leader hands its leadership over, then restarts.
    let mut client = muster_master::testing::operator(&masters.addresses[now], Some(&root)).await?;
    let moved = client
        .transfer_leadership(pb::TransferLeadershipRequest { to: None })
        .await?
        .into_inner();
    ensure!(
        moved.leader != now as u64 + 1,
        "leadership stayed: {moved:?}"
    );
    stop(masters.children[now].as_mut().context("the old leader")?).await?;
    masters.start(now).await?;
    leader_state_when(&masters.addresses, &root, "the old leader back", |s| {
        s.masters.iter().filter(|m| m.healthy == Some(true)).count() == 3
    })
    .await?;

    // Each agent, one at a time: its tasks stop with it and are placed again.
    for (n, agent) in agents.iter_mut().enumerate() {
        stop(agent).await?;
        *agent = start_agent(dir.path(), n, &ports[n], &masters.addresses).await?;
        leader_state_when(&masters.addresses, &root, "the agent back", |s| {
            s.agents.iter().all(|a| a.connected) && s.agents.len() == 2
        })
        .await?;
    }

    // Nothing lost: both jobs run in full on agents that are all back, every master is healthy.
    let (_, state) = leader_state_when(&masters.addresses, &root, "everything back", |s| {
        settled(s, 2, &["web"], 2)
            && settled(s, 2, &["api"], 1)
            && s.masters.len() == 3
            && s.masters
                .iter()
                .all(|m| !m.version.is_empty() && m.healthy == Some(true))
    })
    .await?;
    let version = muster::proto::version::BUILD_VERSION;
    ensure!(
        state.agents.iter().all(|a| a.version == version),
        "{:?}",
        state.agents
    );
    let text = status(&masters.addresses, &root).await?;
    ensure!(
        text.matches(&format!("muster {version}")).count() == 3,
        "status names each master's build: {text}"
    );
    drop(agents);
    common::kill_marked_under(&dir.path().to_string_lossy());
    Ok(())
}

//! A real cluster on loopback: 3 `muster-master` and 5 `muster-agent` processes. The leading
//! master is SIGKILLed three times in a row (and restarted each time); after each kill a new
//! leader is elected, every agent re-registers with it, their tasks are in its state, and no
//! admitted agent is lost.
//!
//! The binaries come from the same target directory as this test: `cargo test --workspace`
//! builds them.

use std::time::Duration;

use anyhow::Context as _;
use common::{Masters, binary, leader_state_when, spawn_listening};
use muster::proto::cluster as pb;
use muster::proto::model as model_pb;
use muster_security::Role;
use muster_security::testing::TestPki;
use tokio::process::{Child, Command};

mod common;

fn all_back(state: &pb::ClusterState, agents: usize) -> bool {
    state.agents.len() == agents
        && state
            .agents
            .iter()
            .all(|a| a.connected && a.tasks.len() == 1)
        && state.unreachable.is_empty()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_survives_three_leader_kills() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut masters = Masters::new(dir.path(), 3).await?;
    for index in 0..3 {
        masters.start(index).await?;
    }
    let root = muster_master::testing::bootstrap(&masters.addresses[0]).await?;

    let mut agents = Vec::new();
    for n in 0..5 {
        let mut command = Command::new(binary("muster-agent")?);
        command
            .args(TestPki::shared().args(Role::Agent, &format!("agent-{n}")))
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--data-dir")
            .arg(dir.path().join(format!("agent-{n}")))
            .arg("--hostname")
            .arg(format!("host-{n}"))
            // The test's tasks end with it.
            .arg("--stop-tasks-on-exit");
        for address in &masters.addresses {
            command.arg("--master").arg(address);
        }
        agents.push(spawn_listening(command, &format!("agent {n}")).await?);
    }

    let (leader, state) =
        leader_state_when(&masters.addresses, &root, "5 agents registering", |s| {
            s.agents.len() == 5 && s.agents.iter().all(|a| a.connected)
        })
        .await?;
    let admitted: Vec<String> = state.agents.iter().map(|a| a.id.clone()).collect();

    // One long task per agent, so there is something to rebuild.
    let mut client =
        muster_master::testing::operator(&masters.addresses[leader], Some(&root)).await?;
    for (n, agent) in admitted.iter().enumerate() {
        client
            .launch_task(pb::LaunchTaskRequest {
                agent_id: agent.clone(),
                framework: Some(pb::Framework {
                    id: "framework-test".into(),
                    name: "test".into(),
                }),
                task: Some(model_pb::Task {
                    id: format!("sleeper-{n}"),
                    command: "sleep".into(),
                    args: vec!["120".into()],
                    ..model_pb::Task::default()
                }),
            })
            .await
            .with_context(|| format!("launching a task on {agent}"))?;
    }
    let mut leader = leader_state_when(&masters.addresses, &root, "tasks running", |s| {
        all_back(s, 5)
    })
    .await?
    .0;

    for round in 1..=3 {
        let mut killed = masters.children[leader].take().context("leader process")?;
        killed.start_kill()?;
        killed.wait().await?;
        let (new_leader, state) = leader_state_when(
            &masters.addresses,
            &root,
            &format!("round {round}: a new leader with every agent back"),
            |s| !s.recovering && all_back(s, 5),
        )
        .await?;
        assert_ne!(new_leader, leader, "round {round}: the killed master leads");
        let mut ids: Vec<String> = state.agents.iter().map(|a| a.id.clone()).collect();
        ids.sort();
        let mut expected = admitted.clone();
        expected.sort();
        assert_eq!(ids, expected, "round {round}: admitted agents lost");
        let mut tasks: Vec<String> = state
            .agents
            .iter()
            .flat_map(|a| a.tasks.iter().map(|t| t.id.clone()))
            .collect();
        tasks.sort();
        assert_eq!(
            tasks,
            (0..5).map(|n| format!("sleeper-{n}")).collect::<Vec<_>>()
        );
        masters.start(leader).await?;
        leader = new_leader;
    }

    for child in agents
        .iter_mut()
        .chain(masters.children.iter_mut().flatten())
    {
        terminate(child).await?;
    }
    Ok(())
}

/// SIGTERM, so the agent stops (and, with `--stop-tasks-on-exit`, kills) its tasks, then wait.
async fn terminate(child: &mut Child) -> anyhow::Result<()> {
    if let Some(pid) = child.id() {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status()
            .await;
    }
    match tokio::time::timeout(Duration::from_secs(10), child.wait()).await {
        Ok(status) => status.map(drop).context("waiting for a child"),
        Err(_) => {
            child.start_kill()?;
            child.wait().await.map(drop).context("killing a child")
        }
    }
}

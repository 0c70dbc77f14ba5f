//! An agent certificate speaks only for its own agent, and only of what a master gave it: a
//! status update for a task no master launched there is refused, so a job never counts a
//! task that does not run.

use std::time::Duration;

use anyhow::bail;
use muster_actor::{System, Upid};
use muster_master::requests::GetState;
use muster_master::testing;
use muster_master::{MasterConfig, MasterServer};
use muster_proto::cluster as pb;
use muster_proto::model as model_pb;
use muster_security::Role;
use muster_security::testing::TestPki;
use muster_transport::Node;

const ASK: Duration = Duration::from_secs(10);

/// Registers an agent of `node` (with its own certificate) at `master`; its id.
async fn register(node: &Node, master: &Upid) -> anyhow::Result<String> {
    let registered = node
        .remote(master.clone())
        .ask_timeout::<pb::RegisterAgent, pb::RegistrationReply>(
            ASK,
            pb::RegisterAgent {
                info: Some(model_pb::AgentInfo {
                    hostname: "claimant".into(),
                    address: format!("agent@{}", node.address()),
                    resources: Some(model_pb::Resources {
                        cpus: 4.0,
                        mem_mb: 4096,
                    }),
                    ..model_pb::AgentInfo::default()
                }),
                ..pb::RegisterAgent::default()
            },
        )
        .await?;
    match registered.result {
        Some(pb::registration_reply::Result::AgentId(id)) => Ok(id),
        other => bail!("registration failed: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_for_a_task_never_launched_there_is_refused() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let master: MasterServer = testing::start_leading(MasterConfig {
        listen: "127.0.0.1:0".into(),
        data_dir: dir.path().join("master"),
        ..MasterConfig::new(TestPki::shared().security(Role::Master, "master-1"))
    })
    .await?;
    let master_upid: Upid = format!("master@{}", master.address()).parse()?;
    let node = Node::bind(
        &System::new(),
        "127.0.0.1:0",
        TestPki::shared().security(Role::Agent, "agent-a"),
    )
    .await?;
    let agent_id = register(&node, &master_upid).await?;

    // Its own agent id, its own certificate, a task nobody launched.
    node.remote(master_upid.clone())
        .tell(pb::TaskStatusUpdate {
            agent_id: agent_id.clone(),
            task: Some(model_pb::Task {
                id: "svcp.g[0]-0badf00d".into(),
                name: "svcp.g[0]".into(),
                framework_id: "svcp".into(),
                job: "svcp".into(),
                group: "g".into(),
                state: model_pb::TaskState::Running as i32,
                command: "sleep".into(),
                resources: Some(model_pb::Resources {
                    cpus: 1.0,
                    mem_mb: 64,
                }),
                ..model_pb::Task::default()
            }),
        })?;
    // The link is ordered: once a second registration over it is answered (the same id), the
    // update has been handled.
    assert_eq!(register(&node, &master_upid).await?, agent_id);

    let state = master.pid().ask(|reply| GetState { reply }.into()).await?;
    let planted: Vec<&model_pb::Task> = state
        .agents
        .iter()
        .flat_map(|agent| &agent.tasks)
        .filter(|task| task.id == "svcp.g[0]-0badf00d")
        .collect();
    assert!(
        planted.is_empty(),
        "a planted task was counted: {planted:?}"
    );

    node.shutdown();
    master.shutdown().await;
    Ok(())
}

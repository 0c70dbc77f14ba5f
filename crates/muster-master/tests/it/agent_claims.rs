//! An agent certificate speaks only for its own agent, and only of what a master gave it: a
//! status update for a task no master launched there is refused, so a job never counts a
//! task that does not run.

use std::time::Duration;

use muster_actor::{System, Upid};
use muster_proto::cluster as pb;
use muster_proto::model as model_pb;
use muster_transport::Node;

use crate::common::{agent_node, master_upid, register_played, start_master, state};

const ASK: Duration = Duration::from_secs(10);

/// Registers an agent of `node` (with its own certificate) at `master`; its id.
async fn register(node: &Node, master: &Upid) -> anyhow::Result<String> {
    let info = model_pb::AgentInfo {
        hostname: "claimant".into(),
        address: format!("agent@{}", node.address()),
        resources: Some(model_pb::Resources {
            cpus: 4.0,
            mem_mb: 4096,
        }),
        ..model_pb::AgentInfo::default()
    };
    register_played(node, master, info, ASK).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_for_a_task_never_launched_there_is_refused() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let master = start_master(dir.path()).await?;
    let master_upid = master_upid(&master)?;
    let node = agent_node(&System::new(), "agent-a").await?;
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

    let state = state(&master).await?;
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

/// What the master answers a registration of `info` from `node`.
async fn registration(
    node: &Node,
    master: &Upid,
    info: model_pb::AgentInfo,
) -> anyhow::Result<Option<pb::registration_reply::Result>> {
    let reply: pb::RegistrationReply = node
        .remote(master.clone())
        .ask_timeout(
            ASK,
            pb::RegisterAgent {
                info: Some(info),
                ..pb::RegisterAgent::default()
            },
        )
        .await?;
    Ok(reply.result)
}

fn info_at(address: String, hostname: &str) -> model_pb::AgentInfo {
    model_pb::AgentInfo {
        hostname: hostname.into(),
        address,
        resources: Some(model_pb::Resources {
            cpus: 1e308,
            mem_mb: 4096,
        }),
        ..model_pb::AgentInfo::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_certificate_holds_one_agent_at_an_address_it_names() -> anyhow::Result<()> {
    use pb::registration_reply::Result as Answer;
    let dir = tempfile::tempdir()?;
    let master = start_master(dir.path()).await?;
    let master_upid = master_upid(&master)?;
    let system = System::new();
    let node = agent_node(&system, "agent-a").await?;
    let first = register(&node, &master_upid).await?;

    // A second agent behind the same certificate, at another address: refused while the
    // first is connected, naming the certificate.
    let port = node
        .address()
        .rsplit_once(':')
        .map_or("1", |(_, port)| port);
    let second = registration(
        &node,
        &master_upid,
        info_at(format!("agent-2@127.0.0.1:{port}"), "another-host"),
    )
    .await?;
    match second {
        Some(Answer::Refused(why)) => assert!(
            why.contains("\"agent-a\"") && why.contains("certificate of its own"),
            "{why}"
        ),
        other => anyhow::bail!("a second agent was admitted on one certificate: {other:?}"),
    }

    // An address whose host the certificate does not name (another machine's, say): refused.
    let elsewhere = registration(
        &node,
        &master_upid,
        info_at("agent@10.9.8.7:5051".into(), "claimant"),
    )
    .await?;
    match elsewhere {
        Some(Answer::Refused(why)) => {
            assert!(
                why.contains("\"10.9.8.7\"") && why.contains("agent-a"),
                "{why}"
            )
        }
        other => anyhow::bail!("an unproven address was admitted: {other:?}"),
    }

    let state = state(&master).await?;
    let ids: Vec<&str> = state.agents.iter().map(|a| a.id.as_str()).collect();
    assert_eq!(ids, [first.as_str()], "one agent only");
    node.shutdown();
    master.shutdown().await;
    Ok(())
}

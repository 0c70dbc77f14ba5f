//! Ports end to end, with a real master and a real agent running real processes: each task of
//! a group with a dynamic and a static port gets its own dynamic port from the agent's range
//! and finds both in its environment; a second task asking for the held static port waits,
//! and the applier refuses a plan that would put one port on one agent twice.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use muster_master::requests::StopJob;
use muster_master::testing::{job_when, operator, submit};
use muster_proto::cluster as pb;
use muster_proto::model as model_pb;

use muster_scheduler::Backend;

use crate::common::{OneAgentCluster, one_agent_cluster};
use crate::plans_bound::Cluster;

/// A service job of `count` tasks, each with a dynamic port `http` and the static port
/// `admin` (when given), printing its environment's view of them and then sleeping.
fn web(name: &str, count: u32, admin: Option<u32>) -> model_pb::Job {
    let mut ports = vec![model_pb::PortRequest {
        label: "http".into(),
        static_port: 0,
    }];
    if let Some(admin) = admin {
        ports.push(model_pb::PortRequest {
            label: "admin".into(),
            static_port: admin,
        });
    }
    model_pb::Job {
        name: name.into(),
        scheduler: model_pb::SchedulerType::Service as i32,
        groups: vec![model_pb::TaskGroup {
            name: "fe".into(),
            count,
            resources: Some(model_pb::Resources {
                cpus: 0.1,
                mem_mb: 16,
            }),
            command: "sh".into(),
            args: vec![
                "-c".into(),
                "echo \"port=$MUSTER_PORT_HTTP addr=$MUSTER_ADDR_HTTP admin=$MUSTER_PORT_ADMIN\"; \
                 exec sleep 60"
                    .into(),
            ],
            ports,
            ..model_pb::TaskGroup::default()
        }],
        ..model_pb::Job::default()
    }
}

fn running(task: &pb::JobTask) -> bool {
    task.task
        .as_ref()
        .is_some_and(|t| t.state == model_pb::TaskState::Running as i32)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_task_gets_its_own_ports_in_its_environment() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let OneAgentCluster {
        master,
        agent,
        root,
        ..
    } = one_agent_cluster(dir.path()).await?;
    submit(&master, web("web", 2, None)).await?;
    let status = job_when(&master, "web", "both tasks run", |status| {
        status.tasks.iter().filter(|t| running(t)).count() == 2
    })
    .await?;
    let mut client = operator(master.address(), Some(&root)).await?;
    let mut ports = BTreeSet::new();
    for task in status.tasks.iter().filter_map(|t| t.task.as_ref()) {
        let [given] = task.ports.as_slice() else {
            anyhow::bail!("one port for {}: {:?}", task.id, task.ports);
        };
        ensure!(given.label == "http", "{given:?}");
        ensure!((20_000..=32_000).contains(&given.port), "{given:?}");
        ensure!(ports.insert(given.port), "port {} given twice", given.port);
        // The task's own output says what it found in its environment.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let output = loop {
            let logs = client
                .task_logs(pb::ReadTaskOutput {
                    task_id: task.id.clone(),
                    ..pb::ReadTaskOutput::default()
                })
                .await?
                .into_inner();
            let text = String::from_utf8_lossy(&logs.data).into_owned();
            if text.contains("port=") || tokio::time::Instant::now() > deadline {
                break text;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        ensure!(
            output.contains(&format!(
                "port={} addr=127.0.0.1:{} admin=\n",
                given.port, given.port
            )),
            "task {} printed {output:?}",
            task.id
        );
    }
    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_static_port_keeps_a_second_task_off_the_agent() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let OneAgentCluster { master, agent, .. } = one_agent_cluster(dir.path()).await?;
    submit(&master, web("first", 1, Some(9_300))).await?;
    job_when(&master, "first", "its task runs", |s| {
        s.tasks.iter().any(running)
    })
    .await?;
    submit(&master, web("second", 1, Some(9_300))).await?;
    let status = job_when(&master, "second", "its evaluation is blocked", |s| {
        s.evals
            .iter()
            .any(|e| e.status == model_pb::EvalStatus::Blocked as i32)
    })
    .await?;
    ensure!(status.tasks.is_empty(), "{:?}", status.tasks);
    // Once the first job stops, the port is free and the second takes it.
    master
        .pid()
        .ask(|reply| {
            StopJob {
                name: "first".into(),
                reply,
            }
            .into()
        })
        .await?
        .map_err(anyhow::Error::msg)?;
    let status = job_when(&master, "second", "its task runs", |s| {
        s.tasks.iter().any(running)
    })
    .await?;
    let task = status
        .tasks
        .iter()
        .find_map(|t| t.task.as_ref())
        .context("a task")?;
    ensure!(
        task.ports
            .iter()
            .any(|p| p.label == "admin" && p.port == 9_300),
        "{:?}",
        task.ports
    );
    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_applier_refuses_a_port_held_twice_or_not_as_asked() -> anyhow::Result<()> {
    let cluster = Cluster::start().await?;
    // A scheduler's plan for three tasks with a dynamic port each, tampered with by hand:
    // the second reuses the first's port, the third takes one outside the agent's range.
    submit(&cluster.master, web("web", 3, None)).await?;
    let assignment = cluster
        .dequeue(&["web"])
        .await?
        .remove("web")
        .context("web's evaluation")?;
    let mut plan = cluster.plan(&assignment).await?;
    ensure!(plan.place.len() == 3, "{plan:?}");
    let first_port = plan.place[0].ports[0].port;
    plan.place[1].ports[0].port = first_port;
    plan.place[2].ports[0].port = 80;
    let result = cluster.backend.submit(plan).await?;
    let names = |placements: &[muster_scheduler::Placement]| -> Vec<String> {
        placements.iter().map(|p| p.name.clone()).collect()
    };
    ensure!(names(&result.committed) == ["web.fe[0]"], "{result:?}");
    ensure!(
        names(&result.rejected) == ["web.fe[1]", "web.fe[2]"],
        "{result:?}"
    );
    let live = cluster.live_tasks("web").await?;
    let held: Vec<u32> = live
        .iter()
        .flat_map(|t| t.ports.iter().map(|p| p.port))
        .collect();
    ensure!(held == [u32::from(first_port)], "{live:?}");

    // A static port given as another number than the job asks for.
    submit(&cluster.master, web("admin", 1, Some(9_400))).await?;
    let assignment = cluster
        .dequeue(&["admin"])
        .await?
        .remove("admin")
        .context("admin's evaluation")?;
    let mut plan = cluster.plan(&assignment).await?;
    ensure!(plan.place.len() == 1, "{plan:?}");
    plan.place[0].ports[1].port = 9_401;
    let result = cluster.backend.submit(plan).await?;
    ensure!(
        result.committed.is_empty() && result.rejected.len() == 1,
        "{result:?}"
    );
    cluster.shutdown().await;
    Ok(())
}

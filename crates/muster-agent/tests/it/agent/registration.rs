//! Registration: the id kept on disk, a restarted agent re-registering with its tasks,
//! "not leader" hints, refusals, a master lost or silent, and pings.

use super::*;

/// The ids of `tasks`, sorted.
fn ids(tasks: &[Task]) -> Vec<&str> {
    let mut ids: Vec<&str> = tasks.iter().map(|t| t.id.as_str()).collect();
    ids.sort_unstable();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_registration_stores_the_id_on_disk() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-1".into())).await?;
    let agent = AgentNode::start(config(&[master.address()], dir.path())).await?;

    let request = master.next_register().await?;
    let info = request.info.context("RegisterAgent without info")?;
    assert_eq!(info.address, agent.upid().to_string());
    assert_eq!(info.hostname, "test-host");
    assert_eq!(info.attributes.get("rack").map(String::as_str), Some("r1"));
    let resources = info.resources.context("no resources")?;
    assert_eq!((resources.cpus, resources.mem_mb), (4.0, 8192));

    let (id, with) = tokio::time::timeout(PATIENCE, agent.handle.registered()).await??;
    assert_eq!(id, "agent-1");
    assert_eq!(with, master.upid()?);
    let stored = std::fs::read_to_string(dir.path().join("agent_id"))?;
    assert_eq!(stored.trim(), "agent-1");
    assert!(!dir.path().join("agent_id.tmp").exists());
    assert_eq!(agent.handle.agent_id().await?.as_deref(), Some("agent-1"));

    let pong = master.ping(agent.upid()).await?;
    assert_eq!(pong.agent_id, "agent-1");
    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_reregisters_with_its_stored_id_and_tasks() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-7".into())).await?;
    let first = AgentNode::start(config(&[master.address()], dir.path())).await?;
    master.next_register().await?;
    first.registered_with(&master.upid()?).await?;

    let reply = master
        .run_task(first.upid(), shell_task("done", "exit 0"))
        .await?;
    assert_eq!(reply.error, "");
    let reply = master
        .run_task(first.upid(), shell_task("long", "sleep 30"))
        .await?;
    assert_eq!(reply.error, "");
    first
        .wait_until("task `done` to finish", |s| {
            state_of(&s.completed_tasks, "done") == Some(TaskState::Finished)
        })
        .await?;
    // What the metrics say: two launches, one task running (a process), one finished, no
    // re-registration yet.
    let figures = first.handle.figures().await?;
    assert!(figures.registered, "{figures:?}");
    assert_eq!((figures.launches, figures.launch_failures), (2, 0));
    assert_eq!(figures.reregistrations, 0);
    assert_eq!(figures.running.len(), 1, "{figures:?}");
    assert_eq!(figures.running[0].task_id, "long");
    assert!(
        figures.running[0].pid.is_some_and(|pid| pid > 0),
        "{figures:?}"
    );
    assert_eq!(
        figures.completed,
        std::collections::BTreeMap::from([("finished".to_owned(), 1)])
    );
    first.stop().await;

    // A new node (new address), same data directory.
    let second = AgentNode::start(config(&[master.address()], dir.path())).await?;
    let request = master.next_reregister().await?;
    assert_eq!(request.agent_id, "agent-7");
    let info = request.info.context("ReregisterAgent without info")?;
    assert_eq!(info.address, second.upid().to_string());
    assert_eq!(
        state_of(&request.completed_tasks, "done"),
        Some(TaskState::Finished)
    );
    // This agent kills its tasks when it stops: the new one reports it killed.
    assert_eq!(
        state_of(&request.completed_tasks, "long"),
        Some(TaskState::Killed)
    );
    assert!(request.tasks.is_empty(), "{:?}", request.tasks);
    assert_eq!(request.completed_frameworks, vec![framework()]);
    assert_eq!(second.registered_with(&master.upid()?).await?, "agent-7");
    assert!(master.got_nothing(), "no fresh RegisterAgent");
    let figures = second.handle.figures().await?;
    assert_eq!(figures.reregistrations, 1, "{figures:?}");
    assert_eq!(figures.completed.get("killed"), Some(&1), "{figures:?}");

    // Task ids stay unique across the restart.
    let reply = master
        .run_task(second.upid(), shell_task("done", "exit 0"))
        .await?;
    assert!(reply.error.contains("already exists"), "{}", reply.error);
    second.stop().await;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_not_leader_hint_sends_the_agent_to_the_leader() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut leader = MasterNode::start(Answer::Admit("agent-b".into())).await?;
    let mut standby = MasterNode::start(Answer::NotLeader(leader.upid()?.to_string())).await?;
    // Only the standby is configured: the agent can find the leader by the hint alone.
    let agent = AgentNode::start(config(&[standby.address()], dir.path())).await?;

    standby.next_register().await?;
    leader.next_register().await?;
    assert_eq!(agent.registered_with(&leader.upid()?).await?, "agent-b");
    agent.stop().await;
    standby.shutdown().await;
    leader.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_hint_sends_the_agent_to_the_next_master() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut standby = MasterNode::start(Answer::NotLeader(String::new())).await?;
    let mut leader = MasterNode::start(Answer::Admit("agent-c".into())).await?;
    let agent =
        AgentNode::start(config(&[standby.address(), leader.address()], dir.path())).await?;

    standby.next_register().await?;
    leader.next_register().await?;
    assert_eq!(agent.registered_with(&leader.upid()?).await?, "agent-c");
    agent.stop().await;
    standby.shutdown().await;
    leader.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_is_retried_later() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Refuse("not today".into())).await?;
    let agent = AgentNode::start(config(&[master.address()], dir.path())).await?;

    master.next_register().await?;
    ensure!(matches!(
        *agent.handle.status().borrow(),
        AgentStatus::Registering
    ));
    master.set_answer(Answer::Admit("agent-r".into()));
    // The agent comes back after its backoff, without anyone prodding it.
    master.next_register().await?;
    assert_eq!(agent.registered_with(&master.upid()?).await?, "agent-r");
    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_master_node_moves_the_agent_and_its_running_task_to_another_master()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut a = MasterNode::start(Answer::Admit("agent-9".into())).await?;
    let mut b = MasterNode::start(Answer::Admit("from-b".into())).await?;
    let agent = AgentNode::start(config(&[a.address(), b.address()], dir.path())).await?;
    a.next_register().await?;
    assert_eq!(agent.registered_with(&a.upid()?).await?, "agent-9");

    let reply = a
        .run_task(agent.upid(), shell_task("long", "sleep 30"))
        .await?;
    assert_eq!(reply.error, "");
    let reply = a
        .run_task(agent.upid(), shell_task("quick", "exit 0"))
        .await?;
    assert_eq!(reply.error, "");
    agent
        .wait_until("task `quick` to finish", |s| {
            state_of(&s.completed_tasks, "quick") == Some(TaskState::Finished)
        })
        .await?;

    a.shutdown().await;
    let request = b.next_reregister().await?;
    assert_eq!(request.agent_id, "agent-9");
    assert_eq!(state_of(&request.tasks, "long"), Some(TaskState::Running));
    assert_eq!(
        state_of(&request.completed_tasks, "quick"),
        Some(TaskState::Finished)
    );
    assert_eq!(request.frameworks, vec![framework()]);
    assert_eq!(agent.registered_with(&b.upid()?).await?, "agent-9");
    let snapshot = agent.handle.snapshot().await?;
    assert_eq!(state_of(&snapshot.tasks, "long"), Some(TaskState::Running));
    agent.stop().await;
    b.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_tasks_go_grouped_by_labels_only_to_a_master_that_said_it_reads_them()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut a = MasterNode::start(Answer::Admit("agent-7".into())).await?;
    let mut b = MasterNode::start(Answer::Admit("agent-7".into())).await?;
    b.read_grouped_tasks();
    let agent = AgentNode::start(config(&[a.address(), b.address()], dir.path())).await?;
    a.next_register().await?;
    agent.registered_with(&a.upid()?).await?;
    let web = vec![Label {
        key: "tier".into(),
        value: "web".into(),
    }];
    let mut labelled = shell_task("labelled", "sleep 30");
    if let Some(task) = labelled.task.as_mut() {
        task.labels.clone_from(&web);
    }
    for request in [labelled, shell_task("plain", "sleep 30")] {
        assert_eq!(a.run_task(agent.upid(), request).await?.error, "");
    }
    agent
        .wait_until("both tasks to run", |s| s.tasks.len() == 2)
        .await?;
    let expect_grouped = |request: &ReregisterAgent| {
        assert_eq!(ids(&request.tasks), ["plain"]);
        assert_eq!(request.tasks_sharing_labels.len(), 1);
        let group = &request.tasks_sharing_labels[0];
        assert_eq!(group.labels, web);
        assert_eq!(ids(&group.tasks), ["labelled"]);
        assert!(group.tasks[0].labels.is_empty());
    };
    let expect_whole = |request: &ReregisterAgent| {
        assert!(request.tasks_sharing_labels.is_empty());
        assert_eq!(ids(&request.tasks), ["labelled", "plain"]);
        assert_eq!(
            find(&request.tasks, "labelled").map(|t| &t.labels),
            Some(&web)
        );
    };

    // b leads, and says it reads them.
    b.announce(agent.upid(), 1)?;
    expect_grouped(&b.next_reregister().await?);
    agent.registered_with(&b.upid()?).await?;
    // a leads, and does not.
    a.announce(agent.upid(), 2)?;
    expect_whole(&a.next_reregister().await?);
    agent.registered_with(&a.upid()?).await?;
    b.announce(agent.upid(), 3)?;
    expect_grouped(&b.next_reregister().await?);
    agent.registered_with(&b.upid()?).await?;

    // b's node goes, and a master of an earlier version comes up at its address: it never
    // said it reads them. a sends the agent there.
    let address = b.address();
    b.shutdown().await;
    a.set_answer(Answer::NotLeader(format!("master@{address}")));
    let mut older = MasterNode::start_on(&address, Answer::Admit("agent-7".into())).await?;
    expect_whole(&older.next_reregister().await?);
    agent.registered_with(&older.upid()?).await?;

    agent.stop().await;
    a.shutdown().await;
    older.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_master_counts_as_lost() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-s".into())).await?;
    let mut config = config(&[master.address()], dir.path());
    config.master_silence_timeout = Duration::from_millis(300);
    let agent = AgentNode::start(config).await?;
    master.next_register().await?;
    agent.registered_with(&master.upid()?).await?;
    // The fake master never pings: the agent gives up on it and re-registers.
    let request = master.next_reregister().await?;
    assert_eq!(request.agent_id, "agent-s");
    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pings_keep_the_master_from_counting_as_lost() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-p".into())).await?;
    let mut config = config(&[master.address()], dir.path());
    config.master_silence_timeout = Duration::from_secs(1);
    let agent = AgentNode::start(config).await?;
    master.next_register().await?;
    agent.registered_with(&master.upid()?).await?;
    // Three silence timeouts' worth of pings, ten per timeout (pacing, not synchronisation).
    for _ in 0..30 {
        assert_eq!(master.ping(agent.upid()).await?.agent_id, "agent-p");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ensure!(
        master.got_nothing(),
        "the agent re-registered although pinged"
    );
    ensure!(
        matches!(
            *agent.handle.status().borrow(),
            AgentStatus::Registered { .. }
        ),
        "still registered"
    );
    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

//! Recovery: a restarted agent takes back its running tasks, kills what the master gave up or
//! what it left past its recovery timeout, and refuses commands of an older leader's term.

use super::*;

/// A task that sleeps a minute, sent by a leader of `term`.
fn in_term(id: &str, term: u64) -> RunTask {
    let mut request = shell_task(id, "exec sleep 60");
    request.term = term;
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_takes_back_its_running_tasks_and_the_real_end_of_the_others()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-r".into())).await?;
    let first = AgentNode::start(keeping_config(&[master.address()], dir.path())).await?;
    master.next_register().await?;
    first.registered_with(&master.upid()?).await?;
    let service = "echo $$ > pid; exec sleep 60";
    let batch = "echo $$ > pid; while [ ! -e release ]; do sleep 0.02; done; exit 7";
    for (id, script) in [("service", service), ("batch", batch)] {
        assert_eq!(
            master
                .run_task(first.upid(), shell_task(id, script))
                .await?
                .error,
            ""
        );
    }
    let service_pid = pid_in(&dir.path().join("tasks/service/pid")).await?;
    let batch_pid = pid_in(&dir.path().join("tasks/batch/pid")).await?;
    first.stop().await;
    ensure!(
        !has_ended(service_pid),
        "the service task outlives its agent"
    );

    // The batch task ends while no agent runs.
    std::fs::write(dir.path().join("tasks/batch/release"), "")?;
    ends(batch_pid, "the batch task").await?;
    // Ended is not yet recorded: its executor writes the wait status once it has reaped it.
    // An agent that starts before then finds the executor still there and re-attaches.
    let status = dir.path().join("meta/tasks/batch.status");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !status.exists() {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the executor never recorded the batch task's end in {}",
            status.display()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let second = AgentNode::start(keeping_config(&[master.address()], dir.path())).await?;
    let request = master.next_reregister().await?;
    let service_task = find(&request.tasks, "service").context("service not reported")?;
    assert_eq!(service_task.state, TaskState::Running as i32);
    assert_eq!(request.tasks.len(), 1, "{:?}", request.tasks);
    let batch_task = find(&request.completed_tasks, "batch").context("batch not reported")?;
    assert_eq!(
        (batch_task.state, batch_task.exit_code),
        (TaskState::Failed as i32, 7),
        "{batch_task:?}"
    );
    ensure!(!has_ended(service_pid), "the service task still runs");
    second.registered_with(&master.upid()?).await?;

    // The re-attached task is the agent's as before: a kill reaches it, and its end is seen.
    assert_eq!(master.kill_task(second.upid(), "service").await?.error, "");
    let killed = await_state(&mut master, "service", TaskState::Killed).await?;
    assert_eq!(killed.exit_code, 128 + 15, "{killed:?}");
    ends(service_pid, "the killed service task").await?;
    second.stop().await;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returning_agent_kills_what_the_master_gave_up_and_an_unknown_id_registers_anew()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-g".into())).await?;
    let first = AgentNode::start(keeping_config(&[master.address()], dir.path())).await?;
    master.next_register().await?;
    first.registered_with(&master.upid()?).await?;
    for id in ["replaced", "kept"] {
        let script = "echo $$ > pid; exec sleep 60";
        assert_eq!(
            master
                .run_task(first.upid(), shell_task(id, script))
                .await?
                .error,
            ""
        );
    }
    let replaced = pid_in(&dir.path().join("tasks/replaced/pid")).await?;
    let kept = pid_in(&dir.path().join("tasks/kept/pid")).await?;
    first.stop().await;

    // The master gave `replaced` up while the agent was away: it goes first thing.
    master.set_answer(Answer::AdmitKilling(
        "agent-g".into(),
        vec!["replaced".into()],
    ));
    let second = AgentNode::start(keeping_config(&[master.address()], dir.path())).await?;
    master.next_reregister().await?;
    let killed = await_state(&mut master, "replaced", TaskState::Killed).await?;
    assert_eq!(killed.exit_code, 128 + 9, "{killed:?}");
    ends(replaced, "the replaced task").await?;
    ensure!(!has_ended(kept), "the task the master still wants runs on");
    second.stop().await;

    // The master does not know the id at all: the agent's tasks go, and it registers anew,
    // forgetting the term it followed (a rebuilt cluster counts its terms from the start).
    std::fs::write(dir.path().join("meta/term"), "9\n")?;
    master.set_answer(Answer::Forgotten("agent-h".into()));
    let third = AgentNode::start(keeping_config(&[master.address()], dir.path())).await?;
    let refused = master.next_reregister().await?;
    assert_eq!(refused.agent_id, "agent-g");
    master.next_register().await?;
    assert_eq!(third.registered_with(&master.upid()?).await?, "agent-h");
    ends(kept, "a task run under the unknown id").await?;
    assert_eq!(
        muster_agent::store::read_agent_id(dir.path())?.as_deref(),
        Some("agent-h")
    );
    assert_eq!(third.handle.snapshot().await?.term, 0);
    assert_eq!(
        master
            .run_task(third.upid(), shell_task("after", "exit 0"))
            .await?
            .error,
        "",
        "a command of the new cluster's term 0 is obeyed"
    );
    third.stop().await;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_down_past_its_recovery_timeout_kills_what_it_left_before_registering()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-t".into())).await?;
    let first = AgentNode::start(keeping_config(&[master.address()], dir.path())).await?;
    master.next_register().await?;
    first.registered_with(&master.upid()?).await?;
    let script = "echo $$ > pid; exec sleep 60";
    assert_eq!(
        master
            .run_task(first.upid(), shell_task("stale", script))
            .await?
            .error,
        ""
    );
    let pid = pid_in(&dir.path().join("tasks/stale/pid")).await?;
    // The task's files belong to the user it runs as.
    let owner = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(
        dir.path().join("tasks/stale/stdout"),
    )?);
    assert_eq!(owner, uid_of(pid)?, "stdout belongs to the task's user");
    first.stop().await;
    ensure!(!has_ended(pid), "the task outlives its agent");

    // The agent was last alive an hour ago: past its 15-minute recovery timeout. The file
    // holds that time (milliseconds since the Unix epoch).
    let alive = std::fs::read_to_string(dir.path().join("meta/alive"))?;
    let alive_ms: u64 = alive.trim().parse().context("meta/alive holds no time")?;
    let hour_ago = alive_ms.saturating_sub(3_600_000);
    std::fs::write(dir.path().join("meta/alive"), format!("{hour_ago}\n"))?;
    let second = AgentNode::start(keeping_config(&[master.address()], dir.path())).await?;
    let request = master.next_reregister().await?;
    // Killed before the agent said anything to the master.
    ensure!(
        has_ended(pid),
        "the stale task still ran at re-registration"
    );
    assert!(request.tasks.is_empty(), "{:?}", request.tasks);
    let stale = find(&request.completed_tasks, "stale").context("stale not reported")?;
    assert_eq!(stale.state, TaskState::Killed as i32, "{stale:?}");
    assert!(stale.message.contains("recovery timeout"), "{stale:?}");
    second.stop().await;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_of_an_older_leader_term_are_refused_counted_and_remembered_across_restarts()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::AdmitInTerm("agent-f".into(), 5)).await?;
    let agent = AgentNode::start(config(&[master.address()], dir.path())).await?;
    master.next_register().await?;
    agent.registered_with(&master.upid()?).await?;
    agent
        .wait_until("the agent to follow term 5", |s| s.term == 5)
        .await?;
    // A deposed leader of term 4 cannot launch or kill.
    let refused = master.run_task(agent.upid(), in_term("old", 4)).await?;
    assert!(
        refused.error.contains("term 4") && refused.error.contains("follows term 5"),
        "{}",
        refused.error
    );
    let remote = master.node.remote(agent.upid().clone());
    remote.tell(LaunchTasks {
        tasks: vec![in_term("old-launch", 4)],
        term: 4,
        ..Default::default()
    })?;
    assert_eq!(
        master
            .run_task(agent.upid(), in_term("new", 5))
            .await?
            .error,
        ""
    );
    let kill = KillTask {
        task_id: "new".into(),
        term: 3,
    };
    let refused: KillTaskReply = remote.ask_timeout(PATIENCE, kill).await?;
    assert!(refused.error.contains("term 3"), "{}", refused.error);
    let snapshot = agent
        .wait_until("three refusals", |s| s.stale_commands_refused == 3)
        .await?;
    assert!(
        find(&snapshot.tasks, "new").is_some(),
        "{:?}",
        snapshot.tasks
    );
    for stale in ["old", "old-launch"] {
        assert!(!snapshot.tasks.iter().any(|t| t.id == stale));
        assert!(!snapshot.completed_tasks.iter().any(|t| t.id == stale));
    }
    agent.stop().await;

    // The promise holds across a restart, before any master speaks to the agent.
    master.set_answer(Answer::Refuse("not now".into()));
    let restarted = AgentNode::start(config(&[master.address()], dir.path())).await?;
    let snapshot = restarted.handle.snapshot().await?;
    assert_eq!(snapshot.term, 5);
    let refused = master
        .run_task(restarted.upid(), in_term("older", 2))
        .await?;
    assert!(refused.error.contains("term 2"), "{}", refused.error);
    restarted.stop().await;
    master.shutdown().await;
    Ok(())
}

/// No single command moves the agent's term: a kill claiming term 1,000,000 is obeyed, as a
/// command of a term no older than the agent's is, but the agent goes on following the term
/// its leader answered it with, so that leader's next launch runs, before and after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_claiming_a_higher_term_does_not_fence_the_agent() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::AdmitInTerm("agent-h".into(), 5)).await?;
    let agent = AgentNode::start(config(&[master.address()], dir.path())).await?;
    master.next_register().await?;
    agent.registered_with(&master.upid()?).await?;
    agent
        .wait_until("the agent to follow term 5", |s| s.term == 5)
        .await?;
    assert_eq!(
        master
            .run_task(agent.upid(), in_term("first", 5))
            .await?
            .error,
        ""
    );
    let claim = KillTask {
        task_id: "first".into(),
        term: 1_000_000,
    };
    let remote = master.node.remote(agent.upid().clone());
    let answer: KillTaskReply = remote.ask_timeout(PATIENCE, claim).await?;
    assert_eq!(answer.error, "", "the kill itself is obeyed");
    assert_eq!(agent.handle.snapshot().await?.term, 5);
    assert_eq!(
        master
            .run_task(agent.upid(), in_term("second", 5))
            .await?
            .error,
        "",
        "the leader of term 5 still commands the agent"
    );
    agent.stop().await;

    master.set_answer(Answer::Refuse("not now".into()));
    let restarted = AgentNode::start(config(&[master.address()], dir.path())).await?;
    assert_eq!(restarted.handle.snapshot().await?.term, 5);
    restarted.stop().await;
    master.shutdown().await;
    Ok(())
}

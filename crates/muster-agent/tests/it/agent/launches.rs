//! Launches: tasks run as real children, launches refused for an earlier registration or
//! past their deadline, and the updates the master is told of, sent again after a
//! re-registration.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_task_runs_real_children_and_refuses_bad_requests() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-t".into())).await?;
    let agent = AgentNode::start(config(&[master.address()], dir.path())).await?;
    master.next_register().await?;
    agent.registered_with(&master.upid()?).await?;
    let to = agent.upid().clone();

    let mut with_env = shell_task("fail", "echo \"$GREETING\" > out.txt; exit 3");
    if let Some(task) = with_env.task.as_mut() {
        task.env.insert("GREETING".into(), "hello".into());
    }
    assert_eq!(master.run_task(&to, with_env).await?.error, "");
    assert_eq!(
        master
            .run_task(&to, shell_task("long", "sleep 30"))
            .await?
            .error,
        ""
    );
    let snapshot = agent
        .wait_until("task `fail` to complete", |s| {
            find(&s.completed_tasks, "fail").is_some()
        })
        .await?;
    let failed = find(&snapshot.completed_tasks, "fail").context("fail")?;
    assert_eq!(TaskState::try_from(failed.state)?, TaskState::Failed);
    assert_eq!(failed.exit_code, 3);
    assert_eq!(failed.framework_id, "fw-1");
    assert_eq!(state_of(&snapshot.tasks, "long"), Some(TaskState::Running));
    assert_eq!(snapshot.frameworks, vec![framework()]);
    // It ran in its own working directory, with its environment.
    let out = std::fs::read_to_string(dir.path().join("tasks/fail/out.txt"))?;
    assert_eq!(out.trim(), "hello");

    // A command that cannot start: an error naming it, nothing running.
    let mut bad = shell_task("bad", "");
    if let Some(task) = bad.task.as_mut() {
        task.command = "/nonexistent/muster-test-command".into();
        task.args.clear();
    }
    let error = master.run_task(&to, bad).await?.error;
    assert!(
        error.contains("/nonexistent/muster-test-command") && error.contains("bad"),
        "{error}"
    );
    let snapshot = agent.handle.snapshot().await?;
    assert!(find(&snapshot.tasks, "bad").is_none());
    assert!(find(&snapshot.completed_tasks, "bad").is_none());

    // Duplicates, and requests that name no framework or no usable id.
    let error = master
        .run_task(&to, shell_task("long", "exit 0"))
        .await?
        .error;
    assert!(error.contains("already exists"), "{error}");
    let error = master
        .run_task(&to, shell_task("fail", "exit 0"))
        .await?
        .error;
    assert!(error.contains("already exists"), "{error}");
    let mut no_framework = shell_task("orphan", "exit 0");
    no_framework.framework = None;
    let error = master.run_task(&to, no_framework).await?.error;
    assert!(error.contains("no framework"), "{error}");
    let error = master
        .run_task(&to, shell_task("../escape", "exit 0"))
        .await?
        .error;
    assert!(error.contains("cannot name a directory"), "{error}");
    let error = master
        .run_task(
            &to,
            RunTask {
                framework: Some(framework()),
                task: None,
                term: 0,
            },
        )
        .await?
        .error;
    assert!(error.contains("no task"), "{error}");

    let snapshot = agent.handle.snapshot().await?;
    assert_eq!(snapshot.tasks.len(), 1, "{:?}", snapshot.tasks);
    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn launch_tasks_starts_each_and_reports_refusals_as_failed_updates() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-l".into())).await?;
    let agent = AgentNode::start(config(&[master.address()], dir.path())).await?;
    master.next_register().await?;
    agent.registered_with(&master.upid()?).await?;
    let to = agent.upid().clone();

    let mut bad = shell_task("bad", "");
    if let Some(task) = bad.task.as_mut() {
        task.command = "/nonexistent/muster-launch-command".into();
        task.args.clear();
    }
    // One message, no answer: three tasks, the middle one cannot start, the last repeats a
    // running task's id.
    let launch = LaunchTasks {
        tasks: vec![
            shell_task("first", "sleep 30"),
            bad,
            shell_task("first", "exit 0"),
        ],
        term: 0,
        ..Default::default()
    };
    master.node.remote(to.clone()).tell(launch)?;

    master.expect_started("agent-l", "first").await?;
    // Accepted (STARTING), then its command cannot start: FAILED.
    master
        .expect_update("agent-l", "bad", TaskState::Starting)
        .await?;
    let refused = master
        .expect_update("agent-l", "bad", TaskState::Failed)
        .await?;
    assert!(
        refused
            .message
            .contains("/nonexistent/muster-launch-command"),
        "the reason travels with the update: {:?}",
        refused.message
    );
    assert_eq!(refused.exit_code, -1);
    // The duplicate is refused without an update that would end the running `first`.
    let snapshot = agent.handle.snapshot().await?;
    assert_eq!(state_of(&snapshot.tasks, "first"), Some(TaskState::Running));
    assert!(find(&snapshot.tasks, "bad").is_none());
    // Updates come in order: the next one is for a later launch, none for the duplicate.
    let later = LaunchTasks {
        tasks: vec![shell_task("later", "sleep 30")],
        term: 0,
        ..Default::default()
    };
    master.node.remote(to.clone()).tell(later)?;
    master.expect_started("agent-l", "later").await?;
    // Four launches, two of them refused or failed; the metrics show the two running tasks'
    // memory, read from their cgroups or processes.
    let figures = agent.handle.figures().await?;
    assert_eq!(
        (figures.launches, figures.launch_failures),
        (4, 2),
        "{figures:?}"
    );
    let text = muster_agent::metrics::gather(&agent.handle, &agent.node).await?;
    for line in [
        "muster_agent_task_launches_total 4",
        "muster_agent_task_launch_failures_total 2",
        "muster_agent_tasks{state=\"running\"} 2",
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
    }
    let memory = text
        .lines()
        .filter(|l| l.starts_with("muster_agent_task_memory_bytes{task=\""))
        .count();
    assert_eq!(memory, 2, "{text}");
    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_for_an_earlier_registration_or_past_its_deadline_is_refused_as_lost()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-f".into())).await?;
    let agent = AgentNode::start(config(&[master.address()], dir.path())).await?;
    let first = master.next_register().await?.registration;
    agent.registered_with(&master.upid()?).await?;
    assert!(first >= 1, "the agent names its registration");
    agent.stop().await;
    // A restarted agent registers under a higher number: it was written down.
    let agent = AgentNode::start(config(&[master.address()], dir.path())).await?;
    let registration = master.next_reregister().await?.registration;
    agent.registered_with(&master.upid()?).await?;
    assert!(registration > first, "{registration} after {first}");
    let to = master.node.remote(agent.upid().clone());
    let now_ms = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis(),
    )?;

    // Stamped with the earlier registration: it waited in a queue while the agent registered
    // again, and the master has counted it lost.
    to.tell(LaunchTasks {
        tasks: vec![shell_task("stale", "sleep 30")],
        registration: first,
        ..Default::default()
    })?;
    let lost = master
        .expect_update("agent-f", "stale", TaskState::Lost)
        .await?;
    assert!(lost.message.contains("registration"), "{:?}", lost.message);
    // Past its deadline.
    to.tell(LaunchTasks {
        tasks: vec![shell_task("late", "sleep 30")],
        registration,
        deadline_unix_ms: now_ms.saturating_sub(1_000),
        ..Default::default()
    })?;
    let lost = master
        .expect_update("agent-f", "late", TaskState::Lost)
        .await?;
    assert!(lost.message.contains("expired"), "{:?}", lost.message);
    // For this registration, in time: it runs.
    to.tell(LaunchTasks {
        tasks: vec![shell_task("fresh", "sleep 30")],
        registration,
        deadline_unix_ms: now_ms + 60_000,
        ..Default::default()
    })?;
    master.expect_started("agent-f", "fresh").await?;
    let snapshot = agent.handle.snapshot().await?;
    assert!(find(&snapshot.tasks, "stale").is_none());
    assert!(find(&snapshot.tasks, "late").is_none());
    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_master_is_told_when_a_task_runs_and_when_it_ends() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-u".into())).await?;
    let agent = AgentNode::start(config(&[master.address()], dir.path())).await?;
    master.next_register().await?;
    agent.registered_with(&master.upid()?).await?;
    let to = agent.upid().clone();

    assert_eq!(
        master
            .run_task(&to, shell_task("ok", "exit 0"))
            .await?
            .error,
        ""
    );
    let running = master.expect_started("agent-u", "ok").await?;
    assert_eq!(running.framework_id, "fw-1");
    assert_eq!(running.command, "sh");
    let finished = master
        .expect_update("agent-u", "ok", TaskState::Finished)
        .await?;
    assert_eq!(finished.exit_code, 0);

    assert_eq!(
        master
            .run_task(&to, shell_task("three", "exit 3"))
            .await?
            .error,
        ""
    );
    master.expect_started("agent-u", "three").await?;
    let failed = master
        .expect_update("agent-u", "three", TaskState::Failed)
        .await?;
    assert_eq!(failed.exit_code, 3);

    // What the master was told is what the agent has.
    let snapshot = agent.handle.snapshot().await?;
    assert_eq!(find(&snapshot.completed_tasks, "ok"), Some(&finished));
    assert_eq!(find(&snapshot.completed_tasks, "three"), Some(&failed));
    // A refused task changes no state: no update for it.
    let error = master
        .run_task(&to, shell_task("three", "exit 0"))
        .await?
        .error;
    assert!(error.contains("already exists"), "{error}");
    assert_eq!(
        master
            .run_task(&to, shell_task("last", "exit 0"))
            .await?
            .error,
        ""
    );
    master.expect_started("agent-u", "last").await?;
    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_made_while_unregistered_is_sent_after_the_next_registration()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut a = MasterNode::start(Answer::Admit("agent-q".into())).await?;
    let mut b = MasterNode::start(Answer::Refuse("not yet".into())).await?;
    let agent = AgentNode::start(config(&[a.address(), b.address()], dir.path())).await?;
    a.next_register().await?;
    agent.registered_with(&a.upid()?).await?;
    let to = agent.upid().clone();
    assert_eq!(
        a.run_task(&to, shell_task("q", "sleep 30")).await?.error,
        ""
    );
    a.expect_started("agent-q", "q").await?;

    // A goes away; B refuses: the agent has no master.
    a.shutdown().await;
    b.next_reregister().await?;
    // The task ends meanwhile (B's node asks for it: any node can).
    assert_eq!(b.kill_task(&to, "q").await?.error, "");
    agent
        .wait_until("task `q` to be killed", |s| {
            state_of(&s.completed_tasks, "q") == Some(TaskState::Killed)
                && s.status == AgentStatus::Registering
        })
        .await?;

    b.set_answer(Answer::Admit("unused".into()));
    assert_eq!(agent.registered_with(&b.upid()?).await?, "agent-q");
    // Only the latest state of the task, and only after B took the agent.
    let Update {
        admitted_before,
        update,
    } = b.next_update().await?;
    let task = update.task.context("TaskStatusUpdate without a task")?;
    assert_eq!(
        (update.agent_id.as_str(), task.id.as_str()),
        ("agent-q", "q")
    );
    assert_eq!(TaskState::try_from(task.state)?, TaskState::Killed);
    assert_eq!(
        admitted_before, 1,
        "the update reached B before B admitted the agent"
    );
    agent.stop().await;
    b.shutdown().await;
    Ok(())
}

//! A task's processes: they end with the task and with the agent, kills with and without
//! SIGTERM honoured, cgroups that bound memory, and the users a task may run as.

use super::*;

/// A shell task with resources (so that its cgroup has limits).
fn bounded_task(id: &str, script: &str, mem_mb: u64) -> RunTask {
    let mut request = shell_task(id, script);
    if let Some(task) = request.task.as_mut() {
        task.resources = Some(muster_proto::model::Resources { cpus: 0.5, mem_mb });
    }
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_s_processes_end_with_it_and_with_the_agent() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-k".into())).await?;
    let agent = AgentNode::start(config(&[master.address()], dir.path())).await?;
    master.next_register().await?;
    agent.registered_with(&master.upid()?).await?;
    let to = agent.upid().clone();

    // The task's main process exits and leaves a background process behind.
    let script = "sleep 30 & echo $! > bg.pid; exit 0";
    assert_eq!(
        master
            .run_task(&to, shell_task("leaves", script))
            .await?
            .error,
        ""
    );
    let straggler = pid_in(&dir.path().join("tasks/leaves/bg.pid")).await?;
    agent
        .wait_until("task `leaves` to finish", |s| {
            state_of(&s.completed_tasks, "leaves") == Some(TaskState::Finished)
        })
        .await?;
    ends(straggler, "the finished task's background process").await?;

    // A running task and its child end when the agent stops.
    let script = "echo $$ > leader.pid; sleep 30 & echo $! > child.pid; wait";
    assert_eq!(
        master
            .run_task(&to, shell_task("runs", script))
            .await?
            .error,
        ""
    );
    let leader = pid_in(&dir.path().join("tasks/runs/leader.pid")).await?;
    let child = pid_in(&dir.path().join("tasks/runs/child.pid")).await?;
    ensure!(!has_ended(leader) && !has_ended(child), "the task runs");
    agent.stop().await;
    ends(leader, "the task's main process").await?;
    ends(child, "the task's child").await?;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_task_stops_a_task_that_honours_sigterm_within_the_grace() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-x".into())).await?;
    let mut config = config(&[master.address()], dir.path());
    let grace = Duration::from_secs(10);
    config.kill_grace = grace;
    let agent = AgentNode::start(config).await?;
    master.next_register().await?;
    agent.registered_with(&master.upid()?).await?;
    let to = agent.upid().clone();

    let script = "echo $$ > leader.pid; sleep 30 & echo $! > child.pid; wait";
    assert_eq!(
        master
            .run_task(&to, shell_task("long", script))
            .await?
            .error,
        ""
    );
    master.expect_started("agent-x", "long").await?;
    let leader = pid_in(&dir.path().join("tasks/long/leader.pid")).await?;
    let child = pid_in(&dir.path().join("tasks/long/child.pid")).await?;

    let asked = tokio::time::Instant::now();
    assert_eq!(master.kill_task(&to, "long").await?.error, "");
    let killed = master
        .expect_update("agent-x", "long", TaskState::Killed)
        .await?;
    let took = asked.elapsed();
    ensure!(
        took < grace,
        "a task that honours SIGTERM took {took:?} to stop (grace {grace:?})"
    );
    // The shell died of the SIGTERM: 128 + 15.
    assert_eq!(killed.exit_code, 143);
    ends(leader, "the killed task's main process").await?;
    ends(child, "the killed task's child").await?;

    let snapshot = agent.handle.snapshot().await?;
    assert!(snapshot.tasks.is_empty(), "{:?}", snapshot.tasks);
    assert_eq!(find(&snapshot.completed_tasks, "long"), Some(&killed));
    // An ended task cannot be killed again.
    let error = master.kill_task(&to, "long").await?.error;
    assert!(
        error.contains("\"long\"") && error.contains("already ended"),
        "{error}"
    );
    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_task_sends_sigkill_after_the_grace_to_a_task_that_ignores_sigterm()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-y".into())).await?;
    let mut config = config(&[master.address()], dir.path());
    let grace = Duration::from_millis(300);
    config.kill_grace = grace;
    let agent = AgentNode::start(config).await?;
    master.next_register().await?;
    agent.registered_with(&master.upid()?).await?;
    let to = agent.upid().clone();

    // The pid files are written after the trap is set: once they are there, SIGTERM is ignored
    // (by the shell and, inherited, by its child).
    let script = "trap '' TERM; echo $$ > leader.pid; sleep 30 & echo $! > child.pid; wait";
    assert_eq!(
        master
            .run_task(&to, shell_task("stubborn", script))
            .await?
            .error,
        ""
    );
    master.expect_started("agent-y", "stubborn").await?;
    let leader = pid_in(&dir.path().join("tasks/stubborn/leader.pid")).await?;
    let child = pid_in(&dir.path().join("tasks/stubborn/child.pid")).await?;

    let asked = tokio::time::Instant::now();
    assert_eq!(master.kill_task(&to, "stubborn").await?.error, "");
    let killed = master
        .expect_update("agent-y", "stubborn", TaskState::Killed)
        .await?;
    let took = asked.elapsed();
    ensure!(
        took >= grace,
        "a task that ignores SIGTERM ended after {took:?}, before the grace of {grace:?}"
    );
    // The shell died of the SIGKILL: 128 + 9.
    assert_eq!(killed.exit_code, 137);
    ends(leader, "the killed task's main process").await?;
    ends(child, "the killed task's child").await?;
    let snapshot = agent.handle.snapshot().await?;
    assert_eq!(
        state_of(&snapshot.completed_tasks, "stubborn"),
        Some(TaskState::Killed)
    );
    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_task_for_an_unknown_task_names_it() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-z".into())).await?;
    let agent = AgentNode::start(config(&[master.address()], dir.path())).await?;
    master.next_register().await?;
    agent.registered_with(&master.upid()?).await?;

    let error = master.kill_task(agent.upid(), "no-such-task").await?.error;
    assert!(error.contains("\"no-such-task\""), "{error}");
    let snapshot = agent.handle.snapshot().await?;
    assert!(snapshot.tasks.is_empty() && snapshot.completed_tasks.is_empty());
    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cgroups_bound_memory_and_a_kill_reaches_every_process() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-cg".into())).await?;
    let agent = AgentNode::start(config(&[master.address()], dir.path())).await?;
    let registered = master.next_register().await?;
    // This machine (and CI's) has writable cgroups: the test is about them.
    let isolation = isolation_of(&registered);
    ensure!(
        isolation.starts_with("cgroup-"),
        "the agent could not use cgroups here ({isolation}); these tests need them"
    );
    agent.registered_with(&master.upid()?).await?;
    let to = agent.upid().clone();

    // 16 MiB, and a pipeline that holds 200 MB: the kernel kills it, the agent says why.
    let hog = "head -c 200000000 /dev/zero | tail > /dev/null";
    assert_eq!(
        master
            .run_task(&to, bounded_task("hog", hog, 16))
            .await?
            .error,
        ""
    );
    master.expect_started("agent-cg", "hog").await?;
    let failed = master
        .expect_update("agent-cg", "hog", TaskState::Failed)
        .await?;
    assert_eq!(failed.message, "out of memory", "{failed:?}");

    // A grandchild in a session of its own is still the task's: a kill ends it too.
    let script = "setsid sh -c 'echo $$ > escapee.pid; exec sleep 300' & wait";
    assert_eq!(
        master
            .run_task(&to, bounded_task("escape", script, 64))
            .await?
            .error,
        ""
    );
    master.expect_started("agent-cg", "escape").await?;
    let escapee = pid_in(&dir.path().join("tasks/escape/escapee.pid")).await?;
    ensure!(!has_ended(escapee), "the grandchild runs");
    assert_eq!(master.kill_task(&to, "escape").await?.error, "");
    master
        .expect_update("agent-cg", "escape", TaskState::Killed)
        .await?;
    ends(escapee, "the setsid grandchild").await?;

    // A task within its limits finishes as usual.
    assert_eq!(
        master
            .run_task(&to, bounded_task("small", "exit 0", 64))
            .await?
            .error,
        ""
    );
    master.expect_started("agent-cg", "small").await?;
    master
        .expect_update("agent-cg", "small", TaskState::Finished)
        .await?;
    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_cgroups_the_agent_says_so() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-pg".into())).await?;
    let mut config = config(&[master.address()], dir.path());
    config.cgroups = false;
    let agent = AgentNode::start(config).await?;
    let registered = master.next_register().await?;
    assert_eq!(isolation_of(&registered), "process-group");
    agent.stop().await;
    master.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_may_name_only_a_user_the_agent_allows() -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        // Only root switches users; a non-root agent's refusal is a unit test.
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let mut master = MasterNode::start(Answer::Admit("agent-u".into())).await?;
    let mut config = config(&[master.address()], dir.path());
    config.allowed_task_users = vec!["daemon".into()];
    let agent = AgentNode::start(config).await?;
    master.next_register().await?;
    agent.registered_with(&master.upid()?).await?;
    let as_user = |id: &str, user: &str| {
        let mut request = shell_task(id, "echo $$ > pid; exec sleep 60");
        if let Some(task) = &mut request.task {
            task.user = user.into();
        }
        request
    };
    let refused = master
        .run_task(agent.upid(), as_user("as-root", "root"))
        .await?;
    assert!(
        refused.error.contains("\"root\"") && refused.error.contains("does not allow"),
        "{}",
        refused.error
    );
    assert_eq!(
        master
            .run_task(agent.upid(), as_user("as-daemon", "daemon"))
            .await?
            .error,
        ""
    );
    let pid = pid_in(&dir.path().join("tasks/as-daemon/pid")).await?;
    let passwd = std::fs::read_to_string("/etc/passwd")?;
    let daemon: u32 = passwd
        .lines()
        .find_map(|line| line.strip_prefix("daemon:x:"))
        .and_then(|rest| rest.split(':').next())
        .and_then(|uid| uid.parse().ok())
        .context("no daemon user")?;
    assert_eq!(uid_of(pid)?, daemon);
    agent.stop().await;
    ends(pid, "the task").await?;
    master.shutdown().await;
    Ok(())
}

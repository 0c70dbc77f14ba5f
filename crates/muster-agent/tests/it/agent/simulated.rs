//! Simulated tasks: the agent's own logic without child processes, across restarts and a
//! reboot.

use super::*;

/// The clock of the simulated tasks in these tests: the time since the first reading.
fn simulated_clock() -> Duration {
    static START: std::sync::OnceLock<tokio::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(tokio::time::Instant::now).elapsed()
}

/// A task of `command` with `args`, for simulated tasks, as a leader of `term` sends it.
fn simulated_task(id: &str, command: &str, args: &[&str], term: u64) -> RunTask {
    RunTask {
        framework: Some(framework()),
        task: Some(Task {
            id: id.into(),
            name: format!("sim.main[{id}]"),
            command: command.into(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            ..Task::default()
        }),
        term,
    }
}

/// On one thread, as in a simulation: the agent's logic runs simulated tasks as it runs
/// processes (updates, exit codes, kills, fencing terms), its next run re-attaches them and
/// hears how those that ended meanwhile ended, a machine crash loses them, and an agent that
/// stops kills them; and it makes no working directory, executor file or cgroup for them.
#[tokio::test(flavor = "current_thread")]
async fn simulated_tasks_go_through_the_agent_s_logic_across_restarts_and_a_reboot()
-> anyhow::Result<()> {
    use muster_agent::runner::CustomRunner;
    use muster_agent::simulated::SimulatedTasks;

    let dir = tempfile::tempdir()?;
    let machine = SimulatedTasks::new(simulated_clock);
    let mut master = MasterNode::start(Answer::AdmitInTerm("agent-sim".into(), 3)).await?;
    // Tasks outlive the agent, as the binary's do; cgroups asked for, and not used.
    let mut config = keeping_config(&[master.address()], dir.path());
    config.task_runner = Some(CustomRunner::new(machine.clone()));
    let first = AgentNode::start(config.clone()).await?;
    let registered = master.next_register().await?;
    assert_eq!(isolation_of(&registered), "none");
    first.registered_with(&master.upid()?).await?;
    let to = first.upid().clone();

    async fn run(master: &MasterNode, to: &Upid, request: RunTask) -> anyhow::Result<String> {
        Ok(master.run_task(to, request).await?.error)
    }
    let request = simulated_task("done", "sleep", &["0.1"], 3);
    assert_eq!(run(&master, &to, request).await?, "");
    master.expect_started("agent-sim", "done").await?;
    let done = master
        .expect_update("agent-sim", "done", TaskState::Finished)
        .await?;
    assert_eq!(done.exit_code, 0);
    let request = simulated_task("three", "exit", &["3"], 3);
    assert_eq!(run(&master, &to, request).await?, "");
    master.expect_started("agent-sim", "three").await?;
    let failed = master
        .expect_update("agent-sim", "three", TaskState::Failed)
        .await?;
    assert_eq!(failed.exit_code, 3);
    let refused = run(&master, &to, simulated_task("stale", "serve", &[], 2)).await?;
    assert!(refused.contains("term 2"), "{refused}");
    let bad = run(&master, &to, simulated_task("bad", "sleep", &["later"], 3)).await?;
    assert!(bad.contains("sleep needs a number"), "{bad}");
    master
        .expect_update("agent-sim", "bad", TaskState::Starting)
        .await?;
    master
        .expect_update("agent-sim", "bad", TaskState::Failed)
        .await?;
    for (id, args) in [("server", vec![]), ("nap", vec!["0.3"])] {
        let command = if id == "nap" { "sleep" } else { "serve" };
        let request = simulated_task(id, command, &args, 3);
        assert_eq!(run(&master, &to, request).await?, "");
        master.expect_started("agent-sim", id).await?;
    }
    first.stop().await;
    assert!(machine.kills().is_empty(), "{:?}", machine.kills());

    // The nap ends while no agent runs.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while machine.running_names().len() > 1 {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the nap never ended"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let second = AgentNode::start(config.clone()).await?;
    let request = master.next_reregister().await?;
    let server = find(&request.tasks, "server").context("server not re-attached")?;
    assert_eq!(server.state, TaskState::Running as i32);
    assert_eq!(request.tasks.len(), 1, "{:?}", request.tasks);
    let nap = find(&request.completed_tasks, "nap").context("nap not reported")?;
    assert_eq!(
        (nap.state, nap.exit_code, nap.message.as_str()),
        (
            TaskState::Finished as i32,
            0,
            "it ended while the agent was down"
        )
    );
    second.registered_with(&master.upid()?).await?;

    // The re-attached task is the agent's as before: a kill (of a leader of term 4) reaches
    // it, and its end is seen.
    let kill = KillTask {
        task_id: "server".into(),
        term: 4,
    };
    let answer: KillTaskReply = master
        .node
        .remote(second.upid().clone())
        .ask_timeout(PATIENCE, kill)
        .await?;
    assert_eq!(answer.error, "");
    let killed = await_state(&mut master, "server", TaskState::Killed).await?;
    assert_eq!(killed.exit_code, 128 + libc::SIGTERM, "{killed:?}");
    let to = second.upid().clone();
    let request = simulated_task("doomed", "serve", &[], 4);
    assert_eq!(run(&master, &to, request).await?, "");
    master.expect_started("agent-sim", "doomed").await?;
    second.stop().await;

    // The machine crashes: the next run finds the task gone.
    machine.reboot();
    // This run kills its tasks when it stops.
    config.stop_tasks_on_exit = true;
    let fourth = AgentNode::start(config).await?;
    let request = master.next_reregister().await?;
    let doomed = find(&request.completed_tasks, "doomed").context("doomed not reported")?;
    assert_eq!(doomed.state, TaskState::Lost as i32, "{doomed:?}");
    assert!(request.tasks.is_empty(), "{:?}", request.tasks);
    fourth.registered_with(&master.upid()?).await?;

    // An agent that kills its tasks as it stops kills simulated ones too.
    let to = fourth.upid().clone();
    let request = simulated_task("last", "serve", &[], 4);
    assert_eq!(run(&master, &to, request).await?, "");
    master.expect_started("agent-sim", "last").await?;
    fourth.stop().await;
    assert!(machine.running_names().is_empty());

    let launched: Vec<(String, u64)> = machine
        .launches()
        .into_iter()
        .map(|l| (l.task_id, l.term))
        .collect();
    // Each started under the term the agent follows (its leader's answer said 3): a command
    // of a later term (doomed's and last's, 4) is obeyed but does not move it.
    let expected = [
        ("done", 3),
        ("three", 3),
        ("server", 3),
        ("nap", 3),
        ("doomed", 3),
        ("last", 3),
    ];
    assert_eq!(launched, expected.map(|(id, term)| (id.to_owned(), term)));
    let kills: Vec<(String, Option<u64>, i32)> = machine
        .kills()
        .into_iter()
        .map(|k| (k.task_id, k.term, k.signal))
        .collect();
    assert_eq!(
        kills,
        vec![
            ("server".to_owned(), Some(4), libc::SIGTERM),
            ("last".to_owned(), None, libc::SIGKILL),
        ]
    );
    // Nothing of the machine's: no working directory, no executor files.
    ensure!(
        !dir.path().join("tasks").exists(),
        "a working directory was made"
    );
    for entry in std::fs::read_dir(dir.path().join("meta/tasks"))? {
        let name = entry?.file_name();
        let name = name.to_string_lossy();
        ensure!(name.ends_with(".pb"), "an executor file: {name}");
    }
    master.shutdown().await;
    Ok(())
}

//! Jobs across a failover: a submission held during the recovery, a job left below its count
//! evaluated again, and a second copy of a slot stopped by the convergence check.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_submitted_during_recovery_is_held_and_placed_when_its_agent_comes_back()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (members, mut masters) = start_group(3, dir.path(), |config| config).await?;
    let addresses: Vec<String> = members.values().cloned().collect();
    let first = leader(&masters).await?;
    let system = System::new();
    let node = agent_node(&system, "agent-1").await?;
    let mut agents = register_agents(&node, &addresses, 1).await?;
    agents[0].tasks.clear();
    reregister(&node, &addresses, &agents[0]).await?;

    // The leader goes; its successor waits for the agent to re-register, and holds every
    // evaluation meanwhile: it does not know what the agent runs.
    masters
        .remove(&first)
        .context("first leader")?
        .shutdown()
        .await;
    let second = leader(&masters).await?;
    let job = service_job("late", 1);
    submit(&masters[&second], job).await?;
    let status = masters[&second]
        .pid()
        .ask(|reply| {
            JobStatus {
                name: "late".into(),
                stale: true,
                reply,
            }
            .into()
        })
        .await?
        .map_err(anyhow::Error::msg)?;
    assert!(
        !status.evals.is_empty()
            && status
                .evals
                .iter()
                .all(|e| e.status == model_pb::EvalStatus::Pending as i32),
        "held, not scheduled: {:?}",
        status.evals
    );

    // The agent comes back, unchanged: the hold ends, and the job is placed there.
    let remaining: Vec<String> = members
        .iter()
        .filter(|(id, _)| **id != first)
        .map(|(_, address)| address.clone())
        .collect();
    reregister(&node, &remaining, &agents[0]).await?;
    state_when(&masters[&second], "the blocked job placed", |s| {
        s.agents
            .iter()
            .any(|a| a.connected && a.tasks.iter().any(|t| t.job == "late"))
    })
    .await?;
    for master in masters.into_values() {
        master.shutdown().await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_left_below_its_count_by_a_failover_is_evaluated_again() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (members, mut masters) = start_group(3, dir.path(), |config| MasterConfig {
        reconcile_interval: Duration::from_millis(200),
        ..config
    })
    .await?;
    let addresses: Vec<String> = members.values().cloned().collect();
    let first = leader(&masters).await?;
    let system = System::new();
    let node = agent_node(&system, "agent-1").await?;
    let mut agents = register_agents(&node, &addresses, 1).await?;
    agents[0].tasks.clear();
    reregister(&node, &addresses, &agents[0]).await?;
    let job = service_job("kept", 1);
    submit(&masters[&first], job).await?;
    let state = state_when(&masters[&first], "the job's task placed", |s| {
        s.agents
            .iter()
            .any(|a| a.tasks.iter().any(|t| t.job == "kept"))
    })
    .await?;
    let mut placed = state.agents[0]
        .tasks
        .iter()
        .find(|t| t.job == "kept")
        .context("placed task")?
        .clone();

    // The leader dies; the agent comes back to its successor saying the task was lost (it
    // ended while the old leader was going, and that leader never evaluated the job again).
    masters
        .remove(&first)
        .context("first leader")?
        .shutdown()
        .await;
    let second = leader(&masters).await?;
    placed.state = model_pb::TaskState::Lost as i32;
    let request = pb::ReregisterAgent {
        agent_id: agents[0].id.clone(),
        info: Some(agents[0].info.clone()),
        completed_tasks: vec![placed.clone()],
        ..pb::ReregisterAgent::default()
    };
    let remaining: Vec<String> = members
        .iter()
        .filter(|(id, _)| **id != first)
        .map(|(_, address)| address.clone())
        .collect();
    ask_until_admitted(&node, &remaining, request).await?;

    // The convergence check notices the job below its count and places a replacement.
    let state = state_when(&masters[&second], "a replacement placed", |s| {
        s.agents
            .iter()
            .any(|a| a.tasks.iter().any(|t| t.job == "kept" && t.id != placed.id))
    })
    .await?;
    assert_eq!(
        state
            .agents
            .iter()
            .flat_map(|a| &a.tasks)
            .filter(|t| t.job == "kept")
            .count(),
        1
    );
    let metrics = masters[&second]
        .pid()
        .ask(|reply| GetMetrics { reply }.into())
        .await?;
    assert!(metrics.reconcile_evals >= 1, "{metrics:?}");
    for master in masters.into_values() {
        master.shutdown().await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_copy_of_a_slot_is_stopped_by_the_convergence_check() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (members, masters) = start_group(1, dir.path(), |config| MasterConfig {
        reconcile_interval: Duration::from_millis(200),
        ..config
    })
    .await?;
    let addresses: Vec<String> = members.values().cloned().collect();
    leader(&masters).await?;
    let system = System::new();
    let node = agent_node(&system, "agent-1").await?;
    let mut agents = register_agents(&node, &addresses, 1).await?;
    agents[0].tasks.clear();
    reregister(&node, &addresses, &agents[0]).await?;
    let job = service_job("single", 1);
    submit(&masters[&1], job).await?;
    let state = state_when(&masters[&1], "the job's task placed", |s| {
        s.agents
            .iter()
            .any(|a| a.tasks.iter().any(|t| t.job == "single"))
    })
    .await?;
    let placed = state.agents[0]
        .tasks
        .iter()
        .find(|t| t.job == "single")
        .context("placed")?
        .clone();

    // A second copy of the slot turns up, as a task a replaced agent brings back when it
    // registers again, with no evaluation to notice it.
    let mut running = placed.clone();
    running.state = model_pb::TaskState::Running as i32;
    let mut twin = running.clone();
    twin.id = format!("{}-twin", placed.id);
    agents[0].tasks = vec![running, twin];
    reregister(&node, &addresses, &agents[0]).await?;

    let live = |s: &pb::ClusterState| {
        s.agents
            .iter()
            .flat_map(|a| &a.tasks)
            .filter(|t| {
                t.job == "single"
                    && !matches!(
                        model_pb::TaskState::try_from(t.state),
                        Ok(model_pb::TaskState::Killed
                            | model_pb::TaskState::Finished
                            | model_pb::TaskState::Failed
                            | model_pb::TaskState::Lost)
                    )
            })
            .count()
    };
    state_when(&masters[&1], "the second copy adopted", |s| live(s) == 2).await?;
    // The convergence check evaluates the job, and one of the two is stopped.
    state_when(&masters[&1], "one copy left", |s| live(s) == 1).await?;
    let metrics = masters[&1]
        .pid()
        .ask(|reply| GetMetrics { reply }.into())
        .await?;
    assert!(metrics.reconcile_evals >= 1, "{metrics:?}");
    for master in masters.into_values() {
        master.shutdown().await;
    }
    Ok(())
}

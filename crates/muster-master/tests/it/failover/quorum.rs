//! A leader cut off from its quorum applies no plan, and reads are linearizable unless a
//! stale one is asked for.

use super::*;

/// A plan placing one task (`task_id`) on `agent`.
fn one_placement(agent: &str, task_id: &str) -> muster_scheduler::Plan {
    let mut plan =
        muster_scheduler::Plan::empty(muster_model::EvalId(format!("eval-{task_id}")), "web", 0);
    plan.place.push(muster_scheduler::Placement {
        ports: Default::default(),
        agent: muster_model::AgentId(agent.into()),
        task_id: task_id.into(),
        name: "web.main[0]".into(),
        job: "web".into(),
        group: "main".into(),
        resources: muster_model::Resources {
            cpus: 1.0,
            mem_mb: 64,
        },
        job_version: 1,
    });
    plan
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_its_quorum_applies_no_plan() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (members, mut masters) = start_group(3, dir.path(), |config| MasterConfig {
        workers: 0,
        ..config
    })
    .await?;
    let leading = leader(&masters).await?;
    let system = System::new();
    let node = agent_node(&system, "agent-q").await?;
    let agent = register_agents(&node, &[members[&leading].clone()], 1).await?;
    let agent_id = agent[0].id.clone();
    let submit = |master: &MasterServer, plan| {
        let pid = master.pid().clone();
        async move { pid.ask(|reply| SubmitPlan { plan, reply }.into()).await }
    };

    // The plans place tasks of `web`, as it is stored (the applier runs what the job says).
    super::submit(&masters[&leading], service_job("web", 1)).await?;
    // With its quorum, the leader applies a plan.
    let applied = submit(
        &masters[&leading],
        one_placement(&agent_id, "web.main[0]-t1"),
    )
    .await?;
    let applied = applied.map_err(anyhow::Error::msg)?;
    assert_eq!(applied.committed.len(), 1);

    // Without it (both followers gone), the next plan past the lease is refused: no launch
    // from a master that may no longer lead.
    let followers: Vec<u64> = members
        .keys()
        .copied()
        .filter(|id| *id != leading)
        .collect();
    for id in followers {
        if let Some(master) = masters.remove(&id) {
            master.shutdown().await;
        }
    }
    let lease = Duration::from_millis(200) / 2;
    tokio::time::sleep(lease).await;
    let refused = submit(
        &masters[&leading],
        one_placement(&agent_id, "web.main[0]-t2"),
    )
    .await?;
    match refused {
        Err(e) => assert!(e.to_string().contains("not the leading master"), "{e}"),
        Ok(result) => bail!("a plan applied without a quorum: {result:?}"),
    }
    let state = masters[&leading]
        .pid()
        .ask(|reply| GetState { reply }.into())
        .await?;
    let tasks: Vec<&str> = state
        .agents
        .iter()
        .flat_map(|a| a.tasks.iter().map(|t| t.id.as_str()))
        .collect();
    assert_eq!(
        tasks,
        ["web.main[0]-t1"],
        "only the plan applied with a quorum placed a task"
    );
    let metrics = masters[&leading]
        .pid()
        .ask(|reply| GetMetrics { reply }.into())
        .await?;
    assert!(metrics.leadership_confirmations >= 1);
    for master in masters.into_values() {
        master.shutdown().await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_are_linearizable_by_default_and_stale_only_when_asked() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (members, mut masters) = start_group(3, dir.path(), |config| MasterConfig {
        workers: 0,
        ..config
    })
    .await?;
    let leading = leader(&masters).await?;
    let standby = *members
        .keys()
        .find(|id| **id != leading)
        .context("a standby")?;
    let token = muster_master::testing::bootstrap(&members[&leading]).await?;
    let mut at_leader = muster_master::testing::operator(&members[&leading], Some(&token)).await?;
    let mut at_standby = muster_master::testing::operator(&members[&standby], Some(&token)).await?;
    // The standby knows the token once it has applied the bootstrap: until then it refuses it.
    let deadline = Instant::now() + DEADLINE;
    while let Err(e) = at_standby
        .get_state(pb::GetStateRequest { stale: true })
        .await
    {
        if e.code() != tonic::Code::Unauthenticated || Instant::now() > deadline {
            bail!("the standby does not take the token: {e:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The leader answers a linearizable read; a standby refuses it, naming the leader.
    let state = at_leader
        .get_state(pb::GetStateRequest::default())
        .await?
        .into_inner();
    let read = state.read.context("no read info")?;
    assert!(
        state.is_leader && !read.stale && read.last_contact_ms == 0,
        "{read:?}"
    );
    let refused = at_standby
        .get_state(pb::GetStateRequest::default())
        .await
        .err()
        .context("a standby answered a linearizable read")?;
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert_eq!(
        refused
            .metadata()
            .get("muster-leader")
            .and_then(|v| v.to_str().ok()),
        Some(members[&leading].as_str())
    );

    // Asked for, the standby answers from its own state and says how far behind it may be.
    let state = at_standby
        .get_state(pb::GetStateRequest { stale: true })
        .await?
        .into_inner();
    let read = state.read.context("no read info")?;
    assert!(
        !state.is_leader && read.stale && read.known_leader,
        "{read:?}"
    );
    assert!(read.last_contact_ms < 10_000, "{read:?}");

    // Cut off from both followers, the leader refuses linearizable reads past its lease: it
    // may no longer lead. A stale read still answers.
    for id in members.keys().filter(|id| **id != leading) {
        if let Some(master) = masters.remove(id) {
            master.shutdown().await;
        }
    }
    tokio::time::sleep(Duration::from_millis(200) / 2).await;
    let refused = at_leader
        .get_state(pb::GetStateRequest::default())
        .await
        .err()
        .context("a leader without a quorum answered a linearizable read")?;
    assert!(
        matches!(
            refused.code(),
            tonic::Code::FailedPrecondition | tonic::Code::Unavailable
        ),
        "{refused:?}"
    );
    let stale = at_leader
        .get_state(pb::GetStateRequest { stale: true })
        .await?
        .into_inner();
    assert!(stale.read.is_some_and(|r| r.stale));
    for master in masters.into_values() {
        master.shutdown().await;
    }
    Ok(())
}

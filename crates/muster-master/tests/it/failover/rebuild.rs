//! A standby takes over and rebuilds the cluster from the agents' re-registrations; agents
//! that stay away past the deadline, or miss their pings, are marked unreachable, within the
//! removal limit.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_over_and_rebuilds_from_reregistrations() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let members = free_addresses(3).await?;
    let addresses: Vec<String> = members.values().cloned().collect();
    let mut masters = BTreeMap::new();
    for id in members.keys() {
        masters.insert(
            *id,
            start_retrying(playing_many_agents(member_config(
                *id,
                &members,
                dir.path(),
            )))
            .await?,
        );
    }
    let first = leader(&masters).await?;

    let system = System::new();
    let agents_node = agent_node(&system, "agent-1").await?;
    let agents = register_agents(&agents_node, &addresses, 5).await?;
    for agent in &agents {
        reregister(&agents_node, &addresses, agent).await?;
    }
    let state = masters[&first]
        .pid()
        .ask(|reply| GetState { reply }.into())
        .await?;
    assert_eq!(state.agents.len(), 5);
    assert!(
        state
            .agents
            .iter()
            .all(|a| a.connected && a.tasks.len() == 2)
    );

    // A standby answers with the leader's address.
    let standby = *masters
        .keys()
        .find(|id| **id != first)
        .context("a standby")?;
    let redirect = agents_node
        .remote(format!("master@{}", members[&standby]).parse()?)
        .ask_timeout::<pb::RegisterAgent, pb::RegistrationReply>(
            Duration::from_secs(5),
            pb::RegisterAgent {
                info: Some(agents[0].info.clone()),
                ..Default::default()
            },
        )
        .await?;
    assert_eq!(
        redirect.result,
        Some(Registration::NotLeader(model_pb::NotLeader {
            leader: format!("master@{}", members[&first]),
        }))
    );

    // The leader dies; a standby takes over and waits for the admitted agents.
    masters.remove(&first).context("leader")?.shutdown().await;
    let second = leader(&masters).await?;
    let recovering = state_when(&masters[&second], "loading admitted agents", |s| {
        s.is_leader && s.agents.len() == 5
    })
    .await?;
    assert!(recovering.recovering);
    assert!(recovering.agents.iter().all(|a| !a.connected));

    // Agents that heard the new leader say it reads running tasks grouped by their labels
    // send them so; the others, whole.
    for (n, agent) in agents.iter().enumerate() {
        let request = reregistration(agent, n % 2 == 0);
        let id = ask_until_admitted(&agents_node, &addresses, request).await?;
        assert_eq!(id, agent.id, "re-registration keeps the agent's id");
    }
    let rebuilt = state_when(&masters[&second], "the rebuild", |s| !s.recovering).await?;
    assert_eq!(rebuilt.agents.len(), 5);
    for agent in &agents {
        let got = rebuilt
            .agents
            .iter()
            .find(|a| a.id == agent.id)
            .context("agent missing after failover")?;
        assert!(got.connected);
        assert_eq!(got.tasks, agent.tasks);
    }
    assert_eq!(rebuilt.frameworks.len(), 2);
    let metrics = masters[&second]
        .pid()
        .ask(|reply| GetMetrics { reply }.into())
        .await?;
    assert_eq!(metrics.agents_reregistered, 5);
    assert_eq!(
        metrics.registry_entries, 0,
        "unchanged agents cost no registry write"
    );
    assert!(metrics.recovery_seconds > 0.0);
    let again = agents_node
        .remote(format!("master@{}", members[&second]).parse()?)
        .ask_timeout::<pb::ReregisterAgent, pb::RegistrationReply>(
            Duration::from_secs(5),
            reregistration(&agents[0], true),
        )
        .await?;
    assert!(
        again.reads_tasks_sharing_labels,
        "an admission says the master reads grouped tasks"
    );

    agents_node.shutdown();
    for master in masters.into_values() {
        master.shutdown().await;
    }
    Ok(())
}

/// Registers `count` agents with a single master, restarts it, brings back `returning` of
/// them, and returns the state once the re-registration deadline has passed.
async fn restart_with_missing_agents(
    count: usize,
    returning: usize,
    removal_limit: f64,
) -> anyhow::Result<(pb::ClusterState, Vec<FakeAgent>, pb::JobStatusReply)> {
    let dir = tempfile::tempdir()?;
    let members = free_addresses(1).await?;
    let addresses: Vec<String> = members.values().cloned().collect();
    let config = MasterConfig {
        reregistration_timeout: Duration::from_millis(500),
        removal_limit,
        ..playing_many_agents(member_config(1, &members, dir.path()))
    };
    let master = start_retrying(config.clone()).await?;
    let system = System::new();
    let agents_node = agent_node(&system, "agent-1").await?;
    let agents = register_agents(&agents_node, &addresses, count).await?;
    // A service job: where its tasks ran dies with this master.
    let web = model_pb::Job {
        name: "web".into(),
        scheduler: model_pb::SchedulerType::Service as i32,
        groups: vec![model_pb::TaskGroup {
            name: "server".into(),
            count: 1,
            resources: Some(model_pb::Resources {
                cpus: 0.5,
                mem_mb: 64,
            }),
            command: "sleep".into(),
            ..model_pb::TaskGroup::default()
        }],
        ..model_pb::Job::default()
    };
    submit(&master, web).await?;
    master.shutdown().await;

    let master = start_retrying(config).await?;
    for agent in &agents[..returning] {
        reregister(&agents_node, &addresses, agent).await?;
    }
    let marked = (count - returning).min((removal_limit * count as f64).floor() as usize);
    let state = state_when(&master, "the re-registration deadline", |s| {
        s.is_leader
            && !s.recovering
            && s.unreachable.len() == marked
            && s.agents.len() == count - marked
    })
    .await?;
    let web = job_status(&master, "web").await?;
    agents_node.shutdown();
    master.shutdown().await;
    Ok((state, agents, web))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_away_past_the_deadline_is_marked_unreachable() -> anyhow::Result<()> {
    let (state, agents, web) = restart_with_missing_agents(5, 4, 1.0).await?;
    let unreachable: Vec<&str> = state.unreachable.iter().map(|a| a.id.as_str()).collect();
    assert_eq!(unreachable, [agents[4].id.as_str()]);
    assert_eq!(state.agents.len(), 4);
    assert!(state.agents.iter().all(|a| a.connected));
    // The new master never learned where the service job's task ran: the job is evaluated
    // anyway, in the same entry as the mark.
    assert!(
        web.evals
            .iter()
            .any(|e| trigger_of(e).contains("AgentUnreachable")
                && trigger_of(e).contains(&agents[4].id)),
        "{:?}",
        web.evals
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_lost_together_make_one_evaluation_per_job() -> anyhow::Result<()> {
    // 3 of 5 stay away: marked in one raft entry, with one evaluation of the job, not three.
    let (state, _agents, web) = restart_with_missing_agents(5, 2, 1.0).await?;
    assert_eq!(state.unreachable.len(), 3);
    let marks = web
        .evals
        .iter()
        .filter(|e| trigger_of(e).contains("AgentUnreachable"))
        .count();
    assert_eq!(marks, 1, "{:?}", web.evals);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_removal_limit_keeps_agents_when_most_stay_away() -> anyhow::Result<()> {
    // 4 of 5 stay away; a 40% limit allows 2 to be marked, and the other 2 are kept.
    let (state, _agents, _web) = restart_with_missing_agents(5, 1, 0.4).await?;
    assert_eq!(state.unreachable.len(), 2);
    assert_eq!(state.agents.len(), 3);
    assert_eq!(state.agents.iter().filter(|a| a.connected).count(), 1);
    Ok(())
}

/// Answers the master's pings, as a healthy agent does.
struct Ponger;

impl muster_actor::Process for Ponger {
    type Message = (pb::Ping, muster_actor::Reply<pb::Pong>);
    async fn handle(&mut self, (_, reply): Self::Message, _ctx: &mut muster_actor::Context<Self>) {
        reply.send(pb::Pong::default());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_misses_its_pings_is_marked_unreachable() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let members = free_addresses(1).await?;
    let addresses: Vec<String> = members.values().cloned().collect();
    let master = start_retrying(MasterConfig {
        // Pings are off by default (heartbeats keep agents connected); this test is about them.
        pings: true,
        ping_interval: Duration::from_millis(50),
        ping_timeout: Duration::from_millis(500),
        max_missed_pings: 3,
        ..playing_many_agents(member_config(1, &members, dir.path()))
    })
    .await?;
    let system = System::new();
    let node = agent_node(&system, "agent-1").await?;
    node.register("agent", &system.spawn(Ponger))?
        .install_ask::<pb::Ping, pb::Pong>(|ping, reply| (ping, reply));

    let healthy = model_pb::AgentInfo {
        address: format!("agent@{}", node.address()),
        ..agent_info(0, &node)
    };
    let silent = model_pb::AgentInfo {
        address: format!("silent@{}", node.address()),
        ..agent_info(1, &node)
    };
    let healthy = ask_until_admitted(
        &node,
        &addresses,
        pb::RegisterAgent {
            info: Some(healthy),
            ..Default::default()
        },
    )
    .await?;
    let silent = ask_until_admitted(
        &node,
        &addresses,
        pb::RegisterAgent {
            info: Some(silent),
            ..Default::default()
        },
    )
    .await?;

    let state = state_when(&master, "the silent agent marked unreachable", |s| {
        s.unreachable.len() == 1 && s.agents.len() == 1
    })
    .await?;
    assert_eq!(state.unreachable[0].id, silent);
    assert_eq!(state.agents[0].id, healthy);
    assert!(state.agents[0].connected);
    let metrics = master
        .pid()
        .ask(|reply| GetMetrics { reply }.into())
        .await?;
    assert_eq!(metrics.agents_unreachable, 1);

    node.shutdown();
    master.shutdown().await;
    Ok(())
}

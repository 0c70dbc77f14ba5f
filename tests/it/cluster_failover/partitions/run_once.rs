//! Each slot runs once through a partition or a failover: a leader cut from its agents and
//! healed, a batch task finished before a failover on an agent back late, and a leader killed
//! with its launches unconfirmed or as it acknowledges a submission.

use super::*;

/// Three masters, three agents; the leader is cut from every agent, both ways (nothing the
/// agents send reaches it, nothing it sends reaches them; it still leads the other masters,
/// which cannot reach the agents either, though the agents reach them) until it marks them
/// all unreachable, then healed. A service job of three long-running slots, a batch job that
/// finished before the cut and one that runs through it: every agent re-registers with the
/// same leader after the heal (the time it took is printed); once settled every service slot
/// runs exactly one process, each process that lived through the cut still runs unless its
/// slot runs a replacement, and it stays so while the leader's convergence check runs; and
/// each batch slot ran exactly once (counted from what each run appends to its slot's file),
/// the running one finishing once released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_from_its_agents_and_healed_runs_every_slot_once() -> anyhow::Result<()> {
    Linked::run("cut-and-heal", QUICK_HEARTBEATS, cut_and_heal).await
}

async fn cut_and_heal(cluster: &mut Linked) -> anyhow::Result<()> {
    const AGENTS: usize = 3;
    const SLOTS: u32 = 3;
    let leader = cluster.start_agents(AGENTS).await?;
    let web = cluster.sleeping_service("web", SLOTS);
    let done = cluster.recorded_batch("done", SLOTS);
    let long = cluster.job(
        "long",
        model_pb::SchedulerType::Batch,
        SLOTS,
        &cluster.recording(&cluster.wait_for_file("release")),
    );
    for job in [web, done, long] {
        cluster.submit(leader, job).await?;
    }
    let (leader, _) = cluster
        .leader_when("web and long running, done finished", |s| {
            tasks_in(s, "web", model_pb::TaskState::Running).len() == SLOTS as usize
                && tasks_in(s, "long", model_pb::TaskState::Running).len() == SLOTS as usize
                && finished_slots(s, "done").len() == SLOTS as usize
        })
        .await?;
    let web_marker = cluster.marker("web");
    let (_, state, before) = cluster
        .leader_when_settled("the web processes", "web", SLOTS, |_| true)
        .await?;
    let agent_ids: BTreeSet<String> = state.agents.iter().map(|a| a.id.clone()).collect();

    // The leader's connections to the agents it launched tasks on: a master dials an agent
    // when it first sends it something of its own, and keeps that connection up (an agent it
    // only answered, on the agent's connection, it has not dialled).
    let dialled = state
        .agents
        .iter()
        .filter(|a| !a.tasks.is_empty() || !a.completed_tasks.is_empty())
        .count();
    cluster.cut_from_agents(leader);
    // Each agent's connection to the leader, and the leader's to those agents.
    cluster.held_at_least(AGENTS + dialled).await?;
    let cut = Instant::now();
    let (still, _) = cluster
        .leader_when("every agent marked unreachable", |s| {
            let gone: BTreeSet<String> = s.unreachable.iter().map(|u| u.id.clone()).collect();
            gone == agent_ids
        })
        .await?;
    ensure!(still == leader, "master {still} leads, not {leader}");
    println!(
        "cut-and-heal: the leader marked every agent unreachable {:?} after the cut",
        cut.elapsed()
    );
    // Nothing was killed meanwhile: no kill and no launch of the leader's reaches an agent
    // (it may have placed replacements on the last agents it still counted reachable, but
    // those launches go nowhere, see the partitions' comment).
    let during = common::processes_marked(&web_marker);
    for (slot, pid) in &before {
        ensure!(
            during.iter().any(|p| p.pid == *pid),
            "{slot}'s process {pid} was killed during the cut: {during:?}"
        );
    }
    cluster.partitions.heal();
    let healed = Instant::now();
    let (back_at, _) = cluster
        .leader_when("every agent back after the heal", |s| {
            connected(s) == AGENTS && s.unreachable.is_empty()
        })
        .await?;
    let took = healed.elapsed();
    println!("cut-and-heal: every agent re-registered {took:?} after the heal");
    ensure!(
        back_at == leader,
        "master {back_at} leads after the heal, not {leader}"
    );

    let (_, _, after) = cluster
        .leader_when_settled("web settled", "web", SLOTS, |s| !s.recovering)
        .await?;
    for (slot, pid) in &before {
        match after.get(slot) {
            Some(now) if now == pid => {}
            Some(now) => println!("cut-and-heal: {slot} is run by a replacement ({pid} → {now})"),
            None => bail!("{slot} runs no process after the heal: {after:?}"),
        }
    }
    // It stays so (one process per slot, the same ones) through the convergence checks.
    cluster
        .service_stays(leader, "after the heal", "web", &after, &[])
        .await?;

    cluster.create_file("release")?;
    cluster
        .leader_when("every batch slot finished", |s| {
            batch_finished(s, "long", SLOTS) && batch_finished(s, "done", SLOTS)
        })
        .await?;
    let mut slots = slots_of("done", SLOTS);
    slots.extend(slots_of("long", SLOTS));
    each_ran_once(cluster, &slots).map_err(anyhow::Error::msg)?;
    Ok(())
}

/// Three masters that give agents back three seconds after a failover before marking the
/// missing ones unreachable, and check every second that jobs run what they ask for.
const SHORT_RECOVERY: &[&str] = &[
    "--reregistration-timeout",
    "3s",
    "--reconcile-interval",
    "1s",
];

/// A batch job's two tasks finish on agent a0 and the leader records them finished; right
/// after, the leader is SIGKILLed while a0 is paused (SIGSTOP), so that a0 re-registers late:
/// after the new leader's re-registration deadline, with a second agent (a1) back at once and
/// room on it, and after three of the new leader's convergence checks. Neither batch task may
/// run again, on a1 or anywhere (counted from what each run appends to its slot's file), and
/// once a0 is back the new leader has both slots finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_task_finished_before_a_failover_does_not_run_again_when_its_agent_is_late()
-> anyhow::Result<()> {
    Linked::run("finished-then-late", SHORT_RECOVERY, finished_then_late).await
}

async fn finished_then_late(cluster: &mut Linked) -> anyhow::Result<()> {
    const SLOTS: u32 = 2;
    cluster.start_agent(0).await?;
    let (leader, _) = cluster
        .leader_when("agent a0 registered", |s| connected(s) == 1)
        .await?;
    cluster
        .submit(leader, cluster.recorded_batch("once", SLOTS))
        .await?;
    let (_, state) = cluster
        .leader_when("both batch tasks finished", |s| {
            batch_finished(s, "once", SLOTS)
        })
        .await?;
    let a0 = agent_named(&state, "a0").context("agent a0")?.id.clone();
    let slots = slots_of("once", SLOTS);
    each_ran_once(cluster, &slots).map_err(anyhow::Error::msg)?;
    // Somewhere for a second run to go.
    cluster.start_agent(1).await?;
    let (leader, _) = cluster
        .leader_when("agent a1 registered", |s| connected(s) == 2)
        .await?;

    common::signal_child(
        cluster.agents[0].as_ref().context("agent a0")?,
        libc::SIGSTOP,
    )?;
    cluster.kill_master(leader).await?;
    let (successor, _) = cluster
        .leader_when("a new leader, a1 back, a0 marked unreachable", |s| {
            connected(s) == 1 && s.unreachable.iter().any(|u| u.id == a0) && !s.recovering
        })
        .await?;
    ensure!(successor != leader, "the killed master {leader} leads");
    // a0 stays away through three convergence checks of the new leader.
    let deadline = Instant::now() + CHECKS;
    while Instant::now() < deadline {
        each_ran_once(cluster, &slots).map_err(|e| anyhow::anyhow!("while a0 was away: {e}"))?;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    common::signal_child(
        cluster.agents[0].as_ref().context("agent a0")?,
        libc::SIGCONT,
    )?;
    let resumed = Instant::now();
    cluster
        .leader_when("a0 back, both slots finished", |s| {
            connected(s) == 2 && s.unreachable.is_empty() && batch_finished(s, "once", SLOTS)
        })
        .await?;
    println!(
        "finished-then-late: a0 re-registered {:?} after it resumed",
        resumed.elapsed()
    );
    each_ran_once(cluster, &slots).map_err(anyhow::Error::msg)?;
    Ok(())
}

/// Master flags of the tests that kill a leader with jobs just submitted: the leader checks
/// every second that jobs run what they ask for.
const RECONCILE_EVERY_SECOND: &[&str] = &["--reconcile-interval", "1s"];

/// Three masters, two agents; the leader is cut from the agents (nothing they send reaches
/// it; its launches still reach them), a service job of three slots and a batch job of three
/// are submitted to it, and it is SIGKILLed once every task has started (the service
/// processes run, each batch run recorded) but before any task's status could reach it (it
/// still has them all staging). The new leader ends with each service slot run by the same
/// one process that the dead leader launched, and each batch slot finished, having run once;
/// and it stays so through its convergence checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_with_its_launches_unconfirmed_leaves_each_slot_run_once()
-> anyhow::Result<()> {
    Linked::run(
        "killed-while-unconfirmed",
        RECONCILE_EVERY_SECOND,
        killed_while_unconfirmed,
    )
    .await
}

async fn killed_while_unconfirmed(cluster: &mut Linked) -> anyhow::Result<()> {
    const AGENTS: usize = 2;
    const SLOTS: u32 = 3;
    let leader = cluster.start_agents(AGENTS).await?;
    cluster.cut_agents_to(leader);
    cluster.held_at_least(AGENTS).await?;
    cluster.submit_web_and_once(leader, SLOTS).await?;
    let web_marker = cluster.marker("web");
    let slots = slots_of("once", SLOTS);
    let started = common::poll_within("every task started", DEADLINE, || {
        let processes = pids_by_slot(&common::processes_marked(&web_marker));
        let ran: Vec<usize> = slots
            .iter()
            .map(|slot| cluster.runs_of(slot).len())
            .collect();
        if processes.len() == SLOTS as usize && ran.iter().all(|n| *n >= 1) {
            Ok(processes)
        } else {
            Err(format!("web processes {processes:?}, batch runs {ran:?}"))
        }
    })
    .await?;
    // The precondition: the leader has heard of none of them.
    let (still, state) = cluster
        .leader_when("the cut leader's state", |_| true)
        .await?;
    ensure!(still == leader, "master {still} leads, not {leader}");
    let staging = |job| tasks_in(&state, job, model_pb::TaskState::Staging).len();
    ensure!(
        staging("web") == SLOTS as usize && staging("once") == SLOTS as usize,
        "the cut leader heard of the launches: {state:#?}"
    );
    cluster.kill_master(leader).await?;
    cluster.partitions.heal();

    let (successor, after) = web_and_once_after_failover(
        cluster,
        leader,
        AGENTS,
        SLOTS,
        "a new leader with the web and once tasks",
    )
    .await?;
    let launched: BTreeMap<String, i32> = started
        .iter()
        .map(|(slot, pids)| (slot.clone(), pids[0]))
        .collect();
    ensure!(
        after == launched,
        "the dead leader's launches ran {launched:?}, now {after:?}"
    );
    each_ran_once(cluster, &slots).map_err(anyhow::Error::msg)?;
    // And so it stays through three convergence checks.
    cluster
        .service_stays(successor, "after the failover", "web", &launched, &slots)
        .await
}

/// Three masters, two agents; a service job of three slots and a batch job of three are
/// submitted to the leader, which is SIGKILLed the moment it acknowledges the second
/// submission: its evaluations, plans and launches may be anywhere between the registry and
/// the agents. The new leader ends with each service slot run by exactly one process and
/// each batch slot finished, having run once; and it stays so through its convergence checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_as_it_acknowledges_a_submission_leaves_each_slot_run_once()
-> anyhow::Result<()> {
    Linked::run(
        "killed-after-submit",
        RECONCILE_EVERY_SECOND,
        killed_after_submit,
    )
    .await
}

async fn killed_after_submit(cluster: &mut Linked) -> anyhow::Result<()> {
    const AGENTS: usize = 2;
    const SLOTS: u32 = 3;
    let leader = cluster.start_agents(AGENTS).await?;
    cluster.submit_web_and_once(leader, SLOTS).await?;
    cluster.kill_master(leader).await?;

    let slots = slots_of("once", SLOTS);
    let (successor, settled) = web_and_once_after_failover(
        cluster,
        leader,
        AGENTS,
        SLOTS,
        "a new leader running web and once",
    )
    .await?;
    each_ran_once(cluster, &slots).map_err(anyhow::Error::msg)?;
    cluster
        .service_stays(successor, "after the failover", "web", &settled, &slots)
        .await
}

/// After master `killed`, which had been given the jobs `web` and `once` of `count` slots each
/// (see [`Linked::submit_web_and_once`]), was SIGKILLed: another master leads, out of
/// recovery, with `agents` agents connected, each slot of `once` finished and none of its
/// tasks live, and `web` settled at `count` slots (see [`service_settled`]). That leader's
/// index, and `web`'s processes by slot.
async fn web_and_once_after_failover(
    cluster: &Linked,
    killed: usize,
    agents: usize,
    count: u32,
    what: &str,
) -> anyhow::Result<(usize, BTreeMap<String, i32>)> {
    let (successor, _, web) = cluster
        .leader_when_settled(what, "web", count, |s| {
            !s.recovering && connected(s) == agents && batch_finished(s, "once", count)
        })
        .await?;
    ensure!(successor != killed, "the killed master {killed} leads");
    Ok((successor, web))
}

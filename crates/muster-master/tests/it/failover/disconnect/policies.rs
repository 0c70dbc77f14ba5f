//! Each `disconnect` policy, as an agent marked unreachable goes away and comes back.

use super::*;

/// An agent marked unreachable for missed heartbeats: its running task is UNKNOWN (in the
/// cluster state's unreachable agents, the job's status and the job's summary), and, the
/// default `disconnect` policy replacing it, a replacement is placed on the other agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_agents_task_is_unknown_and_replaced_by_default() -> anyhow::Result<()> {
    let cluster = AwayCluster::start(1, None).await?;
    let state = cluster.lose_a().await?;
    let away = task_away(&state, &cluster.a.id, &cluster.original.id).context("away")?;
    assert_eq!(away.name, cluster.original.name);
    assert_eq!(away.job, "web");

    let replacement = cluster.replacement_runs_on_b().await?;
    let master = cluster.leading();
    let status = job_status(master, "web").await?;
    let unknown: Vec<(&str, &str)> = status
        .tasks
        .iter()
        .filter_map(|t| Some((t.agent_id.as_str(), t.task.as_ref()?)))
        .filter(|(_, t)| is(t, model_pb::TaskState::Unknown))
        .map(|(agent, t)| (agent, t.id.as_str()))
        .collect();
    assert_eq!(
        unknown,
        [(cluster.a.id.as_str(), cluster.original.id.as_str())],
        "{:?}",
        status.tasks
    );
    assert!(
        status.tasks.iter().any(|t| t.agent_id == cluster.b.id
            && t.task.as_ref().is_some_and(|t| t.id == replacement.id)),
        "{:?}",
        status.tasks
    );
    let summary = job_summary(master, "web").await?;
    assert_eq!(
        (summary.unknown, summary.running, summary.lost),
        (1, 1, 0),
        "{summary:?}"
    );
    cluster.shutdown().await;
    Ok(())
}

/// `reconcile = keep_original`: the agent comes back with its task running while the
/// replacement runs elsewhere. Nothing is killed on the returning agent (its registration
/// reply's kill list is empty, and no KillTask reaches it); the replacement is stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returning_original_is_kept_and_its_replacement_stopped_with_keep_original()
-> anyhow::Result<()> {
    let policy = disconnect(true, 0, model_pb::Reconcile::KeepOriginal);
    let cluster = AwayCluster::start(1, policy).await?;
    cluster.lose_a().await?;
    let replacement = cluster.replacement_runs_on_b().await?;

    cluster.a_returns_and_b_stops(&replacement).await?;
    let (a, b) = (&cluster.a.id, &cluster.b.id);
    let state = state_when(cluster.leading(), "the original alone running", |s| {
        task_on(s, a, &cluster.original.id).is_some_and(|t| is(t, model_pb::TaskState::Running))
            && live_tasks_of(s, b, "web").is_empty()
    })
    .await?;
    assert!(state.unreachable.is_empty(), "{state:?}");
    // The return's evaluation changes nothing: no kill for the original, no new launch.
    let state = cluster.the_return_changed_nothing().await?;
    assert_eq!(live_tasks_of(&state, a, "web").len(), 1, "{state:?}");
    cluster.shutdown().await;
    Ok(())
}

/// `reconcile = keep_replacement`: the agent comes back with its task running while the
/// replacement runs elsewhere. The returning copy is in its registration reply's kill list
/// (and a KillTask for it follows); the replacement stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returning_original_is_killed_with_keep_replacement() -> anyhow::Result<()> {
    let policy = disconnect(true, 0, model_pb::Reconcile::KeepReplacement);
    let cluster = AwayCluster::start(1, policy).await?;
    cluster.lose_a().await?;
    let replacement = cluster.replacement_runs_on_b().await?;

    cluster
        .a_returns_and_its_copy_is_killed(&cluster.original, &replacement)
        .await?;
    assert!(cluster.b.nothing_launched(), "a third copy launched");
    cluster.shutdown().await;
    Ok(())
}

/// `replace = false` (with a `lost_after` that does not pass during the test): while the agent
/// is away its task keeps the slot, so the job's evaluation places nothing; when it comes back
/// the task is kept and nothing is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_not_replaced_keeps_its_slot_while_away_and_is_kept_on_return() -> anyhow::Result<()>
{
    let policy = disconnect(false, 600_000, model_pb::Reconcile::BestScore);
    let cluster = AwayCluster::start(1, policy).await?;
    cluster.lose_a().await?;
    let master = cluster.leading();
    let (a, b) = (&cluster.a.id, &cluster.b.id);

    // The evaluation the mark wrote runs, and places nothing.
    evaluated(master, "web", "AgentUnreachable", a).await?;
    let state = state_when(master, "the state while a is away", |_| true).await?;
    assert!(live_tasks_of(&state, b, "web").is_empty(), "{state:?}");
    assert!(cluster.b.nothing_launched(), "a replacement launched");
    let summary = job_summary(master, "web").await?;
    assert_eq!((summary.unknown, summary.running), (1, 0), "{summary:?}");

    let reply = cluster.a_comes_back(vec![cluster.original.clone()]).await?;
    assert!(reply.kill_tasks.is_empty(), "{reply:?}");
    let state = cluster.the_return_changed_nothing().await?;
    let kept = task_on(&state, a, &cluster.original.id).context("the original")?;
    assert!(is(kept, model_pb::TaskState::Running), "{kept:?}");
    assert!(state.unreachable.is_empty(), "{state:?}");
    cluster.shutdown().await;
    Ok(())
}

/// `replace = false` with a short `lost_after`: the task keeps its slot until then, and a
/// replacement is placed once it has passed (not before); the agent coming back after that has
/// its copy killed (lost for good), and the replacement stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_lost_for_good_is_replaced_then_and_killed_when_its_agent_returns()
-> anyhow::Result<()> {
    const LOST_AFTER_MS: u64 = 1_500;
    let policy = disconnect(false, LOST_AFTER_MS, model_pb::Reconcile::KeepOriginal);
    let cluster = AwayCluster::start(1, policy).await?;
    let marked_at_ms = cluster.lose_a_marked_at().await?;

    let launched = cluster
        .launched_once_lost(marked_at_ms, LOST_AFTER_MS)
        .await?;
    let replacement = cluster.replacement_running(&launched).await?;
    let master = cluster.leading();
    let (a, original) = (&cluster.a.id, &cluster.original.id);
    state_when(master, "the original lost for good", |s| {
        task_away(s, a, original).is_some_and(|t| is(t, model_pb::TaskState::Lost))
    })
    .await?;
    let summary = job_summary(master, "web").await?;
    assert_eq!(
        (summary.unknown, summary.lost, summary.running),
        (0, 1, 1),
        "{summary:?}"
    );

    // Back after lost_after: its copy is killed, even with keep_original.
    cluster
        .a_returns_and_its_copy_is_killed(&cluster.original, &replacement)
        .await?;
    cluster.shutdown().await;
    Ok(())
}

/// `reconcile = best_score`: when the agent comes back and a replacement runs, the copy on the
/// fuller agent stays. The replacement's agent is small, so its one task makes
/// it fuller than the returning agent: the returning copy is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn best_score_keeps_the_copy_on_the_fuller_agent() -> anyhow::Result<()> {
    let small = model_pb::Resources {
        cpus: 2.0,
        mem_mb: 512,
    };
    let policy = disconnect(true, 0, model_pb::Reconcile::BestScore);
    let cluster = AwayCluster::start_with(1, policy, small, true).await?;
    cluster.lose_a().await?;
    let replacement = cluster.replacement_runs_on_b().await?;

    cluster
        .a_returns_and_its_copy_is_killed(&cluster.original, &replacement)
        .await?;
    cluster.shutdown().await;
    Ok(())
}

/// A replacement placed but not running yet when the agent comes back does not count as
/// replacing the task: the returning copy stays (even with `keep_replacement`), and the
/// replacement is stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_not_yet_running_is_stopped_when_the_original_comes_back()
-> anyhow::Result<()> {
    let policy = disconnect(true, 0, model_pb::Reconcile::KeepReplacement);
    let cluster = AwayCluster::start(1, policy).await?;
    cluster.lose_a().await?;
    // Launched on b, which says nothing of it yet: STAGING.
    let staging = cluster.b.next_launch().await?;
    let b = &cluster.b.id;
    state_when(cluster.leading(), "the replacement staging on b", |s| {
        task_on(s, b, &staging.id).is_some_and(|t| is(t, model_pb::TaskState::Staging))
    })
    .await?;

    cluster.a_returns_and_b_stops(&staging).await?;
    cluster
        .settled(&cluster.a, &cluster.original, &cluster.b)
        .await?;
    cluster.shutdown().await;
    Ok(())
}

/// An agent that comes back without a task it ran when it was marked unreachable (it lost it
/// meanwhile): the task is LOST, and a late report of it running is answered with a kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_not_reported_on_return_is_lost_and_killed_if_it_turns_up() -> anyhow::Result<()> {
    let cluster = AwayCluster::start(1, None).await?;
    cluster.lose_a().await?;
    let replacement = cluster.replacement_runs_on_b().await?;

    let reply = cluster.a_comes_back(Vec::new()).await?;
    assert!(reply.kill_tasks.is_empty(), "{reply:?}");
    let master = cluster.leading();
    let (a, b) = (&cluster.a.id, &cluster.b.id);
    let original = &cluster.original.id;
    let lost = |status: &pb::JobStatusReply| {
        status.tasks.iter().any(|t| {
            t.agent_id == *a
                && t.task
                    .as_ref()
                    .is_some_and(|t| t.id == *original && is(t, model_pb::TaskState::Lost))
        })
    };
    let status = job_status(master, "web").await?;
    assert!(lost(&status), "{:?}", status.tasks);
    let summary = job_summary(master, "web").await?;
    assert_eq!(
        (summary.unknown, summary.lost, summary.running),
        (0, 1, 1),
        "{summary:?}"
    );

    // It turns up after all: killed, not run beside the replacement.
    cluster.a.report(
        &cluster.leader,
        &cluster.original,
        model_pb::TaskState::Running,
    )?;
    assert_eq!(cluster.a.next_kill().await?, *original);
    let state = state_when(master, "the state after the late report", |s| {
        task_on(s, a, original).is_some_and(|t| is(t, model_pb::TaskState::Killed))
    })
    .await?;
    let kept = task_on(&state, b, &replacement.id).context("the replacement")?;
    assert!(is(kept, model_pb::TaskState::Running), "{kept:?}");
    assert!(cluster.b.nothing_killed(), "the replacement was killed");
    cluster.shutdown().await;
    Ok(())
}

/// `reconcile = longest_running`: a task its agent had not reported running when it was
/// marked unreachable (it was STAGING) started after its replacement, as far as the master
/// knows: when the agent comes back with it running, the returning copy is killed and the
/// replacement stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn longest_running_keeps_the_replacement_of_a_task_not_running_when_marked()
-> anyhow::Result<()> {
    let policy = disconnect(true, 0, model_pb::Reconcile::LongestRunning);
    let cluster = AwayCluster::start_with(1, policy, AGENT, false).await?;
    let state = cluster.lose_a().await?;
    let away = task_away(&state, &cluster.a.id, &cluster.original.id).context("away")?;
    assert!(is(away, model_pb::TaskState::Unknown), "{away:?}");
    let replacement = cluster.replacement_runs_on_b().await?;

    let running = model_pb::Task {
        state: model_pb::TaskState::Running as i32,
        ..cluster.original.clone()
    };
    cluster
        .a_returns_and_its_copy_is_killed(&running, &replacement)
        .await?;
    cluster.shutdown().await;
    Ok(())
}

/// `replace = false` with a `lost_after` shorter than a second: the slot is still kept until
/// `lost_after` has passed, and only then is a replacement placed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_lost_after_still_keeps_the_slot_until_it_passes() -> anyhow::Result<()> {
    const LOST_AFTER_MS: u64 = 300;
    let policy = disconnect(false, LOST_AFTER_MS, model_pb::Reconcile::BestScore);
    let cluster = AwayCluster::start(1, policy).await?;
    let marked_at_ms = cluster.lose_a_marked_at().await?;
    cluster
        .launched_once_lost(marked_at_ms, LOST_AFTER_MS)
        .await?;
    cluster.shutdown().await;
    Ok(())
}

//! A new leader settles a returning agent from what the registry recorded of it.

use super::*;

/// The leader fails over while the agent is away: the new leader knows from the registry
/// what the agent ran, and applies the group's policy when the agent comes back to it
/// (`keep_replacement`: the returning copy is killed; the replacement stays).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_settles_a_returning_agent_from_the_registrys_record() -> anyhow::Result<()> {
    let policy = disconnect(true, 0, model_pb::Reconcile::KeepReplacement);
    let mut cluster = AwayCluster::start(3, policy).await?;
    cluster.lose_a().await?;
    let replacement = cluster.replacement_runs_on_b().await?;

    // The leader goes; its successor waits for b, which comes back with the replacement.
    cluster.fail_over().await?;
    let reply = cluster
        .b
        .come_back(&cluster.addresses(), vec![replacement.clone()])
        .await?;
    assert!(reply.kill_tasks.is_empty(), "{reply:?}");
    let (a, b) = (&cluster.a.id, &cluster.b.id);
    let original = &cluster.original.id;
    state_when(
        cluster.leading(),
        "recovered, a still away with its task unknown",
        |s| {
            s.is_leader
                && !s.recovering
                && task_on(s, b, &replacement.id)
                    .is_some_and(|t| is(t, model_pb::TaskState::Running))
                && task_away(s, a, original).is_some_and(|t| is(t, model_pb::TaskState::Unknown))
        },
    )
    .await?;

    let state = cluster
        .a_returns_and_its_copy_is_killed(&cluster.original, &replacement)
        .await?;
    assert!(state.unreachable.is_empty(), "{state:?}");
    cluster.shutdown().await;
    Ok(())
}

/// `replace = false` with a `lost_after`, and the leader fails over while the agent is away:
/// the new leader keeps the slot from the registry's record, places the replacement once
/// `lost_after` has passed (the delayed evaluation written with the mark), and kills the
/// agent's copy when it comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_replaces_a_task_lost_for_good_from_the_registrys_record() -> anyhow::Result<()>
{
    const LOST_AFTER_MS: u64 = 2_000;
    let policy = disconnect(false, LOST_AFTER_MS, model_pb::Reconcile::KeepOriginal);
    let mut cluster = AwayCluster::start(3, policy).await?;
    let marked_at_ms = cluster.lose_a_marked_at().await?;
    // The mark's own evaluation is done (placing nothing) before the leader goes.
    evaluated(cluster.leading(), "web", "AgentUnreachable", &cluster.a.id).await?;
    assert!(cluster.b.nothing_launched(), "replaced before lost_after");

    cluster.fail_over().await?;
    cluster
        .b
        .come_back(&cluster.addresses(), Vec::new())
        .await?;

    // The new leader places the replacement once lost_after has passed, not before.
    let launched = cluster
        .launched_once_lost(marked_at_ms, LOST_AFTER_MS)
        .await?;
    assert_eq!(launched.name, cluster.original.name);
    let replacement = cluster
        .b
        .report(&cluster.leader, &launched, model_pb::TaskState::Running)?;
    let (a, b) = (&cluster.a.id, &cluster.b.id);
    let original = &cluster.original.id;
    state_when(
        cluster.leading(),
        "the replacement running, the original lost",
        |s| {
            task_on(s, b, &replacement.id).is_some_and(|t| is(t, model_pb::TaskState::Running))
                && task_away(s, a, original).is_some_and(|t| is(t, model_pb::TaskState::Lost))
        },
    )
    .await?;

    // Back after lost_after: its copy is killed, even with keep_original.
    cluster
        .a_returns_and_its_copy_is_killed(&cluster.original, &replacement)
        .await?;
    cluster.shutdown().await;
    Ok(())
}

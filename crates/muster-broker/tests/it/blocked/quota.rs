//! Demands held back by a namespace's quota: they wait for their namespace (a task of it
//! ending, its quota changing), not for capacity; a change of the quota itself releases every
//! blocked evaluation of the namespace's jobs; and a namespace's change the scheduler did not
//! see releases at once.

use muster_broker::blocked::QuotaChange;

use super::*;

/// A demand of one small task held back by `namespace`'s task quota.
fn held(namespace: &str) -> Demand {
    Demand {
        over_quota: Some(format!(
            "namespace {namespace:?} is at its quota of 2 tasks (it would have 3)"
        )),
        ..demand(0.5, 64, vec![])
    }
}

fn freed(namespace: &str, quota_changed: bool, index: u64) -> BlockedMsg {
    BlockedMsg::QuotaFreed(QuotaChange {
        namespace: namespace.into(),
        quota_changed,
        index,
    })
}

#[tokio::test]
async fn a_quota_held_evaluation_waits_for_its_namespace_not_for_capacity() {
    let (queue, mut rx) = start(BlockedConfig::default());
    tell(
        &queue,
        blocked(eval("a-web", "team-a:web", 1, 5), vec![held("team-a")]),
    );
    tell(
        &queue,
        blocked(
            eval("a-db", "team-a:db", 2, 5),
            vec![demand(2.0, 1024, vec![])],
        ),
    );
    tell(
        &queue,
        blocked(eval("b-web", "team-b:web", 3, 5), vec![held("team-b")]),
    );
    // Room for anything: only the evaluation that wanted room goes.
    tell(&queue, change("r1", 64.0, 65536, 10));
    assert_eq!(stats(&queue).await.total_blocked, 2);
    assert_eq!(ids(&batches(&mut rx.unblocked)), set(&["a-db"]));

    // A task of team-a ended: team-a's quota-held evaluation goes, team-b's stays.
    tell(&queue, freed("team-a", false, 11));
    assert_eq!(blocked_ids(&queue).await, set(&["b-web"]));
    let released = batches(&mut rx.unblocked);
    assert_eq!(ids(&released), set(&["a-web"]));
    let description = &released[0][0].status_description;
    assert!(description.contains("\"team-a\""), "{description}");
    assert_eq!(released[0][0].status, EvalStatus::Pending);

    // A task ending does not release what waits for room; a changed quota releases every
    // blocked evaluation of the namespace (a scheduler that ignores quotas blocks on room).
    tell(
        &queue,
        blocked(
            eval("a-db", "team-a:db", 2, 12),
            vec![demand(2.0, 1024, vec![])],
        ),
    );
    tell(
        &queue,
        blocked(eval("a-web", "team-a:web", 1, 12), vec![held("team-a")]),
    );
    tell(&queue, freed("team-b", false, 13));
    assert_eq!(blocked_ids(&queue).await, set(&["a-db", "a-web"]));
    assert_eq!(ids(&batches(&mut rx.unblocked)), set(&["b-web"]));
    tell(&queue, freed("team-a", false, 14));
    assert_eq!(blocked_ids(&queue).await, set(&["a-db"]));
    assert_eq!(ids(&batches(&mut rx.unblocked)), set(&["a-web"]));
    tell(&queue, freed("team-a", true, 15));
    assert_eq!(stats(&queue).await.total_blocked, 0);
    let released = batches(&mut rx.unblocked);
    assert_eq!(ids(&released), set(&["a-db"]));
    assert!(
        released[0][0].status_description.contains("quota changed"),
        "{:?}",
        released[0][0].status_description
    );
}

#[tokio::test]
async fn a_namespace_change_the_scheduler_did_not_see_releases_at_once() {
    let (queue, mut rx) = start(BlockedConfig::default());
    tell(&queue, freed("team-a", false, 10));
    // Planned before the task ended: released as it arrives; planned after: it waits.
    tell(
        &queue,
        blocked(eval("early", "team-a:web", 1, 9), vec![held("team-a")]),
    );
    tell(
        &queue,
        blocked(eval("late", "team-a:api", 2, 10), vec![held("team-a")]),
    );
    // Another namespace's change, or waiting for room, is not released by it.
    tell(
        &queue,
        blocked(eval("other", "team-b:web", 3, 9), vec![held("team-b")]),
    );
    tell(
        &queue,
        blocked(
            eval("room", "team-a:db", 4, 9),
            vec![demand(1.0, 64, vec![])],
        ),
    );
    assert_eq!(blocked_ids(&queue).await, set(&["late", "other", "room"]));
    assert_eq!(ids(&batches(&mut rx.unblocked)), set(&["early"]));

    // A quota change the scheduler did not see releases any evaluation of the namespace.
    tell(&queue, BlockedMsg::Untrack("team-a:db".into()));
    tell(&queue, freed("team-a", true, 20));
    assert_eq!(blocked_ids(&queue).await, set(&["other"]));
    assert_eq!(ids(&batches(&mut rx.unblocked)), set(&["late"]));
    tell(
        &queue,
        blocked(
            eval("room", "team-a:db", 4, 19),
            vec![demand(1.0, 64, vec![])],
        ),
    );
    assert_eq!(blocked_ids(&queue).await, set(&["other"]));
    assert_eq!(ids(&batches(&mut rx.unblocked)), set(&["room"]));

    // An untracked quota-held evaluation is gone from the namespace's index too.
    tell(
        &queue,
        blocked(eval("gone", "team-b:api", 5, 30), vec![held("team-b")]),
    );
    tell(&queue, BlockedMsg::Untrack("team-b:api".into()));
    tell(&queue, BlockedMsg::Untrack("team-b:web".into()));
    tell(&queue, freed("team-b", false, 31));
    assert_eq!(stats(&queue).await.total_blocked, 0);
    assert!(batches(&mut rx.unblocked).is_empty());
    // Canceled: `room` untracked above, then these two.
    assert_eq!(
        ids(&batches(&mut rx.canceled)),
        set(&["gone", "other", "room"])
    );
}

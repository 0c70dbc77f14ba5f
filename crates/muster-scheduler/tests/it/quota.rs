//! Namespaces' quotas in the placing scheduler: a namespace's live tasks in the snapshot (of
//! every job, system jobs' too; terminal ones not), less the plan's stops, plus its
//! placements, stay within its quota; a slot past it is left unplaced with a demand naming
//! the namespace and the limit.

use crate::common;

use common::*;
use muster_model::{Job, Quota, SchedulerType};
use muster_scheduler::{ClusterSnapshot, Demand, Plan, Scheduler, TaskState, binpack, spread};

fn schedulers() -> Vec<Box<dyn Scheduler>> {
    vec![Box::new(binpack()), Box::new(spread())]
}

/// `snapshot` with `quota` for `namespace`.
fn with_quota(mut snapshot: ClusterSnapshot, namespace: &str, quota: Quota) -> ClusterSnapshot {
    snapshot.quotas.insert(namespace.to_owned(), quota);
    snapshot
}

fn tasks_quota(tasks: u64) -> Quota {
    Quota {
        tasks: Some(tasks),
        ..Quota::default()
    }
}

/// The plan's demands held back by a quota.
fn over_quota(plan: &Plan) -> Vec<&Demand> {
    plan.unplaced
        .iter()
        .filter(|d| d.over_quota.is_some())
        .collect()
}

#[test]
fn a_namespace_places_up_to_its_task_quota_counting_its_other_jobs_live_tasks() {
    let web = job(
        "team-a:web",
        SchedulerType::Service,
        vec![group("fe", 3, 0.5, 64)],
    );
    let snap = snapshot(
        3,
        vec![
            on(
                agent("a1", 16.0, 16384),
                vec![
                    // Counted: a live task of another job of the namespace.
                    task(
                        "team-a:db.main[0]",
                        "team-a:db",
                        "main",
                        1.0,
                        64,
                        TaskState::Running,
                    ),
                    // Not counted: ended, or of another namespace.
                    task(
                        "team-a:db.main[1]",
                        "team-a:db",
                        "main",
                        1.0,
                        64,
                        TaskState::Finished,
                    ),
                    task(
                        "team-a:db.main[2]",
                        "team-a:db",
                        "main",
                        1.0,
                        64,
                        TaskState::Lost,
                    ),
                    task(
                        "team-b:web.fe[0]",
                        "team-b:web",
                        "fe",
                        1.0,
                        64,
                        TaskState::Running,
                    ),
                    task("web.fe[0]", "web", "fe", 1.0, 64, TaskState::Running),
                ],
            ),
            agent("a2", 16.0, 16384),
        ],
        vec![web.clone()],
    );
    let snap = with_quota(snap, "team-a", tasks_quota(3));
    for mut scheduler in schedulers() {
        let plan = scheduler.schedule(&eval_for(&web), &snap);
        assert_eq!(plan.place.len(), 2, "{}: {plan:?}", scheduler.name());
        let held = over_quota(&plan);
        assert_eq!(held.len(), 1, "one demand for the group: {plan:?}");
        assert_eq!(
            held[0].over_quota.as_deref(),
            Some("namespace \"team-a\" is at its quota of 3 tasks (it would have 4)")
        );
        assert_eq!(held[0].resources, res(0.5, 64));
        assert_eq!(plan.unplaced.len(), 1, "no demand for want of room");
    }

    // Another namespace, and a namespace without a quota, place everything.
    let other = job(
        "team-b:web",
        SchedulerType::Service,
        vec![group("fe", 3, 0.5, 64)],
    );
    let mut snap = snap.clone();
    snap.jobs.insert(other.name.clone(), other.clone());
    let plan = binpack().schedule(&eval_for(&other), &snap);
    // Its slot 0 runs already.
    assert_eq!((plan.place.len(), plan.unplaced.len()), (2, 0), "{plan:?}");
}

#[test]
fn a_cpu_quota_leaves_the_slots_that_would_pass_it() {
    let web = job(
        "team-a:web",
        SchedulerType::Service,
        vec![group("fe", 4, 0.75, 64)],
    );
    let snap = with_quota(
        snapshot(3, vec![agent("a1", 16.0, 16384)], vec![web.clone()]),
        "team-a",
        Quota {
            cpus: Some(2.0),
            ..Quota::default()
        },
    );
    for mut scheduler in schedulers() {
        let plan = scheduler.schedule(&eval_for(&web), &snap);
        // 2 × 0.75 = 1.5 fits in 2; a third would need 2.25.
        assert_eq!(plan.place.len(), 2, "{}: {plan:?}", scheduler.name());
        let held = over_quota(&plan);
        assert_eq!(held.len(), 1, "{plan:?}");
        let reason = held[0].over_quota.as_deref().unwrap_or_default();
        assert!(
            reason.starts_with("namespace \"team-a\" is at its quota of 2 cpus"),
            "{reason}"
        );
    }

    // A memory quota likewise.
    let snap = with_quota(
        snap,
        "team-a",
        Quota {
            mem_mb: Some(200),
            ..Quota::default()
        },
    );
    let plan = spread().schedule(&eval_for(&web), &snap);
    assert_eq!(plan.place.len(), 3, "{plan:?}");
    assert_eq!(over_quota(&plan).len(), 1);
}

#[test]
fn the_tasks_a_plan_stops_free_quota_for_its_placements() {
    // Version 2 changed `fe`: both tasks are replaced in one plan, at the quota all along.
    let mut fe = group("fe", 2, 1.0, 64);
    fe.spec_version = 2;
    let mut web = job("team-a:web", SchedulerType::Service, vec![fe]);
    web.version = 2;
    let at_v1 = |slot: &str| {
        let mut task = task(slot, "team-a:web", "fe", 1.0, 64, TaskState::Running);
        task.job_version = 1;
        task
    };
    let snap = with_quota(
        snapshot(
            3,
            vec![on(
                agent("a1", 16.0, 16384),
                vec![at_v1("team-a:web.fe[0]"), at_v1("team-a:web.fe[1]")],
            )],
            vec![web.clone()],
        ),
        "team-a",
        tasks_quota(2),
    );
    for mut scheduler in schedulers() {
        let plan = scheduler.schedule(&eval_for(&web), &snap);
        assert_eq!(
            (plan.stop.len(), plan.place.len(), plan.unplaced.len()),
            (2, 2, 0),
            "{}: {plan:?}",
            scheduler.name()
        );
    }

    // Placed and stopped, then planned again: the new tasks count, the killed ones not.
    let mut after = snap.clone();
    let plan = binpack().schedule(&eval_for(&web), &snap);
    apply(&mut after, &plan);
    let mut grown: Job = web.clone();
    grown.groups[0].count = 3;
    after.jobs.insert(grown.name.clone(), grown.clone());
    let plan = binpack().schedule(&eval_for(&grown), &after);
    assert!(plan.place.is_empty(), "{plan:?}");
    assert_eq!(over_quota(&plan).len(), 1, "{plan:?}");
}

#[test]
fn a_system_jobs_tasks_count_and_are_held_back_alike() {
    let agents = ["a1", "a2", "a3"];
    let logs = job(
        "team-a:logs",
        SchedulerType::System,
        vec![group("ship", 0, 0.25, 32)],
    );
    let web = job(
        "team-a:web",
        SchedulerType::Service,
        vec![group("fe", 1, 0.25, 32)],
    );
    let snap = with_quota(
        snapshot(
            3,
            agents.iter().map(|a| agent(a, 4.0, 4096)).collect(),
            vec![logs.clone(), web.clone()],
        ),
        "team-a",
        tasks_quota(2),
    );
    let plan = spread().schedule(&eval_for(&logs), &snap);
    assert_eq!(plan.place.len(), 2, "{plan:?}");
    assert_eq!(over_quota(&plan).len(), 1, "{plan:?}");

    // With the system job's two tasks live, the service job has no room in the quota.
    let mut after = snap.clone();
    apply(&mut after, &plan);
    let plan = spread().schedule(&eval_for(&web), &after);
    assert!(plan.place.is_empty(), "{plan:?}");
    let held = over_quota(&plan);
    assert_eq!(held.len(), 1, "{plan:?}");
    assert!(
        held[0]
            .over_quota
            .as_deref()
            .is_some_and(|r| r.contains("quota of 2 tasks")),
        "{held:?}"
    );
}

//! Rolling updates: a group with an update policy replaces its outdated tasks as its job's
//! deployment allows (`max_parallel` at a time, each slot's new task counted healthy before
//! the next), with canaries in slots of their own until promoted; a paused or failed
//! deployment replaces nothing more.

use crate::common;

use common::*;
use muster_model::{Deployment, DeploymentStatus, Job, SchedulerType, UpdatePolicy};
use muster_scheduler::{ClusterSnapshot, TaskState, TaskView, reconcile};

/// A task of `web.fe` in slot `slot`, placed at `version`, with id `{slot}-v{version}`.
fn fe_task(slot: &str, version: u64, state: TaskState) -> TaskView {
    let mut task = with_id(
        task(slot, "web", "fe", 0.1, 16, state),
        &format!("{slot}-v{version}"),
    );
    task.job_version = version;
    task
}

/// `web` at version 2, whose group `fe` (3 tasks) changed at 2 and rolls by `update`.
fn web(scheduler: SchedulerType, update: UpdatePolicy) -> Job {
    let mut fe = group("fe", 3, 0.1, 16);
    fe.spec_version = 2;
    fe.update = Some(update);
    let mut web = job("web", scheduler, vec![fe]);
    web.version = 2;
    web
}

/// Three version-1 tasks on one agent, and `web`'s deployment.
fn rolling(web: &Job) -> (ClusterSnapshot, Deployment) {
    let tasks = (0..3)
        .map(|i| fe_task(&format!("web.fe[{i}]"), 1, TaskState::Running))
        .collect();
    let snap = snapshot(
        1,
        vec![on(agent("a1", 8.0, 8192), tasks)],
        vec![web.clone()],
    );
    let Some(deployment) = Deployment::of(web, 0) else {
        panic!("web deploys")
    };
    (snap, deployment)
}

fn with(mut snap: ClusterSnapshot, deployment: &Deployment) -> ClusterSnapshot {
    snap.deployments
        .insert(deployment.job.clone(), deployment.clone());
    snap
}

fn stopped(plan_stop: &[muster_scheduler::Stop]) -> Vec<String> {
    plan_stop.iter().map(|s| s.task_id.to_string()).collect()
}

#[test]
fn outdated_tasks_are_replaced_max_parallel_at_a_time_each_after_the_last_is_healthy() {
    let web = web(SchedulerType::Service, UpdatePolicy::default());
    let (snap, mut deployment) = rolling(&web);
    let r = reconcile(&eval_for(&web), &with(snap.clone(), &deployment));
    assert_eq!(stopped(&r.stop), ["web.fe[0]-v1"]);
    assert_eq!(
        r.missing
            .iter()
            .map(|m| m.name.as_str())
            .collect::<Vec<_>>(),
        ["web.fe[0]"]
    );
    // Its replacement placed and not healthy yet: nothing more.
    let mut snap = snap;
    let placed = fe_task("web.fe[0]", 2, TaskState::Running);
    std::sync::Arc::make_mut(&mut snap.agents[0]).update_tasks(|tasks| {
        tasks.retain(|t| t.id() != "web.fe[0]-v1");
        tasks.push(std::sync::Arc::new(placed));
    });
    let r = reconcile(&eval_for(&web), &with(snap.clone(), &deployment));
    assert!(r.stop.is_empty() && r.missing.is_empty(), "{r:?}");
    // Counted healthy: the next one goes.
    if let Some(g) = deployment.groups.get_mut("fe") {
        g.healthy.insert("web.fe[0]-v2".into());
    }
    let r = reconcile(&eval_for(&web), &with(snap.clone(), &deployment));
    assert_eq!(stopped(&r.stop), ["web.fe[1]-v1"]);
    // Paused or failed: nothing more is replaced.
    for status in [DeploymentStatus::Paused, DeploymentStatus::Failed] {
        deployment.status = status;
        let r = reconcile(&eval_for(&web), &with(snap.clone(), &deployment));
        assert!(
            r.stop.is_empty() && r.missing.is_empty(),
            "{status:?}: {r:?}"
        );
    }
    // Without a deployment, everything outdated goes at once, as before.
    let r = reconcile(&eval_for(&web), &snap);
    assert_eq!(stopped(&r.stop), ["web.fe[1]-v1", "web.fe[2]-v1"]);
}

#[test]
fn canaries_run_beside_the_old_tasks_until_promoted_then_give_way() {
    let update = UpdatePolicy {
        max_parallel: 2,
        canary: 1,
        ..UpdatePolicy::default()
    };
    let web = web(SchedulerType::Service, update);
    let (snap, mut deployment) = rolling(&web);
    let r = reconcile(&eval_for(&web), &with(snap.clone(), &deployment));
    assert!(r.stop.is_empty(), "no old task stops for a canary: {r:?}");
    assert_eq!(
        r.missing
            .iter()
            .map(|m| m.name.as_str())
            .collect::<Vec<_>>(),
        ["web.fe[canary-0]"]
    );
    // The canary runs, healthy: still nothing replaced until the promotion.
    let mut snap = snap;
    std::sync::Arc::make_mut(&mut snap.agents[0]).update_tasks(|tasks| {
        tasks.push(std::sync::Arc::new(fe_task(
            "web.fe[canary-0]",
            2,
            TaskState::Running,
        )))
    });
    if let Some(g) = deployment.groups.get_mut("fe") {
        g.healthy.insert("web.fe[canary-0]-v2".into());
    }
    let r = reconcile(&eval_for(&web), &with(snap.clone(), &deployment));
    assert!(r.stop.is_empty() && r.missing.is_empty(), "{r:?}");
    // Promoted: the canary gives way, and two old tasks are replaced.
    if let Some(g) = deployment.groups.get_mut("fe") {
        g.promoted = true;
    }
    let r = reconcile(&eval_for(&web), &with(snap, &deployment));
    assert_eq!(
        stopped(&r.stop),
        ["web.fe[0]-v1", "web.fe[1]-v1", "web.fe[canary-0]-v2"]
    );
}

#[test]
fn a_system_groups_canaries_are_its_first_replacements() {
    let update = UpdatePolicy {
        canary: 1,
        ..UpdatePolicy::default()
    };
    let web = web(SchedulerType::System, update);
    let agents = (1..=3)
        .map(|n| {
            let name = format!("a{n}");
            let slot = format!("web.fe[{name}]");
            on(
                agent(&name, 8.0, 8192),
                vec![fe_task(&slot, 1, TaskState::Running)],
            )
        })
        .collect();
    let snap = snapshot(1, agents, vec![web.clone()]);
    let Some(deployment) = Deployment::of(&web, 0) else {
        panic!("web deploys")
    };
    let r = reconcile(&eval_for(&web), &with(snap, &deployment));
    assert_eq!(stopped(&r.stop), ["web.fe[a1]-v1"]);
    assert_eq!(r.missing.len(), 1);
}

#[test]
fn an_agent_that_takes_no_tasks_does_not_stall_a_system_roll() {
    let web = web(SchedulerType::System, UpdatePolicy::default());
    let mut agents: Vec<_> = (1..=2)
        .map(|n| {
            let name = format!("a{n}");
            let slot = format!("web.fe[{name}]");
            on(
                agent(&name, 8.0, 8192),
                vec![fe_task(&slot, 1, TaskState::Running)],
            )
        })
        .collect();
    // A third agent takes no tasks (drained, say): its empty slot is placed by nobody.
    let mut idle = agent("a3", 8.0, 8192);
    idle.eligible = false;
    agents.push(idle);
    let snap = snapshot(1, agents, vec![web.clone()]);
    let Some(deployment) = Deployment::of(&web, 0) else {
        panic!("web deploys")
    };
    let r = reconcile(&eval_for(&web), &with(snap, &deployment));
    assert_eq!(stopped(&r.stop), ["web.fe[a1]-v1"]);
}

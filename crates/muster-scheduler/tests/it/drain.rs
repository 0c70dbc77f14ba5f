//! Draining agents as the schedulers see them: service tasks move a migration step at a time,
//! each running until its replacement runs; batch tasks stay to their end; system tasks go
//! last; past the deadline everything stops; nothing is placed on an ineligible agent.

use crate::common;

use std::sync::Arc;

use common::*;
use muster_model::{DrainPhase, SchedulerType};
use muster_scheduler::{AgentView, ClusterSnapshot, Reconciled, TaskState, binpack, reconcile};

fn missing_names(r: &Reconciled) -> Vec<&str> {
    r.missing.iter().map(|s| s.name.as_str()).collect()
}

fn stopped_ids(r: &Reconciled) -> Vec<&str> {
    r.stop.iter().map(|s| s.task_id.as_str()).collect()
}

fn draining(mut agent: AgentView, phase: DrainPhase) -> AgentView {
    agent.eligible = false;
    agent.drain = phase;
    agent
}

fn ineligible(mut agent: AgentView) -> AgentView {
    agent.eligible = false;
    agent
}

fn running(name: &str, job: &str, group: &str) -> muster_scheduler::TaskView {
    task(name, job, group, 1.0, 64, TaskState::Running)
}

/// Sets the state of the task `id` wherever it runs in `snapshot`.
fn set_state(snapshot: &mut ClusterSnapshot, id: &str, state: TaskState) {
    for agent in &mut snapshot.agents {
        Arc::make_mut(agent).update_tasks(|tasks| {
            for task in tasks.iter_mut().filter(|t| *t.id() == *id) {
                Arc::make_mut(task).state = state;
            }
        });
    }
}

/// The live tasks of slot `name`, as (agent, state).
fn holders(snapshot: &ClusterSnapshot, name: &str) -> Vec<(String, TaskState)> {
    snapshot
        .agents
        .iter()
        .flat_map(|agent| {
            agent
                .tasks()
                .iter()
                .filter(|t| t.name() == name && !t.state.is_terminal())
                .map(|t| (agent.id.0.clone(), t.state))
        })
        .collect()
}

#[test]
fn service_tasks_move_a_step_at_a_time_and_stop_only_once_their_replacement_runs() {
    let web = job("web", SchedulerType::Service, vec![group("fe", 3, 1.0, 64)]);
    let mut snap = snapshot(
        1,
        vec![
            draining(
                on(
                    agent("a1", 8.0, 8192),
                    vec![
                        running("web.fe[0]", "web", "fe"),
                        running("web.fe[1]", "web", "fe"),
                        running("web.fe[2]", "web", "fe"),
                    ],
                ),
                DrainPhase::Migrating,
            ),
            agent("a2", 8.0, 8192),
        ],
        vec![web.clone()],
    );
    let mut scheduler = binpack();
    // The first slot moves (the default step is 1): its replacement goes to a2, nothing stops.
    let r = reconcile(&eval_for(&web), &snap);
    assert_eq!(missing_names(&r), ["web.fe[0]"]);
    assert!(r.stop.is_empty(), "{:?}", r.stop);
    let mut plan = scheduler.plan(&eval_for(&web), &snap);
    for step in 0..3 {
        let slot = format!("web.fe[{step}]");
        let placed: Vec<(&str, &str)> = plan
            .place
            .iter()
            .map(|p| (p.name.as_str(), p.agent.0.as_str()))
            .collect();
        assert_eq!(placed, [(slot.as_str(), "a2")], "step {step}");
        apply(&mut snap, &plan);
        let replacement = plan.place[0].task_id.clone();

        // While the replacement starts, the old task runs on and no other slot moves.
        set_state(&mut snap, &replacement, TaskState::Starting);
        let r = reconcile(&eval_for(&web), &snap);
        assert!(
            r.missing.is_empty() && r.stop.is_empty(),
            "step {step}: {r:?}"
        );
        assert_eq!(holders(&snap, &slot).len(), 2);

        // Once it runs, the old one stops and the next slot moves.
        set_state(&mut snap, &replacement, TaskState::Running);
        plan = scheduler.plan(&eval_for(&web), &snap);
        let stopped: Vec<&str> = plan.stop.iter().map(|s| s.task_id.as_str()).collect();
        assert_eq!(stopped, [format!("{slot}-t").as_str()], "step {step}");
        apply(&mut snap, &plan);
        // Never fewer running than the count: every slot has a running task.
        for i in 0..3 {
            let name = format!("web.fe[{i}]");
            let states = holders(&snap, &name);
            assert!(
                i > step || states == [("a2".to_owned(), TaskState::Running)],
                "{name} at step {step}: {states:?}"
            );
            assert!(
                states.iter().any(|(_, state)| *state == TaskState::Running),
                "{name} has no running task at step {step}"
            );
        }
        // `apply` placed the next slot's replacement: the next round checks it.
        for agent in &mut snap.agents {
            Arc::make_mut(agent).update_tasks(|tasks| {
                tasks.retain(|t| !plan.place.iter().any(|p| *p.task_id == *t.id()))
            });
        }
    }
    assert!(plan.place.is_empty(), "nothing left to move");
    assert!(
        snap.agent(&id("a1"))
            .is_some_and(|a| a.tasks().iter().all(|t| t.state.is_terminal())),
        "a1 is empty"
    );
}

#[test]
fn a_larger_migration_step_moves_that_many_at_once() {
    let mut fe = group("fe", 3, 1.0, 64);
    fe.migrate_max_parallel = 2;
    let web = job("web", SchedulerType::Service, vec![fe]);
    let snap = snapshot(
        1,
        vec![
            draining(
                on(
                    agent("a1", 8.0, 8192),
                    vec![
                        running("web.fe[0]", "web", "fe"),
                        running("web.fe[1]", "web", "fe"),
                        running("web.fe[2]", "web", "fe"),
                    ],
                ),
                DrainPhase::Migrating,
            ),
            agent("a2", 8.0, 8192),
        ],
        vec![web.clone()],
    );
    let r = reconcile(&eval_for(&web), &snap);
    assert_eq!(missing_names(&r), ["web.fe[0]", "web.fe[1]"]);
    assert!(r.stop.is_empty());
}

#[test]
fn batch_tasks_stay_to_their_end_until_the_deadline_then_everything_stops() {
    let crunch = job(
        "crunch",
        SchedulerType::Batch,
        vec![group("work", 1, 1.0, 64)],
    );
    let web = job("web", SchedulerType::Service, vec![group("fe", 1, 1.0, 64)]);
    let tasks = vec![
        running("crunch.work[0]", "crunch", "work"),
        running("web.fe[0]", "web", "fe"),
    ];
    let migrating = snapshot(
        1,
        vec![
            draining(
                on(agent("a1", 8.0, 8192), tasks.clone()),
                DrainPhase::Migrating,
            ),
            agent("a2", 8.0, 8192),
        ],
        vec![crunch.clone(), web.clone()],
    );
    let r = reconcile(&eval_for(&crunch), &migrating);
    assert!(r.missing.is_empty() && r.stop.is_empty(), "{r:?}");

    let past_deadline = snapshot(
        2,
        vec![
            draining(on(agent("a1", 8.0, 8192), tasks), DrainPhase::Stopping),
            agent("a2", 8.0, 8192),
        ],
        vec![crunch.clone(), web.clone()],
    );
    for (job, slot) in [(&crunch, "crunch.work[0]"), (&web, "web.fe[0]")] {
        let r = reconcile(&eval_for(job), &past_deadline);
        assert_eq!(stopped_ids(&r), [format!("{slot}-t").as_str()]);
        assert_eq!(missing_names(&r), [slot], "placed elsewhere");
        let plan = binpack().plan(&eval_for(job), &past_deadline);
        assert_eq!(plan.place.len(), 1);
        assert_eq!(plan.place[0].agent.0, "a2");
    }
}

#[test]
fn system_tasks_go_last_and_no_system_slot_is_placed_on_an_ineligible_agent() {
    let logs = job(
        "logs",
        SchedulerType::System,
        vec![group("ship", 0, 0.1, 16)],
    );
    let web = job("web", SchedulerType::Service, vec![group("fe", 1, 1.0, 64)]);
    let ship = || running("logs.ship[a1]", "logs", "ship");
    let with_web = snapshot(
        1,
        vec![draining(
            on(
                agent("a1", 8.0, 8192),
                vec![ship(), running("web.fe[0]", "web", "fe")],
            ),
            DrainPhase::Migrating,
        )],
        vec![logs.clone(), web.clone()],
    );
    let r = reconcile(&eval_for(&logs), &with_web);
    assert!(r.stop.is_empty() && r.missing.is_empty(), "{r:?}");

    let alone = snapshot(
        2,
        vec![draining(
            on(agent("a1", 8.0, 8192), vec![ship()]),
            DrainPhase::Migrating,
        )],
        vec![logs.clone(), web.clone()],
    );
    let r = reconcile(&eval_for(&logs), &alone);
    assert_eq!(stopped_ids(&r), ["logs.ship[a1]-t"]);
    assert!(r.missing.is_empty(), "not placed again there: {r:?}");

    // Ineligible without a drain: its system task stays, and none is placed there.
    let ineligible = ineligible(agent("a1", 8.0, 8192));
    let kept = snapshot(
        3,
        vec![on(ineligible.clone(), vec![ship()])],
        vec![logs.clone()],
    );
    let r = reconcile(&eval_for(&logs), &kept);
    assert!(r.stop.is_empty() && r.missing.is_empty(), "{r:?}");
    let empty = snapshot(4, vec![ineligible], vec![logs.clone()]);
    let plan = binpack().plan(&eval_for(&logs), &empty);
    assert!(
        plan.place.is_empty() && plan.unplaced.is_empty(),
        "{plan:?}"
    );
}

#[test]
fn nothing_is_placed_on_an_ineligible_agent() {
    let web = job("web", SchedulerType::Service, vec![group("fe", 2, 1.0, 64)]);
    let ineligible = ineligible(agent("a1", 8.0, 8192));
    let only_it = snapshot(1, vec![ineligible.clone()], vec![web.clone()]);
    let plan = binpack().plan(&eval_for(&web), &only_it);
    assert!(plan.place.is_empty());
    assert_eq!(plan.unplaced.len(), 1, "blocked, waiting for room");

    let with_another = snapshot(
        2,
        vec![ineligible, agent("a2", 1.0, 8192)],
        vec![web.clone()],
    );
    let plan = binpack().plan(&eval_for(&web), &with_another);
    let agents: Vec<&str> = plan.place.iter().map(|p| p.agent.0.as_str()).collect();
    assert_eq!(agents, ["a2"], "one fits on a2, none on a1");
}

#[test]
fn a_checked_service_task_moves_only_once_its_replacement_is_healthy() {
    let mut fe = group("fe", 1, 1.0, 64);
    fe.ports = vec![muster_model::PortRequest {
        label: "http".into(),
        static_port: 0,
    }];
    fe.checks = vec![muster_model::Check {
        name: "alive".into(),
        port: "http".into(),
        ..muster_model::Check::default()
    }];
    let web = job("web", SchedulerType::Service, vec![fe]);
    let mut snap = snapshot(
        1,
        vec![
            draining(
                on(
                    agent("a1", 8.0, 8192),
                    vec![running("web.fe[0]", "web", "fe")],
                ),
                DrainPhase::Migrating,
            ),
            agent("a2", 8.0, 8192),
        ],
        vec![web.clone()],
    );
    let plan = binpack().plan(&eval_for(&web), &snap);
    apply(&mut snap, &plan);
    let replacement = plan.place[0].task_id.clone();
    let set_health = |snap: &mut ClusterSnapshot, health| {
        for agent in &mut snap.agents {
            Arc::make_mut(agent).update_tasks(|tasks| {
                for task in tasks.iter_mut().filter(|t| *t.id() == *replacement) {
                    let task = Arc::make_mut(task);
                    task.state = TaskState::Running;
                    task.health = health;
                }
            });
        }
    };
    // Running, its checks not passed yet: the old task runs on.
    set_health(&mut snap, muster_model::TaskHealth::Starting);
    let r = reconcile(&eval_for(&web), &snap);
    assert!(r.stop.is_empty() && r.missing.is_empty(), "{r:?}");
    // Healthy: the old task stops.
    set_health(&mut snap, muster_model::TaskHealth::Healthy);
    let r = reconcile(&eval_for(&web), &snap);
    assert_eq!(stopped_ids(&r), ["web.fe[0]-t"]);
}

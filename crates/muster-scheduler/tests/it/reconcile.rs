//! Reconciliation: which slots a job wants, which are missing, which tasks stop.

use crate::common;

use std::collections::HashSet;

use common::*;
use muster_model::{ConstraintOp, SchedulerType};
use muster_scheduler::{JobIndex, Reconciled, Stop, TaskState, reconcile, wants_counted_slot};

fn missing_names(r: &Reconciled) -> Vec<&str> {
    r.missing.iter().map(|s| s.name.as_str()).collect()
}

fn stopped_ids(r: &Reconciled) -> Vec<&str> {
    r.stop.iter().map(|s| s.task_id.as_str()).collect()
}

#[test]
fn service_count_up_wants_only_the_new_slots() {
    let web = job(
        "web",
        SchedulerType::Service,
        vec![group("fe", 3, 1.0, 100)],
    );
    let snap = snapshot(
        7,
        vec![on(
            agent("a1", 8.0, 8192),
            vec![task("web.fe[0]", "web", "fe", 1.0, 100, TaskState::Running)],
        )],
        vec![web.clone()],
    );
    let r = reconcile(&eval_for(&web), &snap);
    assert_eq!(r.wanted, 3);
    assert_eq!(missing_names(&r), ["web.fe[1]", "web.fe[2]"]);
    assert!(r.stop.is_empty());
    assert_eq!(r.job_version, 1);
    assert_eq!(r.scheduler, Some(SchedulerType::Service));
    assert!(
        r.missing
            .iter()
            .all(|s| s.agent.is_none() && s.group.name == "fe")
    );
}

#[test]
fn service_count_down_stops_the_extra_tasks() {
    let web = job(
        "web",
        SchedulerType::Service,
        vec![group("fe", 1, 1.0, 100)],
    );
    let snap = snapshot(
        7,
        vec![
            on(
                agent("a1", 8.0, 8192),
                vec![
                    task("web.fe[0]", "web", "fe", 1.0, 100, TaskState::Running),
                    task("web.fe[2]", "web", "fe", 1.0, 100, TaskState::Staging),
                ],
            ),
            on(
                agent("a2", 8.0, 8192),
                vec![task("web.fe[1]", "web", "fe", 1.0, 100, TaskState::Running)],
            ),
        ],
        vec![web.clone()],
    );
    let r = reconcile(&eval_for(&web), &snap);
    assert!(r.missing.is_empty());
    assert_eq!(
        r.stop,
        [
            Stop {
                agent: id("a1"),
                task_id: "web.fe[2]-t".into()
            },
            Stop {
                agent: id("a2"),
                task_id: "web.fe[1]-t".into()
            },
        ]
    );
}

#[test]
fn ended_service_tasks_are_placed_again_and_not_stopped() {
    let web = job(
        "web",
        SchedulerType::Service,
        vec![group("fe", 4, 1.0, 100)],
    );
    let snap = snapshot(
        7,
        vec![on(
            agent("a1", 8.0, 8192),
            vec![
                task("web.fe[0]", "web", "fe", 1.0, 100, TaskState::Failed),
                task("web.fe[1]", "web", "fe", 1.0, 100, TaskState::Running),
                task("web.fe[2]", "web", "fe", 1.0, 100, TaskState::Lost),
                task("web.fe[3]", "web", "fe", 1.0, 100, TaskState::Finished),
            ],
        )],
        vec![web.clone()],
    );
    let r = reconcile(&eval_for(&web), &snap);
    assert_eq!(missing_names(&r), ["web.fe[0]", "web.fe[2]", "web.fe[3]"]);
    assert!(r.stop.is_empty(), "terminal tasks are never stopped");
}

#[test]
fn batch_slots_that_finished_are_not_placed_again() {
    let etl = job(
        "etl",
        SchedulerType::Batch,
        vec![group("step", 4, 1.0, 100)],
    );
    let snap = snapshot(
        7,
        vec![on(
            agent("a1", 8.0, 8192),
            vec![
                task("etl.step[0]", "etl", "step", 1.0, 100, TaskState::Finished),
                task("etl.step[1]", "etl", "step", 1.0, 100, TaskState::Failed),
                task("etl.step[2]", "etl", "step", 1.0, 100, TaskState::Running),
            ],
        )],
        vec![etl.clone()],
    );
    let r = reconcile(&eval_for(&etl), &snap);
    assert_eq!(missing_names(&r), ["etl.step[1]", "etl.step[3]"]);
    assert!(r.stop.is_empty());
}

#[test]
fn system_jobs_want_one_slot_per_eligible_agent() {
    let logs = job(
        "logs",
        SchedulerType::System,
        vec![constrained(
            group("ship", 0, 0.5, 64),
            "rack",
            ConstraintOp::Equal,
            "r1",
        )],
    );
    let snap = snapshot(
        7,
        vec![
            // Listed out of order: slots come out ordered by agent id.
            on(
                with_attr(agent("a3", 4.0, 4096), "rack", "r2"),
                vec![task(
                    "logs.ship[a3]",
                    "logs",
                    "ship",
                    0.5,
                    64,
                    TaskState::Running,
                )],
            ),
            with_attr(agent("a2", 4.0, 4096), "rack", "r1"),
            on(
                with_attr(agent("a1", 4.0, 4096), "rack", "r1"),
                vec![task(
                    "logs.ship[a1]",
                    "logs",
                    "ship",
                    0.5,
                    64,
                    TaskState::Running,
                )],
            ),
            agent("a4", 4.0, 4096),
        ],
        vec![logs.clone()],
    );
    let r = reconcile(&eval_for(&logs), &snap);
    assert_eq!(r.wanted, 2, "a1 and a2, on rack r1");
    assert_eq!(missing_names(&r), ["logs.ship[a2]"]);
    assert_eq!(r.missing[0].agent, Some(id("a2")));
    // a3 is no longer eligible (rack r2): its task stops.
    assert_eq!(
        r.stop,
        [Stop {
            agent: id("a3"),
            task_id: "logs.ship[a3]-t".into()
        }]
    );
}

#[test]
fn system_slots_of_a_gone_agent_are_no_longer_wanted() {
    let logs = job(
        "logs",
        SchedulerType::System,
        vec![group("ship", 0, 0.5, 64)],
    );
    let before = snapshot(
        7,
        vec![agent("a1", 4.0, 4096), agent("a2", 4.0, 4096)],
        vec![logs.clone()],
    );
    let r = reconcile(&eval_for(&logs), &before);
    assert_eq!(missing_names(&r), ["logs.ship[a1]", "logs.ship[a2]"]);

    let after = snapshot(
        8,
        vec![on(
            agent("a1", 4.0, 4096),
            vec![task(
                "logs.ship[a1]",
                "logs",
                "ship",
                0.5,
                64,
                TaskState::Running,
            )],
        )],
        vec![logs.clone()],
    );
    let r = reconcile(&eval_for(&logs), &after);
    assert_eq!(r.wanted, 1);
    assert!(r.missing.is_empty());
    assert!(r.stop.is_empty());
}

#[test]
fn a_system_task_on_the_wrong_agent_does_not_fill_the_slot() {
    let logs = job(
        "logs",
        SchedulerType::System,
        vec![group("ship", 0, 0.5, 64)],
    );
    let snap = snapshot(
        7,
        vec![
            agent("a1", 4.0, 4096),
            on(
                agent("a2", 4.0, 4096),
                vec![
                    task("logs.ship[a1]", "logs", "ship", 0.5, 64, TaskState::Running),
                    task("logs.ship[a2]", "logs", "ship", 0.5, 64, TaskState::Running),
                ],
            ),
        ],
        vec![logs.clone()],
    );
    let r = reconcile(&eval_for(&logs), &snap);
    assert_eq!(missing_names(&r), ["logs.ship[a1]"]);
    assert_eq!(r.missing[0].agent, Some(id("a1")));
    assert_eq!(stopped_ids(&r), ["logs.ship[a1]-t"]);
}

#[test]
fn a_stopped_job_stops_all_its_live_tasks() {
    let mut web = job(
        "web",
        SchedulerType::Service,
        vec![group("fe", 2, 1.0, 100)],
    );
    let tasks = vec![
        task("web.fe[0]", "web", "fe", 1.0, 100, TaskState::Running),
        task("web.fe[1]", "web", "fe", 1.0, 100, TaskState::Staging),
        task("web.fe[9]", "web", "fe", 1.0, 100, TaskState::Finished),
        task("db.main[0]", "db", "main", 1.0, 100, TaskState::Running),
    ];
    let eval = eval_for(&web);
    web.stopped = true;
    let snap = snapshot(
        7,
        vec![on(agent("a1", 8.0, 8192), tasks.clone())],
        vec![web.clone()],
    );
    let r = reconcile(&eval, &snap);
    assert!(r.wanted == 0 && r.missing.is_empty());
    assert_eq!(stopped_ids(&r), ["web.fe[0]-t", "web.fe[1]-t"]);

    // A job missing from the snapshot (deregistered) is treated the same.
    let gone = snapshot(7, vec![on(agent("a1", 8.0, 8192), tasks)], vec![]);
    let r = reconcile(&eval, &gone);
    assert_eq!(stopped_ids(&r), ["web.fe[0]-t", "web.fe[1]-t"]);
    assert_eq!((r.job_version, r.scheduler), (0, None));
}

#[test]
fn a_removed_group_stops_its_tasks() {
    let web = job(
        "web",
        SchedulerType::Service,
        vec![group("fe", 1, 1.0, 100)],
    );
    let snap = snapshot(
        7,
        vec![on(
            agent("a1", 8.0, 8192),
            vec![
                task("web.fe[0]", "web", "fe", 1.0, 100, TaskState::Running),
                task("web.cache[0]", "web", "cache", 1.0, 100, TaskState::Running),
            ],
        )],
        vec![web.clone()],
    );
    let r = reconcile(&eval_for(&web), &snap);
    assert!(r.missing.is_empty());
    assert_eq!(stopped_ids(&r), ["web.cache[0]-t"]);
}

#[test]
fn of_two_tasks_in_one_slot_the_running_one_stays() {
    let web = job(
        "web",
        SchedulerType::Service,
        vec![group("fe", 1, 1.0, 100)],
    );
    let pending = with_id(
        task("web.fe[0]", "web", "fe", 1.0, 100, TaskState::Staging),
        "web.fe[0]-aaaa",
    );
    let running = with_id(
        task("web.fe[0]", "web", "fe", 1.0, 100, TaskState::Running),
        "web.fe[0]-bbbb",
    );
    // Whichever order the snapshot lists them in.
    for tasks in [
        vec![pending.clone(), running.clone()],
        vec![running.clone(), pending.clone()],
    ] {
        let snap = snapshot(
            7,
            vec![on(agent("a1", 8.0, 8192), tasks)],
            vec![web.clone()],
        );
        let r = reconcile(&eval_for(&web), &snap);
        assert!(r.missing.is_empty());
        assert_eq!(stopped_ids(&r), ["web.fe[0]-aaaa"]);
    }
}

#[test]
fn other_jobs_tasks_are_left_alone() {
    let web = job(
        "web",
        SchedulerType::Service,
        vec![group("fe", 1, 1.0, 100)],
    );
    let snap = snapshot(
        7,
        vec![on(
            agent("a1", 8.0, 8192),
            vec![task("db.fe[5]", "db", "fe", 1.0, 100, TaskState::Running)],
        )],
        vec![web.clone()],
    );
    let r = reconcile(&eval_for(&web), &snap);
    assert_eq!(missing_names(&r), ["web.fe[0]"]);
    assert!(r.stop.is_empty());
}

#[test]
fn every_placement_gets_a_fresh_unique_task_id() {
    let web = job(
        "web",
        SchedulerType::Service,
        vec![group("fe", 200, 1.0, 100)],
    );
    let snap = snapshot(7, vec![], vec![web.clone()]);
    let r = reconcile(&eval_for(&web), &snap);
    let mut ids = HashSet::new();
    for slot in &r.missing {
        for _ in 0..5 {
            let placement = slot.placement(id("a1"));
            let suffix = placement
                .task_id
                .strip_prefix(&format!("{}-", slot.name))
                .expect("id starts with the slot name");
            assert_eq!(suffix.len(), 8, "{}", placement.task_id);
            assert!(suffix.bytes().all(|b| b.is_ascii_hexdigit()));
            assert!(ids.insert(placement.task_id), "duplicate task id");
        }
    }
    assert_eq!(ids.len(), 1000);
}

/// A task of `job`/`group` in `slot`, placed at `job_version`.
fn placed_at(
    slot: &str,
    job: &str,
    group: &str,
    job_version: u64,
    state: TaskState,
) -> muster_scheduler::TaskView {
    let mut task = task(slot, job, group, 1.0, 100, state);
    task.job_version = job_version;
    task
}

#[test]
fn tasks_placed_before_their_groups_definition_changed_are_replaced() {
    // Version 3: `fe`'s definition changed at 3, `db`'s at 1 (its count changed since).
    let mut fe = group("fe", 2, 1.0, 100);
    fe.spec_version = 3;
    let mut db = group("db", 2, 1.0, 100);
    db.spec_version = 1;
    let mut web = job("web", SchedulerType::Service, vec![fe, db]);
    web.version = 3;
    let snap = snapshot(
        7,
        vec![on(
            agent("a1", 8.0, 8192),
            vec![
                placed_at("web.fe[0]", "web", "fe", 2, TaskState::Running),
                placed_at("web.fe[1]", "web", "fe", 3, TaskState::Running),
                placed_at("web.db[0]", "web", "db", 1, TaskState::Running),
                placed_at("web.db[1]", "web", "db", 2, TaskState::Staging),
            ],
        )],
        vec![web.clone()],
    );
    let r = reconcile(&eval_for(&web), &snap);
    assert_eq!(stopped_ids(&r), ["web.fe[0]-t"]);
    assert_eq!(missing_names(&r), ["web.fe[0]"]);
    // The replacement carries the job's current version: it is current from now on.
    assert_eq!(r.missing[0].placement(id("a1")).job_version, 3);
}

#[test]
fn a_task_of_unknown_version_is_current() {
    let mut fe = group("fe", 1, 1.0, 100);
    fe.spec_version = 5;
    let mut web = job("web", SchedulerType::Service, vec![fe]);
    web.version = 5;
    let snap = snapshot(
        7,
        vec![on(
            agent("a1", 8.0, 8192),
            vec![placed_at("web.fe[0]", "web", "fe", 0, TaskState::Running)],
        )],
        vec![web.clone()],
    );
    let r = reconcile(&eval_for(&web), &snap);
    assert!(r.stop.is_empty() && r.missing.is_empty());
}

#[test]
fn an_outdated_task_never_holds_its_slot_against_a_current_one() {
    // The replacement is already placed, the outdated task not stopped yet (a stale snapshot,
    // or the stop did not reach the agent): the current one stays, though it is only pending.
    let mut fe = group("fe", 1, 1.0, 100);
    fe.spec_version = 2;
    let mut web = job("web", SchedulerType::Service, vec![fe]);
    web.version = 2;
    let old = with_id(
        placed_at("web.fe[0]", "web", "fe", 1, TaskState::Running),
        "web.fe[0]-aaaa",
    );
    let new = with_id(
        placed_at("web.fe[0]", "web", "fe", 2, TaskState::Staging),
        "web.fe[0]-bbbb",
    );
    let snap = snapshot(
        7,
        vec![on(agent("a1", 8.0, 8192), vec![old, new])],
        vec![web.clone()],
    );
    let r = reconcile(&eval_for(&web), &snap);
    assert!(r.missing.is_empty());
    assert_eq!(stopped_ids(&r), ["web.fe[0]-aaaa"]);
}

#[test]
fn an_update_stops_running_batch_tasks_and_never_reruns_finished_ones() {
    let mut step = group("step", 3, 1.0, 100);
    step.spec_version = 2;
    let mut etl = job("etl", SchedulerType::Batch, vec![step]);
    etl.version = 2;
    let snap = snapshot(
        7,
        vec![on(
            agent("a1", 8.0, 8192),
            vec![
                placed_at("etl.step[0]", "etl", "step", 1, TaskState::Finished),
                placed_at("etl.step[1]", "etl", "step", 1, TaskState::Running),
                placed_at("etl.step[2]", "etl", "step", 1, TaskState::Failed),
            ],
        )],
        vec![etl.clone()],
    );
    let r = reconcile(&eval_for(&etl), &snap);
    assert_eq!(stopped_ids(&r), ["etl.step[1]-t"]);
    // The running task's slot is placed once it has stopped (it may finish first).
    assert_eq!(missing_names(&r), ["etl.step[2]"]);
}

#[test]
fn a_batch_slot_is_placed_anew_once_its_outdated_task_stopped() {
    let mut step = group("step", 2, 1.0, 100);
    step.spec_version = 2;
    let mut etl = job("etl", SchedulerType::Batch, vec![step]);
    etl.version = 2;
    let snap = snapshot(
        7,
        vec![on(
            agent("a1", 8.0, 8192),
            vec![
                placed_at("etl.step[0]", "etl", "step", 1, TaskState::Killed),
                placed_at("etl.step[1]", "etl", "step", 1, TaskState::Finished),
            ],
        )],
        vec![etl.clone()],
    );
    let r = reconcile(&eval_for(&etl), &snap);
    assert!(r.stop.is_empty());
    assert_eq!(missing_names(&r), ["etl.step[0]"]);
}

#[test]
fn a_job_wants_counted_slots_below_its_count_while_it_runs() {
    let mut etl = job(
        "etl",
        SchedulerType::Batch,
        vec![group("step", 2, 1.0, 100)],
    );
    assert!(wants_counted_slot(&etl, "step", "etl.step[1]"));
    assert!(!wants_counted_slot(&etl, "step", "etl.step[2]"));
    assert!(!wants_counted_slot(&etl, "step", "etl.step[01]"));
    assert!(!wants_counted_slot(&etl, "other", "etl.other[0]"));
    assert!(!wants_counted_slot(&etl, "step", "etx.step[0]"));
    etl.stopped = true;
    assert!(!wants_counted_slot(&etl, "step", "etl.step[0]"));
    let logs = job(
        "logs",
        SchedulerType::System,
        vec![group("ship", 0, 0.5, 64)],
    );
    assert!(!wants_counted_slot(&logs, "ship", "logs.ship[a1]"));
}

#[test]
fn outdated_system_tasks_are_replaced_on_their_own_agent() {
    let mut ship = group("ship", 0, 0.5, 64);
    ship.spec_version = 4;
    let mut logs = job("logs", SchedulerType::System, vec![ship]);
    logs.version = 4;
    let snap = snapshot(
        7,
        vec![
            on(
                agent("a1", 4.0, 4096),
                vec![placed_at(
                    "logs.ship[a1]",
                    "logs",
                    "ship",
                    3,
                    TaskState::Running,
                )],
            ),
            on(
                agent("a2", 4.0, 4096),
                vec![placed_at(
                    "logs.ship[a2]",
                    "logs",
                    "ship",
                    4,
                    TaskState::Running,
                )],
            ),
        ],
        vec![logs.clone()],
    );
    let r = reconcile(&eval_for(&logs), &snap);
    assert_eq!(stopped_ids(&r), ["logs.ship[a1]-t"]);
    assert_eq!(missing_names(&r), ["logs.ship[a1]"]);
    assert_eq!(r.missing[0].agent, Some(id("a1")));
}

#[test]
fn a_held_slot_is_left_empty_while_its_replacement_backs_off() {
    let web = job(
        "web",
        SchedulerType::Service,
        vec![group("fe", 2, 1.0, 100)],
    );
    let mut snap = snapshot(
        7,
        vec![on(
            agent("a1", 8.0, 8192),
            vec![task("web.fe[0]", "web", "fe", 1.0, 100, TaskState::Failed)],
        )],
        vec![web.clone()],
    );
    assert_eq!(
        missing_names(&reconcile(&eval_for(&web), &snap)),
        ["web.fe[0]", "web.fe[1]"]
    );
    snap.held.insert("web.fe[0]".into());
    let r = reconcile(&eval_for(&web), &snap);
    assert_eq!(missing_names(&r), ["web.fe[1]"], "only the slot not held");
    assert_eq!(r.wanted, 2, "still wanted");
}

#[test]
fn only_a_name_written_as_the_slots_is_fills_it() {
    let web = job(
        "web",
        SchedulerType::Service,
        vec![group("fe", 2, 1.0, 100)],
    );
    let odd = [
        "web.fe[01]",
        "web.fe[+1]",
        "web.fe[1 ]",
        "web.fe[]",
        "web.fe[2]",
        "web.fe1]",
        "web.fe[1",
        "web.be[1]",
        "webx.fe[1]",
        "web.fe[99999999999999999999999]",
    ];
    let mut tasks: Vec<_> = odd
        .iter()
        .map(|name| task(name, "web", "fe", 0.1, 1, TaskState::Running))
        .collect();
    tasks.push(task("web.fe[0]", "web", "fe", 0.1, 1, TaskState::Running));
    let snap = snapshot(
        7,
        vec![on(agent("a1", 8.0, 8192), tasks)],
        vec![web.clone()],
    );
    let r = reconcile(&eval_for(&web), &snap);
    assert_eq!(missing_names(&r), ["web.fe[1]"]);
    let mut stopped = stopped_ids(&r);
    stopped.sort_unstable();
    let mut expected: Vec<String> = odd.iter().map(|name| format!("{name}-t")).collect();
    expected.sort_unstable();
    assert_eq!(stopped, expected);
}

#[test]
fn reconciling_through_the_job_index_finds_what_looking_at_every_agent_finds() {
    let web = job("web", SchedulerType::Service, vec![group("fe", 6, 0.5, 64)]);
    let logs = job(
        "logs",
        SchedulerType::System,
        vec![group("ship", 0, 0.1, 8)],
    );
    // Agents a0..a7: web's slots dealt out with a duplicate and an extra, logs on every
    // other agent.
    let agents = (0..8)
        .map(|n| {
            let name = format!("a{n}");
            let mut tasks = vec![task(
                &format!("web.fe[{}]", n % 7),
                "web",
                "fe",
                0.5,
                64,
                TaskState::Running,
            )];
            if n % 2 == 0 {
                tasks.push(task(
                    &format!("logs.ship[{name}]"),
                    "logs",
                    "ship",
                    0.1,
                    8,
                    TaskState::Running,
                ));
            }
            on(agent(&name, 4.0, 4096), tasks)
        })
        .collect();
    let mut snap = snapshot(7, agents, vec![web.clone(), logs.clone()]);
    let by_scan = [
        reconcile(&eval_for(&web), &snap),
        reconcile(&eval_for(&logs), &snap),
    ];
    snap.job_index = Some(JobIndex::update(None, &snap.agents));
    assert!(snap.agents_with("web").is_some(), "the index is used");
    let by_index = [
        reconcile(&eval_for(&web), &snap),
        reconcile(&eval_for(&logs), &snap),
    ];
    assert_eq!(by_scan, by_index);
    assert_eq!(
        missing_names(&by_scan[1]).len(),
        4,
        "logs on the odd agents"
    );
    assert_eq!(
        by_scan[0].stop.len(),
        2,
        "web.fe[0] twice, web.fe[6] beyond the count"
    );
}

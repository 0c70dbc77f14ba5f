//! The placing scheduler and the built-in binpack and spread.

use crate::common;

use std::collections::BTreeMap;

use common::*;
use muster_model::AgentId;
use muster_model::{ConstraintOp, Job, SchedulerType};
use muster_scheduler::{
    AgentView, BinPack, Candidate, ClusterSnapshot, Demand, MIN_CANDIDATES, Placer,
    PlacingScheduler, Plan, Scheduler, SlotRequest, TaskState, binpack, sampled_candidates, spread,
};

fn schedulers() -> Vec<Box<dyn Scheduler>> {
    vec![Box::new(binpack()), Box::new(spread())]
}

/// Agents a1, a2 and a3 of 4 CPUs and 4 GiB, listed out of order.
fn three_agents_of_4_cpus() -> Vec<AgentView> {
    vec![
        agent("a3", 4.0, 4096),
        agent("a1", 4.0, 4096),
        agent("a2", 4.0, 4096),
    ]
}

#[test]
fn binpack_fills_one_agent_before_the_next() {
    // Six groups of one task each: no task of a group meets another of its group.
    let web = job(
        "web",
        SchedulerType::Service,
        (0..6)
            .map(|i| group(&format!("fe{i}"), 1, 1.0, 256))
            .collect(),
    );
    let snap = snapshot(3, three_agents_of_4_cpus(), vec![web.clone()]);
    let plan = binpack().schedule(&eval_for(&web), &snap);
    assert_eq!(
        per_agent(&plan),
        BTreeMap::from([("a1".into(), 4), ("a2".into(), 2)])
    );
    assert!(plan.unplaced.is_empty());
}

#[test]
fn binpack_spreads_a_groups_replicas_over_agents_by_default() {
    // Nomad's job anti-affinity: one agent's loss takes one replica, not the service.
    let web = job(
        "web",
        SchedulerType::Service,
        vec![group("fe", 6, 1.0, 256)],
    );
    let snap = snapshot(3, three_agents_of_4_cpus(), vec![web.clone()]);
    let plan = binpack().schedule(&eval_for(&web), &snap);
    assert_eq!(
        per_agent(&plan),
        BTreeMap::from([("a1".into(), 2), ("a2".into(), 2), ("a3".into(), 2)])
    );
    // With room for only two of them, replicas share an agent rather than stay unplaced.
    let snap = snapshot(
        3,
        vec![agent("a1", 4.0, 4096), agent("a2", 4.0, 4096)],
        vec![web.clone()],
    );
    let plan = binpack().schedule(&eval_for(&web), &snap);
    assert_eq!(
        per_agent(&plan),
        BTreeMap::from([("a1".into(), 3), ("a2".into(), 3)])
    );
}

#[test]
fn binpack_prefers_the_agent_that_ends_up_fullest() {
    // a2 already carries another job's load; binpack tops it up before touching a1.
    let web = job(
        "web",
        SchedulerType::Service,
        vec![group("fe", 3, 1.0, 1024)],
    );
    let snap = snapshot(
        3,
        vec![
            agent("a1", 4.0, 4096),
            on(
                agent("a2", 4.0, 4096),
                vec![task(
                    "db.main[0]",
                    "db",
                    "main",
                    2.0,
                    2048,
                    TaskState::Running,
                )],
            ),
        ],
        vec![web.clone()],
    );
    let plan = binpack().schedule(&eval_for(&web), &snap);
    assert_eq!(
        per_agent(&plan),
        BTreeMap::from([("a1".into(), 1), ("a2".into(), 2)])
    );
    // The first placement went to a2; the second to a1, which ran no replica yet.
    assert_eq!(plan.place[0].agent, id("a2"));
    assert_eq!(plan.place[1].agent, id("a1"));
}

#[test]
fn spread_distributes_evenly() {
    let web = job(
        "web",
        SchedulerType::Service,
        vec![group("fe", 9, 1.0, 256)],
    );
    let snap = snapshot(
        3,
        vec![
            agent("a1", 8.0, 8192),
            agent("a2", 8.0, 8192),
            agent("a3", 8.0, 8192),
        ],
        vec![web.clone()],
    );
    let plan = spread().schedule(&eval_for(&web), &snap);
    assert_eq!(
        per_agent(&plan),
        BTreeMap::from([("a1".into(), 3), ("a2".into(), 3), ("a3".into(), 3)])
    );
}

#[test]
fn spread_counts_the_jobs_existing_tasks_then_utilization() {
    let web = job(
        "web",
        SchedulerType::Service,
        vec![group("fe", 4, 1.0, 256)],
    );
    let snap = snapshot(
        3,
        vec![
            // a1 already runs two of web's tasks.
            on(
                agent("a1", 8.0, 8192),
                vec![
                    task("web.fe[0]", "web", "fe", 1.0, 256, TaskState::Running),
                    task("web.fe[1]", "web", "fe", 1.0, 256, TaskState::Running),
                ],
            ),
            // a2 is busier with another job than a3.
            on(
                agent("a2", 8.0, 8192),
                vec![task(
                    "db.main[0]",
                    "db",
                    "main",
                    4.0,
                    4096,
                    TaskState::Running,
                )],
            ),
            agent("a3", 8.0, 8192),
        ],
        vec![web.clone()],
    );
    let plan = spread().schedule(&eval_for(&web), &snap);
    assert_eq!(placed_names(&plan), ["web.fe[2]", "web.fe[3]"]);
    // No web task on a2 or a3: a3 (less utilized) first, then a2.
    assert_eq!(plan.place[0].agent, id("a3"));
    assert_eq!(plan.place[1].agent, id("a2"));
}

#[test]
fn constraints_are_honoured() {
    let agents = vec![
        with_attr(agent("a1", 8.0, 8192), "rack", "r1"),
        with_attr(agent("a2", 8.0, 8192), "rack", "r2"),
        with_attr(agent("a3", 8.0, 8192), "rack", "r2"),
        agent("a4", 8.0, 8192),
    ];
    let web = job(
        "web",
        SchedulerType::Service,
        vec![
            constrained(
                group("in_r2", 6, 1.0, 256),
                "rack",
                ConstraintOp::Equal,
                "r2",
            ),
            constrained(
                group("not_r2", 6, 1.0, 256),
                "rack",
                ConstraintOp::NotEqual,
                "r2",
            ),
        ],
    );
    let snap = snapshot(3, agents, vec![web.clone()]);
    for mut scheduler in schedulers() {
        let plan = scheduler.schedule(&eval_for(&web), &snap);
        assert_eq!(plan.place.len(), 12, "{}", scheduler.name());
        for placement in &plan.place {
            let allowed: &[&str] = if placement.group == "in_r2" {
                &["a2", "a3"]
            } else {
                &["a1", "a4"]
            };
            assert!(
                allowed.contains(&placement.agent.0.as_str()),
                "{}: {} on {}",
                scheduler.name(),
                placement.name,
                placement.agent
            );
        }
    }
}

#[test]
fn the_cluster_full_reports_one_demand_per_short_group() {
    let fe = constrained(
        group("fe", 5, 1.0, 256),
        "rack",
        ConstraintOp::NotEqual,
        "none",
    );
    let web = job(
        "web",
        SchedulerType::Service,
        vec![
            fe.clone(),
            group("small", 1, 0.5, 64),
            group("huge", 2, 64.0, 64),
        ],
    );
    let snap = snapshot(
        3,
        vec![agent("a1", 2.0, 4096), agent("a2", 2.5, 4096)],
        vec![web.clone()],
    );
    for mut scheduler in schedulers() {
        let plan = scheduler.schedule(&eval_for(&web), &snap);
        // 4.5 cpus: four fe tasks and the small one fit; fe[4] and both huge ones do not.
        let names = placed_names(&plan);
        assert_eq!(names.len(), 5, "{}: {names:?}", scheduler.name());
        assert!(names.contains(&"web.small[0]".to_owned()));
        assert_eq!(
            plan.unplaced,
            [
                Demand {
                    gang_fitting: 0,
                    gang: 0,
                    resources: res(1.0, 256),
                    constraints: fe.constraints.clone(),
                    over_quota: None,
                },
                Demand {
                    gang_fitting: 0,
                    gang: 0,
                    resources: res(64.0, 64),
                    constraints: vec![],
                    over_quota: None,
                },
            ],
            "{}",
            scheduler.name()
        );
    }
}

#[test]
fn memory_limits_placements_as_much_as_cpus() {
    let web = job(
        "web",
        SchedulerType::Service,
        vec![group("fe", 4, 0.1, 1000)],
    );
    let snap = snapshot(3, vec![agent("a1", 16.0, 2500)], vec![web.clone()]);
    let plan = binpack().schedule(&eval_for(&web), &snap);
    assert_eq!(plan.place.len(), 2);
    assert_eq!(plan.unplaced.len(), 1);
}

#[test]
fn system_slots_are_placed_only_on_their_own_agent() {
    let logs = job(
        "logs",
        SchedulerType::System,
        vec![group("ship", 0, 1.0, 64)],
    );
    let snap = snapshot(
        3,
        vec![
            on(
                agent("a1", 1.0, 4096),
                vec![task(
                    "db.main[0]",
                    "db",
                    "main",
                    1.0,
                    64,
                    TaskState::Running,
                )],
            ),
            agent("a2", 8.0, 8192),
            agent("a3", 8.0, 8192),
        ],
        vec![logs.clone()],
    );
    for mut scheduler in schedulers() {
        let plan = scheduler.schedule(&eval_for(&logs), &snap);
        let placed: Vec<(String, String)> = plan
            .place
            .iter()
            .map(|p| (p.name.clone(), p.agent.0.clone()))
            .collect();
        assert_eq!(
            placed,
            [
                ("logs.ship[a2]".to_owned(), "a2".to_owned()),
                ("logs.ship[a3]".to_owned(), "a3".to_owned())
            ],
            "{}",
            scheduler.name()
        );
        // a1 is full: its slot does not go elsewhere, it is reported.
        assert_eq!(plan.unplaced.len(), 1);
    }
}

#[test]
fn a_plan_carries_its_evaluation_and_snapshot_and_the_stops() {
    let web = job(
        "web",
        SchedulerType::Service,
        vec![group("fe", 1, 1.0, 256)],
    );
    let snap = snapshot(
        42,
        vec![on(
            agent("a1", 4.0, 4096),
            vec![
                task("web.fe[1]", "web", "fe", 1.0, 256, TaskState::Running),
                task("web.fe[0]", "web", "fe", 1.0, 256, TaskState::Failed),
            ],
        )],
        vec![web.clone()],
    );
    let eval = eval_for(&web);
    let plan = binpack().schedule(&eval, &snap);
    assert_eq!(plan.eval, eval.id);
    assert_eq!(
        (plan.job.as_str(), plan.job_version, plan.snapshot_index),
        ("web", 1, 42)
    );
    assert_eq!(plan.stop.len(), 1);
    assert_eq!(plan.stop[0].task_id, "web.fe[1]-t");
    // The stopped task's cpu is not reused by this plan, but there is room anyway.
    assert_eq!(placed_names(&plan), ["web.fe[0]"]);
    let placement = &plan.place[0];
    // What it runs is the stored job's: a placement names the slot, its version and room.
    assert_eq!((placement.group.as_str(), placement.job_version), ("fe", 1));
    assert_eq!(placement.resources, res(1.0, 256));
}

#[test]
fn a_custom_placer_sees_only_fitting_admitted_agents_in_id_order() {
    let web = job(
        "web",
        SchedulerType::Service,
        vec![constrained(
            group("fe", 3, 2.0, 256),
            "zone",
            ConstraintOp::Equal,
            "z1",
        )],
    );
    let snap = snapshot(
        3,
        vec![
            with_attr(agent("a4", 4.0, 4096), "zone", "z1"),
            with_attr(agent("a2", 4.0, 4096), "zone", "z1"),
            with_attr(agent("a3", 4.0, 4096), "zone", "z2"),
            with_attr(agent("a1", 1.0, 4096), "zone", "z1"),
        ],
        vec![web.clone()],
    );
    let mut seen: Vec<Vec<String>> = Vec::new();
    let mut scheduler = PlacingScheduler::from_fn("last", |_slot, candidates| {
        seen.push(candidates.iter().map(|c| c.id().0.clone()).collect());
        candidates.last().map(|c| c.id().clone())
    });
    let plan = scheduler.schedule(&eval_for(&web), &snap);
    drop(scheduler);
    assert_eq!(
        seen,
        [vec!["a2", "a4"], vec!["a2", "a4"], vec!["a2"]],
        "a1 is too small, a3 is in the wrong zone, a4 fills up"
    );
    assert_eq!(
        per_agent(&plan),
        BTreeMap::from([("a2".into(), 1), ("a4".into(), 2)])
    );
}

#[test]
fn a_placer_choosing_a_non_candidate_leaves_the_slot_unplaced() {
    let web = job(
        "web",
        SchedulerType::Service,
        vec![group("fe", 2, 1.0, 256)],
    );
    let snap = snapshot(3, vec![agent("a1", 4.0, 4096)], vec![web.clone()]);
    let mut scheduler = PlacingScheduler::from_fn("wrong", |_slot, _candidates| {
        Some(AgentId("nowhere".into()))
    });
    let plan = scheduler.schedule(&eval_for(&web), &snap);
    assert!(plan.place.is_empty());
    assert_eq!(plan.unplaced.len(), 1);
}

#[test]
fn planning_again_after_applying_converges() {
    let web = job(
        "web",
        SchedulerType::Service,
        vec![group("fe", 5, 1.0, 256)],
    );
    let mut snap = snapshot(
        3,
        vec![agent("a1", 4.0, 4096), agent("a2", 4.0, 4096)],
        vec![web.clone()],
    );
    let eval = eval_for(&web);
    let first = spread().schedule(&eval, &snap);
    apply(&mut snap, &first);
    let second = spread().schedule(&eval, &snap);
    assert!(second.is_noop(), "{second:?}");
    assert!(second.unplaced.is_empty());
}

/// Checks that nothing is over-committed after `plan`, and that every group left short had
/// truly no room left on any admitting agent.
fn check_plan(snapshot: &ClusterSnapshot, job: &Job, plan: &Plan, seed: u64, name: &str) {
    let mut after = snapshot.clone();
    apply(&mut after, plan);
    // (The random existing load may over-commit an agent by itself: such an agent must get
    // nothing more.)
    for agent in after
        .agents
        .iter()
        .filter(|a| plan.place.iter().any(|p| p.agent == a.id))
    {
        let used = agent.used();
        assert!(
            used.cpus <= agent.total.cpus + 1e-6 && used.mem_mb <= agent.total.mem_mb,
            "seed {seed} {name}: {} over-committed: {used:?} of {:?}",
            agent.id,
            agent.total
        );
    }
    let mut short_groups = 0;
    for group in &job.groups {
        let placed = plan.place.iter().filter(|p| p.group == group.name).count();
        if placed == group.count as usize {
            continue;
        }
        short_groups += 1;
        assert!(
            plan.unplaced
                .iter()
                .any(|d| d.resources == group.resources && d.constraints == group.constraints),
            "seed {seed} {name}: group {} short but not reported",
            group.name
        );
        assert!(
            !after
                .agents
                .iter()
                .any(|a| a.admits(&group.constraints) && a.fits(&group.resources)),
            "seed {seed} {name}: group {} left short with room available",
            group.name
        );
    }
    assert_eq!(plan.unplaced.len(), short_groups, "seed {seed} {name}");
}

#[test]
fn resources_are_never_over_committed_within_one_plan() {
    for seed in 0..200 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let agents = (0..rng.usize(1..8))
            .map(|i| {
                let a = agent(
                    &format!("a{i}"),
                    rng.usize(1..9) as f64 * 0.5,
                    rng.u64(1..9) * 512,
                );
                let a = with_attr(a, "rack", ["r1", "r2"][rng.usize(0..2)]);
                // Some existing load from another job.
                let load = rng.usize(0..3);
                on(
                    a,
                    (0..load)
                        .map(|k| {
                            task(
                                &format!("db.x[{i}{k}]"),
                                "db",
                                "x",
                                0.5,
                                256,
                                TaskState::Running,
                            )
                        })
                        .collect(),
                )
            })
            .collect();
        let groups = (0..rng.usize(1..4))
            .map(|g| {
                let grp = group(
                    &format!("g{g}"),
                    rng.u32(0..12),
                    rng.usize(1..5) as f64 * 0.3,
                    rng.u64(1..5) * 200,
                );
                if rng.bool() {
                    constrained(grp, "rack", ConstraintOp::Equal, "r1")
                } else {
                    grp
                }
            })
            .collect();
        let web = job("web", SchedulerType::Service, groups);
        let snap = snapshot(1, agents, vec![web.clone()]);
        for mut scheduler in schedulers() {
            let plan = scheduler.schedule(&eval_for(&web), &snap);
            check_plan(&snap, &web, &plan, seed, scheduler.name());
        }
    }
}

#[test]
fn malformed_amounts_do_not_panic() {
    let web = job(
        "web",
        SchedulerType::Service,
        vec![
            group("nan", 2, f64::NAN, 1),
            group("neg", 2, -1.0, 1),
            group("inf", 2, f64::INFINITY, 1),
            group("huge_mem", 2, 0.0, u64::MAX),
        ],
    );
    let snap = snapshot(
        1,
        vec![
            agent("a1", f64::NAN, 0),
            agent("a2", 1.0, u64::MAX),
            agent("a3", -4.0, 100),
        ],
        vec![web.clone()],
    );
    for mut scheduler in schedulers() {
        let plan = scheduler.schedule(&eval_for(&web), &snap);
        assert!(plan.place.iter().all(|p| p.group != "inf"));
        assert!(plan.unplaced.iter().any(|d| d.resources.cpus.is_infinite()));
    }
}

#[test]
fn an_updated_group_is_replaced_once_then_planning_converges() {
    let mut web = job(
        "web",
        SchedulerType::Service,
        vec![group("fe", 2, 1.0, 256), group("db", 1, 1.0, 256)],
    );
    let mut snap = snapshot(3, vec![agent("a1", 8.0, 8192)], vec![web.clone()]);
    let first = binpack().schedule(&eval_for(&web), &snap);
    apply(&mut snap, &first);
    assert!(first.place.iter().all(|p| p.job_version == 1));

    // Version 2 changes `fe`'s arguments (the registry bumps its spec version) and `db`'s count.
    web.version = 2;
    web.groups[0].args = vec!["31".into()];
    web.groups[0].spec_version = 2;
    web.groups[1].count = 2;
    snap.jobs.insert("web".into(), web.clone());
    let update = binpack().schedule(&eval_for(&web), &snap);
    let fe_before: Vec<&str> = first
        .place
        .iter()
        .filter(|p| p.group == "fe")
        .map(|p| p.task_id.as_str())
        .collect();
    let mut stopped: Vec<&str> = update.stop.iter().map(|s| s.task_id.as_str()).collect();
    stopped.sort();
    let mut expected = fe_before.clone();
    expected.sort();
    assert_eq!(stopped, expected, "only fe's tasks stop");
    assert_eq!(
        placed_names(&update),
        ["web.db[1]", "web.fe[0]", "web.fe[1]"]
    );
    assert!(update.place.iter().all(|p| p.job_version == 2));
    let new_fe = update.place.iter().filter(|p| p.group == "fe");
    assert_eq!(new_fe.count(), 2);

    apply(&mut snap, &update);
    let again = binpack().schedule(&eval_for(&web), &snap);
    assert!(again.is_noop(), "{again:?}");
}

/// `n` agents of 4 cpus and 4 GiB, `agent-0000` onwards, listed in reverse.
fn large_cluster(n: usize) -> Vec<AgentView> {
    (0..n)
        .rev()
        .map(|i| agent(&format!("agent-{i:04}"), 4.0, 4096))
        .collect()
}

/// Binpack, recording how many candidates each slot was shown.
struct Counting {
    shown: Vec<usize>,
}

impl Placer for Counting {
    fn candidate_limit(&self, agents: usize) -> Option<usize> {
        BinPack.candidate_limit(agents)
    }

    fn choose(&mut self, slot: &SlotRequest, candidates: &[Candidate<'_>]) -> Option<AgentId> {
        self.shown.push(candidates.len());
        assert!(
            candidates.is_sorted_by(|a, b| a.id() < b.id()),
            "candidates in id order"
        );
        BinPack.choose(slot, candidates)
    }
}

#[test]
fn the_built_in_placers_look_at_a_sample_of_a_large_cluster_and_at_all_of_a_small_one() {
    assert_eq!(sampled_candidates(3), MIN_CANDIDATES);
    assert_eq!(sampled_candidates(1_000), 20, "twice log2, rounded up");
    assert_eq!(sampled_candidates(100_000), 34);

    let web = job(
        "web",
        SchedulerType::Service,
        vec![group("fe", 40, 1.0, 256)],
    );
    let snap = snapshot(3, large_cluster(1_000), vec![web.clone()]);
    let mut scheduler = PlacingScheduler::new("counting", Counting { shown: Vec::new() });
    let plan = scheduler.plan(&eval_for(&web), &snap);
    assert_eq!(plan.place.len(), 40);
    let shown = &scheduler.placer().shown;
    assert_eq!(shown.len(), 40);
    // The sample, and the agent the last slot went to.
    assert!(shown.iter().all(|&n| (20..=21).contains(&n)), "{shown:?}");

    let small = snapshot(3, large_cluster(MIN_CANDIDATES), vec![web.clone()]);
    let mut scheduler = PlacingScheduler::new("counting", Counting { shown: Vec::new() });
    scheduler.plan(&eval_for(&web), &small);
    assert_eq!(
        scheduler.placer().shown[0],
        MIN_CANDIDATES,
        "a small cluster is searched whole"
    );
}

/// A service job `web` of `count` tasks of `cpus` each, and a snapshot of 2,000 empty
/// agents that run nothing yet.
fn web_in_a_large_cluster(count: u32, cpus: f64) -> (Job, ClusterSnapshot) {
    let web = job(
        "web",
        SchedulerType::Service,
        vec![group("fe", count, cpus, 256)],
    );
    let snap = snapshot(3, large_cluster(2_000), vec![web.clone()]);
    (web, snap)
}

#[test]
fn binpack_in_a_large_cluster_puts_each_replica_on_its_own_agent() {
    let (web, snap) = web_in_a_large_cluster(10, 1.0);
    let plan = binpack().schedule(&eval_for(&web), &snap);
    assert_eq!(plan.place.len(), 10);
    assert!(per_agent(&plan).values().all(|&n| n == 1));
}

#[test]
fn spread_in_a_large_cluster_puts_every_task_on_its_own_agent() {
    let (web, snap) = web_in_a_large_cluster(200, 1.0);
    let plan = spread().schedule(&eval_for(&web), &snap);
    assert_eq!(plan.place.len(), 200);
    assert!(per_agent(&plan).values().all(|&n| n == 1));
}

#[test]
fn a_sampled_plan_is_the_same_for_the_same_evaluation_and_differs_for_another() {
    let (web, snap) = web_in_a_large_cluster(30, 1.0);
    let eval = eval_for(&web);
    let agents_of = |plan: &Plan| {
        let mut by_slot: Vec<(String, String)> = plan
            .place
            .iter()
            .map(|p| (p.name.clone(), p.agent.0.clone()))
            .collect();
        by_slot.sort();
        by_slot
    };
    let first = agents_of(&spread().schedule(&eval, &snap));
    assert_eq!(first, agents_of(&spread().schedule(&eval, &snap)));
    assert_ne!(first, agents_of(&spread().schedule(&eval_for(&web), &snap)));
}

#[test]
fn a_full_large_cluster_reports_the_demand_after_one_search() {
    let (web, snap) = web_in_a_large_cluster(50, 8.0);
    let mut scheduler = PlacingScheduler::new("counting", Counting { shown: Vec::new() });
    let plan = scheduler.plan(&eval_for(&web), &snap);
    assert!(plan.place.is_empty());
    assert_eq!(plan.unplaced.len(), 1);
    assert!(scheduler.placer().shown.is_empty(), "no candidate ever");
}

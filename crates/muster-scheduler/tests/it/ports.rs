//! Ports as resources: a static port keeps two tasks off one agent, dynamic ports come from
//! each agent's range and never collide, whichever job holds them.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};

use common::*;
use muster_model::{PortRange, PortRequest, SchedulerType, TaskGroup};
use muster_scheduler::{AgentView, ClusterSnapshot, Scheduler, TaskState, binpack, spread};

fn with_ports(mut group: TaskGroup, ports: &[(&str, u16)]) -> TaskGroup {
    group.ports = ports
        .iter()
        .map(|(label, static_port)| PortRequest {
            label: (*label).into(),
            static_port: *static_port,
        })
        .collect();
    group
}

/// Every port each agent's live tasks hold, checking that none is held twice.
fn ports_by_agent(snapshot: &ClusterSnapshot) -> BTreeMap<String, BTreeSet<u16>> {
    snapshot
        .agents
        .iter()
        .map(|agent| {
            let mut held = BTreeSet::new();
            for task in agent.tasks().iter().filter(|t| !t.state.is_terminal()) {
                for &port in task.ports() {
                    assert!(held.insert(port), "port {port} twice on {}", agent.id.0);
                }
            }
            (agent.id.0.clone(), held)
        })
        .collect()
}

#[test]
fn two_replicas_asking_for_one_static_port_never_share_an_agent() {
    for mut scheduler in [
        Box::new(binpack()) as Box<dyn Scheduler>,
        Box::new(spread()),
    ] {
        let web = job(
            "web",
            SchedulerType::Service,
            vec![with_ports(group("fe", 4, 0.1, 16), &[("http", 8080)])],
        );
        // a3 already runs another job's task on 8080.
        let other =
            task("db.main[0]", "db", "main", 0.1, 16, TaskState::Running).with_ports([8080]);
        let agents = vec![
            agent("a1", 8.0, 8192),
            agent("a2", 8.0, 8192),
            on(agent("a3", 8.0, 8192), vec![other]),
        ];
        let snap = snapshot(3, agents, vec![web.clone()]);
        let plan = scheduler.schedule(&eval_for(&web), &snap);
        assert_eq!(
            per_agent(&plan),
            BTreeMap::from([("a1".into(), 1), ("a2".into(), 1)]),
            "{}",
            scheduler.name()
        );
        assert!(
            plan.place
                .iter()
                .all(|p| p.ports[0].port == 8080 && p.ports[0].label == "http")
        );
        assert_eq!(
            plan.unplaced.len(),
            1,
            "two wait for an agent with 8080 free"
        );
    }
}

#[test]
fn dynamic_ports_never_collide_across_a_thousand_placements() {
    // Ten agents with 300 ports each; ten jobs of 100 tasks, each task three dynamic ports:
    // 3,000 drawn from 3,000 (the ranges end full), planned one job after another against
    // what the earlier plans placed.
    let agents: Vec<AgentView> = (0..10)
        .map(|i| {
            let mut agent = agent(&format!("a{i}"), 64.0, 65_536);
            agent.dynamic_ports = PortRange {
                min: 30_000 + i * 1_000,
                max: 30_299 + i * 1_000,
            };
            agent
        })
        .collect();
    let jobs: Vec<_> = (0..10)
        .map(|j| {
            job(
                &format!("job-{j}"),
                SchedulerType::Service,
                vec![with_ports(
                    group("g", 100, 0.01, 1),
                    &[("a", 0), ("admin", 0), ("b", 0)],
                )],
            )
        })
        .collect();
    let mut snap = snapshot(1, agents, jobs.clone());
    let mut placed = 0;
    for web in &jobs {
        let plan = binpack().schedule(&eval_for(web), &snap);
        for placement in &plan.place {
            let agent = snap
                .agents
                .iter()
                .find(|a| a.id == placement.agent)
                .expect("an agent of the snapshot");
            let labels: Vec<&str> = placement.ports.iter().map(|p| p.label.as_str()).collect();
            assert_eq!(labels, ["a", "admin", "b"]);
            assert!(
                placement
                    .ports
                    .iter()
                    .all(|p| agent.dynamic_ports.contains(p.port))
            );
        }
        placed += plan.place.len();
        apply(&mut snap, &plan);
    }
    assert_eq!(placed, 1_000);
    let held: usize = ports_by_agent(&snap).values().map(BTreeSet::len).sum();
    assert_eq!(
        held, 3_000,
        "three ports a task, none held twice on an agent"
    );
}

#[test]
fn a_full_range_leaves_the_task_unplaced_and_says_so() {
    let mut small = agent("a1", 8.0, 8192);
    small.dynamic_ports = PortRange { min: 100, max: 101 };
    let web = job(
        "web",
        SchedulerType::Service,
        vec![with_ports(group("fe", 2, 0.1, 16), &[("a", 0), ("b", 0)])],
    );
    let plan = binpack().schedule(
        &eval_for(&web),
        &snapshot(3, vec![small], vec![web.clone()]),
    );
    assert_eq!(plan.place.len(), 1);
    assert_eq!(plan.unplaced.len(), 1);
}

#[test]
fn a_groups_own_static_port_inside_the_range_counts_against_its_dynamic_ones() {
    // a1's range holds two ports, one of them the group's static one: no room for two dynamic
    // ports there, so the task goes to a2.
    let mut a1 = agent("a1", 8.0, 8192);
    a1.dynamic_ports = PortRange { min: 100, max: 101 };
    let mut a2 = agent("a2", 8.0, 8192);
    a2.dynamic_ports = PortRange { min: 200, max: 210 };
    let web = job(
        "web",
        SchedulerType::Service,
        vec![with_ports(
            group("fe", 1, 0.1, 16),
            &[("s", 101), ("a", 0), ("b", 0)],
        )],
    );
    let plan = binpack().schedule(
        &eval_for(&web),
        &snapshot(3, vec![a1, a2], vec![web.clone()]),
    );
    assert_eq!(per_agent(&plan), BTreeMap::from([("a2".into(), 1)]));
    assert!(plan.unplaced.is_empty());
}

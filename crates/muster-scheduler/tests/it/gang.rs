//! Groups placed all at once (`gang`): none of their tasks is placed until every one fits,
//! the demand says how many found room, and a plan that places one whole is atomic.

use crate::common;

use common::*;
use muster_model::SchedulerType;
use muster_scheduler::{Scheduler, binpack, spread};

fn gang(count: u32) -> muster_model::Job {
    let mut group = group("workers", count, 1.0, 256);
    group.gang = true;
    job("train", SchedulerType::Batch, vec![group])
}

#[test]
fn a_gang_that_does_not_fit_whole_places_nothing_and_says_how_much_fit() {
    let schedulers: [Box<dyn Scheduler>; 2] = [Box::new(binpack()), Box::new(spread())];
    for mut scheduler in schedulers {
        // Room for three tasks of one cpu, over two agents; the gang needs four.
        let agents = vec![agent("a", 2.0, 4096), agent("b", 1.0, 4096)];
        let job = gang(4);
        let plan = scheduler.schedule(&eval_for(&job), &snapshot(1, agents, vec![job]));
        assert!(plan.place.is_empty(), "{:?}", plan.place);
        assert!(!plan.atomic);
        assert_eq!(plan.unplaced.len(), 1, "{:?}", plan.unplaced);
        let demand = &plan.unplaced[0];
        assert_eq!((demand.gang, demand.gang_fitting), (4, 3));
        assert_eq!(demand.resources, res(1.0, 256));
    }
}

#[test]
fn a_gang_that_fits_whole_is_placed_in_one_atomic_plan() {
    let agents = vec![
        agent("a", 2.0, 4096),
        agent("b", 1.0, 4096),
        agent("c", 1.0, 4096),
    ];
    let job = gang(4);
    let plan = binpack().schedule(&eval_for(&job), &snapshot(1, agents, vec![job]));
    assert_eq!(plan.place.len(), 4);
    assert!(plan.atomic);
    assert!(plan.unplaced.is_empty());

    // A group placed task by task beside it is left as it is.
    let mut job = gang(2);
    job.groups.push(group("web", 3, 1.0, 256));
    let agents = vec![agent("a", 2.0, 4096), agent("b", 1.0, 4096)];
    let plan = binpack().schedule(&eval_for(&job), &snapshot(1, agents, vec![job]));
    let placed: Vec<&str> = plan.place.iter().map(|p| p.group.as_str()).collect();
    assert_eq!(
        placed.iter().filter(|g| **g == "workers").count(),
        2,
        "{placed:?}"
    );
    assert_eq!(
        placed.iter().filter(|g| **g == "web").count(),
        1,
        "{placed:?}"
    );
    assert!(plan.atomic);
    assert_eq!(plan.unplaced.len(), 1);
    assert_eq!(plan.unplaced[0].gang, 0);
}

#[test]
fn a_gang_held_back_by_its_quota_waits_for_the_quota_alone() {
    let mut group = group("workers", 4, 1.0, 256);
    group.gang = true;
    let job = job("team-a:train", SchedulerType::Batch, vec![group]);
    let mut snapshot = snapshot(1, vec![agent("a", 8.0, 4096)], vec![job.clone()]);
    snapshot.quotas.insert(
        "team-a".to_owned(),
        muster_model::Quota {
            tasks: Some(3),
            ..muster_model::Quota::default()
        },
    );
    let plan = binpack().schedule(&eval_for(&job), &snapshot);
    assert!(plan.place.is_empty(), "{:?}", plan.place);
    assert_eq!(plan.unplaced.len(), 1, "{:?}", plan.unplaced);
    assert!(plan.unplaced[0].over_quota.is_some());
    assert_eq!(plan.unplaced[0].gang, 0);
}

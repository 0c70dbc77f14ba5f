//! Preemption: where no agent has room and the job's type may preempt, a plan names the tasks
//! of lower-priority jobs to stop, lowest priority first and as few as make room; never a task
//! of a job of equal or higher priority, and never where preemption is off.

use crate::common;

use common::*;
use muster_model::{Job, PreemptionConfig, SchedulerType, TaskState};
use muster_scheduler::{ClusterSnapshot, Plan, Scheduler, binpack};

/// Two agents of 2 cpus, full: on `a` a task of a job of priority 10 and one of 30, on `b`
/// two of 40; and the job `newcomer`.
fn full_cluster(newcomer: Job) -> ClusterSnapshot {
    let mut low = job("low", SchedulerType::Service, vec![group("g", 1, 1.0, 64)]);
    low.priority = 10;
    let mut mid = job("mid", SchedulerType::Service, vec![group("g", 1, 1.0, 64)]);
    mid.priority = 30;
    let mut high = job("high", SchedulerType::Service, vec![group("g", 2, 1.0, 64)]);
    high.priority = 40;
    let running = TaskState::Running;
    let a = on(
        agent("a", 2.0, 1024),
        vec![
            task("low.g[0]", "low", "g", 1.0, 64, running),
            task("mid.g[0]", "mid", "g", 1.0, 64, running),
        ],
    );
    let b = on(
        agent("b", 2.0, 1024),
        vec![
            task("high.g[0]", "high", "g", 1.0, 64, running),
            task("high.g[1]", "high", "g", 1.0, 64, running),
        ],
    );
    snapshot(1, vec![a, b], vec![low, mid, high, newcomer])
}

fn newcomer(kind: SchedulerType, priority: u8, cpus: f64) -> Job {
    let mut job = job("urgent", kind, vec![group("g", 1, cpus, 64)]);
    job.priority = priority;
    job
}

fn plan(snapshot: &ClusterSnapshot, job: &Job) -> Plan {
    binpack().schedule(&eval_for(job), snapshot)
}

fn preempted(plan: &Plan) -> Vec<&str> {
    plan.preempt.iter().map(|p| p.task_id.as_str()).collect()
}

#[test]
fn a_higher_priority_job_preempts_the_lowest_priority_tasks_it_needs() {
    let job = newcomer(SchedulerType::Service, 50, 1.0);
    let mut snapshot = full_cluster(job.clone());
    // Off for service jobs by default: it waits.
    let waiting = plan(&snapshot, &job);
    assert!(waiting.place.is_empty() && waiting.preempt.is_empty());
    assert_eq!(waiting.unplaced.len(), 1);

    snapshot.preemption = PreemptionConfig::parse("service").unwrap_or_default();
    let one = plan(&snapshot, &job);
    assert_eq!(preempted(&one), ["low.g[0]-t"]);
    assert_eq!(one.place.len(), 1);
    assert_eq!(one.place[0].agent.0, "a");
    assert_eq!(one.preempt[0].job, "low");

    // Two cpus: on `a` both (10 and 30) beat both of `b`'s (40, 40).
    let job = newcomer(SchedulerType::Service, 50, 2.0);
    snapshot.jobs.insert(job.name.clone(), job.clone());
    let two = plan(&snapshot, &job);
    assert_eq!(preempted(&two), ["low.g[0]-t", "mid.g[0]-t"]);
    assert_eq!(two.place[0].agent.0, "a");
}

#[test]
fn no_task_of_equal_or_higher_priority_is_preempted() {
    let mut job = newcomer(SchedulerType::Service, 10, 1.0);
    let mut snapshot = full_cluster(job.clone());
    snapshot.preemption = PreemptionConfig::parse("service,batch,system").unwrap_or_default();
    let equal = plan(&snapshot, &job);
    assert!(equal.preempt.is_empty() && equal.place.is_empty());
    // Priority 35 may preempt only the 10 and the 30 on `a`: two cpus do not fit.
    job.priority = 35;
    job.groups[0].resources = res(3.0, 64);
    snapshot.jobs.insert(job.name.clone(), job.clone());
    let too_big = plan(&snapshot, &job);
    assert!(too_big.preempt.is_empty() && too_big.place.is_empty());
}

#[test]
fn a_system_job_preempts_on_each_agent_by_default() {
    let job = newcomer(SchedulerType::System, 90, 1.0);
    let snapshot = full_cluster(job.clone());
    let plan = plan(&snapshot, &job);
    assert_eq!(plan.place.len(), 2, "{plan:?}");
    let mut victims = preempted(&plan);
    victims.sort_unstable();
    // One task per agent, the lowest there: `low` on `a`, one of `high` on `b`.
    assert_eq!(victims.len(), 2);
    assert_eq!(victims[1], "low.g[0]-t");
    assert!(victims[0].starts_with("high.g["), "{victims:?}");
}

#[test]
fn a_victim_whose_room_is_not_needed_is_given_back() {
    // A 1-cpu task of priority 10 and a 4-cpu one of 20 fill the agent; 4 cpus are needed:
    // taking the 10 first, then the 20, leaves the 10's room needless.
    let mut small = job(
        "small",
        SchedulerType::Service,
        vec![group("g", 1, 1.0, 64)],
    );
    small.priority = 10;
    let mut large = job(
        "large",
        SchedulerType::Service,
        vec![group("g", 1, 4.0, 64)],
    );
    large.priority = 20;
    let agent = on(
        agent("c", 5.0, 1024),
        vec![
            task("small.g[0]", "small", "g", 1.0, 64, TaskState::Running),
            task("large.g[0]", "large", "g", 4.0, 64, TaskState::Running),
        ],
    );
    let mut newcomer = newcomer(SchedulerType::Service, 50, 4.0);
    newcomer.groups[0].resources = res(4.0, 64);
    let mut snapshot = snapshot(1, vec![agent], vec![small, large, newcomer.clone()]);
    snapshot.preemption = PreemptionConfig::parse("service").unwrap_or_default();
    assert_eq!(preempted(&plan(&snapshot, &newcomer)), ["large.g[0]-t"]);
}

//! Builders shared by the integration tests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;

use muster_model::{AgentId, Resources};
use muster_model::{Constraint, ConstraintOp, Evaluation, Job, SchedulerType, TaskGroup, Trigger};
use muster_scheduler::{AgentView, ClusterSnapshot, JobGroup, Plan, TaskState, TaskView};

pub(crate) fn id(s: &str) -> AgentId {
    AgentId(s.to_owned())
}

pub(crate) fn res(cpus: f64, mem_mb: u64) -> Resources {
    Resources { cpus, mem_mb }
}

pub(crate) fn agent(name: &str, cpus: f64, mem_mb: u64) -> AgentView {
    AgentView::new(
        id(name),
        BTreeMap::new(),
        res(cpus, mem_mb),
        Vec::<TaskView>::new(),
    )
}

pub(crate) fn with_attr(mut agent: AgentView, key: &str, value: &str) -> AgentView {
    agent.attributes.insert(key.to_owned(), value.to_owned());
    agent
}

pub(crate) fn group(name: &str, count: u32, cpus: f64, mem_mb: u64) -> TaskGroup {
    TaskGroup {
        migrate_max_parallel: 0,
        disconnect: Default::default(),
        name: name.to_owned(),
        count,
        resources: res(cpus, mem_mb),
        command: "/bin/sleep".to_owned(),
        args: vec!["1000".to_owned()],
        env: BTreeMap::from([("ROLE".to_owned(), name.to_owned())]),
        constraints: Vec::new(),
        spec_version: 0,
        user: String::new(),
        ..TaskGroup::default()
    }
}

pub(crate) fn constrained(
    mut group: TaskGroup,
    attribute: &str,
    op: ConstraintOp,
    value: &str,
) -> TaskGroup {
    group.constraints.push(Constraint {
        attribute: attribute.to_owned(),
        op,
        value: value.to_owned(),
    });
    group
}

pub(crate) fn job(name: &str, scheduler: SchedulerType, groups: Vec<TaskGroup>) -> Job {
    Job {
        name: name.to_owned(),
        priority: 50,
        scheduler,
        named_scheduler: None,
        groups,
        stopped: false,
        version: 1,
    }
}

pub(crate) fn eval_for(job: &Job) -> Evaluation {
    Evaluation::new(job, Trigger::JobRegister)
}

pub(crate) fn snapshot(index: u64, agents: Vec<AgentView>, jobs: Vec<Job>) -> ClusterSnapshot {
    ClusterSnapshot {
        preemption: Default::default(),
        deployments: Default::default(),
        index,
        agents: agents.into_iter().map(Arc::new).collect(),
        jobs: jobs
            .into_iter()
            .map(|job| (job.name.clone(), job))
            .collect(),
        held: Default::default(),
        job_index: None,
        quotas: Default::default(),
    }
}

/// A task filling slot `name` of `job`/`group`, with an id derived from the name.
pub(crate) fn task(
    name: &str,
    job: &str,
    group: &str,
    cpus: f64,
    mem_mb: u64,
    state: TaskState,
) -> TaskView {
    TaskView::new(
        &format!("{name}-t"),
        name,
        JobGroup::new(job, group),
        res(cpus, mem_mb),
        state,
        0,
    )
}

/// `task` with the id `id`.
pub(crate) fn with_id(task: TaskView, id: &str) -> TaskView {
    TaskView::new(
        id,
        task.name(),
        task.job_group().clone(),
        task.resources.clone(),
        task.state,
        task.job_version,
    )
}

pub(crate) fn on(mut agent: AgentView, tasks: Vec<TaskView>) -> AgentView {
    agent.update_tasks(|all| all.extend(tasks.into_iter().map(Arc::new)));
    agent
}

/// Applies a plan to a snapshot as an agent would see it: placements become pending tasks,
/// stopped tasks are killed.
pub(crate) fn apply(snapshot: &mut ClusterSnapshot, plan: &Plan) {
    for stop in &plan.stop {
        for agent in snapshot.agents.iter_mut().filter(|a| a.id == stop.agent) {
            Arc::make_mut(agent).update_tasks(|tasks| {
                for task in tasks.iter_mut().filter(|t| *t.id() == *stop.task_id) {
                    Arc::make_mut(task).state = TaskState::Killed;
                }
            });
        }
    }
    for placement in &plan.place {
        if let Some(agent) = snapshot.agents.iter_mut().find(|a| a.id == placement.agent) {
            Arc::make_mut(agent)
                .update_tasks(|tasks| tasks.push(Arc::new(placement.staged_task())));
        }
    }
    snapshot.index += 1;
}

/// How many placements of `plan` went to each agent.
pub(crate) fn per_agent(plan: &Plan) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for placement in &plan.place {
        *counts.entry(placement.agent.0.clone()).or_insert(0) += 1;
    }
    counts
}

/// Slot names of the plan's placements, sorted.
pub(crate) fn placed_names(plan: &Plan) -> Vec<String> {
    let mut names: Vec<String> = plan.place.iter().map(|p| p.name.clone()).collect();
    names.sort();
    names
}

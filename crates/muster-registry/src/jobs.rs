//! Jobs and evaluations: what users asked to run, and the units of scheduling work that
//! follow every change (Nomad's model).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::types::{AgentId, Resources};

/// Which scheduler handles a job's evaluations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum SchedulerType {
    /// Long-running tasks, kept at their count.
    Service,
    /// Tasks that run to completion.
    Batch,
    /// One task per eligible agent.
    System,
}

impl SchedulerType {
    /// Every scheduler type, in a fixed order.
    pub const ALL: [SchedulerType; 3] = [
        SchedulerType::Service,
        SchedulerType::Batch,
        SchedulerType::System,
    ];

    /// The lower-case name used in job files and stats.
    pub fn name(self) -> &'static str {
        match self {
            SchedulerType::Service => "service",
            SchedulerType::Batch => "batch",
            SchedulerType::System => "system",
        }
    }
}

impl fmt::Display for SchedulerType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a constraint compares an agent attribute with its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ConstraintOp {
    /// The attribute equals the value.
    Equal,
    /// The attribute is absent or differs from the value.
    NotEqual,
}

/// A condition on an agent's attributes that a task group's agents must meet.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Constraint {
    /// The attribute's name (`rack`).
    pub attribute: String,
    /// How to compare.
    pub op: ConstraintOp,
    /// The value to compare with.
    pub value: String,
}

impl Constraint {
    /// Whether an agent with `attributes` meets this constraint.
    pub fn admits(&self, attributes: &BTreeMap<String, String>) -> bool {
        let actual = attributes.get(&self.attribute);
        match self.op {
            ConstraintOp::Equal => actual == Some(&self.value),
            ConstraintOp::NotEqual => actual != Some(&self.value),
        }
    }
}

/// A set of identical tasks within a job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskGroup {
    /// The group's name, unique within its job.
    pub name: String,
    /// How many tasks (ignored by the system scheduler: one per eligible agent).
    pub count: u32,
    /// What each task needs.
    pub resources: Resources,
    /// The program each task runs.
    pub command: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Its environment.
    pub env: BTreeMap<String, String>,
    /// Conditions on the agents its tasks may run on.
    pub constraints: Vec<Constraint>,
    /// The job version at which this group's task definition (everything but `count`) last
    /// changed; tasks placed at an older job version are replaced. Set by the registry when it
    /// stores the job (0 in jobs stored before it existed: their tasks are never outdated).
    #[serde(default)]
    pub spec_version: u64,
}

impl TaskGroup {
    /// Whether `other` defines the same tasks: everything but the name, the count and the spec
    /// version is equal. A change the scheduler must replace running tasks for.
    pub fn same_task_definition(&self, other: &TaskGroup) -> bool {
        // Destructured so that a new field cannot be forgotten here.
        let TaskGroup {
            name: _,
            count: _,
            resources,
            command,
            args,
            env,
            constraints,
            spec_version: _,
        } = self;
        *resources == other.resources
            && *command == other.command
            && *args == other.args
            && *env == other.env
            && *constraints == other.constraints
    }
}

/// What a user asked to run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// The job's name, its id.
    pub name: String,
    /// 1 (lowest) to 100 (highest); orders evaluations in the broker.
    pub priority: u8,
    /// Which scheduler places it.
    pub scheduler: SchedulerType,
    /// Its task groups.
    pub groups: Vec<TaskGroup>,
    /// Set when the job is stopped: its tasks should not run.
    pub stopped: bool,
    /// Bumped by the registry on every change.
    pub version: u64,
}

/// An evaluation's id.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct EvalId(pub String);

impl EvalId {
    /// A fresh random id.
    pub fn random() -> Self {
        EvalId(format!("{:032x}", fastrand::u128(..)))
    }
}

impl fmt::Display for EvalId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where an evaluation is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EvalStatus {
    /// Waiting for a scheduler.
    Pending,
    /// Planned, but some tasks did not fit; waits for capacity.
    Blocked,
    /// Planned.
    Complete,
    /// Gave up after the delivery limit.
    Failed,
    /// Dropped: a newer evaluation of the same job covers it.
    Canceled,
}

/// Why an evaluation was created.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Trigger {
    /// The job was submitted or updated.
    JobRegister,
    /// The job was stopped.
    JobDeregister,
    /// An agent became unreachable.
    AgentUnreachable(AgentId),
    /// An agent came back or joined.
    AgentUpdate(AgentId),
    /// Capacity freed up for a blocked evaluation.
    Unblocked,
    /// One of the job's tasks ended on its own (this task id).
    TaskEnded(String),
    /// This evaluation of the job failed (it reached the delivery limit): a later retry.
    FailedFollowUp(EvalId),
}

/// A unit of scheduling work for one job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    /// Its id.
    pub id: EvalId,
    /// The job it evaluates.
    pub job: String,
    /// The job's priority when the evaluation was made.
    pub priority: u8,
    /// Which scheduler handles it.
    pub scheduler: SchedulerType,
    /// Why it exists.
    pub trigger: Trigger,
    /// Where it is.
    pub status: EvalStatus,
    /// Why it is there, for operators.
    pub status_description: String,
    /// The raft index of the entry that created it (0 until written); orders evaluations of
    /// equal priority, oldest first.
    pub create_index: u64,
    /// The raft index of its last change.
    pub modify_index: u64,
    /// For a blocked evaluation: the registry index of the snapshot it was planned against.
    pub snapshot_index: u64,
    /// Unix time in ms before which the broker holds it back (0: at once): a crash-looping
    /// task's replacement backs off, a failed evaluation's follow-up waits.
    #[serde(default)]
    pub wait_until_ms: u64,
}

impl Evaluation {
    /// A new pending evaluation of `job`.
    pub fn new(job: &Job, trigger: Trigger) -> Self {
        Evaluation {
            id: EvalId::random(),
            job: job.name.clone(),
            priority: job.priority,
            scheduler: job.scheduler,
            trigger,
            status: EvalStatus::Pending,
            status_description: String::new(),
            create_index: 0,
            modify_index: 0,
            snapshot_index: 0,
            wait_until_ms: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constraints_compare_attributes() {
        let attributes = BTreeMap::from([("rack".to_owned(), "r1".to_owned())]);
        let on = |op, value: &str| Constraint {
            attribute: "rack".into(),
            op,
            value: value.into(),
        };
        assert!(on(ConstraintOp::Equal, "r1").admits(&attributes));
        assert!(!on(ConstraintOp::Equal, "r2").admits(&attributes));
        assert!(on(ConstraintOp::NotEqual, "r2").admits(&attributes));
        assert!(!on(ConstraintOp::NotEqual, "r1").admits(&attributes));
        assert!(on(ConstraintOp::NotEqual, "r1").admits(&BTreeMap::new()));
    }
}

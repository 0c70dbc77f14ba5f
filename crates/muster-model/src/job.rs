//! Jobs: what users ask to run (Nomad's model), and the rules a submitted job must meet.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::FieldError;
use crate::resources::Resources;

/// The priority of a job that names none (Nomad's default).
pub const DEFAULT_PRIORITY: u8 = 50;

/// The most tasks one group may ask for.
pub const MAX_GROUP_COUNT: u32 = 10_000;

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

    /// Whether every one of `constraints` admits `attributes`.
    pub fn all_admit(constraints: &[Constraint], attributes: &BTreeMap<String, String>) -> bool {
        constraints.iter().all(|c| c.admits(attributes))
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
    /// The user its tasks run as; empty for the agent's task user. An agent runs a task as a
    /// named user only if its config allows that user.
    #[serde(default)]
    pub user: String,
    /// How many of its tasks may move at once off a draining agent (Nomad's
    /// `migrate.max_parallel`); 0 counts as 1. Each moving task keeps running until its
    /// replacement runs elsewhere.
    #[serde(default)]
    pub migrate_max_parallel: u32,
}

impl TaskGroup {
    /// How many of its tasks may move at once off a draining agent: at least 1.
    pub fn migration_step(&self) -> u32 {
        self.migrate_max_parallel.max(1)
    }

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
            user,
            migrate_max_parallel: _,
        } = self;
        *resources == other.resources
            && *command == other.command
            && *args == other.args
            && *env == other.env
            && *constraints == other.constraints
            && *user == other.user
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

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
}

/// Caps on one job's size, set by the master's operator, so that one submission cannot exhaust
/// the master: groups per job, and tasks per job (the sum of its groups' counts; system jobs,
/// one task per agent, count none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobLimits {
    /// Most task groups in one job (default 100).
    pub max_groups: usize,
    /// Most tasks in one job, all groups together (default 50,000).
    pub max_tasks: u64,
}

impl Default for JobLimits {
    fn default() -> Self {
        JobLimits {
            max_groups: 100,
            max_tasks: 50_000,
        }
    }
}

impl Job {
    /// Checks the job against `limits`.
    ///
    /// # Errors
    /// [`FieldError`] on `groups` naming the cap it is over and the setting that raises it.
    pub fn check_limits(&self, limits: &JobLimits) -> Result<(), FieldError> {
        if self.groups.len() > limits.max_groups {
            return Err(invalid(
                "groups",
                format!(
                    "{} task groups is more than this cluster's cap of {} per job \
                     (the master's --max-job-groups)",
                    self.groups.len(),
                    limits.max_groups
                ),
            ));
        }
        let tasks: u64 = self.groups.iter().map(|g| u64::from(g.count)).sum();
        if tasks > limits.max_tasks {
            return Err(invalid(
                "groups",
                format!(
                    "{tasks} tasks in all is more than this cluster's cap of {} per job \
                     (the master's --max-job-tasks)",
                    limits.max_tasks
                ),
            ));
        }
        Ok(())
    }
}

fn invalid(field: impl Into<String>, problem: impl Into<String>) -> FieldError {
    FieldError::new(field, problem)
}

impl Job {
    /// Checks the rules a submitted job must meet: a name of 1 to 128 letters, digits, `-` or
    /// `_` (the job's and each group's, groups' unique); a priority in `1..=100`; at least one
    /// group; a count of 1 to 10,000 (any for system jobs, which run one task per agent);
    /// positive, finite cpus and at least 1 MiB of memory; a command; constraints that name an
    /// attribute.
    ///
    /// # Errors
    /// [`FieldError`] naming the first field that is wrong (`groups[0].resources.cpus`).
    pub fn validate(&self) -> Result<(), FieldError> {
        if !valid_name(&self.name) {
            return Err(invalid(
                "name",
                format!(
                    "{:?} must be 1 to 128 letters, digits, '-' or '_'",
                    self.name
                ),
            ));
        }
        if !(1..=100).contains(&self.priority) {
            return Err(invalid(
                "priority",
                format!("{} is not within 1..=100", self.priority),
            ));
        }
        if self.groups.is_empty() {
            return Err(invalid("groups", "a job needs at least one task group"));
        }
        let mut names = BTreeSet::new();
        for (i, group) in self.groups.iter().enumerate() {
            let field = |name: &str| format!("groups[{i}].{name}");
            if !valid_name(&group.name) {
                return Err(invalid(
                    field("name"),
                    format!(
                        "{:?} must be 1 to 128 letters, digits, '-' or '_'",
                        group.name
                    ),
                ));
            }
            if !names.insert(group.name.as_str()) {
                return Err(invalid(
                    field("name"),
                    format!("{:?} is used by another group", group.name),
                ));
            }
            if self.scheduler != SchedulerType::System && group.count == 0 {
                return Err(invalid(field("count"), "must be at least 1"));
            }
            if group.count > MAX_GROUP_COUNT {
                return Err(invalid(
                    field("count"),
                    format!("{} is more than {MAX_GROUP_COUNT}", group.count),
                ));
            }
            let cpus = group.resources.cpus;
            if !cpus.is_finite() || cpus <= 0.0 {
                return Err(invalid(
                    field("resources.cpus"),
                    format!("{cpus} must be a positive number"),
                ));
            }
            if group.resources.mem_mb == 0 {
                return Err(invalid(field("resources.mem_mb"), "must be at least 1"));
            }
            if group.command.trim().is_empty() {
                return Err(invalid(field("command"), "must name a program"));
            }
            for (c, constraint) in group.constraints.iter().enumerate() {
                if constraint.attribute.is_empty() {
                    return Err(invalid(
                        format!("groups[{i}].constraints[{c}].attribute"),
                        "must name an attribute",
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_cap_groups_and_total_tasks_and_name_the_setting() {
        let group = |i: usize, count| TaskGroup {
            name: format!("g{i}"),
            count,
            ..TaskGroup::default()
        };
        let mut job = Job {
            name: "big".into(),
            priority: 50,
            scheduler: SchedulerType::Service,
            groups: (0..3).map(|i| group(i, 10)).collect(),
            stopped: false,
            version: 0,
        };
        let limits = JobLimits {
            max_groups: 3,
            max_tasks: 30,
        };
        assert!(job.check_limits(&limits).is_ok());
        job.groups.push(group(3, 0));
        let error = job.check_limits(&limits).unwrap_err().to_string();
        assert!(
            error.contains("4 task groups") && error.contains("--max-job-groups"),
            "{error}"
        );
        job.groups.pop();
        job.groups[0].count = 11;
        let error = job.check_limits(&limits).unwrap_err().to_string();
        assert!(
            error.contains("31 tasks") && error.contains("--max-job-tasks"),
            "{error}"
        );
    }

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

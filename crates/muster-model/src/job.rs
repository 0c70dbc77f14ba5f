//! Jobs: what users ask to run (Nomad's model), and the rules a submitted job must meet.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::FieldError;
use crate::lifecycle::{Check, KillSignal, ReschedulePolicy, RestartPolicy};
use crate::names::invalid;
use crate::placement::{Affinity, Constraint, Spread};
use crate::ports::PortRequest;
use crate::resources::Resources;
use crate::update::UpdatePolicy;

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

    /// The lower-case name used in job files and stats, which is also the name of its
    /// built-in scheduler.
    pub fn name(self) -> &'static str {
        match self {
            SchedulerType::Service => "service",
            SchedulerType::Batch => "batch",
            SchedulerType::System => "system",
        }
    }

    /// The type whose built-in scheduler is called `name`, if one is.
    pub fn of_built_in(name: &str) -> Option<SchedulerType> {
        SchedulerType::ALL.into_iter().find(|t| t.name() == name)
    }
}

/// The names of the built-in schedulers, which the master's own workers serve: one per
/// [`SchedulerType`].
pub const BUILT_IN_SCHEDULERS: [&str; 3] = ["service", "batch", "system"];

impl fmt::Display for SchedulerType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
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
    /// The user its tasks run as; empty for the agent's choice (its `--task-user`, or for a
    /// root agent a uid of the task's own from its `--task-uid-range`). An agent runs a task as a
    /// named user only if its config allows that user.
    #[serde(default)]
    pub user: String,
    /// How many of its tasks may move at once off a draining agent (Nomad's
    /// `migrate.max_parallel`); 0 counts as 1. Each moving task keeps running until its
    /// replacement runs elsewhere.
    #[serde(default)]
    pub migrate_max_parallel: u32,
    /// What becomes of its tasks while their agent is unreachable, and when it comes back.
    #[serde(default)]
    pub disconnect: Disconnect,
    /// Agents its tasks would rather run on (or avoid), by weight. Soft: a change places new
    /// tasks by it and replaces none.
    #[serde(default)]
    pub affinities: Vec<Affinity>,
    /// Attributes its tasks spread over. Soft, as affinities are.
    #[serde(default)]
    pub spreads: Vec<Spread>,
    /// The ports each task is given (see [`ports`](crate::ports)).
    #[serde(default)]
    pub ports: Vec<PortRequest>,
    /// How its agent restarts a failed task in place; `None`: never.
    #[serde(default)]
    pub restart: Option<RestartPolicy>,
    /// How the master places a failed task again; `None`: the master's own back-off for
    /// service and system jobs, never for batch jobs (see [`ReschedulePolicy`]).
    #[serde(default)]
    pub reschedule: Option<ReschedulePolicy>,
    /// The health checks its agent runs against each task.
    #[serde(default)]
    pub checks: Vec<Check>,
    /// The signal that asks a task to stop; `None`: SIGTERM.
    #[serde(default)]
    pub kill_signal: Option<KillSignal>,
    /// How long a task has after its kill signal before SIGKILL, in milliseconds; `None`: the
    /// agent's `--kill-grace`.
    #[serde(default)]
    pub kill_timeout_ms: Option<u64>,
    /// Batch jobs only: how long a task may run before it is stopped and FAILED, in
    /// milliseconds; `None`: no limit.
    #[serde(default)]
    pub max_run_duration_ms: Option<u64>,
    /// How its tasks are replaced when the job changes (service and system jobs); `None`: all
    /// at once, with no deployment.
    #[serde(default)]
    pub update: Option<UpdatePolicy>,
    /// Whether its missing tasks are placed all at once or not at all (a distributed training
    /// run, an MPI job): a scheduler places none of them until every one fits, and the plan
    /// applier commits such a plan's placements whole or not at all.
    #[serde(default)]
    pub gang: bool,
}

/// What becomes of a group's tasks while their agent is unreachable, and when it comes back
/// (Nomad's `disconnect` block). Meanwhile they are [`Unknown`](crate::TaskState::Unknown).
/// What is left unset takes the job type's default ([`Disconnect::policy`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Disconnect {
    /// Place a replacement while the agent is away. `None`: yes for service and system jobs;
    /// no for batch jobs, whose tasks must not run twice: a batch task keeps its slot until
    /// `lost_after`.
    pub replace: Option<bool>,
    /// How long a task may stay unknown before it is lost for good, in milliseconds: then a
    /// replacement is placed whatever `replace` says, and the task is stopped if its agent
    /// comes back. `Some(0)`: never. `None`: never for service and system jobs,
    /// [`BATCH_LOST_AFTER`] for batch jobs.
    pub lost_after_ms: Option<u64>,
    /// Which copy stays when the agent comes back and a replacement runs.
    pub reconcile: Reconcile,
}

/// How long a batch task whose agent is unreachable keeps its slot by default before it is
/// given up and run again elsewhere: as long as an agent keeps tasks it left running
/// (`muster-agent --recovery-timeout`, Mesos's 15 minutes).
pub const BATCH_LOST_AFTER: std::time::Duration = std::time::Duration::from_secs(15 * 60);

impl Disconnect {
    /// The policy for a group of a job of type `scheduler`, with that type's defaults for
    /// what is unset.
    pub fn policy(&self, scheduler: SchedulerType) -> DisconnectPolicy {
        let batch = scheduler == SchedulerType::Batch;
        let default_lost_after = if batch {
            u64::try_from(BATCH_LOST_AFTER.as_millis()).unwrap_or(u64::MAX)
        } else {
            0
        };
        DisconnectPolicy {
            replace: self.replace.unwrap_or(!batch),
            lost_after_ms: self.lost_after_ms.unwrap_or(default_lost_after),
            reconcile: self.reconcile,
        }
    }
}

/// A group's [`Disconnect`] with its job type's defaults filled in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DisconnectPolicy {
    /// Place a replacement while the agent is away.
    pub replace: bool,
    /// How long a task may stay unknown before it is lost for good, in milliseconds; 0: never.
    pub lost_after_ms: u64,
    /// Which copy stays when the agent comes back and a replacement runs.
    pub reconcile: Reconcile,
}

impl DisconnectPolicy {
    /// Whether a task unknown since `since_ms` (Unix milliseconds) is lost for good at `now_ms`.
    pub fn lost_for_good(&self, since_ms: u64, now_ms: u64) -> bool {
        self.lost_after_ms > 0 && now_ms.saturating_sub(since_ms) >= self.lost_after_ms
    }
}

/// Which of two copies of a slot stays when an agent comes back with the original while a
/// replacement runs (Nomad's `disconnect.reconcile`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reconcile {
    /// The copy on the agent placement ranks better now: the fuller agent (most of its CPUs
    /// and memory in use), as bin-packing would choose; the original on a tie.
    BestScore,
    /// The original.
    KeepOriginal,
    /// The replacement.
    KeepReplacement,
    /// The copy that has run longest (the default): the original if it was running when its
    /// agent was lost (Muster does not restart tasks in place, so it started before any
    /// replacement). A healed partition then keeps what ran through it.
    #[default]
    LongestRunning,
}

impl Reconcile {
    /// The word job files use (`best_score`).
    pub fn name(self) -> &'static str {
        match self {
            Reconcile::BestScore => "best_score",
            Reconcile::KeepOriginal => "keep_original",
            Reconcile::KeepReplacement => "keep_replacement",
            Reconcile::LongestRunning => "longest_running",
        }
    }
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
            disconnect: _,
            affinities: _,
            spreads: _,
            ports,
            restart,
            // The master's alone: no task needs to be told.
            reschedule: _,
            checks,
            kill_signal,
            kill_timeout_ms,
            max_run_duration_ms,
            // How tasks are replaced, not what they are.
            update: _,
            // How tasks are placed, not what they are.
            gang: _,
        } = self;
        *resources == other.resources
            && *command == other.command
            && *args == other.args
            && *env == other.env
            && *constraints == other.constraints
            && *user == other.user
            && *ports == other.ports
            && *restart == other.restart
            && *checks == other.checks
            && *kill_signal == other.kill_signal
            && *kill_timeout_ms == other.kill_timeout_ms
            && *max_run_duration_ms == other.max_run_duration_ms
    }
}

/// What a user asked to run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// The job's id: its name, prefixed `namespace:` outside the `default` namespace
    /// (see [`namespace`](crate::namespace)).
    pub name: String,
    /// 1 (lowest) to 100 (highest); orders evaluations in the broker.
    pub priority: u8,
    /// What kind of job it is: how its tasks are kept (at a count, to completion, one per
    /// agent), and which built-in scheduler plans it unless it names another.
    pub scheduler: SchedulerType,
    /// The scheduler it names instead of its type's built-in one (`scheduler = "gang"`):
    /// only workers serving that name plan it. `None` for the built-in one; see
    /// [`scheduler_name`](Self::scheduler_name).
    #[serde(default)]
    pub named_scheduler: Option<String>,
    /// Its task groups.
    pub groups: Vec<TaskGroup>,
    /// Set when the job is stopped: its tasks should not run.
    pub stopped: bool,
    /// Bumped by the registry on every change.
    pub version: u64,
}

impl Job {
    /// Its namespace.
    pub fn namespace(&self) -> &str {
        crate::namespace::namespace_of(&self.name)
    }

    /// Its name within its namespace.
    pub fn name_in_namespace(&self) -> &str {
        crate::namespace::split_job_id(&self.name).1
    }

    /// The name of the scheduler that plans it: the one it names, or its type's built-in one.
    pub fn scheduler_name(&self) -> &str {
        self.named_scheduler
            .as_deref()
            .unwrap_or(self.scheduler.name())
    }
}

/// The most arguments one group's program may take.
pub const MAX_ARGS: usize = 4_096;

/// The most environment variables one group may set.
pub const MAX_ENV: usize = 4_096;

/// The default cap on a submitted job's encoded size (its protobuf `Job`), in bytes.
pub const DEFAULT_MAX_JOB_BYTES: usize = 1024 * 1024;

/// The highest cap an operator may set on a job's encoded size. A task's launch carries its
/// group whole over the link to its agent, which carries messages of up to 4 MiB; 3 MiB leaves
/// room for the launch's own fields.
pub const MAX_JOB_BYTES_CEILING: usize = 3 * 1024 * 1024;

/// Caps on one job's size, set by the master's operator, so that one submission cannot exhaust
/// the master or the registry: its encoded size, groups per job, and tasks per job (the sum of
/// its groups' counts; system jobs, one task per agent, count none). Arguments, environment
/// variables and a group's count have fixed caps ([`MAX_ARGS`], [`MAX_ENV`],
/// [`MAX_GROUP_COUNT`]), checked by [`Job::validate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobLimits {
    /// Most bytes of a submitted job, encoded as its protobuf `Job` (default 1 MiB, at most
    /// [`MAX_JOB_BYTES_CEILING`]). HTTP's JSON documents are read into that form and measured
    /// the same way.
    pub max_bytes: usize,
    /// Most task groups in one job (default 100).
    pub max_groups: usize,
    /// Most tasks in one job, all groups together (default 50,000).
    pub max_tasks: u64,
}

impl Default for JobLimits {
    fn default() -> Self {
        JobLimits {
            max_bytes: DEFAULT_MAX_JOB_BYTES,
            max_groups: 100,
            max_tasks: 50_000,
        }
    }
}

impl JobLimits {
    /// Checks the limits themselves, as an operator set them.
    ///
    /// # Errors
    /// A message naming the setting that is out of range and its range.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_bytes == 0 || self.max_bytes > MAX_JOB_BYTES_CEILING {
            return Err(format!(
                "--max-job-bytes {} is not within 1..={MAX_JOB_BYTES_CEILING} (a task's launch \
                 carries its group whole, and the link to an agent carries at most 4 MiB)",
                self.max_bytes
            ));
        }
        if self.max_groups == 0 {
            return Err("--max-job-groups must be at least 1".into());
        }
        if self.max_tasks == 0 {
            return Err("--max-job-tasks must be at least 1".into());
        }
        Ok(())
    }

    /// Checks a submitted job's encoded size, `bytes`, before anything else is read from it.
    ///
    /// # Errors
    /// [`FieldError`] on `job` naming the size, the cap and the setting that raises it.
    pub fn check_encoded_size(&self, bytes: usize) -> Result<(), FieldError> {
        if bytes > self.max_bytes {
            return Err(invalid(
                "job",
                format!(
                    "the job is {bytes} bytes encoded, more than this cluster's cap of {} bytes \
                     per job (the master's --max-job-bytes)",
                    self.max_bytes
                ),
            ));
        }
        Ok(())
    }
}

impl Job {
    /// About how many bytes the job takes encoded: its text, and a few bytes for each field
    /// and each number. The same on every master (it reads nothing but the job), so the
    /// registry can bound what it keeps by it.
    pub fn approximate_size(&self) -> usize {
        const FIELD: usize = 4;
        let text = |s: &str| s.len() + FIELD;
        let groups: usize = self
            .groups
            .iter()
            .map(|g| {
                text(&g.name)
                    + text(&g.command)
                    + text(&g.user)
                    + g.args.iter().map(|a| text(a)).sum::<usize>()
                    + g.env.iter().map(|(k, v)| text(k) + text(v)).sum::<usize>()
                    + g.constraints
                        .iter()
                        .map(|c| text(&c.attribute) + text(&c.value) + FIELD)
                        .sum::<usize>()
                    + g.affinities
                        .iter()
                        .map(|a| text(&a.attribute) + text(&a.value) + 2 * FIELD)
                        .sum::<usize>()
                    + g.spreads
                        .iter()
                        .map(|s| {
                            text(&s.attribute)
                                + FIELD
                                + s.targets
                                    .iter()
                                    .map(|t| text(&t.value) + FIELD)
                                    .sum::<usize>()
                        })
                        .sum::<usize>()
                    + g.ports
                        .iter()
                        .map(|p| text(&p.label) + FIELD)
                        .sum::<usize>()
                    + 8 * FIELD
            })
            .sum();
        text(&self.name) + groups + 4 * FIELD
    }

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
            named_scheduler: None,
            groups: (0..3).map(|i| group(i, 10)).collect(),
            stopped: false,
            version: 0,
        };
        let limits = JobLimits {
            max_groups: 3,
            max_tasks: 30,
            ..JobLimits::default()
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

    fn one_group_job(group: TaskGroup) -> Job {
        Job {
            name: "j".into(),
            priority: 50,
            scheduler: SchedulerType::Batch,
            named_scheduler: None,
            groups: vec![TaskGroup {
                name: "g".into(),
                count: 1,
                resources: crate::Resources {
                    cpus: 0.1,
                    mem_mb: 16,
                },
                ..group
            }],
            stopped: false,
            version: 0,
        }
    }

    #[test]
    fn control_characters_and_nul_are_refused_where_they_are() {
        let ok = TaskGroup {
            command: "/bin/sh".into(),
            args: vec!["-c".into(), "echo a\techo b\n".into()],
            env: BTreeMap::from([("PEM".to_owned(), "line 1\r\nline 2".to_owned())]),
            ..TaskGroup::default()
        };
        assert_eq!(one_group_job(ok.clone()).validate(), Ok(()));
        let refused = |group: TaskGroup| {
            one_group_job(group)
                .validate()
                .expect_err("refused")
                .to_string()
        };
        let error = refused(TaskGroup {
            args: vec!["-c".into(), "a\0b".into()],
            ..ok.clone()
        });
        assert!(
            error.contains("groups[0].args[1]") && error.contains("U+0000 at byte 1"),
            "{error}"
        );
        let error = refused(TaskGroup {
            env: BTreeMap::from([("K\u{1}".to_owned(), "v".to_owned())]),
            ..ok.clone()
        });
        assert!(
            error.contains("U+0001") && error.contains("none is allowed"),
            "{error}"
        );
        let error = refused(TaskGroup {
            env: BTreeMap::from([("K".to_owned(), "\u{7f}".to_owned())]),
            ..ok.clone()
        });
        assert!(error.contains("U+007F"), "{error}");
        let error = refused(TaskGroup {
            env: BTreeMap::from([("A=B".to_owned(), "v".to_owned())]),
            ..ok.clone()
        });
        assert!(error.contains("without '='"), "{error}");
        let error = refused(TaskGroup {
            command: "/bin/sh\n".into(),
            ..ok.clone()
        });
        assert!(error.contains("groups[0].command"), "{error}");
        let error = refused(TaskGroup {
            args: vec![String::new(); MAX_ARGS + 1],
            ..ok
        });
        assert!(error.contains("4097 arguments"), "{error}");
    }

    #[test]
    fn the_encoded_size_cap_names_the_size_and_the_setting_and_is_itself_bounded() {
        let limits = JobLimits::default();
        assert!(limits.check_encoded_size(DEFAULT_MAX_JOB_BYTES).is_ok());
        let error = limits
            .check_encoded_size(DEFAULT_MAX_JOB_BYTES + 1)
            .expect_err("over")
            .to_string();
        assert!(
            error.contains("1048577 bytes") && error.contains("--max-job-bytes"),
            "{error}"
        );
        assert_eq!(limits.validate(), Ok(()));
        let too_high = JobLimits {
            max_bytes: MAX_JOB_BYTES_CEILING + 1,
            ..limits
        };
        assert!(
            too_high
                .validate()
                .expect_err("over the ceiling")
                .contains("--max-job-bytes")
        );
    }

    #[test]
    fn placement_rules_are_checked_where_they_are() {
        let regexp = TaskGroup {
            command: "true".into(),
            constraints: vec![Constraint {
                attribute: "rack".into(),
                op: crate::ConstraintOp::Regexp,
                value: "(r1".into(),
            }],
            ..TaskGroup::default()
        };
        let error = one_group_job(regexp).validate().unwrap_err();
        assert_eq!(error.field(), "groups[0].constraints[0].value", "{error}");
        let spread = TaskGroup {
            command: "true".into(),
            spreads: vec![Spread {
                attribute: "zone".into(),
                weight: 50,
                targets: vec![crate::SpreadTarget {
                    value: "a".into(),
                    percent: 101,
                }],
            }],
            ..TaskGroup::default()
        };
        let error = one_group_job(spread).validate().unwrap_err();
        assert_eq!(error.field(), "groups[0].spreads[0].targets", "{error}");
    }
}

//! [`JobSpec`]: the job document users write — a TOML file for `muster job run FILE`, or the
//! same document as JSON in the body of `POST /v1/jobs` — and its conversion to the wire form
//! (`muster.model.v1.Job`). The master validates the job; this only checks the document's shape
//! and its words (`type`, `operator`), and its errors name the key.

use std::collections::BTreeMap;

use muster_model::ConstraintOp;
use muster_proto::model as pb;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

mod lifecycle;
mod update;

pub use lifecycle::{CheckSpec, RescheduleSpec, RestartSpec};
pub use update::UpdateSpec;

/// A job: its name, type and priority, and its task groups.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// The job's name: letters, digits, `-` and `_`, at most 128; unique in its namespace.
    pub name: String,
    /// Its namespace (it must exist: `muster namespace apply`); absent: `default`. A
    /// request's `?namespace=` (the CLI's `--namespace`) names it when the document does not.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// `service` (the default), `batch` or `system`.
    #[serde(rename = "type", default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// The scheduler that plans it, when not its type's built-in one (`gang`): only workers
    /// serving that name are handed its evaluations, and until one connects they wait, saying
    /// so. Absent: the type's built-in scheduler.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub scheduler: String,
    /// `gang = true` on the job: every group's tasks are placed all at once (see
    /// [`GroupSpec::gang`]).
    #[serde(default, skip_serializing_if = "is_false")]
    pub gang: bool,
    /// 1 to 100; 0 or absent: 50.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub priority: u32,
    /// Its task groups.
    #[serde(rename = "group", default)]
    pub groups: Vec<GroupSpec>,
}

/// A task group: `count` copies of one task.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GroupSpec {
    /// The group's name, unique in the job.
    pub name: String,
    /// How many copies run (default 1; a system job: one per agent).
    #[serde(default = "one")]
    pub count: u32,
    /// The program each task runs.
    pub command: String,
    /// Its arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Its environment.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// CPUs each task is given.
    pub cpus: f64,
    /// Memory each task is given, in MiB.
    pub mem_mb: u64,
    /// Agent attributes a task's agent must (not) have.
    #[serde(rename = "constraint", default, skip_serializing_if = "Vec::is_empty")]
    pub constraints: Vec<ConstraintSpec>,
    /// The user its tasks run as (the agent must allow it); empty: the agent's `--task-user`, or
    /// on a root agent a uid of each task's own.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub user: String,
    /// How many of its tasks may move at once off a draining agent (Nomad's
    /// `migrate.max_parallel`); 0 or absent: 1.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub migrate_max_parallel: u32,
    /// What becomes of its tasks while their agent is unreachable, and when it comes back
    /// (`[group.disconnect]`); absent: the defaults.
    #[serde(default, skip_serializing_if = "DisconnectSpec::is_default")]
    pub disconnect: DisconnectSpec,
    /// Agents its tasks would rather run on, or avoid (`[[group.affinity]]`).
    #[serde(rename = "affinity", default, skip_serializing_if = "Vec::is_empty")]
    pub affinities: Vec<AffinitySpec>,
    /// Attributes its tasks spread over (`[[group.spread]]`).
    #[serde(rename = "spread", default, skip_serializing_if = "Vec::is_empty")]
    pub spreads: Vec<SpreadSpec>,
    /// The ports each task is given (`[[group.port]]`): it finds them in
    /// `MUSTER_PORT_<LABEL>` and `MUSTER_ADDR_<LABEL>`.
    #[serde(rename = "port", default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<PortSpec>,
    /// How its agent restarts a failed or unhealthy task in place (`[group.restart]`);
    /// absent: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart: Option<RestartSpec>,
    /// How a failed task is placed again (`[group.reschedule]`); absent: the master's own
    /// back-off for service and system jobs, never for batch jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reschedule: Option<RescheduleSpec>,
    /// Health checks its agent runs against each task (`[[group.check]]`).
    #[serde(rename = "check", default, skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<CheckSpec>,
    /// The signal that asks a task to stop: `SIGTERM` (the default), `SIGINT`, `SIGQUIT`,
    /// `SIGHUP`, `SIGUSR1` or `SIGUSR2`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kill_signal: String,
    /// How long a task has after its kill signal before SIGKILL (`30s`); absent: the agent's
    /// `--kill-grace`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kill_timeout: String,
    /// Batch jobs: how long a task may run before it is stopped and FAILED (`2h`); absent:
    /// no limit.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub max_run_duration: String,
    /// How its tasks are replaced when the job changes (`[group.update]`): a deployment,
    /// rolling and with canaries; absent: all at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update: Option<UpdateSpec>,
    /// Whether its missing tasks are placed all at once or not at all (a training run, an MPI
    /// job): none is placed until every one fits, and the evaluation waits saying how many
    /// found room.
    #[serde(default, skip_serializing_if = "is_false")]
    pub gang: bool,
}

/// A port a group's tasks are given.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PortSpec {
    /// Its name (`http`): letters, digits and `_`, unique in the group.
    pub label: String,
    /// This port on every agent (two tasks holding it never share an agent); absent or 0: one
    /// the scheduler picks from the agent's dynamic range.
    #[serde(rename = "static", default, skip_serializing_if = "is_zero")]
    pub static_port: u32,
}

/// What becomes of a group's tasks while their agent is unreachable (they are `UNKNOWN`
/// meanwhile), and when it comes back: Nomad's `disconnect` block. What is left out takes the
/// job type's default.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DisconnectSpec {
    /// Place a replacement while the agent is away. Absent: true for service and system jobs,
    /// false for batch jobs (a batch task must not run twice: it keeps its slot until
    /// `lost_after`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replace: Option<bool>,
    /// How long a task may stay unknown before it is lost for good (replaced, and stopped if
    /// its agent comes back), as a duration (`90s`, `30m`, `1h`) or `never`. Absent: never for
    /// service and system jobs, 15m for batch jobs.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub lost_after: String,
    /// Which copy stays when the agent comes back while a replacement runs:
    /// `longest_running` (the default: the original, if it was running when its agent was
    /// lost), `best_score` (the copy on the fuller agent, the original on a tie),
    /// `keep_original` or `keep_replacement`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reconcile: String,
}

impl DisconnectSpec {
    fn is_default(&self) -> bool {
        *self == DisconnectSpec::default()
    }

    /// The wire form; `key` names the block in an error.
    fn to_proto(&self, key: &str) -> Result<pb::Disconnect, SpecError> {
        let lost_after_ms = match self.lost_after.as_str() {
            "" => None,
            "never" => Some(0),
            text => {
                let after = humantime::parse_duration(text).map_err(|e| SpecError::Value {
                    key: format!("{key}.lost_after"),
                    message: format!("{text:?} is not a duration (90s, 30m, 1h) or never: {e}"),
                })?;
                Some(u64::try_from(after.as_millis()).unwrap_or(u64::MAX).max(1))
            }
        };
        let reconcile = match self.reconcile.as_str() {
            "" => pb::Reconcile::Unspecified,
            "best_score" => pb::Reconcile::BestScore,
            "keep_original" => pb::Reconcile::KeepOriginal,
            "keep_replacement" => pb::Reconcile::KeepReplacement,
            "longest_running" => pb::Reconcile::LongestRunning,
            other => {
                return Err(SpecError::Value {
                    key: format!("{key}.reconcile"),
                    message: format!(
                        "{other:?} is not one of longest_running, best_score, keep_original, \
                         keep_replacement"
                    ),
                });
            }
        };
        Ok(pb::Disconnect {
            replace: self.replace,
            lost_after_ms,
            reconcile: reconcile as i32,
        })
    }

    /// The document form of the wire's.
    fn from_proto(disconnect: Option<&pb::Disconnect>) -> DisconnectSpec {
        let Some(disconnect) = disconnect else {
            return DisconnectSpec::default();
        };
        let reconcile = match pb::Reconcile::try_from(disconnect.reconcile) {
            Ok(pb::Reconcile::BestScore) => "best_score",
            Ok(pb::Reconcile::KeepOriginal) => "keep_original",
            Ok(pb::Reconcile::KeepReplacement) => "keep_replacement",
            Ok(pb::Reconcile::LongestRunning) => "longest_running",
            _ => "",
        };
        let lost_after = match disconnect.lost_after_ms {
            None => String::new(),
            Some(0) => "never".to_owned(),
            Some(ms) => {
                humantime::format_duration(std::time::Duration::from_millis(ms)).to_string()
            }
        };
        DisconnectSpec {
            replace: disconnect.replace,
            lost_after,
            reconcile: reconcile.to_owned(),
        }
    }
}

/// A placement constraint on an agent attribute (or, `distinct_hosts`, on its tasks).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ConstraintSpec {
    /// The attribute (`rack`, `muster.isolation`, ...); none for `distinct_hosts`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub attribute: String,
    /// `=` (the default), `!=`, `regexp`, `version`, `set_contains`, `is_set`, `is_not_set`,
    /// or `distinct_hosts` (no two of the group's tasks on one agent).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub operator: String,
    /// The value compared: a pattern for `regexp`, a requirement (`>= 1.2, < 2`) for
    /// `version`, a comma-separated list for `set_contains`; none for `is_set`,
    /// `is_not_set` and `distinct_hosts`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub value: String,
}

/// A soft placement preference on an agent attribute (Nomad's `affinity`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AffinitySpec {
    /// The attribute (`zone`).
    pub attribute: String,
    /// Any constraint operator but `distinct_hosts`; absent: `=`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub operator: String,
    /// The value compared.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub value: String,
    /// -100 to 100, not 0: how much a matching agent is preferred (negative: avoided).
    pub weight: i32,
}

/// Spreads a group's tasks over the values of an attribute (Nomad's `spread`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SpreadSpec {
    /// The attribute (`zone`).
    pub attribute: String,
    /// 1 to 100, against the group's other spreads and affinities; 0 or absent: 50.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub weight: u32,
    /// Each value's share (`[[group.spread.target]]`); values not listed share what is left
    /// of 100 %. None: even shares over the values seen.
    #[serde(rename = "target", default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<SpreadTargetSpec>,
}

/// One value's share of a spread.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SpreadTargetSpec {
    /// The attribute's value (`eu-1`).
    pub value: String,
    /// Its share of the group's tasks, in percent.
    pub percent: u32,
}

fn one() -> u32 {
    1
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Why a job document was refused: the key and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// The text is not a job document (bad syntax, an unknown or missing key); serde's message
    /// names the key and where.
    #[error("{0}")]
    Syntax(String),
    /// A key holds a word the document does not know.
    #[error("{key}: {message}")]
    Value {
        /// The key's path (`group[0].constraint[1].operator`).
        key: String,
        /// What is wrong.
        message: String,
    },
}

impl JobSpec {
    /// Reads a TOML job file's text.
    ///
    /// # Errors
    /// [`SpecError::Syntax`] naming the key and line.
    pub fn from_toml(text: &str) -> Result<JobSpec, SpecError> {
        toml::from_str(text).map_err(|e| SpecError::Syntax(e.to_string()))
    }

    /// Reads the JSON form (an HTTP request's body).
    ///
    /// # Errors
    /// [`SpecError::Syntax`] naming the key, line and column.
    pub fn from_json(text: &[u8]) -> Result<JobSpec, SpecError> {
        serde_json::from_slice(text).map_err(|e| SpecError::Syntax(e.to_string()))
    }

    /// The wire form of the job, as the master takes it.
    ///
    /// # Errors
    /// [`SpecError::Value`] for an unknown `type`, `operator` or `reconcile`, or a
    /// `lost_after` that is not a duration.
    pub fn to_proto(&self) -> Result<pb::Job, SpecError> {
        let mut groups = Vec::with_capacity(self.groups.len());
        for (i, g) in self.groups.iter().enumerate() {
            let mut constraints = Vec::with_capacity(g.constraints.len());
            for (c, constraint) in g.constraints.iter().enumerate() {
                let op = operator(
                    &constraint.operator,
                    &format!("group[{i}].constraint[{c}].operator"),
                )?;
                constraints.push(pb::Constraint {
                    attribute: constraint.attribute.clone(),
                    op,
                    value: constraint.value.clone(),
                });
            }
            groups.push(pb::TaskGroup {
                gang: self.gang || g.gang,
                name: g.name.clone(),
                count: g.count,
                resources: Some(pb::Resources {
                    cpus: g.cpus,
                    mem_mb: g.mem_mb,
                }),
                command: g.command.clone(),
                args: g.args.clone(),
                env: g.env.clone().into_iter().collect(),
                constraints,
                spec_version: 0,
                user: g.user.clone(),
                migrate_max_parallel: g.migrate_max_parallel,
                disconnect: Some(g.disconnect.to_proto(&format!("group[{i}].disconnect"))?),
                affinities: g
                    .affinities
                    .iter()
                    .enumerate()
                    .map(|(a, affinity)| {
                        Ok(pb::Affinity {
                            attribute: affinity.attribute.clone(),
                            op: operator(
                                &affinity.operator,
                                &format!("group[{i}].affinity[{a}].operator"),
                            )?,
                            value: affinity.value.clone(),
                            weight: affinity.weight,
                        })
                    })
                    .collect::<Result<_, SpecError>>()?,
                spreads: g
                    .spreads
                    .iter()
                    .map(|spread| pb::Spread {
                        attribute: spread.attribute.clone(),
                        weight: spread.weight,
                        targets: spread
                            .targets
                            .iter()
                            .map(|t| pb::SpreadTarget {
                                value: t.value.clone(),
                                percent: t.percent,
                            })
                            .collect(),
                    })
                    .collect(),
                ports: g
                    .ports
                    .iter()
                    .map(|p| pb::PortRequest {
                        label: p.label.clone(),
                        static_port: p.static_port,
                    })
                    .collect(),
                restart: g
                    .restart
                    .as_ref()
                    .map(|r| r.to_proto(&format!("group[{i}].restart")))
                    .transpose()?,
                reschedule: g
                    .reschedule
                    .as_ref()
                    .map(|r| r.to_proto(&format!("group[{i}].reschedule")))
                    .transpose()?,
                checks: g
                    .checks
                    .iter()
                    .enumerate()
                    .map(|(c, check)| check.to_proto(&format!("group[{i}].check[{c}]")))
                    .collect::<Result<_, SpecError>>()?,
                kill_signal: g.kill_signal.clone(),
                kill_timeout_ms: lifecycle::duration_ms(
                    &g.kill_timeout,
                    &format!("group[{i}]"),
                    "kill_timeout",
                )?,
                max_run_duration_ms: lifecycle::duration_ms(
                    &g.max_run_duration,
                    &format!("group[{i}]"),
                    "max_run_duration",
                )?
                .unwrap_or(0),
                update: g
                    .update
                    .as_ref()
                    .map(|u| u.to_proto(&format!("group[{i}].update")))
                    .transpose()?,
            });
        }
        Ok(pb::Job {
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            priority: self.priority,
            scheduler: scheduler(&self.kind)? as i32,
            groups,
            stopped: false,
            version: 0,
            scheduler_name: self.scheduler.clone(),
        })
    }

    /// The document form of a job the master holds (for reading it back, and `history`).
    pub fn from_proto(job: &pb::Job) -> JobSpec {
        JobSpec {
            name: job.name.clone(),
            namespace: job.namespace.clone(),
            kind: scheduler_name(job.scheduler).to_owned(),
            scheduler: job.scheduler_name.clone(),
            // Said per group: a job-wide `gang` reads back on each of its groups.
            gang: false,
            priority: job.priority,
            groups: job
                .groups
                .iter()
                .map(|g| GroupSpec {
                    name: g.name.clone(),
                    count: g.count,
                    command: g.command.clone(),
                    args: g.args.clone(),
                    env: g.env.clone().into_iter().collect(),
                    cpus: g.resources.as_ref().map_or(0.0, |r| r.cpus),
                    mem_mb: g.resources.as_ref().map_or(0, |r| r.mem_mb),
                    constraints: g
                        .constraints
                        .iter()
                        .map(|c| ConstraintSpec {
                            attribute: c.attribute.clone(),
                            operator: operator_name(c.op).into(),
                            value: c.value.clone(),
                        })
                        .collect(),
                    user: g.user.clone(),
                    migrate_max_parallel: g.migrate_max_parallel,
                    disconnect: DisconnectSpec::from_proto(g.disconnect.as_ref()),
                    affinities: g
                        .affinities
                        .iter()
                        .map(|a| AffinitySpec {
                            attribute: a.attribute.clone(),
                            operator: operator_name(a.op).into(),
                            value: a.value.clone(),
                            weight: a.weight,
                        })
                        .collect(),
                    spreads: g
                        .spreads
                        .iter()
                        .map(|s| SpreadSpec {
                            attribute: s.attribute.clone(),
                            weight: s.weight,
                            targets: s
                                .targets
                                .iter()
                                .map(|t| SpreadTargetSpec {
                                    value: t.value.clone(),
                                    percent: t.percent,
                                })
                                .collect(),
                        })
                        .collect(),
                    ports: g
                        .ports
                        .iter()
                        .map(|p| PortSpec {
                            label: p.label.clone(),
                            static_port: p.static_port,
                        })
                        .collect(),
                    restart: g.restart.as_ref().map(RestartSpec::from_proto),
                    reschedule: g.reschedule.as_ref().map(RescheduleSpec::from_proto),
                    checks: g.checks.iter().map(CheckSpec::from_proto).collect(),
                    kill_signal: g.kill_signal.clone(),
                    kill_timeout: g
                        .kill_timeout_ms
                        .map(lifecycle::format_ms)
                        .unwrap_or_default(),
                    max_run_duration: if g.max_run_duration_ms == 0 {
                        String::new()
                    } else {
                        lifecycle::format_ms(g.max_run_duration_ms)
                    },
                    update: g.update.as_ref().map(UpdateSpec::from_proto),
                    gang: g.gang,
                })
                .collect(),
        }
    }
}

/// The scheduler that plans a job of type `scheduler` that names `named` (empty: none): the
/// one it names, or its type's built-in one.
pub fn planned_by(scheduler: i32, named: &str) -> String {
    match named {
        "" => scheduler_name(scheduler).to_owned(),
        named => named.to_owned(),
    }
}

/// The document's word for a scheduler type (`service`, `batch`, `system`; empty if unset).
pub fn scheduler_name(scheduler: i32) -> &'static str {
    match pb::SchedulerType::try_from(scheduler) {
        Ok(pb::SchedulerType::Service) => "service",
        Ok(pb::SchedulerType::Batch) => "batch",
        Ok(pb::SchedulerType::System) => "system",
        _ => "",
    }
}

fn is_false(value: &bool) -> bool {
    !*value
}

fn scheduler(kind: &str) -> Result<pb::SchedulerType, SpecError> {
    Ok(match kind {
        "" => pb::SchedulerType::Unspecified,
        "service" => pb::SchedulerType::Service,
        "batch" => pb::SchedulerType::Batch,
        "system" => pb::SchedulerType::System,
        other => {
            return Err(SpecError::Value {
                key: "type".into(),
                message: format!("{other:?} is not service, batch or system"),
            });
        }
    })
}

/// The wire's operator for a document's word; empty is unspecified (`=`).
fn operator(word: &str, key: &str) -> Result<i32, SpecError> {
    if word.is_empty() {
        return Ok(pb::ConstraintOp::Unspecified as i32);
    }
    ConstraintOp::from_name(word)
        .map(i32::from)
        .ok_or_else(|| SpecError::Value {
            key: key.into(),
            message: format!(
                "{word:?} is not one of {}",
                ConstraintOp::ALL.map(ConstraintOp::name).join(", ")
            ),
        })
}

/// The document's word for the wire's operator (`=` if unspecified or unknown).
fn operator_name(op: i32) -> &'static str {
    ConstraintOp::try_from(op).map_or("=", ConstraintOp::name)
}

#[cfg(test)]
mod tests;

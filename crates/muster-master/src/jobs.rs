//! Job specs on the wire and jobs in the registry: conversion both ways, and validation whose
//! errors name the field.

use std::collections::{BTreeMap, BTreeSet};

use muster_proto::cluster as pb;
use muster_registry::Resources;
use muster_registry::jobs::{Constraint, ConstraintOp, Job, SchedulerType, TaskGroup};

/// The priority of a job that names none (Nomad's default).
pub const DEFAULT_PRIORITY: u8 = 50;

/// A job spec that cannot be accepted, naming the field (`groups[0].resources.cpus`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid job: {field}: {problem}")]
pub struct JobSpecError {
    /// The field, as a path into the spec.
    pub field: String,
    /// What is wrong with it.
    pub problem: String,
}

fn invalid(field: impl Into<String>, problem: impl Into<String>) -> JobSpecError {
    JobSpecError {
        field: field.into(),
        problem: problem.into(),
    }
}

fn scheduler_type(name: &str) -> Result<SchedulerType, JobSpecError> {
    match name {
        "" | "service" => Ok(SchedulerType::Service),
        "batch" => Ok(SchedulerType::Batch),
        "system" => Ok(SchedulerType::System),
        other => Err(invalid(
            "type",
            format!("{other:?} is not service, batch or system"),
        )),
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
}

/// Checks `spec` and turns it into the registry's form.
///
/// # Errors
/// [`JobSpecError`] naming the first field that is wrong.
pub fn job_from_spec(spec: &pb::JobSpec) -> Result<Job, JobSpecError> {
    if !valid_name(&spec.name) {
        return Err(invalid(
            "name",
            format!(
                "{:?} must be 1 to 128 letters, digits, '-' or '_'",
                spec.name
            ),
        ));
    }
    let priority = match spec.priority {
        0 => DEFAULT_PRIORITY,
        p @ 1..=100 => p as u8,
        p => return Err(invalid("priority", format!("{p} is not within 1..=100"))),
    };
    let scheduler = scheduler_type(&spec.r#type)?;
    if spec.groups.is_empty() {
        return Err(invalid("groups", "a job needs at least one task group"));
    }
    let mut names = BTreeSet::new();
    let mut groups = Vec::with_capacity(spec.groups.len());
    for (i, group) in spec.groups.iter().enumerate() {
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
        if scheduler != SchedulerType::System && group.count == 0 {
            return Err(invalid(field("count"), "must be at least 1"));
        }
        if group.count > 10_000 {
            return Err(invalid(
                field("count"),
                format!("{} is more than 10000", group.count),
            ));
        }
        let resources = group.resources.unwrap_or_default();
        if !resources.cpus.is_finite() || resources.cpus <= 0.0 {
            return Err(invalid(
                field("resources.cpus"),
                format!("{} must be a positive number", resources.cpus),
            ));
        }
        if resources.mem_mb == 0 {
            return Err(invalid(field("resources.mem_mb"), "must be at least 1"));
        }
        if group.command.trim().is_empty() {
            return Err(invalid(field("command"), "must name a program"));
        }
        let mut constraints = Vec::with_capacity(group.constraints.len());
        for (c, constraint) in group.constraints.iter().enumerate() {
            let at = |name: &str| format!("groups[{i}].constraints[{c}].{name}");
            if constraint.attribute.is_empty() {
                return Err(invalid(at("attribute"), "must name an attribute"));
            }
            let op = match constraint.operator.as_str() {
                "=" | "==" | "" => ConstraintOp::Equal,
                "!=" => ConstraintOp::NotEqual,
                other => return Err(invalid(at("operator"), format!("{other:?} is not = or !="))),
            };
            constraints.push(Constraint {
                attribute: constraint.attribute.clone(),
                op,
                value: constraint.value.clone(),
            });
        }
        groups.push(TaskGroup {
            name: group.name.clone(),
            count: if scheduler == SchedulerType::System {
                0
            } else {
                group.count
            },
            resources: Resources {
                cpus: resources.cpus,
                mem_mb: resources.mem_mb,
            },
            command: group.command.clone(),
            args: group.args.clone(),
            env: group
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<BTreeMap<_, _>>(),
            constraints,
            // The registry sets it when it stores the job.
            spec_version: 0,
        });
    }
    Ok(Job {
        name: spec.name.clone(),
        priority,
        scheduler,
        groups,
        stopped: false,
        version: 0,
    })
}

/// The wire form of a stored job.
pub fn spec_from_job(job: &Job) -> pb::JobSpec {
    pb::JobSpec {
        name: job.name.clone(),
        priority: u32::from(job.priority),
        r#type: job.scheduler.name().to_owned(),
        groups: job
            .groups
            .iter()
            .map(|group| pb::TaskGroupSpec {
                name: group.name.clone(),
                count: group.count,
                resources: Some(pb::Resources {
                    cpus: group.resources.cpus,
                    mem_mb: group.resources.mem_mb,
                }),
                command: group.command.clone(),
                args: group.args.clone(),
                env: group
                    .env
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                constraints: group
                    .constraints
                    .iter()
                    .map(|c| pb::ConstraintSpec {
                        attribute: c.attribute.clone(),
                        operator: match c.op {
                            ConstraintOp::Equal => "=".into(),
                            ConstraintOp::NotEqual => "!=".into(),
                        },
                        value: c.value.clone(),
                    })
                    .collect(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> pb::JobSpec {
        pb::JobSpec {
            name: "hello".into(),
            priority: 0,
            r#type: "service".into(),
            groups: vec![pb::TaskGroupSpec {
                name: "greeter".into(),
                count: 2,
                resources: Some(pb::Resources {
                    cpus: 0.5,
                    mem_mb: 64,
                }),
                command: "echo".into(),
                args: vec!["hello".into()],
                env: Default::default(),
                constraints: vec![pb::ConstraintSpec {
                    attribute: "rack".into(),
                    operator: "!=".into(),
                    value: "r9".into(),
                }],
            }],
        }
    }

    #[test]
    fn a_valid_spec_round_trips() {
        let job = job_from_spec(&spec()).expect("valid");
        assert_eq!(job.priority, DEFAULT_PRIORITY);
        assert_eq!(job.groups[0].constraints[0].op, ConstraintOp::NotEqual);
        let mut back = spec();
        back.priority = 50;
        assert_eq!(spec_from_job(&job), back);
    }

    #[test]
    fn errors_name_the_field() {
        type BreakSpec = fn(&mut pb::JobSpec);
        let cases: Vec<(BreakSpec, &str)> = vec![
            (|s| s.name = "".into(), "name"),
            (|s| s.name = "a b".into(), "name"),
            (|s| s.priority = 101, "priority"),
            (|s| s.r#type = "cron".into(), "type"),
            (|s| s.groups.clear(), "groups"),
            (|s| s.groups[0].count = 0, "groups[0].count"),
            (
                |s| {
                    s.groups[0].resources = Some(pb::Resources {
                        cpus: 0.0,
                        mem_mb: 1,
                    })
                },
                "groups[0].resources.cpus",
            ),
            (
                |s| {
                    s.groups[0].resources = Some(pb::Resources {
                        cpus: 1.0,
                        mem_mb: 0,
                    })
                },
                "groups[0].resources.mem_mb",
            ),
            (|s| s.groups[0].command = " ".into(), "groups[0].command"),
            (
                |s| s.groups[0].constraints[0].operator = "~".into(),
                "groups[0].constraints[0].operator",
            ),
            (
                |s| {
                    let again = s.groups[0].clone();
                    s.groups.push(again);
                },
                "groups[1].name",
            ),
        ];
        for (break_it, field) in cases {
            let mut bad = spec();
            break_it(&mut bad);
            let error = job_from_spec(&bad).expect_err(field);
            assert_eq!(error.field, field, "{error}");
        }
    }
}

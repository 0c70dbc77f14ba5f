//! [`Job`] and its parts to and from their `muster.model.v1` messages, and
//! [`Job::from_submitted`], which reads a job a user submits.

use muster_proto::model as pb;

use crate::convert::{
    all, bad_enum, each, job_id_from_wire, job_id_to_wire, priority, read, required, sorted,
    unsorted,
};
use crate::error::FieldError;
use crate::job::{DEFAULT_PRIORITY, Disconnect, Job, Reconcile, SchedulerType, TaskGroup};
use crate::placement::{
    Affinity, Constraint, ConstraintOp, DEFAULT_SPREAD_WEIGHT, Spread, SpreadTarget,
};
use crate::resources::Resources;

impl From<SchedulerType> for i32 {
    fn from(scheduler: SchedulerType) -> Self {
        let proto = match scheduler {
            SchedulerType::Service => pb::SchedulerType::Service,
            SchedulerType::Batch => pb::SchedulerType::Batch,
            SchedulerType::System => pb::SchedulerType::System,
        };
        proto as i32
    }
}

impl TryFrom<i32> for SchedulerType {
    type Error = FieldError;

    fn try_from(proto: i32) -> Result<Self, FieldError> {
        match pb::SchedulerType::try_from(proto) {
            Ok(pb::SchedulerType::Service) => Ok(SchedulerType::Service),
            Ok(pb::SchedulerType::Batch) => Ok(SchedulerType::Batch),
            Ok(pb::SchedulerType::System) => Ok(SchedulerType::System),
            Ok(pb::SchedulerType::Unspecified) | Err(_) => Err(bad_enum(proto)),
        }
    }
}

impl From<ConstraintOp> for i32 {
    fn from(op: ConstraintOp) -> Self {
        let proto = match op {
            ConstraintOp::Equal => pb::ConstraintOp::Equal,
            ConstraintOp::NotEqual => pb::ConstraintOp::NotEqual,
            ConstraintOp::Regexp => pb::ConstraintOp::Regexp,
            ConstraintOp::Version => pb::ConstraintOp::Version,
            ConstraintOp::SetContains => pb::ConstraintOp::SetContains,
            ConstraintOp::IsSet => pb::ConstraintOp::IsSet,
            ConstraintOp::IsNotSet => pb::ConstraintOp::IsNotSet,
            ConstraintOp::DistinctHosts => pb::ConstraintOp::DistinctHosts,
        };
        proto as i32
    }
}

impl TryFrom<i32> for ConstraintOp {
    type Error = FieldError;

    fn try_from(proto: i32) -> Result<Self, FieldError> {
        match pb::ConstraintOp::try_from(proto) {
            Ok(pb::ConstraintOp::Equal) => Ok(ConstraintOp::Equal),
            Ok(pb::ConstraintOp::NotEqual) => Ok(ConstraintOp::NotEqual),
            Ok(pb::ConstraintOp::Regexp) => Ok(ConstraintOp::Regexp),
            Ok(pb::ConstraintOp::Version) => Ok(ConstraintOp::Version),
            Ok(pb::ConstraintOp::SetContains) => Ok(ConstraintOp::SetContains),
            Ok(pb::ConstraintOp::IsSet) => Ok(ConstraintOp::IsSet),
            Ok(pb::ConstraintOp::IsNotSet) => Ok(ConstraintOp::IsNotSet),
            Ok(pb::ConstraintOp::DistinctHosts) => Ok(ConstraintOp::DistinctHosts),
            Ok(pb::ConstraintOp::Unspecified) | Err(_) => Err(bad_enum(proto)),
        }
    }
}

impl From<Constraint> for pb::Constraint {
    fn from(constraint: Constraint) -> Self {
        pb::Constraint {
            attribute: constraint.attribute,
            op: constraint.op.into(),
            value: constraint.value,
        }
    }
}

impl TryFrom<pb::Constraint> for Constraint {
    type Error = FieldError;

    fn try_from(proto: pb::Constraint) -> Result<Self, FieldError> {
        Ok(Constraint {
            attribute: proto.attribute,
            op: read(proto.op, "op")?,
            value: proto.value,
        })
    }
}

impl From<Affinity> for pb::Affinity {
    fn from(affinity: Affinity) -> Self {
        pb::Affinity {
            attribute: affinity.attribute,
            op: affinity.op.into(),
            value: affinity.value,
            weight: affinity.weight.into(),
        }
    }
}

impl TryFrom<pb::Affinity> for Affinity {
    type Error = FieldError;

    fn try_from(proto: pb::Affinity) -> Result<Self, FieldError> {
        let op = match proto.op {
            0 => ConstraintOp::Equal,
            other => read(other, "op")?,
        };
        let weight = i8::try_from(proto.weight)
            .ok()
            .filter(|w| (-100..=100).contains(w))
            .ok_or_else(|| {
                FieldError::new(
                    "weight",
                    format!("{} is not within -100..=100", proto.weight),
                )
            })?;
        Ok(Affinity {
            attribute: proto.attribute,
            op,
            value: proto.value,
            weight,
        })
    }
}

impl From<Spread> for pb::Spread {
    fn from(spread: Spread) -> Self {
        pb::Spread {
            attribute: spread.attribute,
            weight: spread.weight.into(),
            targets: spread
                .targets
                .into_iter()
                .map(|t| pb::SpreadTarget {
                    value: t.value,
                    percent: t.percent.into(),
                })
                .collect(),
        }
    }
}

impl TryFrom<pb::Spread> for Spread {
    type Error = FieldError;

    fn try_from(proto: pb::Spread) -> Result<Self, FieldError> {
        let weight = match proto.weight {
            0 => DEFAULT_SPREAD_WEIGHT,
            w => u8::try_from(w)
                .ok()
                .filter(|w| *w <= 100)
                .ok_or_else(|| FieldError::new("weight", format!("{w} is not within 1..=100")))?,
        };
        let mut targets = Vec::with_capacity(proto.targets.len());
        for (t, target) in proto.targets.into_iter().enumerate() {
            let percent = u8::try_from(target.percent)
                .ok()
                .filter(|p| *p <= 100)
                .ok_or_else(|| {
                    FieldError::new(
                        format!("targets[{t}].percent"),
                        format!("{} is not within 0..=100", target.percent),
                    )
                })?;
            targets.push(SpreadTarget {
                value: target.value,
                percent,
            });
        }
        Ok(Spread {
            attribute: proto.attribute,
            weight,
            targets,
        })
    }
}

impl From<TaskGroup> for pb::TaskGroup {
    fn from(group: TaskGroup) -> Self {
        pb::TaskGroup {
            name: group.name,
            count: group.count,
            resources: Some(group.resources.into()),
            command: group.command,
            args: group.args,
            env: unsorted(group.env),
            constraints: all(group.constraints),
            spec_version: group.spec_version,
            user: group.user,
            migrate_max_parallel: group.migrate_max_parallel,
            disconnect: Some(group.disconnect.into()),
            affinities: all(group.affinities),
            spreads: all(group.spreads),
            ports: all(group.ports),
            restart: group.restart.map(Into::into),
            reschedule: group.reschedule.map(Into::into),
            checks: all(group.checks),
            kill_signal: super::lifecycle::kill_signal_to_wire(group.kill_signal),
            kill_timeout_ms: group.kill_timeout_ms,
            max_run_duration_ms: group.max_run_duration_ms.unwrap_or(0),
            update: group.update.map(Into::into),
            gang: group.gang,
        }
    }
}

impl From<Disconnect> for pb::Disconnect {
    fn from(disconnect: Disconnect) -> Self {
        let reconcile = match disconnect.reconcile {
            Reconcile::BestScore => pb::Reconcile::BestScore,
            Reconcile::KeepOriginal => pb::Reconcile::KeepOriginal,
            Reconcile::KeepReplacement => pb::Reconcile::KeepReplacement,
            Reconcile::LongestRunning => pb::Reconcile::LongestRunning,
        };
        pb::Disconnect {
            replace: disconnect.replace,
            lost_after_ms: disconnect.lost_after_ms,
            reconcile: reconcile as i32,
        }
    }
}

impl TryFrom<pb::Disconnect> for Disconnect {
    type Error = FieldError;

    fn try_from(proto: pb::Disconnect) -> Result<Self, FieldError> {
        let reconcile = match pb::Reconcile::try_from(proto.reconcile) {
            Ok(pb::Reconcile::Unspecified) => Reconcile::default(),
            Ok(pb::Reconcile::BestScore) => Reconcile::BestScore,
            Ok(pb::Reconcile::KeepOriginal) => Reconcile::KeepOriginal,
            Ok(pb::Reconcile::KeepReplacement) => Reconcile::KeepReplacement,
            Ok(pb::Reconcile::LongestRunning) => Reconcile::LongestRunning,
            Err(_) => return Err(bad_enum(proto.reconcile).within("reconcile")),
        };
        Ok(Disconnect {
            replace: proto.replace,
            lost_after_ms: proto.lost_after_ms,
            reconcile,
        })
    }
}

impl TryFrom<pb::TaskGroup> for TaskGroup {
    type Error = FieldError;

    fn try_from(proto: pb::TaskGroup) -> Result<Self, FieldError> {
        Ok(TaskGroup {
            name: proto.name,
            count: proto.count,
            resources: required(proto.resources, "resources")?,
            command: proto.command,
            args: proto.args,
            env: sorted(proto.env),
            constraints: each(proto.constraints, "constraints")?,
            spec_version: proto.spec_version,
            user: proto.user,
            migrate_max_parallel: proto.migrate_max_parallel,
            disconnect: match proto.disconnect {
                Some(disconnect) => read(disconnect, "disconnect")?,
                None => Disconnect::default(),
            },
            affinities: each(proto.affinities, "affinities")?,
            spreads: each(proto.spreads, "spreads")?,
            ports: each(proto.ports, "ports")?,
            restart: proto.restart.map(|r| read(r, "restart")).transpose()?,
            reschedule: proto
                .reschedule
                .map(|r| read(r, "reschedule"))
                .transpose()?,
            checks: each(proto.checks, "checks")?,
            kill_signal: super::lifecycle::kill_signal_from_wire(&proto.kill_signal)?,
            kill_timeout_ms: proto.kill_timeout_ms,
            max_run_duration_ms: (proto.max_run_duration_ms > 0)
                .then_some(proto.max_run_duration_ms),
            update: proto.update.map(|u| read(u, "update")).transpose()?,
            gang: proto.gang,
        })
    }
}

impl From<Job> for pb::Job {
    fn from(job: Job) -> Self {
        let (namespace, name) = job_id_to_wire(job.name);
        pb::Job {
            namespace,
            name,
            priority: job.priority.into(),
            scheduler: job.scheduler.into(),
            groups: all(job.groups),
            stopped: job.stopped,
            version: job.version,
            scheduler_name: job.named_scheduler.unwrap_or_default(),
        }
    }
}

impl TryFrom<pb::Job> for Job {
    type Error = FieldError;

    fn try_from(proto: pb::Job) -> Result<Self, FieldError> {
        Ok(Job {
            name: job_id_from_wire(&proto.namespace, proto.name),
            priority: priority(proto.priority, "priority")?,
            scheduler: read(proto.scheduler, "scheduler")?,
            named_scheduler: (!proto.scheduler_name.is_empty()).then_some(proto.scheduler_name),
            groups: each(proto.groups, "groups")?,
            stopped: proto.stopped,
            version: proto.version,
        })
    }
}

impl Job {
    /// Reads a job a user submits and checks it ([`Job::validate`]). Unset fields take their
    /// defaults: priority 0 is [`DEFAULT_PRIORITY`], an unspecified scheduler is service, an
    /// unspecified constraint operator is equality, missing resources are none (and so
    /// refused). A system job's counts are set to 0. What the registry owns (`stopped`,
    /// `version`, each group's `spec_version`) is ignored.
    ///
    /// # Errors
    /// [`FieldError`] naming the first field that is wrong (`groups[0].resources.cpus`).
    pub fn from_submitted(proto: pb::Job) -> Result<Job, FieldError> {
        if !proto.namespace.is_empty() {
            crate::namespace::check_namespace(&proto.namespace)?;
        }
        if proto.name.contains(':') {
            return Err(FieldError::new(
                "name",
                format!(
                    "{:?} must be 1 to 128 letters, digits, '-' or '_' (name the namespace in \
                     `namespace`)",
                    proto.name
                ),
            ));
        }
        let priority = match proto.priority {
            0 => DEFAULT_PRIORITY,
            p @ 1..=100 => p as u8,
            p => {
                return Err(FieldError::new(
                    "priority",
                    format!("{p} is not within 1..=100"),
                ));
            }
        };
        let scheduler = match proto.scheduler {
            0 => SchedulerType::Service,
            other => read(other, "scheduler")?,
        };
        let mut groups = Vec::with_capacity(proto.groups.len());
        for (i, group) in proto.groups.into_iter().enumerate() {
            let field = format!("groups[{i}]");
            let mut constraints = Vec::with_capacity(group.constraints.len());
            for (c, constraint) in group.constraints.into_iter().enumerate() {
                let op = match constraint.op {
                    0 => ConstraintOp::Equal,
                    other => read(other, &format!("{field}.constraints[{c}].op"))?,
                };
                constraints.push(Constraint {
                    attribute: constraint.attribute,
                    op,
                    value: constraint.value,
                });
            }
            let resources: Resources = match group.resources {
                Some(resources) => read(resources, &format!("{field}.resources"))?,
                None => Resources::default(),
            };
            let disconnect = match group.disconnect {
                Some(disconnect) => read(disconnect, &format!("{field}.disconnect"))?,
                None => Disconnect::default(),
            };
            groups.push(TaskGroup {
                name: group.name,
                count: if scheduler == SchedulerType::System {
                    0
                } else {
                    group.count
                },
                resources,
                command: group.command,
                args: group.args,
                env: sorted(group.env),
                constraints,
                // The registry sets it when it stores the job.
                spec_version: 0,
                user: group.user,
                migrate_max_parallel: group.migrate_max_parallel,
                disconnect,
                affinities: each(group.affinities, &format!("{field}.affinities"))?,
                spreads: each(group.spreads, &format!("{field}.spreads"))?,
                ports: each(group.ports, &format!("{field}.ports"))?,
                restart: group
                    .restart
                    .map(|r| read(r, &format!("{field}.restart")))
                    .transpose()?,
                reschedule: group
                    .reschedule
                    .map(|r| read(r, &format!("{field}.reschedule")))
                    .transpose()?,
                checks: each(group.checks, &format!("{field}.checks"))?,
                kill_signal: super::lifecycle::kill_signal_from_wire(&group.kill_signal)
                    .map_err(|e| e.within(&field))?,
                kill_timeout_ms: group.kill_timeout_ms,
                max_run_duration_ms: (group.max_run_duration_ms > 0)
                    .then_some(group.max_run_duration_ms),
                update: group
                    .update
                    .map(|u| read(u, &format!("{field}.update")))
                    .transpose()?,
                gang: group.gang,
            });
        }
        // Naming the type's own built-in scheduler is naming none.
        let named_scheduler =
            Some(proto.scheduler_name).filter(|name| !name.is_empty() && name != scheduler.name());
        let job = Job {
            name: crate::namespace::job_id(&proto.namespace, &proto.name),
            priority,
            scheduler,
            named_scheduler,
            groups,
            stopped: false,
            version: 0,
        };
        job.validate()?;
        Ok(job)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn submitted() -> pb::Job {
        pb::Job {
            name: "hello".into(),
            namespace: String::new(),
            priority: 0,
            scheduler: pb::SchedulerType::Unspecified as i32,
            scheduler_name: String::new(),
            groups: vec![pb::TaskGroup {
                gang: false,
                name: "greeter".into(),
                count: 2,
                resources: Some(pb::Resources {
                    cpus: 0.5,
                    mem_mb: 64,
                }),
                command: "echo".into(),
                args: vec!["hello".into()],
                env: Default::default(),
                constraints: vec![pb::Constraint {
                    attribute: "rack".into(),
                    op: pb::ConstraintOp::NotEqual as i32,
                    value: "r9".into(),
                }],
                spec_version: 0,
                user: String::new(),
                migrate_max_parallel: 0,
                disconnect: None,
                affinities: vec![pb::Affinity {
                    attribute: "zone".into(),
                    op: pb::ConstraintOp::Regexp as i32,
                    value: "^eu-".into(),
                    weight: -40,
                }],
                spreads: vec![pb::Spread {
                    attribute: "zone".into(),
                    weight: 70,
                    targets: vec![pb::SpreadTarget {
                        value: "eu-1".into(),
                        percent: 60,
                    }],
                }],
                ports: vec![pb::PortRequest {
                    label: "http".into(),
                    static_port: 0,
                }],
                restart: Some(pb::RestartPolicy {
                    attempts: 2,
                    interval_ms: 60_000,
                    delay_ms: 1_000,
                    mode: pb::RestartMode::Delay as i32,
                }),
                reschedule: Some(pb::ReschedulePolicy {
                    attempts: 3,
                    interval_ms: 3_600_000,
                    delay_ms: 5_000,
                    delay_function: pb::DelayFunction::Fibonacci as i32,
                    max_delay_ms: 60_000,
                    unlimited: false,
                }),
                checks: vec![pb::Check {
                    name: "alive".into(),
                    kind: pb::CheckKind::Http as i32,
                    port: "http".into(),
                    path: "/health".into(),
                    ..pb::Check::default()
                }],
                kill_signal: "SIGINT".into(),
                kill_timeout_ms: Some(3_000),
                max_run_duration_ms: 0,
                update: Some(pb::UpdatePolicy {
                    max_parallel: 2,
                    min_healthy_time_ms: 1_000,
                    healthy_deadline_ms: 60_000,
                    progress_deadline_ms: 120_000,
                    health: pb::HealthCriteria::Checks as i32,
                    ..pb::UpdatePolicy::default()
                }),
            }],
            stopped: false,
            version: 0,
        }
    }

    #[test]
    fn a_system_job_is_no_gang() {
        let mut job = submitted();
        job.scheduler = pb::SchedulerType::System as i32;
        job.groups[0].gang = true;
        let refused = Job::from_submitted(job).expect_err("a system gang");
        assert_eq!(refused.field(), "groups[0].gang");
    }

    #[test]
    fn a_job_names_its_scheduler_or_takes_its_types() -> Result<(), FieldError> {
        let named = |name: &str| {
            Job::from_submitted(pb::Job {
                scheduler_name: name.into(),
                ..submitted()
            })
        };
        assert_eq!(named("")?.named_scheduler, None);
        assert_eq!(named("")?.scheduler_name(), "service");
        // Its own type's built-in scheduler is no name of its own.
        assert_eq!(named("service")?.named_scheduler, None);
        let gang = named("gang")?;
        assert_eq!(gang.scheduler_name(), "gang");
        let eval = crate::Evaluation::new(&gang, crate::Trigger::JobRegister);
        assert_eq!(eval.scheduler_name(), "gang");
        // Round trip through the wire.
        let back = Job::try_from(pb::Job::from(gang.clone()))?;
        assert_eq!(back, gang);
        for bad in ["system", "a b", "gang/1"] {
            let refused = named(bad).expect_err(bad);
            assert_eq!(refused.field(), "scheduler", "{bad}: {refused}");
        }
        Ok(())
    }

    #[test]
    fn a_valid_submission_takes_defaults_and_round_trips() {
        let job = Job::from_submitted(submitted()).expect("valid");
        assert_eq!(job.priority, DEFAULT_PRIORITY);
        assert_eq!(job.scheduler, SchedulerType::Service);
        assert_eq!(job.groups[0].constraints[0].op, ConstraintOp::NotEqual);
        assert_eq!(job.groups[0].affinities[0].weight, -40);
        assert_eq!(job.groups[0].spreads[0].targets[0].percent, 60);
        let mut back = submitted();
        back.priority = 50;
        back.scheduler = pb::SchedulerType::Service as i32;
        // An absent disconnect block reads as the defaults, written out on the way back.
        assert_eq!(job.groups[0].disconnect, Disconnect::default());
        // A check's zero fields read as the defaults, written out on the way back.
        let check = &job.groups[0].checks[0];
        assert_eq!(
            (
                check.interval_ms,
                check.timeout_ms,
                check.unhealthy_threshold
            ),
            (10_000, 2_000, 3)
        );
        assert_eq!(
            job.groups[0].kill_signal,
            Some(crate::lifecycle::KillSignal::Int)
        );
        back.groups[0].checks = vec![check.clone().into()];
        back.groups[0].disconnect = Some(Disconnect::default().into());
        assert_eq!(pb::Job::from(job.clone()), back);
        assert_eq!(Job::try_from(back), Ok(job));
    }

    #[test]
    fn errors_name_the_field() {
        type Break = fn(&mut pb::Job);
        let cases: Vec<(Break, &str)> = vec![
            (|s| s.name = "".into(), "name"),
            (|s| s.name = "a b".into(), "name"),
            (|s| s.priority = 101, "priority"),
            (|s| s.scheduler = 9, "scheduler"),
            (|s| s.groups.clear(), "groups"),
            (|s| s.groups[0].count = 0, "groups[0].count"),
            (|s| s.groups[0].count = 10_001, "groups[0].count"),
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
                        cpus: f64::NAN,
                        mem_mb: 1,
                    })
                },
                "groups[0].resources.cpus",
            ),
            (|s| s.groups[0].resources = None, "groups[0].resources.cpus"),
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
                |s| s.groups[0].constraints[0].op = 99,
                "groups[0].constraints[0].op",
            ),
            (
                |s| s.groups[0].constraints[0].attribute = String::new(),
                "groups[0].constraints[0].attribute",
            ),
            (
                |s| s.groups[0].affinities[0].weight = 0,
                "groups[0].affinities[0].weight",
            ),
            (
                |s| s.groups[0].affinities[0].weight = 1000,
                "groups[0].affinities[0].weight",
            ),
            (
                |s| s.groups[0].spreads[0].targets[0].percent = 101,
                "groups[0].spreads[0].targets[0].percent",
            ),
            (
                |s| s.groups[0].spreads[0].attribute = String::new(),
                "groups[0].spreads[0].attribute",
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
            let mut bad = submitted();
            break_it(&mut bad);
            let error = Job::from_submitted(bad).expect_err(field);
            assert_eq!(error.field(), field, "{error}");
        }
    }

    #[test]
    fn a_system_job_needs_no_count() {
        let mut proto = submitted();
        proto.scheduler = pb::SchedulerType::System as i32;
        proto.groups[0].count = 0;
        let job = Job::from_submitted(proto).expect("valid");
        assert_eq!(job.groups[0].count, 0);
    }
}

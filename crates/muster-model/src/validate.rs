//! [`Job::validate`]: the rules a submitted job must meet, each error naming its field.

use std::collections::BTreeSet;

use crate::error::FieldError;
use crate::job::{Job, MAX_ARGS, MAX_ENV, MAX_GROUP_COUNT, SchedulerType, TaskGroup};
use crate::names::{Text, check_text, invalid, valid_name};

/// Whether `name` may be the scheduler a job of type `kind` names: a name like a job's, and
/// not the built-in scheduler of another type.
///
/// # Errors
/// [`FieldError`] on `scheduler`, saying why.
pub fn check_scheduler_name(kind: SchedulerType, name: &str) -> Result<(), FieldError> {
    if !valid_name(name) {
        return Err(invalid(
            "scheduler",
            format!("{name:?} must be 1 to 128 letters, digits, '-' or '_'"),
        ));
    }
    match SchedulerType::of_built_in(name) {
        Some(other) if other != kind => Err(invalid(
            "scheduler",
            format!(
                "{name:?} is the built-in scheduler of {other} jobs; a {kind} job names \"{kind}\" or a scheduler of its own"
            ),
        )),
        _ => Ok(()),
    }
}

impl Job {
    /// Checks the rules a submitted job must meet: a name of 1 to 128 letters, digits, `-` or
    /// `_` (the job's and each group's, groups' unique); a priority in `1..=100`; at least one
    /// group; a count of 1 to 10,000 (any for system jobs, which run one task per agent);
    /// a scheduler name like a job's, not another type's built-in one;
    /// positive, finite cpus and at least 1 MiB of memory; a command; at most [`MAX_ARGS`]
    /// arguments and [`MAX_ENV`] variables, each variable named without `=`; constraints,
    /// affinities and spreads whose values suit their operators ([`Constraint::check`](crate::Constraint::check)). No text holds NUL or another control character, but for tab,
    /// newline and carriage return in arguments and variables' values.
    ///
    /// # Errors
    /// [`FieldError`] naming the first field that is wrong (`groups[0].resources.cpus`).
    pub fn validate(&self) -> Result<(), FieldError> {
        let (namespace, name) = crate::namespace::split_job_id(&self.name);
        crate::namespace::check_namespace(namespace)?;
        if !valid_name(name) {
            return Err(invalid(
                "name",
                format!("{name:?} must be 1 to 128 letters, digits, '-' or '_'"),
            ));
        }
        if !(1..=100).contains(&self.priority) {
            return Err(invalid(
                "priority",
                format!("{} is not within 1..=100", self.priority),
            ));
        }
        if let Some(named) = &self.named_scheduler {
            check_scheduler_name(self.scheduler, named)?;
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
            if self.scheduler == SchedulerType::System && group.gang {
                return Err(invalid(
                    field("gang"),
                    "a system job runs a task on every agent that takes it, one by one: it cannot \
                     be placed all at once",
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
            check_text(&field("command"), &group.command, Text::Name)?;
            check_text(&field("user"), &group.user, Text::Name)?;
            if group.args.len() > MAX_ARGS {
                return Err(invalid(
                    field("args"),
                    format!("{} arguments is more than {MAX_ARGS}", group.args.len()),
                ));
            }
            for (a, arg) in group.args.iter().enumerate() {
                check_text(&format!("groups[{i}].args[{a}]"), arg, Text::Value)?;
            }
            if group.env.len() > MAX_ENV {
                return Err(invalid(
                    field("env"),
                    format!("{} variables is more than {MAX_ENV}", group.env.len()),
                ));
            }
            for (key, value) in &group.env {
                let at = format!("groups[{i}].env[{key:?}]");
                if key.is_empty() || key.contains('=') {
                    return Err(invalid(
                        at,
                        "a variable's name must be non-empty, without '='",
                    ));
                }
                check_text(&at, key, Text::Name)?;
                check_text(&at, value, Text::Value)?;
            }
            for (c, constraint) in group.constraints.iter().enumerate() {
                let at = format!("groups[{i}].constraints[{c}]");
                check_text(
                    &format!("{at}.attribute"),
                    &constraint.attribute,
                    Text::Name,
                )?;
                check_text(&format!("{at}.value"), &constraint.value, Text::Name)?;
                constraint
                    .check()
                    .map_err(|(part, problem)| invalid(format!("{at}.{part}"), problem))?;
            }
            for (a, affinity) in group.affinities.iter().enumerate() {
                let at = format!("groups[{i}].affinities[{a}]");
                check_text(&format!("{at}.attribute"), &affinity.attribute, Text::Name)?;
                check_text(&format!("{at}.value"), &affinity.value, Text::Name)?;
                affinity
                    .check()
                    .map_err(|(part, problem)| invalid(format!("{at}.{part}"), problem))?;
            }
            crate::ports::check_requests(&group.ports).map_err(|(at, problem)| match at {
                Some(p) => invalid(format!("groups[{i}].ports[{p}]"), problem),
                None => invalid(field("ports"), problem),
            })?;
            for (s, spread) in group.spreads.iter().enumerate() {
                let at = format!("groups[{i}].spreads[{s}]");
                check_text(&format!("{at}.attribute"), &spread.attribute, Text::Name)?;
                for (t, target) in spread.targets.iter().enumerate() {
                    check_text(
                        &format!("{at}.targets[{t}].value"),
                        &target.value,
                        Text::Name,
                    )?;
                }
                spread
                    .check()
                    .map_err(|(part, problem)| invalid(format!("{at}.{part}"), problem))?;
            }
            self.validate_lifecycle(i, group)?;
        }
        Ok(())
    }

    /// [`Job::validate`] for group `i`'s restart, reschedule, checks and stop.
    fn validate_lifecycle(&self, i: usize, group: &TaskGroup) -> Result<(), FieldError> {
        let field = |name: &str| format!("groups[{i}].{name}");
        if let Some(restart) = &group.restart {
            restart
                .check()
                .map_err(|(part, problem)| invalid(field(&format!("restart.{part}")), problem))?;
        }
        if let Some(reschedule) = &group.reschedule {
            reschedule.check().map_err(|(part, problem)| {
                invalid(field(&format!("reschedule.{part}")), problem)
            })?;
        }
        if group.checks.len() > crate::lifecycle::MAX_CHECKS {
            return Err(invalid(
                field("checks"),
                format!(
                    "{} checks is more than {}",
                    group.checks.len(),
                    crate::lifecycle::MAX_CHECKS
                ),
            ));
        }
        let labels: Vec<&str> = group.ports.iter().map(|p| p.label.as_str()).collect();
        let mut names = BTreeSet::new();
        for (c, check) in group.checks.iter().enumerate() {
            let at = format!("groups[{i}].checks[{c}]");
            check_text(&format!("{at}.command"), &check.command, Text::Name)?;
            check_text(&format!("{at}.path"), &check.path, Text::Name)?;
            if check.args.len() > MAX_ARGS {
                return Err(invalid(
                    format!("{at}.args"),
                    format!("{} arguments is more than {MAX_ARGS}", check.args.len()),
                ));
            }
            for (a, arg) in check.args.iter().enumerate() {
                check_text(&format!("{at}.args[{a}]"), arg, Text::Value)?;
            }
            check
                .check(&labels)
                .map_err(|(part, problem)| invalid(format!("{at}.{part}"), problem))?;
            if !names.insert(check.name.as_str()) {
                return Err(invalid(
                    format!("{at}.name"),
                    format!("{:?} is used by another check", check.name),
                ));
            }
        }
        if let Some(ms) = group.kill_timeout_ms {
            crate::lifecycle::check_duration("kill_timeout", ms)
                .map_err(|(part, problem)| invalid(field(part), problem))?;
        }
        if let Some(update) = &group.update {
            if self.scheduler == SchedulerType::Batch {
                return Err(invalid(
                    field("update"),
                    "a batch job's tasks are not rolled: it has no update policy",
                ));
            }
            update
                .check()
                .map_err(|(part, problem)| invalid(field(&format!("update.{part}")), problem))?;
        }
        if let Some(ms) = group.max_run_duration_ms {
            if self.scheduler != SchedulerType::Batch {
                return Err(invalid(
                    field("max_run_duration"),
                    "only a batch job's tasks have a longest run",
                ));
            }
            crate::lifecycle::check_duration("max_run_duration", ms)
                .map_err(|(part, problem)| invalid(field(part), problem))?;
        }
        Ok(())
    }
}

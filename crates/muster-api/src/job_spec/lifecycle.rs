//! The blocks of a group that say how its tasks live, fail and stop: `[group.restart]`,
//! `[group.reschedule]`, `[[group.check]]`, and the durations `kill_timeout` and
//! `max_run_duration`. Durations are written as `15s`, `30m`, `1h`; what a block leaves out
//! takes the default its documentation gives.

use std::time::Duration;

use muster_model::{Check, ReschedulePolicy, RestartPolicy};
use muster_proto::model as pb;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::SpecError;

/// How an agent restarts a failed (or unhealthy) task in place (Nomad's `restart`). Without
/// the block a failed task is not restarted in place; with it, what is left out takes these
/// defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RestartSpec {
    /// Restarts allowed within `interval` (default 2).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// The window restarts are counted in (default `30m`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub interval: String,
    /// The wait before each restart (default `15s`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub delay: String,
    /// `fail` (the default: the task FAILED and is placed again by `reschedule`) or `delay`
    /// (wait for the interval to end, then restart again).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub mode: String,
}

impl RestartSpec {
    /// The wire form; `key` names the block in an error.
    pub(super) fn to_proto(&self, key: &str) -> Result<pb::RestartPolicy, SpecError> {
        let defaults = RestartPolicy::default();
        let mode = match self.mode.as_str() {
            "" | "fail" => pb::RestartMode::Fail,
            "delay" => pb::RestartMode::Delay,
            other => {
                return Err(value_error(
                    key,
                    "mode",
                    format!("{other:?} is not fail or delay"),
                ));
            }
        };
        Ok(pb::RestartPolicy {
            attempts: self.attempts.unwrap_or(defaults.attempts),
            interval_ms: duration_ms(&self.interval, key, "interval")?
                .unwrap_or(defaults.interval_ms),
            delay_ms: duration_ms(&self.delay, key, "delay")?.unwrap_or(defaults.delay_ms),
            mode: mode as i32,
        })
    }

    /// The document form of the wire's.
    pub(super) fn from_proto(policy: &pb::RestartPolicy) -> RestartSpec {
        let mode = match pb::RestartMode::try_from(policy.mode) {
            Ok(pb::RestartMode::Delay) => "delay",
            _ => "fail",
        };
        RestartSpec {
            attempts: Some(policy.attempts),
            interval: format_ms(policy.interval_ms),
            delay: format_ms(policy.delay_ms),
            mode: mode.to_owned(),
        }
    }
}

/// How the master places a failed task again, elsewhere (Nomad's `reschedule`). Without the
/// block: the master's own back-off, without limit, for service and system jobs; never for
/// batch jobs. With it, what is left out takes these defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RescheduleSpec {
    /// Placements allowed within `interval`, unless `unlimited` (default 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// The window attempts are counted in (default `1h`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub interval: String,
    /// The wait before the first placement again (default `30s`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub delay: String,
    /// `constant`, `exponential` (the default) or `fibonacci`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub delay_function: String,
    /// The longest wait (default `1h`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub max_delay: String,
    /// No limit on attempts (default false).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unlimited: Option<bool>,
}

impl RescheduleSpec {
    /// The wire form; `key` names the block in an error.
    pub(super) fn to_proto(&self, key: &str) -> Result<pb::ReschedulePolicy, SpecError> {
        let defaults = ReschedulePolicy::default();
        let function = match self.delay_function.as_str() {
            "" | "exponential" => pb::DelayFunction::Exponential,
            "constant" => pb::DelayFunction::Constant,
            "fibonacci" => pb::DelayFunction::Fibonacci,
            other => {
                return Err(value_error(
                    key,
                    "delay_function",
                    format!("{other:?} is not constant, exponential or fibonacci"),
                ));
            }
        };
        Ok(pb::ReschedulePolicy {
            attempts: self.attempts.unwrap_or(defaults.attempts),
            interval_ms: duration_ms(&self.interval, key, "interval")?
                .unwrap_or(defaults.interval_ms),
            delay_ms: duration_ms(&self.delay, key, "delay")?.unwrap_or(defaults.delay_ms),
            delay_function: function as i32,
            max_delay_ms: duration_ms(&self.max_delay, key, "max_delay")?
                .unwrap_or(defaults.max_delay_ms),
            unlimited: self.unlimited.unwrap_or(defaults.unlimited),
        })
    }

    /// The document form of the wire's.
    pub(super) fn from_proto(policy: &pb::ReschedulePolicy) -> RescheduleSpec {
        let function = match pb::DelayFunction::try_from(policy.delay_function) {
            Ok(pb::DelayFunction::Exponential) => "exponential",
            Ok(pb::DelayFunction::Fibonacci) => "fibonacci",
            _ => "constant",
        };
        RescheduleSpec {
            attempts: Some(policy.attempts),
            interval: format_ms(policy.interval_ms),
            delay: format_ms(policy.delay_ms),
            delay_function: function.to_owned(),
            max_delay: format_ms(policy.max_delay_ms),
            unlimited: Some(policy.unlimited),
        }
    }
}

/// A health check its agent runs against each of the group's tasks (`[[group.check]]`). A task
/// is healthy while all its checks pass; one that turns unhealthy is restarted by the group's
/// `restart` block (or, without one, FAILED and placed again).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CheckSpec {
    /// Its name, unique in the group.
    pub name: String,
    /// `http` (GET `path`; a 2xx status passes), `tcp` (a connection accepted passes) or
    /// `command` (exit 0 passes).
    #[serde(rename = "type")]
    pub kind: String,
    /// `http` and `tcp`: the label of the group's port to probe.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub port: String,
    /// `http`: the path (default `/`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub path: String,
    /// `command`: the program, run as the task's user in its directory and environment.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub command: String,
    /// `command`: its arguments.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// How often it runs (default `10s`; at least `100ms`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub interval: String,
    /// How long one probe may take (default `2s`; at most the interval).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub timeout: String,
    /// Passes in a row that make it pass (default 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub healthy_threshold: Option<u32>,
    /// Failures in a row that make it fail (default 3).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unhealthy_threshold: Option<u32>,
    /// How long after the task starts its failures do not count (default none).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub grace: String,
}

impl CheckSpec {
    /// The wire form; `key` names the block in an error.
    pub(super) fn to_proto(&self, key: &str) -> Result<pb::Check, SpecError> {
        let defaults = Check::default();
        let kind = match self.kind.as_str() {
            "http" => pb::CheckKind::Http,
            "tcp" => pb::CheckKind::Tcp,
            "command" => pb::CheckKind::Command,
            other => {
                return Err(value_error(
                    key,
                    "type",
                    format!("{other:?} is not http, tcp or command"),
                ));
            }
        };
        Ok(pb::Check {
            name: self.name.clone(),
            kind: kind as i32,
            port: self.port.clone(),
            path: self.path.clone(),
            command: self.command.clone(),
            args: self.args.clone(),
            interval_ms: duration_ms(&self.interval, key, "interval")?
                .unwrap_or(defaults.interval_ms),
            timeout_ms: duration_ms(&self.timeout, key, "timeout")?.unwrap_or(defaults.timeout_ms),
            healthy_threshold: self.healthy_threshold.unwrap_or(defaults.healthy_threshold),
            unhealthy_threshold: self
                .unhealthy_threshold
                .unwrap_or(defaults.unhealthy_threshold),
            grace_ms: duration_ms(&self.grace, key, "grace")?.unwrap_or(0),
        })
    }

    /// The document form of the wire's.
    pub(super) fn from_proto(check: &pb::Check) -> CheckSpec {
        let kind = match pb::CheckKind::try_from(check.kind) {
            Ok(pb::CheckKind::Tcp) => "tcp",
            Ok(pb::CheckKind::Command) => "command",
            _ => "http",
        };
        CheckSpec {
            name: check.name.clone(),
            kind: kind.to_owned(),
            port: check.port.clone(),
            path: check.path.clone(),
            command: check.command.clone(),
            args: check.args.clone(),
            interval: format_ms(check.interval_ms),
            timeout: format_ms(check.timeout_ms),
            healthy_threshold: Some(check.healthy_threshold),
            unhealthy_threshold: Some(check.unhealthy_threshold),
            grace: if check.grace_ms == 0 {
                String::new()
            } else {
                format_ms(check.grace_ms)
            },
        }
    }
}

/// A duration key's milliseconds; `None` when it is empty (left out).
pub(super) fn duration_ms(text: &str, key: &str, field: &str) -> Result<Option<u64>, SpecError> {
    if text.is_empty() {
        return Ok(None);
    }
    let duration = humantime::parse_duration(text).map_err(|e| {
        value_error(
            key,
            field,
            format!("{text:?} is not a duration (500ms, 15s, 30m, 1h): {e}"),
        )
    })?;
    Ok(Some(
        u64::try_from(duration.as_millis()).unwrap_or(u64::MAX),
    ))
}

/// Milliseconds as a document writes a duration (`15s`, `1h 30m`).
pub(super) fn format_ms(ms: u64) -> String {
    humantime::format_duration(Duration::from_millis(ms)).to_string()
}

fn value_error(key: &str, field: &str, message: String) -> SpecError {
    SpecError::Value {
        key: format!("{key}.{field}"),
        message,
    }
}

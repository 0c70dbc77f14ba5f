//! A group's restart and reschedule policies, checks and stop signal to and from their
//! `muster.model.v1` messages, and the [`TaskLifecycle`](pb::TaskLifecycle) a launch carries.

use muster_proto::model as pb;

use crate::convert::{bad_enum, each};
use crate::error::FieldError;
use crate::job::TaskGroup;
use crate::lifecycle::{
    Check, CheckKind, DEFAULT_CHECK_INTERVAL_MS, DEFAULT_CHECK_TIMEOUT_MS, DelayFunction,
    KillSignal, ReschedulePolicy, RestartMode, RestartPolicy, TaskHealth,
};

impl From<RestartPolicy> for pb::RestartPolicy {
    fn from(policy: RestartPolicy) -> Self {
        let mode = match policy.mode {
            RestartMode::Fail => pb::RestartMode::Fail,
            RestartMode::Delay => pb::RestartMode::Delay,
        };
        pb::RestartPolicy {
            attempts: policy.attempts,
            interval_ms: policy.interval_ms,
            delay_ms: policy.delay_ms,
            mode: mode as i32,
        }
    }
}

impl TryFrom<pb::RestartPolicy> for RestartPolicy {
    type Error = FieldError;

    fn try_from(proto: pb::RestartPolicy) -> Result<Self, FieldError> {
        let mode = match pb::RestartMode::try_from(proto.mode) {
            Ok(pb::RestartMode::Unspecified | pb::RestartMode::Fail) => RestartMode::Fail,
            Ok(pb::RestartMode::Delay) => RestartMode::Delay,
            Err(_) => return Err(bad_enum(proto.mode).within("mode")),
        };
        Ok(RestartPolicy {
            attempts: proto.attempts,
            interval_ms: proto.interval_ms,
            delay_ms: proto.delay_ms,
            mode,
        })
    }
}

impl From<ReschedulePolicy> for pb::ReschedulePolicy {
    fn from(policy: ReschedulePolicy) -> Self {
        let function = match policy.delay_function {
            DelayFunction::Constant => pb::DelayFunction::Constant,
            DelayFunction::Exponential => pb::DelayFunction::Exponential,
            DelayFunction::Fibonacci => pb::DelayFunction::Fibonacci,
        };
        pb::ReschedulePolicy {
            attempts: policy.attempts,
            interval_ms: policy.interval_ms,
            delay_ms: policy.delay_ms,
            delay_function: function as i32,
            max_delay_ms: policy.max_delay_ms,
            unlimited: policy.unlimited,
        }
    }
}

impl TryFrom<pb::ReschedulePolicy> for ReschedulePolicy {
    type Error = FieldError;

    fn try_from(proto: pb::ReschedulePolicy) -> Result<Self, FieldError> {
        let delay_function = match pb::DelayFunction::try_from(proto.delay_function) {
            Ok(pb::DelayFunction::Unspecified | pb::DelayFunction::Constant) => {
                DelayFunction::Constant
            }
            Ok(pb::DelayFunction::Exponential) => DelayFunction::Exponential,
            Ok(pb::DelayFunction::Fibonacci) => DelayFunction::Fibonacci,
            Err(_) => return Err(bad_enum(proto.delay_function).within("delay_function")),
        };
        Ok(ReschedulePolicy {
            attempts: proto.attempts,
            interval_ms: proto.interval_ms,
            delay_ms: proto.delay_ms,
            delay_function,
            max_delay_ms: proto.max_delay_ms,
            unlimited: proto.unlimited,
        })
    }
}

impl From<Check> for pb::Check {
    fn from(check: Check) -> Self {
        let kind = match check.kind {
            CheckKind::Http => pb::CheckKind::Http,
            CheckKind::Tcp => pb::CheckKind::Tcp,
            CheckKind::Command => pb::CheckKind::Command,
        };
        pb::Check {
            name: check.name,
            kind: kind as i32,
            port: check.port,
            path: check.path,
            command: check.command,
            args: check.args,
            interval_ms: check.interval_ms,
            timeout_ms: check.timeout_ms,
            healthy_threshold: check.healthy_threshold,
            unhealthy_threshold: check.unhealthy_threshold,
            grace_ms: check.grace_ms,
        }
    }
}

/// A check's zero fields read as their defaults (the interval, the timeout, the thresholds);
/// an unspecified kind is refused.
impl TryFrom<pb::Check> for Check {
    type Error = FieldError;

    fn try_from(proto: pb::Check) -> Result<Self, FieldError> {
        let kind = match pb::CheckKind::try_from(proto.kind) {
            Ok(pb::CheckKind::Http) => CheckKind::Http,
            Ok(pb::CheckKind::Tcp) => CheckKind::Tcp,
            Ok(pb::CheckKind::Command) => CheckKind::Command,
            Ok(pb::CheckKind::Unspecified) => {
                return Err(FieldError::new(
                    "kind",
                    "must be http, tcp or command".to_owned(),
                ));
            }
            Err(_) => return Err(bad_enum(proto.kind).within("kind")),
        };
        let or = |value: u64, default: u64| if value == 0 { default } else { value };
        let defaults = Check::default();
        Ok(Check {
            name: proto.name,
            kind,
            port: proto.port,
            path: proto.path,
            command: proto.command,
            args: proto.args,
            interval_ms: or(proto.interval_ms, DEFAULT_CHECK_INTERVAL_MS),
            timeout_ms: or(proto.timeout_ms, DEFAULT_CHECK_TIMEOUT_MS),
            healthy_threshold: match proto.healthy_threshold {
                0 => defaults.healthy_threshold,
                n => n,
            },
            unhealthy_threshold: match proto.unhealthy_threshold {
                0 => defaults.unhealthy_threshold,
                n => n,
            },
            grace_ms: proto.grace_ms,
        })
    }
}

impl From<TaskHealth> for i32 {
    fn from(health: TaskHealth) -> Self {
        let proto = match health {
            TaskHealth::None => pb::TaskHealth::Unspecified,
            TaskHealth::Starting => pb::TaskHealth::Starting,
            TaskHealth::Healthy => pb::TaskHealth::Healthy,
            TaskHealth::Unhealthy => pb::TaskHealth::Unhealthy,
        };
        proto as i32
    }
}

/// Any value reads: one this build does not know is [`TaskHealth::None`].
impl From<pb::TaskHealth> for TaskHealth {
    fn from(proto: pb::TaskHealth) -> Self {
        match proto {
            pb::TaskHealth::Unspecified => TaskHealth::None,
            pb::TaskHealth::Starting => TaskHealth::Starting,
            pb::TaskHealth::Healthy => TaskHealth::Healthy,
            pb::TaskHealth::Unhealthy => TaskHealth::Unhealthy,
        }
    }
}

impl TaskHealth {
    /// The health a wire task carries (`Task.health`); an unknown value is none.
    pub fn from_wire(value: i32) -> TaskHealth {
        pb::TaskHealth::try_from(value).map_or(TaskHealth::None, TaskHealth::from)
    }
}

/// A kill signal as the wire names it: empty for SIGTERM.
pub(crate) fn kill_signal_to_wire(signal: Option<KillSignal>) -> String {
    signal.map(|s| s.as_str().to_owned()).unwrap_or_default()
}

/// A kill signal the wire names; empty: none named.
pub(crate) fn kill_signal_from_wire(name: &str) -> Result<Option<KillSignal>, FieldError> {
    if name.is_empty() {
        return Ok(None);
    }
    KillSignal::parse(name)
        .map(Some)
        .map_err(|problem| FieldError::new("kill_signal", problem))
}

/// The group's restart policy, checks and stop, as its launches carry them to its tasks'
/// agent; `None` when it sets none of them (the launch then carries nothing).
pub fn task_lifecycle(group: &TaskGroup) -> Option<pb::TaskLifecycle> {
    let lifecycle = pb::TaskLifecycle {
        restart: group.restart.map(Into::into),
        checks: group.checks.iter().cloned().map(Into::into).collect(),
        kill_signal: kill_signal_to_wire(group.kill_signal),
        kill_timeout_ms: group.kill_timeout_ms,
        max_run_duration_ms: group.max_run_duration_ms.unwrap_or(0),
    };
    (lifecycle != pb::TaskLifecycle::default()).then_some(lifecycle)
}

/// What an agent reads of a launched task's lifecycle.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Lifecycle {
    /// How it restarts the task in place; `None`: never.
    pub restart: Option<RestartPolicy>,
    /// The checks it runs against it.
    pub checks: Vec<Check>,
    /// The signal that asks it to stop.
    pub kill_signal: KillSignal,
    /// How long it has after that signal before SIGKILL; `None`: the agent's default.
    pub kill_timeout_ms: Option<u64>,
    /// How long it may run; `None`: no limit.
    pub max_run_duration_ms: Option<u64>,
}

impl TryFrom<pb::TaskLifecycle> for Lifecycle {
    type Error = FieldError;

    fn try_from(proto: pb::TaskLifecycle) -> Result<Self, FieldError> {
        Ok(Lifecycle {
            restart: proto
                .restart
                .map(RestartPolicy::try_from)
                .transpose()
                .map_err(|e| e.within("restart"))?,
            checks: each(proto.checks, "checks")?,
            kill_signal: kill_signal_from_wire(&proto.kill_signal)?.unwrap_or_default(),
            kill_timeout_ms: proto.kill_timeout_ms,
            max_run_duration_ms: (proto.max_run_duration_ms > 0)
                .then_some(proto.max_run_duration_ms),
        })
    }
}

//! How a group's tasks live, fail and stop: the [`RestartPolicy`] their agent applies in
//! place, the [`ReschedulePolicy`] the master applies elsewhere, the health [`Check`]s their
//! agent runs and the [`TaskHealth`] it reports, and how a task is asked to stop
//! ([`KillSignal`], kill timeout, a batch task's longest run).
//!
//! The fields and their defaults follow Nomad's job specification (`restart`, `reschedule`,
//! `check`, `kill_signal`, `kill_timeout`, `max_run_duration`); where Muster differs, the item
//! says so.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How an agent restarts a failed task in place: at most `attempts` restarts within
/// `interval_ms`, each `delay_ms` after the failure; then [`RestartMode`] says what follows. A
/// task that turns unhealthy counts as failed.
///
/// A group without one is never restarted in place (unlike Nomad, whose default restarts a
/// task twice): a failed task goes to the master, which places it again by its
/// [`ReschedulePolicy`]. The defaults below are those of a block that leaves a field out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RestartPolicy {
    /// Restarts allowed within `interval_ms` (default 2).
    pub attempts: u32,
    /// The window restarts are counted in, from the first (default 30 minutes).
    pub interval_ms: u64,
    /// How long after a failure the task starts again (default 15 s).
    pub delay_ms: u64,
    /// What follows the last attempt.
    pub mode: RestartMode,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        RestartPolicy {
            attempts: 2,
            interval_ms: 30 * 60 * 1000,
            delay_ms: 15_000,
            mode: RestartMode::Fail,
        }
    }
}

impl RestartPolicy {
    /// The window restarts are counted in.
    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.interval_ms)
    }

    /// The wait before each restart.
    pub fn delay(&self) -> Duration {
        Duration::from_millis(self.delay_ms)
    }
}

/// What a [`RestartPolicy`] does once its attempts are used up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RestartMode {
    /// The task FAILED: the master places it again by its group's [`ReschedulePolicy`].
    #[default]
    Fail,
    /// Wait until the interval is over, then restart it again, counting anew.
    Delay,
}

/// How the master places a failed task again, elsewhere: at most `attempts` times within
/// `interval_ms` (or `unlimited`), the first `delay_ms` after the failure and each further one
/// later by `delay_function`, at most `max_delay_ms`.
///
/// A group without one keeps the master's own back-off (`--reschedule-delay`, doubled per
/// failure in a row up to `--reschedule-max-delay`, without limit) for service and system
/// jobs, and is never placed again for batch jobs (a failed batch task has run). The defaults
/// below are those of a block that leaves a field out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ReschedulePolicy {
    /// Placements allowed within `interval_ms`, unless `unlimited` (default 1).
    pub attempts: u32,
    /// The window attempts are counted in (default 1 hour).
    pub interval_ms: u64,
    /// The wait before the first placement again (default 30 s).
    pub delay_ms: u64,
    /// How the wait grows (default exponential).
    pub delay_function: DelayFunction,
    /// The longest wait (default 1 hour).
    pub max_delay_ms: u64,
    /// No limit on attempts (default false).
    pub unlimited: bool,
}

impl Default for ReschedulePolicy {
    fn default() -> Self {
        ReschedulePolicy {
            attempts: 1,
            interval_ms: 60 * 60 * 1000,
            delay_ms: 30_000,
            delay_function: DelayFunction::Exponential,
            max_delay_ms: 60 * 60 * 1000,
            unlimited: false,
        }
    }
}

impl ReschedulePolicy {
    /// The wait before placement number `attempt` (1 for the first after a failure).
    pub fn delay(&self, attempt: u32) -> Duration {
        let base = self.delay_ms;
        let max = self.max_delay_ms.max(base);
        let step = attempt.max(1) - 1;
        let ms = match self.delay_function {
            DelayFunction::Constant => base,
            DelayFunction::Exponential => {
                let factor = 1u64.checked_shl(step.min(63)).unwrap_or(u64::MAX);
                base.saturating_mul(factor)
            }
            DelayFunction::Fibonacci => {
                // 1, 1, 2, 3, 5, ... times the base.
                let (mut a, mut b) = (1u64, 1u64);
                for _ in 0..step.min(90) {
                    (a, b) = (b, a.saturating_add(b));
                }
                base.saturating_mul(a)
            }
        };
        Duration::from_millis(ms.min(max))
    }

    /// The window attempts are counted in.
    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.interval_ms)
    }
}

/// How a delay grows from one attempt to the next.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DelayFunction {
    /// The same each time.
    Constant,
    /// Doubled each time.
    #[default]
    Exponential,
    /// The sum of the two before (1, 1, 2, 3, 5 times the delay).
    Fibonacci,
}

/// A health check an agent runs against each of a group's tasks (Nomad's `check`, without
/// Consul; Kubernetes' probes). A task is healthy while every check passes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Check {
    /// Unique in the group: letters, digits, `-` and `_`.
    pub name: String,
    /// What it does.
    pub kind: CheckKind,
    /// HTTP and TCP: the label of the group's port to probe, at the agent's address.
    pub port: String,
    /// HTTP: the path to GET (default `/`).
    pub path: String,
    /// Command: the program to run as the task's user, in its directory and environment.
    pub command: String,
    /// Command: its arguments.
    pub args: Vec<String>,
    /// How often it runs (default 10 s).
    pub interval_ms: u64,
    /// How long one probe may take (default 2 s).
    pub timeout_ms: u64,
    /// Passes in a row that make it pass (default 1).
    pub healthy_threshold: u32,
    /// Failures in a row that make it fail (default 3).
    pub unhealthy_threshold: u32,
    /// How long after the task starts its failures do not count (default 0).
    pub grace_ms: u64,
}

impl Default for Check {
    fn default() -> Self {
        Check {
            name: String::new(),
            kind: CheckKind::Http,
            port: String::new(),
            path: String::new(),
            command: String::new(),
            args: Vec::new(),
            interval_ms: DEFAULT_CHECK_INTERVAL_MS,
            timeout_ms: DEFAULT_CHECK_TIMEOUT_MS,
            healthy_threshold: 1,
            unhealthy_threshold: 3,
            grace_ms: 0,
        }
    }
}

/// A check's interval when it names none.
pub const DEFAULT_CHECK_INTERVAL_MS: u64 = 10_000;
/// A check's timeout when it names none.
pub const DEFAULT_CHECK_TIMEOUT_MS: u64 = 2_000;
/// The shortest interval a check may have.
pub const MIN_CHECK_INTERVAL_MS: u64 = 100;
/// The most checks one group may have.
pub const MAX_CHECKS: usize = 16;
/// The most a threshold or attempt count may be.
pub const MAX_COUNT: u32 = 1_000;
/// The longest any of these durations may be: 30 days.
pub const MAX_DURATION_MS: u64 = 30 * 24 * 60 * 60 * 1000;

impl Check {
    /// How often it runs.
    pub fn interval(&self) -> Duration {
        Duration::from_millis(self.interval_ms.max(MIN_CHECK_INTERVAL_MS))
    }

    /// How long one probe may take.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.max(1))
    }

    /// How long after the task starts its failures do not count.
    pub fn grace(&self) -> Duration {
        Duration::from_millis(self.grace_ms)
    }

    /// The HTTP path it asks for.
    pub fn http_path(&self) -> &str {
        if self.path.is_empty() {
            "/"
        } else {
            &self.path
        }
    }

    /// Checks its fields against each other and against the group's port labels; the error
    /// names the field (`port`) and the problem.
    pub(crate) fn check(&self, port_labels: &[&str]) -> Result<(), (&'static str, String)> {
        if !crate::names::valid_name(&self.name) {
            return Err((
                "name",
                format!(
                    "{:?} must be 1 to 128 letters, digits, '-' or '_'",
                    self.name
                ),
            ));
        }
        match self.kind {
            CheckKind::Http | CheckKind::Tcp => {
                if !port_labels.contains(&self.port.as_str()) {
                    return Err((
                        "port",
                        format!(
                            "{:?} is not a port of the group (it has {port_labels:?})",
                            self.port
                        ),
                    ));
                }
                if !self.command.is_empty() || !self.args.is_empty() {
                    return Err((
                        "command",
                        format!("an {} check runs no command", self.kind.as_str()),
                    ));
                }
            }
            CheckKind::Command => {
                if self.command.trim().is_empty() {
                    return Err(("command", "a command check must name a program".into()));
                }
                if !self.port.is_empty() {
                    return Err(("port", "a command check probes no port".into()));
                }
            }
        }
        if self.kind == CheckKind::Http {
            if !self.path.is_empty() && !self.path.starts_with('/') {
                return Err(("path", format!("{:?} must start with '/'", self.path)));
            }
            if self.path.bytes().any(|b| b.is_ascii_whitespace()) {
                return Err(("path", format!("{:?} holds whitespace", self.path)));
            }
        } else if !self.path.is_empty() {
            return Err(("path", "only an http check has a path".into()));
        }
        if self.interval_ms < MIN_CHECK_INTERVAL_MS || self.interval_ms > MAX_DURATION_MS {
            return Err((
                "interval",
                format!(
                    "{} ms is not within {MIN_CHECK_INTERVAL_MS} ms..=30 days",
                    self.interval_ms
                ),
            ));
        }
        if self.timeout_ms == 0 || self.timeout_ms > self.interval_ms {
            return Err((
                "timeout",
                format!(
                    "{} ms must be at least 1 ms and at most the interval ({} ms)",
                    self.timeout_ms, self.interval_ms
                ),
            ));
        }
        for (field, value) in [
            ("healthy_threshold", self.healthy_threshold),
            ("unhealthy_threshold", self.unhealthy_threshold),
        ] {
            if !(1..=MAX_COUNT).contains(&value) {
                return Err((field, format!("{value} is not within 1..={MAX_COUNT}")));
            }
        }
        check_duration("grace", self.grace_ms)?;
        Ok(())
    }
}

/// What a health check does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckKind {
    /// GET its path on the port; any 2xx status passes.
    #[default]
    Http,
    /// Connect to the port; an accepted connection passes.
    Tcp,
    /// Run a program; exit 0 passes.
    Command,
}

impl CheckKind {
    /// Its name in job files: `http`, `tcp`, `command`.
    pub fn as_str(self) -> &'static str {
        match self {
            CheckKind::Http => "http",
            CheckKind::Tcp => "tcp",
            CheckKind::Command => "command",
        }
    }
}

/// What a task's checks say of it, as its agent reports it.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum TaskHealth {
    /// It has no checks, or is not running.
    #[default]
    None,
    /// Its checks have not all passed yet.
    Starting,
    /// Every check passes.
    Healthy,
    /// A check fails.
    Unhealthy,
}

impl TaskHealth {
    /// Its name in the API and the CLI: empty for [`None`](TaskHealth::None), else
    /// `starting`, `healthy`, `unhealthy`.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskHealth::None => "",
            TaskHealth::Starting => "starting",
            TaskHealth::Healthy => "healthy",
            TaskHealth::Unhealthy => "unhealthy",
        }
    }
}

/// The signal that asks a task to stop, before SIGKILL.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum KillSignal {
    /// SIGTERM.
    #[default]
    #[serde(rename = "SIGTERM")]
    Term,
    /// SIGINT.
    #[serde(rename = "SIGINT")]
    Int,
    /// SIGQUIT.
    #[serde(rename = "SIGQUIT")]
    Quit,
    /// SIGHUP.
    #[serde(rename = "SIGHUP")]
    Hup,
    /// SIGUSR1.
    #[serde(rename = "SIGUSR1")]
    Usr1,
    /// SIGUSR2.
    #[serde(rename = "SIGUSR2")]
    Usr2,
}

impl KillSignal {
    /// Every signal a job may name.
    pub const ALL: [KillSignal; 6] = [
        KillSignal::Term,
        KillSignal::Int,
        KillSignal::Quit,
        KillSignal::Hup,
        KillSignal::Usr1,
        KillSignal::Usr2,
    ];

    /// Its name: `SIGTERM`.
    pub fn as_str(self) -> &'static str {
        match self {
            KillSignal::Term => "SIGTERM",
            KillSignal::Int => "SIGINT",
            KillSignal::Quit => "SIGQUIT",
            KillSignal::Hup => "SIGHUP",
            KillSignal::Usr1 => "SIGUSR1",
            KillSignal::Usr2 => "SIGUSR2",
        }
    }

    /// The signal named `name` (`SIGTERM`, or `TERM`, in any case); the error lists those
    /// allowed.
    pub fn parse(name: &str) -> Result<KillSignal, String> {
        let upper = name.trim().to_ascii_uppercase();
        let full = if upper.starts_with("SIG") {
            upper
        } else {
            format!("SIG{upper}")
        };
        KillSignal::ALL
            .into_iter()
            .find(|signal| signal.as_str() == full)
            .ok_or_else(|| {
                let allowed: Vec<&str> = KillSignal::ALL.iter().map(|s| s.as_str()).collect();
                format!("{name:?} is not one of {}", allowed.join(", "))
            })
    }
}

/// Checks a duration field against [`MAX_DURATION_MS`].
pub(crate) fn check_duration(field: &'static str, ms: u64) -> Result<(), (&'static str, String)> {
    if ms > MAX_DURATION_MS {
        return Err((field, format!("{ms} ms is more than 30 days")));
    }
    Ok(())
}

/// Checks a policy's `attempts` within `interval_ms` (counted only if `limited`), each
/// `delay_ms` or more apart.
fn check_attempts(
    attempts: u32,
    interval_ms: u64,
    delay_ms: u64,
    limited: bool,
) -> Result<(), (&'static str, String)> {
    if attempts > MAX_COUNT {
        return Err(("attempts", format!("{attempts} is more than {MAX_COUNT}")));
    }
    check_duration("interval", interval_ms)?;
    check_duration("delay", delay_ms)?;
    if limited && attempts > 0 && interval_ms == 0 {
        return Err(("interval", "must be more than 0 with attempts".into()));
    }
    Ok(())
}

impl RestartPolicy {
    /// Checks its fields; the error names the field and the problem.
    pub(crate) fn check(&self) -> Result<(), (&'static str, String)> {
        check_attempts(self.attempts, self.interval_ms, self.delay_ms, true)?;
        if self.mode == RestartMode::Delay && self.interval_ms == 0 {
            return Err((
                "interval",
                "mode \"delay\" waits for it: it must be more than 0".into(),
            ));
        }
        Ok(())
    }
}

impl ReschedulePolicy {
    /// Checks its fields; the error names the field and the problem.
    pub(crate) fn check(&self) -> Result<(), (&'static str, String)> {
        check_attempts(
            self.attempts,
            self.interval_ms,
            self.delay_ms,
            !self.unlimited,
        )?;
        check_duration("max_delay", self.max_delay_ms)?;
        if self.max_delay_ms < self.delay_ms {
            return Err((
                "max_delay",
                format!(
                    "{} ms is less than the delay ({} ms)",
                    self.max_delay_ms, self.delay_ms
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
    fn reschedule_delays_grow_by_their_function_up_to_the_maximum() {
        let secs = Duration::from_secs;
        let policy = |delay_function| ReschedulePolicy {
            delay_ms: 5_000,
            max_delay_ms: 60_000,
            delay_function,
            ..ReschedulePolicy::default()
        };
        let delays = |f| (1..=6).map(|n| policy(f).delay(n)).collect::<Vec<_>>();
        assert_eq!(delays(DelayFunction::Constant), vec![secs(5); 6]);
        assert_eq!(
            delays(DelayFunction::Exponential),
            vec![secs(5), secs(10), secs(20), secs(40), secs(60), secs(60)]
        );
        assert_eq!(
            delays(DelayFunction::Fibonacci),
            vec![secs(5), secs(5), secs(10), secs(15), secs(25), secs(40)]
        );
        // Far attempts do not overflow.
        assert_eq!(policy(DelayFunction::Exponential).delay(500), secs(60));
        assert_eq!(policy(DelayFunction::Fibonacci).delay(500), secs(60));
    }

    #[test]
    fn kill_signals_are_named_as_unix_names_them() {
        assert_eq!(KillSignal::parse("SIGINT"), Ok(KillSignal::Int));
        assert_eq!(KillSignal::parse("term"), Ok(KillSignal::Term));
        let error = KillSignal::parse("SIGKILL").unwrap_err();
        assert!(error.contains("SIGTERM, SIGINT"), "{error}");
    }

    #[test]
    fn checks_name_what_is_wrong_with_them() {
        let http = Check {
            name: "alive".into(),
            port: "http".into(),
            ..Check::default()
        };
        assert_eq!(http.check(&["http"]), Ok(()));
        assert_eq!(http.check(&["admin"]).unwrap_err().0, "port");
        let slow = Check {
            timeout_ms: 20_000,
            ..http.clone()
        };
        assert_eq!(slow.check(&["http"]).unwrap_err().0, "timeout");
        let command = Check {
            kind: CheckKind::Command,
            port: String::new(),
            ..http.clone()
        };
        assert_eq!(command.check(&[]).unwrap_err().0, "command");
        let never = Check {
            unhealthy_threshold: 0,
            ..http
        };
        assert_eq!(never.check(&["http"]).unwrap_err().0, "unhealthy_threshold");
    }
}

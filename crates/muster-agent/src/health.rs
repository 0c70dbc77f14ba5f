//! Health checks: the agent probes each running task by its group's [`Check`]s (an HTTP GET,
//! a TCP connect, or a command) and says what they make of it, a [`TaskHealth`].
//!
//! Each check keeps its own streak ([`CheckStatus`]): `healthy_threshold` passes in a row make
//! it pass, `unhealthy_threshold` failures in a row make it fail, and failures within the
//! check's grace period after the task started do not count. The task is healthy while every
//! check passes, unhealthy once one fails, and starting until then ([`overall`]). [`watch`]
//! runs the probes of one run of a task and calls back on every change of its health; the
//! agent decides what an unhealthy task comes to (see `agent::supervision`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use muster_model::{Check, CheckKind, TaskHealth};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// Where a task's checks probe it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Target {
    /// The agent's host, where the task's ports are bound.
    pub(crate) host: String,
    /// The task's ports by label.
    pub(crate) ports: BTreeMap<String, u16>,
    /// Command checks: the task's environment (its ports' variables included).
    pub(crate) env: BTreeMap<String, String>,
    /// Command checks: the task's working directory.
    pub(crate) dir: Option<PathBuf>,
    /// Command checks: the user and group to run as (the task's), if the agent switches
    /// users.
    pub(crate) credentials: Option<(u32, u32)>,
    /// Command checks: why none may run (a root agent that cannot tell whom the task runs
    /// as runs no program for it as root), if so.
    pub(crate) no_command: Option<String>,
}

/// Where one check stands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum CheckStatus {
    /// Not yet passed `healthy_threshold` times in a row.
    #[default]
    Pending,
    /// Passing.
    Passing,
    /// Failed `unhealthy_threshold` times in a row (outside its grace period).
    Failing,
}

/// One check's streaks.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Streak {
    status: CheckStatus,
    passes: u32,
    failures: u32,
}

impl Streak {
    /// Records a probe's outcome; `in_grace` while the task is within the check's grace period
    /// (a failure then counts for nothing). Returns the status after it.
    pub(crate) fn record(&mut self, passed: bool, in_grace: bool, check: &Check) -> CheckStatus {
        if passed {
            self.failures = 0;
            self.passes = self.passes.saturating_add(1);
            if self.passes >= check.healthy_threshold.max(1) {
                self.status = CheckStatus::Passing;
            }
        } else if !in_grace {
            self.passes = 0;
            self.failures = self.failures.saturating_add(1);
            if self.failures >= check.unhealthy_threshold.max(1) {
                self.status = CheckStatus::Failing;
            }
        } else {
            self.passes = 0;
        }
        self.status
    }
}

/// A task's health from its checks' statuses: unhealthy if one fails, healthy if all pass,
/// else starting.
pub(crate) fn overall(statuses: &[CheckStatus]) -> TaskHealth {
    if statuses.contains(&CheckStatus::Failing) {
        TaskHealth::Unhealthy
    } else if statuses.iter().all(|s| *s == CheckStatus::Passing) {
        TaskHealth::Healthy
    } else {
        TaskHealth::Starting
    }
}

/// Runs `checks` against `target` for one run of a task (started at `started`), forever:
/// calls `changed` with the task's health and what the last probe said whenever the health
/// changes (the first time with [`TaskHealth::Starting`]). Dropping the future stops every
/// probe.
pub(crate) async fn watch(
    checks: Vec<Check>,
    target: Target,
    started: Instant,
    mut changed: impl FnMut(TaskHealth, String) + Send,
) {
    let (results, mut outcomes) = mpsc::channel::<(usize, Result<(), String>)>(checks.len() + 1);
    let mut probes = JoinSet::new();
    for (index, check) in checks.iter().cloned().enumerate() {
        let (target, results) = (target.clone(), results.clone());
        probes.spawn(async move {
            let mut ticks = tokio::time::interval(check.interval());
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let outcome = probe(&check, &target).await;
                if results.send((index, outcome)).await.is_err() {
                    return;
                }
            }
        });
    }
    drop(results);
    let mut streaks = vec![Streak::default(); checks.len()];
    let mut statuses = vec![CheckStatus::Pending; checks.len()];
    let mut health = TaskHealth::Starting;
    changed(health, String::new());
    while let Some((index, outcome)) = outcomes.recv().await {
        let (Some(check), Some(streak)) = (checks.get(index), streaks.get_mut(index)) else {
            continue;
        };
        let in_grace = started.elapsed() < check.grace();
        statuses[index] = streak.record(outcome.is_ok(), in_grace, check);
        let now = overall(&statuses);
        if now != health {
            health = now;
            let said = match &outcome {
                Ok(()) => format!("check {:?} passes", check.name),
                Err(why) => format!("check {:?} fails: {why}", check.name),
            };
            changed(health, said);
        }
    }
}

/// Runs one probe of `check` against `target`, within the check's timeout.
pub(crate) async fn probe(check: &Check, target: &Target) -> Result<(), String> {
    let timeout = check.timeout();
    let run = async {
        match check.kind {
            CheckKind::Tcp => {
                let address = address(check, target)?;
                TcpStream::connect(&address)
                    .await
                    .map(drop)
                    .map_err(|e| format!("cannot connect to {address}: {e}"))
            }
            CheckKind::Http => http_get(check, target).await,
            CheckKind::Command => command(check, target).await,
        }
    };
    match tokio::time::timeout(timeout, run).await {
        Ok(outcome) => outcome,
        Err(_) => Err(format!("no answer within {timeout:?}")),
    }
}

/// The `host:port` a port check probes.
fn address(check: &Check, target: &Target) -> Result<String, String> {
    let port = target
        .ports
        .get(&check.port)
        .ok_or_else(|| format!("the task holds no port {:?}", check.port))?;
    Ok(muster_model::ports::host_port(&target.host, *port))
}

/// GETs the check's path; a 2xx status passes.
async fn http_get(check: &Check, target: &Target) -> Result<(), String> {
    let address = address(check, target)?;
    let stream = TcpStream::connect(&address)
        .await
        .map_err(|e| format!("cannot connect to {address}: {e}"))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("{address}: {e}"))?;
    let driver = tokio::spawn(connection);
    let request = hyper::Request::get(check.http_path())
        .header(hyper::header::HOST, &address)
        .header(hyper::header::USER_AGENT, "muster-agent")
        .body(Empty::<Bytes>::new())
        .map_err(|e| format!("cannot ask for {:?}: {e}", check.http_path()))?;
    let answered = sender.send_request(request).await;
    driver.abort();
    let response =
        answered.map_err(|e| format!("GET http://{address}{}: {e}", check.http_path()))?;
    let status = response.status();
    if status.is_success() {
        Ok(())
    } else {
        Err(format!(
            "GET http://{address}{} answered {status}",
            check.http_path()
        ))
    }
}

/// Runs the check's command in the task's directory and environment, as its user; exit 0
/// passes. The process is killed if the probe times out.
async fn command(check: &Check, target: &Target) -> Result<(), String> {
    if let Some(why) = &target.no_command {
        return Err(why.clone());
    }
    let mut command = tokio::process::Command::new(&check.command);
    command
        .args(&check.args)
        .env_clear()
        .envs(&target.env)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true);
    if let Some(dir) = &target.dir {
        command.current_dir(dir);
    }
    if let Some((uid, gid)) = target.credentials {
        command.uid(uid).gid(gid);
    }
    let status = command
        .status()
        .await
        .map_err(|e| format!("cannot run {:?}: {e}", check.command))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{:?} exited with {status}", check.command))
    }
}

/// The user and group a process runs as, from its `/proc` directory's owner.
pub(crate) fn process_credentials(pid: i32) -> Option<(u32, u32)> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata(format!("/proc/{pid}")).ok()?;
    Some((meta.uid(), meta.gid()))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpListener;

    fn check(kind: CheckKind) -> Check {
        Check {
            name: "c".into(),
            kind,
            port: "http".into(),
            interval_ms: 100,
            timeout_ms: 100,
            healthy_threshold: 2,
            unhealthy_threshold: 2,
            ..Check::default()
        }
    }

    #[test]
    fn streaks_turn_a_check_passing_and_failing_by_their_thresholds() {
        let check = check(CheckKind::Tcp);
        let mut streak = Streak::default();
        assert_eq!(streak.record(true, false, &check), CheckStatus::Pending);
        assert_eq!(streak.record(true, false, &check), CheckStatus::Passing);
        assert_eq!(streak.record(false, false, &check), CheckStatus::Passing);
        assert_eq!(streak.record(true, false, &check), CheckStatus::Passing);
        assert_eq!(streak.record(false, false, &check), CheckStatus::Passing);
        assert_eq!(streak.record(false, false, &check), CheckStatus::Failing);
        assert_eq!(streak.record(true, false, &check), CheckStatus::Failing);
        assert_eq!(streak.record(true, false, &check), CheckStatus::Passing);
        // Failures in the grace period count for nothing.
        let mut young = Streak::default();
        for _ in 0..5 {
            assert_eq!(young.record(false, true, &check), CheckStatus::Pending);
        }
        assert_eq!(young.record(false, false, &check), CheckStatus::Pending);
        assert_eq!(young.record(false, false, &check), CheckStatus::Failing);
        use CheckStatus::*;
        assert_eq!(overall(&[Passing, Passing]), TaskHealth::Healthy);
        assert_eq!(overall(&[Passing, Pending]), TaskHealth::Starting);
        assert_eq!(overall(&[Failing, Pending]), TaskHealth::Unhealthy);
        assert_eq!(overall(&[]), TaskHealth::Healthy);
    }

    /// A one-shot HTTP server answering every request with `status`.
    async fn serve(status: u16) -> std::io::Result<u16> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut buf = [0u8; 1024];
                let _ = stream.read(&mut buf).await;
                let answer = format!(
                    "HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            }
        });
        Ok(port)
    }

    fn target(port: u16) -> Target {
        Target {
            host: "127.0.0.1".into(),
            ports: [("http".to_owned(), port)].into(),
            ..Target::default()
        }
    }

    #[tokio::test]
    async fn probes_pass_on_2xx_a_connection_and_exit_0_and_say_why_they_fail() {
        let ok = serve(204).await.expect("bind");
        let broken = serve(500).await.expect("bind");
        let http = check(CheckKind::Http);
        assert_eq!(probe(&http, &target(ok)).await, Ok(()));
        let failed = probe(&http, &target(broken)).await.unwrap_err();
        assert!(failed.contains("500"), "{failed}");
        let tcp = check(CheckKind::Tcp);
        assert_eq!(probe(&tcp, &target(ok)).await, Ok(()));
        // A port nobody listens on: bound, then closed.
        let closed = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            listener.local_addr().expect("address").port()
        };
        let refused = probe(&tcp, &target(closed)).await.unwrap_err();
        assert!(refused.contains("cannot connect"), "{refused}");
        let unknown = Check {
            port: "admin".into(),
            ..tcp
        };
        let named = probe(&unknown, &target(ok)).await.unwrap_err();
        assert!(named.contains("\"admin\""), "{named}");
        let command = |program: &str| Check {
            kind: CheckKind::Command,
            command: program.into(),
            port: String::new(),
            timeout_ms: 5_000,
            ..check(CheckKind::Command)
        };
        assert_eq!(probe(&command("true"), &Target::default()).await, Ok(()));
        let exited = probe(&command("false"), &Target::default())
            .await
            .unwrap_err();
        assert!(exited.contains("exit status: 1"), "{exited}");
    }

    /// How long the tests wait for a check to say anything at all.
    const SOON: Duration = Duration::from_secs(10);

    #[tokio::test]
    async fn watch_reports_starting_then_healthy_then_unhealthy() {
        let port = serve(200).await.expect("bind");
        let (said, mut heard) = mpsc::unbounded_channel();
        let checks = vec![Check {
            healthy_threshold: 1,
            ..check(CheckKind::Http)
        }];
        let watching = tokio::spawn(watch(
            checks,
            target(port),
            Instant::now(),
            move |h, why| {
                let _ = said.send((h, why));
            },
        ));
        let next = async |heard: &mut mpsc::UnboundedReceiver<(TaskHealth, String)>| {
            tokio::time::timeout(SOON, heard.recv())
                .await
                .ok()
                .flatten()
        };
        assert_eq!(
            next(&mut heard).await.map(|h| h.0),
            Some(TaskHealth::Starting)
        );
        let healthy = next(&mut heard).await;
        assert_eq!(healthy.as_ref().map(|h| h.0), Some(TaskHealth::Healthy));
        watching.abort();
        // Nobody listens on the other port: two failures in a row make it unhealthy.
        let closed = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            listener.local_addr().expect("address").port()
        };
        let (said, mut heard) = mpsc::unbounded_channel();
        let watching = tokio::spawn(watch(
            vec![check(CheckKind::Tcp)],
            target(closed),
            Instant::now(),
            move |h, why| {
                let _ = said.send((h, why));
            },
        ));
        assert_eq!(
            next(&mut heard).await.map(|h| h.0),
            Some(TaskHealth::Starting)
        );
        let unhealthy = next(&mut heard).await;
        assert_eq!(unhealthy.as_ref().map(|h| h.0), Some(TaskHealth::Unhealthy));
        assert!(
            unhealthy.is_some_and(|(_, why)| why.contains("cannot connect")),
            "the reason is the probe's"
        );
        watching.abort();
    }
}

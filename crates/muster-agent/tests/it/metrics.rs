//! The `muster-agent` binary's HTTP port, fetched as Prometheus and a load balancer would,
//! with curl over TLS (the test CA only, no client certificate): `/metrics` before and after
//! the agent registers with a real master and runs a real task, with every family's HELP and
//! TYPE, sane values, and the text checked by `promtool check metrics`; `/v1/health/ready`
//! 503 with a JSON error, then 200.
//!
//! promtool comes with Debian's `prometheus` package (`.ci/run` installs it). Without it the
//! promtool check says so and passes, unless `MUSTER_REQUIRE_PROMTOOL=1` (as CI sets) makes its
//! absence a failure.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use muster_proto::model as model_pb;
use muster_security::testing::TestPki;

use crate::common::{WAIT, free_address, spawn_agent, start_master};

/// The families the agent serves, with their types. The per-task ones are left out while no
/// task runs (a family with no series has no HELP or TYPE either).
const PER_TASK: [&str; 2] = [
    "muster_agent_task_cpu_seconds",
    "muster_agent_task_memory_bytes",
];

/// The families the agent serves, with their types.
const FAMILIES: &[(&str, &str)] = &[
    ("muster_agent_tasks", "gauge"),
    ("muster_agent_task_launches_total", "counter"),
    ("muster_agent_task_launch_failures_total", "counter"),
    ("muster_agent_task_cpu_seconds", "gauge"),
    ("muster_agent_task_memory_bytes", "gauge"),
    ("muster_agent_registered", "gauge"),
    ("muster_agent_leader_term", "gauge"),
    ("muster_agent_stale_commands_refused_total", "counter"),
    ("muster_agent_heartbeats_sent_total", "counter"),
    ("muster_agent_reregistrations_total", "counter"),
    ("muster_agent_transport_sent_bytes_total", "counter"),
    ("muster_agent_transport_received_bytes_total", "counter"),
    ("muster_agent_transport_received_frames_total", "counter"),
    ("muster_agent_transport_received_envelopes_total", "counter"),
    ("muster_agent_transport_reconnects_total", "counter"),
    ("muster_agent_transport_late_replies_total", "counter"),
    ("muster_agent_transport_dead_letters_total", "counter"),
];

/// The agent binary; stopped with SIGTERM when the test ends (its tasks with it: it runs with
/// --stop-tasks-on-exit), SIGKILL if that does not do.
struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if !matches!(self.0.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the binary for `master` (its tasks stop with it: `--stop-tasks-on-exit`); returns
/// it with the `/metrics` URL its stdout line names.
fn start_agent(master: &str, data_dir: &std::path::Path) -> anyhow::Result<(Agent, String)> {
    let (agent, line) = spawn_agent(master, data_dir, &["--stop-tasks-on-exit"], Agent)?;
    ensure!(
        line.starts_with("muster-agent listening on "),
        "unexpected first line {line:?}"
    );
    let url = line
        .split_once(", metrics on ")
        .map(|(_, url)| url.trim().to_owned())
        .with_context(|| format!("no metrics URL in {line:?}"))?;
    ensure!(
        url.starts_with("https://127.0.0.1:") && url.ends_with("/metrics"),
        "{url}"
    );
    Ok((agent, url))
}

/// GETs `url` with curl, trusting the test CA only; returns the status and the body.
fn curl(url: &str) -> anyhow::Result<(u16, String)> {
    let output = Command::new("curl")
        .args(["--silent", "--show-error", "--max-time", "10"])
        .arg("--cacert")
        .arg(TestPki::shared().ca_file())
        .args(["--write-out", "\n%{http_code}", url])
        .stdin(Stdio::null())
        .output()
        .context("cannot run curl")?;
    ensure!(
        output.status.success(),
        "curl {url} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).context("curl's output is not UTF-8")?;
    let (body, code) = text
        .rsplit_once('\n')
        .with_context(|| format!("no status in curl's output {text:?}"))?;
    Ok((code.trim().parse()?, body.to_owned()))
}

/// The samples of `text`: each series (name and labels, as written) with its value.
fn parse_samples(text: &str) -> anyhow::Result<BTreeMap<String, f64>> {
    let mut samples = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (series, value) = line
            .rsplit_once(' ')
            .with_context(|| format!("a sample line without a value: {line:?}"))?;
        let value: f64 = value
            .parse()
            .with_context(|| format!("a sample line with a bad value: {line:?}"))?;
        samples.insert(series.to_owned(), value);
    }
    Ok(samples)
}

/// The value of the one series `series` (name and labels, as written).
fn value(samples: &BTreeMap<String, f64>, series: &str) -> anyhow::Result<f64> {
    samples
        .get(series)
        .copied()
        .with_context(|| format!("no series {series} in {samples:#?}"))
}

/// Checks every family is there with its HELP and TYPE (the per-task ones only if
/// `tasks_run`), and returns the samples.
fn check_families(text: &str, tasks_run: bool) -> anyhow::Result<BTreeMap<String, f64>> {
    for (name, kind) in FAMILIES {
        if !tasks_run && PER_TASK.contains(name) {
            continue;
        }
        ensure!(
            text.lines()
                .any(|l| l.starts_with(&format!("# HELP {name} ")) && l.len() > name.len() + 20),
            "no HELP for {name} in:\n{text}"
        );
        ensure!(
            text.lines().any(|l| l == format!("# TYPE {name} {kind}")),
            "no TYPE {kind} for {name} in:\n{text}"
        );
    }
    parse_samples(text)
}

/// Fetches `/metrics` until `done` holds of its samples (up to [`WAIT`]), checks its families
/// (the per-task ones too if `tasks_run`), and returns the text.
fn metrics_when(
    url: &str,
    tasks_run: bool,
    what: &str,
    done: impl Fn(&BTreeMap<String, f64>) -> bool,
) -> anyhow::Result<String> {
    let deadline = Instant::now() + WAIT;
    loop {
        let (status, text) = curl(url)?;
        ensure!(status == 200, "GET {url}: {status} {text}");
        let samples = check_families(&text, false)?;
        if done(&samples) {
            check_families(&text, tasks_run)?;
            return Ok(text);
        }
        if Instant::now() > deadline {
            bail!("{what} did not show in {WAIT:?}:\n{text}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Pipes `text` into `promtool check metrics`: an error naming what it reports, if it
/// reports anything. Without promtool: a note, and Ok, unless MUSTER_REQUIRE_PROMTOOL=1.
fn promtool_check(text: &str) -> anyhow::Result<()> {
    let spawned = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            ensure!(
                std::env::var("MUSTER_REQUIRE_PROMTOOL").as_deref() != Ok("1"),
                "promtool is not installed, and MUSTER_REQUIRE_PROMTOOL=1"
            );
            eprintln!(
                "promtool is not installed: the metrics are not linted (install Debian's \
                 prometheus package)"
            );
            return Ok(());
        }
        Err(error) => return Err(error).context("cannot run promtool"),
    };
    let mut stdin = child.stdin.take().context("no stdin for promtool")?;
    stdin.write_all(text.as_bytes())?;
    drop(stdin);
    let output = child.wait_with_output()?;
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    ensure!(
        output.status.success() && report.trim().is_empty(),
        "promtool check metrics ({}): {report}\non:\n{text}",
        output.status
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_health_over_https_before_and_after_registering_and_running_a_task()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    // The master's port, chosen now; the master starts on it later.
    let master_address = free_address()?;
    let (_agent, metrics_url) = start_agent(&master_address, &dir.path().join("agent"))?;
    let base = metrics_url.trim_end_matches("/metrics").to_owned();

    // No master yet: live, not ready, not registered, no tasks.
    let (status, body) = curl(&format!("{base}/v1/health/live"))?;
    ensure!(
        status == 200 && body.contains("\"live\""),
        "{status} {body}"
    );
    let (status, body) = curl(&format!("{base}/v1/health/ready"))?;
    ensure!(
        status == 503
            && body.contains("\"code\":\"unavailable\"")
            && body.contains("\"message\":\"this agent is not registered"),
        "{status} {body}"
    );
    let (status, body) = curl(&format!("{base}/no/such/path"))?;
    ensure!(
        status == 404 && body.contains("\"code\":\"not_found\""),
        "{status} {body}"
    );
    let (status, before) = curl(&metrics_url)?;
    ensure!(status == 200, "{status} {before}");
    let samples = check_families(&before, false)?;
    ensure!(
        !before.contains("muster_agent_task_memory_bytes"),
        "no task runs: {before}"
    );
    ensure!(value(&samples, "muster_agent_registered")? == 0.0);
    ensure!(value(&samples, "muster_agent_tasks{state=\"running\"}")? == 0.0);
    ensure!(value(&samples, "muster_agent_task_launches_total")? == 0.0);
    ensure!(value(&samples, "muster_agent_heartbeats_sent_total")? == 0.0);
    promtool_check(&before)?;

    let master = start_master(&master_address, dir.path()).await?;
    let url = metrics_url.clone();
    let registered = tokio::task::spawn_blocking(move || {
        metrics_when(&url, false, "registered 1 and a heartbeat", |s| {
            s.get("muster_agent_registered") == Some(&1.0)
                && s.get("muster_agent_heartbeats_sent_total")
                    .is_some_and(|n| *n >= 1.0)
        })
    })
    .await??;
    let samples = parse_samples(&registered)?;
    ensure!(
        value(&samples, "muster_agent_leader_term")? >= 1.0,
        "{registered}"
    );
    ensure!(
        value(&samples, "muster_agent_transport_sent_bytes_total")? > 0.0
            && value(&samples, "muster_agent_transport_received_envelopes_total")? > 0.0,
        "{registered}"
    );
    ensure!(
        value(&samples, "muster_agent_reregistrations_total")? == 0.0,
        "a first registration is no re-registration: {registered}"
    );
    let (status, body) = curl(&format!("{base}/v1/health/ready"))?;
    ensure!(
        status == 200 && body.contains("\"ready\""),
        "{status} {body}"
    );

    // A task that runs until the agent stops (it kills its tasks on exit).
    let job = model_pb::Job {
        name: "sleepy".into(),
        scheduler: model_pb::SchedulerType::Service as i32,
        groups: vec![model_pb::TaskGroup {
            name: "main".into(),
            count: 1,
            resources: Some(model_pb::Resources {
                cpus: 0.1,
                mem_mb: 64,
            }),
            command: "sleep".into(),
            args: vec!["600".into()],
            ..model_pb::TaskGroup::default()
        }],
        ..model_pb::Job::default()
    };
    muster_master::testing::submit(&master, job).await?;
    let url = metrics_url.clone();
    let running = tokio::task::spawn_blocking(move || {
        metrics_when(&url, true, "the task running, with its memory", |s| {
            s.get("muster_agent_tasks{state=\"running\"}") == Some(&1.0)
                && s.iter().any(|(series, bytes)| {
                    series.starts_with("muster_agent_task_memory_bytes{")
                        && series.contains("job=\"sleepy\"")
                        && *bytes > 0.0
                })
        })
    })
    .await??;
    let samples = parse_samples(&running)?;
    ensure!(
        value(&samples, "muster_agent_task_launches_total")? == 1.0
            && value(&samples, "muster_agent_task_launch_failures_total")? == 0.0,
        "{running}"
    );
    let cpu: Vec<f64> = samples
        .iter()
        .filter(|(series, _)| {
            series.starts_with("muster_agent_task_cpu_seconds{")
                && series.contains("job=\"sleepy\"")
        })
        .map(|(_, seconds)| *seconds)
        .collect();
    ensure!(
        cpu.len() == 1 && cpu[0] >= 0.0 && cpu[0] < 60.0,
        "one task's CPU seconds, a little: {running}"
    );
    promtool_check(&running)?;

    master.shutdown().await;
    Ok(())
}

//! The master's Prometheus metrics, rendered for a real cluster in this test process: a
//! leading master (with TLS, as every test here) and one agent that runs a batch job to the
//! end. The rendering is read back by a strict parser of the exposition formats (below), in
//! both formats, and handed to Prometheus's own linter, `promtool check metrics`.
//!
//! promtool comes with Debian's `prometheus` package (`.ci/run` installs it). Without it the
//! promtool test says so and passes, unless `MUSTER_REQUIRE_PROMTOOL=1` (as CI sets) makes its
//! absence a failure.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use muster_agent::AgentHandle;
use muster_master::metrics::{Format, render, render_as};
use muster_master::testing::{self, WAIT};
use muster_master::{MasterConfig, MasterServer};
use muster_proto::model as model_pb;
use muster_transport::Node;
use tokio::io::AsyncWriteExt as _;
use tokio::time::Instant;

use crate::common::{
    agent_config, free_addresses, installed, master_config, start_agent, start_master,
};

/// A leading master with one agent, which has run the batch job `once` to the end.
struct Cluster {
    master: MasterServer,
    _agent: (Node, AgentHandle, String),
    _dir: tempfile::TempDir,
}

async fn cluster_with_a_finished_job() -> anyhow::Result<Cluster> {
    let dir = tempfile::tempdir()?;
    let master = start_master(dir.path()).await?;
    let agent = start_agent(
        "agent-1",
        agent_config(
            vec![master.address().to_owned()],
            dir.path(),
            "agent-1",
            (2.0, 1024),
        ),
    )
    .await?;
    let job = model_pb::Job {
        name: "once".into(),
        scheduler: model_pb::SchedulerType::Batch as i32,
        groups: vec![model_pb::TaskGroup {
            name: "run".into(),
            count: 1,
            resources: Some(model_pb::Resources {
                cpus: 0.5,
                mem_mb: 64,
            }),
            command: "sh".into(),
            args: vec!["-c".into(), "exit 0".into()],
            ..model_pb::TaskGroup::default()
        }],
        ..model_pb::Job::default()
    };
    testing::submit(&master, job).await?;
    testing::job_when(&master, "once", "the batch task finishing", |status| {
        status.tasks.len() == 1
            && status.tasks.iter().all(|t| {
                t.task
                    .as_ref()
                    .is_some_and(|t| t.state == model_pb::TaskState::Finished as i32)
            })
    })
    .await?;
    Ok(Cluster {
        master,
        _agent: agent,
        _dir: dir,
    })
}

/// Renders in `format` until `ready` holds for what it parses to (up to [`WAIT`]): the
/// worker's ack and the registry writes after a task ends may come a moment later.
async fn render_when(
    master: &MasterServer,
    format: Format,
    what: &str,
    ready: impl Fn(&Exposition) -> bool,
) -> anyhow::Result<(String, Exposition)> {
    let deadline = Instant::now() + WAIT;
    loop {
        let text = match format {
            Format::OpenMetrics => render(master.pid()).await?,
            Format::PrometheusText => render_as(master.pid(), format).await?,
        };
        let parsed = Exposition::parse(&text, format)
            .with_context(|| format!("{format:?} rendering does not parse:\n{text}"))?;
        if ready(&parsed) {
            return Ok((text, parsed));
        }
        if Instant::now() > deadline {
            bail!("{what} did not show within {WAIT:?}:\n{text}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The whole run is in: the evaluation completed, the worker's run timed, the task ended.
fn settled(m: &Exposition) -> bool {
    m.value("muster_evaluations_completed_total", &[]) >= Some(1.0)
        && m.value(
            "muster_scheduler_run_seconds_count",
            &[("outcome", "complete")],
        ) >= Some(1.0)
        && m.value("muster_tasks", &[("state", "finished")]) >= Some(1.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leading_master_renders_what_it_did_in_both_formats() -> anyhow::Result<()> {
    let cluster = cluster_with_a_finished_job().await?;
    let master = &cluster.master;
    let (text, first) = render_when(master, Format::OpenMetrics, "the job's run", settled).await?;
    ensure!(text.ends_with("# EOF\n"), "OpenMetrics ends in # EOF");

    // What the master did, as it shows.
    let at_least = |name: &str, labels: &[(&str, &str)], min: f64| -> anyhow::Result<()> {
        let value = first
            .value(name, labels)
            .with_context(|| format!("no {name}{labels:?} in:\n{text}"))?;
        ensure!(
            value >= min,
            "{name}{labels:?} is {value}, not at least {min}"
        );
        Ok(())
    };
    let exactly = |name: &str, labels: &[(&str, &str)], want: f64| -> anyhow::Result<()> {
        let value = first
            .value(name, labels)
            .with_context(|| format!("no {name}{labels:?} in:\n{text}"))?;
        ensure!(value == want, "{name}{labels:?} is {value}, not {want}");
        Ok(())
    };
    exactly("muster_master_is_leader", &[], 1.0)?;
    at_least("muster_registry_term", &[], 1.0)?;
    at_least("muster_registry_applied_index", &[], 1.0)?;
    at_least("muster_registry_commit_index", &[], 1.0)?;
    at_least("muster_registry_last_log_index", &[], 1.0)?;
    at_least("muster_registry_log_entries", &[], 1.0)?;
    at_least("muster_registrar_entries", &[], 1.0)?;
    at_least("muster_leader_changes_total", &[], 1.0)?;
    at_least("muster_registry_write_seconds_count", &[], 1.0)?;
    at_least("muster_evaluations_created_total", &[], 1.0)?;
    at_least("muster_evaluations_completed_total", &[], 1.0)?;
    at_least("muster_plan_apply_seconds_count", &[], 1.0)?;
    at_least("muster_placements_total", &[("result", "committed")], 1.0)?;
    at_least("muster_broker_deliveries_total", &[], 1.0)?;
    exactly("muster_agents_registered", &[], 1.0)?;
    exactly("muster_agents_connected", &[], 1.0)?;
    exactly("muster_agents_unreachable", &[], 0.0)?;
    exactly("muster_agent_registrations_total", &[], 1.0)?;
    exactly("muster_tasks", &[("state", "finished")], 1.0)?;
    exactly("muster_tasks", &[("state", "running")], 0.0)?;
    at_least("muster_processes", &[], 3.0)?;
    at_least("muster_mailbox_depth", &[("process", "master")], 0.0)?;
    at_least("muster_mailbox_depth", &[("process", "registrar")], 0.0)?;
    // The agent's registration came in over the transport, and the launch went out on it.
    at_least("muster_transport_received_bytes_total", &[], 1.0)?;
    at_least("muster_transport_sent_bytes_total", &[], 1.0)?;
    at_least("muster_dead_letters_total", &[], 0.0)?;
    // Every scheduler type and state has its series, at zero when empty.
    for scheduler in ["service", "batch", "system"] {
        for state in [
            "ready",
            "unacked",
            "pending",
            "delayed",
            "cancelable",
            "failed",
            "blocked",
        ] {
            at_least(
                "muster_broker_evaluations",
                &[("scheduler", scheduler), ("state", state)],
                0.0,
            )?;
        }
    }
    exactly("muster_kill_retries_total", &[], 0.0)?;
    exactly("muster_impersonations_refused_total", &[], 0.0)?;
    at_least("muster_recovery_seconds", &[], 0.0)?;

    // The Prometheus text format carries the same families, each counter named with its
    // `_total`, and no counter went back between the two renderings.
    let (_, second) = render_when(master, Format::PrometheusText, "a rendering", |_| true).await?;
    let om_names: BTreeSet<String> = first
        .families
        .values()
        .map(|f| match f.kind.as_str() {
            "counter" => format!("{}_total", f.name),
            _ => f.name.clone(),
        })
        .collect();
    let text_names: BTreeSet<String> = second.families.keys().cloned().collect();
    ensure!(
        om_names == text_names,
        "the formats differ: {:?} / {:?}",
        om_names
            .symmetric_difference(&text_names)
            .collect::<Vec<_>>(),
        ()
    );
    for family in first.families.values() {
        if family.kind != "counter" {
            continue;
        }
        for sample in &family.samples {
            let labels: Vec<(&str, &str)> = sample
                .labels
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let later = second
                .value(&sample.name, &labels)
                .with_context(|| format!("{} {labels:?} gone", sample.name))?;
            ensure!(
                later >= sample.value,
                "counter {}{labels:?} went back from {} to {later}",
                sample.name,
                sample.value
            );
        }
    }
    cluster.master.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_master_that_does_not_lead_answers_too() -> anyhow::Result<()> {
    // Two members, the other one never started: no quorum, so this master never leads.
    let members = free_addresses(2).await?;
    let dir = tempfile::tempdir()?;
    let master = MasterServer::start(MasterConfig {
        id: 1,
        listen: members[&1].clone(),
        http_listen: Some("127.0.0.1:0".into()),
        members,
        ..master_config(dir.path())
    })
    .await?;
    let text = render(master.pid()).await?;
    let parsed = Exposition::parse(&text, Format::OpenMetrics)
        .with_context(|| format!("the rendering does not parse:\n{text}"))?;
    for (name, want) in [
        ("muster_master_is_leader", 0.0),
        ("muster_agents_connected", 0.0),
        ("muster_registrar_entries", 0.0),
    ] {
        ensure!(parsed.value(name, &[]) == Some(want), "{name} in:\n{text}");
    }
    ensure!(
        parsed
            .value("muster_mailbox_depth", &[("process", "registrar")])
            .is_none(),
        "a registrar without leading:\n{text}"
    );
    master.shutdown().await;
    Ok(())
}

/// Pipes `text` into `promtool check metrics`: its exit status and what it printed.
async fn promtool_check(text: &str) -> anyhow::Result<(bool, String)> {
    let mut promtool = tokio::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("promtool did not start")?;
    let mut stdin = promtool.stdin.take().context("promtool's stdin")?;
    stdin.write_all(text.as_bytes()).await?;
    drop(stdin);
    let output = tokio::time::timeout(WAIT, promtool.wait_with_output())
        .await
        .context("promtool did not finish")??;
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok((output.status.success(), printed))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promtool_finds_nothing_to_lint() -> anyhow::Result<()> {
    if !installed("promtool", "--version", "MUSTER_REQUIRE_PROMTOOL")? {
        return Ok(());
    }
    let cluster = cluster_with_a_finished_job().await?;
    let (text, _) = render_when(
        &cluster.master,
        Format::PrometheusText,
        "the job's run",
        settled,
    )
    .await?;
    // promtool reads the Prometheus text format 0.0.4, the format Prometheus falls back to.
    let (passed, printed) = promtool_check(&text).await?;
    ensure!(
        passed && printed.trim().is_empty(),
        "promtool check metrics found problems:\n{printed}\nin:\n{text}"
    );
    // The checker itself fails on a problem, so its silence above means something.
    let (passed, printed) = promtool_check(
        "# HELP muster_bad A gauge named as a counter.\n# TYPE muster_bad counter\nmuster_bad 1\n",
    )
    .await?;
    ensure!(
        !passed && printed.contains("_total"),
        "promtool passed a counter without _total: {printed}"
    );
    cluster.master.shutdown().await;
    Ok(())
}

// ---- a strict reader of the exposition formats ----

/// A parsed rendering: every family by name, as declared.
#[derive(Debug)]
struct Exposition {
    families: BTreeMap<String, Family>,
}

#[derive(Debug)]
struct Family {
    name: String,
    kind: String,
    help: String,
    samples: Vec<Sample>,
}

#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

impl Exposition {
    /// The value of the sample `name` with exactly `labels`.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let labels: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        self.families
            .values()
            .flat_map(|f| &f.samples)
            .find(|s| s.name == name && s.labels == labels)
            .map(|s| s.value)
    }

    /// Reads `text` as `format` requires, refusing anything out of place: a family is its
    /// `# HELP` then its `# TYPE` (then, in OpenMetrics, an optional `# UNIT` that its name
    /// ends in), then its samples, each named as its type allows; every name and label is
    /// valid, every value a number; each family is declared once and has a help text and
    /// samples; histograms' buckets rise to `+Inf`, which is their count; OpenMetrics ends
    /// in `# EOF`, and the other format never has it.
    fn parse(text: &str, format: Format) -> anyhow::Result<Exposition> {
        let openmetrics = format == Format::OpenMetrics;
        let mut families: BTreeMap<String, Family> = BTreeMap::new();
        let mut current: Option<String> = None;
        let mut ended = false;
        for (number, line) in text.lines().enumerate() {
            let at = || format!("line {}: {line:?}", number + 1);
            ensure!(!ended, "{}: after # EOF", at());
            if line == "# EOF" {
                ensure!(openmetrics, "{}: # EOF outside OpenMetrics", at());
                ended = true;
                continue;
            }
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').with_context(at)?;
                ensure!(valid_name(name), "{}: bad name", at());
                ensure!(!help.trim().is_empty(), "{}: empty help", at());
                ensure!(!families.contains_key(name), "{}: declared twice", at());
                families.insert(
                    name.to_owned(),
                    Family {
                        name: name.to_owned(),
                        kind: String::new(),
                        help: help.to_owned(),
                        samples: Vec::new(),
                    },
                );
                current = Some(name.to_owned());
                continue;
            }
            let family = current
                .as_ref()
                .and_then(|name| families.get_mut(name))
                .with_context(|| format!("{}: before any # HELP", at()))?;
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').with_context(at)?;
                ensure!(name == family.name, "{}: not the family helped", at());
                ensure!(family.kind.is_empty(), "{}: typed twice", at());
                ensure!(
                    ["counter", "gauge", "histogram"].contains(&kind),
                    "{}: unexpected type",
                    at()
                );
                ensure!(
                    (kind == "counter") == name.ends_with("_total") || openmetrics,
                    "{}: a 0.0.4 counter, and only a counter, ends in _total",
                    at()
                );
                ensure!(
                    !(openmetrics && name.ends_with("_total")),
                    "{}: an OpenMetrics family name ends in _total",
                    at()
                );
                family.kind = kind.to_owned();
                continue;
            }
            ensure!(!family.kind.is_empty(), "{}: no # TYPE yet", at());
            if let Some(rest) = line.strip_prefix("# UNIT ") {
                ensure!(openmetrics, "{}: # UNIT outside OpenMetrics", at());
                let (name, unit) = rest.split_once(' ').with_context(at)?;
                ensure!(
                    name == family.name && name.ends_with(&format!("_{unit}")),
                    "{}: a unit its family is not named for",
                    at()
                );
                continue;
            }
            ensure!(!line.starts_with('#'), "{}: unexpected comment", at());
            let sample = parse_sample(line).with_context(at)?;
            let suffixes: &[&str] = match (family.kind.as_str(), openmetrics) {
                ("counter", true) => &["_total"],
                ("histogram", _) => &["_bucket", "_count", "_sum"],
                _ => &[""],
            };
            ensure!(
                suffixes
                    .iter()
                    .any(|s| sample.name == format!("{}{s}", family.name)),
                "{}: not a sample of {} {}",
                at(),
                family.kind,
                family.name
            );
            family.samples.push(sample);
        }
        ensure!(ended == openmetrics, "# EOF ends OpenMetrics, and only it");
        for family in families.values() {
            ensure!(!family.kind.is_empty(), "{} has no # TYPE", family.name);
            ensure!(!family.samples.is_empty(), "{} has no samples", family.name);
            ensure!(
                family.help.ends_with('.'),
                "{}: help is a sentence",
                family.name
            );
            if family.kind == "histogram" {
                check_histogram(family)?;
            }
        }
        Ok(Exposition { families })
    }
}

/// A histogram series' buckets (upper bound, count) and its count.
type HistogramSeries = (Vec<(f64, f64)>, Option<f64>);

/// Each series' buckets rise, the last is `+Inf`, and it equals the series' count.
fn check_histogram(family: &Family) -> anyhow::Result<()> {
    let mut series: BTreeMap<Vec<(String, String)>, HistogramSeries> = BTreeMap::new();
    for sample in &family.samples {
        let mut labels = sample.labels.clone();
        let le = labels.remove("le");
        let entry = series.entry(labels.into_iter().collect()).or_default();
        if sample.name.ends_with("_bucket") {
            let le = le.context("a bucket without le")?;
            let bound = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse()?
            };
            entry.0.push((bound, sample.value));
        } else if sample.name.ends_with("_count") {
            entry.1 = Some(sample.value);
        }
    }
    for (labels, (buckets, count)) in series {
        ensure!(
            buckets
                .windows(2)
                .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1),
            "{} {labels:?}: buckets do not rise: {buckets:?}",
            family.name
        );
        let last = buckets.last().context("no buckets")?;
        ensure!(last.0 == f64::INFINITY, "{}: no +Inf bucket", family.name);
        ensure!(
            Some(last.1) == count,
            "{}: +Inf is not the count",
            family.name
        );
    }
    Ok(())
}

/// `[a-zA-Z_:][a-zA-Z0-9_:]*`, and Muster's prefix.
fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        && name.starts_with("muster_")
}

/// `name{label="value",...} value`.
fn parse_sample(line: &str) -> anyhow::Result<Sample> {
    let name_end = line.find(['{', ' ']).context("a sample without a value")?;
    let name = &line[..name_end];
    ensure!(valid_name(name), "bad metric name {name:?}");
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(inner) = rest.strip_prefix('{') {
        rest = inner;
        loop {
            let (label, after) = rest.split_once("=\"").context("a label without a value")?;
            let mut chars = label.chars();
            ensure!(
                chars
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                    && chars.all(|c| c.is_ascii_alphanumeric() || c == '_'),
                "bad label name {label:?}"
            );
            let mut value = String::new();
            let mut chars = after.char_indices();
            let end = loop {
                match chars.next() {
                    Some((i, '"')) => break i,
                    Some((_, '\\')) => match chars.next() {
                        Some((_, 'n')) => value.push('\n'),
                        Some((_, c @ ('\\' | '"'))) => value.push(c),
                        other => bail!("bad escape {other:?}"),
                    },
                    Some((_, c)) => value.push(c),
                    None => bail!("an unterminated label value"),
                }
            };
            ensure!(
                labels.insert(label.to_owned(), value).is_none(),
                "label {label} twice"
            );
            rest = &after[end + 1..];
            if let Some(more) = rest.strip_prefix(',') {
                rest = more;
            } else {
                rest = rest.strip_prefix('}').context("labels not closed")?;
                break;
            }
        }
    }
    let value = rest
        .strip_prefix(' ')
        .context("no space before the value")?;
    ensure!(!value.contains(' '), "a timestamp or more after the value");
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        other => other
            .parse()
            .with_context(|| format!("bad value {other:?}"))?,
    };
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

#[test]
fn the_reader_refuses_what_is_out_of_place() {
    let good = "# HELP muster_x_total X.\n# TYPE muster_x_total counter\nmuster_x_total 1\n";
    assert!(Exposition::parse(good, Format::PrometheusText).is_ok());
    for bad in [
        // No help, no type, a counter without _total, a sample of another family.
        "# TYPE muster_x gauge\nmuster_x 1\n",
        "# HELP muster_x X.\nmuster_x 1\n",
        "# HELP muster_x X.\n# TYPE muster_x counter\nmuster_x 1\n",
        "# HELP muster_x X.\n# TYPE muster_x gauge\nmuster_y 1\n",
        // A bad name, a bad value, an unterminated label, an EOF in the wrong format.
        "# HELP muster-x X.\n# TYPE muster-x gauge\nmuster-x 1\n",
        "# HELP muster_x X.\n# TYPE muster_x gauge\nmuster_x one\n",
        "# HELP muster_x X.\n# TYPE muster_x gauge\nmuster_x{a=\"b} 1\n",
        "# HELP muster_x X.\n# TYPE muster_x gauge\nmuster_x 1\n# EOF\n",
    ] {
        assert!(
            Exposition::parse(bad, Format::PrometheusText).is_err(),
            "{bad:?} was read"
        );
    }
    let openmetrics = "# HELP muster_x X.\n# TYPE muster_x counter\nmuster_x_total 1\n# EOF\n";
    assert!(Exposition::parse(openmetrics, Format::OpenMetrics).is_ok());
    assert!(
        Exposition::parse(openmetrics.trim_end_matches("# EOF\n"), Format::OpenMetrics).is_err(),
        "OpenMetrics without # EOF"
    );
}

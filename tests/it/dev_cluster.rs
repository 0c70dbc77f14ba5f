//! `muster dev` starts a master and an agent in one process; `muster status` shows them.

use crate::common;

use anyhow::{Context as _, ensure};
use common::{DevCluster, free_port_on};
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_muster");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_runs_a_cluster_that_status_shows() -> anyhow::Result<()> {
    let cluster = DevCluster::start().await?;
    let (master, agent, banner) = (&cluster.master, &cluster.agent, &cluster.banner);
    let settings = cluster.settings.clone();
    ensure!(
        banner.contains(&format!("agent@{agent}")),
        "banner: {banner}"
    );
    for export in [
        "MUSTER_ADDR",
        "MUSTER_CACERT",
        "MUSTER_CLIENT_CERT",
        "MUSTER_CLIENT_KEY",
        "MUSTER_TOKEN",
    ] {
        ensure!(
            banner.contains(&format!("export {export}=")),
            "banner: {banner}"
        );
    }
    ensure!(settings.exists(), "no settings file");

    // A second terminal: no flags, no variables; the CLI finds the dev cluster.
    let muster = |args: &[&str]| cluster.cli(args);
    let status = muster(&["status"])?.output().await?;
    ensure!(status.status.success(), "status failed: {status:?}");
    let text = String::from_utf8_lossy(&status.stdout);
    ensure!(text.contains(&format!("leader {master}")), "status: {text}");
    ensure!(
        text.contains("agents: 1 (1 connected), 0 unreachable"),
        "status: {text}"
    );
    ensure!(text.contains(&format!("agent@{agent}")), "status: {text}");
    ensure!(text.contains("security: mutual TLS"), "status: {text}");
    ensure!(!text.contains("frameworks"), "status: {text}");

    // Into a pipe whose reader is gone (`muster status | head -0`): no error, nothing said.
    for args in [&["status"][..], &["status", "--json"][..]] {
        let (reader, writer) = std::io::pipe()?;
        drop(reader);
        let closed = muster(args)?
            .stdout(std::process::Stdio::from(writer))
            .stderr(std::process::Stdio::piped())
            .spawn()?
            .wait_with_output()
            .await?;
        let said = String::from_utf8_lossy(&closed.stderr);
        ensure!(
            closed.status.success() && said.is_empty(),
            "{args:?}: {closed:?}"
        );
    }

    // Several masters in MUSTER_ADDR: one that is down is passed over, for leader-only and
    // stale calls alike; when none answers, each one's reason is named.
    let nobody = free_port_on("127.0.0.1").await?;
    let both = format!("{nobody},{master}");
    for args in [
        &["status", "--master", &both][..],
        &["status", "--stale", "--master", &both][..],
    ] {
        let status = muster(args)?.output().await?;
        ensure!(status.status.success(), "{args:?} failed: {status:?}");
        let text = String::from_utf8_lossy(&status.stdout);
        ensure!(text.contains(&format!("leader {master}")), "status: {text}");
    }
    let other = free_port_on("127.0.0.1").await?;
    let none = muster(&["status", "--master", &format!("{nobody},{other}")])?
        .output()
        .await?;
    ensure!(!none.status.success(), "status answered with no master up");
    let text = String::from_utf8_lossy(&none.stderr);
    ensure!(
        text.contains("no master answered")
            && text.contains(&format!("cannot reach a master at {nobody}"))
            && text.contains(&format!("cannot reach a master at {other}")),
        "{text}"
    );

    // The README's walkthrough: run a job, see it.
    let job = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/jobs/hello.toml");
    let run = muster(&["job", "run", job])?.output().await?;
    ensure!(run.status.success(), "job run: {run:?}");

    // The lists: the job with its count, its registration evaluation, the agent.
    let jobs = muster(&["job", "list"])?.output().await?;
    ensure!(jobs.status.success(), "job list: {jobs:?}");
    let text = String::from_utf8_lossy(&jobs.stdout);
    let row = text
        .lines()
        .find(|l| l.starts_with("hello "))
        .with_context(|| format!("no hello in the job list: {text}"))?;
    let columns: Vec<&str> = row.split_whitespace().collect();
    ensure!(
        columns.get(1..5) == Some(&["default", "batch", "50", "1"][..])
            && columns.get(6) == Some(&"1"),
        "job list row: {row}"
    );
    // Its status in Nomad's words: the one-second task may not have started yet, may run, or
    // may have finished.
    ensure!(
        matches!(columns.get(5), Some(&("pending" | "running" | "complete"))),
        "job list row: {row}"
    );
    let none = muster(&["job", "list", "--prefix", "nomatch"])?
        .output()
        .await?;
    ensure!(
        String::from_utf8_lossy(&none.stdout).trim() == "no jobs",
        "{none:?}"
    );
    let evals = muster(&["eval", "list", "--job", "hello"])?
        .output()
        .await?;
    ensure!(evals.status.success(), "eval list: {evals:?}");
    let text = String::from_utf8_lossy(&evals.stdout);
    ensure!(
        text.lines()
            .any(|l| l.contains(" hello ") && l.contains("JobRegister")),
        "eval list: {text}"
    );
    let agents = muster(&["agent", "list", "--stale"])?.output().await?;
    ensure!(agents.status.success(), "agent list: {agents:?}");
    let text = String::from_utf8_lossy(&agents.stdout);
    ensure!(
        text.contains(&format!("agent@{agent}")),
        "agent list: {text}"
    );

    // --json: the documents the HTTP API answers, one per line.
    let json = |args: &'static [&'static str]| {
        let command = muster(args);
        async move {
            let output = command?.output().await?;
            ensure!(output.status.success(), "{args:?}: {output:?}");
            let value: serde_json::Value = serde_json::from_slice(&output.stdout)
                .with_context(|| format!("{args:?} printed no JSON: {output:?}"))?;
            anyhow::Ok(value)
        }
    };
    let jobs = json(&["job", "list", "--json"]).await?;
    ensure!(
        jobs["jobs"][0]["name"] == "hello" && jobs["jobs"][0]["type"] == "batch",
        "{jobs}"
    );
    let hello = json(&["job", "status", "hello", "--json"]).await?;
    ensure!(
        hello["job"]["name"] == "hello" && hello["evaluations"][0]["job"] == "hello",
        "{hello}"
    );
    let evals = json(&["eval", "list", "--json", "--job", "hello"]).await?;
    ensure!(
        evals["evaluations"][0]["triggered_by"] == "job-register",
        "{evals}"
    );
    let agents = json(&["agent", "list", "--json"]).await?;
    ensure!(agents["agents"][0]["status"] == "ready", "{agents}");
    let status = json(&["status", "--json"]).await?;
    ensure!(
        status["is_leader"] == true && status["leader"] == master.as_str(),
        "{status}"
    );

    // Draining the agent and its eligibility: a drain makes it ineligible until cancelled,
    // and eligibility cannot be set while it drains.
    let agent_id = agents["agents"][0]["id"]
        .as_str()
        .context("no agent id")?
        .to_owned();
    let drained = muster(&["agent", "drain", &agent_id, "--deadline", "10m", "--json"])?
        .output()
        .await?;
    ensure!(drained.status.success(), "agent drain: {drained:?}");
    let drained: serde_json::Value = serde_json::from_slice(&drained.stdout)?;
    ensure!(
        drained["drain"] == "draining"
            && drained["eligible"] == false
            && drained["drain_deadline_ms"].as_u64() > Some(0),
        "{drained}"
    );
    let refused = muster(&["agent", "eligibility", &agent_id, "--enable"])?
        .output()
        .await?;
    ensure!(
        !refused.status.success()
            && String::from_utf8_lossy(&refused.stderr).contains("is draining"),
        "eligibility while draining: {refused:?}"
    );
    let listed = muster(&["agent", "list"])?.output().await?;
    ensure!(
        String::from_utf8_lossy(&listed.stdout).contains("draining, deadline "),
        "agent list: {listed:?}"
    );
    let cancelled = muster(&["agent", "drain", &agent_id, "--disable"])?
        .output()
        .await?;
    ensure!(
        cancelled.status.success()
            && String::from_utf8_lossy(&cancelled.stdout).trim()
                == format!("agent {agent_id}: eligible"),
        "drain --disable: {cancelled:?}"
    );
    let ineligible = muster(&["agent", "eligibility", &agent_id, "--disable"])?
        .output()
        .await?;
    ensure!(
        String::from_utf8_lossy(&ineligible.stdout).trim()
            == format!("agent {agent_id}: ineligible"),
        "eligibility --disable: {ineligible:?}"
    );
    let eligible = muster(&["agent", "eligibility", &agent_id, "--enable"])?
        .output()
        .await?;
    ensure!(
        eligible.status.success(),
        "eligibility --enable: {eligible:?}"
    );
    let neither = muster(&["agent", "eligibility", &agent_id])?
        .output()
        .await?;
    ensure!(
        !neither.status.success() && String::from_utf8_lossy(&neither.stderr).contains("--enable"),
        "eligibility without a choice: {neither:?}"
    );

    // A dry run of the same file: the next version; nothing is submitted.
    let plan = muster(&["job", "plan", job])?.output().await?;
    ensure!(
        plan.status.success()
            && String::from_utf8_lossy(&plan.stdout).starts_with("job hello would be version 2"),
        "job plan: {plan:?}"
    );

    // Its history: one version so far.
    let history = muster(&["job", "history", "hello"])?.output().await?;
    ensure!(
        history.status.success()
            && String::from_utf8_lossy(&history.stdout).starts_with("version 1 (current):"),
        "job history: {history:?}"
    );

    // The task's output, followed until the task ends.
    let logs = muster(&["job", "logs", "hello", "--follow"])?
        .output()
        .await?;
    ensure!(logs.status.success(), "job logs: {logs:?}");
    ensure!(
        String::from_utf8_lossy(&logs.stdout).contains("hello from muster, task one"),
        "job logs: {logs:?}"
    );
    let missing = muster(&["job", "logs", "hello", "--task", "nope"])?
        .output()
        .await?;
    ensure!(
        !missing.status.success()
            && String::from_utf8_lossy(&missing.stderr).contains("has no task \"nope\""),
        "{missing:?}"
    );

    // The event stream: what is kept comes first (the job's registration), as JSON lines.
    {
        use tokio::io::AsyncBufReadExt as _;
        let mut events = muster(&["events", "--json", "--topic", "job"])?
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = events.stdout.take().context("no stdout")?;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let line = tokio::time::timeout(std::time::Duration::from_secs(30), lines.next_line())
            .await
            .context("no event in 30 s")??
            .context("the event stream ended")?;
        let event: serde_json::Value = serde_json::from_str(&line)?;
        ensure!(
            event["kind"] == "job-registered" && event["key"] == "hello",
            "{event}"
        );
        events.kill().await?;
    }

    // A read token cannot submit; the error says why.
    let token = |name: &'static str, policy: &'static str| {
        let command = muster(&["acl", "token", "create", "--policy", policy, "--name", name]);
        async move {
            let created = command?.output().await?;
            ensure!(created.status.success(), "token create: {created:?}");
            String::from_utf8_lossy(&created.stdout)
                .lines()
                .find_map(|l| l.strip_prefix("Secret"))
                .map(|secret| secret.trim().to_owned())
                .context("no secret printed")
        }
    };
    let secret = token("ci", "read").await?;
    let vars = std::fs::read_to_string(&settings)?;
    let var = |key: &str| {
        vars.lines()
            .find_map(|l| l.strip_prefix(&format!("export {key}='")))
            .and_then(|v| v.strip_suffix('\''))
            .map(str::to_owned)
            .with_context(|| format!("{key} not in the settings"))
    };
    // The CLI with the dev cluster's address and certificates, and the token `secret`.
    let as_token = |secret: &str, args: &[&str]| -> anyhow::Result<Command> {
        let mut command = Command::new(BIN);
        command
            .args(args)
            .env("MUSTER_DEV_ENV", cluster.dir().join("none"))
            .env("MUSTER_ADDR", master)
            .env("MUSTER_CACERT", var("MUSTER_CACERT")?)
            .env("MUSTER_CLIENT_CERT", var("MUSTER_CLIENT_CERT")?)
            .env("MUSTER_CLIENT_KEY", var("MUSTER_CLIENT_KEY")?)
            .env("MUSTER_TOKEN", secret)
            .env_remove("MUSTER_NAMESPACE");
        Ok(command)
    };
    let refused = as_token(&secret, &["job", "run", job])?.output().await?;
    ensure!(!refused.status.success(), "a read token submitted");
    let text = String::from_utf8_lossy(&refused.stderr);
    ensure!(
        text.contains("token \"ci\" (policies: read) may not make this call: it needs a policy granting submit-job in some namespace"),
        "{text}"
    );

    // A team's namespace, policy and token: the token runs jobs there, is refused elsewhere
    // with the namespace named, and `-n '*'` lists what it may read, namespace by namespace.
    let applied = muster(&["namespace", "apply", "team-a"])?.output().await?;
    ensure!(applied.status.success(), "namespace apply: {applied:?}");
    let rules = cluster.dir().join("team-a-dev.toml");
    std::fs::write(&rules, "[namespace.team-a]\npolicy = \"write\"\n")?;
    let rules = rules.to_str().context("a policy path that is not UTF-8")?;
    let applied = muster(&["acl", "policy", "apply", "team-a-dev", rules])?
        .output()
        .await?;
    ensure!(applied.status.success(), "policy apply: {applied:?}");
    let alice = token("alice", "team-a-dev").await?;
    let run = as_token(&alice, &["-n", "team-a", "job", "run", job])?
        .output()
        .await?;
    ensure!(
        run.status.success()
            && String::from_utf8_lossy(&run.stdout).starts_with("job hello submitted"),
        "job run in team-a: {run:?}"
    );
    let status = as_token(&alice, &["-n", "team-a", "job", "status", "hello"])?
        .output()
        .await?;
    ensure!(
        String::from_utf8_lossy(&status.stdout).starts_with("job hello in namespace team-a ("),
        "job status in team-a: {status:?}"
    );
    let evals = as_token(&alice, &["-n", "team-a", "eval", "list"])?
        .output()
        .await?;
    let evals = String::from_utf8_lossy(&evals.stdout);
    ensure!(
        evals.lines().any(|l| {
            let columns: Vec<&str> = l.split_whitespace().collect();
            columns.get(1..3) == Some(&["team-a", "hello"][..])
        }),
        "eval list in team-a: {evals}"
    );
    for args in [
        &["job", "status", "hello"][..],
        &["-n", "default", "job", "list"],
    ] {
        let refused = as_token(&alice, args)?.output().await?;
        ensure!(
            !refused.status.success()
                && String::from_utf8_lossy(&refused.stderr)
                    .contains("may not read-job in namespace \"default\""),
            "{args:?} with team-a's token: {refused:?}"
        );
    }
    let listed = |output: std::process::Output| -> anyhow::Result<Vec<(String, String)>> {
        ensure!(output.status.success(), "job list: {output:?}");
        let text = String::from_utf8_lossy(&output.stdout);
        let mut lines = text.lines();
        let header: Vec<&str> = lines
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        ensure!(
            header.get(..2) == Some(&["NAME", "NAMESPACE"][..]),
            "{text}"
        );
        Ok(lines
            .filter_map(|l| {
                let mut columns = l.split_whitespace();
                Some((columns.next()?.to_owned(), columns.next()?.to_owned()))
            })
            .collect())
    };
    let own = listed(
        as_token(&alice, &["-n", "*", "job", "list"])?
            .output()
            .await?,
    )?;
    ensure!(
        own == [("hello".into(), "team-a".into())],
        "alice's jobs: {own:?}"
    );
    let mut every = listed(muster(&["-n", "*", "job", "list"])?.output().await?)?;
    every.sort();
    ensure!(
        every
            == [
                ("hello".into(), "default".into()),
                ("hello".into(), "team-a".into())
            ],
        "every job: {every:?}"
    );
    // No credentials at all: plaintext to a TLS port gets nowhere, and says where it went.
    let anonymous = Command::new(BIN)
        .args(["status", "--master", master, "--timeout", "5s"])
        .env("MUSTER_DEV_ENV", cluster.dir().join("none"))
        .output()
        .await?;
    ensure!(!anonymous.status.success(), "an anonymous status answered");

    cluster.stop().await?;
    ensure!(!settings.exists(), "the settings file outlived the cluster");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_names_an_unreachable_master() -> anyhow::Result<()> {
    let nobody = free_port_on("127.0.0.1").await?;
    let dir = tempfile::tempdir()?;
    let status = Command::new(BIN)
        .args(["status", "--master", &nobody])
        .env("MUSTER_DEV_ENV", dir.path().join("none"))
        .output()
        .await?;
    ensure!(!status.status.success());
    let text = String::from_utf8_lossy(&status.stderr);
    ensure!(
        text.contains(&format!("cannot reach a master at {nobody}")),
        "{text}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cli_without_tls_settings_at_a_tls_master_says_what_to_set() -> anyhow::Result<()> {
    let cluster = DevCluster::start().await?;
    for token in [None, Some("a-token-but-no-ca")] {
        let mut command = Command::new(BIN);
        command
            .arg("status")
            .env("RUST_LOG", "warn")
            // No dev cluster to fall back on, and no TLS settings.
            .env("MUSTER_DEV_ENV", cluster.dir().join("none"))
            .env("MUSTER_ADDR", &cluster.master)
            .env_remove("MUSTER_CACERT")
            .env_remove("MUSTER_CLIENT_CERT")
            .env_remove("MUSTER_CLIENT_KEY")
            .env_remove("MUSTER_TOKEN");
        if let Some(token) = token {
            command.env("MUSTER_TOKEN", token);
        }
        let output = tokio::time::timeout(common::DEADLINE, command.output())
            .await
            .context("the CLI hung")??;
        ensure!(
            !output.status.success(),
            "a plaintext status read a TLS master"
        );
        let err = String::from_utf8_lossy(&output.stderr);
        ensure!(
            err.contains("plaintext")
                && err.contains("MUSTER_CACERT")
                && err.contains("--role client"),
            "with token {token:?}, the error says what to set: {err}"
        );
    }
    cluster.stop().await
}

//! Helpers for tests that run Muster's binaries as child processes.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use muster::proto::cluster as pb;
use muster_security::testing::TestPki;
use muster_security::{Role, TokenSecret};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// How long a child may take to do what a test waits for.
pub(crate) const DEADLINE: Duration = Duration::from_secs(60);

/// A binary of the workspace, from the same target directory as the running test.
pub(crate) fn binary(name: &str) -> anyhow::Result<PathBuf> {
    let test_exe = std::env::current_exe()?;
    let profile_dir = test_exe
        .parent()
        .and_then(|deps| deps.parent())
        .context("test executable has no target directory")?;
    let path = profile_dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    if !path.exists() {
        bail!(
            "{} not found: run through `cargo test --workspace`, which builds it",
            path.display()
        );
    }
    Ok(path)
}

/// Starts a binary and waits for the line it prints once it listens.
pub(crate) async fn spawn_listening(mut command: Command, what: &str) -> anyhow::Result<Child> {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    let stdout = child.stdout.take().context("child stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(DEADLINE, lines.next_line())
        .await
        .with_context(|| format!("{what} did not start listening"))??
        .with_context(|| format!("{what} exited before listening"))?;
    if !line.contains("listening on") {
        bail!("{what} printed {line:?}");
    }
    // Keep draining stdout so the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(child)
}

/// Three (or more) `muster-master` processes on loopback, started and restarted by index.
pub(crate) struct Masters {
    /// Each master's `host:port`.
    pub(crate) addresses: Vec<String>,
    /// Where their data directories go.
    pub(crate) dir: PathBuf,
    /// The running processes, by index.
    pub(crate) children: Vec<Option<Child>>,
}

impl Masters {
    /// `n` masters' free addresses under `dir`, none started yet.
    pub(crate) async fn new(dir: &std::path::Path, n: usize) -> anyhow::Result<Masters> {
        Ok(Masters {
            addresses: free_ports(n).await?,
            dir: dir.to_owned(),
            children: (0..n).map(|_| None).collect(),
        })
    }

    /// Starts master `index` (again), each master a peer, with `extra` flags.
    pub(crate) async fn start(&mut self, index: usize) -> anyhow::Result<()> {
        self.start_with(index, &[]).await
    }

    /// Starts master `index` (again) with `extra` flags.
    pub(crate) async fn start_with(&mut self, index: usize, extra: &[&str]) -> anyhow::Result<()> {
        let mut command = Command::new(binary("muster-master")?);
        command
            .args(TestPki::shared().args(Role::Master, &format!("master-{}", index + 1)))
            .arg("--id")
            .arg((index + 1).to_string())
            .arg("--listen")
            .arg(&self.addresses[index])
            .arg("--data-dir")
            .arg(self.dir.join(format!("master-{}", index + 1)));
        for (i, address) in self.addresses.iter().enumerate() {
            command.arg("--peer").arg(format!("{}={address}", i + 1));
        }
        command.args(extra);
        let child = spawn_listening(command, &format!("master {}", index + 1)).await?;
        self.children[index] = Some(child);
        Ok(())
    }
}

/// `n` distinct free loopback addresses.
pub(crate) async fn free_ports(n: usize) -> anyhow::Result<Vec<String>> {
    // Held together so they differ, then released for the masters to bind.
    let mut listeners = Vec::new();
    for _ in 0..n {
        listeners.push(tokio::net::TcpListener::bind("127.0.0.1:0").await?);
    }
    listeners
        .iter()
        .map(|l| Ok(l.local_addr()?.to_string()))
        .collect()
}

/// Asks each master for the cluster state and returns the leader's, once `done` holds there.
pub(crate) async fn leader_state_when(
    addresses: &[String],
    token: &TokenSecret,
    what: &str,
    done: impl Fn(&pb::ClusterState) -> bool,
) -> anyhow::Result<(usize, pb::ClusterState)> {
    leader_state_within(addresses, token, what, DEADLINE, done).await
}

/// As [`leader_state_when`], failing if `done` does not hold within `limit`.
pub(crate) async fn leader_state_within(
    addresses: &[String],
    token: &TokenSecret,
    what: &str,
    limit: Duration,
    done: impl Fn(&pb::ClusterState) -> bool,
) -> anyhow::Result<(usize, pb::ClusterState)> {
    let deadline = Instant::now() + limit;
    let mut last = None;
    loop {
        for (index, address) in addresses.iter().enumerate() {
            let Ok(mut client) = muster_master::testing::operator(address, Some(token)).await
            else {
                continue;
            };
            if let Ok(state) = client.get_state(pb::GetStateRequest::default()).await {
                let state = state.into_inner();
                if state.is_leader && done(&state) {
                    return Ok((index, state));
                }
                if state.is_leader {
                    last = Some(state);
                }
            }
        }
        if Instant::now() > deadline {
            bail!("{what} did not happen within {limit:?}; last leader state: {last:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `muster dev` as a child process, with its own settings file so that it never meets a
/// developer's dev cluster; the CLI run through [`DevCluster::cli`] finds it with no flags.
pub(crate) struct DevCluster {
    /// The child.
    pub(crate) child: Child,
    /// The master's address.
    pub(crate) master: String,
    /// The agent's address.
    pub(crate) agent: String,
    /// Where the CLI settings (address, certificates, token) are written.
    pub(crate) settings: PathBuf,
    /// The banner it printed, up to its hint.
    pub(crate) banner: String,
    dir: tempfile::TempDir,
}

impl DevCluster {
    /// Starts `muster dev` on free ports and waits for its banner.
    pub(crate) async fn start() -> anyhow::Result<DevCluster> {
        let ports = free_ports(2).await?;
        let (master, agent) = (ports[0].clone(), ports[1].clone());
        let dir = tempfile::tempdir()?;
        let settings = dir.path().join("muster-dev.env");
        let mut child = Command::new(binary("muster")?)
            .args(["dev", "--listen", &master, "--agent-listen", &agent])
            .env("RUST_LOG", "warn")
            .env("MUSTER_DEV_ENV", &settings)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting muster dev")?;
        let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
        let first = tokio::time::timeout(DEADLINE, lines.next_line())
            .await
            .context("muster dev did not come up")??
            .context("muster dev exited")?;
        anyhow::ensure!(
            first.contains("muster dev cluster running"),
            "printed {first:?}"
        );
        let mut banner = String::new();
        loop {
            let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
                .await
                .context("the banner stopped")??
                .context("muster dev exited")?;
            banner.push_str(&line);
            banner.push('\n');
            if line.contains("Try `muster status`") {
                break;
            }
        }
        Ok(DevCluster {
            child,
            master,
            agent,
            settings,
            banner,
            dir,
        })
    }

    /// The `muster` CLI, pointed at this cluster through its settings file alone.
    pub(crate) fn cli(&self, args: &[&str]) -> anyhow::Result<Command> {
        let mut command = Command::new(binary("muster")?);
        command
            .args(args)
            .env("RUST_LOG", "warn")
            .env("MUSTER_DEV_ENV", &self.settings)
            .env_remove("MUSTER_ADDR")
            .env_remove("MUSTER_TOKEN");
        Ok(command)
    }

    /// A scratch directory that lives as long as the cluster.
    pub(crate) fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Stops it with SIGTERM and waits for a clean exit.
    pub(crate) async fn stop(mut self) -> anyhow::Result<()> {
        let pid = self.child.id().context("dev pid")?;
        Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await?;
        let exit = tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .context("muster dev did not stop on SIGTERM")??;
        anyhow::ensure!(exit.success(), "muster dev exited with {exit}");
        Ok(())
    }
}

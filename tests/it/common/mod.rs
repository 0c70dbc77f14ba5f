//! Helpers for tests that run Muster's binaries as child processes.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use muster::proto::cluster as pb;
use muster::proto::model as model_pb;
use muster_security::testing::TestPki;
use muster_security::{Role, TokenSecret};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::Instant;

pub(crate) mod dev_jobs;

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
pub(crate) async fn spawn_listening(command: Command, what: &str) -> anyhow::Result<Child> {
    spawn_listening_with(command, what, Stdio::null()).await
}

/// As [`spawn_listening`], appending the child's stderr (its logs) to `log`: a restarted
/// child's logs follow those of its earlier runs. See [`keep_logs_on_error`].
pub(crate) async fn spawn_logged(
    command: Command,
    what: &str,
    log: &Path,
) -> anyhow::Result<Child> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    spawn_listening_with(command, what, Stdio::from(file))
        .await
        .map_err(|e| {
            // Why it exited is in its log, which goes with the test's directory.
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(20).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            e.context(format!("the end of its log:\n{}", tail.join("\n")))
        })
}

async fn spawn_listening_with(
    mut command: Command,
    what: &str,
    stderr: Stdio,
) -> anyhow::Result<Child> {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(stderr)
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

/// `muster-master` with the certificate `master-<id>` of the shared test CA, listening on
/// `address`, its data in `data_dir`; the caller adds its other flags.
pub(crate) fn master_command(id: usize, address: &str, data_dir: &Path) -> anyhow::Result<Command> {
    let mut command = Command::new(binary("muster-master")?);
    command
        .args(TestPki::shared().args(Role::Master, &format!("master-{id}")))
        .arg("--listen")
        .arg(address)
        .arg("--data-dir")
        .arg(data_dir);
    Ok(command)
}

/// `muster-agent` as agent `n`: the certificate `agent-<n>` of the shared test CA (valid for
/// `host`, where it listens, as well as loopback's usual names), its data in `dir/agent-<n>`,
/// reporting to each of `masters`; the caller adds where it listens and its other flags.
pub(crate) fn agent_command(
    dir: &Path,
    n: usize,
    host: &str,
    masters: &[String],
) -> anyhow::Result<Command> {
    let mut command = Command::new(binary("muster-agent")?);
    command
        .args(TestPki::shared().args_naming(Role::Agent, &format!("agent-{n}"), &[host.to_owned()]))
        .arg("--data-dir")
        .arg(dir.join(format!("agent-{n}")));
    for master in masters {
        command.arg("--master").arg(master);
    }
    Ok(command)
}

/// The `muster` CLI against `masters` (any of them), with the shared test CA's client
/// certificate and `token`, and no dev cluster to fall back on; the caller adds the command.
pub(crate) fn cli_with_token(masters: &[String], token: &TokenSecret) -> anyhow::Result<Command> {
    let files = TestPki::shared().files(Role::Client, "test-client");
    let mut command = Command::new(binary("muster")?);
    command
        .env("RUST_LOG", "warn")
        .env_remove("MUSTER_DEV_ENV")
        .env_remove("MUSTER_NAMESPACE")
        .env("MUSTER_ADDR", masters.join(","))
        .env("MUSTER_CACERT", &files.ca)
        .env("MUSTER_CLIENT_CERT", &files.cert)
        .env("MUSTER_CLIENT_KEY", &files.key)
        .env("MUSTER_TOKEN", token.expose());
    Ok(command)
}

/// Starts agents `0..count` of every master of `masters` ([`agent_command`]), each on a free
/// port of loopback, its tasks ending with it (`--stop-tasks-on-exit`), with the flags `extra`
/// gives agent `n`; returns them once each listens.
pub(crate) async fn start_agents(
    dir: &Path,
    masters: &[String],
    count: usize,
    extra: impl Fn(usize) -> Vec<String>,
) -> anyhow::Result<Vec<Child>> {
    let mut agents = Vec::with_capacity(count);
    for n in 0..count {
        let mut command = agent_command(dir, n, "127.0.0.1", masters)?;
        command
            .args(["--listen", "127.0.0.1:0", "--stop-tasks-on-exit"])
            .args(extra(n));
        agents.push(spawn_listening(command, &format!("agent {n}")).await?);
    }
    Ok(agents)
}

/// Submits `job` to the master at `address` with `token`, again (up to [`DEADLINE`]) while the
/// master answers UNAVAILABLE: refused before anything was written, its leadership could not be
/// confirmed in time (a loaded machine).
pub(crate) async fn submit(
    address: &str,
    token: &TokenSecret,
    job: model_pb::Job,
) -> anyhow::Result<()> {
    let name = job.name.clone();
    let deadline = Instant::now() + DEADLINE;
    loop {
        let mut client = muster_master::testing::operator(address, Some(token)).await?;
        let request = pb::SubmitJobRequest {
            job: Some(job.clone()),
        };
        match client.submit_job(request).await {
            Ok(_) => return Ok(()),
            Err(status)
                if status.code() == tonic::Code::Unavailable && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(status) => return Err(status).with_context(|| format!("submitting {name}")),
        }
    }
}

/// Three (or more) `muster-master` processes on loopback, started and restarted by index.
pub(crate) struct Masters {
    /// Each master's `host:port`: where it listens, and where the test reaches it.
    pub(crate) addresses: Vec<String>,
    /// What each master is named in every master's `--peer` list: the address the masters
    /// reach each other at, and give agents (leader hints, announcements). Its address unless
    /// a test routes that traffic through links of its own
    /// (`muster_security::testing::partitions`).
    pub(crate) advertised: Vec<String>,
    /// Where their data directories go.
    pub(crate) dir: PathBuf,
    /// The running processes, by index.
    pub(crate) children: Vec<Option<Child>>,
    /// Whether each master's HTTP port is any free port of its host (else the default, its
    /// `--listen` port plus 10).
    http_on_any_port: bool,
    /// Whether each master's stderr is kept, in `<dir>/master-<id>.log`.
    logged: bool,
}

impl Masters {
    /// `n` masters' free addresses under `dir`, none started yet.
    pub(crate) async fn new(dir: &std::path::Path, n: usize) -> anyhow::Result<Masters> {
        let addresses = free_ports(n).await?;
        Ok(Masters {
            advertised: addresses.clone(),
            addresses,
            dir: dir.to_owned(),
            children: (0..n).map(|_| None).collect(),
            http_on_any_port: false,
            logged: false,
        })
    }

    /// One master on each of `hosts` (loopback addresses such as `127.0.0.11`), on a free
    /// port, its HTTP port any free one of the same host, its logs kept in
    /// `<dir>/master-<id>.log`; none started yet.
    pub(crate) async fn on_hosts(dir: &Path, hosts: &[&str]) -> anyhow::Result<Masters> {
        let mut addresses = Vec::with_capacity(hosts.len());
        for host in hosts {
            addresses.push(free_port_on(host).await?);
        }
        Ok(Masters {
            advertised: addresses.clone(),
            addresses,
            dir: dir.to_owned(),
            children: hosts.iter().map(|_| None).collect(),
            http_on_any_port: true,
            logged: true,
        })
    }

    /// Where master `index`'s logs go, if they are kept.
    pub(crate) fn log(&self, index: usize) -> Option<PathBuf> {
        self.logged
            .then(|| self.dir.join(format!("master-{}.log", index + 1)))
    }

    /// Starts every master, each a peer of the others.
    pub(crate) async fn start_all(&mut self) -> anyhow::Result<()> {
        for index in 0..self.addresses.len() {
            self.start(index).await?;
        }
        Ok(())
    }

    /// Starts master `index` (again), each master a peer.
    pub(crate) async fn start(&mut self, index: usize) -> anyhow::Result<()> {
        self.start_with(index, &[]).await
    }

    /// Starts master `index` (again) with `extra` flags.
    pub(crate) async fn start_with(&mut self, index: usize, extra: &[&str]) -> anyhow::Result<()> {
        let id = index + 1;
        let data_dir = self.dir.join(format!("master-{id}"));
        let mut command = master_command(id, &self.addresses[index], &data_dir)?;
        command.arg("--id").arg(id.to_string());
        if self.http_on_any_port {
            let (host, _) = self.addresses[index]
                .rsplit_once(':')
                .context("an address without a port")?;
            command.arg("--http-listen").arg(format!("{host}:0"));
        }
        for (i, address) in self.advertised.iter().enumerate() {
            command.arg("--peer").arg(format!("{}={address}", i + 1));
        }
        command.args(extra);
        let what = format!("master {}", index + 1);
        let child = match self.log(index) {
            Some(log) => spawn_logged(command, &what, &log).await?,
            None => spawn_listening(command, &what).await?,
        };
        self.children[index] = Some(child);
        Ok(())
    }
}

/// A free port of `host` (a loopback address), as `host:port`: bound, then released for a
/// child to bind.
pub(crate) async fn free_port_on(host: &str) -> anyhow::Result<String> {
    let listener = bind_below_ephemeral(host).await?;
    Ok(listener.local_addr()?.to_string())
}

/// A listener on a port of `host` below the kernel's ephemeral range (32768 and up): a port
/// checked free and released for a server to bind must not be handed meanwhile to anything
/// binding port 0 (a test's link proxy, another test's client), as an ephemeral one can be.
async fn bind_below_ephemeral(host: &str) -> anyhow::Result<tokio::net::TcpListener> {
    for _ in 0..1_000 {
        let port = fastrand::u16(12_000..20_000);
        if let Ok(listener) = tokio::net::TcpListener::bind((host, port)).await {
            return Ok(listener);
        }
    }
    bail!("no free port of {host} in 12000..20000")
}

/// `n` distinct free loopback addresses.
pub(crate) async fn free_ports(n: usize) -> anyhow::Result<Vec<String>> {
    // Held together so they differ, then released for the masters to bind.
    let mut listeners = Vec::new();
    for _ in 0..n {
        listeners.push(bind_below_ephemeral("127.0.0.1").await?);
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

/// How long [`leader_state_within`] waits for one master's state before asking the next.
const STATE_READ_LIMIT: Duration = Duration::from_secs(2);

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
            // A paused master answers nothing: ask the next one soon.
            let read = client.get_state(pb::GetStateRequest::default());
            if let Ok(Ok(state)) = tokio::time::timeout(STATE_READ_LIMIT, read).await {
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
            .env_remove("MUSTER_TOKEN")
            .env_remove("MUSTER_NAMESPACE");
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

/// The environment variable that marks a test's task processes: each task of a test's jobs
/// carries `MUSTER_TEST_MARKER=<marker>`, which its processes inherit (through `exec` too).
pub(crate) const MARKER: &str = "MUSTER_TEST_MARKER";

/// A job of one group `main` of `count` tasks running `script` under `sh -c`, each with a tenth
/// of a CPU and `mem_mb` MiB, its processes marked `marker` (see [`MARKER`]).
pub(crate) fn marked_shell_job(
    name: &str,
    scheduler: model_pb::SchedulerType,
    count: u32,
    mem_mb: u64,
    script: &str,
    marker: &str,
) -> model_pb::Job {
    let group = model_pb::TaskGroup {
        name: "main".into(),
        count,
        resources: Some(model_pb::Resources { cpus: 0.1, mem_mb }),
        command: "sh".into(),
        args: vec!["-c".into(), script.into()],
        env: [(MARKER.to_owned(), marker.to_owned())].into(),
        ..model_pb::TaskGroup::default()
    };
    model_pb::Job {
        name: name.into(),
        scheduler: scheduler as i32,
        groups: vec![group],
        ..model_pb::Job::default()
    }
}

/// A live process of this machine that carries a marker: its pid, and the task it works for
/// (its working directory is the agent's `.../tasks/<task id>`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Marked {
    pub(crate) pid: i32,
    pub(crate) task: String,
}

impl Marked {
    /// The slot (task name, `job.group[n]`) the process's task fills: its id without the
    /// random suffix.
    pub(crate) fn slot(&self) -> &str {
        self.task
            .rsplit_once('-')
            .map_or(self.task.as_str(), |(slot, _)| slot)
    }
}

/// The live processes whose marker satisfies `wanted`. Zombies are left out: a process that
/// ended and waits for its parent runs nothing.
pub(crate) fn processes_where(wanted: impl Fn(&str) -> bool) -> Vec<Marked> {
    let prefix = format!("{MARKER}=");
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found: Vec<Marked> = entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|environ| {
                environ.split(|byte| *byte == 0).any(|entry| {
                    entry
                        .strip_prefix(prefix.as_bytes())
                        .and_then(|marker| std::str::from_utf8(marker).ok())
                        .is_some_and(&wanted)
                })
            })
        })
        .filter(|pid| {
            // `State:` is `Z (zombie)` for a process that ended.
            std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|status| {
                !status
                    .lines()
                    .any(|line| line.starts_with("State:") && line.contains('Z'))
            })
        })
        .map(|pid| Marked {
            pid,
            task: std::fs::read_link(format!("/proc/{pid}/cwd"))
                .ok()
                .and_then(|cwd| Some(cwd.file_name()?.to_str()?.to_owned()))
                .unwrap_or_default(),
        })
        .collect();
    found.sort();
    found
}

/// The live processes marked `marker`.
pub(crate) fn processes_marked(marker: &str) -> Vec<Marked> {
    processes_where(|found| found == marker)
}

/// SIGKILLs every live process whose marker starts with `prefix` (a test's own directory):
/// the tasks a test leaves behind, whatever happened to their agents.
pub(crate) fn kill_marked_under(prefix: &str) {
    for process in processes_where(|marker| marker.starts_with(prefix)) {
        // SAFETY: kill takes two integers.
        unsafe {
            libc::kill(process.pid, libc::SIGKILL);
        }
    }
}

/// Sends `signal` to a child process.
pub(crate) fn signal_child(child: &Child, signal: libc::c_int) -> anyhow::Result<()> {
    let pid = child.id().context("the child has exited")?;
    let pid = libc::pid_t::try_from(pid)?;
    // SAFETY: kill takes two integers.
    if unsafe { libc::kill(pid, signal) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(())
}

/// Polls `check` every 50 ms until it answers `Ok`, failing after `limit` with what it last
/// said (`Err`).
pub(crate) async fn poll_within<T>(
    what: &str,
    limit: Duration,
    mut check: impl FnMut() -> Result<T, String>,
) -> anyhow::Result<T> {
    let deadline = Instant::now() + limit;
    loop {
        let last = match check() {
            Ok(found) => return Ok(found),
            Err(last) => last,
        };
        if Instant::now() > deadline {
            bail!("{what}: not within {limit:?}; last: {last}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Passes `result` on; if it is an error, first copies the `*.log` files of `dir` (the
/// children's stderr, see [`spawn_logged`]) to a directory that outlives the test, and prints
/// where, with the last lines of each. With `MUSTER_TEST_KEEP_LOGS` set, the logs are kept
/// (and where printed) whatever the result.
pub(crate) fn keep_logs_on_error<T>(
    test: &str,
    dir: &Path,
    result: anyhow::Result<T>,
) -> anyhow::Result<T> {
    let keep_anyway = std::env::var_os("MUSTER_TEST_KEEP_LOGS").is_some();
    let error = match result {
        Ok(value) if !keep_anyway => return Ok(value),
        Ok(value) => {
            let kept = copy_logs(test, dir);
            eprintln!("{test}: the binaries' logs are in {}", kept.display());
            return Ok(value);
        }
        Err(error) => error,
    };
    let kept = copy_logs(test, dir);
    eprintln!(
        "{test} failed; the binaries' logs are in {}",
        kept.display()
    );
    for log in logs_in(dir) {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(40)..];
        eprintln!("---- the last lines of {} ----", log.display());
        for line in tail {
            eprintln!("{line}");
        }
    }
    Err(error)
}

/// The `*.log` files in `dir`, by name.
fn logs_in(dir: &Path) -> Vec<PathBuf> {
    let mut logs: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|entry| entry.path())
                .filter(|path| path.extension().is_some_and(|ext| ext == "log"))
                .collect()
        })
        .unwrap_or_default();
    logs.sort();
    logs
}

/// Copies the logs of `dir` to a directory of the system's temporary directory named after
/// `test` and this process, which outlives the test; returns it.
fn copy_logs(test: &str, dir: &Path) -> PathBuf {
    let kept = std::env::temp_dir().join(format!("muster-{test}-{}", std::process::id()));
    if std::fs::create_dir_all(&kept).is_ok() {
        for log in logs_in(dir) {
            if let Some(name) = log.file_name() {
                let _ = std::fs::copy(&log, kept.join(name));
            }
        }
    }
    kept
}

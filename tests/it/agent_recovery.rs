//! Tasks stay owned across agent restarts, with real `muster-master` and `muster-agent`
//! processes on loopback, counting the task processes on the machine (by an environment marker
//! each task carries), not only what the master says:
//!
//! - an agent SIGKILLed and restarted within the master's deadline takes its tasks back: the
//!   service task keeps its id and its process, nothing replaces it, and a batch task that ended
//!   while the agent was down arrives with its real exit code; tasks run as uids of their own;
//! - an agent kept down past the master's deadline comes back to find its service task replaced
//!   on another agent: its old copy is killed, and one process is left;
//! - batch jobs submitted while their agent is SIGKILLed and restarted at the same address
//!   (launches in flight, queued for it, delivered to the new process) run each slot exactly
//!   once, counted from the tasks' own output.
//!
//! The binaries come from the same target directory as this test: `cargo test --workspace`
//! builds them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, ensure};
use common::{agent_command, master_command, spawn_listening};
use muster::proto::cluster as pb;
use muster::proto::model as model_pb;
use muster_security::TokenSecret;
use tokio::process::Child;
use tokio::time::Instant;

use crate::common;

const DEADLINE: Duration = common::DEADLINE;

/// The environment variable that marks a test's task processes (the one
/// [`common::marked_shell_job`] sets).
const MARKER: &str = common::MARKER;

/// A master, its agents and a management token.
struct Cluster {
    dir: PathBuf,
    master_address: String,
    master: Child,
    agents: Vec<Option<Child>>,
    token: TokenSecret,
}

impl Cluster {
    /// One master with `master_flags`, and no agents yet.
    async fn start(dir: &Path, master_flags: &[&str]) -> anyhow::Result<Cluster> {
        let master_address = common::free_port_on("127.0.0.1").await?;
        let mut command = master_command(1, &master_address, &dir.join("master"))?;
        command.args(["--id", "1"]).args(master_flags);
        let master = spawn_listening(command, "master").await?;
        let token = muster_master::testing::bootstrap(&master_address).await?;
        Ok(Cluster {
            dir: dir.to_owned(),
            master_address,
            master,
            agents: Vec::new(),
            token,
        })
    }

    /// Starts agent `n` (again: same data directory, same name), reporting `rack=<rack>`.
    async fn start_agent(&mut self, n: usize, rack: &str) -> anyhow::Result<()> {
        self.start_agent_at(n, rack, "127.0.0.1:0").await
    }

    /// As [`start_agent`](Self::start_agent), listening on `listen`: an agent restarted at
    /// its old address is where what its link queued for it goes.
    async fn start_agent_at(&mut self, n: usize, rack: &str, listen: &str) -> anyhow::Result<()> {
        let masters = [self.master_address.clone()];
        let mut command = agent_command(&self.dir, n, "127.0.0.1", &masters)?;
        command
            .args(["--listen", listen])
            .args(["--cpus", "2", "--mem-mb", "2048"])
            .arg("--attribute")
            .arg(format!("rack={rack}"));
        let child = spawn_listening(command, &format!("agent {n}")).await?;
        if self.agents.len() <= n {
            self.agents.resize_with(n + 1, || None);
        }
        self.agents[n] = Some(child);
        Ok(())
    }

    /// SIGKILLs agent `n` and waits for it to be gone.
    async fn kill_agent(&mut self, n: usize) -> anyhow::Result<()> {
        let mut child = self.agents[n].take().context("agent not running")?;
        child.start_kill()?;
        child.wait().await?;
        Ok(())
    }

    /// Submits `job` (see [`common::submit`]).
    async fn submit(&self, job: model_pb::Job) -> anyhow::Result<()> {
        common::submit(&self.master_address, &self.token, job).await
    }

    /// The master's state once `done` holds.
    async fn state_when(
        &self,
        what: &str,
        done: impl Fn(&pb::ClusterState) -> bool,
    ) -> anyhow::Result<pb::ClusterState> {
        // A linearizable read: only the leader answers it.
        let masters = [self.master_address.clone()];
        let (_, state) = common::leader_state_when(&masters, &self.token, what, done).await?;
        Ok(state)
    }

    /// Stops everything; the tasks go with their marker's processes.
    async fn shutdown(mut self, markers: &[&str]) {
        for child in self.agents.iter_mut().flatten() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
        let _ = self.master.start_kill();
        let _ = self.master.wait().await;
        for marker in markers {
            for pid in processes_marked(marker) {
                // SAFETY: kill takes two integers.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
    }
}

/// A job of one group of one task running `script` under `sh -c` (64 MiB, see
/// [`common::marked_shell_job`]), on agents with `rack=<rack>` if given, its processes marked
/// with `marker`.
fn job(
    name: &str,
    scheduler: model_pb::SchedulerType,
    script: &str,
    marker: &str,
    rack: Option<&str>,
) -> model_pb::Job {
    let mut job = common::marked_shell_job(name, scheduler, 1, 64, script, marker);
    job.groups[0].constraints = rack
        .map(|rack| model_pb::Constraint {
            attribute: "rack".into(),
            op: model_pb::ConstraintOp::Equal as i32,
            value: rack.into(),
        })
        .into_iter()
        .collect();
    job
}

/// The live processes on this machine whose environment holds `MARKER=<marker>`.
fn processes_marked(marker: &str) -> Vec<i32> {
    let wanted = format!("{MARKER}={marker}");
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|environ| {
                environ
                    .split(|byte| *byte == 0)
                    .any(|entry| entry == wanted.as_bytes())
            })
        })
        .collect()
}

/// Waits until exactly `count` processes carry `marker`; returns them.
async fn marked_become(marker: &str, count: usize, what: &str) -> anyhow::Result<Vec<i32>> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let found = processes_marked(marker);
        if found.len() == count {
            return Ok(found);
        }
        ensure!(
            Instant::now() < deadline,
            "{what}: {} processes marked {marker}, not {count}: {found:?}",
            found.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The running (non-terminal) tasks of `job` on any agent, with their agent's id.
fn running_of<'a>(state: &'a pb::ClusterState, job: &str) -> Vec<(&'a str, &'a model_pb::Task)> {
    state
        .agents
        .iter()
        .flat_map(|a| a.tasks.iter().map(move |t| (a.id.as_str(), t)))
        .filter(|(_, t)| t.job == job && t.state == model_pb::TaskState::Running as i32)
        .collect()
}

/// The agent id whose hostname-independent rack is `rack`.
fn agent_on(state: &pb::ClusterState, rack: &str) -> Option<String> {
    state
        .agents
        .iter()
        .find(|a| {
            a.info
                .as_ref()
                .is_some_and(|i| i.attributes.get("rack").map(String::as_str) == Some(rack))
        })
        .map(|a| a.id.clone())
}

/// The uid a process runs as (the real uid in `/proc/<pid>/status`).
fn uid_of(pid: i32) -> anyhow::Result<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().next())
        .and_then(|uid| uid.parse().ok())
        .context("no Uid line")
}

fn nobody_uid() -> Option<u32> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        (fields.next() == Some("nobody"))
            .then(|| fields.nth(1)?.parse().ok())
            .flatten()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_agent_takes_its_tasks_back_and_reports_what_ended_meanwhile()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut cluster = Cluster::start(dir.path(), &[]).await?;
    cluster.start_agent(0, "a").await?;
    cluster.start_agent(1, "b").await?;
    cluster
        .state_when("two agents", |s| s.agents.len() == 2)
        .await?;

    let service_marker = format!("{}/service", dir.path().display());
    let batch_marker = format!("{}/batch", dir.path().display());
    let release = dir.path().join("release");
    cluster
        .submit(job(
            "web",
            model_pb::SchedulerType::Service,
            "exec sleep 600",
            &service_marker,
            Some("a"),
        ))
        .await?;
    let batch_script = format!(
        "while [ ! -e {} ]; do sleep 0.02; done; exit 3",
        release.display()
    );
    cluster
        .submit(job(
            "once",
            model_pb::SchedulerType::Batch,
            &batch_script,
            &batch_marker,
            Some("a"),
        ))
        .await?;
    let state = cluster
        .state_when("both tasks running", |s| {
            running_of(s, "web").len() == 1 && running_of(s, "once").len() == 1
        })
        .await?;
    let agent_a = agent_on(&state, "a").context("agent a")?;
    let (on, web) = running_of(&state, "web")[0];
    assert_eq!(on, agent_a);
    let (web_id, batch_id) = (web.id.clone(), running_of(&state, "once")[0].1.id.clone());
    let service_pids = marked_become(&service_marker, 1, "the service task runs").await?;
    marked_become(&batch_marker, 1, "the batch task runs").await?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let uid = uid_of(service_pids[0])?;
        ensure!(
            muster_agent::DEFAULT_TASK_UID_RANGE.contains(uid) && Some(uid) != nobody_uid(),
            "a root agent's task runs as {uid}, not a uid of its own from {}",
            muster_agent::DEFAULT_TASK_UID_RANGE
        );
    }

    cluster.kill_agent(0).await?;
    // The service task outlives its agent; the batch task ends while no agent runs.
    assert_eq!(processes_marked(&service_marker), service_pids);
    std::fs::write(&release, "")?;
    marked_become(&batch_marker, 0, "the batch task ends").await?;

    cluster.start_agent(0, "a").await?;
    let state = cluster
        .state_when("the batch task's real end", |s| {
            s.agents.iter().any(|a| {
                a.id == agent_a && a.connected && a.completed_tasks.iter().any(|t| t.id == batch_id)
            })
        })
        .await?;
    let agent = state
        .agents
        .iter()
        .find(|a| a.id == agent_a)
        .context("agent a")?;
    let batch = agent
        .completed_tasks
        .iter()
        .find(|t| t.id == batch_id)
        .context("batch task")?;
    assert_eq!(
        (batch.state, batch.exit_code),
        (model_pb::TaskState::Failed as i32, 3),
        "{batch:?}"
    );
    let web: Vec<_> = running_of(&state, "web");
    assert_eq!(web.len(), 1, "one service task: {web:?}");
    assert_eq!(
        (web[0].0, web[0].1.id.as_str()),
        (agent_a.as_str(), web_id.as_str())
    );
    // Same process, none beside it, and still so a moment on (no replacement was started).
    assert_eq!(processes_marked(&service_marker), service_pids);
    let settled = cluster
        .state_when("evaluations settled", |s| !s.recovering)
        .await?;
    assert_eq!(running_of(&settled, "web").len(), 1);
    assert_eq!(processes_marked(&service_marker), service_pids);
    cluster.shutdown(&[&service_marker, &batch_marker]).await;
    Ok(())
}

/// An agent back after it was marked unreachable, under a job whose `disconnect.reconcile` is
/// `keep_replacement`: its copy, replaced meanwhile, is killed, and the replacement runs on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_back_after_its_deadline_kills_the_copies_that_were_replaced() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    // Agents are lost two seconds after their last heartbeat.
    let mut cluster = Cluster::start(
        dir.path(),
        &["--heartbeat-min-ttl", "1s", "--heartbeat-grace", "1s"],
    )
    .await?;
    cluster.start_agent(0, "a").await?;
    cluster
        .state_when("agent a", |s| s.agents.len() == 1)
        .await?;
    let marker = format!("{}/web", dir.path().display());
    let mut web = job(
        "web",
        model_pb::SchedulerType::Service,
        "exec sleep 600",
        &marker,
        None,
    );
    for group in &mut web.groups {
        group.disconnect = Some(model_pb::Disconnect {
            reconcile: model_pb::Reconcile::KeepReplacement as i32,
            ..model_pb::Disconnect::default()
        });
    }
    cluster.submit(web).await?;
    let state = cluster
        .state_when("the task on agent a", |s| running_of(s, "web").len() == 1)
        .await?;
    let agent_a = agent_on(&state, "a").context("agent a")?;
    let old = marked_become(&marker, 1, "the first copy runs").await?;

    cluster.start_agent(1, "b").await?;
    cluster
        .state_when("agent b", |s| s.agents.len() == 2)
        .await?;
    cluster.kill_agent(0).await?;
    let state = cluster
        .state_when("the task replaced on agent b", |s| {
            s.unreachable.iter().any(|u| u.id == agent_a)
                && running_of(s, "web").iter().any(|(on, _)| *on != agent_a)
        })
        .await?;
    let (_, replacement) = running_of(&state, "web")
        .into_iter()
        .find(|(on, _)| *on != agent_a)
        .context("replacement")?;
    let replacement_id = replacement.id.clone();
    // The old copy still runs, untracked, while its agent is down: two processes.
    let both = marked_become(&marker, 2, "the replacement beside the old copy").await?;
    assert!(old.iter().all(|pid| both.contains(pid)));

    cluster.start_agent(0, "a").await?;
    let left = marked_become(&marker, 1, "the old copy killed by its returning agent").await?;
    assert!(!left.contains(&old[0]), "the old copy is the one killed");
    let state = cluster
        .state_when("agent a back with no task running", |s| {
            s.agents.iter().any(|a| {
                a.id == agent_a
                    && a.connected
                    && a.tasks
                        .iter()
                        .all(|t| t.state != model_pb::TaskState::Running as i32)
            })
        })
        .await?;
    let web = running_of(&state, "web");
    assert_eq!(web.len(), 1, "{web:?}");
    assert_eq!(web[0].1.id, replacement_id);
    assert_eq!(processes_marked(&marker), left);
    cluster.shutdown(&[&marker]).await;
    Ok(())
}

/// The task id a process works for: its working directory is `.../tasks/<task id>`.
fn task_of(pid: i32) -> Option<String> {
    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok()?;
    Some(cwd.file_name()?.to_str()?.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seven_agent_kills_leave_a_service_job_at_its_count_with_every_process_tracked()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut cluster = Cluster::start(
        dir.path(),
        &["--heartbeat-min-ttl", "1s", "--heartbeat-grace", "1s"],
    )
    .await?;
    for n in 0..3 {
        cluster.start_agent(n, &format!("r{n}")).await?;
    }
    cluster
        .state_when("three agents", |s| s.agents.len() == 3)
        .await?;
    let marker = format!("{}/web", dir.path().display());
    let mut web = job(
        "web",
        model_pb::SchedulerType::Service,
        "exec sleep 600",
        &marker,
        None,
    );
    web.groups[0].count = 2;
    cluster.submit(web).await?;
    cluster
        .state_when("two copies", |s| running_of(s, "web").len() == 2)
        .await?;

    for round in 0..7 {
        let n = round % 3;
        let before = cluster
            .state_when(&format!("round {round}: all agents connected"), |s| {
                s.agents.len() == 3 && s.agents.iter().all(|a| a.connected)
            })
            .await?;
        let rack = format!("r{n}");
        let id = agent_on(&before, &rack).context("the agent to kill")?;
        cluster.kill_agent(n).await?;
        if round % 2 == 1 {
            // Past the master's deadline: its tasks are replaced before it comes back.
            cluster
                .state_when(&format!("round {round}: {id} unreachable"), |s| {
                    s.unreachable.iter().any(|u| u.id == id)
                })
                .await?;
        }
        cluster.start_agent(n, &rack).await?;
    }

    // Settled: two copies on the master, two processes on the machine, and the same tasks.
    let deadline = Instant::now() + DEADLINE;
    loop {
        let state = cluster
            .state_when("agents connected", |s| {
                s.agents.iter().filter(|a| a.connected).count() == 3
            })
            .await?;
        let mut tracked: Vec<String> = running_of(&state, "web")
            .iter()
            .map(|(_, t)| t.id.clone())
            .collect();
        let mut running: Vec<String> = processes_marked(&marker)
            .into_iter()
            .filter_map(task_of)
            .collect();
        tracked.sort();
        running.sort();
        if tracked.len() == 2 && tracked == running {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the master tracks {tracked:?}, the machine runs {running:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.shutdown(&[&marker]).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_tasks_launched_around_agent_restarts_run_each_slot_exactly_once()
-> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;

    const SLOTS: u32 = 6;
    const ROUNDS: usize = 4;
    let dir = tempfile::tempdir()?;
    // Where each run appends its task id, one file per slot; the tasks run as uids of their
    // own, so it and the files each makes (umask 0) are open to all: a slot's second run can
    // append to its first's file.
    let runs = tempfile::Builder::new()
        .prefix("muster-runs")
        .tempdir_in("/tmp")?;
    std::fs::set_permissions(runs.path(), std::fs::Permissions::from_mode(0o777))?;
    let mut cluster = Cluster::start(dir.path(), &[]).await?;
    let address = common::free_ports(1).await?.remove(0);
    cluster.start_agent_at(0, "r0", &address).await?;
    cluster
        .state_when("the agent", |s| s.agents.iter().any(|a| a.connected))
        .await?;
    let marker = format!("{}/once", dir.path().display());
    let script = format!(
        "umask 0; t=${{PWD##*/}}; echo \"$t\" >> '{}'/\"${{t%-*}}\"",
        runs.path().display()
    );
    for round in 0..ROUNDS {
        let mut batch = job(
            &format!("once-{round}"),
            model_pb::SchedulerType::Batch,
            &script,
            &marker,
            None,
        );
        batch.groups[0].count = SLOTS;
        cluster.submit(batch).await?;
        // Its launches are on the way, queued for the agent, or about to be: the agent dies
        // and comes back at the same address.
        cluster.kill_agent(0).await?;
        cluster.start_agent_at(0, "r0", &address).await?;
    }

    // The master has every slot finished...
    cluster
        .state_when("every slot of every job finished", |s| {
            (0..ROUNDS).all(|round| {
                let job = format!("once-{round}");
                let mut slots: Vec<&str> = s
                    .agents
                    .iter()
                    .flat_map(|a| a.completed_tasks.iter())
                    .filter(|t| t.job == job && t.state == model_pb::TaskState::Finished as i32)
                    .map(|t| t.name.as_str())
                    .collect();
                slots.sort_unstable();
                slots.dedup();
                let live = s
                    .agents
                    .iter()
                    .flat_map(|a| a.tasks.iter())
                    .any(|t| t.job == job);
                slots.len() == SLOTS as usize && !live
            })
        })
        .await?;
    // ...and each ran once: one line in each slot's file, none missing.
    for round in 0..ROUNDS {
        for slot in 0..SLOTS {
            let name = format!("once-{round}.main[{slot}]");
            let ran = std::fs::read_to_string(runs.path().join(&name))
                .with_context(|| format!("{name} never ran"))?;
            let times = ran.lines().count();
            ensure!(times == 1, "{name} ran {times} times: {ran:?}");
        }
    }
    cluster.shutdown(&[&marker]).await;
    Ok(())
}

//! Clusters whose agents and masters reach each other through links the test cuts, each
//! process on its own loopback address: this file holds the harness ([`Linked`]), the cases
//! are in `run_once`.
//!
//! Every connection between an agent and a master crosses a link of `Partitions` (a TCP proxy
//! the test cuts and heals), whichever of them dials:
//!
//! - agent `a` is given, for master `m`, the link `a → m` (`--master`): the connections it
//!   opens to the masters, which carry all it sends of its own (registrations, heartbeats, task
//!   status) and the masters' answers to its asks;
//! - every master is named in every `--peer` list by the link `ADVERTISED → m`: the address the
//!   masters reach each other at (raft), and the one they give agents (a standby's leader hint,
//!   a new leader's announcement), so that an agent that follows a hint or an announcement is
//!   still behind a link the test controls;
//! - agent `a` listens on an address of its own host and is named by the link `ANY_MASTER → a`
//!   (`--advertise`), which forwards there: the connections the masters open to it, which carry
//!   all a master sends of its own (registration answers, launches, kills, announcements) and
//!   the agent's answers to its asks. Every master dials an agent at the one address it
//!   advertises, so that link is shared by all the masters: it cannot be cut for one master
//!   alone.
//!
//! Cutting the leader from the agents ([`Linked::cut_from_agents`]) cuts `a → leader` and
//! `ANY_MASTER → a` for every agent, and `ADVERTISED → leader`: nothing passes between the
//! leader and any agent, either way. The standbys then cannot dial the leader either (they
//! only would to ask for votes; the leader's own connections to them, which carry raft, stay
//! up), nor reach any agent (the agents can still reach them). Cutting only what the agents
//! send the leader ([`Linked::cut_agents_to`]) leaves `ANY_MASTER → a` up: the leader's
//! launches, kills and announcements still reach the agents, while nothing the agents send of
//! their own reaches the leader.

mod run_once;

use super::*;

/// How long the tests watch that something stays so: three rounds of the convergence check,
/// which they have run every second.
const CHECKS: Duration = Duration::from_secs(3);

/// The partition member that dials a master at its advertised address (see above).
const ADVERTISED: Member = 100;

/// The partition member that dials an agent at its advertised address: any master (see
/// above).
const ANY_MASTER: Member = 101;

/// Master `index`'s partition member.
fn master_member(index: usize) -> Member {
    index as Member + 1
}

/// Agent `n`'s partition member.
fn agent_member(n: usize) -> Member {
    n as Member + 11
}

/// Master `index`'s loopback host.
fn master_host(index: usize) -> String {
    format!("127.0.0.{}", 11 + index)
}

/// Agent `n`'s loopback host.
fn agent_host(n: usize) -> String {
    format!("127.0.0.{}", 21 + n)
}

/// Masters and agents as separate processes, each on its own loopback host, every connection
/// between an agent and a master through `partitions`; a directory (`runs`) the tasks (which
/// run as `nobody` under a root agent) can write to; the logs of every child in `dir`.
struct Linked {
    dir: tempfile::TempDir,
    runs: tempfile::TempDir,
    partitions: Partitions,
    masters: Masters,
    agents: Vec<Option<Child>>,
    /// Each agent's `--master` addresses: its links to the masters.
    agent_links: Vec<Vec<String>>,
    /// Where each agent listens, and its link `ANY_MASTER → agent` (`--advertise`).
    agent_addresses: Vec<Option<AgentAddress>>,
    token: TokenSecret,
}

/// Where an agent listens (a port of its host chosen before its first start, the same at a
/// restart), and the address it advertises: its link `ANY_MASTER → agent`, which forwards
/// there.
struct AgentAddress {
    listen: String,
    advertised: String,
}

impl Linked {
    /// `masters` masters with `master_flags` (each a peer of the others through the
    /// `ADVERTISED` links), bootstrapped, and no agent yet.
    async fn start(masters: usize, master_flags: &[&str]) -> anyhow::Result<Linked> {
        use std::os::unix::fs::PermissionsExt as _;

        let dir = tempfile::tempdir()?;
        let runs = tempfile::Builder::new()
            .prefix("muster-runs")
            .tempdir_in("/tmp")?;
        std::fs::set_permissions(runs.path(), std::fs::Permissions::from_mode(0o777))?;
        let partitions = Partitions::new();
        let hosts: Vec<String> = (0..masters).map(master_host).collect();
        let hosts: Vec<&str> = hosts.iter().map(String::as_str).collect();
        let mut group = Masters::on_hosts(dir.path(), &hosts).await?;
        for index in 0..masters {
            group.advertised[index] = partitions
                .link(
                    ADVERTISED,
                    master_member(index),
                    &master_host(index),
                    group.addresses[index].clone(),
                )
                .await?;
        }
        for index in 0..masters {
            group.start_with(index, master_flags).await?;
        }
        let token = muster_master::testing::bootstrap(&group.addresses[0]).await?;
        Ok(Linked {
            dir,
            runs,
            partitions,
            masters: group,
            agents: Vec::new(),
            agent_links: Vec::new(),
            agent_addresses: Vec::new(),
            token,
        })
    }

    /// Runs `body` on three masters started with `master_flags` (see [`Linked::start`]), then
    /// stops everything and passes its result on, with the children's logs (kept under the name
    /// `test`) if it is an error (see [`Linked::finish`]).
    async fn run(
        test: &str,
        master_flags: &[&str],
        body: impl AsyncFnOnce(&mut Linked) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let mut cluster = Linked::start(3, master_flags).await?;
        let result = body(&mut cluster).await;
        cluster.finish(test, result).await
    }

    /// Starts agents `0..count` (see [`Linked::start_agent`]) and returns the leading
    /// master's index once all of them are connected to it.
    async fn start_agents(&mut self, count: usize) -> anyhow::Result<usize> {
        for n in 0..count {
            self.start_agent(n).await?;
        }
        let (leader, _) = self
            .leader_when(&format!("{count} agents registered"), |s| {
                connected(s) == count
            })
            .await?;
        Ok(leader)
    }

    /// Starts agent `n` on its own host, reaching each master through its link `n → master`
    /// and reached by every master through its link `ANY_MASTER → n`, reporting `name=a<n>`.
    async fn start_agent(&mut self, n: usize) -> anyhow::Result<()> {
        if self.agent_links.len() <= n {
            self.agent_links.resize_with(n + 1, Vec::new);
            self.agent_addresses.resize_with(n + 1, || None);
            self.agents.resize_with(n + 1, || None);
        }
        if self.agent_addresses[n].is_none() {
            // The link must know where to forward before the agent starts and names itself
            // by the link: so the agent listens on a port chosen here.
            let listen = common::free_port_on(&agent_host(n)).await?;
            let advertised = self
                .partitions
                .link(ANY_MASTER, agent_member(n), &agent_host(n), listen.clone())
                .await?;
            self.agent_addresses[n] = Some(AgentAddress { listen, advertised });
        }
        let address = self.agent_addresses[n]
            .as_ref()
            .context("the agent's addresses")?;
        if self.agent_links[n].is_empty() {
            for (index, address) in self.masters.addresses.iter().enumerate() {
                let link = self
                    .partitions
                    .link(
                        agent_member(n),
                        master_member(index),
                        &master_host(index),
                        address.clone(),
                    )
                    .await?;
                self.agent_links[n].push(link);
            }
        }
        let mut command = agent_command(self.dir.path(), n, &agent_host(n), &self.agent_links[n])?;
        command
            .args(["--listen", &address.listen])
            .args(["--advertise", &address.advertised])
            // Not the default (the --listen port plus 10), which may not be free.
            .args(["--http-listen", &format!("{}:0", agent_host(n))])
            .args(["--hostname", &format!("host-{n}")])
            .args(["--cpus", "2", "--mem-mb", "2048"])
            .args(["--attribute", &format!("name=a{n}")])
            .arg("--stop-tasks-on-exit");
        let log = self.dir.path().join(format!("agent-{n}.log"));
        let child = common::spawn_logged(command, &format!("agent {n}"), &log).await?;
        self.agents[n] = Some(child);
        Ok(())
    }

    /// The leading master's index and state once `done` holds there.
    async fn leader_when(
        &self,
        what: &str,
        done: impl Fn(&pb::ClusterState) -> bool,
    ) -> anyhow::Result<(usize, pb::ClusterState)> {
        leader_state_when(&self.masters.addresses, &self.token, what, done).await
    }

    /// The leading master's index and state, and the processes of the service job `job` by
    /// slot, once `done` holds there and `job` has settled at `count` slots (see
    /// [`service_settled`]).
    async fn leader_when_settled(
        &self,
        what: &str,
        job: &str,
        count: u32,
        done: impl Fn(&pb::ClusterState) -> bool,
    ) -> anyhow::Result<(usize, pb::ClusterState, BTreeMap<String, i32>)> {
        let marker = self.marker(job);
        let count = count as usize;
        let (leader, state) = self
            .leader_when(what, |s| {
                done(s) && service_settled(s, job, &marker, count).is_ok()
            })
            .await?;
        let settled = service_settled(&state, job, &marker, count).map_err(anyhow::Error::msg)?;
        Ok((leader, state, settled))
    }

    /// Watches master `index` for [`CHECKS`] (see [`Linked::stays_so`]): the service job `job`
    /// stays settled (see [`service_settled`]) with each of its slots run by the same process
    /// as in `expected`, and each of the batch slots `ran_once` recorded exactly one run.
    async fn service_stays(
        &self,
        index: usize,
        what: &str,
        job: &str,
        expected: &BTreeMap<String, i32>,
        ran_once: &[String],
    ) -> anyhow::Result<()> {
        let marker = self.marker(job);
        self.stays_so(index, what, CHECKS, |state| {
            let now = service_settled(state, job, &marker, expected.len())?;
            if now != *expected {
                return Err(format!(
                    "the {job} processes went from {expected:?} to {now:?}"
                ));
            }
            each_ran_once(self, ran_once)
        })
        .await
    }

    /// Submits `job` to master `index` (the leader, directly: operators are not behind links).
    /// Again while it answers UNAVAILABLE (see [`common::submit`]).
    async fn submit(&self, index: usize, job: model_pb::Job) -> anyhow::Result<()> {
        common::submit(&self.masters.addresses[index], &self.token, job).await
    }

    /// Cuts master `index` from every agent started so far, both ways: what the agents send
    /// it (their links to it, and whoever dials it at its advertised address: agents that
    /// followed a hint or an announcement, the standbys) and what it sends them (the agents'
    /// links `ANY_MASTER → agent`, which the standbys' connections to the agents cross too:
    /// they are cut from the agents as well, though the agents still reach them).
    fn cut_from_agents(&self, index: usize) {
        self.cut_agents_to(index);
        for n in 0..self.agent_addresses.len() {
            self.partitions.cut(ANY_MASTER, agent_member(n));
        }
    }

    /// Cuts what every agent started so far sends master `index` (their links to it, and
    /// whoever dials it at its advertised address: agents that followed a hint or an
    /// announcement, the standbys); what it sends them still reaches them.
    fn cut_agents_to(&self, index: usize) {
        for n in 0..self.agent_links.len() {
            self.partitions.cut(agent_member(n), master_member(index));
        }
        self.partitions.cut(ADVERTISED, master_member(index));
    }

    /// Waits until at least `count` connections are held silent by the cuts.
    async fn held_at_least(&self, count: usize) -> anyhow::Result<()> {
        tokio::time::timeout(DEADLINE, self.partitions.held_at_least(count))
            .await
            .with_context(|| format!("{count} connections held by the cut"))
    }

    /// SIGKILLs master `index` and waits for it to be gone.
    async fn kill_master(&mut self, index: usize) -> anyhow::Result<()> {
        let mut child = self.masters.children[index]
            .take()
            .context("the master is not running")?;
        child.start_kill()?;
        child.wait().await?;
        Ok(())
    }

    /// Reads master `index`'s state every 100 ms for `window`, each answer while it leads
    /// checked by `check`: an observation that something stays so while the leader's periodic
    /// checks get their turns. A read that fails (a leader that could not confirm its
    /// leadership in time on a loaded machine) is skipped; at least one must succeed.
    async fn stays_so(
        &self,
        index: usize,
        what: &str,
        window: Duration,
        check: impl Fn(&pb::ClusterState) -> Result<(), String>,
    ) -> anyhow::Result<()> {
        let address = &self.masters.addresses[index];
        let end = Instant::now() + window;
        let mut checked = 0;
        let mut failed = String::new();
        while Instant::now() < end {
            let read = match muster_master::testing::operator(address, Some(&self.token)).await {
                Ok(mut client) => client
                    .get_state(pb::GetStateRequest::default())
                    .await
                    .map(tonic::Response::into_inner)
                    .map_err(|status| status.to_string()),
                Err(error) => Err(format!("{error:#}")),
            };
            match read {
                Ok(state) if state.is_leader => {
                    check(&state).map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
                    checked += 1;
                }
                Ok(_) => failed = format!("master {index} no longer leads"),
                Err(error) => failed = error,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        ensure!(
            checked > 0,
            "{what}: no read of master {index}'s state in {window:?}; the last: {failed}"
        );
        Ok(())
    }

    /// The marker of `job`'s processes.
    fn marker(&self, job: &str) -> String {
        format!("{}/{job}", self.dir.path().display())
    }

    /// The runs recorded by the tasks of the slot `slot` (see [`recording`]).
    fn runs_of(&self, slot: &str) -> Vec<String> {
        std::fs::read_to_string(self.runs.path().join(slot))
            .map(|text| text.lines().map(str::to_owned).collect())
            .unwrap_or_default()
    }

    /// A shell script that records its run (its task id, appended to `<runs>/<slot>`) and
    /// then runs `then`.
    fn recording(&self, then: &str) -> String {
        format!(
            "t=${{PWD##*/}}; echo \"$t\" >> '{}'/\"${{t%-*}}\"; {then}",
            self.runs.path().display()
        )
    }

    /// A script that waits for the file `<runs>/<name>`.
    fn wait_for_file(&self, name: &str) -> String {
        format!(
            "while [ ! -e '{}/{name}' ]; do sleep 0.05; done",
            self.runs.path().display()
        )
    }

    /// Creates `<runs>/<name>`.
    fn create_file(&self, name: &str) -> anyhow::Result<()> {
        std::fs::write(self.runs.path().join(name), "")?;
        Ok(())
    }

    /// A job of one group `main` of `count` tasks running `script` under `sh -c`, marked
    /// (32 MiB each, see [`common::marked_shell_job`]).
    fn job(
        &self,
        name: &str,
        scheduler: model_pb::SchedulerType,
        count: u32,
        script: &str,
    ) -> model_pb::Job {
        common::marked_shell_job(name, scheduler, count, 32, script, &self.marker(name))
    }

    /// A service job of `count` slots, each run by one process (`exec sleep 600`).
    fn sleeping_service(&self, name: &str, count: u32) -> model_pb::Job {
        self.job(
            name,
            model_pb::SchedulerType::Service,
            count,
            "exec sleep 600",
        )
    }

    /// A batch job of `count` tasks, each of which records its run (see [`Linked::recording`])
    /// and exits 0.
    fn recorded_batch(&self, name: &str, count: u32) -> model_pb::Job {
        self.job(
            name,
            model_pb::SchedulerType::Batch,
            count,
            &self.recording("exit 0"),
        )
    }

    /// Submits to master `index` the service job `web` and then the batch job `once`, of
    /// `count` slots each (see [`Linked::sleeping_service`] and [`Linked::recorded_batch`]).
    async fn submit_web_and_once(&self, index: usize, count: u32) -> anyhow::Result<()> {
        self.submit(index, self.sleeping_service("web", count))
            .await?;
        self.submit(index, self.recorded_batch("once", count)).await
    }

    /// Stops everything (agents first, with their tasks), and passes `result` on, with the
    /// children's logs if it is an error.
    async fn finish(mut self, test: &str, result: anyhow::Result<()>) -> anyhow::Result<()> {
        let agents = self.agents.iter_mut().flatten();
        for child in agents.chain(self.masters.children.iter_mut().flatten()) {
            // A stopped agent (SIGSTOP) must be able to take the SIGTERM.
            let _ = common::signal_child(child, libc::SIGCONT);
            if let Err(error) = terminate(child).await {
                eprintln!("{test}: stopping a child: {error:#}");
            }
        }
        common::kill_marked_under(&format!("{}/", self.dir.path().display()));
        common::keep_logs_on_error(test, self.dir.path(), result)
    }
}

impl Drop for Linked {
    fn drop(&mut self) {
        // The agents are SIGKILLed on drop: their tasks would outlive them.
        common::kill_marked_under(&format!("{}/", self.dir.path().display()));
    }
}

fn is(task: &model_pb::Task, state: model_pb::TaskState) -> bool {
    task.state == state as i32
}

/// The tasks of `job` the master has in `state`, live or completed, with their agents' ids.
fn tasks_in<'a>(
    state: &'a pb::ClusterState,
    job: &str,
    wanted: model_pb::TaskState,
) -> Vec<(&'a str, &'a model_pb::Task)> {
    state
        .agents
        .iter()
        .flat_map(|a| {
            a.tasks
                .iter()
                .chain(&a.completed_tasks)
                .map(move |t| (a.id.as_str(), t))
        })
        .filter(|(_, t)| t.job == job && is(t, wanted))
        .collect()
}

/// The slots of `job` with a task that finished.
fn finished_slots(state: &pb::ClusterState, job: &str) -> BTreeSet<String> {
    tasks_in(state, job, model_pb::TaskState::Finished)
        .into_iter()
        .map(|(_, t)| t.name.clone())
        .collect()
}

/// The tasks of `job` the master counts live (not ended), by id.
fn live_tasks(state: &pb::ClusterState, job: &str) -> BTreeSet<String> {
    state
        .agents
        .iter()
        .flat_map(|a| &a.tasks)
        .filter(|t| t.job == job)
        .map(|t| t.id.clone())
        .collect()
}

/// Whether each of the `count` slots of the batch job `job` has a task that finished, and
/// none of its tasks is live.
fn batch_finished(state: &pb::ClusterState, job: &str, count: u32) -> bool {
    finished_slots(state, job).len() == count as usize && live_tasks(state, job).is_empty()
}

/// The number of agents connected.
fn connected(state: &pb::ClusterState) -> usize {
    state.agents.iter().filter(|a| a.connected).count()
}

/// The agent whose `name` attribute is `name`.
fn agent_named<'a>(state: &'a pb::ClusterState, name: &str) -> Option<&'a pb::AgentState> {
    state.agents.iter().find(|a| {
        a.info
            .as_ref()
            .is_some_and(|i| i.attributes.get("name").map(String::as_str) == Some(name))
    })
}

/// The processes of a job on this machine, one entry per slot: the pids of each.
fn pids_by_slot(processes: &[common::Marked]) -> BTreeMap<String, Vec<i32>> {
    let mut slots: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    for process in processes {
        slots
            .entry(process.slot().to_owned())
            .or_default()
            .push(process.pid);
    }
    slots
}

/// A service job's processes, each of its `count` slots run by one process (`exec sleep`), and
/// the master's running tasks of it being those processes' tasks: the slots and their pids.
fn service_settled(
    state: &pb::ClusterState,
    job: &str,
    marker: &str,
    count: usize,
) -> Result<BTreeMap<String, i32>, String> {
    let processes = common::processes_marked(marker);
    let slots = pids_by_slot(&processes);
    let tasks: BTreeSet<String> = processes.iter().map(|p| p.task.clone()).collect();
    let running: BTreeSet<String> = tasks_in(state, job, model_pb::TaskState::Running)
        .into_iter()
        .map(|(_, t)| t.id.clone())
        .collect();
    let one_each = slots.len() == count && slots.values().all(|pids| pids.len() == 1);
    if !one_each || tasks != running || live_tasks(state, job) != running {
        return Err(format!(
            "{job}: processes by slot {slots:?}, their tasks {tasks:?}; the master runs \
             {running:?} and counts live {:?}",
            live_tasks(state, job)
        ));
    }
    Ok(slots
        .into_iter()
        .map(|(slot, pids)| (slot, pids[0]))
        .collect())
}

/// Each of `slots` recorded exactly one run: a task of it started once. Else every slot that
/// did not, with its runs (the task ids).
fn each_ran_once(cluster: &Linked, slots: &[String]) -> Result<(), String> {
    let wrong: Vec<String> = slots
        .iter()
        .filter_map(|slot| {
            let runs = cluster.runs_of(slot);
            (runs.len() != 1).then(|| format!("{slot} ran {} times {runs:?}", runs.len()))
        })
        .collect();
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

/// The slot names of a one-group (`main`) job of `count` tasks.
fn slots_of(job: &str, count: u32) -> Vec<String> {
    (0..count).map(|n| format!("{job}.main[{n}]")).collect()
}

/// Master flags of the cut-and-heal test: agents are lost two seconds after their last
/// heartbeat, and the leader checks every second that jobs run what they ask for.
const QUICK_HEARTBEATS: &[&str] = &[
    "--heartbeat-min-ttl",
    "1s",
    "--heartbeat-grace",
    "1s",
    "--reconcile-interval",
    "1s",
];

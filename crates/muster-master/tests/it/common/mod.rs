//! What the master's integration-test modules share: a master's settings and starting one (again,
//! on the port and store of one just stopped), real agents and nodes where a test plays an agent,
//! reading the cluster state until a wait is over, and the checks for tools a test needs.
//!
//! Every master and agent here speaks mutual TLS with a certificate of the shared test CA
//! ([`TestPki::shared`]), as in production. The waits last up to [`testing::WAIT`]. Submitting a
//! job and reading its status are [`testing::submit`] and [`testing::job_status`].

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use muster_actor::{System, Upid};
use muster_agent::{AgentConfig, AgentHandle};
use muster_master::requests::GetState;
use muster_master::{MasterConfig, MasterServer, testing};
use muster_proto::cluster as pb;
use muster_proto::model as model_pb;
use muster_security::testing::TestPki;
use muster_security::{Role, TokenSecret};
use muster_transport::Node;
use tokio::time::Instant;

/// The `muster-master` binary Cargo built for these tests.
pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_muster-master");

/// A single master's settings: any free port of loopback, its data in `dir/master`, the
/// certificate `master-1`; the library's defaults otherwise.
pub(crate) fn master_config(dir: &Path) -> MasterConfig {
    MasterConfig {
        listen: "127.0.0.1:0".into(),
        data_dir: dir.join("master"),
        ..MasterConfig::new(TestPki::shared().security(Role::Master, "master-1"))
    }
}

/// The settings of master `id` of the group `members` (id → address): listening at its
/// address (any free port of loopback if it has none), its data in `dir/master-<id>`, the
/// certificate `master-<id>`, and quick raft timings (heartbeats every 50 ms, elections after
/// 200 to 400 ms of silence).
pub(crate) fn member_config(id: u64, members: &BTreeMap<u64, String>, dir: &Path) -> MasterConfig {
    MasterConfig {
        id,
        listen: members
            .get(&id)
            .cloned()
            .unwrap_or_else(|| "127.0.0.1:0".into()),
        members: members.clone(),
        data_dir: dir.join(format!("master-{id}")),
        raft_heartbeat: Duration::from_millis(50),
        raft_election_timeout: (Duration::from_millis(200), Duration::from_millis(400)),
        ..MasterConfig::new(TestPki::shared().security(Role::Master, &format!("master-{id}")))
    }
}

/// `config` for a test that plays several agents on one node of its own, behind one agent
/// certificate (as the benches do): the master lets a certificate hold any number of agents.
/// Everywhere else one certificate holds one agent (`agent_claims.rs` tests the rule).
pub(crate) fn playing_many_agents(config: MasterConfig) -> MasterConfig {
    MasterConfig {
        agents_per_certificate: usize::MAX,
        ..config
    }
}

/// `n` free addresses of loopback for the masters of a group, by id (1 to `n`).
pub(crate) async fn free_addresses(n: u64) -> anyhow::Result<BTreeMap<u64, String>> {
    let mut members = BTreeMap::new();
    for id in 1..=n {
        let listener = Node::listen("127.0.0.1:0").await?;
        members.insert(id, listener.local_addr().to_string());
    }
    Ok(members)
}

/// A single master on [`master_config`], once it leads.
pub(crate) async fn start_master(dir: &Path) -> anyhow::Result<MasterServer> {
    testing::start_leading(master_config(dir)).await
}

/// Starts a master on `config`, retrying (up to [`testing::WAIT`]) while a stopped
/// predecessor still holds its port or its store.
pub(crate) async fn start_retrying(config: MasterConfig) -> anyhow::Result<MasterServer> {
    let deadline = Instant::now() + testing::WAIT;
    loop {
        match MasterServer::start(config.clone()).await {
            Ok(master) => return Ok(master),
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => return Err(e).context("starting a master"),
        }
    }
}

/// [`start_retrying`], then waits (up to [`testing::WAIT`]) until the master leads: what
/// [`testing::start_leading`] does, for a master that restarts on the port and store of one
/// just stopped.
pub(crate) async fn start_leading_retrying(config: MasterConfig) -> anyhow::Result<MasterServer> {
    let master = start_retrying(config).await?;
    let deadline = Instant::now() + testing::WAIT;
    while !master
        .pid()
        .ask(|reply| muster_master::requests::GetMetrics { reply }.into())
        .await?
        .is_leader
    {
        if Instant::now() > deadline {
            bail!("the master did not lead within {:?}", testing::WAIT);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(master)
}

/// The pid of `master`'s registered process (`master@host:port`), where agents send.
pub(crate) fn master_upid(master: &MasterServer) -> anyhow::Result<Upid> {
    Ok(Upid::new("master", master.address())?)
}

/// A node of the test's own on `system`, on a free port of loopback, presenting the agent
/// certificate `name`: where a test plays an agent, or runs a real one.
pub(crate) async fn agent_node(system: &System, name: &str) -> anyhow::Result<Node> {
    Ok(Node::bind(
        system,
        "127.0.0.1:0",
        TestPki::shared().security(Role::Agent, name),
    )
    .await?)
}

/// A real agent's settings: reporting to `masters`, the host `name` with its data in
/// `dir/<name>`, offering `resources` (CPUs, MiB), retrying its registration after 20 ms at
/// first; the library's defaults otherwise.
pub(crate) fn agent_config(
    masters: Vec<String>,
    dir: &Path,
    name: &str,
    resources: (f64, u64),
) -> AgentConfig {
    let mut config = AgentConfig::new(masters, dir.join(name));
    config.hostname = name.into();
    config.resources = resources;
    config.registration_backoff_initial = Duration::from_millis(20);
    config
}

/// Starts a real agent on `config` on a node of its own ([`agent_node`], presenting the
/// certificate `certificate`) and waits (up to [`testing::WAIT`]) until it registers. Its
/// node, its handle and the id the master gave it.
pub(crate) async fn start_agent(
    certificate: &str,
    config: AgentConfig,
) -> anyhow::Result<(Node, AgentHandle, String)> {
    let node = agent_node(&System::new(), certificate).await?;
    let agent = muster_agent::start(&node, config).await?;
    let (id, _) = tokio::time::timeout(testing::WAIT, agent.registered())
        .await
        .context("the agent did not register")??;
    Ok((node, agent, id))
}

/// A master and one real agent (the host and certificate `agent-1`, 4 CPUs and 4 GiB), with
/// ACLs bootstrapped: what the tests of tokens, namespaces and the web UI start from.
pub(crate) struct OneAgentCluster {
    /// The master.
    pub(crate) master: MasterServer,
    /// The agent, to stop at the end.
    pub(crate) agent: AgentHandle,
    /// Its node, kept alive with it.
    _node: Node,
    /// The bootstrap management token.
    pub(crate) root: TokenSecret,
}

/// Starts a [`OneAgentCluster`] with its data in `dir`.
pub(crate) async fn one_agent_cluster(dir: &Path) -> anyhow::Result<OneAgentCluster> {
    let master = start_master(dir).await?;
    let config = agent_config(
        vec![master.address().to_owned()],
        dir,
        "agent-1",
        (4.0, 4096),
    );
    let (node, agent, _) = start_agent("agent-1", config).await?;
    let root = testing::bootstrap(master.address()).await?;
    Ok(OneAgentCluster {
        master,
        agent,
        _node: node,
        root,
    })
}

/// [`start_agent`] of `master` on [`agent_config`] (presenting the certificate `name`: one
/// certificate speaks for one agent), with the attribute `name=<name>`: what constraints pin
/// tasks to it by.
pub(crate) async fn start_pinnable_agent(
    master: &MasterServer,
    dir: &Path,
    name: &str,
    resources: (f64, u64),
) -> anyhow::Result<(Node, AgentHandle, String)> {
    let mut config = agent_config(vec![master.address().to_owned()], dir, name, resources);
    config.attributes = BTreeMap::from([("name".to_owned(), name.to_owned())]);
    start_agent(name, config).await
}

/// Registers an agent the test plays, described by `info`, from `node` with the master
/// `master`; the id it was admitted under. The ask gives up after `within`.
pub(crate) async fn register_played(
    node: &Node,
    master: &Upid,
    info: model_pb::AgentInfo,
    within: Duration,
) -> anyhow::Result<String> {
    let reply = node
        .remote(master.clone())
        .ask_timeout::<pb::RegisterAgent, pb::RegistrationReply>(
            within,
            pb::RegisterAgent {
                info: Some(info),
                ..Default::default()
            },
        )
        .await?;
    match reply.result {
        Some(pb::registration_reply::Result::AgentId(id)) => Ok(id),
        other => bail!("registration failed: {other:?}"),
    }
}

/// The cluster state on `master`, in process.
pub(crate) async fn state(master: &MasterServer) -> anyhow::Result<pb::ClusterState> {
    Ok(master.pid().ask(|reply| GetState { reply }.into()).await?)
}

/// The cluster state on `master` once `done` holds (polled up to [`testing::WAIT`]); `what`
/// names the wait in the error, with the last state.
pub(crate) async fn state_when(
    master: &MasterServer,
    what: &str,
    done: impl Fn(&pb::ClusterState) -> bool,
) -> anyhow::Result<pb::ClusterState> {
    let deadline = Instant::now() + testing::WAIT;
    loop {
        let state = state(master).await?;
        if done(&state) {
            return Ok(state);
        }
        if Instant::now() > deadline {
            bail!(
                "{what} did not happen within {:?}: {state:?}",
                testing::WAIT
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An evaluation's trigger as operators read it (`AgentUpdate(AgentId("agent-1"))`).
pub(crate) fn trigger_of(eval: &model_pb::Evaluation) -> String {
    muster_model::Evaluation::try_from(eval.clone())
        .map(|eval| format!("{:?}", eval.trigger))
        .unwrap_or_default()
}

/// Whether `tool` is on PATH (it runs with `version_flag`). Its absence is an error when the
/// environment variable `require` is `1` (as CI sets it); otherwise the test says it is
/// skipped, and the caller passes.
pub(crate) fn installed(tool: &str, version_flag: &str, require: &str) -> anyhow::Result<bool> {
    let found = std::process::Command::new(tool)
        .arg(version_flag)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !found && std::env::var(require).as_deref() == Ok("1") {
        bail!("{tool} is not on PATH and {require}=1");
    }
    if !found {
        eprintln!("{tool} is not on PATH: skipped ({require}=1 makes this a failure)");
    }
    Ok(found)
}

/// The lines a child process prints, as they come.
pub(crate) type CurlLines = tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>;

/// Starts `curl` following the stream at `url` with the test CA, `token`, and
/// `Accept: accept` if given: the child (killed when dropped) and the lines it prints.
pub(crate) fn follow_with_curl(
    url: &str,
    token: &muster_security::TokenSecret,
    accept: Option<&str>,
) -> anyhow::Result<(tokio::process::Child, CurlLines)> {
    use tokio::io::AsyncBufReadExt as _;
    let mut command = tokio::process::Command::new("curl");
    command
        .args(["--silent", "--show-error", "--no-buffer"])
        .arg("--cacert")
        .arg(TestPki::shared().ca_file())
        .args(["--header", &format!("X-Muster-Token: {}", token.expose())]);
    if let Some(accept) = accept {
        command.args(["--header", &format!("Accept: {accept}")]);
    }
    let mut child = command
        .arg(url)
        .stdout(Stdio::piped())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("curl")?;
    let stdout = child.stdout.take().context("no stdout")?;
    Ok((child, tokio::io::BufReader::new(stdout).lines()))
}

/// Waits (up to [`testing::WAIT`]) until job `name` has exactly `count` tasks running, and
/// returns its status then.
pub(crate) async fn job_runs(
    master: &muster_master::MasterServer,
    name: &str,
    count: usize,
) -> anyhow::Result<muster_proto::cluster::JobStatusReply> {
    muster_master::testing::job_when(master, name, &format!("{count} tasks running"), |status| {
        status
            .tasks
            .iter()
            .filter(|t| {
                t.task
                    .as_ref()
                    .is_some_and(|t| t.state == muster_proto::model::TaskState::Running as i32)
            })
            .count()
            == count
    })
    .await
}

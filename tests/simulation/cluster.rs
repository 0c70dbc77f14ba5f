//! The simulated cluster's hosts: three masters (the real master, with its registry on an
//! in-memory disk that forgets unflushed writes when the host dies) and agents (the real
//! agent, with simulated tasks that outlive an agent restart but not a machine crash).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use muster_actor::System;
use muster_agent::AgentConfig;
use muster_agent::runner::CustomRunner;
use muster_agent::simulated::SimulatedTasks;
use muster_broker::BrokerMsg;
use muster_master::requests::GetSchedulingPids;
use muster_master::{MasterConfig, MasterServer};
use muster_registry::MemoryDisk;
use muster_security::Role;
use muster_security::testing::TestPki;
use muster_transport::{Node, NodeConfig};

use crate::record::Record;

/// The port every master serves on.
pub(crate) const MASTER_PORT: u16 = 7000;
/// The port every agent serves on.
pub(crate) const AGENT_PORT: u16 = 7001;

/// How often raft's leader sends heartbeats.
pub(crate) const RAFT_HEARTBEAT: Duration = Duration::from_millis(100);
/// The shortest heartbeat TTL a master gives an agent (it staggers each TTL up to twice this).
pub(crate) const HEARTBEAT_MIN_TTL: Duration = Duration::from_secs(2);
/// How long past its TTL a master waits for an agent's heartbeat before it marks the agent
/// unreachable.
pub(crate) const HEARTBEAT_GRACE: Duration = Duration::from_secs(2);
/// The longest an agent a master no longer hears from stays reachable in its eyes: the
/// longest TTL plus the grace, plus the sweep that finds it overdue (a tenth of the TTL).
pub(crate) const HEARTBEAT_DEADLINE: Duration = Duration::from_millis(
    2 * HEARTBEAT_MIN_TTL.as_millis() as u64 + HEARTBEAT_GRACE.as_millis() as u64 + 200,
);
/// Ping interval and timeout of every actor-transport link.
const LINK_KEEPALIVE: Duration = Duration::from_millis(500);

/// A master host: its name, raft id, and disk.
#[derive(Clone, Debug)]
pub(crate) struct MasterHost {
    /// turmoil host name (`m1`..).
    pub(crate) name: String,
    /// Raft id.
    pub(crate) id: u64,
    /// What its store has on "disk".
    pub(crate) disk: MemoryDisk,
    /// Its election timeout: seeded, fixed for the run (openraft draws its own from a
    /// generator no seed reaches; a one-millisecond range leaves it nothing to draw).
    pub(crate) election_timeout: Duration,
    /// When it starts outside the group and asks the others to add it (`--join`); `None`: one
    /// of the group from the start.
    pub(crate) joins_at: Option<Duration>,
}

/// An agent host.
#[derive(Clone, Debug)]
pub(crate) struct AgentHost {
    /// turmoil host name (`a1`..).
    pub(crate) name: String,
    /// Its machine's tasks.
    pub(crate) tasks: SimulatedTasks,
    /// Its data directory (real files; a simulated host's files survive its crashes).
    pub(crate) dir: Arc<tempfile::TempDir>,
}

/// Every master's `ip:port`, as the hosts see them.
pub(crate) fn master_addresses(masters: &[MasterHost]) -> Vec<String> {
    masters
        .iter()
        .map(|m| format!("{}:{MASTER_PORT}", turmoil::lookup(m.name.as_str())))
        .collect()
}

/// Runs one incarnation of a master host until the simulation crashes it: one of the group
/// `all`, or, if it `joins`, a master asking them to add it.
pub(crate) async fn run_master(
    host: MasterHost,
    all: Vec<MasterHost>,
    record: Record,
) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(at) = host.joins_at {
        tokio::time::sleep(at.saturating_sub(crate::record::now())).await;
    }
    // A restarted process has what its store flushed, nothing more.
    host.disk.crash();
    let mut config = MasterConfig::new(TestPki::shared().security(Role::Master, &host.name));
    config.id = host.id;
    let members: BTreeMap<u64, String> = if host.joins_at.is_some() {
        config.join = master_addresses(&all);
        let own = format!("{}:{MASTER_PORT}", turmoil::lookup(host.name.as_str()));
        BTreeMap::from([(host.id, own)])
    } else {
        all.iter()
            .zip(master_addresses(&all))
            .map(|(m, address)| (m.id, address))
            .collect()
    };
    config.listen = members[&host.id].clone();
    config.members = members;
    config.registry_store = Some(host.disk.clone());
    config.raft_heartbeat = RAFT_HEARTBEAT;
    config.raft_election_timeout = (
        host.election_timeout,
        host.election_timeout + Duration::from_millis(1),
    );
    config.heartbeat_min_ttl = HEARTBEAT_MIN_TTL;
    config.heartbeat_grace = HEARTBEAT_GRACE;
    config.failover_heartbeat_ttl = Duration::from_secs(10);
    config.reregistration_timeout = Duration::from_secs(20);
    config.reschedule_delay = Duration::from_secs(1);
    config.reschedule_max_delay = Duration::from_secs(5);
    config.launch_timeout = Duration::from_secs(10);
    config.reconcile_interval = Duration::from_secs(5);
    config.workers = 1;
    config.link_keepalive = LINK_KEEPALIVE;
    let server = match MasterServer::start(config).await {
        Ok(server) => server,
        Err(e) => {
            record.log(format!("{} did not start: {e}", host.name));
            return Err(e.into());
        }
    };
    record.log(format!("{} started", host.name));
    watch_broker(&server, record.clone()).await;
    let mut leadership = server.registry().leadership();
    loop {
        let now = leadership.borrow_and_update().clone();
        record.standing(host.id, now.term, now.is_self);
        if leadership.changed().await.is_err() {
            break;
        }
    }
    std::future::pending::<()>().await;
    drop(server);
    Ok(())
}

/// Samples what the broker has handed out, every 50 ms: never two evaluations of one job at
/// once.
async fn watch_broker(server: &MasterServer, record: Record) {
    let Ok(pids) = server
        .pid()
        .ask(|reply| GetSchedulingPids { reply }.into())
        .await
    else {
        return;
    };
    tokio::spawn(async move {
        let mut reported = false;
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let Ok(unacked) = pids.broker.ask(BrokerMsg::Unacked).await else {
                return;
            };
            let twice = unacked.windows(2).find(|w| w[0].0 == w[1].0);
            if let (Some(w), false) = (twice, reported) {
                reported = true;
                record.problem(format!(
                    "two evaluations of {} in flight at once: {} and {}",
                    w[0].0, w[0].1.0, w[1].1.0
                ));
            }
        }
    });
}

/// Runs one incarnation of an agent host until the simulation crashes it.
pub(crate) async fn run_agent(
    host: AgentHost,
    masters: Vec<MasterHost>,
    record: Record,
) -> Result<(), Box<dyn std::error::Error>> {
    let ip = turmoil::lookup(host.name.as_str());
    let system = System::new();
    // Its certificate names its address in the simulated network: an agent registers only an
    // address its certificate proves.
    let mut node_config = NodeConfig::new(TestPki::shared().security_naming(
        Role::Agent,
        &host.name,
        &[ip.to_string()],
    ));
    node_config.keepalive_interval = LINK_KEEPALIVE;
    node_config.keepalive_timeout = LINK_KEEPALIVE;
    let node = Node::bind_with(&system, &format!("{ip}:{AGENT_PORT}"), node_config).await?;
    let mut config = AgentConfig::new(master_addresses(&masters), host.dir.path());
    config.hostname = host.name.clone();
    config.resources = (8.0, 8192);
    config.cgroups = false;
    config.stop_tasks_on_exit = false;
    config.task_runner = Some(CustomRunner::new(host.tasks.clone()));
    config.registration_backoff_initial = Duration::from_millis(200);
    config.registration_backoff_max = Duration::from_secs(2);
    config.master_silence_timeout = Duration::from_secs(6);
    config.ask_timeout = Duration::from_secs(2);
    config.kill_grace = Duration::from_millis(500);
    let agent = muster_agent::start(&node, config).await?;
    record.log(format!("{} started", host.name));
    std::future::pending::<()>().await;
    drop(agent);
    Ok(())
}

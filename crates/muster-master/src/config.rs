//! How a master is configured.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use muster_registry::types::NodeId;

/// How the master's scheduler workers choose agents.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Placement {
    /// Fill agents one after another (Nomad's default): fewer agents in use.
    #[default]
    Binpack,
    /// Spread each job's tasks evenly over the agents.
    Spread,
}

/// A master's settings. Defaults follow Mesos where it has one.
#[derive(Clone, Debug)]
pub struct MasterConfig {
    /// This master's id in the registry group.
    pub id: NodeId,
    /// Where to listen (`host:port`; port 0 picks one). Agents, peers and operators all use
    /// this one port.
    pub listen: String,
    /// Every master of the group, id to `host:port`, this one included. Empty: a group of one
    /// at the listening address.
    pub members: BTreeMap<NodeId, String>,
    /// Where the registry is stored.
    pub data_dir: PathBuf,
    /// How often the leading master pings each agent (Mesos: 15 s).
    pub ping_interval: Duration,
    /// How long to wait for each pong.
    pub ping_timeout: Duration,
    /// Missed pings in a row after which an agent is marked unreachable (Mesos: 5).
    pub max_missed_pings: u32,
    /// How long a new leading master waits for admitted agents to re-register before it
    /// marks the missing ones unreachable (Mesos: 10 min).
    pub reregistration_timeout: Duration,
    /// The largest share of admitted agents the deadline may mark unreachable; past it the
    /// master logs loudly and keeps them (Mesos: 100%).
    pub removal_limit: f64,
    /// Scheduler workers this master runs (they work only while it leads).
    pub workers: usize,
    /// How its workers place tasks.
    pub placement: Placement,
    /// raft heartbeat interval.
    pub raft_heartbeat: Duration,
    /// raft election timeout range.
    pub raft_election_timeout: (Duration, Duration),
}

impl Default for MasterConfig {
    fn default() -> Self {
        MasterConfig {
            id: 1,
            listen: "127.0.0.1:5050".into(),
            members: BTreeMap::new(),
            data_dir: PathBuf::from("muster-master-data"),
            ping_interval: Duration::from_secs(15),
            ping_timeout: Duration::from_secs(15),
            max_missed_pings: 5,
            reregistration_timeout: Duration::from_secs(600),
            removal_limit: 1.0,
            workers: 2,
            placement: Placement::Binpack,
            raft_heartbeat: Duration::from_millis(100),
            raft_election_timeout: (Duration::from_millis(500), Duration::from_millis(1000)),
        }
    }
}

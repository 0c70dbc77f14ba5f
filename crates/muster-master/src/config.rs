//! How a master is configured.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use muster_registry::types::NodeId;
use muster_security::Security;

/// How the master's scheduler workers choose agents.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Placement {
    /// Fill agents one after another (Nomad's default): fewer agents in use.
    #[default]
    Binpack,
    /// Spread each job's tasks evenly over the agents.
    Spread,
}

/// A master's settings. Defaults ([`MasterConfig::new`]) follow Mesos where it has one.
#[derive(Clone, Debug)]
pub struct MasterConfig {
    /// Mutual TLS for every link (raft, agents, the APIs) and ACL tokens on the APIs; or
    /// [`Security::Insecure`], only when asked for explicitly.
    pub security: Security,
    /// This master's id in the registry group.
    pub id: NodeId,
    /// Where to listen (`host:port`; port 0 picks one). Agents, peers and operators all use
    /// this one port.
    pub listen: String,
    /// Every master of the group, id to `host:port`, this one included. Empty: a group of one
    /// at the listening address.
    pub members: BTreeMap<NodeId, String>,
    /// Masters of a running group to ask to add this one (`--join`, any of them). Set:
    /// `members` names this master alone; on first start it waits to be added as a learner,
    /// catches up, and becomes a voter. Ignored once it is in a group.
    pub join: Vec<String>,
    /// Where the registry is stored.
    pub data_dir: PathBuf,
    /// Keep the registry on this in-memory disk instead of in `data_dir` (deterministic
    /// simulations, where sled cannot run).
    pub registry_store: Option<muster_registry::MemoryDisk>,
    /// Whether the leading master also pings each agent, Mesos-style (default: off; agents'
    /// heartbeats are what keeps them connected). When on, an agent that misses
    /// [`max_missed_pings`](Self::max_missed_pings) pings in a row is marked unreachable even
    /// if it heartbeats.
    pub pings: bool,
    /// How often the leading master pings each agent, when [`pings`](Self::pings) is on
    /// (Mesos: 15 s).
    pub ping_interval: Duration,
    /// How long to wait for each pong, and for an agent's answer to a kill (one not answered
    /// in time is sent again, after a back-off).
    pub ping_timeout: Duration,
    /// Missed pings in a row after which an agent is marked unreachable (Mesos: 5).
    pub max_missed_pings: u32,
    /// The shortest heartbeat TTL the leading master gives an agent (Nomad: 10 s).
    pub heartbeat_min_ttl: Duration,
    /// The heartbeats per second the leading master aims to handle at most (Nomad: 50): an
    /// agent's TTL is `max(heartbeat_min_ttl, agents / heartbeats_per_second seconds)` plus a
    /// random stagger of up to as much again. Zero, negative or NaN: no scaling (min TTL only).
    pub heartbeats_per_second: f64,
    /// How long past its TTL an agent's heartbeat may be late before the agent is marked
    /// unreachable (Nomad: 10 s).
    pub heartbeat_grace: Duration,
    /// The first TTL of every agent a new leading master loads from the registry (Nomad:
    /// 300 s): none of them is marked unreachable for missing heartbeats before this (plus the
    /// grace) has passed since the master took the lead. Agents that never re-register are
    /// still handled by the re-registration deadline and the removal limit.
    pub failover_heartbeat_ttl: Duration,
    /// How long a new leading master waits for admitted agents to re-register before it
    /// marks the missing ones unreachable (Mesos: 10 min).
    pub reregistration_timeout: Duration,
    /// The largest share of admitted agents the deadline may mark unreachable; past it the
    /// master logs loudly and keeps them (Mesos: 100%).
    pub removal_limit: f64,
    /// How long the replacement of a service or system task that failed waits when the same
    /// slot failed just before: this, doubled for each further failure in a row, up to
    /// `reschedule_max_delay` (a first failure is replaced at once). A slot that has not
    /// failed for ten times the maximum starts over.
    pub reschedule_delay: Duration,
    /// The longest a crash-looping task's replacement waits.
    pub reschedule_max_delay: Duration,
    /// How long a launch is valid: the agent refuses it after this (on its own clock), and a
    /// task still STAGING with no word from its agent counts as LOST, and is replaced, 5 s
    /// after that (launches are one-way, and can be lost with a broken link or wait in its
    /// queue; the 5 s are for the two clocks to disagree).
    pub launch_timeout: Duration,
    /// Start over empty if the registry store is damaged, instead of refusing to start (see
    /// [`RegistryConfig::rejoin_damaged`](muster_registry::RegistryConfig)): the damaged
    /// directory is moved aside, and this master catches up from the others, voting again
    /// only once its log is back where the damaged one's was.
    pub rejoin_damaged: bool,
    /// How the registry writes its entries, snapshots and raft requests
    /// ([`RegistryConfig::encoding`](muster_registry::RegistryConfig)): MessagePack, the
    /// default; JSON, the encoding before it, to measure the difference (`benches/failover.rs`).
    pub registry_encoding: muster_registry::codec::Encoding,
    /// Scheduler workers this master runs (they work only while it leads); they serve the
    /// built-in schedulers.
    pub workers: usize,
    /// How long after a scheduler's last worker last asked for work its name counts as not
    /// served, and its waiting evaluations say so (default 30 s; a worker waiting on it
    /// serves it meanwhile).
    pub scheduler_gone_after: Duration,
    /// Which job types may stop tasks of lower-priority jobs to fit (Nomad's preemption
    /// config): system jobs only by default.
    pub preemption: muster_model::PreemptionConfig,
    /// How its workers place tasks.
    pub placement: Placement,
    /// How often the leading master checks that every job's running tasks match what it asks
    /// for, and evaluates the ones that do not (default 30 s; see `master/convergence.rs`).
    pub reconcile_interval: Duration,
    /// Caps on one job's size: a submission over them is refused, naming the cap.
    pub job_limits: muster_model::JobLimits,
    /// How many agent ids one agent certificate may hold (default 1: a certificate speaks
    /// for one agent; a second agent presenting it is refused while the first is connected,
    /// and takes its id over once it is not). More only for simulators and load tests that
    /// run many agents behind one certificate.
    pub agents_per_certificate: usize,
    /// raft heartbeat interval.
    pub raft_heartbeat: Duration,
    /// raft election timeout range.
    pub raft_election_timeout: (Duration, Duration),
    /// How often the actor transport pings each link, and how long a ping may go unanswered
    /// before the link is dropped and reconnected (default 5 s each). Keep the two together
    /// under `heartbeat_min_ttl` plus `heartbeat_grace`, so that a connection to an agent that
    /// died silently is replaced before the agent is counted late.
    pub link_keepalive: Duration,
    /// Where the HTTP/JSON API listens (`host:port`). `None` (the default): the gRPC port
    /// plus [`HTTP_PORT_OFFSET`] on the same host (5060 beside 5050; port 0 stays 0: any free
    /// port).
    pub http_listen: Option<String>,
    /// Other masters' HTTP addresses by raft id, for the redirects a standby answers, where
    /// they are not at their gRPC port plus the offset this master uses. Empty by default.
    pub http_members: BTreeMap<u64, String>,
}

/// How far above its gRPC port a master's HTTP API listens by default: 5060 beside 5050, clear
/// of an agent's 5051 and of masters on consecutive ports.
pub const HTTP_PORT_OFFSET: u16 = 10;

impl MasterConfig {
    /// Where the HTTP API listens: `http_listen`, or the gRPC address `listen` with its port
    /// plus [`HTTP_PORT_OFFSET`] (0 stays 0: a master listening on any free port serves HTTP
    /// on any free port too).
    ///
    /// # Errors
    /// A message naming `listen` if it has no port.
    pub fn http_address(&self, listen: &str) -> Result<String, String> {
        if let Some(address) = &self.http_listen {
            return Ok(address.clone());
        }
        let (host, port) = listen
            .rsplit_once(':')
            .and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?)))
            .ok_or_else(|| format!("the listen address {listen:?} has no port"))?;
        let port = if port == 0 {
            0
        } else {
            port.checked_add(HTTP_PORT_OFFSET).ok_or_else(|| {
                format!("no port after {port} for the HTTP API; set --http-listen")
            })?
        };
        Ok(format!("{host}:{port}"))
    }

    /// The default settings, with `security`.
    pub fn new(security: Security) -> Self {
        MasterConfig {
            security,
            id: 1,
            listen: "127.0.0.1:5050".into(),
            members: BTreeMap::new(),
            join: Vec::new(),
            data_dir: PathBuf::from("muster-master-data"),
            registry_store: None,
            pings: false,
            ping_interval: Duration::from_secs(15),
            ping_timeout: Duration::from_secs(15),
            max_missed_pings: 5,
            heartbeat_min_ttl: Duration::from_secs(10),
            heartbeats_per_second: 50.0,
            heartbeat_grace: Duration::from_secs(10),
            failover_heartbeat_ttl: Duration::from_secs(300),
            reregistration_timeout: Duration::from_secs(600),
            removal_limit: 1.0,
            reschedule_delay: Duration::from_secs(10),
            reschedule_max_delay: Duration::from_secs(300),
            launch_timeout: Duration::from_secs(60),
            rejoin_damaged: false,
            registry_encoding: Default::default(),
            workers: 2,
            scheduler_gone_after: Duration::from_secs(30),
            preemption: muster_model::PreemptionConfig::default(),
            placement: Placement::Binpack,
            job_limits: muster_model::JobLimits::default(),
            agents_per_certificate: 1,
            reconcile_interval: Duration::from_secs(30),
            raft_heartbeat: Duration::from_millis(100),
            raft_election_timeout: (Duration::from_millis(500), Duration::from_millis(1000)),
            link_keepalive: Duration::from_secs(5),
            http_listen: None,
            http_members: BTreeMap::new(),
        }
    }
}

/// The `--preemption` setting: which job types may stop tasks of lower-priority jobs to fit,
/// as a list (`system,service`) or `none`, in a flag or the config file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreemptionSetting(pub muster_model::PreemptionConfig);

impl std::str::FromStr for PreemptionSetting {
    type Err = String;

    fn from_str(list: &str) -> Result<Self, String> {
        muster_model::PreemptionConfig::parse(list).map(PreemptionSetting)
    }
}

impl std::fmt::Display for PreemptionSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl From<muster_model::PreemptionConfig> for PreemptionSetting {
    fn from(config: muster_model::PreemptionConfig) -> Self {
        PreemptionSetting(config)
    }
}

impl From<PreemptionSetting> for muster_model::PreemptionConfig {
    fn from(setting: PreemptionSetting) -> Self {
        setting.0
    }
}

impl<'de> serde::Deserialize<'de> for PreemptionSetting {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl muster_launch::settings::Show for PreemptionSetting {
    fn show(&self) -> Option<String> {
        Some(self.to_string())
    }
}

//! Agents: the machines that run tasks, as the registry and schedulers know them.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::resources::Resources;

/// An agent's id, assigned by the registry when the agent is first admitted (`agent-1`, ...).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct AgentId(pub String);

impl fmt::Display for AgentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What the registry remembers of an agent: enough to know it after a failover.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentInfo {
    /// The agent's host name.
    pub hostname: String,
    /// Where the agent process is reached (`agent@host:port`).
    pub address: String,
    /// What it offers.
    pub resources: Resources,
    /// Attributes schedulers constrain on (`rack = "r1"`).
    pub attributes: BTreeMap<String, String>,
    /// The ports it hands out to tasks that ask for a dynamic one.
    #[serde(default)]
    pub dynamic_ports: crate::PortRange,
    /// The name in the certificate the agent registered with (empty without TLS). Only an
    /// agent presenting a certificate of this name may speak for the agent afterwards. Set
    /// by the master from the verified connection, never from what the agent sends.
    #[serde(default)]
    pub identity: String,
}

/// An agent the master has stopped hearing from, and when it was marked (Unix milliseconds).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UnreachableAgent {
    /// The agent as it was admitted.
    pub info: AgentInfo,
    /// When the master marked it unreachable, in milliseconds since the Unix epoch.
    pub marked_at_ms: u64,
    /// What it ran (or was starting, or being told to kill) when it was marked, without the
    /// program, arguments, environment and labels (its job has them): each task is
    /// [`Unknown`](crate::TaskState::Unknown) while the agent is away, in its state at the
    /// mark here. Kept in the registry so that whichever master leads when the agent comes
    /// back knows what was given up.
    #[serde(default)]
    pub tasks: Vec<crate::Task>,
}

/// How schedulers may use an agent, as operators set it (`muster agent eligibility`,
/// `muster agent drain`): whether it takes new tasks, and the drain under way. Kept in the
/// registry apart from [`AgentInfo`], so that nothing an agent reports changes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentScheduling {
    /// Whether schedulers may place new tasks on it. False while it drains and after.
    pub eligible: bool,
    /// The drain under way, if any.
    pub drain: Option<Drain>,
    /// When its last drain completed, in milliseconds since the Unix epoch; 0 if it never
    /// completed one.
    pub drained_at_ms: u64,
}

impl Default for AgentScheduling {
    fn default() -> Self {
        AgentScheduling {
            eligible: true,
            drain: None,
            drained_at_ms: 0,
        }
    }
}

impl AgentScheduling {
    /// Whether it is as a newly admitted agent's: eligible, never drained.
    pub fn is_default(&self) -> bool {
        *self == AgentScheduling::default()
    }

    /// Where its drain is.
    pub fn phase(&self) -> DrainPhase {
        match &self.drain {
            None => DrainPhase::None,
            Some(drain) if drain.past_deadline => DrainPhase::Stopping,
            Some(_) => DrainPhase::Migrating,
        }
    }

    /// Whether a drain is under way.
    pub fn is_draining(&self) -> bool {
        self.drain.is_some()
    }
}

/// A drain under way: the agent is emptied of its tasks (Nomad's node drain).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drain {
    /// When it began, in milliseconds since the Unix epoch.
    pub started_ms: u64,
    /// When the tasks still there are stopped, in milliseconds since the Unix epoch; `None`:
    /// never (they are left to end or move).
    pub deadline_ms: Option<u64>,
    /// The deadline passed (or the drain was forced): every task left is stopped.
    pub past_deadline: bool,
}

/// Where an agent's drain is, as schedulers act on it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DrainPhase {
    /// Not draining.
    #[default]
    None,
    /// Its service tasks move to other agents a few at a time, each replacement running
    /// before the task it replaces stops; batch tasks may run to their end; system tasks
    /// stop once nothing else runs there.
    Migrating,
    /// The deadline passed: every task left stops.
    Stopping,
}

impl DrainPhase {
    /// The lower-case name operators see (`migrating`).
    pub fn name(self) -> &'static str {
        match self {
            DrainPhase::None => "none",
            DrainPhase::Migrating => "migrating",
            DrainPhase::Stopping => "stopping",
        }
    }
}

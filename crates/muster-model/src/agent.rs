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
}

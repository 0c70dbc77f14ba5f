//! [`Upid`]: a process address, `name@host:port` (libprocess's UPID).

use std::fmt;
use std::str::FromStr;

use crate::RemoteError;

/// The address of a named process on a node: `name@host:port`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Upid {
    name: String,
    node: String,
}

impl Upid {
    /// The address of process `name` on the node listening at `node` (`host:port`).
    ///
    /// # Errors
    /// [`RemoteError::InvalidAddress`] if the name is empty or contains `@`, or the node is not
    /// `host:port` with a numeric port.
    pub fn new(name: impl Into<String>, node: impl Into<String>) -> Result<Self, RemoteError> {
        let name = name.into();
        let node = node.into();
        let invalid = |reason| {
            Err(RemoteError::InvalidAddress {
                address: format!("{name}@{node}"),
                reason,
            })
        };
        if name.is_empty() || name.contains('@') {
            return invalid("the process name must be non-empty and contain no '@'");
        }
        match node.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {}
            _ => return invalid("the node must be host:port with a numeric port"),
        }
        Ok(Upid { name, node })
    }

    /// The process's name on its node.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node's address, `host:port`.
    pub fn node(&self) -> &str {
        &self.node
    }
}

impl FromStr for Upid {
    type Err = RemoteError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once('@') {
            Some((name, node)) => Upid::new(name, node),
            None => Err(RemoteError::InvalidAddress {
                address: s.to_owned(),
                reason: "expected name@host:port",
            }),
        }
    }
}

impl fmt::Display for Upid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.name, self.node)
    }
}

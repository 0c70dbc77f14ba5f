//! Why a process ended, and who it was: what linked processes learn through `exited`, and
//! the callbacks that hear it (`ExitWatcher`).

use std::fmt;

use crate::upid::Upid;

/// Identity of a local process, unique within its [`System`](crate::System) for its lifetime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcessId(pub(crate) u64);

impl ProcessId {
    /// The raw number, for logs.
    pub fn as_u64(self) -> u64 {
        self.0
    }
}

impl fmt::Display for ProcessId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<{}>", self.0)
    }
}

/// A process that a linked process hears about: local by id, remote by address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ProcessRef {
    /// A process of this system.
    Local(ProcessId),
    /// A process on another node.
    Remote(Upid),
}

impl fmt::Display for ProcessRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProcessRef::Local(id) => id.fmt(f),
            ProcessRef::Remote(upid) => upid.fmt(f),
        }
    }
}

/// A callback run once when a process ends; links are made of these.
pub(crate) type ExitWatcher = Box<dyn FnOnce(&ExitReason) + Send>;

/// Why a process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExitReason {
    /// It stopped itself ([`Context::stop`](crate::Context::stop)).
    Normal,
    /// Someone called [`Pid::terminate`](crate::Pid::terminate).
    Terminated,
    /// The whole system was shut down ([`System::shutdown`](crate::System::shutdown)).
    Shutdown,
    /// A handler panicked; the panic message.
    Panicked(String),
    /// It failed for the stated reason, e.g. a supervisor past its restart limit.
    Failed(String),
    /// The connection to the node it lives on was lost (remote processes only).
    ConnectionLost {
        /// The node's address, `host:port`.
        node: String,
    },
}

impl ExitReason {
    /// True for an orderly end (stop, terminate, shutdown); false for a panic, failure or loss.
    pub fn is_normal(&self) -> bool {
        matches!(
            self,
            ExitReason::Normal | ExitReason::Terminated | ExitReason::Shutdown
        )
    }
}

impl fmt::Display for ExitReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExitReason::Normal => f.write_str("stopped"),
            ExitReason::Terminated => f.write_str("terminated"),
            ExitReason::Shutdown => f.write_str("shut down"),
            ExitReason::Panicked(msg) => write!(f, "panicked: {msg}"),
            ExitReason::Failed(msg) => write!(f, "failed: {msg}"),
            ExitReason::ConnectionLost { node } => write!(f, "connection to {node} lost"),
        }
    }
}

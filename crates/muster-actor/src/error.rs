//! Errors of the runtime. Failed sends hand the message back; nothing is dropped silently.

use std::fmt;

/// Why [`Pid::tell`](crate::Pid::tell) could not deliver a message. The message comes back.
#[derive(thiserror::Error)]
pub enum TellError<M> {
    /// The bounded mailbox is full: "busy, go away". Retry later or elsewhere.
    #[error("mailbox is full")]
    Busy(M),
    /// The process has stopped.
    #[error("process has stopped")]
    Stopped(M),
}

impl<M> TellError<M> {
    /// The message that could not be delivered.
    pub fn into_inner(self) -> M {
        match self {
            TellError::Busy(m) | TellError::Stopped(m) => m,
        }
    }
}

impl<M> fmt::Debug for TellError<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TellError::Busy(_) => f.write_str("Busy(..)"),
            TellError::Stopped(_) => f.write_str("Stopped(..)"),
        }
    }
}

/// Why an ask, a dispatch or a remote request got no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AskError {
    /// The target process has stopped (or stopped before answering).
    #[error("process has stopped")]
    Stopped,
    /// The target's bounded mailbox is full.
    #[error("mailbox is full")]
    Busy,
    /// The handler dropped the reply without answering.
    #[error("the handler dropped the reply without answering")]
    NoReply,
    /// No answer within the timeout.
    #[error("no answer within {0:?}")]
    Timeout(std::time::Duration),
    /// The remote node could not deliver or answer the request.
    #[error(transparent)]
    Remote(#[from] RemoteError),
}

/// A failure of the transport between nodes: returned to asks, counted as dead letters for tells.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteError {
    /// The address is not of the form `name@host:port`.
    #[error("invalid process address {address:?}: {reason}")]
    InvalidAddress {
        /// The address as given.
        address: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// No process of that name is registered on the receiving node.
    #[error("no process named {0:?} on the remote node")]
    UnknownProcess(String),
    /// The process does not accept messages of that type (nothing installed for it).
    #[error("process does not accept messages of type {0:?}")]
    UnknownType(String),
    /// The body did not decode as the named type.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// The message is larger than the link's limit.
    #[error("message of {size} bytes exceeds the limit of {limit} bytes")]
    Oversized {
        /// Encoded size of the message.
        size: usize,
        /// The configured maximum.
        limit: usize,
    },
    /// The remote process has stopped or its mailbox is full.
    #[error("remote process could not take the message: {0}")]
    Rejected(String),
    /// The receiving process does not accept this message from the sender's role (its
    /// certificate says master, agent or client; see `Registration::install_from` in
    /// `muster-transport`).
    #[error("not authorized: {0}")]
    Unauthorized(String),
    /// The connection to the node was lost before the answer came.
    #[error("connection to {0} lost")]
    ConnectionLost(String),
    /// The node could not be reached (refused, timed out, no route); the link keeps retrying.
    #[error("cannot reach {node}: {reason}")]
    Unreachable {
        /// The node's address, `host:port`.
        node: String,
        /// What the connection attempt said.
        reason: String,
    },
    /// Too many messages are queued for an unreachable node.
    #[error("too many messages queued for {0}")]
    QueueFull(String),
    /// The remote handler dropped the reply without answering.
    #[error("the remote handler dropped the reply without answering")]
    NoReply,
}

//! [`AgentError`]: why an agent could not start or answer.

use std::path::PathBuf;

/// Why an agent could not start, or a request to it failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// A value of the [`AgentConfig`](crate::AgentConfig) cannot work; says which.
    #[error("invalid agent config: {0}")]
    InvalidConfig(String),
    /// The data directory cannot be created or written.
    #[error("data directory {path} is not usable")]
    DataDir {
        /// The directory.
        path: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// A file of the agent's state (its id, a task checkpoint) cannot be read or written.
    #[error("cannot read or write agent state file {path}")]
    StateFile {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
    /// The stored agent id is not usable (empty, or not UTF-8).
    #[error("stored agent id in {path} is invalid: {reason}")]
    InvalidStoredId {
        /// The id file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The agent process could not be registered on the node.
    #[error("cannot register the agent process on the node")]
    Node(#[from] muster_transport::NodeError),
    /// The agent process has stopped.
    #[error("the agent process has stopped")]
    Stopped,
}

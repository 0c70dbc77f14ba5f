//! A task's output files, `stdout` and `stderr` in its working directory: writing them for the
//! task within their bounds, and reading them back across rotations.
//!
//! - `files`: what a stream's files hold (the live file, the rotated files, and the base that
//!   counts offsets from the task's start), and how the agent opens files a task can touch.
//! - `capture`: the task's executor copies its pipes into the files ([`Capture`]), rotating
//!   them before a chunk would take the live file past its limit.
//! - `copy_truncate`: the agent rotates the files of a task started by an earlier agent, which
//!   holds them itself ([`rotate`]).
//! - `read`: a stream read back from an absolute offset, across its files ([`read_task`]).

mod capture;
mod copy_truncate;
mod files;
mod read;
#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex, PoisonError};

pub(crate) use capture::{Capture, TaskEnds, TaskFiles};
pub(crate) use copy_truncate::{Rotated, rotate};
pub(crate) use read::{READ_LIMIT_MAX, read_task};

/// One of a task's two output streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stream {
    /// Its standard output, `stdout`.
    Stdout,
    /// Its standard error, `stderr`.
    Stderr,
}

impl Stream {
    /// Both streams.
    pub(crate) const BOTH: [Stream; 2] = [Stream::Stdout, Stream::Stderr];

    /// The live file's name, which the other files' names start with.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }

    /// Its place in [`Stream::BOTH`].
    pub(super) fn index(self) -> usize {
        match self {
            Stream::Stdout => 0,
            Stream::Stderr => 1,
        }
    }
}

impl std::fmt::Display for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How large a stream's live file may grow, and how many rotated files are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Past this size the live file is rotated.
    pub(crate) max_bytes: u64,
    /// Rotated files kept per stream (at least 1).
    pub(crate) files: u32,
}

/// Serializes one agent's rotations and reads of output files, so that a read never sees a
/// rotation half done. Clones share the lock.
#[derive(Debug, Clone, Default)]
pub(crate) struct OutputLock(Arc<Mutex<()>>);

impl OutputLock {
    /// Runs `work` holding the lock (a panic of an earlier holder does not matter: the files
    /// are consistent between the steps of a rotation too, see `copy_truncate`).
    pub(super) fn hold<T>(&self, work: impl FnOnce() -> T) -> T {
        let _held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        work()
    }
}

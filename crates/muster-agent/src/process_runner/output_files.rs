//! The process runner's side of its tasks' output files (see [`crate::output`]): the masters'
//! reads of a task's output, and the periodic copy-truncate rotation of the `stdout` and
//! `stderr` of running tasks whose executor does not rotate them itself (tasks an agent from
//! before the executors' pipes started). A task's own executor keeps its files bounded as it
//! writes them, whether an agent runs or not. Both block on the files: the agent calls them on
//! tokio's blocking threads, never on the agent process's, so that a large copy or read does not
//! hold up its messages.

use std::collections::HashSet;
use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};

use super::ProcessRunner;
use crate::executor::{Files, Record};
use crate::output::{self, Limits, OutputLock, Stream};
use crate::runner::{OutputChunk, OutputError};
use crate::store;

/// What the runner keeps for its tasks' output files.
#[derive(Debug, Default)]
pub(super) struct OutputFiles {
    /// Serializes the copy-truncate rotations and the reads of tasks whose executor does not
    /// capture their output (see [`output::read_task`]).
    lock: OutputLock,
    /// Tasks whose last rotation failed: warned about once, until one succeeds again.
    failing: Mutex<HashSet<String>>,
}

/// A task's executor record could not be read: whether its output is the agent's to rotate is
/// not known.
#[derive(Debug, thiserror::Error)]
#[error("cannot read its executor record {}: {error}", path.display())]
struct UnreadableRecord {
    /// The record.
    path: PathBuf,
    /// What went wrong.
    error: io::Error,
}

/// How one task's rotation check went: per stream, what was rotated or why not; or why its
/// record could not be read (both streams' failure).
type Checked = (
    String,
    Result<Vec<(Stream, io::Result<Option<output::Rotated>>)>, UnreadableRecord>,
);

/// Whether the agent rotates the output of the task with these executor `files` itself, copy-
/// truncate style ([`output::rotate`]): only if its executor's record says the executor does
/// not capture it (a task an older agent started). A task whose record is missing (not
/// written yet, or lost) is left alone: a copy-truncate of files its executor writes would
/// race it.
fn copy_truncated_by_agent(files: &Files) -> io::Result<bool> {
    Ok(Record::read(files)?.is_some_and(|record| !record.output_captured))
}

/// Rotates the streams of those of `tasks` (id, working directory, executor files) whose
/// output the agent rotates itself (see [`copy_truncated_by_agent`]); the others are not
/// reported.
fn rotate_uncaptured(
    lock: &OutputLock,
    tasks: Vec<(String, PathBuf, Files)>,
    limits: Limits,
) -> Vec<Checked> {
    tasks
        .into_iter()
        .filter_map(|(id, dir, files)| {
            let streams = match copy_truncated_by_agent(&files) {
                Ok(false) => return None,
                Ok(true) => Ok(Stream::BOTH
                    .into_iter()
                    .map(|stream| (stream, output::rotate(lock, &dir, stream, limits)))
                    .collect()),
                Err(error) => Err(UnreadableRecord {
                    path: files.record.clone(),
                    error,
                }),
            };
            Some((id, streams))
        })
        .collect()
}

impl ProcessRunner {
    /// Rotates the output files of the `running` tasks that are past the size limit and that
    /// their executors do not rotate, and logs what it did: rotations at debug, a task's
    /// failure once until it rotates again.
    pub(super) fn rotate_uncaptured(&self, running: &[String]) {
        let tasks = running
            .iter()
            .map(|id| {
                let dir = store::task_dir(&self.data_dir, id);
                let files = store::executor_files(&self.data_dir, id);
                (id.clone(), dir, files)
            })
            .collect();
        let checked = rotate_uncaptured(&self.output.lock, tasks, self.output_limits);
        let mut failing = self
            .output
            .failing
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for (task, streams) in checked {
            let warned = failing.contains(&task);
            let failed = match streams {
                Ok(streams) => {
                    let mut failed = false;
                    for (stream, result) in streams {
                        match result {
                            Ok(Some(rotated)) => tracing::debug!(
                                task = %task,
                                %stream,
                                bytes = rotated.copied,
                                base = rotated.base,
                                "rotated a task's output"
                            ),
                            Ok(None) => {}
                            Err(error) => {
                                failed = true;
                                warn_rotation(&task, stream, &error, warned);
                            }
                        }
                    }
                    failed
                }
                Err(error) => {
                    for stream in Stream::BOTH {
                        warn_rotation(&task, stream, &error, warned);
                    }
                    true
                }
            };
            if failed {
                failing.insert(task);
            } else {
                failing.remove(&task);
            }
        }
        failing.retain(|task| running.contains(task));
    }

    /// Reads a piece of task `task_id`'s stderr (else stdout) from `offset`, at most `limit`
    /// bytes (see [`output::read_task`]).
    pub(super) fn read(
        &self,
        task_id: &str,
        stderr: bool,
        offset: u64,
        limit: usize,
    ) -> Result<OutputChunk, OutputError> {
        let stream = if stderr {
            Stream::Stderr
        } else {
            Stream::Stdout
        };
        let dir = store::task_dir(&self.data_dir, task_id);
        let lock_file = store::executor_files(&self.data_dir, task_id).output_lock;
        output::read_task(&self.output.lock, &lock_file, &dir, stream, offset, limit)
            .map(|chunk| OutputChunk {
                data: chunk.data,
                offset: chunk.offset,
                next_offset: chunk.next_offset,
                first_offset: chunk.first_offset,
            })
            .map_err(|error| OutputError::Read {
                task_id: task_id.to_owned(),
                stream: stream.name(),
                error,
            })
    }
}

/// Warns that `task`'s `stream` could not be rotated, unless it was `warned` of already.
fn warn_rotation(task: &str, stream: Stream, error: &dyn fmt::Display, warned: bool) {
    if !warned {
        tracing::warn!(task = %task, %stream, %error, "cannot rotate a task's output; it may grow past its limit");
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::Path;

    use super::*;

    const LIMITS: Limits = Limits {
        max_bytes: 10,
        files: 1,
    };

    /// A running task `id` under `root` whose stdout is past [`LIMITS`], and its executor
    /// files, whose record `record` writes (or not).
    fn task(
        root: &Path,
        id: &str,
        record: impl FnOnce(&Files) -> io::Result<()>,
    ) -> io::Result<(String, PathBuf, Files)> {
        let dir = root.join("tasks").join(id);
        fs::create_dir_all(&dir)?;
        fs::write(dir.join("stdout"), [b'x'; 100])?;
        let meta = root.join("meta/tasks");
        fs::create_dir_all(&meta)?;
        let files = Files::new(&meta, id);
        record(&files)?;
        Ok((id.to_owned(), dir, files))
    }

    fn record(output_captured: bool) -> Record {
        Record {
            executor_pid: 42,
            executor_start: 7,
            boot_id: "boot".into(),
            task_pid: 43,
            output_captured,
            cgroup: None,
        }
    }

    #[test]
    fn the_copy_truncate_check_rotates_only_tasks_whose_executor_does_not_capture_them()
    -> io::Result<()> {
        let root = tempfile::tempdir()?;
        let root = root.path();
        let tasks = vec![
            // Its executor writes its files: never copy-truncated.
            task(root, "captured", |files| record(true).write(files))?,
            // Started by an older agent, whose record has no `output_captured`.
            task(root, "old", |files| {
                fs::write(
                    &files.record,
                    "executor_pid = 42\nexecutor_start = 7\nboot_id = \"boot\"\ntask_pid = 43\n",
                )
            })?,
            // Its record says so too.
            task(root, "uncaptured", |files| record(false).write(files))?,
            // No record (not written yet, or lost): left alone.
            task(root, "unrecorded", |_| Ok(()))?,
            // An unreadable record: a failure, not a rotation.
            task(root, "garbage", |files| fs::write(&files.record, "{{{"))?,
        ];
        let checked = rotate_uncaptured(&OutputLock::default(), tasks, LIMITS);
        let ids: Vec<&str> = checked.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["old", "uncaptured", "garbage"]);
        for (id, streams) in &checked {
            match streams {
                Ok(streams) => {
                    let results: Vec<_> = streams
                        .iter()
                        .map(|(stream, result)| {
                            (*stream, result.as_ref().ok().map(|r| r.map(|r| r.copied)))
                        })
                        .collect();
                    assert_eq!(
                        results,
                        [
                            (Stream::Stdout, Some(Some(100))),
                            (Stream::Stderr, Some(None))
                        ],
                        "{id}"
                    );
                }
                Err(error) => {
                    assert_eq!(id, "garbage");
                    assert!(error.to_string().contains("garbage.executor"), "{error}");
                }
            }
        }
        for (id, rotated) in [
            ("captured", false),
            ("old", true),
            ("uncaptured", true),
            ("unrecorded", false),
            ("garbage", false),
        ] {
            let dir = root.join("tasks").join(id);
            let live = fs::metadata(dir.join("stdout"))?.len();
            assert_eq!(live, if rotated { 0 } else { 100 }, "{id}");
            assert_eq!(dir.join("stdout.1").exists(), rotated, "{id}");
        }
        Ok(())
    }
}

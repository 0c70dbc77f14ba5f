//! The agent process's side of its tasks' output files (see [`crate::output`]): the masters'
//! `ReadTaskOutput` asks, and the periodic copy-truncate rotation of the `stdout` and `stderr`
//! of running tasks whose executor does not rotate them itself (tasks an agent from before the
//! executors' pipes started). A task's own executor keeps its files bounded as it writes them,
//! whether an agent runs or not. The file work runs on tokio's blocking threads, never on the
//! agent process's: a large copy or read does not hold up its messages.

use std::collections::HashSet;
use std::io;
use std::path::PathBuf;

use muster_actor::{Context, Reply};
use muster_proto::cluster::{ReadTaskOutput, TaskOutputChunk};

use super::{Agent, AgentMsg, Msg};
use crate::executor::{Files, Record};
use crate::output::{self, Limits, OutputLock, Stream};
use crate::store;

/// What the agent keeps for its tasks' output files.
#[derive(Debug, Default)]
pub(super) struct Output {
    /// Serializes the copy-truncate rotations and the reads of tasks whose executor does not
    /// capture their output (see [`output::read_task`]).
    lock: OutputLock,
    /// Tasks whose last rotation failed: warned about once, until one succeeds again.
    failing: HashSet<String>,
}

/// How one task's rotation check went: per stream, what was rotated, or why not.
type Checked = (
    String,
    Vec<(Stream, Result<Option<output::Rotated>, String>)>,
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
/// reported. A record that cannot be read is reported as both streams' failure.
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
                Ok(true) => Stream::BOTH
                    .into_iter()
                    .map(|stream| {
                        let rotated =
                            output::rotate(lock, &dir, stream, limits).map_err(|e| e.to_string());
                        (stream, rotated)
                    })
                    .collect(),
                Err(error) => {
                    let error = format!(
                        "cannot read its executor record {}: {error}",
                        files.record.display()
                    );
                    Stream::BOTH
                        .into_iter()
                        .map(|stream| (stream, Err(error.clone())))
                        .collect()
                }
            };
            Some((id, streams))
        })
        .collect()
}

impl Agent {
    /// Schedules the next rotation check, one interval from now. Not for a configured
    /// [`TaskRunner`](crate::runner::TaskRunner): its tasks have no output files.
    pub(super) fn schedule_output_check(&self, ctx: &mut Context<Self>) {
        if self.config.task_runner.is_none() {
            ctx.delay(
                self.config.task_output_check_interval,
                AgentMsg(Msg::CheckOutput),
            );
        }
    }

    /// Rotates the output files of the running tasks that are past the size limit and that
    /// their executors do not rotate, off the agent's thread; the next check is scheduled once
    /// this one is done, so checks never overlap.
    pub(super) fn check_output(&mut self, ctx: &mut Context<Self>) {
        let tasks: Vec<(String, PathBuf, Files)> = self
            .tasks
            .running_ids()
            .into_iter()
            .map(|id| {
                let dir = store::task_dir(&self.config.data_dir, &id);
                let files = store::executor_files(&self.config.data_dir, &id);
                (id, dir, files)
            })
            .collect();
        if tasks.is_empty() {
            self.schedule_output_check(ctx);
            return;
        }
        let limits = Limits {
            max_bytes: self.config.task_output_max_bytes,
            files: self.config.task_output_files,
        };
        let lock = self.output.lock.clone();
        let rotate_all = async move {
            tokio::task::spawn_blocking(move || rotate_uncaptured(&lock, tasks, limits)).await
        };
        ctx.defer(rotate_all, |agent: &mut Agent, ctx, checked| {
            match checked {
                Ok(checked) => agent.output_checked(checked),
                Err(error) => tracing::warn!(%error, "the task output check did not finish"),
            }
            agent.schedule_output_check(ctx);
        });
    }

    /// Logs what a rotation check did: rotations at debug, a task's failure once until it
    /// rotates again.
    fn output_checked(&mut self, checked: Vec<Checked>) {
        for (task, streams) in checked {
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
                        if !self.output.failing.contains(&task) {
                            tracing::warn!(task = %task, %stream, %error, "cannot rotate a task's output; it may grow past its limit");
                        }
                    }
                }
            }
            if failed {
                self.output.failing.insert(task);
            } else {
                self.output.failing.remove(&task);
            }
        }
        let running: HashSet<String> = self.tasks.running_ids().into_iter().collect();
        self.output.failing.retain(|task| running.contains(task));
    }

    /// Answers a master's `ReadTaskOutput`: checks the task id (it must name a directory under
    /// the data directory, and a task the agent runs or remembers), then reads on a blocking
    /// thread, which answers `reply` itself.
    pub(super) fn read_task_output(&self, request: ReadTaskOutput, reply: Reply<TaskOutputChunk>) {
        let refuse = |error: String| TaskOutputChunk {
            error,
            ..TaskOutputChunk::default()
        };
        let id = request.task_id;
        if let Err(error) = store::check_task_id(&id) {
            return reply.send(refuse(error.to_string()));
        }
        if !self.tasks.knows(&id) {
            return reply.send(refuse(format!(
                "no task {id:?} on this agent (neither running nor in its completed history)"
            )));
        }
        if self.config.task_runner.is_some() {
            return reply.send(refuse(format!(
                "task {id:?} is run by the agent's task runner, which keeps no output files"
            )));
        }
        let task_running = self.tasks.running_ids().contains(&id);
        let stream = if request.stderr {
            Stream::Stderr
        } else {
            Stream::Stdout
        };
        let dir = store::task_dir(&self.config.data_dir, &id);
        let lock_file = store::executor_files(&self.config.data_dir, &id).output_lock;
        let lock = self.output.lock.clone();
        let limit = usize::try_from(request.limit).unwrap_or(output::READ_LIMIT_MAX);
        let offset = request.offset;
        // Detached: the blocking task answers the ask itself.
        drop(tokio::task::spawn_blocking(move || {
            let answer = match output::read_task(&lock, &lock_file, &dir, stream, offset, limit) {
                Ok(chunk) => TaskOutputChunk {
                    data: chunk.data.into(),
                    offset: chunk.offset,
                    next_offset: chunk.next_offset,
                    first_offset: chunk.first_offset,
                    task_running,
                    error: String::new(),
                },
                Err(error) => refuse(format!("task {id:?}: cannot read its {stream}: {error}")),
            };
            reply.send(answer);
        }));
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
            let results: Vec<_> = streams
                .iter()
                .map(|(stream, result)| (*stream, result.as_ref().map(|r| r.map(|r| r.copied))))
                .collect();
            if id == "garbage" {
                assert!(
                    results.iter().all(|(_, result)| result
                        .as_ref()
                        .is_err_and(|error| error.contains("garbage.executor"))),
                    "{results:?}"
                );
            } else {
                assert_eq!(
                    results,
                    [(Stream::Stdout, Ok(Some(100))), (Stream::Stderr, Ok(None))],
                    "{id}"
                );
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

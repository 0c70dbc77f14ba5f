//! The agent process's side of its tasks' output files (see [`crate::output`]): the periodic
//! rotation of its running tasks' `stdout` and `stderr`, and the masters' `ReadTaskOutput`
//! asks. The file work runs on tokio's blocking threads, never on the agent process's: a large
//! copy or read does not hold up its messages.

use std::collections::HashSet;
use std::path::PathBuf;

use muster_actor::{Context, Reply};
use muster_proto::cluster::{ReadTaskOutput, TaskOutputChunk};

use super::{Agent, AgentMsg, Msg};
use crate::output::{self, Limits, OutputLock, Stream};
use crate::store;

/// What the agent keeps for its tasks' output files.
#[derive(Debug, Default)]
pub(super) struct Output {
    /// Serializes rotations and reads.
    lock: OutputLock,
    /// Tasks whose last rotation failed: warned about once, until one succeeds again.
    failing: HashSet<String>,
}

/// How one task's rotation check went: per stream, what was rotated, or why not.
type Checked = (
    String,
    Vec<(Stream, Result<Option<output::Rotated>, String>)>,
);

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

    /// Rotates the output files of the running tasks that are past the size limit, off the
    /// agent's thread; the next check is scheduled once this one is done, so checks never
    /// overlap.
    pub(super) fn check_output(&mut self, ctx: &mut Context<Self>) {
        let tasks: Vec<(String, PathBuf)> = self
            .tasks
            .running_ids()
            .into_iter()
            .map(|id| {
                let dir = store::task_dir(&self.config.data_dir, &id);
                (id, dir)
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
            tokio::task::spawn_blocking(move || {
                tasks
                    .into_iter()
                    .map(|(id, dir)| {
                        let streams = Stream::BOTH
                            .into_iter()
                            .map(|stream| {
                                let rotated = output::rotate(&lock, &dir, stream, limits)
                                    .map_err(|e| e.to_string());
                                (stream, rotated)
                            })
                            .collect();
                        (id, streams)
                    })
                    .collect::<Vec<Checked>>()
            })
            .await
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
            return reply.send(refuse(error));
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
        let lock = self.output.lock.clone();
        let limit = usize::try_from(request.limit).unwrap_or(output::READ_LIMIT_MAX);
        let offset = request.offset;
        // Detached: the blocking task answers the ask itself.
        drop(tokio::task::spawn_blocking(move || {
            let answer = match output::read(&lock, &dir, stream, offset, limit) {
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

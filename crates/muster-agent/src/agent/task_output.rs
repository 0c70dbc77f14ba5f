//! The agent process's side of its tasks' output files: the masters' `ReadTaskOutput` asks, and
//! the periodic check that keeps the files of running tasks within their bounds where their
//! executors do not (tasks an agent from before the executors' pipes started). The files are
//! its runner's ([`TaskRunner::read_output`], [`TaskRunner::check_output`]; a runner whose tasks
//! keep none refuses reads and asks for no checks); the file work runs on tokio's blocking
//! threads, never on the agent process's: a large copy or read does not hold up its messages.

use std::sync::Arc;

use muster_actor::{Context, Reply};
use muster_proto::cluster::{ReadTaskOutput, TaskOutputChunk};

use super::{Agent, AgentMsg, Msg};
use crate::runner::{OutputRead, TaskRunner};
use crate::store;

impl Agent {
    /// Schedules the next output check, one interval of the runner's from now; none if its
    /// tasks keep no output files.
    pub(super) fn schedule_output_check(&self, ctx: &mut Context<Self>) {
        if let Some(interval) = self.runner.output_check_interval() {
            ctx.delay(interval, AgentMsg(Msg::CheckOutput));
        }
    }

    /// Has the runner check the output files of the running tasks, off the agent's thread; the
    /// next check is scheduled once this one is done, so checks never overlap.
    pub(super) fn check_output(&mut self, ctx: &mut Context<Self>) {
        let running = self.tasks.running_ids();
        if running.is_empty() {
            self.schedule_output_check(ctx);
            return;
        }
        let runner = Arc::clone(&self.runner);
        let check =
            async move { tokio::task::spawn_blocking(move || runner.check_output(running)).await };
        ctx.defer(check, |agent: &mut Agent, ctx, checked| {
            if let Err(error) = checked {
                tracing::warn!(%error, "the task output check did not finish");
            }
            agent.schedule_output_check(ctx);
        });
    }

    /// Answers a master's `ReadTaskOutput`: checks the task id (it must name a directory under
    /// the data directory, and a task the agent runs or remembers), then has the runner read on
    /// a blocking thread, which answers `reply` itself.
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
        let task_running = self.tasks.running_ids().contains(&id);
        let read = OutputRead {
            stderr: request.stderr,
            offset: request.offset,
            limit: u64::from(request.limit),
        };
        let runner: Arc<dyn TaskRunner> = Arc::clone(&self.runner);
        // Detached: the blocking task answers the ask itself.
        drop(tokio::task::spawn_blocking(move || {
            let answer = match runner.read_output(&id, read) {
                Ok(chunk) => TaskOutputChunk {
                    data: chunk.data.into(),
                    offset: chunk.offset,
                    next_offset: chunk.next_offset,
                    first_offset: chunk.first_offset,
                    task_running,
                    error: String::new(),
                },
                Err(error) => refuse(error.to_string()),
            };
            reply.send(answer);
        }));
    }
}

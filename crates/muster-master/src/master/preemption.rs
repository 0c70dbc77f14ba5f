//! A plan's preemptions, applied: the tasks of lower-priority jobs a scheduler named to make
//! room are stopped before the plan's placements, and their jobs are evaluated again.
//!
//! The applier trusts none of it: the plan's job's type must be allowed to preempt
//! ([`MasterConfig::preemption`](crate::MasterConfig)), each task must run where the plan
//! says, and its job's priority (as the registry holds it) must be lower than the plan's
//! job's. A task that fails a check is left running; a placement that needed its room is then
//! rejected for want of room, as any stale plan's is.

use muster_actor::Context;
use muster_model::{Evaluation, Job, Trigger};
use muster_scheduler::{Plan, Preemption, Stop};

use super::Master;

impl Master {
    /// Stops the tasks `plan` preempts that pass the checks, before its placements are
    /// applied; returns them. `job` is the plan's job as the registry holds it.
    pub(super) fn preempt(
        &mut self,
        plan: &Plan,
        job: Option<&Job>,
        ctx: &mut Context<Self>,
    ) -> Vec<Preemption> {
        let Some(job) = job.filter(|_| !plan.preempt.is_empty()) else {
            return Vec::new();
        };
        if !self.config.preemption.allows(job.scheduler) {
            tracing::warn!(job = %job.name, kind = %job.scheduler, "plan preempts tasks, but jobs of its type may not: none stopped");
            return Vec::new();
        }
        let mut preempted = Vec::new();
        let mut evals: Vec<Evaluation> = Vec::new();
        for victim in &plan.preempt {
            let Some(their_job) = self.live_task_job(victim) else {
                continue;
            };
            let theirs = self
                .registry
                .reader()
                .read(|s| s.jobs.get(&their_job).cloned());
            let Some(theirs) = theirs.filter(|theirs| theirs.priority < job.priority) else {
                tracing::warn!(task = %victim.task_id, "plan preempts a task whose job's priority is not lower: left running");
                continue;
            };
            let stop = Stop {
                agent: victim.agent.clone(),
                task_id: victim.task_id.clone(),
            };
            if !self.stop_task(&stop, ctx) {
                continue;
            }
            tracing::info!(task = %victim.task_id, job = %their_job, by = %job.name, "task preempted");
            if !evals.iter().any(|e| e.job == theirs.name) {
                evals.push(Evaluation::new(
                    &theirs,
                    Trigger::Preempted(victim.task_id.clone()),
                ));
            }
            preempted.push(Preemption {
                agent: victim.agent.clone(),
                task_id: victim.task_id.clone(),
                job: their_job,
            });
        }
        if !evals.is_empty() {
            self.write_with_evals(Vec::new(), evals, ctx, |_, _, written| {
                if let Err(e) = written {
                    tracing::warn!(error = %e, "could not evaluate the preempted tasks' jobs");
                }
            });
        }
        preempted
    }

    /// The job of `victim`'s task, if it is live on the agent the plan names and its job is
    /// the one the plan names (which the scheduling API checked the caller's rights on).
    fn live_task_job(&self, victim: &Preemption) -> Option<String> {
        let agent = self.cluster.agents.get(&victim.agent.0)?;
        let task = agent
            .tasks
            .iter()
            .find(|t| t.id() == victim.task_id && !t.state().is_terminal())?;
        task.job_name()
            .filter(|job| *job == victim.job)
            .map(str::to_owned)
    }
}

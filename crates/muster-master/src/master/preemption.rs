//! A plan's preemptions, applied: the tasks of lower-priority jobs a scheduler named to make
//! room are stopped, where the plan's placements are committed, before those placements
//! launch, and their jobs are evaluated again.
//!
//! The applier trusts none of it: the plan's job's type must be allowed to preempt
//! ([`MasterConfig::preemption`](crate::MasterConfig)), each task must run where the plan
//! says and belong to the job it names, and that job's priority (as the registry holds it)
//! must be lower than the plan's job's. A task that fails a check keeps running. One that
//! passes counts its room as free for the plan's placements on its agent, and is stopped only
//! if one of them is committed there: a plan refused, or whose placements on that agent are
//! all rejected, stops nothing of another job.

use muster_actor::Context;
use muster_model::{Evaluation, Job, Resources, Trigger};
use muster_scheduler::{Plan, Preemption, Stop};

use super::Master;

impl Master {
    /// The tasks `plan` preempts that pass the checks, each with what it holds. `job` is the
    /// plan's job as the registry holds it.
    pub(super) fn victims(&self, plan: &Plan, job: Option<&Job>) -> Vec<(Preemption, Resources)> {
        let Some(job) = job.filter(|_| !plan.preempt.is_empty()) else {
            return Vec::new();
        };
        if !self.config.preemption.allows(job.scheduler) {
            tracing::warn!(job = %job.name, kind = %job.scheduler, "plan preempts tasks, but jobs of its type may not: none stopped");
            return Vec::new();
        }
        let mut victims: Vec<(Preemption, Resources)> = Vec::new();
        for victim in &plan.preempt {
            if victims.iter().any(|(v, _)| v.task_id == victim.task_id) {
                continue;
            }
            let Some(held) = self.live_task(victim) else {
                continue;
            };
            let lower = self.registry.reader().read(|s| {
                s.jobs
                    .get(&victim.job)
                    .is_some_and(|theirs| theirs.priority < job.priority)
            });
            if !lower {
                tracing::warn!(task = %victim.task_id, "plan preempts a task whose job's priority is not lower: left running");
                continue;
            }
            victims.push((victim.clone(), held));
        }
        victims
    }

    /// Stops `victims` (checked by [`victims`](Self::victims)) for a plan of `job`, and
    /// evaluates each of their jobs again; returns those stopped.
    pub(super) fn stop_victims(
        &mut self,
        victims: Vec<Preemption>,
        job: Option<&Job>,
        ctx: &mut Context<Self>,
    ) -> Vec<Preemption> {
        let by = job.map_or("", |job| job.name.as_str());
        let mut evals: Vec<Evaluation> = Vec::new();
        let mut preempted = Vec::new();
        for victim in victims {
            let stop = Stop {
                agent: victim.agent.clone(),
                task_id: victim.task_id.clone(),
            };
            if !self.stop_task(&stop, ctx) {
                continue;
            }
            tracing::info!(task = %victim.task_id, job = %victim.job, %by, "task preempted");
            if !evals.iter().any(|e| e.job == victim.job)
                && let Some(theirs) = self
                    .registry
                    .reader()
                    .read(|s| s.jobs.get(&victim.job).cloned())
            {
                let trigger = Trigger::Preempted(victim.task_id.clone());
                evals.push(Evaluation::new(&theirs, trigger));
            }
            preempted.push(victim);
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

    /// What `victim`'s task holds, if it is live on the agent the plan names and its job is the
    /// one the plan names (which the scheduling API checked the caller's rights on).
    fn live_task(&self, victim: &Preemption) -> Option<Resources> {
        let agent = self.cluster.agents.get(&victim.agent.0)?;
        let task = agent.tasks.iter().find(|t| {
            t.id() == victim.task_id
                && !t.state().is_terminal()
                && t.job_name() == Some(victim.job.as_str())
        })?;
        Some(task.view.resources.clone())
    }
}

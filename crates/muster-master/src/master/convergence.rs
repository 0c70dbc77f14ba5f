//! Convergence: the leading master's periodic check that every job runs what it asks for.
//!
//! Every evaluation path (a submission, a task's end, a lost agent, capacity freed) makes the
//! evaluation that brings a job back to its count. But a leader can die between an event and
//! its evaluation's write, a new leader rebuilds tasks from what agents report, and a task can
//! be adopted from a returning agent: what is asked and what runs can part with nothing left to
//! notice. Every [`reconcile_interval`](crate::MasterConfig::reconcile_interval) the leader
//! compares, job by job, the tasks that run (not ended, not being killed) with what the job
//! asks, and gives each job that differs and has no evaluation in flight (pending or blocked)
//! one evaluation, triggered `Reconcile`. The schedulers do the rest: too few are placed, too
//! many stopped.
//!
//! Its cost is bounded: one pass over the tasks and one over the jobs, and at most
//! [`MAX_RECONCILE_EVALS`] evaluations per round, written in one raft entry. It waits while a
//! new leader recovers (the tasks of agents not back yet are unknown).

use std::collections::{HashMap, HashSet};

use muster_actor::Context;
use muster_model::{EvalStatus, Evaluation, Job, SchedulerType, Trigger};

use super::Master;
use super::leadership::Role;
use super::tasks::{is_terminal, task_job};

/// Most evaluations one round makes; the rest wait for the next.
pub(super) const MAX_RECONCILE_EVALS: usize = 500;

impl Master {
    /// One round of the check (see the module).
    pub(super) fn reconcile_jobs(&mut self, ctx: &mut Context<Self>) {
        let Role::Leading { recovery, .. } = &self.role else {
            return;
        };
        if recovery.is_some() {
            return;
        }
        // Running tasks per job and group.
        let mut running: HashMap<(&str, &str), u32> = HashMap::new();
        for agent in self.cluster.agents.values() {
            for task in agent.tasks.iter().filter(|t| !is_terminal(t)) {
                if let Some(job) = task_job(task) {
                    *running.entry((job, task.group.as_str())).or_default() += 1;
                }
            }
        }
        let evals: Vec<Evaluation> = self.registry.reader().read(|state| {
            let in_flight: HashSet<&str> = state
                .evals
                .values()
                .filter(|e| matches!(e.status, EvalStatus::Pending | EvalStatus::Blocked))
                .map(|e| e.job.as_str())
                .collect();
            state
                .jobs
                .values()
                .filter(|job| !in_flight.contains(job.name.as_str()))
                .filter(|job| diverges(job, &running))
                .take(MAX_RECONCILE_EVALS)
                .map(|job| Evaluation::new(job, Trigger::Reconcile))
                .collect()
        });
        if evals.is_empty() {
            return;
        }
        let jobs: Vec<String> = evals.iter().map(|e| e.job.clone()).collect();
        tracing::warn!(
            ?jobs,
            "jobs whose running tasks differ from what they ask for: evaluating them"
        );
        self.metrics.reconcile_evals += evals.len() as u64;
        self.write_with_evals(Vec::new(), evals, ctx, |_master, _ctx, written| {
            if let Err(error) = written {
                tracing::warn!(%error, "could not write the reconciliation's evaluations");
            }
        });
    }
}

/// Whether `job`'s running tasks differ from what it asks for: any for a stopped job; another
/// count than a group's for a service job (or tasks of a group it no longer has); more than a
/// group's count for a batch job (one that finished needs no replacement). System jobs run one
/// task per eligible agent, which agents' arrivals and departures already evaluate.
fn diverges(job: &Job, running: &HashMap<(&str, &str), u32>) -> bool {
    let of_job = || {
        running
            .iter()
            .filter(|((name, _), _)| *name == job.name)
            .map(|(_, count)| *count)
            .sum::<u32>()
    };
    if job.stopped {
        return of_job() > 0;
    }
    let counted = |group: &str| {
        running
            .get(&(job.name.as_str(), group))
            .copied()
            .unwrap_or(0)
    };
    match job.scheduler {
        SchedulerType::Service => {
            let in_groups: u32 = job.groups.iter().map(|g| counted(&g.name)).sum();
            job.groups.iter().any(|g| counted(&g.name) != g.count) || in_groups != of_job()
        }
        SchedulerType::Batch => job.groups.iter().any(|g| counted(&g.name) > g.count),
        SchedulerType::System => false,
    }
}

#[cfg(test)]
mod tests {
    use muster_model::{Resources, TaskGroup};

    use super::*;

    fn job(scheduler: SchedulerType, counts: &[u32]) -> Job {
        Job {
            name: "web".into(),
            priority: 50,
            scheduler,
            groups: counts
                .iter()
                .enumerate()
                .map(|(i, count)| TaskGroup {
                    name: format!("g{i}"),
                    count: *count,
                    resources: Resources {
                        cpus: 1.0,
                        mem_mb: 64,
                    },
                    ..TaskGroup::default()
                })
                .collect(),
            stopped: false,
            version: 1,
        }
    }

    #[test]
    fn too_few_too_many_and_leftovers_diverge() {
        let service = job(SchedulerType::Service, &[2, 1]);
        let mut running = HashMap::from([(("web", "g0"), 2), (("web", "g1"), 1)]);
        assert!(!diverges(&service, &running));
        running.insert(("web", "g1"), 0);
        assert!(diverges(&service, &running), "too few");
        running.insert(("web", "g1"), 2);
        assert!(diverges(&service, &running), "too many");
        running.insert(("web", "g1"), 1);
        running.insert(("web", "gone"), 1);
        assert!(
            diverges(&service, &running),
            "a group the job no longer has"
        );

        let batch = job(SchedulerType::Batch, &[2]);
        assert!(
            !diverges(&batch, &HashMap::new()),
            "finished batch tasks stay finished"
        );
        assert!(diverges(&batch, &HashMap::from([(("web", "g0"), 3)])));

        let mut stopped = job(SchedulerType::Service, &[1]);
        stopped.stopped = true;
        assert!(diverges(&stopped, &HashMap::from([(("web", "g0"), 1)])));
        assert!(!diverges(&stopped, &HashMap::new()));
    }
}

//! Convergence: the leading master's periodic check that every job runs what it asks for.
//!
//! Every evaluation path (a submission, a task's end, a lost agent, capacity freed) makes the
//! evaluation that brings a job back to its count. But a leader can die between an event and
//! its evaluation's write, a new leader rebuilds tasks from what agents report, and a task can
//! be adopted from a returning agent: what is asked and what runs can part with nothing left to
//! notice. Every [`reconcile_interval`](crate::MasterConfig::reconcile_interval) the leader
//! compares, job by job, the tasks that run (not ended, not being killed) with what the job
//! asks (for a system job, agent by agent: one task on each connected, eligible agent its
//! constraints admit), and gives each job that differs and has no evaluation in flight (pending,
//! or blocked but for a job with a slot running twice: the blocked evaluation waits for
//! capacity the second copy holds) one evaluation, triggered `Reconcile`; so does a job with one slot (task name) running
//! twice, even when its counts match; and a batch job with a slot filled neither by a live
//! task nor by one that finished (a launch lost with its leader before it was confirmed). The
//! schedulers do the rest: too few are placed, too many stopped.
//!
//! Its cost is bounded: one pass over the tasks and one over the jobs, and at most
//! [`MAX_RECONCILE_EVALS`] evaluations per round, written in one raft entry. It waits while a
//! new leader recovers (the tasks of agents not back yet are unknown).

use std::collections::{BTreeMap, HashMap, HashSet};

use muster_actor::Context;
use muster_model::{Constraint, EvalStatus, Evaluation, Job, SchedulerType, TaskState, Trigger};

use crate::master::Master;
use crate::master::leadership::Role;

/// Most evaluations one round makes; the rest wait for the next.
pub(in crate::master) const MAX_RECONCILE_EVALS: usize = 500;

impl Master {
    /// One round of the check (see the module).
    pub(in crate::master) fn check_convergence(
        &mut self,
        _timer: super::CheckConvergence,
        ctx: &mut Context<Self>,
    ) {
        let Role::Leading { recovery, .. } = &self.role else {
            return;
        };
        if recovery.is_some() {
            return;
        }
        // Tasks on unreachable agents that keep their slots: counted as running.
        let kept_away = self.tasks_kept_while_away();
        // Running tasks per job and group, and per job, group and agent (system jobs).
        let mut running: HashMap<(&str, &str), u32> = HashMap::new();
        let mut on_agents = OnAgents::new();
        // Jobs with a slot (task name) running more than once: the counts can match while
        // one slot runs twice and another not at all.
        let mut slots = HashSet::new();
        let mut doubled: HashSet<&str> = HashSet::new();
        // Batch slots filled, by a live task or one that finished: one that never ran (its
        // launch lost, its leader gone before it was confirmed) is in neither.
        let mut batch_slots: HashSet<(&str, &str, &str)> = HashSet::new();
        for (agent_id, agent) in &self.cluster.agents {
            for task in agent.tasks.iter().filter(|t| !t.is_terminal()) {
                if let Some(job) = task.job_name() {
                    if !slots.insert((job, task.name())) {
                        doubled.insert(job);
                    }
                    batch_slots.insert((job, task.view.group(), task.name()));
                    *running.entry((job, task.view.group())).or_default() += 1;
                    *on_agents
                        .entry((job, task.view.group(), agent_id.as_str()))
                        .or_default() += 1;
                }
            }
            let finished = agent
                .completed_tasks
                .iter()
                .filter(|t| t.state() == TaskState::Finished);
            for task in finished {
                if let Some(job) = task.job_name() {
                    batch_slots.insert((job, task.view.group(), task.name()));
                }
            }
        }
        for task in &kept_away {
            if !slots.insert((task.job.as_str(), task.name.as_str())) {
                doubled.insert(task.job.as_str());
            }
            batch_slots.insert((&task.job, &task.group, &task.name));
            *running.entry((&task.job, &task.group)).or_default() += 1;
        }
        // Batch slots the registry records as finished (their agent may be away).
        let finished: Vec<(String, String, String)> = self.registry.reader().read(|state| {
            state
                .jobs
                .values()
                .filter(|job| job.scheduler == SchedulerType::Batch)
                .flat_map(|job| {
                    state
                        .finished_slots(job)
                        .map(|(group, slot)| (job.name.clone(), group.to_owned(), slot.to_owned()))
                })
                .collect()
        });
        for (job, group, slot) in &finished {
            batch_slots.insert((job, group, slot));
        }
        // By job and group, the indices of the filled slots (the job's count may have been
        // lowered since a higher one finished: `diverges` counts those below it).
        let mut filled: HashMap<(&str, &str), Vec<usize>> = HashMap::new();
        for (job, group, slot) in batch_slots {
            if let Some(index) = muster_scheduler::counted_slot_index(job, group, slot) {
                filled.entry((job, group)).or_default().push(index);
            }
        }
        // Where a system job's tasks belong: every connected agent new tasks may go to, by
        // its attributes (a drained agent's system tasks stopped for good).
        let scheduling = self.agent_scheduling();
        let agents: Vec<(&str, &BTreeMap<String, String>)> = self
            .cluster
            .agents
            .iter()
            .filter(|(id, agent)| agent.connected && scheduling.get(*id).is_none_or(|s| s.eligible))
            .map(|(id, agent)| (id.as_str(), &agent.info.attributes))
            .collect();
        let evals: Vec<Evaluation> = self.registry.reader().read(|state| {
            let pending: HashSet<&str> = state
                .evals
                .values()
                .filter(|e| e.status == EvalStatus::Pending)
                .map(|e| e.job.as_str())
                .collect();
            let blocked: HashSet<&str> = state
                .evals
                .values()
                .filter(|e| e.status == EvalStatus::Blocked)
                .map(|e| e.job.as_str())
                .collect();
            state
                .jobs
                .values()
                .filter(|job| !pending.contains(job.name.as_str()))
                // A blocked evaluation waits for capacity; a slot running twice holds some
                // that only an evaluation can free, so it does not wait behind one.
                .filter(|job| {
                    !blocked.contains(job.name.as_str()) || doubled.contains(job.name.as_str())
                })
                .filter(|job| {
                    doubled.contains(job.name.as_str())
                        || diverges(job, &running, &filled, &on_agents, &agents)
                })
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

/// Running tasks per job, group and agent.
type OnAgents<'a> = HashMap<(&'a str, &'a str, &'a str), u32>;

/// Whether `job`'s running tasks differ from what it asks for: any for a stopped job; another
/// count than a group's for a service job (or tasks of a group it no longer has); for a batch
/// job, more than a group's count running, or fewer of its slots below the count `filled` (by
/// a live task or one that finished; by index) than its count; for a system job,
/// on some connected agent of `agents` (id, attributes), none of a group whose constraints
/// admit the agent, more than one, or any of a group whose constraints do not.
fn diverges(
    job: &Job,
    running: &HashMap<(&str, &str), u32>,
    filled: &HashMap<(&str, &str), Vec<usize>>,
    on_agents: &OnAgents<'_>,
    agents: &[(&str, &BTreeMap<String, String>)],
) -> bool {
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
        SchedulerType::Batch => job.groups.iter().any(|g| {
            let slots = filled
                .get(&(job.name.as_str(), g.name.as_str()))
                .map_or(0, |indices| {
                    indices.iter().filter(|&&i| i < g.count as usize).count()
                });
            counted(&g.name) > g.count || slots < g.count as usize
        }),
        SchedulerType::System => {
            let in_groups: u32 = job.groups.iter().map(|g| counted(&g.name)).sum();
            in_groups != of_job()
                || job.groups.iter().any(|group| {
                    agents.iter().any(|(agent, attributes)| {
                        let here = on_agents
                            .get(&(job.name.as_str(), group.name.as_str(), *agent))
                            .copied()
                            .unwrap_or(0);
                        let admitted = Constraint::all_admit(&group.constraints, attributes);
                        if admitted { here != 1 } else { here > 0 }
                    })
                })
        }
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
            named_scheduler: None,
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

    /// No batch slot filled (what a service or system job's check ignores).
    fn none() -> HashMap<(&'static str, &'static str), Vec<usize>> {
        HashMap::new()
    }

    #[test]
    fn too_few_too_many_and_leftovers_diverge() {
        let service = job(SchedulerType::Service, &[2, 1]);
        let mut running = HashMap::from([(("web", "g0"), 2), (("web", "g1"), 1)]);
        assert!(!diverges(
            &service,
            &running,
            &none(),
            &OnAgents::new(),
            &[]
        ));
        running.insert(("web", "g1"), 0);
        assert!(
            diverges(&service, &running, &none(), &OnAgents::new(), &[]),
            "too few"
        );
        running.insert(("web", "g1"), 2);
        assert!(
            diverges(&service, &running, &none(), &OnAgents::new(), &[]),
            "too many"
        );
        running.insert(("web", "g1"), 1);
        running.insert(("web", "gone"), 1);
        assert!(
            diverges(&service, &running, &none(), &OnAgents::new(), &[]),
            "a group the job no longer has"
        );

        let batch = job(SchedulerType::Batch, &[2]);
        let two_filled = HashMap::from([(("web", "g0"), vec![0, 1])]);
        assert!(
            !diverges(&batch, &HashMap::new(), &two_filled, &OnAgents::new(), &[]),
            "finished batch tasks stay finished"
        );
        assert!(diverges(
            &batch,
            &HashMap::from([(("web", "g0"), 3)]),
            &HashMap::from([(("web", "g0"), vec![0, 1, 2])]),
            &OnAgents::new(),
            &[]
        ));
        assert!(
            diverges(
                &batch,
                &HashMap::from([(("web", "g0"), 1)]),
                &HashMap::from([(("web", "g0"), vec![0])]),
                &OnAgents::new(),
                &[]
            ),
            "a batch slot that never ran (nor runs) is missing"
        );
        assert!(
            diverges(
                &batch,
                &HashMap::new(),
                &HashMap::from([(("web", "g0"), vec![1, 2])]),
                &OnAgents::new(),
                &[]
            ),
            "a slot above the count, finished before the count was lowered, fills none below"
        );

        let mut stopped = job(SchedulerType::Service, &[1]);
        stopped.stopped = true;
        assert!(diverges(
            &stopped,
            &HashMap::from([(("web", "g0"), 1)]),
            &none(),
            &OnAgents::new(),
            &[]
        ));
        assert!(!diverges(
            &stopped,
            &HashMap::new(),
            &none(),
            &OnAgents::new(),
            &[]
        ));
    }

    #[test]
    fn a_system_job_diverges_on_an_agent_without_its_task_or_with_two() {
        let mut system = job(SchedulerType::System, &[0]);
        system.groups[0].constraints = vec![Constraint {
            attribute: "rack".into(),
            op: muster_model::ConstraintOp::Equal,
            value: "r1".into(),
        }];
        let r1 = BTreeMap::from([("rack".to_owned(), "r1".to_owned())]);
        let r2 = BTreeMap::from([("rack".to_owned(), "r2".to_owned())]);
        let agents = [("a1", &r1), ("a2", &r1), ("a3", &r2)];
        let totals = |n| HashMap::from([(("web", "g0"), n)]);
        let one_each = OnAgents::from([(("web", "g0", "a1"), 1), (("web", "g0", "a2"), 1)]);
        assert!(!diverges(&system, &totals(2), &none(), &one_each, &agents));
        let missing = OnAgents::from([(("web", "g0", "a1"), 1)]);
        assert!(
            diverges(&system, &totals(1), &none(), &missing, &agents),
            "an admitted agent runs none"
        );
        let twice = OnAgents::from([(("web", "g0", "a1"), 2), (("web", "g0", "a2"), 1)]);
        assert!(
            diverges(&system, &totals(3), &none(), &twice, &agents),
            "one runs two"
        );
        let outside = OnAgents::from([
            (("web", "g0", "a1"), 1),
            (("web", "g0", "a2"), 1),
            (("web", "g0", "a3"), 1),
        ]);
        assert!(
            diverges(&system, &totals(3), &none(), &outside, &agents),
            "an agent its constraints do not admit runs one"
        );
    }
}

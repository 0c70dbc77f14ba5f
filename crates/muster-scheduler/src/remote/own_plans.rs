//! The placements a `RemoteBackend`'s own workers submitted that the snapshots it gives may
//! not show yet: a plan on its way to the master, or committed at an index its copy of the
//! cluster has not reached.
//!
//! Two workers planning against one copy would otherwise both fill the agents it shows free,
//! and the master would refuse the second plan's placements for the first's; the second
//! worker would then wait for the copy to bring the first's back and plan again. Each
//! snapshot the backend gives carries them instead, as staged tasks, until the copy reaches
//! the index the master committed them at.
//!
//! They only ever add tasks the master holds, or may soon: a placement the master rejects
//! leaves with its answer, and a plan with no answer (an error, a lost connection, a caller
//! that gave up) leaves when its submission ends. Committed ones leave once a snapshot is at
//! their index, or older than one given before (the copy follows a new leader, which counts
//! its indexes anew), and any after [`KEPT_FOR`]. The master's plan applier stays the judge
//! of what fits.
//!
//! The tasks added hold room and ports but belong to no job ([`OWN_PLAN_JOB`]): they fill no
//! job's slot and are preempted by none. A placement that does not come to be (its plan
//! refused because the evaluation went to another worker, or its leader gone before its agent
//! heard of it) can then cost room for a moment, never a slot left empty.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use muster_model::AgentId;

use crate::plan::{ClusterSnapshot, JobIndex, Plan, PlanResult, TaskView};

/// How long a plan's placements are added at most: far longer than a copy takes to catch up
/// (milliseconds), short enough that a stale one costs little room.
pub(super) const KEPT_FOR: Duration = Duration::from_secs(1);

/// The job the added tasks are staged under: no job's id, in no namespace (names of both are
/// letters, digits, `-` and `_`), so reconciliation counts them in no slot, preemption never
/// picks them, and no namespace's quota counts them.
pub(super) const OWN_PLAN_JOB: &str = "(own plans):(a plan of this backend)";

/// The backend's plans that its snapshots add.
#[derive(Debug, Default)]
pub(super) struct OwnPlans {
    plans: Mutex<Plans>,
    next_id: AtomicU64,
}

#[derive(Debug, Default)]
struct Plans {
    plans: Vec<OwnPlan>,
    /// The newest snapshot index seen.
    newest: u64,
}

#[derive(Debug)]
struct OwnPlan {
    id: u64,
    /// The master's index for it, once it answered.
    committed_at: Option<u64>,
    since: Instant,
    /// Its placements, as the tasks they stage, by agent.
    tasks: Vec<(AgentId, Arc<TaskView>)>,
}

/// A plan being submitted: its placements count until it is [`answered`](Self::answered),
/// and leave if it is dropped unanswered.
#[derive(Debug)]
pub(super) struct Submitting<'a> {
    plans: &'a OwnPlans,
    id: u64,
    answered: bool,
}

impl OwnPlans {
    fn lock(&self) -> std::sync::MutexGuard<'_, Plans> {
        self.plans.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts `plan`'s placements from now on.
    pub(super) fn submitting(&self, plan: &Plan) -> Submitting<'_> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        if !plan.place.is_empty() {
            let tasks = plan
                .place
                .iter()
                .map(|p| (p.agent.clone(), Arc::new(p.staged_task_of(OWN_PLAN_JOB))))
                .collect();
            self.lock().plans.push(OwnPlan {
                id,
                committed_at: None,
                since: Instant::now(),
                tasks,
            });
        }
        Submitting {
            plans: self,
            id,
            answered: false,
        }
    }

    /// Adds to `snapshot` the placements of plans it may not show: not answered yet, or
    /// committed after the newest index seen (none once a snapshot goes back, as a copy that
    /// follows a new leader does). An agent it does not have, or that holds the task already,
    /// is left as it is.
    pub(super) fn add_to(&self, snapshot: &mut ClusterSnapshot) {
        let mut own = self.lock();
        let now = Instant::now();
        let went_back = snapshot.index < own.newest;
        own.newest = own.newest.max(snapshot.index);
        let newest = own.newest;
        own.plans.retain(|plan| {
            now.duration_since(plan.since) < KEPT_FOR
                && match plan.committed_at {
                    None => true,
                    Some(at) => !went_back && at > newest,
                }
        });
        let mut added = false;
        for (agent, task) in own.plans.iter().flat_map(|plan| &plan.tasks) {
            let Ok(at) = snapshot.agents.binary_search_by(|view| view.id.cmp(agent)) else {
                continue;
            };
            let view = &mut snapshot.agents[at];
            if view.tasks().iter().any(|held| held.id() == task.id()) {
                continue;
            }
            Arc::make_mut(view).add_task(Arc::clone(task));
            added = true;
        }
        if added {
            snapshot.job_index = Some(JobIndex::update(
                snapshot.job_index.as_ref(),
                &snapshot.agents,
            ));
        }
    }
}

impl Submitting<'_> {
    /// The master answered: the committed placements count until the copy reaches
    /// `result.index`; the rejected ones no longer.
    pub(super) fn answered(mut self, result: &PlanResult) {
        self.answered = true;
        let committed: HashSet<&str> = result
            .committed
            .iter()
            .map(|p| p.task_id.as_str())
            .collect();
        let mut own = self.plans.lock();
        if let Some(plan) = own.plans.iter_mut().find(|plan| plan.id == self.id) {
            plan.tasks.retain(|(_, task)| committed.contains(task.id()));
            plan.committed_at = Some(result.index);
        }
        own.plans.retain(|plan| !plan.tasks.is_empty());
    }
}

impl Drop for Submitting<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.plans.lock().plans.retain(|plan| plan.id != self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use muster_model::{EvalId, Resources};

    use super::*;
    use crate::plan::{AgentView, Placement};

    fn agent(n: u32) -> Arc<AgentView> {
        Arc::new(AgentView::new(
            AgentId(format!("agent-{n}")),
            BTreeMap::new(),
            Resources {
                cpus: 4.0,
                mem_mb: 1024,
            },
            Vec::<TaskView>::new(),
        ))
    }

    fn at(index: u64) -> ClusterSnapshot {
        let agents = vec![agent(1), agent(2)];
        ClusterSnapshot {
            index,
            job_index: Some(JobIndex::update(None, &agents)),
            agents,
            ..ClusterSnapshot::default()
        }
    }

    fn placement(agent: u32, slot: u32) -> Placement {
        Placement {
            agent: AgentId(format!("agent-{agent}")),
            task_id: format!("web.fe[{slot}]-0000000{slot}"),
            name: format!("web.fe[{slot}]"),
            job: "web".into(),
            group: "fe".into(),
            resources: Resources {
                cpus: 1.0,
                mem_mb: 64,
            },
            job_version: 1,
            ports: Vec::new(),
        }
    }

    /// A snapshot at `index`, as `own` gives it.
    fn given(own: &OwnPlans, index: u64) -> ClusterSnapshot {
        let mut snapshot = at(index);
        own.add_to(&mut snapshot);
        snapshot
    }

    /// The task ids on each agent of `snapshot`.
    fn tasks(snapshot: &ClusterSnapshot) -> Vec<Vec<String>> {
        snapshot
            .agents
            .iter()
            .map(|agent| agent.tasks().iter().map(|t| t.id().to_owned()).collect())
            .collect()
    }

    fn plan() -> Plan {
        let mut plan = Plan::empty(EvalId("eval-1".into()), "web", 7);
        plan.place = vec![placement(1, 0), placement(2, 1), placement(3, 2)];
        plan
    }

    #[test]
    fn a_plan_counts_while_submitted_then_its_committed_placements_until_the_copy_has_them() {
        let own = OwnPlans::default();
        let submitting = own.submitting(&plan());
        let snapshot = given(&own, 7);
        // Agent 3 is not in the snapshot: that placement is left out.
        assert_eq!(
            tasks(&snapshot),
            [["web.fe[0]-00000000"], ["web.fe[1]-00000001"]]
        );
        // They hold room, but fill none of the job's slots.
        assert_eq!(snapshot.agents[0].used().cpus, 1.0);
        assert!(snapshot.agents[0].tasks_of("web").is_empty());
        assert_eq!(snapshot.agents[0].tasks()[0].job(), OWN_PLAN_JOB);
        let quotas = [(
            muster_model::DEFAULT_NAMESPACE.to_owned(),
            muster_model::Quota {
                cpus: Some(1.0),
                ..muster_model::Quota::default()
            },
        )]
        .into();
        let usage = crate::quota::usage(&quotas, &snapshot.agents, "web", &[]);
        assert_eq!(
            usage.map(|u| u.used.cpus),
            Some(0.0),
            "no quota counts them"
        );
        let index = snapshot.job_index.as_ref().expect("a job index");
        assert!(index.holds_for(&snapshot.agents), "the job index follows");

        // Committed at 9, one of them rejected.
        let result = PlanResult {
            committed: vec![placement(2, 1)],
            rejected: vec![placement(1, 0), placement(3, 2)],
            index: 9,
            ..PlanResult::default()
        };
        submitting.answered(&result);
        let behind = given(&own, 8);
        assert_eq!(tasks(&behind), [vec![], vec!["web.fe[1]-00000001"]]);
        let caught_up = given(&own, 9);
        assert_eq!(tasks(&caught_up), [Vec::<String>::new(), vec![]]);
        // Gone for good: an older snapshot no longer gets it.
        let older = given(&own, 8);
        assert_eq!(tasks(&older), [Vec::<String>::new(), vec![]]);
    }

    #[test]
    fn a_plan_left_unanswered_counts_no_more_and_a_task_held_already_is_not_added_twice() {
        let own = OwnPlans::default();
        let submitting = own.submitting(&plan());
        let snapshot = given(&own, 7);
        // The copy caught up with the staged task before the answer came.
        let mut again = snapshot.clone();
        own.add_to(&mut again);
        assert_eq!(tasks(&again), tasks(&snapshot));
        drop(submitting);
        let after = given(&own, 7);
        assert_eq!(tasks(&after), [Vec::<String>::new(), vec![]]);
    }

    #[test]
    fn a_snapshot_older_than_one_given_before_drops_what_was_committed() {
        let own = OwnPlans::default();
        let submitting = own.submitting(&plan());
        submitting.answered(&PlanResult {
            committed: vec![placement(1, 0)],
            index: 50,
            ..PlanResult::default()
        });
        let before = given(&own, 40);
        assert_eq!(tasks(&before)[0], ["web.fe[0]-00000000"]);
        // A new leader: the copy now counts from 12.
        let new_leader = given(&own, 12);
        assert_eq!(tasks(&new_leader), [Vec::<String>::new(), vec![]]);
    }
}

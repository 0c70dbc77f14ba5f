//! Namespaces' quotas as a plan is built: a namespace's live tasks in the snapshot, less the
//! plan's stops, plus its placements, stay within the namespace's quota (Nomad's quota
//! specifications). The plan applier counts again, authoritatively, against the cluster as
//! the master knows it.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use muster_model::{Quota, QuotaUsage, namespace_of, task_namespace};

use crate::plan::{AgentView, Stop};

/// What the namespace of `job` holds on `agents` (a snapshot's, each once), counted against
/// its quota in `quotas`: its live (non-terminal) tasks, of every job (system jobs' too), but
/// those `stops` stop. `None` if the namespace's quota sets no limit.
pub(crate) fn usage(
    quotas: &BTreeMap<String, Quota>,
    agents: &[Arc<AgentView>],
    job: &str,
    stops: &[Stop],
) -> Option<QuotaUsage> {
    let namespace = namespace_of(job);
    let quota = quotas
        .get(namespace)
        .filter(|quota| !quota.is_unlimited())?;
    let stopped: HashSet<&str> = stops.iter().map(|stop| stop.task_id.as_str()).collect();
    let mut usage = QuotaUsage::new(namespace, quota.clone());
    for agent in agents {
        count_on(agent, &stopped, &mut usage);
    }
    Some(usage)
}

/// Counts into `usage` the live tasks of its namespace on `agent` that `stopped` does not
/// name. A job of another namespace costs a look at its first task.
fn count_on(agent: &AgentView, stopped: &HashSet<&str>, usage: &mut QuotaUsage) {
    for tasks in agent.tasks_by_job() {
        // Tasks launched by hand have no job and count by their names.
        let Some(first) = tasks.first() else {
            continue;
        };
        if !first.job().is_empty() && namespace_of(first.job()) != usage.namespace {
            continue;
        }
        for task in tasks {
            if !task.state.is_terminal()
                && task_namespace(task.job(), task.name()) == usage.namespace
                && !stopped.contains(task.id())
            {
                usage.add(&task.resources);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use muster_model::{AgentId, Resources, TaskState};

    use super::*;
    use crate::plan::{ClusterSnapshot, JobGroup, TaskView};

    fn task(job: &str, id: &str, cpus: f64, state: TaskState) -> TaskView {
        TaskView::new(
            id,
            id,
            JobGroup::new(job, "g"),
            Resources { cpus, mem_mb: 10 },
            state,
            1,
        )
    }

    fn agent(id: &str, tasks: Vec<TaskView>) -> Arc<AgentView> {
        let total = Resources {
            cpus: 64.0,
            mem_mb: 1 << 20,
        };
        Arc::new(AgentView::new(
            AgentId(id.into()),
            BTreeMap::new(),
            total,
            tasks,
        ))
    }

    fn of(snapshot: &ClusterSnapshot, job: &str, stops: &[Stop]) -> Option<QuotaUsage> {
        usage(&snapshot.quotas, &snapshot.agents_by_id(), job, stops)
    }

    #[test]
    fn a_namespace_counts_its_live_tasks_of_every_job_less_the_plans_stops() {
        let snapshot = ClusterSnapshot {
            agents: vec![
                agent(
                    "a1",
                    vec![
                        task("team-a:web", "team-a:web.g[0]-1", 1.0, TaskState::Running),
                        task("team-a:web", "team-a:web.g[1]-1", 1.0, TaskState::Finished),
                        task("team-a:db", "team-a:db.g[0]-1", 2.0, TaskState::Staging),
                        task("team-b:web", "team-b:web.g[0]-1", 4.0, TaskState::Running),
                        task("web", "web.g[0]-1", 8.0, TaskState::Running),
                    ],
                ),
                agent(
                    "a2",
                    vec![
                        task("team-a:web", "team-a:web.g[2]-1", 1.0, TaskState::Lost),
                        task("team-a:web", "team-a:web.g[3]-1", 0.5, TaskState::Unknown),
                        task("", "team-a:adhoc-1", 0.25, TaskState::Running),
                    ],
                ),
            ],
            quotas: BTreeMap::from([(
                "team-a".to_owned(),
                Quota {
                    tasks: Some(10),
                    ..Quota::default()
                },
            )]),
            ..ClusterSnapshot::default()
        };
        let counted = of(&snapshot, "team-a:web", &[]).expect("team-a has a quota");
        assert_eq!(counted.tasks, 4);
        assert!(
            (counted.used.cpus - 3.75).abs() < 1e-9,
            "{:?}",
            counted.used
        );

        let stop = Stop {
            agent: AgentId("a1".into()),
            task_id: "team-a:web.g[0]-1".into(),
        };
        let counted = of(&snapshot, "team-a:web", &[stop]).expect("team-a has a quota");
        assert_eq!(counted.tasks, 3);
        assert!(
            (counted.used.cpus - 2.75).abs() < 1e-9,
            "{:?}",
            counted.used
        );

        assert_eq!(of(&snapshot, "team-b:web", &[]), None);
        assert_eq!(of(&snapshot, "web", &[]), None);
    }
}

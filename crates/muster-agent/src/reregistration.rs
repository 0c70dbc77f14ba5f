//! How an agent reports its running tasks when it re-registers with a master that reads them
//! grouped: tasks that share their labels are sent together, with the labels once; and how a
//! re-registration is kept within the transport's message limit.
//!
//! The tasks of one job or group usually carry the same labels, and a leading master reads
//! every re-registration of the cluster right after a failover: grouped, a label costs it one
//! read per group instead of one per task.

use std::collections::HashMap;

use muster_proto::cluster::{ReregisterAgent, TasksSharingLabels};
use muster_proto::model::Task;
use prost::Message as _;

/// The most bytes a re-registration may take, encoded: under the transport's default message
/// limit (4 MiB) with room to spare. A job may be 1 MiB, so a few of its tasks with their
/// environments would not fit otherwise, and the agent could never re-register.
pub const REREGISTRATION_BUDGET: usize = 3 * 1024 * 1024;

/// Makes `request` fit in `budget` encoded bytes: drops the arguments and environments of its
/// ended tasks, then of its running tasks, largest first, until it does. Ids, slots, jobs,
/// versions, states and resources stay: they are what the master settles the agent's tasks
/// by (it holds each job's definition). Returns how many tasks were reported without them.
pub fn fit_within(request: &mut ReregisterAgent, budget: usize) -> usize {
    if request.encoded_len() <= budget {
        return 0;
    }
    let mut stripped = 0;
    let mut strip = |task: &mut Task| {
        if task.args.is_empty() && task.env.is_empty() {
            return 0;
        }
        let freed = task.args.iter().map(String::len).sum::<usize>()
            + task
                .env
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>();
        task.args.clear();
        task.env.clear();
        stripped += 1;
        freed
    };
    for task in &mut request.completed_tasks {
        strip(task);
    }
    let mut over = request.encoded_len().saturating_sub(budget);
    if over > 0 {
        let grouped = request
            .tasks_sharing_labels
            .iter_mut()
            .flat_map(|group| &mut group.tasks);
        let mut running: Vec<&mut Task> = request.tasks.iter_mut().chain(grouped).collect();
        running.sort_by_key(|task| std::cmp::Reverse(task.encoded_len()));
        for task in running {
            if over == 0 {
                break;
            }
            over = over.saturating_sub(strip(task));
        }
    }
    stripped
}

/// Splits `tasks` into those without labels, in their order, and groups of tasks with the
/// same labels (in the order each group's first task came, its tasks in theirs). A grouped
/// task's labels move to its group: the form of `ReregisterAgent`'s `tasks` and
/// `tasks_sharing_labels`.
pub fn group_by_shared_labels(tasks: Vec<Task>) -> (Vec<Task>, Vec<TasksSharingLabels>) {
    let mut unlabelled = Vec::new();
    let mut groups: Vec<TasksSharingLabels> = Vec::new();
    let mut group_of: HashMap<Vec<(String, String)>, usize> = HashMap::new();
    for mut task in tasks {
        if task.labels.is_empty() {
            unlabelled.push(task);
            continue;
        }
        let labels = std::mem::take(&mut task.labels);
        let key = labels
            .iter()
            .map(|label| (label.key.clone(), label.value.clone()))
            .collect();
        let group = *group_of.entry(key).or_insert_with(|| {
            groups.push(TasksSharingLabels {
                labels,
                tasks: Vec::new(),
            });
            groups.len() - 1
        });
        groups[group].tasks.push(task);
    }
    (unlabelled, groups)
}

#[cfg(test)]
mod tests {
    use muster_proto::model::Label;

    use super::*;

    fn task(id: &str, labels: &[(&str, &str)]) -> Task {
        Task {
            id: id.to_owned(),
            labels: labels
                .iter()
                .map(|(key, value)| Label {
                    key: (*key).to_owned(),
                    value: (*value).to_owned(),
                })
                .collect(),
            ..Task::default()
        }
    }

    #[test]
    fn tasks_with_the_same_labels_share_one_group_and_come_back_whole() {
        let web = [("tier", "web"), ("team", "a")];
        let db = [("tier", "db")];
        let tasks = vec![
            task("w1", &web),
            task("plain", &[]),
            task("d1", &db),
            task("w2", &web),
            // The same pairs in another order are other labels.
            task("w3", &[("team", "a"), ("tier", "web")]),
        ];
        let (unlabelled, groups) = group_by_shared_labels(tasks.clone());
        assert_eq!(unlabelled, vec![task("plain", &[])]);
        let ids: Vec<Vec<&str>> = groups
            .iter()
            .map(|g| g.tasks.iter().map(|t| t.id.as_str()).collect())
            .collect();
        assert_eq!(ids, vec![vec!["w1", "w2"], vec!["d1"], vec!["w3"]]);
        assert!(
            groups
                .iter()
                .flat_map(|g| &g.tasks)
                .all(|t| t.labels.is_empty())
        );
        assert_eq!(groups[0].labels, task("", &web).labels);

        let mut back = unlabelled;
        for group in groups {
            back.extend(group.tasks.into_iter().map(|mut task| {
                task.labels.clone_from(&group.labels);
                task
            }));
        }
        let mut expected = tasks;
        back.sort_by(|a, b| a.id.cmp(&b.id));
        expected.sort_by(|a, b| a.id.cmp(&b.id));
        assert_eq!(back, expected);
    }

    #[test]
    fn a_reregistration_over_its_budget_drops_arguments_and_environments_until_it_fits() {
        let big = |n: usize| Task {
            id: format!("etl.load[{n}]-{n:08x}"),
            name: format!("etl.load[{n}]"),
            job: "etl".into(),
            args: vec!["x".repeat(1000)],
            env: [("BLOB".to_owned(), "y".repeat(900 * 1024))].into(),
            ..Task::default()
        };
        let mut request = ReregisterAgent {
            agent_id: "agent-1".into(),
            tasks: (0..6).map(big).collect(),
            completed_tasks: vec![big(9)],
            ..ReregisterAgent::default()
        };
        assert!(request.encoded_len() > 5 * 1024 * 1024);
        let stripped = fit_within(&mut request, REREGISTRATION_BUDGET);
        assert!(request.encoded_len() <= REREGISTRATION_BUDGET);
        // The ended task first, then only as many running ones as it takes.
        assert!(request.completed_tasks[0].env.is_empty());
        assert_eq!(
            stripped,
            1 + request.tasks.iter().filter(|t| t.env.is_empty()).count()
        );
        assert!(request.tasks.iter().any(|t| !t.env.is_empty()));
        // What the master settles tasks by stays.
        let names: Vec<&str> = request.tasks.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names.len(), 6);
        assert!(
            request
                .tasks
                .iter()
                .all(|t| t.job == "etl" && !t.id.is_empty())
        );

        let mut small = ReregisterAgent {
            tasks: vec![big(0)],
            ..ReregisterAgent::default()
        };
        assert_eq!(fit_within(&mut small, REREGISTRATION_BUDGET), 0);
        assert!(!small.tasks[0].env.is_empty());
    }
}

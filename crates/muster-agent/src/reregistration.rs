//! How an agent reports its running tasks when it re-registers with a master that reads them
//! grouped: tasks that share their labels are sent together, with the labels once.
//!
//! The tasks of one job or group usually carry the same labels, and a leading master reads
//! every re-registration of the cluster right after a failover: grouped, a label costs it one
//! read per group instead of one per task.

use std::collections::HashMap;

use muster_proto::cluster::TasksSharingLabels;
use muster_proto::model::Task;

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
}

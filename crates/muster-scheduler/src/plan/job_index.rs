//! Which agents run tasks of each job ([`JobIndex`]), kept from snapshot to snapshot.

use foldhash::HashMap;
use std::sync::Arc;

use super::agent_view::{AgentView, job_changes};
use super::attribute_column::{AttributeColumn, Columns};

/// For each job, the agents (by position in a snapshot's agents, ordered by id) with a task
/// of it, running or recently ended: what lets a scheduler run cost what its job costs, not
/// what the cluster does.
///
/// A master keeps one from snapshot to snapshot ([`JobIndex::update`]): an agent whose view is
/// the same `Arc` as before costs a pointer comparison, a changed view the difference of its
/// jobs, and only a change of the agents themselves (one joined or left) renumbers the
/// positions. The index holds the views it was built from, so a snapshot whose agents were
/// changed after it was built is detected ([`ClusterSnapshot::agents_with`](super::ClusterSnapshot::agents_with)).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobIndex {
    agents: Vec<Arc<AgentView>>,
    jobs: HashMap<Arc<str>, Arc<Vec<u32>>>,
    /// Whether `agents` are ordered by id, each once, as the index needs (if not, it is
    /// never used). Checked where the list changed only: views kept from the list before
    /// stay in its order.
    ordered: bool,
    /// The agents' attributes that spreads asked for, as columns, carried along like the
    /// jobs.
    columns: Columns,
}

impl JobIndex {
    /// The index of `agents` (ordered by id, each once), built from `previous`, the index of
    /// an earlier list, when there is one. Returns `previous` itself if nothing changed.
    pub fn update(previous: Option<&Arc<JobIndex>>, agents: &[Arc<AgentView>]) -> Arc<JobIndex> {
        let empty = JobIndex {
            ordered: true,
            ..JobIndex::default()
        };
        // An index of a list out of order is not built on.
        let before = previous
            .filter(|index| index.ordered)
            .map_or(&empty, |index| &**index);
        if let Some(previous) = previous
            && previous.holds_for(agents)
        {
            return Arc::clone(previous);
        }
        // Walk the old and new lists together (both ordered by id): where each old agent is
        // now, and the views that are new or changed.
        let old = &before.agents;
        let mut moved_to = vec![u32::MAX; old.len()];
        let mut renumbered = old.len() != agents.len();
        let mut changed: Vec<(Option<&AgentView>, u32)> = Vec::new();
        let (mut i, mut j) = (0, 0);
        while i < old.len() || j < agents.len() {
            let order = match (old.get(i), agents.get(j)) {
                (Some(a), Some(b)) if Arc::ptr_eq(a, b) => None,
                (Some(a), Some(b)) => Some(a.id.cmp(&b.id)),
                (Some(_), None) => Some(std::cmp::Ordering::Less),
                (None, _) => Some(std::cmp::Ordering::Greater),
            };
            match order {
                None => {
                    moved_to[i] = j as u32;
                    renumbered |= i != j;
                    (i, j) = (i + 1, j + 1);
                }
                Some(std::cmp::Ordering::Equal) => {
                    moved_to[i] = j as u32;
                    renumbered |= i != j;
                    changed.push((Some(&old[i]), j as u32));
                    (i, j) = (i + 1, j + 1);
                }
                Some(std::cmp::Ordering::Less) => {
                    renumbered = true;
                    i += 1;
                }
                Some(std::cmp::Ordering::Greater) => {
                    renumbered = true;
                    changed.push((None, j as u32));
                    j += 1;
                }
            }
        }
        let in_order =
            |at: usize| at == 0 || at >= agents.len() || agents[at - 1].id < agents[at].id;
        let ordered = before.ordered
            && changed
                .iter()
                .all(|&(_, at)| in_order(at as usize) && in_order(at as usize + 1));
        let changed_at: Vec<u32> = changed.iter().map(|&(_, at)| at).collect();
        let columns =
            before
                .columns
                .carried(agents, renumbered.then_some(&moved_to[..]), &changed_at);
        let mut jobs = before.jobs.clone();
        if renumbered {
            // An agent joined or left: every position moves (monotonically, so each list
            // stays ordered).
            jobs = jobs
                .into_iter()
                .map(|(job, at)| {
                    let moved: Vec<u32> = at
                        .iter()
                        .map(|&p| moved_to[p as usize])
                        .filter(|&p| p != u32::MAX)
                        .collect();
                    (job, Arc::new(moved))
                })
                .collect();
        }
        for (was, at) in changed {
            let now = &agents[at as usize];
            // A view grown from the one the index holds by added tasks says which jobs are
            // new; otherwise the two job directories are compared.
            let (gone, new) = match was.and_then(|was| now.jobs_added_since(was)) {
                Some(new) => (Vec::new(), new),
                None => job_changes(was, now),
            };
            for job in gone {
                if let Some(list) = jobs.get_mut(job) {
                    let list = Arc::make_mut(list);
                    if let Ok(k) = list.binary_search(&at) {
                        list.remove(k);
                    }
                }
            }
            for job in new {
                match jobs.get_mut(job) {
                    Some(list) => {
                        let list = Arc::make_mut(list);
                        if let Err(k) = list.binary_search(&at) {
                            list.insert(k, at);
                        }
                    }
                    None => {
                        jobs.insert(Arc::from(job), Arc::new(vec![at]));
                    }
                }
            }
        }
        jobs.retain(|_, at| !at.is_empty());
        Arc::new(JobIndex {
            agents: agents.to_vec(),
            jobs,
            ordered,
            columns,
        })
    }

    /// The agents' values of attribute `key`, by position, built the first time it is asked
    /// for and then kept up to date by [`update`](Self::update).
    pub fn attribute_column(&self, key: &str) -> Arc<AttributeColumn> {
        self.columns.get(key, &self.agents)
    }

    /// The positions of the agents with a task of `job`, in order.
    pub fn agents_with(&self, job: &str) -> &[u32] {
        self.jobs.get(job).map_or(&[], |at| at.as_slice())
    }

    /// Whether it was built for exactly these views, ordered by id.
    pub(crate) fn holds_for(&self, agents: &[Arc<AgentView>]) -> bool {
        self.ordered
            && self.agents.len() == agents.len()
            && self
                .agents
                .iter()
                .zip(agents)
                .all(|(a, b)| Arc::ptr_eq(a, b))
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use muster_model::{Resources, TaskState};

    use super::*;
    use crate::plan::ClusterSnapshot;
    use crate::plan::agent_view::tests::running;
    use crate::plan::agent_view::{JobGroup, TaskView};

    #[test]
    fn the_job_index_lists_the_agents_of_each_job_and_is_kept_when_nothing_changed() {
        let agents = vec![
            running(1, &["web", "db"]),
            running(2, &[]),
            running(3, &["web"]),
        ];
        let index = JobIndex::update(None, &agents);
        assert_eq!(index.agents_with("web"), [0, 2]);
        assert_eq!(index.agents_with("db"), [0]);
        assert!(index.agents_with("nope").is_empty());
        assert!(Arc::ptr_eq(
            &index,
            &JobIndex::update(Some(&index), &agents)
        ));

        let mut snapshot = ClusterSnapshot {
            agents: agents.clone(),
            job_index: Some(Arc::clone(&index)),
            ..ClusterSnapshot::default()
        };
        assert_eq!(snapshot.agents_with("web"), Some(&[0, 2][..]));
        // A view replaced after the index was built: the index no longer holds.
        snapshot.agents[1] = running(2, &["web"]);
        assert_eq!(snapshot.agents_with("web"), None);
    }

    #[test]
    fn an_updated_job_index_is_the_one_built_afresh() {
        let jobs = ["a", "b", "c", "d"];
        let mut rng = fastrand::Rng::with_seed(7);
        let mut agents: Vec<Arc<AgentView>> = Vec::new();
        let mut index = JobIndex::update(None, &agents);
        // Asked for once: from then on the index keeps the column with the agents.
        index.attribute_column("zone");
        let zones = ["x", "y", "z", ""];
        let in_zone = |mut view: Arc<AgentView>, zone: &str| {
            let attributes = &mut Arc::make_mut(&mut view).attributes;
            attributes.clear();
            if !zone.is_empty() {
                attributes.insert("zone".to_owned(), zone.to_owned());
            }
            view
        };
        for round in 0..500 {
            for _ in 0..rng.usize(1..4) {
                let n = rng.u32(0..40);
                let at = agents.binary_search_by(|a| a.id.cmp(&running(n, &[]).id));
                let some_jobs: Vec<&str> = jobs.iter().copied().filter(|_| rng.bool()).collect();
                match (at, rng.u8(0..5)) {
                    (Ok(at), 0) => {
                        agents.remove(at);
                    }
                    // Tasks added in place, as a master adds the ones it places: the view
                    // says which jobs are new since the one the index holds.
                    (Ok(at), 1 | 2) => {
                        for _ in 0..rng.usize(1..3) {
                            let job = jobs[rng.usize(..jobs.len())];
                            let id = format!("{job}-{n}-{round}-{}", rng.u32(..));
                            let task = TaskView::new(
                                &id,
                                &id,
                                JobGroup::new(job, "g"),
                                Resources::default(),
                                TaskState::Running,
                                0,
                            );
                            // Sometimes another snapshot still holds the view: the
                            // change goes to a copy of a copy the index never saw.
                            let _held = rng.bool().then(|| Arc::clone(&agents[at]));
                            Arc::make_mut(&mut agents[at]).add_task(Arc::new(task));
                        }
                    }
                    (Ok(at), 3) => {
                        agents[at] = in_zone(Arc::clone(&agents[at]), zones[rng.usize(..4)]);
                    }
                    (Ok(at), _) => {
                        agents[at] = in_zone(running(n, &some_jobs), zones[n as usize % 4])
                    }
                    (Err(at), _) => {
                        agents.insert(at, in_zone(running(n, &some_jobs), zones[n as usize % 4]));
                    }
                }
            }
            index = JobIndex::update(Some(&index), &agents);
            let fresh = JobIndex::update(None, &agents);
            for job in jobs {
                assert_eq!(
                    index.agents_with(job),
                    fresh.agents_with(job),
                    "round {round}, job {job}"
                );
                let expected: Vec<u32> = (0..agents.len() as u32)
                    .filter(|&at| !agents[at as usize].tasks_of(job).is_empty())
                    .collect();
                assert_eq!(index.agents_with(job), expected, "round {round}, job {job}");
            }
            assert!(index.holds_for(&agents), "round {round}: kept in order");
            let column = index.attribute_column("zone");
            for (at, agent) in agents.iter().enumerate() {
                let value = column.number_at(at).and_then(|n| column.value(n));
                let expected = agent.attributes.get("zone").map(String::as_str);
                assert_eq!(value, expected, "round {round}, zone of agent {at}");
            }
        }
    }

    #[test]
    fn a_job_index_of_agents_out_of_order_is_never_used() {
        let sorted = vec![running(1, &["web"]), running(2, &["web"]), running(3, &[])];
        let index = JobIndex::update(None, &sorted);
        let mut swapped = sorted.clone();
        swapped.swap(0, 2);
        for index in [
            JobIndex::update(None, &swapped),
            JobIndex::update(Some(&index), &swapped),
        ] {
            let snapshot = ClusterSnapshot {
                agents: swapped.clone(),
                job_index: Some(Arc::clone(&index)),
                ..ClusterSnapshot::default()
            };
            assert_eq!(snapshot.agents_with("web"), None);
            assert!(matches!(snapshot.agents_by_id(), Cow::Owned(_)));
            // Once in order again, an index built on it holds.
            let again = JobIndex::update(Some(&index), &sorted);
            assert_eq!(again.agents_with("web"), [0, 1]);
            assert!(again.holds_for(&sorted));
        }
    }
}

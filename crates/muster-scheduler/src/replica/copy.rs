//! The watcher's side: a copy of the cluster kept by applying the leader's changes.

use std::collections::BTreeMap;
use std::sync::Arc;

use muster_model::convert::{each, read};
use muster_model::{AgentId, FieldError, Job};
use muster_proto::scheduling as pb;

use super::digest;
use super::feed::Settings;
use super::wire::settings_from_wire;
use crate::plan::{AgentView, ClusterSnapshot, JobIndex, TaskView};

/// A copy of the cluster as the leader's scheduling API shows it, kept by
/// [`apply`](Self::apply)ing the messages of a watch (`WatchCluster`) in order.
///
/// Between the first message of a change and the one marked complete, the copy is part way
/// and [`snapshot`](Self::snapshot) has none to give.
#[derive(Debug, Default)]
pub struct Replica {
    agents: BTreeMap<AgentId, Arc<AgentView>>,
    jobs: BTreeMap<String, Job>,
    settings: Option<Settings>,
    /// The index of the last complete change, if the copy is at it.
    index: Option<u64>,
    /// Built for the agents of the last snapshot given, and carried to the next.
    job_index: Option<Arc<JobIndex>>,
}

impl Replica {
    /// An empty copy.
    pub fn new() -> Self {
        Self::default()
    }

    /// The index the copy is consistent at; `None` part way through a change, or before the
    /// first.
    pub fn index(&self) -> Option<u64> {
        self.index
    }

    /// Applies one message of a watch.
    ///
    /// # Errors
    /// A [`FieldError`] for a message that does not make a valid change of this copy (a field
    /// out of range, a change to an agent it does not hold). The copy may then be part way:
    /// the watcher drops it and watches afresh.
    pub fn apply(&mut self, change: pb::ClusterChange) -> Result<(), FieldError> {
        self.index = None;
        for (i, agent) in change.agents.into_iter().enumerate() {
            self.apply_agent(agent)
                .map_err(|e| e.within(&format!("agents[{i}]")))?;
        }
        for gone in change.agents_gone {
            self.agents.remove(&AgentId(gone));
        }
        for (i, job) in change.jobs.into_iter().enumerate() {
            let job: Job = read(job, &format!("jobs[{i}]"))?;
            self.jobs.insert(job.name.clone(), job);
        }
        for gone in change.jobs_gone {
            self.jobs.remove(&gone);
        }
        if let Some(settings) = change.settings {
            let settings = settings_from_wire(settings).map_err(|e| e.within("settings"))?;
            self.settings = Some(settings);
        }
        if change.complete {
            self.index = Some(change.index);
        }
        Ok(())
    }

    fn apply_agent(&mut self, change: pb::AgentChange) -> Result<(), FieldError> {
        let id = AgentId(change.id);
        let tasks: Vec<TaskView> = each(change.tasks, "tasks")?;
        let mut view = match (change.header, self.agents.remove(&id)) {
            (Some(header), was) => {
                if header.id != id.0 {
                    return Err(FieldError::new(
                        "header.id",
                        format!("{:?} is not the agent's id {:?}", header.id, id.0),
                    ));
                }
                let mut view = AgentView::try_from(header).map_err(|e| e.within("header"))?;
                match (was, change.replace_tasks) {
                    (_, true) => {}
                    (Some(was), false) => {
                        let kept = Arc::unwrap_or_clone(was).into_tasks();
                        view.update_tasks(|tasks| *tasks = kept);
                    }
                    (None, false) => {
                        return Err(FieldError::new(
                            "replace_tasks",
                            format!("agent {:?} is new to the copy but not sent whole", id.0),
                        ));
                    }
                }
                view
            }
            (None, Some(was)) => Arc::unwrap_or_clone(was),
            (None, None) => {
                return Err(FieldError::new(
                    "header",
                    format!("agent {:?} changed but was never sent whole", id.0),
                ));
            }
        };
        if change.replace_tasks || !tasks.is_empty() || !change.tasks_gone.is_empty() {
            let replace = change.replace_tasks;
            let gone = change.tasks_gone;
            view.update_tasks(|held| {
                if replace {
                    held.clear();
                }
                let changed: std::collections::HashSet<&str> = tasks
                    .iter()
                    .map(TaskView::id)
                    .chain(gone.iter().map(String::as_str))
                    .collect();
                held.retain(|task| !changed.contains(task.id()));
                held.extend(tasks.into_iter().map(Arc::new));
            });
        }
        self.agents.insert(id, Arc::new(view));
        Ok(())
    }

    /// The copy as a snapshot, if it is consistent (see [`index`](Self::index)). Agents are
    /// shared with the copy, and the [`JobIndex`] is carried from the last snapshot given
    /// (rebuilt only for the agents that changed since).
    pub fn snapshot(&mut self) -> Option<ClusterSnapshot> {
        let index = self.index?;
        let agents: Vec<Arc<AgentView>> = self.agents.values().cloned().collect();
        let job_index = JobIndex::update(self.job_index.as_ref(), &agents);
        self.job_index = Some(Arc::clone(&job_index));
        let mut snapshot = ClusterSnapshot {
            index,
            agents,
            jobs: self.jobs.clone(),
            job_index: Some(job_index),
            ..ClusterSnapshot::default()
        };
        if let Some(settings) = &self.settings {
            snapshot.held.clone_from(&settings.held);
            snapshot.quotas.clone_from(&settings.quotas);
            snapshot.deployments.clone_from(&settings.deployments);
            snapshot.preemption = settings.preemption;
        }
        Some(snapshot)
    }

    /// What the copy holds, as digests: sent when watching again, so that only what differs
    /// comes back.
    pub fn digest(&self) -> pb::ReplicaDigest {
        pb::ReplicaDigest {
            agents: self
                .agents
                .iter()
                .map(|(id, view)| (id.0.clone(), digest::agent(view)))
                .collect(),
            jobs: self
                .jobs
                .iter()
                .map(|(name, job)| (name.clone(), digest::job(job)))
                .collect(),
        }
    }
}

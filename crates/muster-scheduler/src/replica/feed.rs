//! The leader's side of a watch: what one watcher's copy holds, and the changes that bring it
//! to the next snapshot.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use muster_model::convert::unsorted;
use muster_model::{Deployment, Job, PreemptionConfig, Quota};
use muster_proto::scheduling as pb;
use prost::Message;

use super::digest;
use super::wire::{settings_to_wire, task_to_wire};
use crate::plan::{AgentView, ClusterSnapshot};

/// The size a message of changes is kept under (an agent with its tasks is never split, so
/// one agent of more than this makes a message of its own).
pub const PAGE_BYTES: usize = 1 << 20;

/// Each job's version and whether it was stopped, by name: what a feed compares jobs by.
pub type JobVersions = BTreeMap<String, (u64, bool)>;

/// The versions of `jobs`, as a feed compares them.
pub fn job_versions(jobs: &BTreeMap<String, Job>) -> JobVersions {
    jobs.iter()
        .map(|(name, job)| (name.clone(), (job.version, job.stopped)))
        .collect()
}

/// Whether `jobs` are the same jobs as `seen`, each at the version (and stopped or not) it
/// says: then a feed has no job to send.
pub fn same_job_versions(seen: &JobVersions, jobs: &BTreeMap<String, Job>) -> bool {
    seen.len() == jobs.len()
        && seen
            .iter()
            .zip(jobs)
            .all(|((name, was), (now, job))| name == now && *was == (job.version, job.stopped))
}

/// What one watcher holds, as far as the leader knows: the views and jobs it was last sent
/// (or, after a resume, their digests).
///
/// [`Feed::changes`] turns each new [`ClusterSnapshot`] into the messages that bring the
/// watcher's copy to it, walking the snapshot's agents and the ones last sent side by side (both
/// in id order). A view the snapshot shares with the last one ([`Arc::ptr_eq`]) costs a
/// pointer comparison; a changed one, its tasks compared by id and pointer; only what changed
/// is sent. Jobs are compared by version: the registry gives every change to a job a new one.
#[derive(Debug, Default)]
pub struct Feed {
    /// The views last sent, in id order.
    agents: Vec<Arc<AgentView>>,
    /// Each job last sent, by name: its version and whether it was stopped.
    jobs: JobVersions,
    /// What a resumed watcher said it holds, until the first changes are worked out.
    resumed: Option<pb::ReplicaDigest>,
    /// The small parts as last sent; `None` before the first.
    settings: Option<Settings>,
    /// The index last sent.
    index: Option<u64>,
    page_bytes: usize,
}

/// The parts of a snapshot that are sent whole.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Settings {
    pub(super) held: BTreeSet<String>,
    pub(super) quotas: BTreeMap<String, Quota>,
    pub(super) deployments: BTreeMap<String, Deployment>,
    pub(super) preemption: PreemptionConfig,
}

impl Settings {
    /// Whether these are `snapshot`'s.
    fn is_of(&self, snapshot: &ClusterSnapshot) -> bool {
        self.held == snapshot.held
            && self.quotas == snapshot.quotas
            && self.deployments == snapshot.deployments
            && self.preemption == snapshot.preemption
    }

    fn of(snapshot: &ClusterSnapshot) -> Self {
        Settings {
            held: snapshot.held.clone(),
            quotas: snapshot.quotas.clone(),
            deployments: snapshot.deployments.clone(),
            preemption: snapshot.preemption,
        }
    }
}

impl Feed {
    /// A feed for a watcher that holds `holding` (empty for nothing).
    pub fn new(holding: pb::ReplicaDigest) -> Self {
        Feed {
            resumed: Some(holding),
            page_bytes: PAGE_BYTES,
            ..Feed::default()
        }
    }

    /// The same, with messages kept under `bytes` (tests page small clusters this way).
    pub fn with_page_bytes(mut self, bytes: usize) -> Self {
        self.page_bytes = bytes.max(1);
        self
    }

    /// The messages that bring the watcher from what it holds to `snapshot`, the last marked
    /// complete; none if it holds `snapshot` already. `snapshot` lists its agents by id, each
    /// once, as a master's do.
    pub fn changes(&mut self, snapshot: &ClusterSnapshot) -> Vec<pb::ClusterChange> {
        self.changes_with(snapshot, true)
    }

    /// [`changes`](Self::changes), the snapshot's jobs left as they were last sent unless
    /// `with_jobs` (a leader that knows its jobs did not change leaves them out of the
    /// snapshot). The first changes always take the snapshot's jobs.
    pub fn changes_with(
        &mut self,
        snapshot: &ClusterSnapshot,
        with_jobs: bool,
    ) -> Vec<pb::ClusterChange> {
        let mut pages = Pages::new(self.page_bytes);
        match self.resumed.take() {
            Some(holding) => self.first_changes(holding, snapshot, &mut pages),
            None => {
                self.agent_changes(snapshot, &mut pages);
                if with_jobs {
                    self.job_changes(snapshot, &mut pages);
                }
            }
        }
        self.agents.clone_from(&snapshot.agents);
        // Compared where they are; copied only when they changed (every round takes this).
        let settings_changed = !self.settings.as_ref().is_some_and(|s| s.is_of(snapshot));
        if pages.is_empty() && !settings_changed && self.index == Some(snapshot.index) {
            return Vec::new();
        }
        if settings_changed {
            let settings = Settings::of(snapshot);
            pages.last().settings = Some(settings_to_wire(&settings));
            self.settings = Some(settings);
        }
        self.index = Some(snapshot.index);
        pages.finish(snapshot.index)
    }

    /// The first changes: against the digests of what the watcher holds.
    fn first_changes(
        &mut self,
        mut holding: pb::ReplicaDigest,
        snapshot: &ClusterSnapshot,
        pages: &mut Pages,
    ) {
        for view in &snapshot.agents {
            if holding.agents.remove(&view.id.0) != Some(digest::agent(view)) {
                let change = whole_agent(view);
                pages.add(|page| page.agents.push(change));
            }
        }
        let mut gone: Vec<String> = holding.agents.into_keys().collect();
        gone.sort();
        for id in gone {
            pages.add(|page| page.agents_gone.push(id));
        }
        for (name, job) in &snapshot.jobs {
            if holding.jobs.remove(name) != Some(digest::job(job)) {
                let wire: muster_proto::model::Job = job.clone().into();
                pages.add(|page| page.jobs.push(wire));
            }
            self.jobs.insert(name.clone(), (job.version, job.stopped));
        }
        let mut gone: Vec<String> = holding.jobs.into_keys().collect();
        gone.sort();
        for name in gone {
            pages.add(|page| page.jobs_gone.push(name));
        }
    }

    fn agent_changes(&mut self, snapshot: &ClusterSnapshot, pages: &mut Pages) {
        let (was, now) = (&self.agents, &snapshot.agents);
        let (mut i, mut j) = (0, 0);
        while i < was.len() || j < now.len() {
            let order = match (was.get(i), now.get(j)) {
                (Some(old), Some(new)) if Arc::ptr_eq(old, new) => {
                    (i, j) = (i + 1, j + 1);
                    continue;
                }
                (Some(old), Some(new)) => old.id.cmp(&new.id),
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, _) => std::cmp::Ordering::Greater,
            };
            match order {
                std::cmp::Ordering::Equal => {
                    if let Some(change) = agent_change(&was[i], &now[j]) {
                        pages.add(|page| page.agents.push(change));
                    }
                    (i, j) = (i + 1, j + 1);
                }
                std::cmp::Ordering::Less => {
                    let gone = was[i].id.0.clone();
                    pages.add(|page| page.agents_gone.push(gone));
                    i += 1;
                }
                std::cmp::Ordering::Greater => {
                    let change = whole_agent(&now[j]);
                    pages.add(|page| page.agents.push(change));
                    j += 1;
                }
            }
        }
    }

    fn job_changes(&mut self, snapshot: &ClusterSnapshot, pages: &mut Pages) {
        if same_job_versions(&self.jobs, &snapshot.jobs) {
            return;
        }
        let mut was = std::mem::take(&mut self.jobs);
        for (name, job) in &snapshot.jobs {
            if was.remove(name) != Some((job.version, job.stopped)) {
                let wire: muster_proto::model::Job = job.clone().into();
                pages.add(|page| page.jobs.push(wire));
            }
            self.jobs.insert(name.clone(), (job.version, job.stopped));
        }
        for gone in was.into_keys() {
            pages.add(|page| page.jobs_gone.push(gone));
        }
    }
}

/// An agent new to the watcher, or held by digest only: all of it.
fn whole_agent(view: &AgentView) -> pb::AgentChange {
    pb::AgentChange {
        id: view.id.0.clone(),
        header: Some(header(view)),
        replace_tasks: true,
        tasks: view.tasks().iter().map(task_to_wire).collect(),
        tasks_gone: Vec::new(),
    }
}

/// An agent's fields without its tasks.
fn header(view: &AgentView) -> pb::AgentView {
    pb::AgentView {
        id: view.id.0.clone(),
        attributes: unsorted(view.attributes.clone()),
        total: Some(view.total.clone().into()),
        tasks: Vec::new(),
        ineligible: !view.eligible,
        drain: muster_proto::model::DrainPhase::from(view.drain).into(),
        dynamic_ports: Some(view.dynamic_ports.into()),
    }
}

/// What changed from `old` to `new` (the same agent), if anything did.
fn agent_change(old: &AgentView, new: &AgentView) -> Option<pb::AgentChange> {
    let header_changed = old.attributes != new.attributes
        || old.total != new.total
        || old.eligible != new.eligible
        || old.drain != new.drain
        || old.dynamic_ports != new.dynamic_ports;
    let before: HashMap<&str, &Arc<crate::plan::TaskView>, foldhash::fast::RandomState> =
        old.tasks().iter().map(|task| (task.id(), task)).collect();
    let now: HashSet<&str, foldhash::fast::RandomState> =
        new.tasks().iter().map(|task| task.id()).collect();
    if before.len() != old.tasks().len() || now.len() != new.tasks().len() {
        // An id twice on the agent (a task given up as lost that reported in again): changes
        // by id cannot say which, so the agent goes whole.
        return Some(whole_agent(new));
    }
    let mut tasks = Vec::new();
    for task in new.tasks() {
        match before.get(task.id()) {
            Some(was) if Arc::ptr_eq(was, task) || ***was == **task => {}
            _ => tasks.push(task_to_wire(task)),
        }
    }
    let tasks_gone: Vec<String> = before
        .keys()
        .filter(|id| !now.contains(*id))
        .map(|id| (*id).to_owned())
        .collect();
    if !header_changed && tasks.is_empty() && tasks_gone.is_empty() {
        return None;
    }
    Some(pb::AgentChange {
        id: new.id.0.clone(),
        header: header_changed.then(|| header(new)),
        replace_tasks: false,
        tasks,
        tasks_gone,
    })
}

/// Messages of changes being filled, each kept under a size.
struct Pages {
    done: Vec<pb::ClusterChange>,
    open: pb::ClusterChange,
    /// The open message's encoded size: the sum of its additions' (repeated fields encode
    /// element by element).
    open_bytes: usize,
    limit: usize,
}

impl Pages {
    fn new(limit: usize) -> Self {
        Pages {
            done: Vec::new(),
            open: pb::ClusterChange::default(),
            open_bytes: 0,
            limit,
        }
    }

    fn is_empty(&self) -> bool {
        self.done.is_empty() && self.open_bytes == 0
    }

    /// Adds to the open message with `add`; if that takes it over the limit, the message
    /// without the addition is closed and the addition opens the next.
    fn add(&mut self, add: impl FnOnce(&mut pb::ClusterChange)) {
        let mut next = pb::ClusterChange::default();
        add(&mut next);
        let bytes = next.encoded_len();
        if self.open_bytes > 0 && self.open_bytes + bytes > self.limit {
            self.done.push(std::mem::take(&mut self.open));
            self.open_bytes = 0;
        }
        self.open_bytes += bytes;
        let open = &mut self.open;
        open.agents.append(&mut next.agents);
        open.agents_gone.append(&mut next.agents_gone);
        open.jobs.append(&mut next.jobs);
        open.jobs_gone.append(&mut next.jobs_gone);
    }

    fn last(&mut self) -> &mut pb::ClusterChange {
        &mut self.open
    }

    /// Every message, the last complete at `index`.
    fn finish(mut self, index: u64) -> Vec<pb::ClusterChange> {
        for page in &mut self.done {
            page.index = index;
        }
        self.open.index = index;
        self.open.complete = true;
        self.done.push(self.open);
        self.done
    }
}

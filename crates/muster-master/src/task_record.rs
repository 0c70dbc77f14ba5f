//! How the leading master keeps a task: what is the task's own (its id and slot name, state,
//! exit code and message) beside what every task of its group at its version shares (job,
//! group, resources, program, environment, owner, labels), which is kept once.
//!
//! A master holds every task of the cluster, and the C2M shape is two million of them: as the
//! agents' wire form (`muster.model.v1.Task`, every string its own allocation) a task cost
//! about 800 bytes, and each scheduler view copied its strings again. A [`TaskRecord`] is a
//! [`TaskView`] (whose strings the views built from it share) plus one pointer to an interned
//! [`TaskDetail`], an exit code and a message.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::hash::Hash;
use std::sync::Arc;

use muster_model::{Resources, TaskState};
use muster_proto::model as model_pb;
use muster_scheduler::TaskView;

/// What the tasks of one group at one job version share beyond what a [`TaskView`] holds:
/// kept once by the [`TaskInterner`] and pointed to by each of them.
#[derive(Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct TaskDetail {
    pub(crate) framework_id: String,
    pub(crate) command: String,
    pub(crate) args: Vec<String>,
    /// Ordered by name.
    pub(crate) env: Vec<(String, String)>,
    pub(crate) user: String,
    /// In order, as given; interned on their own (tasks of many groups carry the same ones).
    pub(crate) labels: Arc<Vec<(String, String)>>,
}

/// One task as the master keeps it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TaskRecord {
    /// What schedulers see of it, shared with the views built from it (a view of an agent
    /// costs a pointer per task).
    pub(crate) view: Arc<TaskView>,
    /// What it runs and who owns it, shared with the tasks of its group.
    pub(crate) detail: Arc<TaskDetail>,
    pub(crate) exit_code: i32,
    /// Why it is in its state, when there is more to say.
    pub(crate) message: Box<str>,
}

impl TaskRecord {
    /// Its unique id.
    pub(crate) fn id(&self) -> &str {
        &self.view.id
    }

    /// The slot it fills.
    pub(crate) fn name(&self) -> &str {
        &self.view.name
    }

    /// Its job; empty for a task an operator launched by hand.
    pub(crate) fn job(&self) -> &str {
        &self.view.job
    }

    /// The job it belongs to, if the master launched it for one.
    pub(crate) fn job_name(&self) -> Option<&str> {
        (!self.view.job.is_empty()).then_some(&*self.view.job)
    }

    /// Where it is.
    pub(crate) fn state(&self) -> TaskState {
        self.view.state
    }

    /// Moves it to `state` (a view that shares it keeps the state it was built with).
    pub(crate) fn set_state(&mut self, state: TaskState) {
        Arc::make_mut(&mut self.view).state = state;
    }

    /// Whether it ended (finished, failed, killed, lost).
    pub(crate) fn is_terminal(&self) -> bool {
        self.view.state.is_terminal()
    }

    /// What it holds while not terminal.
    pub(crate) fn resources(&self) -> &Resources {
        &self.view.resources
    }

    /// It in the wire form agents, operators and events read.
    pub(crate) fn to_wire(&self) -> model_pb::Task {
        let detail = &*self.detail;
        model_pb::Task {
            id: self.view.id.to_string(),
            name: self.view.name.to_string(),
            framework_id: detail.framework_id.clone(),
            resources: Some(self.view.resources.clone().into()),
            labels: detail
                .labels
                .iter()
                .map(|(key, value)| model_pb::Label {
                    key: key.clone(),
                    value: value.clone(),
                })
                .collect(),
            state: self.view.state.into(),
            exit_code: self.exit_code,
            command: detail.command.clone(),
            args: detail.args.clone(),
            env: detail.env.iter().cloned().collect(),
            message: self.message.to_string(),
            job: self.view.job.to_string(),
            group: self.view.group.to_string(),
            job_version: self.view.job_version,
            user: detail.user.clone(),
        }
    }
}

/// Keeps one copy of each job name, group name and [`TaskDetail`] the master's tasks use.
/// Entries no task uses any more are dropped as the interner grows ([`TaskInterner::sweep`]).
///
/// It hashes with foldhash (seeded per process): a new leader interns every task of the
/// cluster as the agents re-register, and SipHash over a detail's dozens of short strings cost
/// more than the rest of a re-registration.
#[derive(Debug, Default)]
pub(crate) struct TaskInterner {
    names: HashSet<Arc<str>, foldhash::fast::RandomState>,
    labels: HashSet<Arc<Vec<(String, String)>>, foldhash::fast::RandomState>,
    details: HashSet<Arc<TaskDetail>, foldhash::fast::RandomState>,
    /// Entries after the last sweep: the next comes when there are twice as many.
    swept_at: usize,
}

/// The copy of `value` in `set`, put there (made with `make`) if there is none.
fn intern<T, V>(
    set: &mut HashSet<Arc<T>, foldhash::fast::RandomState>,
    value: V,
    make: impl FnOnce(V) -> Arc<T>,
) -> Arc<T>
where
    T: Hash + Eq + ?Sized,
    V: Borrow<T>,
{
    if let Some(shared) = set.get(value.borrow()) {
        return Arc::clone(shared);
    }
    let shared = make(value);
    set.insert(Arc::clone(&shared));
    shared
}

/// Interned entries below which the interner never sweeps.
const SWEEP_FLOOR: usize = 4_096;

impl TaskInterner {
    /// The shared copy of `name`.
    pub(crate) fn name(&mut self, name: &str) -> Arc<str> {
        let shared = intern(&mut self.names, name, Arc::from);
        self.maybe_sweep();
        shared
    }

    /// The shared copy of `labels`.
    pub(crate) fn labels(&mut self, labels: Vec<(String, String)>) -> Arc<Vec<(String, String)>> {
        let shared = intern(&mut self.labels, labels, Arc::new);
        self.maybe_sweep();
        shared
    }

    /// The shared copy of `detail`.
    pub(crate) fn detail(&mut self, detail: TaskDetail) -> Arc<TaskDetail> {
        let shared = intern(&mut self.details, detail, Arc::new);
        self.maybe_sweep();
        shared
    }

    /// A task from its wire form (as agents report it), lenient as the master always was with
    /// what agents send: an unknown state counts as not started, missing resources as none.
    pub(crate) fn task(&mut self, wire: model_pb::Task) -> TaskRecord {
        let state = TaskState::try_from(wire.state).unwrap_or(TaskState::Staging);
        let resources = wire
            .resources
            .map(|r| Resources {
                cpus: r.cpus,
                mem_mb: r.mem_mb,
            })
            .unwrap_or_default();
        let mut env: Vec<(String, String)> = wire.env.into_iter().collect();
        env.sort_unstable();
        let labels = self.labels(
            wire.labels
                .into_iter()
                .map(|label| (label.key, label.value))
                .collect(),
        );
        let detail = self.detail(TaskDetail {
            framework_id: wire.framework_id,
            command: wire.command,
            args: wire.args,
            env,
            user: wire.user,
            labels,
        });
        TaskRecord {
            view: Arc::new(TaskView {
                id: wire.id.into(),
                name: wire.name.into(),
                job: self.name(&wire.job),
                group: self.name(&wire.group),
                resources,
                state,
                job_version: wire.job_version,
            }),
            detail,
            exit_code: wire.exit_code,
            message: wire.message.into_boxed_str(),
        }
    }

    /// Names and details interned now.
    pub(crate) fn len(&self) -> usize {
        self.names.len() + self.labels.len() + self.details.len()
    }

    /// Sweeps when the interner has doubled since the last sweep (and is past a floor), so
    /// that sweeping costs a constant share of interning.
    fn maybe_sweep(&mut self) {
        if self.len() >= SWEEP_FLOOR.max(2 * self.swept_at) {
            self.sweep();
        }
    }

    /// Drops the entries no task uses any more.
    pub(crate) fn sweep(&mut self) {
        // Details first: a detail dropped here releases its labels.
        self.details.retain(|detail| Arc::strong_count(detail) > 1);
        self.labels.retain(|labels| Arc::strong_count(labels) > 1);
        self.names.retain(|name| Arc::strong_count(name) > 1);
        self.swept_at = self.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(id: &str, slot: usize) -> model_pb::Task {
        model_pb::Task {
            id: id.into(),
            name: format!("web.fe[{slot}]"),
            framework_id: "web".into(),
            resources: Some(model_pb::Resources {
                cpus: 0.5,
                mem_mb: 64,
            }),
            labels: vec![model_pb::Label {
                key: "tier".into(),
                value: "front".into(),
            }],
            state: TaskState::Running.into(),
            exit_code: 0,
            command: "serve".into(),
            args: vec!["--port".into(), "80".into()],
            env: [
                ("A".to_owned(), "1".to_owned()),
                ("B".to_owned(), "2".to_owned()),
            ]
            .into(),
            message: "started".into(),
            job: "web".into(),
            group: "fe".into(),
            job_version: 3,
            user: "nobody".into(),
        }
    }

    #[test]
    fn a_task_reads_back_as_it_was_given() {
        let mut interner = TaskInterner::default();
        let given = wire("web.fe[0]-1", 0);
        let record = interner.task(given.clone());
        assert_eq!(record.to_wire(), given);
        assert_eq!(record.id(), "web.fe[0]-1");
        assert_eq!(record.name(), "web.fe[0]");
        assert_eq!(record.job_name(), Some("web"));
        assert_eq!(record.state(), TaskState::Running);
        assert_eq!(record.resources().mem_mb, 64);
    }

    #[test]
    fn the_tasks_of_a_group_share_one_copy_of_what_they_have_in_common() {
        let mut interner = TaskInterner::default();
        let a = interner.task(wire("a", 0));
        let b = interner.task(wire("b", 1));
        assert!(Arc::ptr_eq(&a.detail, &b.detail));
        assert!(Arc::ptr_eq(&a.view.job, &b.view.job));
        assert!(Arc::ptr_eq(&a.view.group, &b.view.group));
        // The environment is compared as a set: the order it arrives in does not matter.
        let mut reordered = wire("c", 2);
        reordered.env = [
            ("B".to_owned(), "2".to_owned()),
            ("A".to_owned(), "1".to_owned()),
        ]
        .into_iter()
        .collect();
        let c = interner.task(reordered);
        assert!(Arc::ptr_eq(&a.detail, &c.detail));
        let mut other = wire("d", 3);
        other.command = "other".into();
        let d = interner.task(other);
        assert!(!Arc::ptr_eq(&a.detail, &d.detail));
    }

    #[test]
    fn a_sweep_forgets_what_no_task_uses() {
        let mut interner = TaskInterner::default();
        let kept = interner.task(wire("a", 0));
        let mut other = wire("b", 1);
        other.job = "api".into();
        other.command = "api".into();
        drop(interner.task(other));
        assert_eq!(
            interner.len(),
            6,
            "web, fe, api, the labels and two details"
        );
        interner.sweep();
        assert_eq!(
            interner.len(),
            4,
            "web, fe, the labels and the detail still used"
        );
        let again = interner.task(wire("c", 2));
        assert!(Arc::ptr_eq(&kept.detail, &again.detail));
    }
}

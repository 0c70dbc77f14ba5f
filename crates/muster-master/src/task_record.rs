//! How the leading master keeps a task: what is the task's own (its id and slot name, state,
//! exit code and message) beside what every task of its group at its version shares (job,
//! group, resources, program, environment, owner, labels), which is kept once.
//!
//! A master holds every task of the cluster, and the C2M shape is two million of them: as the
//! agents' wire form (`muster.model.v1.Task`, every string its own allocation) a task cost
//! about 800 bytes, and each scheduler view copied its strings again. A [`TaskRecord`] is a
//! [`TaskView`] (whose strings the views built from it share) plus one pointer to an interned
//! [`TaskDetail`], an exit code and a message.

use std::hash::{BuildHasher, Hash, Hasher};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use hashbrown::HashTable;
use tokio::time::Instant;

use muster_model::{Resources, TaskState};
use muster_proto::model as model_pb;
use muster_scheduler::{JobGroup, TaskView};

/// A task's labels, in order, as given.
pub(crate) type Labels = Vec<(String, String)>;

/// What the tasks of one group at one job version share beyond what a [`TaskView`] holds:
/// kept once by the [`TaskInterner`] and pointed to by each of them.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct TaskDetail {
    pub(crate) framework_id: String,
    pub(crate) command: String,
    pub(crate) args: Vec<String>,
    /// Ordered by name.
    pub(crate) env: Vec<(String, String)>,
    pub(crate) user: String,
    /// In order, as given; interned on their own (tasks of many groups carry the same ones),
    /// so two details with the same labels point to the same copy.
    pub(crate) labels: Arc<Labels>,
    /// The labels of the ports each task holds, in its group's order (the numbers are each
    /// task's own, in its view).
    pub(crate) port_labels: Vec<String>,
}

impl TaskDetail {
    /// Its labels, as the wire has them.
    pub(crate) fn wire_labels(&self) -> Vec<model_pb::Label> {
        self.labels
            .iter()
            .map(|(key, value)| model_pb::Label {
                key: key.clone(),
                value: value.clone(),
            })
            .collect()
    }
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
    /// For a task this master launched: when it counts as lost if its agent has still said
    /// nothing about it (kept beside the exit code, in what would be padding).
    pub(crate) launch_deadline: Option<LaunchDeadline>,
    /// Why it is in its state, when there is more to say.
    pub(crate) message: Box<str>,
}

/// A moment on a master's launch clock: milliseconds since the clock's origin, in 32 bits
/// that wrap every 49 days. Two moments compare by their wrapping difference (as TCP compares
/// sequence numbers), which is right while they are under 24 days apart: launch timeouts are
/// capped there ([`LaunchDeadline::after`]). Four bytes, where an `Instant` takes sixteen,
/// for every task a master holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LaunchDeadline(NonZeroU32);

/// The longest launch timeout a [`LaunchDeadline`] keeps: 24 days.
const LONGEST_LAUNCH_TIMEOUT: Duration = Duration::from_secs(24 * 24 * 3600);

impl LaunchDeadline {
    /// `timeout` (at most 24 days) after `now`, on the clock that started at `origin`.
    pub(crate) fn after(origin: Instant, now: Instant, timeout: Duration) -> Self {
        let at = Self::ticks(origin, now)
            .wrapping_add(Self::ticks_of(timeout.min(LONGEST_LAUNCH_TIMEOUT)));
        // 0 is "no deadline" in an Option: a millisecond later does no harm.
        LaunchDeadline(NonZeroU32::new(at).unwrap_or(NonZeroU32::MIN))
    }

    /// How long from `now` until the deadline; zero once it passed.
    pub(crate) fn remaining(self, origin: Instant, now: Instant) -> Duration {
        let ahead = self.0.get().wrapping_sub(Self::ticks(origin, now)) as i32;
        Duration::from_millis(u64::try_from(ahead).unwrap_or(0))
    }

    /// The clock's reading at `now`.
    fn ticks(origin: Instant, now: Instant) -> u32 {
        // Truncated to 32 bits on purpose: the clock wraps.
        now.saturating_duration_since(origin).as_millis() as u32
    }

    fn ticks_of(duration: Duration) -> u32 {
        u32::try_from(duration.as_millis()).unwrap_or(u32::MAX)
    }
}

impl TaskRecord {
    /// Its unique id.
    pub(crate) fn id(&self) -> &str {
        self.view.id()
    }

    /// The slot it fills.
    pub(crate) fn name(&self) -> &str {
        self.view.name()
    }

    /// Its job; empty for a task an operator launched by hand.
    pub(crate) fn job(&self) -> &str {
        self.view.job()
    }

    /// The job it belongs to, if the master launched it for one.
    pub(crate) fn job_name(&self) -> Option<&str> {
        let job = self.view.job();
        (!job.is_empty()).then_some(job)
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
            id: self.view.id().to_owned(),
            name: self.view.name().to_owned(),
            framework_id: detail.framework_id.clone(),
            resources: Some(self.view.resources.clone().into()),
            labels: detail.wire_labels(),
            state: self.view.state.into(),
            exit_code: self.exit_code,
            command: detail.command.clone(),
            args: detail.args.clone(),
            env: detail.env.iter().cloned().collect(),
            message: self.message.to_string(),
            // The job's id, which carries its namespace (as agents and the master's own
            // messages name jobs); documents for people show them apart.
            job: self.view.job().to_owned(),
            namespace: String::new(),
            group: self.view.group().to_owned(),
            job_version: self.view.job_version,
            user: detail.user.clone(),
            ports: self.wire_ports(),
            lifecycle: None,
            health: self.view.health.into(),
            restarts: self.view.restarts,
        }
    }

    /// The ports it holds, labelled, as the wire has them.
    pub(crate) fn wire_ports(&self) -> Vec<model_pb::AssignedPort> {
        self.detail
            .port_labels
            .iter()
            .zip(self.view.ports())
            .map(|(label, &port)| model_pb::AssignedPort {
                label: label.clone(),
                port: port.into(),
            })
            .collect()
    }
}

/// Keeps one copy of each job's group ([`JobGroup`]) and [`TaskDetail`] the master's tasks use.
/// Entries no task uses any more are dropped as the interner grows ([`TaskInterner::sweep`]).
///
/// A task is interned from its wire form by reference: labels and details are looked up by
/// the wire's own strings, and copied only the first time they are seen. A new leader interns
/// every task of the cluster as the agents re-register (a million at 100,000 agents), and the
/// strings of the wire form are left whole to be freed with it, off the master's thread
/// ([`drop_later`](crate::drop_later)).
///
/// It hashes with foldhash (seeded per process): SipHash over a task's dozens of short strings
/// cost more than the rest of a re-registration. It compares strings with [`same_text`].
#[derive(Debug, Default)]
pub(crate) struct TaskInterner {
    /// Hashed by job and group.
    job_groups: HashTable<Arc<JobGroup>>,
    hasher: foldhash::fast::RandomState,
    labels: HashTable<Arc<Labels>>,
    /// Hashed by their fields, and their labels by address (labels are interned first).
    details: HashTable<Arc<TaskDetail>>,
    /// Entries after the last sweep: the next comes when there are twice as many.
    swept_at: usize,
}

/// Whether two strings are the same, as `a == b`, without handing an empty one to `memcmp`.
///
/// An empty `String` points at no allocation but at a dangling, unmapped address, and glibc's
/// AVX-512 `memcmp` reads an input shorter than a vector with a masked load: at an unmapped
/// address, even with nothing to read, that costs the CPU a microcode assist. On the 2-core
/// machine the benches run on, comparing two empty strings took about 90 ns, fifty times a
/// comparison of two short ones; a wire task's empty job, group, command and user made that
/// more than half of interning it.
#[inline]
pub(crate) fn same_text(a: &str, b: &str) -> bool {
    a.len() == b.len() && (a.is_empty() || a == b)
}

/// Whether two lists of strings are the same, by [`same_text`].
pub(crate) fn same_texts(a: &[String], b: &[String]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(a, b)| same_text(a, b))
}

/// The hash of job `job`'s group `group`.
fn job_group_hash(hasher: &foldhash::fast::RandomState, job: &str, group: &str) -> u64 {
    let mut state = hasher.build_hasher();
    job.hash(&mut state);
    group.hash(&mut state);
    state.finish()
}

/// A [`TaskDetail`]'s fields but its environment, borrowed (from a wire task, or from a
/// detail), to look one up by; the environment, ordered by name, goes beside it.
struct DetailKey<'a> {
    framework_id: &'a str,
    command: &'a str,
    args: &'a [String],
    user: &'a str,
    labels: &'a Arc<Labels>,
    port_labels: PortLabels<'a>,
}

/// The labels of a task's ports, as a detail keeps them or as the wire carries them.
#[derive(Clone, Copy)]
enum PortLabels<'a> {
    Kept(&'a [String]),
    Wire(&'a [model_pb::AssignedPort]),
}

impl DetailKey<'_> {
    /// Its port labels, copied.
    fn port_labels_owned(&self) -> Vec<String> {
        (0..self.port_labels.len())
            .map(|i| self.port_labels.get(i).to_owned())
            .collect()
    }
}

/// A wire task's port numbers, or `None` if one is not a port (0, or past 65535).
fn wire_port_numbers(wire: &model_pb::Task) -> Option<Vec<u16>> {
    wire.ports
        .iter()
        .map(|p| u16::try_from(p.port).ok().filter(|&port| port > 0))
        .collect()
}

impl<'a> PortLabels<'a> {
    fn len(self) -> usize {
        match self {
            PortLabels::Kept(kept) => kept.len(),
            PortLabels::Wire(wire) => wire.len(),
        }
    }

    fn get(self, i: usize) -> &'a str {
        match self {
            PortLabels::Kept(kept) => kept.get(i).map_or("", String::as_str),
            PortLabels::Wire(wire) => wire.get(i).map_or("", |port| port.label.as_str()),
        }
    }
}

/// Interned entries below which the interner never sweeps.
const SWEEP_FLOOR: usize = 4_096;

/// The hash of labels given as pairs, the same for the wire's and the interned copy's.
fn labels_hash<'a>(
    hasher: &foldhash::fast::RandomState,
    pairs: impl Iterator<Item = (&'a str, &'a str)>,
) -> u64 {
    let mut state = hasher.build_hasher();
    for (key, value) in pairs {
        key.hash(&mut state);
        value.hash(&mut state);
    }
    state.finish()
}

/// The hash of a detail, from its fields and its environment (ordered by name); its labels
/// count by address.
fn detail_hash<'a>(
    hasher: &foldhash::fast::RandomState,
    key: &DetailKey<'_>,
    env: impl Iterator<Item = (&'a str, &'a str)>,
) -> u64 {
    let mut state = hasher.build_hasher();
    key.framework_id.hash(&mut state);
    key.command.hash(&mut state);
    key.args.hash(&mut state);
    for (name, value) in env {
        name.hash(&mut state);
        value.hash(&mut state);
    }
    key.user.hash(&mut state);
    Arc::as_ptr(key.labels).hash(&mut state);
    for i in 0..key.port_labels.len() {
        key.port_labels.get(i).hash(&mut state);
    }
    state.finish()
}

/// Pairs of strings, borrowed.
pub(crate) fn pairs(
    owned: &[(String, String)],
) -> impl ExactSizeIterator<Item = (&str, &str)> + Clone {
    owned.iter().map(|(a, b)| (a.as_str(), b.as_str()))
}

/// Whether two lists of pairs are the same, pair by pair.
pub(crate) fn same_pairs<'a, 'b>(
    a: impl ExactSizeIterator<Item = (&'a str, &'a str)>,
    b: impl ExactSizeIterator<Item = (&'b str, &'b str)>,
) -> bool {
    a.len() == b.len()
        && a.zip(b)
            .all(|(a, b)| same_text(a.0, b.0) && same_text(a.1, b.1))
}

impl TaskDetail {
    /// Its fields, borrowed, but its environment.
    fn key(&self) -> DetailKey<'_> {
        DetailKey {
            framework_id: &self.framework_id,
            command: &self.command,
            args: &self.args,
            user: &self.user,
            labels: &self.labels,
            port_labels: PortLabels::Kept(&self.port_labels),
        }
    }

    /// Its hash as [`detail_hash`] gives it.
    fn hash_with(&self, hasher: &foldhash::fast::RandomState) -> u64 {
        detail_hash(hasher, &self.key(), pairs(&self.env))
    }

    /// Whether it has the fields of `key` and the environment `env` (ordered by name).
    fn is(&self, key: &DetailKey<'_>, env: &[(&str, &str)]) -> bool {
        same_text(&self.framework_id, key.framework_id)
            && same_text(&self.command, key.command)
            && same_texts(&self.args, key.args)
            && same_pairs(pairs(&self.env), env.iter().copied())
            && same_text(&self.user, key.user)
            && Arc::ptr_eq(&self.labels, key.labels)
            && self.port_labels.len() == key.port_labels.len()
            && self
                .port_labels
                .iter()
                .enumerate()
                .all(|(i, label)| same_text(label, key.port_labels.get(i)))
    }
}

impl TaskInterner {
    /// The shared copy of `job`'s group `group`.
    pub(crate) fn job_group(&mut self, job: &str, group: &str) -> Arc<JobGroup> {
        let hash = job_group_hash(&self.hasher, job, group);
        let same =
            |known: &Arc<JobGroup>| same_text(&known.job, job) && same_text(&known.group, group);
        if let Some(shared) = self.job_groups.find(hash, same) {
            return Arc::clone(shared);
        }
        let shared = JobGroup::new(job, group);
        let hasher = &self.hasher;
        self.job_groups
            .insert_unique(hash, Arc::clone(&shared), |known| {
                job_group_hash(hasher, &known.job, &known.group)
            });
        self.maybe_sweep();
        shared
    }

    /// The shared copy of `labels`.
    pub(crate) fn labels(&mut self, labels: &[(String, String)]) -> Arc<Labels> {
        self.labels_of(pairs(labels))
    }

    /// The shared copy of the labels `given` lists, copied only if they are new.
    fn labels_of<'a>(
        &mut self,
        given: impl ExactSizeIterator<Item = (&'a str, &'a str)> + Clone,
    ) -> Arc<Labels> {
        let hash = labels_hash(&self.hasher, given.clone());
        let same = |known: &Arc<Labels>| same_pairs(pairs(known), given.clone());
        if let Some(shared) = self.labels.find(hash, same) {
            return Arc::clone(shared);
        }
        let shared: Arc<Labels> = Arc::new(
            given
                .map(|(key, value)| (key.to_owned(), value.to_owned()))
                .collect(),
        );
        let hasher = &self.hasher;
        self.labels
            .insert_unique(hash, Arc::clone(&shared), |known| {
                labels_hash(hasher, pairs(known))
            });
        self.maybe_sweep();
        shared
    }

    /// The shared copy of `detail`, whose environment is ordered by name and whose labels came
    /// from [`labels`](TaskInterner::labels).
    pub(crate) fn detail(&mut self, detail: TaskDetail) -> Arc<TaskDetail> {
        debug_assert!(
            detail.env.is_sorted(),
            "a detail's environment is ordered by name"
        );
        let env: Vec<(&str, &str)> = pairs(&detail.env).collect();
        let found = self.find_detail(&detail.key(), &env);
        drop(env);
        found.unwrap_or_else(|| self.add_detail(detail))
    }

    /// The shared detail with the fields of `key` and the environment `env` (ordered by name),
    /// if there is one.
    fn find_detail(&self, key: &DetailKey<'_>, env: &[(&str, &str)]) -> Option<Arc<TaskDetail>> {
        let hash = detail_hash(&self.hasher, key, env.iter().copied());
        self.details.find(hash, |known| known.is(key, env)).cloned()
    }

    /// Interns `detail`, which is not there yet.
    fn add_detail(&mut self, detail: TaskDetail) -> Arc<TaskDetail> {
        let shared = Arc::new(detail);
        let hasher = &self.hasher;
        self.details
            .insert_unique(shared.hash_with(hasher), Arc::clone(&shared), |known| {
                known.hash_with(hasher)
            });
        self.maybe_sweep();
        shared
    }

    /// A task from its wire form (as agents report it), lenient as the master always was with
    /// what agents send: an unknown state counts as not started, missing resources as none.
    /// Only what is new to the interner, and the task's id, name and message, are copied.
    pub(crate) fn task(&mut self, wire: &model_pb::Task) -> TaskRecord {
        let labels = self.wire_labels(&wire.labels);
        self.record(wire, labels)
    }

    /// A task of a group sent with the labels its tasks share (`labels`, from
    /// [`wire_labels`](TaskInterner::wire_labels)), as [`task`](TaskInterner::task) reads
    /// it. A task with labels of its own keeps them.
    pub(crate) fn task_sharing(
        &mut self,
        wire: &model_pb::Task,
        labels: &Arc<Labels>,
    ) -> TaskRecord {
        let labels = if wire.labels.is_empty() {
            Arc::clone(labels)
        } else {
            self.wire_labels(&wire.labels)
        };
        self.record(wire, labels)
    }

    /// The shared copy of labels as the wire gives them.
    pub(crate) fn wire_labels(&mut self, labels: &[model_pb::Label]) -> Arc<Labels> {
        self.labels_of(
            labels
                .iter()
                .map(|label| (label.key.as_str(), label.value.as_str())),
        )
    }

    /// The record of `wire`, whose labels are `labels`.
    fn record(&mut self, wire: &model_pb::Task, labels: Arc<Labels>) -> TaskRecord {
        let state = TaskState::try_from(wire.state).unwrap_or(TaskState::Staging);
        let resources = wire
            .resources
            .as_ref()
            .map(|r| Resources {
                cpus: r.cpus,
                mem_mb: r.mem_mb,
            })
            .unwrap_or_default();
        // Allocates only for a task with an environment.
        let mut env: Vec<(&str, &str)> = wire
            .env
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str()))
            .collect();
        env.sort_unstable();
        // Labels and numbers stay aligned: a report with a port that is not one holds none.
        let ports = wire_port_numbers(wire);
        let key = DetailKey {
            framework_id: &wire.framework_id,
            command: &wire.command,
            args: &wire.args,
            user: &wire.user,
            labels: &labels,
            port_labels: PortLabels::Wire(if ports.is_some() { &wire.ports } else { &[] }),
        };
        let detail = match self.find_detail(&key, &env) {
            Some(detail) => detail,
            None => {
                let detail = TaskDetail {
                    framework_id: wire.framework_id.clone(),
                    command: wire.command.clone(),
                    args: wire.args.clone(),
                    env: env
                        .iter()
                        .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
                        .collect(),
                    user: wire.user.clone(),
                    labels: Arc::clone(&labels),
                    port_labels: key.port_labels_owned(),
                };
                self.add_detail(detail)
            }
        };
        let mut view = TaskView::new(
            &wire.id,
            &wire.name,
            self.job_group(&wire.job, &wire.group),
            resources,
            state,
            wire.job_version,
        )
        .with_ports(ports.unwrap_or_default());
        view.health = muster_model::TaskHealth::from_wire(wire.health);
        view.restarts = wire.restarts;
        TaskRecord {
            view: Arc::new(view),
            detail,
            exit_code: wire.exit_code,
            launch_deadline: None,
            message: wire.message.as_str().into(),
        }
    }

    /// Job groups, label sets and details interned now.
    pub(crate) fn len(&self) -> usize {
        self.job_groups.len() + self.labels.len() + self.details.len()
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
        self.job_groups.retain(|group| Arc::strong_count(group) > 1);
        self.swept_at = self.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(id: &str, slot: usize) -> model_pb::Task {
        model_pb::Task {
            ports: Default::default(),
            lifecycle: None,
            health: 0,
            restarts: 0,
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
            namespace: String::new(),
            job: "web".into(),
            group: "fe".into(),
            job_version: 3,
            user: "nobody".into(),
        }
    }

    #[test]
    fn same_text_is_string_equality() {
        let texts = ["", "a", "b", "ab", "framework-1", "framework-2"];
        for a in texts {
            for b in texts {
                assert_eq!(same_text(a, b), a == b, "{a:?} against {b:?}");
                // An empty slice of a live string, beside the dangling empty `String`.
                let empty = String::new();
                assert!(same_text(&a[..0], empty.as_str()));
            }
        }
        assert!(same_texts(
            &["x".into(), String::new()],
            &["x".into(), String::new()]
        ));
        assert!(!same_texts(&["x".into()], &["x".into(), String::new()]));
    }

    #[test]
    fn a_task_reads_back_as_it_was_given() {
        let mut interner = TaskInterner::default();
        let given = wire("web.fe[0]-1", 0);
        let record = interner.task(&given);
        assert_eq!(record.to_wire(), given);
        assert_eq!(record.id(), "web.fe[0]-1");
        assert_eq!(record.name(), "web.fe[0]");
        assert_eq!(record.job_name(), Some("web"));
        assert_eq!(record.state(), TaskState::Running);
        assert_eq!(record.resources().mem_mb, 64);
    }

    #[test]
    fn a_task_sent_in_a_group_sharing_its_labels_reads_back_as_if_sent_whole() {
        let mut interner = TaskInterner::default();
        let whole = wire("a", 0);
        let labels = interner.wire_labels(&whole.labels);
        let mut grouped = whole.clone();
        grouped.labels.clear();
        let record = interner.task_sharing(&grouped, &labels);
        assert_eq!(record.to_wire(), whole);
        assert!(Arc::ptr_eq(&record.detail, &interner.task(&whole).detail));
        // Labels of its own win over the group's.
        let mut own = wire("b", 1);
        own.labels[0].value = "back".into();
        let record = interner.task_sharing(&own, &labels);
        assert_eq!(record.to_wire(), own);
    }

    #[test]
    fn the_tasks_of_a_group_share_one_copy_of_what_they_have_in_common() {
        let mut interner = TaskInterner::default();
        let a = interner.task(&wire("a", 0));
        let b = interner.task(&wire("b", 1));
        assert!(Arc::ptr_eq(&a.detail, &b.detail));
        assert!(Arc::ptr_eq(a.view.job_group(), b.view.job_group()));
        // The environment is compared as a set: the order it arrives in does not matter.
        let mut reordered = wire("c", 2);
        reordered.env = [
            ("B".to_owned(), "2".to_owned()),
            ("A".to_owned(), "1".to_owned()),
        ]
        .into_iter()
        .collect();
        let c = interner.task(&reordered);
        assert!(Arc::ptr_eq(&a.detail, &c.detail));
        let mut other = wire("d", 3);
        other.command = "other".into();
        let d = interner.task(&other);
        assert!(!Arc::ptr_eq(&a.detail, &d.detail));
    }

    #[test]
    fn labels_are_one_copy_across_groups_and_tell_details_apart() {
        let mut interner = TaskInterner::default();
        let web = interner.task(&wire("a", 0));
        let mut api = wire("b", 0);
        api.job = "api".into();
        api.command = "api".into();
        let api = interner.task(&api);
        assert!(Arc::ptr_eq(&web.detail.labels, &api.detail.labels));
        // Labels are kept in order: the same pairs in another order are other labels, and
        // the detail that carries them another detail.
        let mut given = wire("c", 1);
        given.labels.push(model_pb::Label {
            key: "zone".into(),
            value: "a".into(),
        });
        let mut reordered = given.clone();
        reordered.labels.reverse();
        let (given, reordered) = (interner.task(&given), interner.task(&reordered));
        assert!(!Arc::ptr_eq(&given.detail.labels, &reordered.detail.labels));
        assert!(!Arc::ptr_eq(&given.detail, &reordered.detail));
        assert!(!Arc::ptr_eq(&given.detail, &web.detail));
        assert_eq!(reordered.to_wire().labels[0].key, "zone");
        // No labels at all are labels too, shared.
        assert!(Arc::ptr_eq(&interner.labels(&[]), &interner.labels(&[])));
    }

    #[test]
    fn a_launch_deadline_passes_after_its_timeout_across_the_clocks_wrap() {
        let origin = Instant::now();
        let second = Duration::from_secs(1);
        // From the start, and from just before the 32-bit millisecond clock wraps (49.7 days).
        for start in [
            Duration::ZERO,
            Duration::from_millis(u64::from(u32::MAX) - 500),
        ] {
            let now = origin + start;
            let deadline = LaunchDeadline::after(origin, now, second);
            assert_eq!(deadline.remaining(origin, now), second);
            assert_eq!(deadline.remaining(origin, now + second / 2), second / 2);
            assert_eq!(deadline.remaining(origin, now + second), Duration::ZERO);
            assert_eq!(
                deadline.remaining(origin, now + 10 * second),
                Duration::ZERO
            );
        }
        // A timeout past 24 days is 24 days.
        let far = LaunchDeadline::after(origin, origin, Duration::from_secs(u64::MAX));
        assert_eq!(far.remaining(origin, origin), LONGEST_LAUNCH_TIMEOUT);
        assert_eq!(
            std::mem::size_of::<TaskRecord>(),
            40,
            "a record as small as before"
        );
    }

    #[test]
    fn a_sweep_forgets_what_no_task_uses() {
        let mut interner = TaskInterner::default();
        let kept = interner.task(&wire("a", 0));
        let mut other = wire("b", 1);
        other.job = "api".into();
        other.command = "api".into();
        drop(interner.task(&other));
        assert_eq!(
            interner.len(),
            5,
            "web's fe, api's fe, the labels and two details"
        );
        interner.sweep();
        assert_eq!(
            interner.len(),
            3,
            "web's fe, the labels and the detail still used"
        );
        let again = interner.task(&wire("c", 2));
        assert!(Arc::ptr_eq(&kept.detail, &again.detail));
    }
}

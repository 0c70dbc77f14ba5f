//! A feed and a copy, joined without a network: whatever the leader's state goes through, the
//! copy ends each complete change equal to it.

use std::collections::BTreeMap;
use std::sync::Arc;

use muster_model::{AgentId, DrainPhase, Job, Resources, SchedulerType, TaskGroup, TaskState};
use muster_proto::scheduling as pb;
use prost::Message;

use super::{Feed, Replica};
use crate::plan::{AgentView, ClusterSnapshot, JobGroup, TaskView};

/// The leader's state, changed at random.
struct Leader {
    agents: BTreeMap<String, Arc<AgentView>>,
    jobs: BTreeMap<String, Job>,
    index: u64,
    held: Vec<String>,
    next_task: u64,
    rng: fastrand::Rng,
}

impl Leader {
    fn new(seed: u64) -> Self {
        Leader {
            agents: BTreeMap::new(),
            jobs: BTreeMap::new(),
            index: 1,
            held: Vec::new(),
            next_task: 0,
            rng: fastrand::Rng::with_seed(seed),
        }
    }

    fn snapshot(&self) -> ClusterSnapshot {
        ClusterSnapshot {
            index: self.index,
            agents: self.agents.values().cloned().collect(),
            jobs: self.jobs.clone(),
            held: self.held.iter().cloned().collect(),
            ..ClusterSnapshot::default()
        }
    }

    fn task(&mut self) -> TaskView {
        self.next_task += 1;
        let job = format!("job-{}", self.rng.u8(0..6));
        let id = format!("{job}.g[0]-{:08x}", self.next_task);
        let resources = Resources {
            cpus: 0.25,
            mem_mb: 64,
        };
        TaskView::new(
            &id,
            &format!("{job}.g[0]"),
            JobGroup::new(&job, "g"),
            resources,
            TaskState::Staging,
            1,
        )
    }

    fn some_agent(&mut self) -> Option<String> {
        let n = self.agents.len();
        (n > 0).then(|| {
            let k = self.rng.usize(0..n);
            self.agents.keys().nth(k).cloned().unwrap_or_default()
        })
    }

    /// One change of the kind a master makes.
    fn change(&mut self) {
        self.index += 1;
        match self.rng.u8(0..10) {
            0 => {
                let id = format!("agent-{:03}", self.rng.u16(0..200));
                let zone = format!("zone-{}", self.rng.u8(0..3));
                let total = Resources {
                    cpus: 8.0,
                    mem_mb: 8192,
                };
                let tasks: Vec<TaskView> = (0..self.rng.usize(0..4)).map(|_| self.task()).collect();
                let view = AgentView::new(
                    AgentId(id.clone()),
                    BTreeMap::from([("zone".to_owned(), zone)]),
                    total,
                    tasks,
                );
                self.agents.insert(id, Arc::new(view));
            }
            1 => {
                if let Some(id) = self.some_agent() {
                    self.agents.remove(&id);
                }
            }
            2..=4 => {
                if let Some(id) = self.some_agent() {
                    let task = Arc::new(self.task());
                    if let Some(view) = self.agents.get_mut(&id) {
                        Arc::make_mut(view).add_task(task);
                    }
                }
            }
            5..=6 => {
                // A task's state changes: a new pointer for it, the view rebuilt.
                if let Some(id) = self.some_agent() {
                    let state = [TaskState::Running, TaskState::Finished, TaskState::Failed]
                        [self.rng.usize(0..3)];
                    let pick = self.rng.usize(0..8);
                    if let Some(view) = self.agents.get_mut(&id) {
                        Arc::make_mut(view).update_tasks(|tasks| {
                            if !tasks.is_empty() {
                                let k = pick % tasks.len();
                                let mut task = TaskView::clone(&tasks[k]);
                                task.state = state;
                                tasks[k] = Arc::new(task);
                            }
                        });
                    }
                }
            }
            7 => {
                if let Some(id) = self.some_agent() {
                    let pick = self.rng.usize(0..8);
                    let eligible = self.rng.bool();
                    if let Some(view) = self.agents.get_mut(&id) {
                        let view = Arc::make_mut(view);
                        view.eligible = eligible;
                        view.drain = if eligible {
                            DrainPhase::None
                        } else {
                            DrainPhase::Migrating
                        };
                        view.update_tasks(|tasks| {
                            if !tasks.is_empty() {
                                tasks.remove(pick % tasks.len());
                            }
                        });
                    }
                }
            }
            8 => {
                let name = format!("job-{}", self.rng.u8(0..6));
                let version = self.rng.u64(1..5);
                self.jobs.insert(name.clone(), job(&name, version));
            }
            _ => {
                if self.rng.bool() {
                    let name = format!("job-{}", self.rng.u8(0..6));
                    self.jobs.remove(&name);
                } else {
                    self.held = vec![format!("job-{}.g[{}]", self.rng.u8(0..6), self.index)];
                }
            }
        }
    }
}

fn job(name: &str, version: u64) -> Job {
    Job {
        name: name.to_owned(),
        priority: 50,
        scheduler: SchedulerType::Service,
        named_scheduler: None,
        groups: vec![TaskGroup {
            name: "g".into(),
            count: 2,
            resources: Resources {
                cpus: 0.25,
                mem_mb: 64,
            },
            command: "server".into(),
            ..TaskGroup::default()
        }],
        stopped: false,
        version,
    }
}

/// A snapshot as the wire shows it, each agent's tasks by id (the order of a job's tasks
/// among themselves is not part of the state).
fn normalized(snapshot: ClusterSnapshot) -> pb::ClusterSnapshot {
    let mut wire = pb::ClusterSnapshot::from(snapshot);
    for agent in &mut wire.agents {
        agent.tasks.sort_by(|a, b| a.id.cmp(&b.id));
    }
    wire
}

/// Applies `pages` to `replica`, checking that it has a snapshot only after the last.
fn apply(replica: &mut Replica, pages: Vec<pb::ClusterChange>) {
    let last = pages.len().saturating_sub(1);
    for (k, page) in pages.into_iter().enumerate() {
        assert_eq!(page.complete, k == last, "only the last page completes");
        replica.apply(page).expect("a valid change");
        assert_eq!(replica.snapshot().is_some(), k == last);
    }
}

#[test]
fn a_copy_follows_every_change_of_the_leader() {
    for seed in 0..20 {
        let mut leader = Leader::new(seed);
        // Small pages, so that changes span several messages.
        let mut feed = Feed::new(pb::ReplicaDigest::default()).with_page_bytes(600);
        let mut replica = Replica::new();
        for round in 0..150 {
            for _ in 0..leader.rng.usize(1..6) {
                leader.change();
            }
            let snapshot = leader.snapshot();
            apply(&mut replica, feed.changes(&snapshot));
            let copy = replica.snapshot().expect("complete");
            assert_eq!(copy.index, snapshot.index);
            assert_eq!(
                normalized(copy),
                normalized(snapshot),
                "seed {seed}, round {round}"
            );
        }
    }
}

#[test]
fn an_unchanged_leader_sends_nothing_and_a_new_index_alone_sends_the_index() {
    let mut leader = Leader::new(7);
    for _ in 0..30 {
        leader.change();
    }
    let mut feed = Feed::new(pb::ReplicaDigest::default());
    let mut replica = Replica::new();
    apply(&mut replica, feed.changes(&leader.snapshot()));
    assert!(feed.changes(&leader.snapshot()).is_empty());
    leader.index += 1;
    let pages = feed.changes(&leader.snapshot());
    assert_eq!(
        pages,
        [pb::ClusterChange {
            index: leader.index,
            complete: true,
            ..pb::ClusterChange::default()
        }]
    );
}

#[test]
fn a_resumed_watch_sends_only_what_the_digests_say_differs() {
    let mut leader = Leader::new(11);
    for _ in 0..400 {
        leader.change();
    }
    // And a size where the digests are small beside the state: 50 agents of 20 tasks.
    for n in 0..50 {
        let tasks: Vec<TaskView> = (0..20).map(|_| leader.task()).collect();
        let total = Resources {
            cpus: 8.0,
            mem_mb: 8192,
        };
        let view = AgentView::new(AgentId(format!("big-{n}")), BTreeMap::new(), total, tasks);
        leader.agents.insert(format!("big-{n}"), Arc::new(view));
    }
    let mut first = Feed::new(pb::ReplicaDigest::default());
    let mut replica = Replica::new();
    let whole: usize = first
        .changes(&leader.snapshot())
        .into_iter()
        .map(|page| {
            let bytes = page.encoded_len();
            replica.apply(page).expect("a valid change");
            bytes
        })
        .sum();
    // The watch ends; the leader (or its successor) changes one agent meanwhile.
    let changed = leader.some_agent().expect("agents");
    let task = Arc::new(leader.task());
    if let Some(view) = leader.agents.get_mut(&changed) {
        Arc::make_mut(view).add_task(task);
    }
    leader.index += 1;
    let mut resumed = Feed::new(replica.digest());
    let pages = resumed.changes(&leader.snapshot());
    let sent: Vec<&str> = pages
        .iter()
        .flat_map(|page| page.agents.iter().map(|a| a.id.as_str()))
        .collect();
    assert_eq!(sent, [changed.as_str()]);
    assert!(pages.iter().all(|page| page.jobs.is_empty()));
    let resumed_bytes: usize = pages.iter().map(Message::encoded_len).sum();
    assert!(
        resumed_bytes * 20 < whole,
        "resuming sent {resumed_bytes} bytes, the whole state is {whole}"
    );
    apply(&mut replica, pages);
    assert_eq!(
        normalized(replica.snapshot().expect("complete")),
        normalized(leader.snapshot())
    );
}

#[test]
fn a_change_to_an_agent_never_sent_is_refused_by_its_field() {
    let mut replica = Replica::new();
    let change = pb::ClusterChange {
        index: 3,
        complete: true,
        agents: vec![pb::AgentChange {
            id: "agent-9".into(),
            tasks_gone: vec!["t".into()],
            ..pb::AgentChange::default()
        }],
        ..pb::ClusterChange::default()
    };
    let error = replica.apply(change).expect_err("never sent whole");
    assert!(error.to_string().contains("agents[0].header"), "{error}");
    assert!(replica.snapshot().is_none());
}

#[test]
fn an_agent_holding_one_id_twice_is_sent_whole_and_copied_as_it_is() {
    let mut leader = Leader::new(3);
    let task = leader.task();
    let other = leader.task();
    let total = Resources {
        cpus: 8.0,
        mem_mb: 8192,
    };
    let view = AgentView::new(
        AgentId("a".into()),
        BTreeMap::new(),
        total,
        vec![task.clone(), other.clone()],
    );
    leader.agents.insert("a".into(), Arc::new(view));
    let mut feed = Feed::new(pb::ReplicaDigest::default());
    let mut replica = Replica::new();
    apply(&mut replica, feed.changes(&leader.snapshot()));
    // A task given up as lost reports in again: the same id, twice, and `other` gone.
    let mut lost = task.clone();
    lost.state = TaskState::Lost;
    if let Some(view) = leader.agents.get_mut("a") {
        Arc::make_mut(view).update_tasks(|tasks| *tasks = vec![Arc::new(lost), Arc::new(task)]);
    }
    leader.index += 1;
    let pages = feed.changes(&leader.snapshot());
    assert!(pages[0].agents[0].replace_tasks, "{pages:?}");
    apply(&mut replica, pages);
    assert_eq!(
        normalized(replica.snapshot().expect("complete")),
        normalized(leader.snapshot())
    );
}

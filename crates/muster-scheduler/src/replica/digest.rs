//! Digests of what a copy of the cluster holds: 64 bits per agent and per job, the same in
//! every process and build that sends the same fields, so that a watch resuming at another
//! master sends only what differs.
//!
//! A digest covers exactly what the wire carries (a task's in-place restarts do not travel,
//! so they are not in it). Two different values share a digest with odds of about one in
//! 2^64; a digest that differs only costs sending the value again.

use muster_model::Job;

use crate::plan::{AgentView, TaskView};

/// FNV-1a, 64 bits: small, and fixed by its definition rather than by a library version.
struct Fnv(u64);

impl Fnv {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    fn new() -> Self {
        Fnv(Self::OFFSET)
    }

    fn bytes(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(Self::PRIME);
        }
    }

    fn u64(&mut self, value: u64) {
        self.bytes(&value.to_le_bytes());
    }

    /// A string, after its length, so that ("ab", "c") and ("a", "bc") differ.
    fn str(&mut self, text: &str) {
        self.u64(text.len() as u64);
        self.bytes(text.as_bytes());
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The digest of an agent's view: its fields, and its tasks in any order.
pub fn agent(view: &AgentView) -> u64 {
    let mut hash = Fnv::new();
    hash.str(&view.id.0);
    hash.u64(view.attributes.len() as u64);
    for (key, value) in &view.attributes {
        hash.str(key);
        hash.str(value);
    }
    hash.u64(view.total.cpus.to_bits());
    hash.u64(view.total.mem_mb);
    hash.u64(u64::from(view.eligible));
    let drain: i32 = muster_proto::model::DrainPhase::from(view.drain).into();
    hash.u64(drain as u64);
    hash.u64(u64::from(view.dynamic_ports.min));
    hash.u64(u64::from(view.dynamic_ports.max));
    // A sum is the same whatever order the tasks are in (a copy adds tasks at the end of their
    // job's, a master where a rebuild sorts them).
    let tasks = view
        .tasks()
        .iter()
        .fold(0u64, |sum, task| sum.wrapping_add(self::task(task)));
    hash.u64(view.tasks().len() as u64);
    hash.u64(tasks);
    hash.finish()
}

/// The digest of one task.
fn task(task: &TaskView) -> u64 {
    let mut hash = Fnv::new();
    hash.str(task.id());
    hash.str(task.name());
    hash.str(task.job());
    hash.str(task.group());
    hash.u64(task.resources.cpus.to_bits());
    hash.u64(task.resources.mem_mb);
    let state: i32 = task.state.into();
    let health: i32 = task.health.into();
    hash.u64(state as u64);
    hash.u64(health as u64);
    hash.u64(task.job_version);
    hash.u64(task.ports().len() as u64);
    for &port in task.ports() {
        hash.u64(u64::from(port));
    }
    // Mixed, so that sums of similar tasks do not cancel out.
    hash.finish()
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .rotate_left(29)
}

/// The digest of a job: of its debug form, which lists every field in order (maps in a job
/// are ordered). Another build may print a job differently; then the job is sent again.
pub fn job(job: &Job) -> u64 {
    let mut hash = Fnv::new();
    hash.bytes(format!("{job:?}").as_bytes());
    hash.finish()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use muster_model::{AgentId, Resources, TaskState};

    use super::*;
    use crate::plan::JobGroup;

    fn view(tasks: Vec<TaskView>) -> AgentView {
        let total = Resources {
            cpus: 4.0,
            mem_mb: 4096,
        };
        let attributes = BTreeMap::from([("zone".to_owned(), "a".to_owned())]);
        AgentView::new(AgentId("agent-1".into()), attributes, total, tasks)
    }

    fn task(id: &str, job: &str, state: TaskState) -> TaskView {
        let resources = Resources {
            cpus: 0.5,
            mem_mb: 64,
        };
        TaskView::new(id, id, JobGroup::new(job, "g"), resources, state, 1)
    }

    #[test]
    fn an_agents_digest_follows_its_fields_and_tasks_but_not_their_order() {
        let a = task("a-1", "a", TaskState::Running);
        let b = task("b-1", "b", TaskState::Running);
        let base = agent(&view(vec![a.clone(), b.clone()]));
        assert_eq!(base, agent(&view(vec![b.clone(), a.clone()])));
        assert_ne!(base, agent(&view(vec![a.clone()])));
        assert_ne!(
            base,
            agent(&view(vec![a.clone(), task("b-1", "b", TaskState::Failed)]))
        );
        let mut ineligible = view(vec![a.clone(), b.clone()]);
        ineligible.eligible = false;
        assert_ne!(base, agent(&ineligible));
        // What the wire does not carry does not count.
        let mut restarted = b.clone();
        restarted.restarts = 3;
        assert_eq!(base, agent(&view(vec![a, restarted])));
    }
}

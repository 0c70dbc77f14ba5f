//! Re-registration: rebuilding an agent from what it reports when it comes back (after a
//! failover or a broken link), settling that with what this master knew of it, and the
//! recovery a new leader waits through until every admitted agent is back (its deadline is
//! handled in `internal`).

use std::collections::HashSet;

use muster_actor::Context;
use muster_model::{AgentId, TaskState};
use muster_proto::cluster as pb;
use muster_scheduler::Stop;

use super::Master;
use super::leadership::Role;
use crate::cluster::{AgentEntry, registry_info, state_of};
use crate::task_record::TaskRecord;

impl Master {
    /// Rebuilds an agent, its tasks and frameworks from its re-registration, then settles what
    /// this master knew of it with what it reports (see `settle_reregistered`). With
    /// `given_up` (the agent comes back from unreachable: its tasks were marked lost, and
    /// replacements placed where there was room), a task it reports running whose slot a
    /// replacement already runs in is recorded as being killed, and returned: the agent kills
    /// it before anything else. A task nothing replaced, or whose replacement has not started,
    /// is kept, and that replacement stopped: a healed partition does not leave a service
    /// below its count.
    pub(super) fn readmit(
        &mut self,
        request: pb::ReregisterAgent,
        identity: &str,
        given_up: bool,
        ctx: &mut Context<Self>,
    ) -> (String, Vec<String>) {
        let pb::ReregisterAgent {
            agent_id,
            info,
            frameworks,
            tasks,
            completed_frameworks,
            completed_tasks,
            tasks_sharing_labels,
            registration,
        } = request;
        let (mut tasks, mut tasks_sharing_labels) = (tasks, tasks_sharing_labels);
        let mut kill = Vec::new();
        // Replacements not running yet of the tasks it comes back with: stopped, the
        // originals kept.
        let mut superseded = Vec::new();
        if given_up {
            // The slots a replacement already runs in: there, the returning copy is the extra
            // one. Elsewhere nothing replaced the task (no room, or its replacement has not
            // started): it is kept, and the replacement on its way stopped.
            let replaced: HashSet<&str> = self
                .cluster
                .agents
                .iter()
                .filter(|(id, _)| **id != agent_id)
                .flat_map(|(_, agent)| agent.tasks.iter())
                .filter(|t| t.state() == TaskState::Running)
                .map(TaskRecord::name)
                .collect();
            let grouped = tasks_sharing_labels
                .iter_mut()
                .flat_map(|group| &mut group.tasks);
            let mut kept = HashSet::new();
            for task in tasks
                .iter_mut()
                .chain(grouped)
                .filter(|t| !state_of(t).is_terminal())
            {
                if replaced.contains(task.name.as_str()) {
                    tracing::warn!(agent = %agent_id, task = %task.id, "the agent comes back with a task given up as lost and replaced: it kills it");
                    task.state = TaskState::Killed.into();
                    kill.push(task.id.clone());
                } else {
                    tracing::info!(agent = %agent_id, task = %task.id, "the agent comes back with a task given up as lost that nothing replaced: kept");
                    kept.insert(task.name.clone());
                }
            }
            superseded = self
                .cluster
                .agents
                .iter()
                .filter(|(id, _)| **id != agent_id)
                .flat_map(|(id, agent)| agent.tasks.iter().map(move |t| (id, t)))
                .filter(|(_, t)| !t.is_terminal() && kept.contains(t.name()))
                .map(|(id, t)| Stop {
                    agent: AgentId(id.clone()),
                    task_id: t.id().to_owned(),
                })
                .collect();
            self.metrics.given_up_killed += kill.len() as u64;
        }
        self.cluster.add_frameworks(&frameworks);
        for framework in completed_frameworks {
            if !self.cluster.frameworks.contains_key(&framework.id) {
                self.cluster.completed_frameworks.insert(framework.id);
            }
        }
        let interner = &mut self.cluster.interner;
        let wire = (tasks, tasks_sharing_labels, completed_tasks, frameworks);
        let grouped: usize = wire.1.iter().map(|group| group.tasks.len()).sum();
        let mut tasks: Vec<TaskRecord> = Vec::with_capacity(wire.0.len() + grouped);
        tasks.extend(wire.0.iter().map(|t| interner.task(t)));
        for group in &wire.1 {
            // Read once for the group's tasks.
            let labels = interner.wire_labels(&group.labels);
            tasks.extend(
                group
                    .tasks
                    .iter()
                    .map(|t| interner.task_sharing(t, &labels)),
            );
        }
        let mut completed_tasks: Vec<TaskRecord> =
            wire.2.iter().map(|t| interner.task(t)).collect();
        // Their strings are freed beside the master, not by it.
        crate::drop_later::drop_later(wire);
        // What it ran when it was marked unreachable and does not report now: remembered as
        // LOST, so that a late start of one is killed when it reports in.
        if let Some(lost) = self.cluster.given_up.remove(&agent_id) {
            let reported: HashSet<&str> = tasks
                .iter()
                .chain(&completed_tasks)
                .map(TaskRecord::id)
                .collect();
            let forgotten: Vec<_> = lost
                .into_iter()
                .filter(|t| !reported.contains(t.id()))
                .collect();
            completed_tasks.extend(forgotten);
        }
        let previous = self.cluster.agents.insert(
            agent_id.clone(),
            AgentEntry::connected(
                registry_info(&info.unwrap_or_default(), identity),
                registration,
                tasks,
                completed_tasks,
            ),
        );
        // A re-registration counts as a heartbeat, but does not cut short the long first TTL
        // a new leader gave the agent.
        self.heartbeat_received_not_earlier(&agent_id);
        self.metrics.reregistered += 1;
        if let Role::Leading { recovery, .. } = &mut self.role
            && let Some(progress) = recovery
        {
            progress.awaiting.remove(&agent_id);
            if progress.awaiting.is_empty() {
                let took = progress.started.elapsed();
                tracing::info!(
                    agents = progress.admitted,
                    took = ?took,
                    "every admitted agent re-registered; recovery done"
                );
                self.metrics.recovery = Some(took);
                progress.deadline.cancel();
                self.release_placements("every admitted agent is back");
                if let Role::Leading { recovery, .. } = &mut self.role {
                    *recovery = None;
                }
            }
        }
        // Its capacity is news to the blocked-queue: evaluations blocked while it was away
        // (a job submitted during a failover's recovery, say) may fit now.
        self.capacity_joined(&agent_id);
        // The answer names them, but it may be lost on the way (the agent then asks again and
        // hears nothing of them, as they are no longer given up): the kills are also sent,
        // and sent again until each task reports its end.
        for task_id in &kill {
            self.send_kill(agent_id.clone(), task_id.clone(), 0, ctx);
        }
        for stop in superseded {
            tracing::info!(agent = %stop.agent.0, task = %stop.task_id, "a replacement not yet running: stopped, its original is back");
            self.stop_task(&stop, ctx);
        }
        if let Some(previous) = previous {
            self.settle_reregistered(&agent_id, previous, ctx);
        }
        (agent_id, kill)
    }

    /// An agent re-registered with what it runs; `previous` is what this master had for it.
    /// - A task the master had running there that the agent ended while away (it is in the
    ///   agent's completed tasks) is updated as ended: its job may get a replacement.
    /// - One the agent does not report at all (its launch was lost on the way, or the agent
    ///   lost its state) is LOST, and its job gets an evaluation to replace it.
    /// - One the agent runs that this master gave up on (marked LOST and replaced), or was
    ///   killing, is killed (again), so its slot does not end up with two tasks.
    pub(super) fn settle_reregistered(
        &mut self,
        agent_id: &str,
        previous: AgentEntry,
        ctx: &mut Context<Self>,
    ) {
        self.publish_agent(agent_id, "agent-reregistered");
        let Some(agent) = self.cluster.agents.get(agent_id) else {
            return;
        };
        // Given up as lost (and replaced), or being killed: neither may run on.
        let given_up: HashSet<&str> = previous
            .completed_tasks
            .iter()
            .filter(|t| t.state() == TaskState::Lost)
            .chain(
                previous
                    .tasks
                    .iter()
                    .filter(|t| t.state() == TaskState::Killed),
            )
            .map(TaskRecord::id)
            .collect();
        let to_kill: Vec<Stop> = agent
            .tasks
            .iter()
            .filter(|t| given_up.contains(t.id()))
            .map(|t| Stop {
                agent: AgentId(agent_id.to_owned()),
                task_id: t.id().to_owned(),
            })
            .collect();
        let mut ended_away = Vec::new();
        let mut lost = Vec::new();
        for known in previous.tasks.into_iter().filter(|t| !t.is_terminal()) {
            if agent.tasks.iter().any(|t| t.id() == known.id()) {
                continue;
            }
            match agent.completed_tasks.iter().find(|t| t.id() == known.id()) {
                Some(ended) => ended_away.push((known, ended.clone())),
                None => lost.push(known),
            }
        }
        for stop in to_kill {
            tracing::warn!(agent = %agent_id, task = %stop.task_id, "the agent runs a task already given up as lost: killing it");
            self.stop_task(&stop, ctx);
        }
        for (known, ended) in ended_away {
            if let Some(agent) = self.cluster.agent_mut(agent_id) {
                agent.completed_tasks.retain(|t| t.id() != ended.id());
                agent.tasks.push(known);
            }
            self.record_updated(agent_id.to_owned(), ended, ctx);
        }
        for mut task in lost {
            tracing::warn!(agent = %agent_id, task = %task.id(), "the re-registered agent does not know a task launched on it");
            if let Some(agent) = self.cluster.agent_mut(agent_id) {
                agent.tasks.push(task.clone());
            }
            task.set_state(TaskState::Lost);
            task.message = "the agent did not report it when it re-registered".into();
            self.record_updated(agent_id.to_owned(), task, ctx);
        }
    }
}

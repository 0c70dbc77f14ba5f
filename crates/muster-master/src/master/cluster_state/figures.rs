//! What the master answers a metrics rendering with ([`GetMetricsSnapshot`]): its own figures
//! at this moment, and the handles [`crate::metrics`] reads the rest through, beside the
//! process. Answered at once on every master, leading or not.
//!
//! [`GetMetricsSnapshot`]: super::GetMetricsSnapshot

use std::sync::Arc;

use muster_actor::Context;

use crate::master::Master;
use crate::master::leadership::Role;

use crate::metrics::snapshot::{MasterFigures, MetricsSnapshot, TASK_STATES};

impl Master {
    /// This master's figures, and the processes and members to read the rest from.
    pub(in crate::master) fn metrics_snapshot(&self, ctx: &Context<Self>) -> MetricsSnapshot {
        let mut tasks = [0u64; TASK_STATES.len()];
        for agent in self.cluster.agents.values() {
            for task in agent.tasks.iter().chain(&agent.completed_tasks) {
                let state = task.state();
                if let Some(i) = TASK_STATES.iter().position(|(s, _)| *s == state) {
                    tasks[i] += 1;
                }
            }
        }
        let (agents_registered, agents_unreachable) = self
            .registry
            .reader()
            .read(|state| (state.agents.len() as u64, state.unreachable.len() as u64));
        let m = &self.metrics;
        let master = MasterFigures {
            is_leader: self.leading_term().is_some(),
            recovery: m.recovery,
            messages: m.messages,
            agents_registered,
            agents_connected: self.cluster.connected_agents() as u64,
            agents_unreachable,
            tasks,
            registrations: m.registered,
            reregistrations: m.reregistered,
            marked_unreachable: m.unreachable,
            impersonations_refused: m.impersonations,
            unknown_agents_refused: m.unknown_agents,
            given_up_tasks_killed: m.given_up_killed,
            leadership_confirmations: m.leadership_confirmations,
            reconcile_evals: m.reconcile_evals,
            kill_retries: m.kill_retries,
            kills_fenced: m.kills_fenced,
        };
        let registrar = match &self.role {
            Role::Leading { registrar, .. } => Some(registrar.clone()),
            Role::Standby { .. } | Role::Starting { .. } => None,
        };
        MetricsSnapshot {
            instruments: Arc::clone(&self.instruments),
            master,
            master_queued: ctx.pid().queued(),
            broker: self.broker.clone(),
            blocked: self.blocked.clone(),
            registrar,
            registry: self.registry.clone(),
            node: self.node.clone(),
            system: ctx.system().clone(),
        }
    }
}

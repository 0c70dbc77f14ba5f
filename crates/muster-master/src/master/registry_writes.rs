//! Registry writes: a write as a deferred future, writes that carry evaluations (handed to the
//! broker once stored), and the state index that orders snapshots, plans and evaluations.

use std::sync::Arc;

use muster_actor::{Context, Pid};
use muster_broker::BrokerMsg;
use muster_model::{EvalStatus, Evaluation};
use muster_registry::{Op, Outcome, Registrar, RegistrarMsg, WriteError};

use super::Master;
use super::leadership::Role;

/// Milliseconds since the Unix epoch, on the cluster's wall clock.
pub(super) fn now_ms() -> u64 {
    muster_model::clock::unix_ms()
}

impl Master {
    /// A registry write through `registrar` as a future the process can defer; its latency
    /// is observed in the master's instruments.
    pub(super) fn write_registry(
        &self,
        registrar: &Pid<Registrar>,
        op: Op,
    ) -> impl std::future::Future<
        Output = Result<muster_registry::WriteResult, muster_actor::AskError>,
    > + Send
    + 'static {
        let registrar = registrar.clone();
        let instruments = Arc::clone(&self.instruments);
        async move {
            let started = std::time::Instant::now();
            let written = registrar.ask(|r| RegistrarMsg::Write(op, r)).await;
            instruments.registry_written(started.elapsed());
            written
        }
    }

    /// The index the cluster state is at: it counts changes to agents and tasks, and never
    /// falls behind the registry's applied index, so snapshots, plans, evaluations and the
    /// blocked-queue's capacity changes share one order.
    pub(super) fn current_index(&self) -> u64 {
        self.state_index.max(self.registry.reader().applied_index())
    }

    /// Records a change to agents or tasks and returns its index.
    pub(super) fn next_index(&mut self) -> u64 {
        self.state_index = self.current_index() + 1;
        self.state_index
    }

    /// Writes `ops` and `evals` in one raft entry, then hands the stored pending evaluations
    /// to the broker; `done` gets the entry's outcome.
    pub(super) fn write_with_evals(
        &mut self,
        ops: Vec<Op>,
        evals: Vec<Evaluation>,
        ctx: &mut Context<Self>,
        done: impl FnOnce(&mut Master, &mut Context<Master>, Result<Outcome, WriteError>)
        + Send
        + 'static,
    ) {
        let Role::Leading { registrar, .. } = &self.role else {
            return done(self, ctx, Err(WriteError::NotLeader { leader: None }));
        };
        // New evaluations (not stored yet: no create index) are counted once stored.
        let created = evals.iter().filter(|e| e.create_index == 0).count();
        // Only pending evaluations go to the broker; a completed or blocked one is just
        // recorded.
        let ids: Vec<_> = evals
            .iter()
            .filter(|e| e.status == EvalStatus::Pending)
            .map(|e| e.id.clone())
            .collect();
        let mut all = ops;
        if !evals.is_empty() {
            all.push(Op::UpsertEvals(evals));
        }
        // Kept for the event stream: what the write changed, published once it is stored.
        let published = all.clone();
        let write = self.write_registry(registrar, Op::Together(all));
        ctx.defer(write, move |master: &mut Master, ctx, written| {
            let written = match written {
                Ok(result) => result,
                Err(e) => Err(WriteError::Failed(format!("registrar unavailable: {e}"))),
            };
            if written.is_ok() {
                master.publish_written(&published);
                master.instruments.evaluations_created(created);
            }
            if written.is_ok() && !ids.is_empty() {
                // The stored form carries the create index the broker orders by.
                let stored: Vec<Evaluation> = master.registry.reader().read(|state| {
                    ids.iter()
                        .filter_map(|id| state.evals.get(id).cloned())
                        .collect()
                });
                // The pulse first: a worker handed one of these reads the index from it.
                master.publish_state();
                let _ = master.broker.tell(BrokerMsg::Enqueue(stored));
            }
            done(master, ctx, written);
        });
    }
}

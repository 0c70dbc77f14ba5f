//! The instruments observed where things happen: latency histograms of scheduler runs, plans
//! and registry writes, and counters of evaluations, placements, heartbeats and leader
//! changes, registered once in one [`Registry`] per master.

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use super::Label;

/// Buckets of the latency histograms: 0.5 ms to about 33 s, doubling.
fn latency_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.0005, 2.0, 17)
}

fn latency_histogram() -> Histogram {
    Histogram::new(latency_buckets())
}

/// How a scheduler worker's run of an evaluation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RunOutcome {
    /// Everything placed; the evaluation completed and acked.
    Complete,
    /// Some tasks found no room; the evaluation blocked and acked.
    Blocked,
    /// A backend error interrupted it; the evaluation was handed back.
    Nacked,
}

impl RunOutcome {
    fn label(self) -> [Label; 1] {
        [(
            "outcome",
            match self {
                RunOutcome::Complete => "complete",
                RunOutcome::Blocked => "blocked",
                RunOutcome::Nacked => "nacked",
            },
        )]
    }
}

/// The instruments observed where events happen, registered once in this master's
/// [`Registry`]. The master process owns them; its scheduler workers hold a clone of the
/// `Arc` (handed out with [`SchedulingPids`](crate::SchedulingPids)).
#[derive(Debug)]
pub struct MasterInstruments {
    registry: Registry,
    scheduler_runs: Family<[Label; 1], Histogram, fn() -> Histogram>,
    plan_apply: Histogram,
    registry_writes: Histogram,
    evaluations_created: Counter,
    evaluations_completed: Counter,
    evaluations_blocked: Counter,
    placements: Family<[Label; 1], Counter>,
    heartbeats: Counter,
    leader_changes: Counter,
}

impl Default for MasterInstruments {
    fn default() -> Self {
        MasterInstruments::new()
    }
}

impl MasterInstruments {
    /// New instruments, all at zero, registered in a registry of their own.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let scheduler_runs: Family<[Label; 1], Histogram, fn() -> Histogram> =
            Family::new_with_constructor(latency_histogram);
        // Every series exists from the start, at zero, so a rate over it is defined.
        for outcome in [
            RunOutcome::Complete,
            RunOutcome::Blocked,
            RunOutcome::Nacked,
        ] {
            scheduler_runs.get_or_create_owned(&outcome.label());
        }
        registry.register_with_unit(
            "muster_scheduler_run",
            "Time a scheduler worker of this master spent on an evaluation, from its dequeue to \
             its ack or nack, by outcome (complete, blocked, nacked)",
            Unit::Seconds,
            scheduler_runs.clone(),
        );
        let plan_apply = latency_histogram();
        registry.register_with_unit(
            "muster_plan_apply",
            "Time from a plan's arrival at this master's plan applier to its answer, the quorum's \
             confirmation of the leadership included (plans applied only)",
            Unit::Seconds,
            plan_apply.clone(),
        );
        let registry_writes = latency_histogram();
        registry.register_with_unit(
            "muster_registry_write",
            "Time a registry write of this master took, from its ask to the registrar to its \
             entry applied (batching included)",
            Unit::Seconds,
            registry_writes.clone(),
        );
        let evaluations_created = Counter::default();
        registry.register(
            "muster_evaluations_created",
            "Evaluations this master created and stored (job submissions and stops, task ends, \
             agents arriving or lost, reconciliation)",
            evaluations_created.clone(),
        );
        let evaluations_completed = Counter::default();
        registry.register(
            "muster_evaluations_completed",
            "Evaluations a scheduler planned fully and this master recorded complete",
            evaluations_completed.clone(),
        );
        let evaluations_blocked = Counter::default();
        registry.register(
            "muster_evaluations_blocked",
            "Evaluations a scheduler could not place fully and this master recorded blocked",
            evaluations_blocked.clone(),
        );
        let placements: Family<[Label; 1], Counter> = Family::default();
        for result in ["committed", "rejected"] {
            placements.get_or_create_owned(&[("result", result)]);
        }
        registry.register(
            "muster_placements",
            "Placements in the plans this master applied, by result (committed: it fit and was \
             launched; rejected: it no longer fit)",
            placements.clone(),
        );
        let heartbeats = Counter::default();
        registry.register(
            "muster_heartbeats_received",
            "Heartbeats agents sent this master, answered or refused",
            heartbeats.clone(),
        );
        let leader_changes = Counter::default();
        registry.register(
            "muster_leader_changes",
            "Changes of the registry's leader or term as this master's member saw them, from no \
             leader known when it started",
            leader_changes.clone(),
        );
        MasterInstruments {
            registry,
            scheduler_runs,
            plan_apply,
            registry_writes,
            evaluations_created,
            evaluations_completed,
            evaluations_blocked,
            placements,
            heartbeats,
            leader_changes,
        }
    }

    /// The registry the instruments are registered in.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// A scheduler worker's run of an evaluation ended.
    pub(crate) fn scheduler_run(&self, outcome: RunOutcome, took: Duration) {
        self.scheduler_runs
            .get_or_create(&outcome.label())
            .observe(took.as_secs_f64());
    }

    /// A plan was applied: `committed` placements fit, `rejected` did not.
    pub(crate) fn plan_applied(&self, took: Duration, committed: usize, rejected: usize) {
        self.plan_apply.observe(took.as_secs_f64());
        self.placements
            .get_or_create(&[("result", "committed")])
            .inc_by(committed as u64);
        self.placements
            .get_or_create(&[("result", "rejected")])
            .inc_by(rejected as u64);
    }

    /// A registry write was answered (stored or not).
    pub(crate) fn registry_written(&self, took: Duration) {
        self.registry_writes.observe(took.as_secs_f64());
    }

    /// `count` new evaluations were stored.
    pub(crate) fn evaluations_created(&self, count: usize) {
        self.evaluations_created.inc_by(count as u64);
    }

    /// An evaluation was recorded complete.
    pub(crate) fn evaluation_completed(&self) {
        self.evaluations_completed.inc();
    }

    /// An evaluation was recorded blocked.
    pub(crate) fn evaluation_blocked(&self) {
        self.evaluations_blocked.inc();
    }

    /// An agent's heartbeat arrived.
    pub(crate) fn heartbeat_received(&self) {
        self.heartbeats.inc();
    }

    /// The registry's leader or term changed.
    pub(crate) fn leader_changed(&self) {
        self.leader_changes.inc();
    }
}

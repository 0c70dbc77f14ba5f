//! The figures and the instruments of one rendering, encoded by `prometheus-client` in the
//! [`Format`] asked for.

use std::fmt;

use prometheus_client::encoding::{
    EncodeLabelSet, EncodeMetric, MetricEncoder, prometheus_text, text,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::{Registry, Unit};

use super::Format;
use super::instruments::MasterInstruments;
use super::snapshot::{Figures, TASK_STATES};

/// The values of one family, each with its labels, in order: a family built for one
/// rendering.
#[derive(Debug)]
struct Series<M, L> {
    values: Vec<(L, M)>,
}

impl<M: TypedMetric, L> TypedMetric for Series<M, L> {
    const TYPE: MetricType = M::TYPE;
}

impl<M, L> EncodeMetric for Series<M, L>
where
    M: EncodeMetric + TypedMetric,
    L: EncodeLabelSet + fmt::Debug,
{
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), fmt::Error> {
        for (labels, metric) in &self.values {
            metric.encode(encoder.encode_family(labels)?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        M::TYPE
    }

    fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

fn series<M, L>(values: impl IntoIterator<Item = (L, M)>) -> Series<M, L> {
    Series {
        values: values.into_iter().collect(),
    }
}

/// A registry of `figures`, for one rendering.
fn figures_registry(figures: &Figures) -> Registry {
    let mut r = Registry::default();
    let gauge = |r: &mut Registry, name: &str, help: &str, value: u64| {
        r.register(name, help, ConstGauge::new(value));
    };
    let counter = |r: &mut Registry, name: &str, help: &str, value: u64| {
        r.register(name, help, ConstCounter::new(value));
    };

    // The master process.
    let m = &figures.master;
    gauge(
        &mut r,
        "muster_master_is_leader",
        "Whether this master leads, caught up with the registry (1), or not (0)",
        u64::from(m.is_leader),
    );
    r.register_with_unit(
        "muster_recovery",
        "How long this master's last failover recovery took, from leading to every admitted \
         agent back or the deadline passed (0 until one completes)",
        Unit::Seconds,
        ConstGauge::new(m.recovery.map_or(0.0, |d| d.as_secs_f64())),
    );
    counter(
        &mut r,
        "muster_master_messages",
        "Messages the master process handled",
        m.messages,
    );
    gauge(
        &mut r,
        "muster_agents_registered",
        "Agents admitted in the registry and not marked unreachable",
        m.agents_registered,
    );
    gauge(
        &mut r,
        "muster_agents_connected",
        "Agents connected to this master (0 on a standby)",
        m.agents_connected,
    );
    gauge(
        &mut r,
        "muster_agents_unreachable",
        "Agents the registry holds marked unreachable",
        m.agents_unreachable,
    );
    r.register(
        "muster_tasks",
        "Tasks on the agents this master knows, by state (ended ones while their agents keep \
         them; none on a standby)",
        series(
            TASK_STATES
                .iter()
                .zip(m.tasks)
                .map(|((_, state), count)| ([("state", *state)], ConstGauge::new(count))),
        ),
    );
    for (name, help, value) in [
        (
            "muster_agent_registrations",
            "Agents this master admitted",
            m.registrations,
        ),
        (
            "muster_agent_reregistrations",
            "Re-registrations of admitted agents this master took",
            m.reregistrations,
        ),
        (
            "muster_agents_marked_unreachable",
            "Agents this master marked unreachable",
            m.marked_unreachable,
        ),
        (
            "muster_impersonations_refused",
            "Agent messages refused for claiming what their certificate does not prove: another certificate's agent, a second agent on one certificate, an address it does not name",
            m.impersonations_refused,
        ),
        (
            "muster_unknown_agents_refused",
            "Re-registrations refused under an id the registry does not hold",
            m.unknown_agents_refused,
        ),
        (
            "muster_given_up_tasks_killed",
            "Tasks returning agents were told to kill: given up as lost, and replaced",
            m.given_up_tasks_killed,
        ),
        (
            "muster_leadership_confirmations",
            "Rounds in which a quorum confirmed this master's leadership",
            m.leadership_confirmations,
        ),
        (
            "muster_reconcile_evaluations",
            "Evaluations the convergence check made for jobs that ran other than they ask",
            m.reconcile_evals,
        ),
        (
            "muster_kill_retries",
            "Kills sent again because the agent did not answer the last one",
            m.kill_retries,
        ),
        (
            "muster_kills_fenced",
            "Kills an agent refused for their leader term",
            m.kills_fenced,
        ),
    ] {
        counter(&mut r, name, help, value);
    }

    // The broker and the blocked-queue.
    // Every scheduler name the broker knows (the built-in ones always), and any only the
    // blocked-queue holds evaluations of.
    let mut evaluations = Vec::new();
    let mut served = Vec::new();
    let built_in = muster_model::BUILT_IN_SCHEDULERS.map(str::to_owned);
    let names: std::collections::BTreeSet<&String> = (built_in.iter())
        .chain(figures.broker.by_scheduler.keys())
        .chain(figures.blocked.by_scheduler.keys())
        .collect();
    for scheduler in names {
        let q = figures
            .broker
            .by_scheduler
            .get(scheduler)
            .copied()
            .unwrap_or_default();
        let blocked = figures
            .blocked
            .by_scheduler
            .get(scheduler)
            .copied()
            .unwrap_or(0);
        let presence = figures
            .broker
            .schedulers
            .get(scheduler)
            .copied()
            .unwrap_or_default();
        served.push((
            [("scheduler", scheduler.clone())],
            ConstGauge::new(u64::from(presence.served)),
        ));
        for (state, count) in [
            ("ready", q.ready),
            ("unacked", q.unacked),
            ("pending", q.pending),
            ("delayed", q.delayed),
            ("cancelable", q.cancelable),
            ("failed", q.failed),
            ("blocked", blocked),
        ] {
            evaluations.push((
                [
                    ("scheduler", scheduler.clone()),
                    ("state", state.to_owned()),
                ],
                ConstGauge::new(count as u64),
            ));
        }
    }
    r.register(
        "muster_broker_evaluations",
        "Evaluations the eval broker holds, by scheduler name and state (ready, unacked, \
         pending, delayed, cancelable, failed), and those the blocked-queue holds (blocked)",
        series(evaluations),
    );
    r.register(
        "muster_scheduler_served",
        "Whether a worker serves each scheduler name the broker knows (1): one waits on it, \
         or asked for it lately; 0 while its evaluations wait for one",
        series(served),
    );
    counter(
        &mut r,
        "muster_broker_deliveries",
        "Evaluations the broker handed to scheduler workers, redeliveries included",
        figures.broker.delivered,
    );
    counter(
        &mut r,
        "muster_broker_canceled_evaluations",
        "Evaluations the broker marked canceled in the registry",
        figures.broker.canceled,
    );
    counter(
        &mut r,
        "muster_blocked_unblocked_evaluations",
        "Evaluations the blocked-queue released for capacity that changed",
        figures.blocked.total_unblocked,
    );
    counter(
        &mut r,
        "muster_blocked_canceled_evaluations",
        "Blocked evaluations canceled for a newer one of their job",
        figures.blocked.total_canceled,
    );

    // The registry.
    let raft = &figures.raft;
    for (name, help, value) in [
        (
            "muster_registry_term",
            "The raft term this master's registry member is in",
            raft.term,
        ),
        (
            "muster_registry_last_log_index",
            "The index of the last entry in this member's raft log",
            raft.last_log_index,
        ),
        (
            "muster_registry_commit_index",
            "The registry's raft commit index as this member knows it: on the leader, the \
             highest index a majority holds; on a standby, its applied index (a lower bound)",
            raft.commit_index,
        ),
        (
            "muster_registry_applied_index",
            "The index of the last entry this member applied to its registry",
            raft.applied_index,
        ),
        (
            "muster_registry_snapshot_index",
            "The index of the last entry in this member's latest snapshot",
            raft.snapshot_index,
        ),
        (
            "muster_registry_log_entries",
            "Entries in this member's raft log: after the last one purged into a snapshot, up \
             to the last",
            raft.last_log_index.saturating_sub(raft.purged_index),
        ),
        (
            "muster_registrar_entries",
            "Raft entries this master's registrar wrote since this master last became leader (0 \
             on a standby)",
            figures.registrar.entries,
        ),
        (
            "muster_registrar_operations",
            "Operations the registrar's entries carried since this master last became leader",
            figures.registrar.ops,
        ),
    ] {
        gauge(&mut r, name, help, value);
    }

    // The actor runtime.
    gauge(
        &mut r,
        "muster_processes",
        "Actor processes running in this master",
        figures.processes as u64,
    );
    r.register(
        "muster_mailbox_depth",
        "Envelopes waiting in a process's mailbox: the master (which is also the plan \
         applier), the eval broker, the blocked-queue, the registrar (while leading)",
        series(
            figures
                .mailboxes
                .iter()
                .map(|(process, depth)| ([("process", *process)], ConstGauge::new(*depth as u64))),
        ),
    );
    counter(
        &mut r,
        "muster_dead_letters",
        "Messages this master's actor system could not deliver: left in a mailbox when its \
         process ended, or from another node and not delivered",
        figures.dead_letters,
    );
    let t = &figures.transport;
    r.register_with_unit(
        "muster_transport_sent",
        "Bytes of the frames this master wrote on its links to other nodes (protobuf-encoded, \
         before gRPC, HTTP/2 and TLS framing)",
        Unit::Bytes,
        ConstCounter::new(t.bytes_sent),
    );
    r.register_with_unit(
        "muster_transport_received",
        "Bytes of the frames this master read from its links to other nodes (as sent bytes)",
        Unit::Bytes,
        ConstCounter::new(t.bytes_received),
    );
    counter(
        &mut r,
        "muster_transport_reconnects",
        "Connection attempts to a peer after its link was lost or an attempt failed",
        t.reconnects,
    );
    counter(
        &mut r,
        "muster_transport_expired_sends",
        "Messages sent with a deadline (task launches) dropped unwritten: past their deadline, \
         or queued for a connection that broke",
        t.expired_tells,
    );
    counter(
        &mut r,
        "muster_transport_frames_received",
        "Frames this master read from its links",
        t.frames_received,
    );
    counter(
        &mut r,
        "muster_transport_envelopes_received",
        "Envelopes this master read from its links",
        t.envelopes_received,
    );
    counter(
        &mut r,
        "muster_transport_late_replies",
        "Answers from other nodes that came after their asker gave up",
        t.late_replies,
    );
    r.register(
        "muster_transport_undelivered",
        "Envelopes from other nodes that were not delivered, by cause",
        series(
            [
                ("unknown_process", t.unknown_process),
                ("unknown_type", t.unknown_type),
                ("malformed", t.malformed),
                ("oversized", t.oversized),
                ("rejected", t.rejected),
                ("unauthorized", t.unauthorized),
            ]
            .map(|(cause, count)| ([("cause", cause)], ConstCounter::new(count))),
        ),
    );
    r
}

/// Encodes the figures and the instruments in `format`.
pub(super) fn encode(
    instruments: &MasterInstruments,
    figures: &Figures,
    format: Format,
) -> Result<String, fmt::Error> {
    let figures = figures_registry(figures);
    let mut out = String::with_capacity(16 * 1024);
    match format {
        Format::OpenMetrics => {
            text::encode_registry(&mut out, &figures)?;
            text::encode_registry(&mut out, instruments.registry())?;
            text::encode_eof(&mut out)?;
        }
        Format::PrometheusText => {
            prometheus_text::encode(&mut out, &figures)?;
            prometheus_text::encode(&mut out, instruments.registry())?;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashSet};
    use std::time::Duration;

    use muster_broker::{BlockedStats, BrokerStats, QueueStats};

    use super::super::snapshot::{MasterFigures, RaftFigures};
    use super::*;

    fn figures() -> Figures {
        Figures {
            master: MasterFigures {
                is_leader: true,
                recovery: Some(Duration::from_millis(1500)),
                agents_registered: 2,
                tasks: [1, 0, 3, 0, 0, 0, 1],
                kill_retries: 4,
                ..MasterFigures::default()
            },
            broker: BrokerStats {
                by_scheduler: BTreeMap::from([(
                    "batch".to_owned(),
                    QueueStats {
                        ready: 5,
                        ..QueueStats::default()
                    },
                )]),
                delivered: 9,
                ..BrokerStats::default()
            },
            blocked: BlockedStats {
                by_scheduler: BTreeMap::from([("service".to_owned(), 2)]),
                ..BlockedStats::default()
            },
            raft: RaftFigures {
                term: 3,
                last_log_index: 40,
                commit_index: 40,
                applied_index: 40,
                snapshot_index: 10,
                purged_index: 8,
            },
            mailboxes: vec![("master", 1), ("broker", 0)],
            ..Figures::default()
        }
    }

    /// The families a text declares with `# TYPE`, in order.
    fn families(text: &str) -> Vec<(&str, &str)> {
        text.lines()
            .filter_map(|line| line.strip_prefix("# TYPE "))
            .filter_map(|rest| rest.split_once(' '))
            .collect()
    }

    #[test]
    fn both_formats_declare_each_family_once_with_its_help() -> Result<(), fmt::Error> {
        let instruments = MasterInstruments::new();
        instruments.plan_applied(Duration::from_millis(3), 2, 1);
        for format in [Format::OpenMetrics, Format::PrometheusText] {
            let text = encode(&instruments, &figures(), format)?;
            let families = families(&text);
            assert!(families.len() > 40, "{format:?}: {families:?}");
            let mut seen = HashSet::new();
            for (name, _) in &families {
                assert!(seen.insert(*name), "{format:?}: {name} declared twice");
                assert!(name.starts_with("muster_"), "{name}");
                assert!(
                    text.contains(&format!("# HELP {name} ")),
                    "{format:?}: {name} has no help"
                );
            }
            assert_eq!(
                text.ends_with("# EOF\n"),
                format == Format::OpenMetrics,
                "{format:?}"
            );
        }
        Ok(())
    }

    #[test]
    fn figures_land_in_their_series() -> Result<(), fmt::Error> {
        let instruments = MasterInstruments::new();
        instruments.plan_applied(Duration::from_millis(3), 2, 1);
        instruments.evaluations_created(3);
        let text = encode(&instruments, &figures(), Format::PrometheusText)?;
        for line in [
            "muster_master_is_leader 1",
            "muster_recovery_seconds 1.5",
            "muster_agents_registered 2",
            "muster_tasks{state=\"running\"} 3",
            "muster_tasks{state=\"lost\"} 1",
            "muster_kill_retries_total 4",
            "muster_broker_evaluations{scheduler=\"batch\",state=\"ready\"} 5",
            "muster_broker_evaluations{scheduler=\"service\",state=\"blocked\"} 2",
            "muster_broker_evaluations{scheduler=\"system\",state=\"failed\"} 0",
            "muster_broker_deliveries_total 9",
            "muster_registry_term 3",
            "muster_registry_log_entries 32",
            "muster_mailbox_depth{process=\"master\"} 1",
            "muster_transport_undelivered_total{cause=\"unauthorized\"} 0",
            "muster_transport_sent_bytes_total 0",
            "muster_evaluations_created_total 3",
            "muster_placements_total{result=\"committed\"} 2",
            "muster_placements_total{result=\"rejected\"} 1",
            "muster_plan_apply_seconds_count 1",
            "muster_scheduler_run_seconds_count{outcome=\"nacked\"} 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in:\n{text}"
            );
        }
        Ok(())
    }
}

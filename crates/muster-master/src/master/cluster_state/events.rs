//! The event stream: what changed on the leading master — jobs, evaluations, tasks, agents —
//! in one order, for `GET /v1/event/stream` and `muster events` (Nomad's event stream).
//!
//! The master publishes an event where the change happens: after a registry write it made
//! (jobs, evaluations, agents marked unreachable), when an agent registers, and when a task's
//! state changes. The log keeps the last [`KEPT_EVENTS`] for subscribers that resume from an
//! index; a subscriber gets what is kept after its index and then every new event, from a
//! broadcast channel. One that falls more than [`SUBSCRIBER_BUFFER`] events behind is told
//! so (and resumes from its last index), so a slow reader never holds the master up.

use std::collections::VecDeque;
use std::sync::Arc;

use muster_api::{EvaluationInfo, Event, TaskInfo};
use muster_model::{Evaluation, namespace_of};
use muster_proto::model as model_pb;
use muster_registry::Op;
use muster_security::Caller;
use tokio::sync::broadcast;

use crate::master::Master;
use crate::master::registry_writes::now_ms;
use crate::task_record::TaskRecord;
use crate::visibility::{NamespaceFilter, event_visibility, task_namespace};

/// Events the log keeps for subscribers resuming from an index.
pub const KEPT_EVENTS: usize = 4096;
/// Events one subscriber may fall behind before it is told it lagged.
pub const SUBSCRIBER_BUFFER: usize = 1024;

/// What a subscriber starts from: the kept events after its index, then the live ones.
pub type Subscription = (Vec<Arc<LoggedEvent>>, broadcast::Receiver<Arc<LoggedEvent>>);

/// An event as the log keeps it. Its topic and kind are fixed text, and an agent's payload is
/// made only when a subscriber reads the event ([`to_event`](LoggedEvent::to_event)): a
/// master publishes an event for every agent that re-registers, most often with nobody
/// subscribed.
#[derive(Debug)]
pub struct LoggedEvent {
    index: u64,
    term: u64,
    time_ms: u64,
    topic: &'static str,
    kind: &'static str,
    key: Box<str>,
    /// The namespace of its job, evaluation or task; `None` for an agent's.
    namespace: Option<Box<str>>,
    payload: Payload,
}

/// What an event says about its subject.
#[derive(Debug)]
enum Payload {
    /// An agent (the key) and its status: `{"id", "status"}`.
    AgentStatus(&'static str),
    /// Any other document, as it goes out.
    Document(serde_json::Value),
}

impl LoggedEvent {
    /// Its place in the master's stream.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// The event as the stream carries it.
    pub fn to_event(&self) -> Event {
        let payload = match &self.payload {
            Payload::AgentStatus(status) => {
                serde_json::json!({ "id": &*self.key, "status": status })
            }
            Payload::Document(document) => document.clone(),
        };
        Event {
            index: self.index,
            term: self.term,
            time_ms: self.time_ms,
            topic: self.topic.to_owned(),
            kind: self.kind.to_owned(),
            key: self.key.to_string(),
            namespace: self.namespace.as_deref().map(str::to_owned),
            payload,
        }
    }
}

/// A subscriber's events in order, the kept ones first, filtered to some topics: what the
/// HTTP stream and the gRPC `StreamEvents` both read.
#[derive(Debug)]
pub struct EventFeed {
    backlog: std::vec::IntoIter<Arc<LoggedEvent>>,
    live: broadcast::Receiver<Arc<LoggedEvent>>,
    topics: Vec<String>,
    /// The index of the last event read, wanted or not: where a lagged reader resumes.
    last: u64,
    /// Who reads: events of namespaces it may not read are skipped, and environment values
    /// are redacted where it may not read secrets.
    reader: Caller,
    /// The namespaces it asked for.
    namespaces: NamespaceFilter,
}

/// A reader fell more than [`SUBSCRIBER_BUFFER`] events behind and missed some.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lagged {
    /// How many it missed.
    pub missed: u64,
    /// The index to resume after.
    pub resume_after: u64,
}

impl EventFeed {
    /// The feed of `subscription` (made after index `after`) for `reader`, filtered to
    /// `topics` (every topic if empty) and `namespaces` (agent events pass to a reader who
    /// may read agents).
    pub fn new(
        subscription: Subscription,
        after: u64,
        topics: Vec<String>,
        reader: Caller,
        namespaces: NamespaceFilter,
    ) -> EventFeed {
        let (backlog, live) = subscription;
        EventFeed {
            backlog: backlog.into_iter(),
            live,
            topics,
            last: after,
            reader,
            namespaces,
        }
    }

    /// `event` as this reader may see it, if it wants it and may see it at all.
    fn shown(&self, event: &LoggedEvent) -> Option<Event> {
        if !(self.topics.is_empty() || self.topics.iter().any(|topic| topic == event.topic)) {
            return None;
        }
        let namespace = event.namespace.as_deref();
        if namespace.is_some_and(|namespace| !self.namespaces.admits(namespace)) {
            return None;
        }
        let reveal = event_visibility(&self.reader, namespace)?;
        let mut shown = event.to_event();
        if !reveal {
            shown.redact_secrets();
        }
        Some(shown)
    }

    /// The next wanted event; `None` once the log is gone (the master stopped or stepped
    /// down). Cancel-safe: a cancelled call loses nothing.
    pub async fn next(&mut self) -> Option<Result<Event, Lagged>> {
        while let Some(event) = self.backlog.next() {
            self.last = event.index;
            if let Some(shown) = self.shown(&event) {
                return Some(Ok(shown));
            }
        }
        loop {
            match self.live.recv().await {
                Ok(event) => {
                    self.last = event.index;
                    if let Some(shown) = self.shown(&event) {
                        return Some(Ok(shown));
                    }
                }
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    return Some(Err(Lagged {
                        missed,
                        resume_after: self.last,
                    }));
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
}

/// The master's event log.
#[derive(Debug)]
pub(crate) struct EventLog {
    next: u64,
    kept: VecDeque<Arc<LoggedEvent>>,
    live: broadcast::Sender<Arc<LoggedEvent>>,
}

impl Default for EventLog {
    fn default() -> Self {
        EventLog {
            next: 1,
            kept: VecDeque::with_capacity(KEPT_EVENTS),
            live: broadcast::Sender::new(SUBSCRIBER_BUFFER),
        }
    }
}

impl EventLog {
    /// Appends an event and sends it to the subscribers.
    fn publish(
        &mut self,
        term: u64,
        topic: &'static str,
        kind: &'static str,
        key: &str,
        namespace: Option<&str>,
        payload: Payload,
    ) {
        let event = Arc::new(LoggedEvent {
            index: self.next,
            term,
            time_ms: now_ms(),
            topic,
            kind,
            key: key.into(),
            namespace: namespace.map(Into::into),
            payload,
        });
        self.next += 1;
        if self.kept.len() == KEPT_EVENTS {
            self.kept.pop_front();
        }
        self.kept.push_back(Arc::clone(&event));
        // No subscriber: nothing to do.
        let _ = self.live.send(event);
    }

    /// The kept events after `after` (all of them for 0, or for an index from before what is
    /// kept), and a receiver of the ones to come.
    pub(crate) fn subscribe(&self, after: u64) -> Subscription {
        let backlog = self
            .kept
            .iter()
            .filter(|e| e.index > after)
            .cloned()
            .collect();
        (backlog, self.live.subscribe())
    }
}

impl Master {
    /// Publishes an event on this master's stream, in its current term: about something in
    /// `namespace`, or (`None`) about an agent.
    fn publish(
        &mut self,
        topic: &'static str,
        kind: &'static str,
        key: &str,
        namespace: Option<&str>,
        payload: serde_json::Value,
    ) {
        let term = self.term;
        self.events.publish(
            term,
            topic,
            kind,
            key,
            namespace,
            Payload::Document(payload),
        );
    }

    /// Publishes what the registry write `ops` changed, once it is stored.
    pub(in crate::master) fn publish_written(&mut self, ops: &[Op]) {
        for op in ops {
            match op {
                Op::Together(ops) => self.publish_written(ops),
                Op::UpsertJob(job) => self.publish_job(&job.name, "job-registered"),
                Op::StopJob(name) => self.publish_job(name, "job-stopped"),
                Op::UpsertEvals(evals) => {
                    let ids: Vec<String> = evals.iter().map(|e| e.id.0.clone()).collect();
                    self.publish_evals(&ids);
                }
                Op::SetEvalStatus { ids, .. } => {
                    let ids: Vec<String> = ids.iter().map(|id| id.0.clone()).collect();
                    self.publish_evals(&ids);
                }
                Op::MarkUnreachable { id, .. } => {
                    self.publish_agent(&id.0, "agent-unreachable");
                }
                Op::UpdateAgent { id, .. } => self.publish_agent(&id.0, "agent-updated"),
                Op::SetScheduling { id, scheduling } => {
                    let doc = muster_api::AgentScheduling::from(
                        muster_proto::cluster::AgentSchedulingReply {
                            agent_id: id.0.clone(),
                            scheduling: Some(scheduling.clone().into()),
                        },
                    );
                    if let Ok(payload) = serde_json::to_value(doc) {
                        self.publish("agent", "agent-scheduling", &id.0, None, payload);
                    }
                }
                _ => {}
            }
        }
    }

    fn publish_job(&mut self, name: &str, kind: &'static str) {
        let payload = self.registry.reader().read(|state| {
            state.jobs.get(name).map(|job| {
                serde_json::json!({
                    "name": job.name_in_namespace(),
                    "namespace": job.namespace(),
                    "version": job.version,
                    "stopped": job.stopped,
                })
            })
        });
        if let Some(payload) = payload {
            self.publish("job", kind, name, Some(namespace_of(name)), payload);
        }
    }

    fn publish_evals(&mut self, ids: &[String]) {
        let stored: Vec<Evaluation> = self.registry.reader().read(|state| {
            ids.iter()
                .filter_map(|id| state.evals.get(&muster_model::EvalId(id.clone())).cloned())
                .collect()
        });
        for eval in stored {
            let namespace = namespace_of(&eval.job).to_owned();
            let doc = EvaluationInfo::from(model_pb::Evaluation::from(eval));
            let key = doc.id.clone();
            if let Ok(payload) = serde_json::to_value(doc) {
                self.publish(
                    "evaluation",
                    "evaluation-updated",
                    &key,
                    Some(&namespace),
                    payload,
                );
            }
        }
    }

    /// Publishes an agent's change: `kind` is `agent-registered`, `agent-reregistered`,
    /// `agent-updated` or `agent-unreachable`.
    pub(in crate::master) fn publish_agent(&mut self, id: &str, kind: &'static str) {
        let status = match kind {
            "agent-unreachable" => "unreachable",
            _ => "ready",
        };
        let term = self.term;
        self.events
            .publish(term, "agent", kind, id, None, Payload::AgentStatus(status));
    }

    /// Publishes a task's new state on `agent_id`.
    pub(in crate::master) fn publish_task(&mut self, agent_id: &str, task: &TaskRecord) {
        let wire = task.to_wire();
        let namespace = task_namespace(&wire).to_owned();
        let doc = TaskInfo::new(agent_id, wire);
        let key = doc.id.clone();
        if let Ok(payload) = serde_json::to_value(doc) {
            self.publish("task", "task-updated", &key, Some(&namespace), payload);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subscriber_resumes_after_its_index_from_what_is_kept() {
        let mut log = EventLog::default();
        for n in 0..(KEPT_EVENTS + 10) {
            log.publish(
                1,
                "job",
                "job-registered",
                &format!("j{n}"),
                Some("default"),
                Payload::Document(serde_json::Value::Null),
            );
        }
        let (backlog, _) = log.subscribe(0);
        assert_eq!(backlog.len(), KEPT_EVENTS, "only the last ones are kept");
        assert_eq!(backlog.first().map(|e| e.index), Some(11));
        let (backlog, mut live) = log.subscribe(KEPT_EVENTS as u64 + 8);
        assert_eq!(
            backlog.iter().map(|e| e.index).collect::<Vec<_>>(),
            [KEPT_EVENTS as u64 + 9, KEPT_EVENTS as u64 + 10]
        );
        log.publish(
            2,
            "task",
            "task-updated",
            "t1",
            Some("default"),
            Payload::Document(serde_json::Value::Null),
        );
        let next = live.try_recv().map(|e| (e.index, e.term, e.key.clone()));
        assert_eq!(next.ok(), Some((KEPT_EVENTS as u64 + 11, 2, "t1".into())));
    }

    #[test]
    fn an_agent_event_reads_as_its_id_and_status() {
        let mut log = EventLog::default();
        log.publish(
            3,
            "agent",
            "agent-unreachable",
            "agent-7",
            None,
            Payload::AgentStatus("unreachable"),
        );
        let (backlog, _) = log.subscribe(0);
        let events: Vec<Event> = backlog.iter().map(|e| e.to_event()).collect();
        assert_eq!(
            events,
            [Event {
                index: 1,
                term: 3,
                time_ms: backlog[0].time_ms,
                topic: "agent".into(),
                kind: "agent-unreachable".into(),
                key: "agent-7".into(),
                namespace: None,
                payload: serde_json::json!({ "id": "agent-7", "status": "unreachable" }),
            }]
        );
    }
}

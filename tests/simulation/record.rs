//! What a run saw: its event trace, the leaders each master claimed to be, and the clients'
//! operations for the linearizability check. Shared by every host of one simulation.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use muster_security::TokenSecret;

use crate::workload::{JobOp, JobRet};

/// One client operation event, in the order the simulation saw them.
#[derive(Clone, Debug)]
pub(crate) enum OpEvent {
    /// A client (one logical thread of the checker) invoked an operation on a job.
    Invoke { thread: u64, job: String, op: JobOp },
    /// It returned.
    Return {
        thread: u64,
        job: String,
        ret: JobRet,
    },
}

#[derive(Debug, Default)]
struct Inner {
    trace: Vec<(Duration, String)>,
    leaders: BTreeMap<u64, BTreeSet<u64>>,
    latest_leader: Option<(u64, u64)>,
    ops: Vec<Option<OpEvent>>,
    token: Option<TokenSecret>,
    problems: Vec<String>,
}

/// The run's shared record.
#[derive(Clone, Debug, Default)]
pub(crate) struct Record {
    inner: Arc<Mutex<Inner>>,
}

/// Simulated time inside a host or client (zero outside one).
pub(crate) fn now() -> Duration {
    turmoil::sim_elapsed().unwrap_or_default()
}

impl Record {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a line to the trace at simulated time `at`.
    pub(crate) fn log_at(&self, at: Duration, line: impl Into<String>) {
        self.lock().trace.push((at, line.into()));
    }

    /// Adds a line to the trace, from inside a host or client.
    pub(crate) fn log(&self, line: impl Into<String>) {
        self.log_at(now(), line);
    }

    /// The trace, one line per event.
    pub(crate) fn trace(&self) -> Vec<String> {
        self.lock()
            .trace
            .iter()
            .map(|(at, line)| format!("{:>9.3}s {line}", at.as_secs_f64()))
            .collect()
    }

    /// Master `id` believes it leads in `term`.
    pub(crate) fn leader(&self, term: u64, id: u64) {
        let mut inner = self.lock();
        let new = inner.leaders.entry(term).or_default().insert(id);
        if inner.latest_leader.is_none_or(|(t, _)| term >= t) {
            inner.latest_leader = Some((term, id));
        }
        drop(inner);
        if new {
            self.log(format!("m{id} leads in term {term}"));
        }
    }

    /// Every term with the masters that claimed to lead in it.
    pub(crate) fn leaders(&self) -> BTreeMap<u64, BTreeSet<u64>> {
        self.lock().leaders.clone()
    }

    /// The master that claimed leadership in the highest term seen.
    pub(crate) fn latest_leader(&self) -> Option<u64> {
        self.lock().latest_leader.map(|(_, id)| id)
    }

    /// Records a client operation event; answers its position for [`discard`](Self::discard).
    pub(crate) fn op(&self, event: OpEvent) -> usize {
        let line = match &event {
            OpEvent::Invoke { thread, job, op } => format!("client {thread}: {job} {op:?} ..."),
            OpEvent::Return { thread, job, ret } => format!("client {thread}: {job} -> {ret:?}"),
        };
        let mut inner = self.lock();
        inner.ops.push(Some(event));
        let position = inner.ops.len() - 1;
        drop(inner);
        self.log(line);
        position
    }

    /// Takes back an invocation that surely had no effect and got no answer (a read that
    /// failed): it is left out of the history.
    pub(crate) fn discard(&self, position: usize) {
        if let Some(event) = self.lock().ops.get_mut(position) {
            *event = None;
        }
        self.log("(it reached no master: left out)");
    }

    /// Every client operation event that counts, in order.
    pub(crate) fn ops(&self) -> Vec<OpEvent> {
        self.lock().ops.iter().flatten().cloned().collect()
    }

    /// Records a broken invariant found while the run was going.
    pub(crate) fn problem(&self, problem: String) {
        self.log(format!("PROBLEM: {problem}"));
        self.lock().problems.push(problem);
    }

    /// The broken invariants recorded while the run was going.
    pub(crate) fn problems(&self) -> Vec<String> {
        self.lock().problems.clone()
    }

    /// The management token, once the ACLs are bootstrapped.
    pub(crate) fn token(&self) -> Option<TokenSecret> {
        self.lock().token.clone()
    }

    /// Stores the management token.
    pub(crate) fn set_token(&self, token: TokenSecret) {
        self.lock().token = Some(token);
    }
}

//! What a run saw: its event trace, each master's leadership and raft term as they changed,
//! the clients' operations (with when each was invoked) for the linearizability check and the
//! checks of what ran, the faults in force and when, and the jobs as the last reads found
//! them. Shared by every host of one simulation. (What the agents' machines ran, started,
//! stopped and lost is kept by their `SimulatedTasks`.)

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

/// One master's standing, as its registry's leadership watch said when it changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Standing {
    /// When.
    pub(crate) at: Duration,
    /// The master's raft id.
    pub(crate) master: u64,
    /// Its raft term.
    pub(crate) term: u64,
    /// Whether it leads (raft has it lead and a quorum answered it within its lease).
    pub(crate) leads: bool,
}

/// A fault the nemesis inflicted: what, from when, until when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FaultSpan {
    /// The fault, as the trace names it.
    pub(crate) what: String,
    /// For a follower cut off from everything ([`Fault::IsolateFollower`]), its raft id.
    ///
    /// [`Fault::IsolateFollower`]: crate::faults::Fault::IsolateFollower
    pub(crate) isolated_follower: Option<u64>,
    /// When it started (an agent restart waiting for a launch: when it started waiting).
    pub(crate) from: Duration,
    /// When it was undone (or done, for a restart); `None` while in force.
    pub(crate) until: Option<Duration>,
}

/// A client's write (a submission or a stop), as the checks of what ran need it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Write {
    /// The job.
    pub(crate) job: String,
    /// What it asked.
    pub(crate) op: JobOp,
    /// When it was invoked.
    pub(crate) at: Duration,
    /// What it answered; `None` if its effect is unknown (no answer, or a refusal).
    pub(crate) ret: Option<JobRet>,
    /// The bytes of payload a submission carried (0: none).
    pub(crate) payload: usize,
}

#[derive(Debug, Default)]
struct Inner {
    trace: Vec<(Duration, String)>,
    leaders: BTreeMap<u64, BTreeSet<u64>>,
    latest_leader: Option<(u64, u64)>,
    /// Every master's standing as it changed.
    standings: Vec<Standing>,
    /// The clients' operation events, each with when it was recorded; `None` for a
    /// discarded one.
    ops: Vec<Option<(Duration, OpEvent)>>,
    /// The payload of each submission that carried one, by its position in `ops`.
    payloads: BTreeMap<usize, usize>,
    /// How many submissions were invoked.
    submissions: u64,
    /// How many stretches of large submissions are in force.
    large_entries: u32,
    /// The faults inflicted.
    faults: Vec<FaultSpan>,
    /// Each job as the last read found it.
    finals: BTreeMap<String, JobRet>,
    token: Option<TokenSecret>,
    problems: Vec<String>,
}

/// The run's shared record.
#[derive(Clone, Debug, Default)]
pub(crate) struct Record {
    inner: Arc<Mutex<Inner>>,
}

thread_local! {
    /// The simulation's time as of its last step, for what runs between steps (the nemesis
    /// rebooting a machine) or after them (the checks reading the machines).
    static BETWEEN_STEPS: std::cell::Cell<Duration> = const { std::cell::Cell::new(Duration::ZERO) };
}

/// Simulated time: inside a host or client, its clock; outside one, the time of the last
/// step (see [`stepped`]).
pub(crate) fn now() -> Duration {
    turmoil::sim_elapsed().unwrap_or_else(|| BETWEEN_STEPS.with(std::cell::Cell::get))
}

/// The simulation running on this thread has stepped to `elapsed`.
pub(crate) fn stepped(elapsed: Duration) {
    BETWEEN_STEPS.with(|at| at.set(elapsed));
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
    fn leader(&self, term: u64, id: u64) {
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

    /// Master `id`'s leadership watch changed: it is in `term`, leading or not.
    pub(crate) fn standing(&self, id: u64, term: u64, leads: bool) {
        let at = now();
        self.lock().standings.push(Standing {
            at,
            master: id,
            term,
            leads,
        });
        if leads {
            self.leader(term, id);
        }
    }

    /// Every master's standing as it changed, in order.
    pub(crate) fn standings(&self) -> Vec<Standing> {
        self.lock().standings.clone()
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
        let at = now();
        let mut inner = self.lock();
        if let OpEvent::Invoke {
            op: JobOp::Submit(..),
            ..
        } = &event
        {
            inner.submissions += 1;
        }
        inner.ops.push(Some((at, event)));
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
        self.lock()
            .ops
            .iter()
            .flatten()
            .map(|(_, event)| event.clone())
            .collect()
    }

    /// Every write the clients invoked, in order, with its answer if it had one.
    pub(crate) fn writes(&self) -> Vec<Write> {
        let inner = self.lock();
        let mut writes: Vec<Write> = Vec::new();
        // Each logical thread has at most one operation in flight: its write, if a write.
        let mut open: BTreeMap<u64, usize> = BTreeMap::new();
        let events = inner
            .ops
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.as_ref().map(|e| (i, e)));
        for (position, (at, event)) in events {
            match event {
                OpEvent::Invoke { thread, job, op } => {
                    open.remove(thread);
                    if *op != JobOp::Read {
                        open.insert(*thread, writes.len());
                        writes.push(Write {
                            job: job.clone(),
                            op: op.clone(),
                            at: *at,
                            ret: None,
                            payload: inner.payloads.get(&position).copied().unwrap_or(0),
                        });
                    }
                }
                OpEvent::Return { thread, ret, .. } => {
                    if let Some(write) = open.remove(thread).and_then(|i| writes.get_mut(i)) {
                        write.ret = Some(ret.clone());
                    }
                }
            }
        }
        writes
    }

    /// The submission invoked at `position` (see [`op`](Self::op)) carries `bytes` of
    /// payload (noted in the trace).
    pub(crate) fn payload(&self, position: usize, bytes: usize) {
        if bytes > 0 {
            self.lock().payloads.insert(position, bytes);
            self.log(format!("(it carries {bytes} bytes of payload)"));
        }
    }

    /// How many submissions the clients have invoked so far.
    pub(crate) fn submissions(&self) -> u64 {
        self.lock().submissions
    }

    /// Whether the clients' submissions carry large payloads now (a
    /// [`Fault::LargeEntries`](crate::faults::Fault::LargeEntries) is in force).
    pub(crate) fn large_entries(&self) -> bool {
        self.lock().large_entries > 0
    }

    /// Starts (`true`) or ends (`false`) one stretch of large submissions; they overlap.
    pub(crate) fn set_large_entries(&self, on: bool) {
        let mut inner = self.lock();
        inner.large_entries = if on {
            inner.large_entries + 1
        } else {
            inner.large_entries.saturating_sub(1)
        };
    }

    /// A fault started at `at`; answers its number for [`fault_ended`](Self::fault_ended).
    pub(crate) fn fault_started(
        &self,
        at: Duration,
        what: String,
        isolated_follower: Option<u64>,
    ) -> usize {
        let mut inner = self.lock();
        inner.faults.push(FaultSpan {
            what,
            isolated_follower,
            from: at,
            until: None,
        });
        inner.faults.len() - 1
    }

    /// Fault `number` was undone (or done) at `at`.
    pub(crate) fn fault_ended(&self, number: usize, at: Duration) {
        if let Some(fault) = self.lock().faults.get_mut(number) {
            fault.until.get_or_insert(at);
        }
    }

    /// Every fault inflicted, in the order they started.
    pub(crate) fn faults(&self) -> Vec<FaultSpan> {
        self.lock().faults.clone()
    }

    /// The last read of `job` after the cluster converged found this.
    pub(crate) fn set_final(&self, job: &str, ret: JobRet) {
        self.lock().finals.insert(job.to_owned(), ret);
    }

    /// Every job as the last reads after convergence found it.
    pub(crate) fn finals(&self) -> BTreeMap<String, JobRet> {
        self.lock().finals.clone()
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

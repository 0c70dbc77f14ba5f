//! The evaluation broker, with Nomad's semantics (the Nomad blog post "Load shedding in the Nomad eval broker").
//!
//! - **ready** queues, one per scheduler name (the built-in `service`, `batch` and `system`,
//!   and any a job names), ordered by priority then age; a worker dequeues only the names it
//!   serves, and the broker keeps a [`SchedulerRoster`] of the names served, so that an
//!   evaluation nobody serves can say so;
//! - **unacked**: evaluations handed to a worker with a token and a nack timer;
//! - **pending**: at most one evaluation per job is ready or unacked; the job's others wait here;
//! - **cancelable**: on an ack, every pending evaluation of that job but the newest is dropped
//!   and later marked canceled in the registry in batches, one raft entry per batch;
//! - **failed**: evaluations nacked (or timed out) `delivery_limit` times. Each gets a
//!   follow-up, a new evaluation of its job written with the failure and held back a minute
//!   or more (Nomad's failed follow-up);
//! - **delayed**: evaluations whose `wait_until_ms` lies ahead (a follow-up, a crash-looping
//!   task's replacement) wait on one timer, then are enqueued as if new.
//!
//! Workers pull with a long poll ([`BrokerMsg::Dequeue`]), so work goes to whoever is free.
//! The broker lives beside the leading master; a new leader rebuilds it from the registry with
//! [`BrokerMsg::Restore`].
//!
//! What callers send and get back (settings, messages, deliveries, counters) is in `protocol`;
//! where the broker writes status changes ([`RegistryWriter`]), in `registry_writer`.

mod protocol;
mod registry_writer;
mod roster;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::mem;
use std::time::Duration;

use tokio::time::Instant;

use muster_actor::{Context, Process, Reply, TimerHandle};
use muster_model::{BUILT_IN_SCHEDULERS, EvalId, EvalStatus, Evaluation, Trigger};
use muster_registry::Op;

pub use protocol::{
    BrokerConfig, BrokerError, BrokerMsg, BrokerStats, Delivery, QueueStats, SchedulerPresence,
};
pub use registry_writer::{RegistryWriter, WriteFuture, registrar_writer};
pub use roster::SchedulerRoster;

/// Orders ready evaluations: higher priority first, then older (lower create index).
type ReadyKey = (std::cmp::Reverse<u8>, u64, EvalId);

fn ready_key(eval: &Evaluation) -> ReadyKey {
    (
        std::cmp::Reverse(eval.priority),
        eval.create_index,
        eval.id.clone(),
    )
}

#[derive(Debug)]
struct Unacked {
    eval: Evaluation,
    token: String,
    timer: TimerHandle,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    schedulers: Vec<String>,
    reply: Reply<Result<Option<Delivery>, BrokerError>>,
    timer: TimerHandle,
}

/// Evaluations dropped for a newer one of their job and not yet marked canceled in the
/// registry, oldest first, with their count per scheduler name for stats.
#[derive(Debug, Default)]
struct Cancelable {
    evals: Vec<Evaluation>,
    counts: BTreeMap<String, usize>,
}

impl Cancelable {
    fn extend(&mut self, evals: impl IntoIterator<Item = Evaluation>) {
        for eval in evals {
            *self
                .counts
                .entry(eval.scheduler_name().to_owned())
                .or_default() += 1;
            self.evals.push(eval);
        }
    }

    /// Takes out the oldest `max` (or all, if fewer).
    fn take(&mut self, max: usize) -> Vec<Evaluation> {
        let take = self.evals.len().min(max);
        let taken: Vec<Evaluation> = self.evals.drain(..take).collect();
        for eval in &taken {
            if let Some(count) = self.counts.get_mut(eval.scheduler_name()) {
                *count = count.saturating_sub(1);
            }
        }
        taken
    }

    fn count(&self, scheduler: &str) -> usize {
        self.counts.get(scheduler).copied().unwrap_or(0)
    }

    fn is_empty(&self) -> bool {
        self.evals.is_empty()
    }

    fn clear(&mut self) {
        self.evals.clear();
        self.counts.clear();
    }
}

/// The broker process.
#[derive(Debug)]
pub struct EvalBroker {
    config: BrokerConfig,
    writer: Option<RegistryWriter>,
    /// Per scheduler name.
    ready: BTreeMap<String, BTreeMap<ReadyKey, Evaluation>>,
    /// Where each evaluation of `ready` is: its scheduler and key.
    ready_at: HashMap<EvalId, (String, ReadyKey)>,
    unacked: HashMap<EvalId, Unacked>,
    /// The job's evaluation that is ready, unacked or waiting out a nack delay.
    in_flight: HashMap<String, EvalId>,
    /// Per job, the evaluations waiting behind the one in flight.
    pending: HashMap<String, Vec<Evaluation>>,
    cancelable: Cancelable,
    failed: Vec<Evaluation>,
    /// Failed evaluations not yet marked in the registry.
    failed_unwritten: Vec<EvalId>,
    /// Follow-ups of failed evaluations, not yet written to the registry.
    follow_ups_unwritten: Vec<Evaluation>,
    /// Evaluations held back until their `wait_until_ms`, by when (on tokio's clock).
    delayed: BTreeMap<(Instant, EvalId), Evaluation>,
    /// The timer for the earliest of `delayed`.
    delay_timer: Option<(Instant, TimerHandle)>,
    deliveries: HashMap<EvalId, u32>,
    waiters: VecDeque<Waiter>,
    next_waiter: u64,
    writing: bool,
    /// The cancellations the write in flight carries, by scheduler type: still cancelable
    /// until it is written (the stats count them so).
    canceling: BTreeMap<String, usize>,
    /// The scheduler names workers serve.
    roster: SchedulerRoster,
    /// Bumped by every restore and disable: a registry write that completes in a later
    /// session is not this session's business.
    session: u64,
    stats: BrokerStats,
}

impl EvalBroker {
    /// A disabled broker; [`BrokerMsg::Restore`] enables it.
    pub fn new(config: BrokerConfig) -> Self {
        EvalBroker {
            roster: SchedulerRoster::new(config.scheduler_gone_after),
            config,
            writer: None,
            ready: BTreeMap::new(),
            ready_at: HashMap::new(),
            unacked: HashMap::new(),
            in_flight: HashMap::new(),
            pending: HashMap::new(),
            cancelable: Cancelable::default(),
            failed: Vec::new(),
            failed_unwritten: Vec::new(),
            follow_ups_unwritten: Vec::new(),
            delayed: BTreeMap::new(),
            delay_timer: None,
            deliveries: HashMap::new(),
            waiters: VecDeque::new(),
            next_waiter: 0,
            writing: false,
            canceling: BTreeMap::new(),
            session: 0,
            stats: BrokerStats::default(),
        }
    }

    /// Its roster of the scheduler names workers serve, shared: take it before spawning the
    /// broker to read it from elsewhere.
    pub fn roster(&self) -> SchedulerRoster {
        self.roster.clone()
    }

    fn enabled(&self) -> bool {
        self.writer.is_some()
    }

    fn enqueue(&mut self, eval: Evaluation, ctx: &mut Context<Self>) {
        if eval.status != EvalStatus::Pending {
            return;
        }
        // At most a day: a wall clock far ahead (or a bad value) must not park it for good.
        let wait = Duration::from_millis(eval.wait_until_ms.saturating_sub(now_ms())).min(MAX_WAIT);
        if !wait.is_zero() {
            let due = Instant::now() + wait;
            self.delayed.insert((due, eval.id.clone()), eval);
            self.arm_delay_timer(ctx);
            return;
        }
        match self.in_flight.get(&eval.job) {
            Some(current) if *current != eval.id => {
                // A job now planned by another scheduler (its named one changed, or it was
                // stopped): its evaluation still waiting in the old one's queue, handed to no
                // worker, is superseded rather than waited behind (it may wait for a
                // scheduler that never comes).
                let current = current.clone();
                if let Some(waiting) = self.ready_elsewhere(&current, eval.scheduler_name()) {
                    self.cancelable.extend([waiting]);
                    self.in_flight.insert(eval.job.clone(), eval.id.clone());
                    self.make_ready(eval, ctx);
                    self.write_next(ctx);
                    return;
                }
                self.pending.entry(eval.job.clone()).or_default().push(eval);
            }
            Some(_) => {}
            None => {
                self.in_flight.insert(eval.job.clone(), eval.id.clone());
                self.make_ready(eval, ctx);
            }
        }
    }

    /// Takes evaluation `id` out of its ready queue if it waits there for a scheduler other
    /// than `scheduler` (it is not handed out).
    fn ready_elsewhere(&mut self, id: &EvalId, scheduler: &str) -> Option<Evaluation> {
        let (name, key) = self
            .ready_at
            .get(id)
            .filter(|(name, _)| name != scheduler)?;
        let eval = self.ready.get_mut(name)?.remove(key)?;
        self.ready_at.remove(id);
        Some(eval)
    }

    /// Keeps one timer, for the earliest held-back evaluation.
    fn arm_delay_timer(&mut self, ctx: &mut Context<Self>) {
        let Some(&(earliest, _)) = self.delayed.first_key_value().map(|(k, _)| k) else {
            return;
        };
        if let Some((at, timer)) = &self.delay_timer {
            if *at <= earliest {
                return;
            }
            timer.cancel();
        }
        let timer = ctx.delay(
            earliest.saturating_duration_since(Instant::now()),
            BrokerMsg::DelayOver,
        );
        self.delay_timer = Some((earliest, timer));
    }

    /// Enqueues the held-back evaluations that are due.
    fn release_delayed(&mut self, ctx: &mut Context<Self>) {
        self.delay_timer = None;
        let now = Instant::now();
        while let Some(entry) = self.delayed.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let mut eval = entry.remove();
            eval.wait_until_ms = 0;
            self.enqueue(eval, ctx);
        }
        self.arm_delay_timer(ctx);
    }

    fn make_ready(&mut self, eval: Evaluation, ctx: &mut Context<Self>) {
        // A waiting worker takes it at once; one that gave up (its request dropped) is skipped
        // rather than handed work that would sit unacked until the nack timer.
        let roster = &self.roster;
        self.waiters.retain(|w| {
            let gone = w.reply.is_closed();
            if gone {
                w.timer.cancel();
                roster.waiting(&w.schedulers, false);
            }
            !gone
        });
        if let Some(position) = self
            .waiters
            .iter()
            .position(|w| w.schedulers.iter().any(|s| s == eval.scheduler_name()))
            && let Some(waiter) = self.waiters.remove(position)
        {
            waiter.timer.cancel();
            self.roster.waiting(&waiter.schedulers, false);
            self.roster.asked(&waiter.schedulers);
            let delivery = self.deliver(eval, ctx);
            waiter.reply.send(Ok(Some(delivery)));
            return;
        }
        let key = ready_key(&eval);
        self.ready_at.insert(
            eval.id.clone(),
            (eval.scheduler_name().to_owned(), key.clone()),
        );
        match self.ready.get_mut(eval.scheduler_name()) {
            Some(queue) => {
                queue.insert(key, eval);
            }
            None => {
                let name = eval.scheduler_name().to_owned();
                self.ready.entry(name).or_default().insert(key, eval);
            }
        }
    }

    /// Hands `eval` out: a fresh token and a nack timer.
    fn deliver(&mut self, eval: Evaluation, ctx: &mut Context<Self>) -> Delivery {
        let token = format!("{:032x}", fastrand::u128(..));
        *self.deliveries.entry(eval.id.clone()).or_default() += 1;
        self.stats.delivered += 1;
        let timer = ctx.delay(
            self.config.nack_timeout,
            BrokerMsg::NackTimeout {
                eval: eval.id.clone(),
                token: token.clone(),
            },
        );
        self.unacked.insert(
            eval.id.clone(),
            Unacked {
                eval: eval.clone(),
                token: token.clone(),
                timer,
            },
        );
        Delivery { eval, token }
    }

    fn dequeue(
        &mut self,
        schedulers: Vec<String>,
        timeout: Duration,
        reply: Reply<Result<Option<Delivery>, BrokerError>>,
        ctx: &mut Context<Self>,
    ) {
        if !self.enabled() {
            return reply.send(Err(BrokerError::Disabled));
        }
        self.roster.asked(&schedulers);
        // The best head among the worker's schedulers.
        let best = schedulers
            .iter()
            .filter_map(|s| {
                let queue = self.ready.get(s)?;
                let (key, _) = queue.first_key_value()?;
                Some((key.clone(), s))
            })
            .min();
        if let Some((key, scheduler)) = best
            && let Some(eval) = self.ready.get_mut(scheduler).and_then(|q| q.remove(&key))
        {
            self.ready_at.remove(&eval.id);
            // A name's empty queue goes (the built-in ones' stay, for stats).
            if self.ready.get(scheduler).is_some_and(BTreeMap::is_empty)
                && !BUILT_IN_SCHEDULERS.contains(&scheduler.as_str())
            {
                self.ready.remove(scheduler);
            }
            let delivery = self.deliver(eval, ctx);
            return reply.send(Ok(Some(delivery)));
        }
        if timeout.is_zero() {
            return reply.send(Ok(None));
        }
        let id = self.next_waiter;
        self.next_waiter += 1;
        let timer = ctx.delay(timeout, BrokerMsg::DequeueTimeout(id));
        self.roster.waiting(&schedulers, true);
        self.waiters.push_back(Waiter {
            id,
            schedulers,
            reply,
            timer,
        });
    }

    fn take_unacked(&mut self, eval: &EvalId, token: &str) -> Result<Evaluation, BrokerError> {
        self.outstanding(eval, token)?;
        let held = self
            .unacked
            .remove(eval)
            .ok_or_else(|| BrokerError::NotOutstanding(eval.clone()))?;
        held.timer.cancel();
        Ok(held.eval)
    }

    /// The evaluation handed out as `eval` under `token`, still unacked.
    fn outstanding(&self, eval: &EvalId, token: &str) -> Result<&Evaluation, BrokerError> {
        match self.unacked.get(eval) {
            None => Err(BrokerError::NotOutstanding(eval.clone())),
            Some(held) if held.token != token => Err(BrokerError::TokenMismatch(eval.clone())),
            Some(held) => Ok(&held.eval),
        }
    }

    fn ack(
        &mut self,
        eval: &EvalId,
        token: &str,
        ctx: &mut Context<Self>,
    ) -> Result<(), BrokerError> {
        let eval = self.take_unacked(eval, token)?;
        self.deliveries.remove(&eval.id);
        self.release_job(&eval.job, ctx);
        Ok(())
    }

    /// The job's evaluation in flight is done: its newest pending evaluation becomes ready and
    /// the others cancelable.
    fn release_job(&mut self, job: &str, ctx: &mut Context<Self>) {
        self.in_flight.remove(job);
        let Some(mut waiting) = self.pending.remove(job) else {
            return;
        };
        let newest = waiting
            .iter()
            .enumerate()
            .max_by_key(|(_, e)| (e.create_index, e.modify_index))
            .map(|(i, _)| i);
        if let Some(newest) = newest {
            let next = waiting.swap_remove(newest);
            self.cancelable.extend(waiting);
            self.in_flight.insert(next.job.clone(), next.id.clone());
            self.make_ready(next, ctx);
        }
        self.write_next(ctx);
    }

    fn nack(
        &mut self,
        eval: &EvalId,
        token: &str,
        ctx: &mut Context<Self>,
    ) -> Result<(), BrokerError> {
        let eval = self.take_unacked(eval, token)?;
        let deliveries = self.deliveries.get(&eval.id).copied().unwrap_or(0);
        if deliveries >= self.config.delivery_limit {
            tracing::warn!(eval = %eval.id, job = %eval.job, deliveries, "evaluation failed: delivery limit reached");
            self.deliveries.remove(&eval.id);
            self.failed_unwritten.push(eval.id.clone());
            self.follow_ups_unwritten.push(self.follow_up(&eval));
            let job = eval.job.clone();
            self.failed.push(eval);
            self.release_job(&job, ctx);
        } else {
            let delay = if deliveries <= 1 {
                self.config.initial_nack_delay
            } else {
                self.config.subsequent_nack_delay
            };
            // The job stays in flight while the evaluation waits out its delay.
            ctx.delay(delay, BrokerMsg::Requeue(eval));
        }
        Ok(())
    }

    /// A later retry of a failed evaluation (Nomad's failed follow-up): a new evaluation of
    /// the job, held back for the configured delay plus jitter.
    fn follow_up(&self, failed: &Evaluation) -> Evaluation {
        let jitter = self.config.failed_follow_up_jitter.mul_f64(fastrand::f64());
        let wait = self.config.failed_follow_up_delay + jitter;
        Evaluation {
            id: EvalId::random(),
            trigger: Trigger::FailedFollowUp(failed.id.clone()),
            status: EvalStatus::Pending,
            status_description: format!("retries failed evaluation {}", failed.id),
            create_index: 0,
            modify_index: 0,
            snapshot_index: 0,
            wait_until_ms: now_ms()
                .saturating_add(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX)),
            ..failed.clone()
        }
    }

    /// Writes the next batch of cancellations (and failures with their follow-ups) if no write
    /// is in flight.
    fn write_next(&mut self, ctx: &mut Context<Self>) {
        if self.writing
            || (self.cancelable.is_empty()
                && self.failed_unwritten.is_empty()
                && self.follow_ups_unwritten.is_empty())
        {
            return;
        }
        let Some(writer) = self.writer.clone() else {
            return;
        };
        let canceled = self.cancelable.take(self.config.max_cancel_batch);
        let failed = mem::take(&mut self.failed_unwritten);
        let follow_ups = mem::take(&mut self.follow_ups_unwritten);
        let mut ops = Vec::new();
        if !canceled.is_empty() {
            ops.push(Op::SetEvalStatus {
                ids: canceled.iter().map(|e| e.id.clone()).collect(),
                status: EvalStatus::Canceled,
                description: "canceled: a newer evaluation of the job was processed".into(),
            });
        }
        if !failed.is_empty() {
            ops.push(Op::SetEvalStatus {
                ids: failed.clone(),
                status: EvalStatus::Failed,
                description: "failed: delivery limit reached".into(),
            });
        }
        if !follow_ups.is_empty() {
            ops.push(Op::UpsertEvals(follow_ups.clone()));
        }
        self.writing = true;
        self.canceling.clear();
        for eval in &canceled {
            *self
                .canceling
                .entry(eval.scheduler_name().to_owned())
                .or_default() += 1;
        }
        self.stats.registry_writes += 1;
        let op = Op::Together(ops);
        let session = self.session;
        ctx.defer(
            writer.write(op),
            move |broker: &mut EvalBroker, ctx, written| {
                if broker.session != session {
                    // Written (or not) for a session since disabled: the registry, which the
                    // restore read, is the truth now.
                    return;
                }
                broker.writing = false;
                broker.canceling.clear();
                match written {
                    Ok(()) => {
                        broker.stats.canceled += canceled.len() as u64;
                        if broker.enabled() {
                            for follow_up in follow_ups {
                                broker.enqueue(follow_up, ctx);
                            }
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "could not write cancellations; retrying");
                        if broker.enabled() {
                            broker.cancelable.extend(canceled);
                            broker.failed_unwritten.extend(failed);
                            broker.follow_ups_unwritten.extend(follow_ups);
                        }
                        return;
                    }
                }
                broker.write_next(ctx);
            },
        );
    }

    fn stats(&self) -> BrokerStats {
        let mut stats = BrokerStats {
            by_scheduler: BUILT_IN_SCHEDULERS
                .iter()
                .map(|s| ((*s).to_owned(), QueueStats::default()))
                .collect(),
            ..self.stats.clone()
        };
        let mut count =
            |scheduler: &str, n: usize, field: fn(&mut QueueStats) -> &mut usize| match stats
                .by_scheduler
                .get_mut(scheduler)
            {
                Some(q) => *field(q) += n,
                None => {
                    let mut q = QueueStats::default();
                    *field(&mut q) += n;
                    stats.by_scheduler.insert(scheduler.to_owned(), q);
                }
            };
        for held in self.unacked.values() {
            count(held.eval.scheduler_name(), 1, |q| &mut q.unacked);
        }
        for eval in &self.failed {
            count(eval.scheduler_name(), 1, |q| &mut q.failed);
        }
        for eval in self.delayed.values() {
            count(eval.scheduler_name(), 1, |q| &mut q.delayed);
        }
        for waiting in self.pending.values() {
            // A job's waiting evaluations are counted under its first one's scheduler.
            if let Some(eval) = waiting.first() {
                count(eval.scheduler_name(), waiting.len(), |q| &mut q.pending);
            }
        }
        // The big queues are counted without walking them: ready by its per-name maps,
        // cancelable by the counts it keeps.
        let served = self.roster.all();
        let names: BTreeSet<&String> = (self.ready.keys())
            .chain(self.cancelable.counts.keys())
            .chain(self.canceling.keys())
            .chain(served.keys())
            .collect();
        for name in names {
            stats.by_scheduler.entry(name.clone()).or_default();
        }
        for (scheduler, q) in &mut stats.by_scheduler {
            q.ready = self.ready.get(scheduler).map_or(0, BTreeMap::len);
            q.cancelable = self.cancelable.count(scheduler)
                + self.canceling.get(scheduler).copied().unwrap_or(0);
            // A name no worker ever asked for is not served.
            let presence = served.get(scheduler).copied().unwrap_or_default();
            stats.schedulers.insert(scheduler.clone(), presence);
        }
        stats
    }

    fn disable(&mut self) {
        self.writer = None;
        self.session += 1;
        self.writing = false;
        self.canceling.clear();
        for held in self.unacked.values() {
            held.timer.cancel();
        }
        for waiter in self.waiters.drain(..) {
            waiter.timer.cancel();
            waiter.reply.send(Err(BrokerError::Disabled));
        }
        self.roster.none_waiting();
        self.ready.clear();
        self.ready_at.clear();
        self.unacked.clear();
        self.in_flight.clear();
        self.pending.clear();
        self.cancelable.clear();
        self.failed.clear();
        self.failed_unwritten.clear();
        self.follow_ups_unwritten.clear();
        self.delayed.clear();
        if let Some((_, timer)) = self.delay_timer.take() {
            timer.cancel();
        }
        self.deliveries.clear();
    }
}

impl Process for EvalBroker {
    type Message = BrokerMsg;

    async fn handle(&mut self, msg: BrokerMsg, ctx: &mut Context<Self>) {
        match msg {
            BrokerMsg::Enqueue(evals) => {
                if self.enabled() {
                    for eval in evals {
                        self.enqueue(eval, ctx);
                    }
                }
            }
            BrokerMsg::Dequeue {
                schedulers,
                timeout,
                reply,
            } => self.dequeue(schedulers, timeout, reply, ctx),
            BrokerMsg::Ack { eval, token, reply } => reply.send(self.ack(&eval, &token, ctx)),
            BrokerMsg::Nack { eval, token, reply } => reply.send(self.nack(&eval, &token, ctx)),
            BrokerMsg::Outstanding { eval, token, reply } => {
                reply.send(self.outstanding(&eval, &token).cloned());
            }
            BrokerMsg::Stats(reply) => reply.send(self.stats()),
            BrokerMsg::Unacked(reply) => {
                let mut unacked: Vec<(String, EvalId)> = self
                    .unacked
                    .values()
                    .map(|held| (held.eval.job.clone(), held.eval.id.clone()))
                    .collect();
                unacked.sort();
                reply.send(unacked);
            }
            BrokerMsg::Restore { writer, evals } => {
                self.disable();
                self.writer = Some(writer);
                let mut evals: Vec<Evaluation> = evals
                    .into_iter()
                    .filter(|e| e.status == EvalStatus::Pending)
                    .collect();
                evals.sort_by_key(|e| e.create_index);
                for eval in evals {
                    self.enqueue(eval, ctx);
                }
            }
            BrokerMsg::Disable => self.disable(),
            BrokerMsg::NackTimeout { eval, token } => {
                if self.nack(&eval, &token, ctx).is_ok() {
                    tracing::warn!(eval = %eval, "evaluation not acked in time: nacked");
                }
            }
            BrokerMsg::Requeue(eval) => {
                if self.enabled() && self.in_flight.get(&eval.job) == Some(&eval.id) {
                    self.make_ready(eval, ctx);
                }
            }
            BrokerMsg::DelayOver => {
                if self.enabled() {
                    self.release_delayed(ctx);
                }
            }
            BrokerMsg::DequeueTimeout(id) => {
                if let Some(position) = self.waiters.iter().position(|w| w.id == id)
                    && let Some(waiter) = self.waiters.remove(position)
                {
                    self.roster.waiting(&waiter.schedulers, false);
                    if !waiter.reply.is_closed() {
                        self.roster.asked(&waiter.schedulers);
                    }
                    waiter.reply.send(Ok(None));
                }
            }
        }
    }
}

/// The longest the broker holds an evaluation back.
const MAX_WAIT: Duration = Duration::from_secs(24 * 60 * 60);

/// The wall clock in Unix ms, what `wait_until_ms` counts in (it must mean the same on the
/// next leader).
fn now_ms() -> u64 {
    muster_model::clock::unix_ms()
}

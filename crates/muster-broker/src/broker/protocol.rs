//! What callers of the broker see: its settings, the messages it handles, what it hands out
//! and refuses, and its counters.

use std::collections::BTreeMap;
use std::time::Duration;

use muster_actor::Reply;
use muster_model::{EvalId, Evaluation};

use super::RegistryWriter;

/// The broker's settings (Nomad's defaults).
#[derive(Clone, Debug)]
pub struct BrokerConfig {
    /// How long a worker may hold an evaluation before it counts as nacked (Nomad: 60 s).
    pub nack_timeout: Duration,
    /// Deliveries after which an evaluation goes to the failed queue (Nomad: 3).
    pub delivery_limit: u32,
    /// Delay before an evaluation nacked for the first time is ready again (Nomad: 1 s).
    pub initial_nack_delay: Duration,
    /// Delay after later nacks (Nomad: 20 s).
    pub subsequent_nack_delay: Duration,
    /// The most evaluation ids one cancellation write carries.
    pub max_cancel_batch: usize,
    /// How long the follow-up of a failed evaluation waits at least (Nomad: 1 min).
    pub failed_follow_up_delay: Duration,
    /// A random extra wait of up to this much, so failures do not retry in step (Nomad: 5 min).
    pub failed_follow_up_jitter: Duration,
    /// How long after its last worker's last dequeue a scheduler name counts as no longer
    /// served (while a worker waits on it, it is served): a worker between two long polls is
    /// planning, not gone.
    pub scheduler_gone_after: Duration,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            nack_timeout: Duration::from_secs(60),
            delivery_limit: 3,
            initial_nack_delay: Duration::from_secs(1),
            subsequent_nack_delay: Duration::from_secs(20),
            max_cancel_batch: 10_000,
            failed_follow_up_delay: Duration::from_secs(60),
            failed_follow_up_jitter: Duration::from_secs(300),
            scheduler_gone_after: Duration::from_secs(30),
        }
    }
}

/// An evaluation handed to a worker, with the token that acks or nacks it.
#[derive(Clone, Debug, PartialEq)]
pub struct Delivery {
    /// The evaluation.
    pub eval: Evaluation,
    /// Proves the worker holds it.
    pub token: String,
}

/// Why an ack or nack was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BrokerError {
    /// The evaluation is not handed out (it was acked, nacked, or timed out).
    #[error("evaluation {0} is not outstanding")]
    NotOutstanding(EvalId),
    /// The token is not the one the evaluation was handed out with.
    #[error("token does not match evaluation {0}'s delivery")]
    TokenMismatch(EvalId),
    /// The broker is disabled (this master does not lead).
    #[error("the broker is disabled")]
    Disabled,
}

/// Counts per scheduler name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Ready to hand out.
    pub ready: usize,
    /// Handed out, not yet acked.
    pub unacked: usize,
    /// Waiting behind their job's evaluation in flight.
    pub pending: usize,
    /// Dropped, not yet marked canceled in the registry (including those being written).
    pub cancelable: usize,
    /// Past the delivery limit.
    pub failed: usize,
    /// Held back until their `wait_until_ms`.
    pub delayed: usize,
}

/// Whether a worker serves a scheduler name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedulerPresence {
    /// A worker waits on it now, or asked for it within the broker's
    /// [`scheduler_gone_after`](BrokerConfig::scheduler_gone_after).
    pub served: bool,
    /// When a worker last asked for it, as Unix time in ms; `None` if none has since this
    /// broker was created (a master's broker lives as long as the process).
    pub last_served_ms: Option<u64>,
}

/// The broker's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BrokerStats {
    /// Per scheduler name: the built-in ones always, and every other with evaluations or
    /// workers.
    pub by_scheduler: BTreeMap<String, QueueStats>,
    /// Whether each scheduler name of `by_scheduler` is served.
    pub schedulers: BTreeMap<String, SchedulerPresence>,
    /// Evaluations marked canceled in the registry so far.
    pub canceled: u64,
    /// Registry writes the broker made (cancellations and failures).
    pub registry_writes: u64,
    /// Evaluations handed out so far (counting redeliveries).
    pub delivered: u64,
}

impl BrokerStats {
    /// The sum over scheduler names.
    pub fn total(&self) -> QueueStats {
        self.by_scheduler
            .values()
            .fold(QueueStats::default(), |sum, q| QueueStats {
                ready: sum.ready + q.ready,
                unacked: sum.unacked + q.unacked,
                pending: sum.pending + q.pending,
                cancelable: sum.cancelable + q.cancelable,
                failed: sum.failed + q.failed,
                delayed: sum.delayed + q.delayed,
            })
    }
}

/// What the broker handles.
#[derive(Debug)]
pub enum BrokerMsg {
    /// New or changed evaluations, already written to the registry.
    Enqueue(Vec<Evaluation>),
    /// Hand out the best ready evaluation for one of `schedulers`, waiting up to `timeout`
    /// for one; `None` if none came.
    Dequeue {
        /// The names of the schedulers the worker serves.
        schedulers: Vec<String>,
        /// How long to wait.
        timeout: Duration,
        /// The answer.
        reply: Reply<Result<Option<Delivery>, BrokerError>>,
    },
    /// The worker is done with the evaluation.
    Ack {
        /// The evaluation.
        eval: EvalId,
        /// Its delivery token.
        token: String,
        /// The answer.
        reply: Reply<Result<(), BrokerError>>,
    },
    /// The worker gives the evaluation back.
    Nack {
        /// The evaluation.
        eval: EvalId,
        /// Its delivery token.
        token: String,
        /// The answer.
        reply: Reply<Result<(), BrokerError>>,
    },
    /// The evaluation, if it is handed out under `token` and not yet acked or nacked: what a
    /// plan, a block or a completion for it must prove before it is applied.
    Outstanding {
        /// The evaluation.
        eval: EvalId,
        /// The delivery token the caller holds it under.
        token: String,
        /// The evaluation as it was handed out.
        reply: Reply<Result<Evaluation, BrokerError>>,
    },
    /// Counters.
    Stats(Reply<BrokerStats>),
    /// The evaluations handed to workers and not yet acked or nacked, as (job, evaluation),
    /// sorted: what is being scheduled right now.
    Unacked(Reply<Vec<(String, EvalId)>>),
    /// Start serving with `writer` for registry writes (this master leads); `evals` are the
    /// registry's pending evaluations.
    Restore {
        /// Where cancellations and failures are written.
        writer: RegistryWriter,
        /// Pending evaluations from the registry.
        evals: Vec<Evaluation>,
    },
    /// Stop serving and drop everything (leadership lost).
    Disable,
    /// A nack timer fired.
    #[doc(hidden)]
    NackTimeout {
        /// The evaluation.
        eval: EvalId,
        /// The delivery it timed.
        token: String,
    },
    /// A nacked evaluation's delay is over.
    #[doc(hidden)]
    Requeue(Evaluation),
    /// A waiting dequeue timed out.
    #[doc(hidden)]
    DequeueTimeout(u64),
    /// The earliest held-back evaluation may be due.
    #[doc(hidden)]
    DelayOver,
}

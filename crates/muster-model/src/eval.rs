//! Evaluations: the units of scheduling work that follow every change to a job or to the agents
//! it runs on (Nomad's model).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::agent::AgentId;
use crate::job::{Job, SchedulerType};

/// An evaluation's id.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct EvalId(pub String);

impl EvalId {
    /// A fresh random id.
    pub fn random() -> Self {
        EvalId(format!("{:032x}", fastrand::u128(..)))
    }
}

impl fmt::Display for EvalId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where an evaluation is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EvalStatus {
    /// Waiting for a scheduler.
    Pending,
    /// Planned, but some tasks did not fit; waits for capacity.
    Blocked,
    /// Planned.
    Complete,
    /// Gave up after the delivery limit.
    Failed,
    /// Dropped: a newer evaluation of the same job covers it.
    Canceled,
}

impl EvalStatus {
    /// The lower-case name operators see.
    pub fn name(self) -> &'static str {
        match self {
            EvalStatus::Pending => "pending",
            EvalStatus::Blocked => "blocked",
            EvalStatus::Complete => "complete",
            EvalStatus::Failed => "failed",
            EvalStatus::Canceled => "canceled",
        }
    }
}

/// Why an evaluation was created.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Trigger {
    /// The job was submitted or updated.
    JobRegister,
    /// The job was stopped.
    JobDeregister,
    /// An agent became unreachable.
    AgentUnreachable(AgentId),
    /// An agent came back or joined.
    AgentUpdate(AgentId),
    /// Capacity freed up for a blocked evaluation.
    Unblocked,
    /// One of the job's tasks ended on its own (this task id).
    TaskEnded(String),
    /// This evaluation of the job failed (it reached the delivery limit): a later retry.
    FailedFollowUp(EvalId),
    /// The leader's periodic check found the job's running tasks differ from what it asks
    /// for, with no evaluation of it in flight.
    Reconcile,
    /// This agent drains: the job's tasks there move or stop.
    AgentDrain(AgentId),
    /// This deployment of the job moved on: new tasks turned healthy, canaries were promoted,
    /// or it was paused, resumed or failed.
    Deployment(String),
    /// This task of the job was stopped so that a higher-priority job's task fits.
    Preempted(String),
}

/// A unit of scheduling work for one job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    /// Its id.
    pub id: EvalId,
    /// The job it evaluates.
    pub job: String,
    /// The job's priority when the evaluation was made.
    pub priority: u8,
    /// Its job's type.
    pub scheduler: SchedulerType,
    /// The scheduler its job names instead of its type's built-in one: only workers serving
    /// that name are handed it. See [`scheduler_name`](Self::scheduler_name).
    #[serde(default)]
    pub named_scheduler: Option<String>,
    /// Why it exists.
    pub trigger: Trigger,
    /// Where it is.
    pub status: EvalStatus,
    /// Why it is there, for operators.
    pub status_description: String,
    /// The raft index of the entry that created it (0 until written); orders evaluations of
    /// equal priority, oldest first.
    pub create_index: u64,
    /// The raft index of its last change.
    pub modify_index: u64,
    /// For a blocked evaluation: the registry index of the snapshot it was planned against.
    pub snapshot_index: u64,
    /// Unix time in ms before which the broker holds it back (0: at once): a crash-looping
    /// task's replacement backs off, a failed evaluation's follow-up waits.
    #[serde(default)]
    pub wait_until_ms: u64,
}

impl Evaluation {
    /// A new pending evaluation of `job`.
    pub fn new(job: &Job, trigger: Trigger) -> Self {
        Evaluation {
            id: EvalId::random(),
            job: job.name.clone(),
            priority: job.priority,
            scheduler: job.scheduler,
            named_scheduler: job.named_scheduler.clone(),
            trigger,
            status: EvalStatus::Pending,
            status_description: String::new(),
            create_index: 0,
            modify_index: 0,
            snapshot_index: 0,
            wait_until_ms: 0,
        }
    }

    /// The name of the scheduler that plans it (its queue in the broker): the one its job
    /// names, or its type's built-in one.
    pub fn scheduler_name(&self) -> &str {
        self.named_scheduler
            .as_deref()
            .unwrap_or(self.scheduler.name())
    }
}

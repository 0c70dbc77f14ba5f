//! Scheduler workers in their own program: the SDK's types on the wire, and [`RemoteBackend`],
//! a [`Backend`] that reaches the leading master over gRPC (`muster.scheduling.v1`).
//!
//! A program with its own [`Scheduler`](crate::Scheduler) runs [`Worker`](crate::Worker)s
//! against a [`RemoteBackend`] given the masters' addresses. The backend talks to one master at
//! a time and follows the leader: a standby answers with the leader's address
//! ([`not_leader`]), and a master that cannot be reached is skipped for the next one in the
//! list.
//!
//! # Conversions
//! [`IntoProto`] turns an SDK value into its message and never fails. [`FromProto`] turns a
//! message back and checks it: an unknown or unspecified enum value, a missing required
//! message, a priority above 255 or a cpu amount that is NaN, infinite or negative is a
//! [`ConversionError`] naming the field (`agents[0].tasks[2].resources.cpus`). Encoding maps
//! cpu amounts the SDK treats as zero (NaN, negative) to zero and an infinite one to the largest
//! finite amount, so whatever one side encodes the other decodes.
//!
//! # Errors on the wire
//! | status | meaning | [`RemoteBackend`] does |
//! |---|---|---|
//! | `FAILED_PRECONDITION` | a standby; the leader in the `muster-leader` metadata and the message | retries at the leader |
//! | `UNAVAILABLE` | no leader known yet, or the master cannot be reached | retries at the next master |
//! | `ABORTED` | the broker or the master refused (stale token, failed write) | the call's [`WorkerError`] |
//! | `OUT_OF_RANGE` | a snapshot older than asked for | [`WorkerError::StaleSnapshot`] |
//! | `INVALID_ARGUMENT` | a malformed request, naming the field | the call's [`WorkerError`] |

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use muster_proto::scheduling as pb;
use muster_proto::scheduling::scheduling_client::SchedulingClient;
use muster_registry::jobs::{
    Constraint, ConstraintOp, EvalId, EvalStatus, Evaluation, Job, SchedulerType, TaskGroup,
    Trigger,
};
use muster_registry::{AgentId, Resources};
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Status};

use crate::plan::{
    AgentView, ClusterSnapshot, Demand, Placement, Plan, PlanResult, Stop, TaskState, TaskView,
};
use crate::worker::{Assignment, Backend, WorkerError};

/// The longest a dequeue long-polls; the master caps longer requests to it.
pub const MAX_DEQUEUE_TIMEOUT: Duration = Duration::from_secs(30);

/// The default largest message either side sends or accepts: snapshots of big clusters are big.
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 64 * 1024 * 1024;

/// Metadata key of a standby's answer: the leading master's `host:port`.
pub const LEADER_METADATA: &str = "muster-leader";

/// Metadata key of a stale-snapshot answer: the index of the master's state.
pub const SNAPSHOT_INDEX_METADATA: &str = "muster-snapshot-index";

/// The words before the leader's address in a standby's answer.
const LEADER_IS: &str = "the leader is ";

// ---------------------------------------------------------------------------------------------
// Conversions
// ---------------------------------------------------------------------------------------------

/// A message that does not make a valid SDK value, and which field is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConversionError {
    field: String,
    problem: String,
}

impl ConversionError {
    /// `field` (a path like `plan.place[1].resources`, or empty for the message itself) is
    /// wrong because of `problem`.
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        ConversionError {
            field: field.into(),
            problem: problem.into(),
        }
    }

    /// The path of the field at fault; empty if the message itself is.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// What is wrong with it.
    pub fn problem(&self) -> &str {
        &self.problem
    }

    /// The same error seen from the message that holds this one in its field `outer`.
    #[must_use]
    pub fn within(mut self, outer: &str) -> Self {
        self.field = if self.field.is_empty() {
            outer.to_owned()
        } else if self.field.starts_with('[') {
            format!("{outer}{}", self.field)
        } else {
            format!("{outer}.{}", self.field)
        };
        self
    }
}

impl fmt::Display for ConversionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "malformed message: {}", self.problem)
        } else {
            write!(f, "malformed {}: {}", self.field, self.problem)
        }
    }
}

impl std::error::Error for ConversionError {}

/// An SDK value that has a message form. Never fails.
pub trait IntoProto {
    /// The message (an `i32` for enums, as prost stores them).
    type Proto;

    /// The message form of `self`.
    fn into_proto(self) -> Self::Proto;
}

/// An SDK value that can be read from a message, checking it.
pub trait FromProto: Sized {
    /// The message (an `i32` for enums, as prost stores them).
    type Proto;

    /// The value `proto` describes.
    ///
    /// # Errors
    /// [`ConversionError`] naming the field (relative to `proto`) that is missing or invalid.
    fn from_proto(proto: Self::Proto) -> Result<Self, ConversionError>;
}

impl<T: IntoProto> IntoProto for Vec<T> {
    type Proto = Vec<T::Proto>;

    fn into_proto(self) -> Vec<T::Proto> {
        self.into_iter().map(IntoProto::into_proto).collect()
    }
}

/// Reads `proto`, naming `field` in an error.
fn read<T: FromProto>(proto: T::Proto, field: &str) -> Result<T, ConversionError> {
    T::from_proto(proto).map_err(|e| e.within(field))
}

/// Reads the required message `proto` of `field`.
fn required<T: FromProto>(proto: Option<T::Proto>, field: &str) -> Result<T, ConversionError> {
    match proto {
        Some(proto) => read(proto, field),
        None => Err(ConversionError::new(field, "missing")),
    }
}

/// Reads every element of the repeated field `field`.
fn each<T: FromProto>(protos: Vec<T::Proto>, field: &str) -> Result<Vec<T>, ConversionError> {
    protos
        .into_iter()
        .enumerate()
        .map(|(i, proto)| read(proto, &format!("{field}[{i}]")))
        .collect()
}

fn sorted(map: HashMap<String, String>) -> BTreeMap<String, String> {
    map.into_iter().collect()
}

fn unsorted(map: BTreeMap<String, String>) -> HashMap<String, String> {
    map.into_iter().collect()
}

fn priority(value: u32, field: &str) -> Result<u8, ConversionError> {
    u8::try_from(value)
        .map_err(|_| ConversionError::new(field, format!("{value} is above the highest, 255")))
}

/// An enum value prost could not name, or the unspecified zero.
fn bad_enum(value: i32) -> ConversionError {
    if value == 0 {
        ConversionError::new("", "unspecified")
    } else {
        ConversionError::new("", format!("unknown value {value}"))
    }
}

impl IntoProto for SchedulerType {
    type Proto = i32;

    fn into_proto(self) -> i32 {
        let proto = match self {
            SchedulerType::Service => pb::SchedulerType::Service,
            SchedulerType::Batch => pb::SchedulerType::Batch,
            SchedulerType::System => pb::SchedulerType::System,
        };
        proto as i32
    }
}

impl FromProto for SchedulerType {
    type Proto = i32;

    fn from_proto(proto: i32) -> Result<Self, ConversionError> {
        match pb::SchedulerType::try_from(proto) {
            Ok(pb::SchedulerType::Service) => Ok(SchedulerType::Service),
            Ok(pb::SchedulerType::Batch) => Ok(SchedulerType::Batch),
            Ok(pb::SchedulerType::System) => Ok(SchedulerType::System),
            Ok(pb::SchedulerType::Unspecified) | Err(_) => Err(bad_enum(proto)),
        }
    }
}

impl IntoProto for EvalStatus {
    type Proto = i32;

    fn into_proto(self) -> i32 {
        let proto = match self {
            EvalStatus::Pending => pb::EvalStatus::Pending,
            EvalStatus::Blocked => pb::EvalStatus::Blocked,
            EvalStatus::Complete => pb::EvalStatus::Complete,
            EvalStatus::Failed => pb::EvalStatus::Failed,
            EvalStatus::Canceled => pb::EvalStatus::Canceled,
        };
        proto as i32
    }
}

impl FromProto for EvalStatus {
    type Proto = i32;

    fn from_proto(proto: i32) -> Result<Self, ConversionError> {
        match pb::EvalStatus::try_from(proto) {
            Ok(pb::EvalStatus::Pending) => Ok(EvalStatus::Pending),
            Ok(pb::EvalStatus::Blocked) => Ok(EvalStatus::Blocked),
            Ok(pb::EvalStatus::Complete) => Ok(EvalStatus::Complete),
            Ok(pb::EvalStatus::Failed) => Ok(EvalStatus::Failed),
            Ok(pb::EvalStatus::Canceled) => Ok(EvalStatus::Canceled),
            Ok(pb::EvalStatus::Unspecified) | Err(_) => Err(bad_enum(proto)),
        }
    }
}

impl IntoProto for TaskState {
    type Proto = i32;

    fn into_proto(self) -> i32 {
        let proto = match self {
            TaskState::Pending => pb::TaskState::Pending,
            TaskState::Running => pb::TaskState::Running,
            TaskState::Finished => pb::TaskState::Finished,
            TaskState::Failed => pb::TaskState::Failed,
            TaskState::Killed => pb::TaskState::Killed,
            TaskState::Lost => pb::TaskState::Lost,
        };
        proto as i32
    }
}

impl FromProto for TaskState {
    type Proto = i32;

    fn from_proto(proto: i32) -> Result<Self, ConversionError> {
        match pb::TaskState::try_from(proto) {
            Ok(pb::TaskState::Pending) => Ok(TaskState::Pending),
            Ok(pb::TaskState::Running) => Ok(TaskState::Running),
            Ok(pb::TaskState::Finished) => Ok(TaskState::Finished),
            Ok(pb::TaskState::Failed) => Ok(TaskState::Failed),
            Ok(pb::TaskState::Killed) => Ok(TaskState::Killed),
            Ok(pb::TaskState::Lost) => Ok(TaskState::Lost),
            Ok(pb::TaskState::Unspecified) | Err(_) => Err(bad_enum(proto)),
        }
    }
}

impl IntoProto for ConstraintOp {
    type Proto = i32;

    fn into_proto(self) -> i32 {
        let proto = match self {
            ConstraintOp::Equal => pb::ConstraintOp::Equal,
            ConstraintOp::NotEqual => pb::ConstraintOp::NotEqual,
        };
        proto as i32
    }
}

impl FromProto for ConstraintOp {
    type Proto = i32;

    fn from_proto(proto: i32) -> Result<Self, ConversionError> {
        match pb::ConstraintOp::try_from(proto) {
            Ok(pb::ConstraintOp::Equal) => Ok(ConstraintOp::Equal),
            Ok(pb::ConstraintOp::NotEqual) => Ok(ConstraintOp::NotEqual),
            Ok(pb::ConstraintOp::Unspecified) | Err(_) => Err(bad_enum(proto)),
        }
    }
}

impl IntoProto for Resources {
    type Proto = pb::Resources;

    fn into_proto(self) -> pb::Resources {
        // What the SDK's arithmetic makes of odd amounts, so that the other side can read it.
        let cpus = if self.cpus.is_nan() || self.cpus < 0.0 {
            0.0
        } else {
            self.cpus.min(f64::MAX)
        };
        pb::Resources {
            cpus,
            mem_mb: self.mem_mb,
        }
    }
}

impl FromProto for Resources {
    type Proto = pb::Resources;

    fn from_proto(proto: pb::Resources) -> Result<Self, ConversionError> {
        let cpus = proto.cpus;
        if !cpus.is_finite() || cpus < 0.0 {
            return Err(ConversionError::new(
                "cpus",
                format!("{cpus} is not a finite, non-negative number of cores"),
            ));
        }
        Ok(Resources {
            cpus,
            mem_mb: proto.mem_mb,
        })
    }
}

impl IntoProto for Constraint {
    type Proto = pb::Constraint;

    fn into_proto(self) -> pb::Constraint {
        pb::Constraint {
            attribute: self.attribute,
            op: self.op.into_proto(),
            value: self.value,
        }
    }
}

impl FromProto for Constraint {
    type Proto = pb::Constraint;

    fn from_proto(proto: pb::Constraint) -> Result<Self, ConversionError> {
        Ok(Constraint {
            attribute: proto.attribute,
            op: read(proto.op, "op")?,
            value: proto.value,
        })
    }
}

impl IntoProto for TaskGroup {
    type Proto = pb::TaskGroup;

    fn into_proto(self) -> pb::TaskGroup {
        pb::TaskGroup {
            name: self.name,
            count: self.count,
            resources: Some(self.resources.into_proto()),
            command: self.command,
            args: self.args,
            env: unsorted(self.env),
            constraints: self.constraints.into_proto(),
            spec_version: self.spec_version,
        }
    }
}

impl FromProto for TaskGroup {
    type Proto = pb::TaskGroup;

    fn from_proto(proto: pb::TaskGroup) -> Result<Self, ConversionError> {
        Ok(TaskGroup {
            name: proto.name,
            count: proto.count,
            resources: required(proto.resources, "resources")?,
            command: proto.command,
            args: proto.args,
            env: sorted(proto.env),
            constraints: each(proto.constraints, "constraints")?,
            spec_version: proto.spec_version,
        })
    }
}

impl IntoProto for Job {
    type Proto = pb::Job;

    fn into_proto(self) -> pb::Job {
        pb::Job {
            name: self.name,
            priority: self.priority.into(),
            scheduler: self.scheduler.into_proto(),
            groups: self.groups.into_proto(),
            stopped: self.stopped,
            version: self.version,
        }
    }
}

impl FromProto for Job {
    type Proto = pb::Job;

    fn from_proto(proto: pb::Job) -> Result<Self, ConversionError> {
        Ok(Job {
            name: proto.name,
            priority: priority(proto.priority, "priority")?,
            scheduler: read(proto.scheduler, "scheduler")?,
            groups: each(proto.groups, "groups")?,
            stopped: proto.stopped,
            version: proto.version,
        })
    }
}

impl IntoProto for Trigger {
    type Proto = pb::Trigger;

    fn into_proto(self) -> pb::Trigger {
        use pb::trigger::Kind;
        let kind = match self {
            Trigger::JobRegister => Kind::JobRegister(pb::trigger::JobRegister {}),
            Trigger::JobDeregister => Kind::JobDeregister(pb::trigger::JobDeregister {}),
            Trigger::AgentUnreachable(agent) => Kind::AgentUnreachable(agent.0),
            Trigger::AgentUpdate(agent) => Kind::AgentUpdate(agent.0),
            Trigger::Unblocked => Kind::Unblocked(pb::trigger::Unblocked {}),
            Trigger::TaskEnded(task) => Kind::TaskEnded(task),
            Trigger::FailedFollowUp(eval) => Kind::FailedFollowUp(eval.0),
        };
        pb::Trigger { kind: Some(kind) }
    }
}

impl FromProto for Trigger {
    type Proto = pb::Trigger;

    fn from_proto(proto: pb::Trigger) -> Result<Self, ConversionError> {
        use pb::trigger::Kind;
        match proto.kind {
            Some(Kind::JobRegister(_)) => Ok(Trigger::JobRegister),
            Some(Kind::JobDeregister(_)) => Ok(Trigger::JobDeregister),
            Some(Kind::AgentUnreachable(agent)) => Ok(Trigger::AgentUnreachable(AgentId(agent))),
            Some(Kind::AgentUpdate(agent)) => Ok(Trigger::AgentUpdate(AgentId(agent))),
            Some(Kind::Unblocked(_)) => Ok(Trigger::Unblocked),
            Some(Kind::TaskEnded(task)) => Ok(Trigger::TaskEnded(task)),
            Some(Kind::FailedFollowUp(eval)) => Ok(Trigger::FailedFollowUp(EvalId(eval))),
            None => Err(ConversionError::new("", "none of its kinds is set")),
        }
    }
}

impl IntoProto for Evaluation {
    type Proto = pb::Evaluation;

    fn into_proto(self) -> pb::Evaluation {
        pb::Evaluation {
            id: self.id.0,
            job: self.job,
            priority: self.priority.into(),
            scheduler: self.scheduler.into_proto(),
            trigger: Some(self.trigger.into_proto()),
            status: self.status.into_proto(),
            status_description: self.status_description,
            create_index: self.create_index,
            modify_index: self.modify_index,
            snapshot_index: self.snapshot_index,
            wait_until_ms: self.wait_until_ms,
        }
    }
}

impl FromProto for Evaluation {
    type Proto = pb::Evaluation;

    fn from_proto(proto: pb::Evaluation) -> Result<Self, ConversionError> {
        Ok(Evaluation {
            id: EvalId(proto.id),
            job: proto.job,
            priority: priority(proto.priority, "priority")?,
            scheduler: read(proto.scheduler, "scheduler")?,
            trigger: required(proto.trigger, "trigger")?,
            status: read(proto.status, "status")?,
            status_description: proto.status_description,
            create_index: proto.create_index,
            modify_index: proto.modify_index,
            snapshot_index: proto.snapshot_index,
            wait_until_ms: proto.wait_until_ms,
        })
    }
}

impl IntoProto for TaskView {
    type Proto = pb::TaskView;

    fn into_proto(self) -> pb::TaskView {
        pb::TaskView {
            id: self.id,
            name: self.name,
            job: self.job,
            group: self.group,
            resources: Some(self.resources.into_proto()),
            state: self.state.into_proto(),
            job_version: self.job_version,
        }
    }
}

impl FromProto for TaskView {
    type Proto = pb::TaskView;

    fn from_proto(proto: pb::TaskView) -> Result<Self, ConversionError> {
        Ok(TaskView {
            id: proto.id,
            name: proto.name,
            job: proto.job,
            group: proto.group,
            resources: required(proto.resources, "resources")?,
            state: read(proto.state, "state")?,
            job_version: proto.job_version,
        })
    }
}

impl IntoProto for AgentView {
    type Proto = pb::AgentView;

    fn into_proto(self) -> pb::AgentView {
        pb::AgentView {
            id: self.id.0,
            attributes: unsorted(self.attributes),
            total: Some(self.total.into_proto()),
            tasks: self.tasks.into_proto(),
        }
    }
}

impl FromProto for AgentView {
    type Proto = pb::AgentView;

    fn from_proto(proto: pb::AgentView) -> Result<Self, ConversionError> {
        Ok(AgentView {
            id: AgentId(proto.id),
            attributes: sorted(proto.attributes),
            total: required(proto.total, "total")?,
            tasks: each(proto.tasks, "tasks")?,
        })
    }
}

impl IntoProto for ClusterSnapshot {
    type Proto = pb::ClusterSnapshot;

    fn into_proto(self) -> pb::ClusterSnapshot {
        pb::ClusterSnapshot {
            index: self.index,
            agents: self
                .agents
                .into_iter()
                .map(|agent| Arc::unwrap_or_clone(agent).into_proto())
                .collect(),
            jobs: self
                .jobs
                .into_iter()
                .map(|(name, job)| (name, job.into_proto()))
                .collect(),
            held: self.held.into_iter().collect(),
        }
    }
}

impl FromProto for ClusterSnapshot {
    type Proto = pb::ClusterSnapshot;

    fn from_proto(proto: pb::ClusterSnapshot) -> Result<Self, ConversionError> {
        let mut jobs = BTreeMap::new();
        for (name, job) in proto.jobs {
            let job = read(job, &format!("jobs[{name:?}]"))?;
            jobs.insert(name, job);
        }
        Ok(ClusterSnapshot {
            index: proto.index,
            agents: each::<AgentView>(proto.agents, "agents")?
                .into_iter()
                .map(Arc::new)
                .collect(),
            jobs,
            held: proto.held.into_iter().collect(),
        })
    }
}

impl IntoProto for Placement {
    type Proto = pb::Placement;

    fn into_proto(self) -> pb::Placement {
        pb::Placement {
            agent: self.agent.0,
            task_id: self.task_id,
            name: self.name,
            job: self.job,
            group: self.group,
            resources: Some(self.resources.into_proto()),
            command: self.command,
            args: self.args,
            env: unsorted(self.env),
            job_version: self.job_version,
        }
    }
}

impl FromProto for Placement {
    type Proto = pb::Placement;

    fn from_proto(proto: pb::Placement) -> Result<Self, ConversionError> {
        Ok(Placement {
            agent: AgentId(proto.agent),
            task_id: proto.task_id,
            name: proto.name,
            job: proto.job,
            group: proto.group,
            resources: required(proto.resources, "resources")?,
            command: proto.command,
            args: proto.args,
            env: sorted(proto.env),
            job_version: proto.job_version,
        })
    }
}

impl IntoProto for Stop {
    type Proto = pb::Stop;

    fn into_proto(self) -> pb::Stop {
        pb::Stop {
            agent: self.agent.0,
            task_id: self.task_id,
        }
    }
}

impl FromProto for Stop {
    type Proto = pb::Stop;

    fn from_proto(proto: pb::Stop) -> Result<Self, ConversionError> {
        Ok(Stop {
            agent: AgentId(proto.agent),
            task_id: proto.task_id,
        })
    }
}

impl IntoProto for Demand {
    type Proto = pb::Demand;

    fn into_proto(self) -> pb::Demand {
        pb::Demand {
            resources: Some(self.resources.into_proto()),
            constraints: self.constraints.into_proto(),
        }
    }
}

impl FromProto for Demand {
    type Proto = pb::Demand;

    fn from_proto(proto: pb::Demand) -> Result<Self, ConversionError> {
        Ok(Demand {
            resources: required(proto.resources, "resources")?,
            constraints: each(proto.constraints, "constraints")?,
        })
    }
}

impl IntoProto for Plan {
    type Proto = pb::Plan;

    fn into_proto(self) -> pb::Plan {
        pb::Plan {
            eval_id: self.eval.0,
            job: self.job,
            job_version: self.job_version,
            snapshot_index: self.snapshot_index,
            place: self.place.into_proto(),
            stop: self.stop.into_proto(),
            unplaced: self.unplaced.into_proto(),
        }
    }
}

impl FromProto for Plan {
    type Proto = pb::Plan;

    fn from_proto(proto: pb::Plan) -> Result<Self, ConversionError> {
        Ok(Plan {
            eval: EvalId(proto.eval_id),
            job: proto.job,
            job_version: proto.job_version,
            snapshot_index: proto.snapshot_index,
            place: each(proto.place, "place")?,
            stop: each(proto.stop, "stop")?,
            unplaced: each(proto.unplaced, "unplaced")?,
        })
    }
}

impl IntoProto for PlanResult {
    type Proto = pb::PlanResult;

    fn into_proto(self) -> pb::PlanResult {
        pb::PlanResult {
            committed: self.committed.into_proto(),
            rejected: self.rejected.into_proto(),
            stopped: self.stopped.into_proto(),
            index: self.index,
        }
    }
}

impl FromProto for PlanResult {
    type Proto = pb::PlanResult;

    fn from_proto(proto: pb::PlanResult) -> Result<Self, ConversionError> {
        Ok(PlanResult {
            committed: each(proto.committed, "committed")?,
            rejected: each(proto.rejected, "rejected")?,
            stopped: each(proto.stopped, "stopped")?,
            index: proto.index,
        })
    }
}

impl IntoProto for Assignment {
    type Proto = pb::Assignment;

    fn into_proto(self) -> pb::Assignment {
        pb::Assignment {
            evaluation: Some(self.eval.into_proto()),
            token: self.token,
        }
    }
}

impl FromProto for Assignment {
    type Proto = pb::Assignment;

    fn from_proto(proto: pb::Assignment) -> Result<Self, ConversionError> {
        Ok(Assignment {
            eval: required(proto.evaluation, "evaluation")?,
            token: proto.token,
        })
    }
}

/// Reads the required message `proto` of a request's field `field` (for servers: the error
/// names the field from the request down).
///
/// # Errors
/// [`ConversionError`] if it is missing or invalid.
pub fn required_field<T: FromProto>(
    proto: Option<T::Proto>,
    field: &str,
) -> Result<T, ConversionError> {
    required(proto, field)
}

/// Reads every element of a request's repeated field `field`.
///
/// # Errors
/// [`ConversionError`] naming the first invalid element.
pub fn repeated_field<T: FromProto>(
    protos: Vec<T::Proto>,
    field: &str,
) -> Result<Vec<T>, ConversionError> {
    each(protos, field)
}

// ---------------------------------------------------------------------------------------------
// Statuses shared by the service and the client
// ---------------------------------------------------------------------------------------------

/// A standby's answer: `FAILED_PRECONDITION` naming the leading master's `leader` address
/// (`host:port`) in the message and in the [`LEADER_METADATA`] metadata.
pub fn not_leader(leader: &str) -> Status {
    let mut status =
        Status::failed_precondition(format!("not the leading master; {LEADER_IS}{leader}"));
    if let Ok(value) = MetadataValue::try_from(leader) {
        status.metadata_mut().insert(LEADER_METADATA, value);
    }
    status
}

/// The leader a [`not_leader`] answer names, if `status` is one and names one.
pub fn leader_hint(status: &Status) -> Option<String> {
    if status.code() != Code::FailedPrecondition {
        return None;
    }
    let from_metadata = status
        .metadata()
        .get(LEADER_METADATA)
        .and_then(|value| value.to_str().ok())
        .map(str::trim)
        .filter(|leader| !leader.is_empty());
    let from_message = || {
        status
            .message()
            .rsplit_once(LEADER_IS)
            .map(|(_, leader)| leader.trim())
            .filter(|leader| !leader.is_empty() && !leader.contains(char::is_whitespace))
    };
    from_metadata.or_else(from_message).map(str::to_owned)
}

/// A stale-snapshot answer: `OUT_OF_RANGE`, with the index the master has in the
/// [`SNAPSHOT_INDEX_METADATA`] metadata.
pub fn stale_snapshot(min_index: u64, got: u64) -> Status {
    let mut status =
        Status::out_of_range(WorkerError::StaleSnapshot { min_index, got }.to_string());
    if let Ok(value) = MetadataValue::try_from(got.to_string()) {
        status.metadata_mut().insert(SNAPSHOT_INDEX_METADATA, value);
    }
    status
}

// ---------------------------------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------------------------------

/// How a [`RemoteBackend`] talks to the masters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteConfig {
    /// How long connecting to one master may take before it counts as unreachable.
    pub connect_timeout: Duration,
    /// How long a call may take; a dequeue may take its long poll on top.
    pub call_timeout: Duration,
    /// The largest message sent or accepted.
    pub max_message_size: usize,
}

impl Default for RemoteConfig {
    fn default() -> Self {
        RemoteConfig {
            connect_timeout: Duration::from_secs(2),
            call_timeout: Duration::from_secs(30),
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
        }
    }
}

/// Why a [`RemoteBackend`] could not be made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RemoteError {
    /// The list of masters is empty.
    #[error("no master address given")]
    NoAddresses,
    /// An address is not `host:port`.
    #[error("master address {address:?} is not HOST:PORT: {reason}")]
    BadAddress {
        /// The address.
        address: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// A worker's way to the leading master from another program: gRPC over one HTTP/2 connection
/// per master, shared by the clones (one per worker is the usual use).
///
/// Each call goes to the master it last found leading. A standby's answer sends it to the
/// leader it names (added to the list if it was not there); an unreachable master, or one
/// that knows no leader, sends it to the next in the list. A call goes round the list at most
/// twice before it fails with [`WorkerError::Unavailable`]; the worker then backs off. A plan
/// whose master went away after it was sent is not sent again elsewhere (it may have been
/// applied): the worker nacks the evaluation, and whoever gets it next plans afresh.
#[derive(Clone)]
pub struct RemoteBackend {
    inner: Arc<Inner>,
}

struct Inner {
    config: RemoteConfig,
    masters: Mutex<Masters>,
}

struct Masters {
    known: Vec<Master>,
    current: usize,
}

struct Master {
    /// `host:port`.
    address: String,
    endpoint: Endpoint,
    /// Made on first use, so that making the backend needs no runtime.
    client: Option<SchedulingClient<Channel>>,
}

impl fmt::Debug for RemoteBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let masters = self.inner.lock();
        f.debug_struct("RemoteBackend")
            .field(
                "masters",
                &masters.known.iter().map(|m| &m.address).collect::<Vec<_>>(),
            )
            .field("current", &masters.known[masters.current].address)
            .field("config", &self.inner.config)
            .finish()
    }
}

/// Why a call failed.
enum CallError {
    /// No master answered as the leader.
    Unavailable(String),
    /// The leading master (or the connection to it) answered this.
    Status(Status),
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, Masters> {
        self.masters.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn endpoint(address: &str, config: &RemoteConfig) -> Result<(String, Endpoint), RemoteError> {
    let bad = |reason: &str| RemoteError::BadAddress {
        address: address.to_owned(),
        reason: reason.to_owned(),
    };
    let trimmed = address.trim();
    let authority = trimmed
        .strip_prefix("http://")
        .unwrap_or(trimmed)
        .trim_end_matches('/');
    if authority.is_empty() {
        return Err(bad("it is empty"));
    }
    if authority.contains("://") || authority.contains('/') {
        return Err(bad("only plain http HOST:PORT is supported"));
    }
    let endpoint =
        Endpoint::from_shared(format!("http://{authority}")).map_err(|e| bad(&e.to_string()))?;
    if endpoint.uri().port_u16().is_none() {
        return Err(bad("it has no port"));
    }
    let endpoint = endpoint
        .tcp_nodelay(true)
        .connect_timeout(config.connect_timeout);
    Ok((authority.to_owned(), endpoint))
}

/// Whether the call never left this program: the connection could not be made.
fn never_sent(status: &Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        if error.is::<tonic::ConnectError>() {
            return true;
        }
        source = error.source();
    }
    false
}

/// Whether this status was made here from a transport failure rather than sent by a master.
fn from_transport(status: &Status) -> bool {
    std::error::Error::source(status).is_some()
}

/// A failure's reason as the worker reports it: a master's refusal as it gave it, anything
/// else with its code.
fn reason(status: &Status) -> String {
    match status.code() {
        Code::Aborted => status.message().to_owned(),
        code => format!("{} ({code:?})", status.message()),
    }
}

impl RemoteBackend {
    /// A backend for the masters at `addresses` (`host:port` each, any order; one is enough
    /// if it leads or knows the leader), with the default [`RemoteConfig`].
    ///
    /// Nothing is connected yet: the first call reaches out, so the masters need not be up.
    ///
    /// # Errors
    /// [`RemoteError`] for an empty list or an address that is not `host:port`.
    pub fn connect(addresses: Vec<String>) -> Result<Self, RemoteError> {
        Self::connect_with(addresses, RemoteConfig::default())
    }

    /// [`connect`](Self::connect) with these settings.
    ///
    /// # Errors
    /// [`RemoteError`] for an empty list or an address that is not `host:port`.
    pub fn connect_with(addresses: Vec<String>, config: RemoteConfig) -> Result<Self, RemoteError> {
        let mut known: Vec<Master> = Vec::new();
        for address in &addresses {
            let (address, endpoint) = endpoint(address, &config)?;
            if known.iter().all(|m| m.address != address) {
                known.push(Master {
                    address,
                    endpoint,
                    client: None,
                });
            }
        }
        if known.is_empty() {
            return Err(RemoteError::NoAddresses);
        }
        Ok(RemoteBackend {
            inner: Arc::new(Inner {
                config,
                masters: Mutex::new(Masters { known, current: 0 }),
            }),
        })
    }

    /// The master calls go to now: the leader, as far as this backend knows.
    pub fn current(&self) -> String {
        let masters = self.inner.lock();
        masters.known[masters.current].address.clone()
    }

    /// Every master it knows of: those it was given, then leaders it was sent to.
    pub fn masters(&self) -> Vec<String> {
        self.inner
            .lock()
            .known
            .iter()
            .map(|m| m.address.clone())
            .collect()
    }

    /// Its settings.
    pub fn config(&self) -> &RemoteConfig {
        &self.inner.config
    }

    /// The master to call and a client for it.
    fn target(&self) -> (String, SchedulingClient<Channel>) {
        let max = self.inner.config.max_message_size;
        let mut masters = self.inner.lock();
        let current = masters.current;
        let master = &mut masters.known[current];
        let client = master.client.get_or_insert_with(|| {
            SchedulingClient::new(master.endpoint.connect_lazy())
                .max_decoding_message_size(max)
                .max_encoding_message_size(max)
        });
        (master.address.clone(), client.clone())
    }

    /// After `tried` failed: go to `leader` if given, else to the master after `tried`. Does
    /// nothing if another call has moved on from `tried` already.
    fn move_on(&self, tried: &str, leader: Option<String>) {
        let mut masters = self.inner.lock();
        let Some(at) = masters.known.iter().position(|m| m.address == tried) else {
            return;
        };
        if masters.current != at {
            return;
        }
        let leader = leader.and_then(|leader| endpoint(&leader, &self.inner.config).ok());
        masters.current = match leader {
            Some((address, endpoint)) => {
                match masters.known.iter().position(|m| m.address == address) {
                    Some(i) => i,
                    None => {
                        masters.known.push(Master {
                            address,
                            endpoint,
                            client: None,
                        });
                        masters.known.len() - 1
                    }
                }
            }
            None => (at + 1) % masters.known.len(),
        };
    }

    /// Sends a request made by `make` to the leading master, following the leader.
    /// `resend` says whether a request that may have reached a master that then went away
    /// may be sent to another.
    async fn call<Req, Rep, F, Fut>(
        &self,
        timeout: Duration,
        resend: bool,
        make: impl Fn() -> Req,
        send: F,
    ) -> Result<Rep, CallError>
    where
        F: Fn(SchedulingClient<Channel>, Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Rep>, Status>>,
    {
        let rounds = 2 * self.inner.lock().known.len();
        let mut failures: Vec<String> = Vec::new();
        for _ in 0..rounds.max(2) {
            let (address, client) = self.target();
            let mut request = Request::new(make());
            request.set_timeout(timeout);
            let status = match send(client, request).await {
                Ok(reply) => return Ok(reply.into_inner()),
                Err(status) => status,
            };
            match status.code() {
                Code::FailedPrecondition => {
                    let leader = leader_hint(&status).filter(|leader| *leader != address);
                    failures.push(format!("{address}: {}", status.message()));
                    self.move_on(&address, leader);
                }
                Code::Unavailable => {
                    failures.push(format!("{address}: {}", status.message()));
                    self.move_on(&address, None);
                    if from_transport(&status) && !never_sent(&status) && !resend {
                        return Err(CallError::Unavailable(format!(
                            "lost the connection to the master at {address} during the call: {}",
                            status.message()
                        )));
                    }
                }
                Code::Cancelled | Code::DeadlineExceeded if from_transport(&status) => {
                    // Timed out here: that master may be stuck; the next call tries another.
                    self.move_on(&address, None);
                    return Err(CallError::Unavailable(format!(
                        "the master at {address} did not answer within {timeout:?}"
                    )));
                }
                _ => return Err(CallError::Status(status)),
            }
        }
        Err(CallError::Unavailable(format!(
            "no leading master answered: {}",
            failures.join("; ")
        )))
    }

    fn call_timeout(&self) -> Duration {
        self.inner.config.call_timeout
    }
}

impl Backend for RemoteBackend {
    async fn dequeue(
        &self,
        schedulers: &[SchedulerType],
        timeout: Duration,
    ) -> Result<Option<Assignment>, WorkerError> {
        let poll = timeout.min(MAX_DEQUEUE_TIMEOUT);
        let request = pb::DequeueRequest {
            schedulers: schedulers.iter().map(|s| s.into_proto()).collect(),
            timeout_ms: u64::try_from(poll.as_millis()).unwrap_or(u64::MAX),
        };
        let reply = self
            .call(
                poll + self.call_timeout(),
                true,
                || request.clone(),
                |mut client, request| async move { client.dequeue(request).await },
            )
            .await
            .map_err(|e| match e {
                CallError::Unavailable(why) => WorkerError::Unavailable(why),
                CallError::Status(status) => WorkerError::Dequeue(reason(&status)),
            })?;
        reply
            .assignment
            .map(|assignment| {
                read::<Assignment>(assignment, "assignment").map_err(|e| {
                    WorkerError::Dequeue(format!("the master's reply is malformed: {e}"))
                })
            })
            .transpose()
    }

    async fn snapshot(&self, min_index: u64) -> Result<ClusterSnapshot, WorkerError> {
        let snapshot = self
            .call(
                self.call_timeout(),
                true,
                || pb::SnapshotRequest { min_index },
                |mut client, request| async move { client.snapshot(request).await },
            )
            .await
            .map_err(|e| match e {
                CallError::Unavailable(why) => WorkerError::Unavailable(why),
                CallError::Status(status) if status.code() == Code::OutOfRange => {
                    let got = status
                        .metadata()
                        .get(SNAPSHOT_INDEX_METADATA)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    WorkerError::StaleSnapshot { min_index, got }
                }
                CallError::Status(status) => WorkerError::Snapshot {
                    min_index,
                    reason: reason(&status),
                },
            })?;
        let snapshot =
            ClusterSnapshot::from_proto(snapshot).map_err(|e| WorkerError::Snapshot {
                min_index,
                reason: format!("the master's reply is malformed: {}", e.within("snapshot")),
            })?;
        if snapshot.index < min_index {
            return Err(WorkerError::StaleSnapshot {
                min_index,
                got: snapshot.index,
            });
        }
        Ok(snapshot)
    }

    async fn submit(&self, plan: Plan) -> Result<PlanResult, WorkerError> {
        let eval = plan.eval.clone();
        let request = pb::SubmitPlanRequest {
            plan: Some(plan.into_proto()),
        };
        let result = self
            .call(
                self.call_timeout(),
                false,
                || request.clone(),
                |mut client, request| async move { client.submit_plan(request).await },
            )
            .await
            .map_err(|e| match e {
                CallError::Unavailable(why) => WorkerError::Unavailable(why),
                CallError::Status(status) => WorkerError::Submit {
                    eval: eval.clone(),
                    reason: reason(&status),
                },
            })?;
        PlanResult::from_proto(result).map_err(|e| WorkerError::Submit {
            eval,
            reason: format!("the master's reply is malformed: {}", e.within("result")),
        })
    }

    async fn ack(&self, eval: &EvalId, token: &str) -> Result<(), WorkerError> {
        let request = pb::AckRequest {
            eval_id: eval.0.clone(),
            token: token.to_owned(),
        };
        self.call(
            self.call_timeout(),
            true,
            || request.clone(),
            |mut client, request| async move { client.ack(request).await },
        )
        .await
        .map(|_| ())
        .map_err(|e| match e {
            CallError::Unavailable(why) => WorkerError::Unavailable(why),
            CallError::Status(status) => WorkerError::Ack {
                eval: eval.clone(),
                reason: reason(&status),
            },
        })
    }

    async fn nack(&self, eval: &EvalId, token: &str) -> Result<(), WorkerError> {
        let request = pb::NackRequest {
            eval_id: eval.0.clone(),
            token: token.to_owned(),
        };
        self.call(
            self.call_timeout(),
            true,
            || request.clone(),
            |mut client, request| async move { client.nack(request).await },
        )
        .await
        .map(|_| ())
        .map_err(|e| match e {
            CallError::Unavailable(why) => WorkerError::Unavailable(why),
            CallError::Status(status) => WorkerError::Nack {
                eval: eval.clone(),
                reason: reason(&status),
            },
        })
    }

    async fn block(&self, eval: Evaluation, unplaced: Vec<Demand>) -> Result<(), WorkerError> {
        let id = eval.id.clone();
        let request = pb::BlockRequest {
            evaluation: Some(eval.into_proto()),
            unplaced: unplaced.into_proto(),
        };
        self.call(
            self.call_timeout(),
            true,
            || request.clone(),
            |mut client, request| async move { client.block(request).await },
        )
        .await
        .map(|_| ())
        .map_err(|e| match e {
            CallError::Unavailable(why) => WorkerError::Unavailable(why),
            CallError::Status(status) => WorkerError::Block {
                eval: id,
                reason: reason(&status),
            },
        })
    }

    async fn complete(&self, eval: &Evaluation) -> Result<(), WorkerError> {
        let request = pb::CompleteRequest {
            evaluation: Some(eval.clone().into_proto()),
        };
        self.call(
            self.call_timeout(),
            true,
            || request.clone(),
            |mut client, request| async move { client.complete(request).await },
        )
        .await
        .map(|_| ())
        .map_err(|e| match e {
            CallError::Unavailable(why) => WorkerError::Unavailable(why),
            CallError::Status(status) => WorkerError::Complete {
                eval: eval.id.clone(),
                reason: reason(&status),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;

    fn resources(cpus: f64, mem_mb: u64) -> Resources {
        Resources { cpus, mem_mb }
    }

    fn rack(op: ConstraintOp, value: &str) -> Constraint {
        Constraint {
            attribute: "rack".into(),
            op,
            value: value.into(),
        }
    }

    fn job() -> Job {
        Job {
            name: "web".into(),
            priority: 70,
            scheduler: SchedulerType::System,
            groups: vec![TaskGroup {
                name: "fe".into(),
                count: 3,
                resources: resources(0.25, 128),
                command: "sleep".into(),
                args: vec!["30".into()],
                env: BTreeMap::from([("A".to_owned(), "1".to_owned())]),
                constraints: vec![
                    rack(ConstraintOp::Equal, "r1"),
                    rack(ConstraintOp::NotEqual, "r2"),
                ],
                spec_version: 7,
            }],
            stopped: true,
            version: 9,
        }
    }

    fn eval(trigger: Trigger, status: EvalStatus) -> Evaluation {
        Evaluation {
            id: EvalId("e-1".into()),
            job: "web".into(),
            priority: 255,
            scheduler: SchedulerType::Batch,
            trigger,
            status,
            status_description: "why".into(),
            create_index: 1,
            modify_index: 2,
            snapshot_index: 3,
            wait_until_ms: 4,
        }
    }

    fn placement(task: &str) -> Placement {
        Placement {
            agent: AgentId("agent-1".into()),
            task_id: format!("{task}-0000abcd"),
            name: task.into(),
            job: "web".into(),
            group: "fe".into(),
            resources: resources(1.5, 64),
            command: "sh".into(),
            args: vec!["-c".into(), "true".into()],
            env: BTreeMap::from([("B".to_owned(), "2".to_owned())]),
            job_version: 9,
        }
    }

    fn snapshot() -> ClusterSnapshot {
        let states = [
            TaskState::Pending,
            TaskState::Running,
            TaskState::Finished,
            TaskState::Failed,
            TaskState::Killed,
            TaskState::Lost,
        ];
        ClusterSnapshot {
            index: 42,
            agents: vec![Arc::new(AgentView {
                id: AgentId("agent-1".into()),
                attributes: BTreeMap::from([("rack".to_owned(), "r1".to_owned())]),
                total: resources(8.0, 4096),
                tasks: states
                    .iter()
                    .enumerate()
                    .map(|(i, state)| TaskView {
                        id: format!("t{i}"),
                        name: format!("web.fe[{i}]"),
                        job: "web".into(),
                        group: "fe".into(),
                        resources: resources(0.5, 32),
                        state: *state,
                        // 0 (unknown) included.
                        job_version: i as u64,
                    })
                    .collect(),
            })],
            jobs: BTreeMap::from([("web".to_owned(), job())]),
            held: ["web.fe[0]".to_owned()].into(),
        }
    }

    /// Into the message, through bytes, and back.
    fn round_trip<T>(value: T) -> T
    where
        T: IntoProto + FromProto<Proto = <T as IntoProto>::Proto>,
        <T as IntoProto>::Proto: prost::Message + Default,
    {
        let bytes = value.into_proto().encode_to_vec();
        let decoded = <T as IntoProto>::Proto::decode(bytes.as_slice()).expect("decodes");
        T::from_proto(decoded).expect("converts back")
    }

    #[test]
    fn evaluations_round_trip_with_every_trigger_and_status() {
        let triggers = [
            Trigger::JobRegister,
            Trigger::JobDeregister,
            Trigger::AgentUnreachable(AgentId("agent-3".into())),
            Trigger::AgentUpdate(AgentId("agent-4".into())),
            Trigger::Unblocked,
            Trigger::TaskEnded("web.fe[0]-1".into()),
            Trigger::FailedFollowUp(EvalId("e-0".into())),
        ];
        let statuses = [
            EvalStatus::Pending,
            EvalStatus::Blocked,
            EvalStatus::Complete,
            EvalStatus::Failed,
            EvalStatus::Canceled,
        ];
        for trigger in triggers {
            for status in statuses {
                let eval = eval(trigger.clone(), status);
                assert_eq!(round_trip(eval.clone()), eval);
            }
        }
        for scheduler in SchedulerType::ALL {
            let eval = Evaluation {
                scheduler,
                ..eval(Trigger::JobRegister, EvalStatus::Pending)
            };
            assert_eq!(round_trip(eval.clone()), eval);
        }
        let assignment = Assignment {
            eval: eval(Trigger::Unblocked, EvalStatus::Blocked),
            token: "tok".into(),
        };
        assert_eq!(round_trip(assignment.clone()), assignment);
    }

    #[test]
    fn snapshots_plans_and_results_round_trip() {
        assert_eq!(round_trip(snapshot()), snapshot());
        assert_eq!(
            round_trip(ClusterSnapshot::default()),
            ClusterSnapshot::default()
        );
        let plan = Plan {
            eval: EvalId("e-1".into()),
            job: "web".into(),
            job_version: 9,
            snapshot_index: 42,
            place: vec![placement("web.fe[0]"), placement("web.fe[1]")],
            stop: vec![Stop {
                agent: AgentId("agent-2".into()),
                task_id: "old".into(),
            }],
            unplaced: vec![Demand {
                resources: resources(2.0, 10),
                constraints: vec![rack(ConstraintOp::Equal, "r9")],
            }],
        };
        assert_eq!(round_trip(plan.clone()), plan);
        let result = PlanResult {
            committed: vec![placement("web.fe[0]")],
            rejected: vec![placement("web.fe[1]")],
            stopped: plan.stop.clone(),
            index: 43,
        };
        assert_eq!(round_trip(result.clone()), result);
    }

    #[test]
    fn odd_cpu_amounts_are_sent_as_the_sdk_counts_them() {
        for (cpus, sent) in [
            (f64::NAN, 0.0),
            (-1.0, 0.0),
            (f64::INFINITY, f64::MAX),
            (0.0, 0.0),
            (2.5, 2.5),
        ] {
            let proto = resources(cpus, 1).into_proto();
            assert_eq!(proto.cpus, sent, "{cpus}");
            assert!(Resources::from_proto(proto).is_ok());
        }
    }

    fn error_of<T: FromProto + fmt::Debug>(proto: T::Proto) -> ConversionError {
        T::from_proto(proto).expect_err("malformed")
    }

    #[test]
    fn malformed_messages_name_the_field() {
        // An unknown enum value, deep in a snapshot.
        let mut proto = snapshot().into_proto();
        proto.agents[0].tasks[2].state = 99;
        let error = error_of::<ClusterSnapshot>(proto);
        assert_eq!(error.field(), "agents[0].tasks[2].state");
        assert_eq!(error.problem(), "unknown value 99");
        assert_eq!(
            error.to_string(),
            "malformed agents[0].tasks[2].state: unknown value 99"
        );

        // NaN and negative resources.
        let mut proto = snapshot().into_proto();
        proto.agents[0].tasks[1].resources = Some(pb::Resources {
            cpus: f64::NAN,
            mem_mb: 1,
        });
        let error = error_of::<ClusterSnapshot>(proto);
        assert_eq!(error.field(), "agents[0].tasks[1].resources.cpus");
        assert!(error.problem().contains("NaN"), "{error}");
        let mut proto = snapshot().into_proto();
        proto.agents[0].total = Some(pb::Resources {
            cpus: -2.0,
            mem_mb: 1,
        });
        assert_eq!(
            error_of::<ClusterSnapshot>(proto).field(),
            "agents[0].total.cpus"
        );

        // A missing required message.
        let mut proto = snapshot().into_proto();
        proto.agents[0].total = None;
        let error = error_of::<ClusterSnapshot>(proto);
        assert_eq!(
            (error.field(), error.problem()),
            ("agents[0].total", "missing")
        );

        // Inside a job of the snapshot.
        let mut proto = snapshot().into_proto();
        let job = proto.jobs.get_mut("web").expect("web");
        job.groups[0].constraints[1].op = 0;
        let error = error_of::<ClusterSnapshot>(proto);
        assert_eq!(error.field(), r#"jobs["web"].groups[0].constraints[1].op"#);
        assert_eq!(error.problem(), "unspecified");

        // Evaluations: trigger, status, scheduler, priority.
        let good = eval(Trigger::JobRegister, EvalStatus::Pending).into_proto();
        type Break = fn(&mut pb::Evaluation);
        let cases: [(Break, &str); 5] = [
            (|e| e.trigger = None, "trigger"),
            (|e| e.trigger = Some(pb::Trigger { kind: None }), "trigger"),
            (|e| e.status = 0, "status"),
            (|e| e.scheduler = 7, "scheduler"),
            (|e| e.priority = 256, "priority"),
        ];
        for (break_it, field) in cases {
            let mut proto = good.clone();
            break_it(&mut proto);
            assert_eq!(error_of::<Evaluation>(proto).field(), field);
        }
        let error = error_of::<Assignment>(pb::Assignment {
            evaluation: None,
            token: "t".into(),
        });
        assert_eq!(error.field(), "evaluation");

        // Plans and results.
        let mut proto = Plan {
            place: vec![placement("a"), placement("b")],
            ..Plan::empty(EvalId("e".into()), "web", 1)
        }
        .into_proto();
        proto.place[1].resources = None;
        assert_eq!(error_of::<Plan>(proto).field(), "place[1].resources");
        let proto = pb::PlanResult {
            rejected: vec![pb::Placement {
                resources: Some(pb::Resources {
                    cpus: f64::INFINITY,
                    mem_mb: 0,
                }),
                ..pb::Placement::default()
            }],
            ..pb::PlanResult::default()
        };
        assert_eq!(
            error_of::<PlanResult>(proto).field(),
            "rejected[0].resources.cpus"
        );
        let proto = pb::Demand {
            resources: Some(pb::Resources::default()),
            constraints: vec![pb::Constraint {
                op: 3,
                ..pb::Constraint::default()
            }],
        };
        assert_eq!(error_of::<Demand>(proto).field(), "constraints[0].op");

        // Request-level helpers name the request's field.
        let error = required_field::<Plan>(None, "plan").expect_err("missing");
        assert_eq!(error.to_string(), "malformed plan: missing");
        let error = repeated_field::<Demand>(
            vec![pb::Demand::default(), pb::Demand::default()],
            "unplaced",
        )
        .expect_err("no resources");
        assert_eq!(error.field(), "unplaced[0].resources");
    }

    #[test]
    fn a_standby_answer_names_the_leader() {
        let status = not_leader("10.0.0.7:5050");
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert_eq!(
            status.message(),
            "not the leading master; the leader is 10.0.0.7:5050"
        );
        assert_eq!(leader_hint(&status).as_deref(), Some("10.0.0.7:5050"));
        // The message alone is enough (a proxy may drop metadata).
        let bare = Status::failed_precondition(status.message());
        assert_eq!(leader_hint(&bare).as_deref(), Some("10.0.0.7:5050"));
        // Other answers name none.
        assert_eq!(leader_hint(&Status::failed_precondition("nope")), None);
        assert_eq!(
            leader_hint(&Status::unavailable("the leader is 1.2.3.4:5")),
            None
        );

        let stale = stale_snapshot(10, 7);
        assert_eq!(stale.code(), Code::OutOfRange);
        assert_eq!(
            stale
                .metadata()
                .get(SNAPSHOT_INDEX_METADATA)
                .and_then(|v| v.to_str().ok()),
            Some("7")
        );
    }

    #[test]
    fn addresses_must_be_host_and_port() {
        assert_eq!(
            RemoteBackend::connect(Vec::new()).expect_err("empty"),
            RemoteError::NoAddresses
        );
        for bad in ["", "localhost", "https://a:1", "a:1/path", "a b:1"] {
            assert!(
                matches!(
                    RemoteBackend::connect(vec![bad.to_owned()]),
                    Err(RemoteError::BadAddress { .. })
                ),
                "{bad:?}"
            );
        }
        let backend = RemoteBackend::connect(vec![
            "127.0.0.1:5050".into(),
            "http://127.0.0.1:5051/".into(),
            "127.0.0.1:5050".into(),
        ])
        .expect("valid");
        assert_eq!(backend.masters(), ["127.0.0.1:5050", "127.0.0.1:5051"]);
        assert_eq!(backend.current(), "127.0.0.1:5050");
    }

    #[tokio::test]
    async fn no_reachable_master_is_unavailable_after_trying_each() {
        // Ports that were just free: nothing listens there.
        let closed = || {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            listener.local_addr().expect("address").to_string()
        };
        let (first, second) = (closed(), closed());
        let backend = RemoteBackend::connect(vec![first.clone(), second.clone()]).expect("valid");
        let error = backend
            .snapshot(0)
            .await
            .expect_err("nothing listens there");
        let WorkerError::Unavailable(why) = &error else {
            panic!("not unavailable: {error:?}");
        };
        assert!(why.contains(&first) && why.contains(&second), "{why}");
        // A plan is not resent after a connection failure, but one that was never sent may go
        // to the next master: the error is the same.
        let error = backend
            .submit(Plan::empty(EvalId("e".into()), "web", 0))
            .await
            .expect_err("nothing listens there");
        assert!(matches!(error, WorkerError::Unavailable(_)), "{error:?}");
    }
}

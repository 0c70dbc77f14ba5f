//! The clients: operations on jobs through the operator API, as a real client makes them, and
//! the sequential specification the linearizability checker holds them to.
//!
//! Most jobs are services (tasks that run until stopped); every fourth ([`is_batch`]) is a
//! batch job, whose tasks sleep a while and finish. A submission sets the job's count and one
//! of two task definitions (numbered in its environment, so that a read says which it saw):
//! one that keeps the definition the job has restarts nothing (a scale, or nothing at all),
//! one that changes it replaces the job's running tasks. While a
//! [`Fault::LargeEntries`](crate::faults::Fault::LargeEntries) is in force, half the
//! submissions carry a payload of hundreds of KiB (a service's environment, a batch job's
//! arguments: a definition of its own).
//!
//! Each group says what becomes of its tasks while their agent is unreachable (its
//! `disconnect` policy, see [`disconnect`]): a batch group keeps its slots for them (the
//! default: a slot runs once), service groups replace them (one at once, one after a few
//! seconds) and, when the agent comes back while a replacement runs, keep one copy by a
//! policy that differs by job.

use std::collections::BTreeMap;
use std::time::Duration;

use muster_master::testing::TestOperator;
use muster_proto::cluster as pb;
use muster_proto::model as model_pb;
use stateright::semantics::SequentialSpec;
use tonic::Code;

use crate::record::{OpEvent, Record};

/// An operation on one job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum JobOp {
    /// Submit (or update) it with this count and task definition (0 or 1, carried in its
    /// environment).
    Submit(u32, u64),
    /// Stop it.
    Stop,
    /// Read it (linearizable).
    Read,
}

/// What an operation answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum JobRet {
    /// Stored as this version.
    Written(u64),
    /// No such job.
    NotFound,
    /// The job as read, with the task definition it holds.
    Job {
        version: u64,
        count: u32,
        stopped: bool,
        definition: u64,
    },
}

/// One job as a register: `(version, count, stopped, definition)` once submitted; every
/// write, even one that changes nothing, is a new version.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct JobRegister(Option<(u64, u32, bool, u64)>);

impl SequentialSpec for JobRegister {
    type Op = JobOp;
    type Ret = JobRet;

    fn invoke(&mut self, op: &JobOp) -> JobRet {
        match (op, self.0) {
            (JobOp::Submit(count, definition), previous) => {
                let version = previous.map_or(1, |(v, ..)| v + 1);
                self.0 = Some((version, *count, false, *definition));
                JobRet::Written(version)
            }
            (JobOp::Stop, None) | (JobOp::Read, None) => JobRet::NotFound,
            (JobOp::Stop, Some((version, count, _, definition))) => {
                self.0 = Some((version + 1, count, true, definition));
                JobRet::Written(version + 1)
            }
            (JobOp::Read, Some((version, count, stopped, definition))) => JobRet::Job {
                version,
                count,
                stopped,
                definition,
            },
        }
    }
}

/// The environment variable that carries a submission's task definition.
const DEFINITION: &str = "SIM_DEFINITION";
/// The environment variable that carries a large service submission's payload.
const PAYLOAD: &str = "SIM_PAYLOAD";
/// The one task group of every job.
pub(crate) const GROUP: &str = "main";

/// The smallest large payload.
const LARGE_MIN: usize = 200 * 1024;
/// The largest: the job with it stays under `muster_model`'s default cap of 1 MiB per job
/// (`DEFAULT_MAX_JOB_BYTES`), with room for its other fields.
const LARGE_MAX: usize = muster_model::DEFAULT_MAX_JOB_BYTES - 8 * 1024;

/// Whether `job` (`job-N`) is a batch job: every fourth one, `job-3`, `job-7`, ...
pub(crate) fn is_batch(job: &str) -> bool {
    job.strip_prefix("job-")
        .and_then(|n| n.parse::<usize>().ok())
        .is_some_and(|n| n % 4 == 3)
}

/// Whether `job` rolls its updates (`job-0`, `job-8`, ...): a service replaced one task at a
/// time, each new task running for a while before the next (see [`ROLLED_MAX_PARALLEL`]).
pub(crate) fn is_rolled(job: &str) -> bool {
    job.strip_prefix("job-")
        .and_then(|n| n.parse::<usize>().ok())
        .is_some_and(|n| n % 8 == 0)
}

/// How many tasks of a rolled job are replaced at a time.
pub(crate) const ROLLED_MAX_PARALLEL: usize = 1;

/// A rolled job's update policy: one task at a time, each running for 200 ms first; a task
/// not running within 5 s fails the deployment, which then replaces nothing more until the
/// next version.
fn rolled_update() -> model_pb::UpdatePolicy {
    model_pb::UpdatePolicy {
        max_parallel: ROLLED_MAX_PARALLEL as u32,
        min_healthy_time_ms: 200,
        healthy_deadline_ms: 5_000,
        progress_deadline_ms: 0,
        health: model_pb::HealthCriteria::TaskStates as i32,
        ..model_pb::UpdatePolicy::default()
    }
}

/// The name of slot `index` of `job`'s group.
pub(crate) fn slot(job: &str, index: u32) -> String {
    format!("{job}.{GROUP}[{index}]")
}

/// What a submission carries besides its count and task definition.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Shape {
    /// How many bytes of payload it carries (0: none).
    pub(crate) payload: usize,
}

/// How long a batch job's tasks sleep under task definition `definition`.
fn sleep_of(definition: u64) -> &'static str {
    if definition == 0 { "4" } else { "1.5" }
}

/// What becomes of job `name`'s tasks while their agent is unreachable (`None`: the job
/// type's defaults): a batch job's keep their slots (the default, so that a slot runs at most
/// once); a service's are replaced at once, and when the agent comes back while a replacement
/// runs, the copy that stays is chosen by a policy that differs by job (`job-0` the default,
/// `job-1` the original, `job-2` the replacement, `job-4` the best score, `job-5` the longest
/// running), but for `job-6`'s, which keep their slots for 3 s before they are replaced.
pub(crate) fn disconnect(name: &str) -> Option<model_pb::Disconnect> {
    use model_pb::Reconcile;
    if is_batch(name) {
        return None;
    }
    let number = name
        .strip_prefix("job-")
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(0);
    let (reconcile, kept_for_ms) = match number % 8 {
        1 => (Reconcile::KeepOriginal, None),
        2 => (Reconcile::KeepReplacement, None),
        4 => (Reconcile::BestScore, None),
        5 => (Reconcile::LongestRunning, None),
        6 => (Reconcile::Unspecified, Some(3_000)),
        _ => (Reconcile::Unspecified, None),
    };
    Some(model_pb::Disconnect {
        replace: kept_for_ms.map(|_| false),
        lost_after_ms: kept_for_ms,
        reconcile: reconcile as i32,
    })
}

/// Job `name` as a submission of `count` tasks of task definition `definition`, shaped by
/// `shape`: a service whose tasks run until stopped, or (see [`is_batch`]) a batch job whose
/// tasks sleep a while (by their definition) and finish.
pub(crate) fn job(name: &str, count: u32, definition: u64, shape: Shape) -> model_pb::Job {
    let batch = is_batch(name);
    let mut env = model_pb::TaskGroup::default().env;
    env.insert(DEFINITION.to_owned(), definition.to_string());
    let mut args = Vec::new();
    if batch {
        args.push(sleep_of(definition).to_owned());
    }
    if shape.payload > 0 {
        // Its content does not matter, only its size (which makes it a definition of its own).
        let unit = format!("{definition:016x}");
        let payload: String = unit.chars().cycle().take(shape.payload).collect();
        if batch {
            args.push(payload);
        } else {
            env.insert(PAYLOAD.to_owned(), payload);
        }
    }
    model_pb::Job {
        name: name.into(),
        scheduler: if batch {
            model_pb::SchedulerType::Batch
        } else {
            model_pb::SchedulerType::Service
        } as i32,
        groups: vec![model_pb::TaskGroup {
            name: GROUP.into(),
            count,
            resources: Some(model_pb::Resources {
                cpus: 1.0,
                mem_mb: 64,
            }),
            command: if batch { "sleep" } else { "serve" }.into(),
            args,
            env,
            disconnect: disconnect(name),
            update: is_rolled(name).then(rolled_update),
            ..model_pb::TaskGroup::default()
        }],
        ..model_pb::Job::default()
    }
}

/// How long one call may take before the client gives up on it (simulated TCP never
/// retransmits: without a deadline a call on a cut link waits forever).
const CALL_DEADLINE: Duration = Duration::from_secs(3);

/// How an operation ended.
enum Outcome {
    /// The master answered.
    Answered(JobRet),
    /// It surely did nothing (a read that failed).
    Nothing,
    /// It may or may not have taken effect (a write that failed or timed out).
    Unknown,
}

/// A client of the cluster: follows leader hints, keeps one connection per master.
pub(crate) struct Client {
    masters: Vec<String>,
    target: usize,
    connections: BTreeMap<String, TestOperator>,
    record: Record,
    /// Why the last call that failed did, for the trace.
    pub(crate) last_error: String,
}

impl Client {
    /// A client of `masters` that records into `record`.
    pub(crate) fn new(masters: Vec<String>, record: Record) -> Self {
        Client {
            masters,
            target: 0,
            connections: BTreeMap::new(),
            record,
            last_error: String::new(),
        }
    }

    async fn connection(&mut self, address: &str) -> Option<TestOperator> {
        if let Some(client) = self.connections.get(address) {
            return Some(client.clone());
        }
        let token = self.record.token()?;
        let connected = tokio::time::timeout(
            CALL_DEADLINE,
            muster_master::testing::operator(address, Some(&token)),
        )
        .await;
        match connected {
            Ok(Ok(client)) => {
                self.connections.insert(address.to_owned(), client.clone());
                Some(client)
            }
            _ => None,
        }
    }

    /// Drops the connection to `address`: a simulated TCP connection cut by a partition never
    /// errors (nothing retransmits, and these clients send no keepalives), so a call with no
    /// answer may mean a dead connection, and the next call makes a new one.
    fn forget(&mut self, address: &str) {
        self.connections.remove(address);
    }

    fn follow(&mut self, status: &tonic::Status) {
        match muster_scheduler::protocol::leader_hint(status) {
            Some(leader) => {
                // A master the client was not told of (one that joined the group) is learned
                // from the hint.
                match self.masters.iter().position(|m| *m == leader) {
                    Some(i) => self.target = i,
                    None => {
                        self.masters.push(leader);
                        self.target = self.masters.len() - 1;
                    }
                }
            }
            None => self.target = (self.target + 1) % self.masters.len(),
        }
    }

    /// Performs `op` on `job` as logical thread `thread` (a submission shaped by `shape`),
    /// recording its invocation and answer. Returns whether the thread may go on (false: the
    /// operation's effect is unknown, and the thread must be retired, as the checker allows
    /// one operation in flight per thread).
    pub(crate) async fn perform(
        &mut self,
        thread: u64,
        job: &str,
        op: JobOp,
        shape: Shape,
    ) -> bool {
        let invoked = self.record.op(OpEvent::Invoke {
            thread,
            job: job.to_owned(),
            op: op.clone(),
        });
        self.record.payload(invoked, shape.payload);
        let outcome = match op {
            JobOp::Read => self.read(job).await,
            _ => self.write(job, &op, shape).await,
        };
        match outcome {
            Outcome::Answered(ret) => {
                self.record.op(OpEvent::Return {
                    thread,
                    job: job.to_owned(),
                    ret,
                });
                true
            }
            Outcome::Nothing => {
                self.record.discard(invoked);
                true
            }
            Outcome::Unknown => {
                self.record
                    .log(format!("client {thread}: {job} {op:?} -> unknown"));
                false
            }
        }
    }

    /// Reads `job` linearizably, following leader hints, without recording it: `None` if no
    /// master answered, `Some(None)` if there is no such job.
    pub(crate) async fn status(&mut self, job: &str) -> Option<Option<pb::JobStatusReply>> {
        // A read changes nothing: following a leader hint is the same read.
        for _ in 0..self.masters.len() + 1 {
            let address = self.masters[self.target].clone();
            let Some(mut client) = self.connection(&address).await else {
                self.last_error = format!("{address}: cannot connect");
                self.target = (self.target + 1) % self.masters.len();
                continue;
            };
            let request = pb::JobStatusRequest {
                name: job.to_owned(),
                stale: false,
                namespace: String::new(),
            };
            match tokio::time::timeout(CALL_DEADLINE, client.job_status(request)).await {
                Ok(Ok(reply)) => return Some(Some(reply.into_inner())),
                Ok(Err(status)) if status.code() == Code::NotFound => return Some(None),
                Ok(Err(status)) => {
                    self.last_error = format!("{address}: {}", status.message());
                    self.follow(&status);
                }
                Err(_) => {
                    self.last_error = format!("{address}: no answer within {CALL_DEADLINE:?}");
                    self.forget(&address);
                    self.target = (self.target + 1) % self.masters.len();
                }
            }
        }
        None
    }

    /// Whether `job`'s newest deployment still runs (read linearizably, following leader
    /// hints): `None` if no master answered.
    pub(crate) async fn deploying(&mut self, job: &str) -> Option<bool> {
        for _ in 0..self.masters.len() + 1 {
            let address = self.masters[self.target].clone();
            let Some(mut client) = self.connection(&address).await else {
                self.last_error = format!("{address}: cannot connect");
                self.target = (self.target + 1) % self.masters.len();
                continue;
            };
            let request = pb::ListDeploymentsRequest {
                job: job.to_owned(),
                ..pb::ListDeploymentsRequest::default()
            };
            match tokio::time::timeout(CALL_DEADLINE, client.list_deployments(request)).await {
                Ok(Ok(reply)) => {
                    let running = |d: &model_pb::Deployment| {
                        matches!(
                            model_pb::DeploymentStatus::try_from(d.status),
                            Ok(model_pb::DeploymentStatus::Running
                                | model_pb::DeploymentStatus::Paused)
                        )
                    };
                    return Some(reply.into_inner().deployments.first().is_some_and(running));
                }
                Ok(Err(status)) => {
                    self.last_error = format!("{address}: {}", status.message());
                    self.follow(&status);
                }
                Err(_) => {
                    self.last_error = format!("{address}: no answer within {CALL_DEADLINE:?}");
                    self.forget(&address);
                    self.target = (self.target + 1) % self.masters.len();
                }
            }
        }
        None
    }

    /// Reads `job` as logical thread `thread`, recorded for the checker; `None` if no
    /// master answered (then nothing is recorded).
    pub(crate) async fn perform_read(&mut self, thread: u64, job: &str) -> Option<JobRet> {
        let invoked = self.record.op(OpEvent::Invoke {
            thread,
            job: job.to_owned(),
            op: JobOp::Read,
        });
        match self.read(job).await {
            Outcome::Answered(ret) => {
                self.record.op(OpEvent::Return {
                    thread,
                    job: job.to_owned(),
                    ret: ret.clone(),
                });
                Some(ret)
            }
            _ => {
                self.record.discard(invoked);
                None
            }
        }
    }

    async fn read(&mut self, job: &str) -> Outcome {
        match self.status(job).await {
            None => Outcome::Nothing,
            Some(None) => Outcome::Answered(JobRet::NotFound),
            Some(Some(reply)) => {
                let group = reply.job.as_ref().and_then(|j| j.groups.first());
                Outcome::Answered(JobRet::Job {
                    version: reply.version,
                    count: group.map_or(0, |g| g.count),
                    stopped: reply.stopped,
                    definition: group
                        .and_then(|g| g.env.get(DEFINITION))
                        .and_then(|t| t.parse().ok())
                        .unwrap_or(0),
                })
            }
        }
    }

    async fn write(&mut self, job: &str, op: &JobOp, shape: Shape) -> Outcome {
        let address = self.masters[self.target].clone();
        let Some(mut client) = self.connection(&address).await else {
            self.target = (self.target + 1) % self.masters.len();
            return Outcome::Nothing;
        };
        let call = async {
            match op {
                JobOp::Submit(count, definition) => {
                    let request = pb::SubmitJobRequest {
                        job: Some(self::job(job, *count, *definition, shape)),
                    };
                    client.submit_job(request).await
                }
                _ => {
                    let request = pb::StopJobRequest {
                        name: job.to_owned(),
                        namespace: String::new(),
                    };
                    client.stop_job(request).await
                }
            }
        };
        match tokio::time::timeout(CALL_DEADLINE, call).await {
            Ok(Ok(reply)) => Outcome::Answered(JobRet::Written(reply.into_inner().version)),
            Ok(Err(status)) if status.code() == Code::NotFound => {
                Outcome::Answered(JobRet::NotFound)
            }
            Ok(Err(status)) => {
                // A refusal may come after the entry reached the log (a leader deposed
                // while it waited): its effect is unknown.
                self.follow(&status);
                Outcome::Unknown
            }
            Err(_) => {
                self.forget(&address);
                self.target = (self.target + 1) % self.masters.len();
                Outcome::Unknown
            }
        }
    }
}

/// A workload client: random operations on `jobs` jobs until `until`, as logical threads
/// `first_thread`, `first_thread + 1`, ... (a new one after each unknown outcome).
pub(crate) async fn run(
    mut client: Client,
    seed: u64,
    jobs: usize,
    first_thread: u64,
    until: Duration,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut thread = first_thread;
    while client.record.token().is_none() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    while crate::record::now() < until {
        let job = format!("job-{}", rng.usize(..jobs));
        let mut shape = Shape::default();
        let op = match rng.u32(..10) {
            0..=3 => JobOp::Read,
            4..=8 => {
                if client.record.large_entries() && rng.bool() {
                    shape.payload = rng.usize(LARGE_MIN..=LARGE_MAX);
                }
                // Mostly the first definition: most submissions keep the job's.
                let definition = u64::from(rng.u32(..4) == 0);
                JobOp::Submit(rng.u32(1..=3), definition)
            }
            _ => JobOp::Stop,
        };
        if !client.perform(thread, &job, op, shape).await {
            thread += 1;
        }
        tokio::time::sleep(Duration::from_millis(rng.u64(100..1_000))).await;
    }
    Ok(())
}

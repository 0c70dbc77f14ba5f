//! The clients: operations on jobs through the operator API, as a real client makes them, and
//! the sequential specification the linearizability checker holds them to.

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
    /// Submit (or update) it with this count; the tag (unique to the operation) travels in
    /// its environment, so that a read says which write it saw.
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
    /// The job as read, with the tag of the submission it holds.
    Job {
        version: u64,
        count: u32,
        stopped: bool,
        tag: u64,
    },
}

/// One job as a register: `(version, count, stopped, tag)` once submitted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct JobRegister(Option<(u64, u32, bool, u64)>);

impl SequentialSpec for JobRegister {
    type Op = JobOp;
    type Ret = JobRet;

    fn invoke(&mut self, op: &JobOp) -> JobRet {
        match (op, self.0) {
            (JobOp::Submit(count, tag), previous) => {
                let version = previous.map_or(1, |(v, ..)| v + 1);
                self.0 = Some((version, *count, false, *tag));
                JobRet::Written(version)
            }
            (JobOp::Stop, None) | (JobOp::Read, None) => JobRet::NotFound,
            (JobOp::Stop, Some((version, count, _, tag))) => {
                self.0 = Some((version + 1, count, true, tag));
                JobRet::Written(version + 1)
            }
            (JobOp::Read, Some((version, count, stopped, tag))) => JobRet::Job {
                version,
                count,
                stopped,
                tag,
            },
        }
    }
}

/// The environment variable that carries a submission's tag.
const TAG: &str = "SIM_TAG";

/// A service job of `count` tasks that run until stopped, tagged `tag`.
pub(crate) fn service_job(name: &str, count: u32, tag: u64) -> model_pb::Job {
    model_pb::Job {
        name: name.into(),
        scheduler: model_pb::SchedulerType::Service as i32,
        groups: vec![model_pb::TaskGroup {
            name: "main".into(),
            count,
            resources: Some(model_pb::Resources {
                cpus: 1.0,
                mem_mb: 64,
            }),
            command: "serve".into(),
            env: [(TAG.to_owned(), tag.to_string())].into(),
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
                if let Some(i) = self.masters.iter().position(|m| *m == leader) {
                    self.target = i;
                }
            }
            None => self.target = (self.target + 1) % self.masters.len(),
        }
    }

    /// Performs `op` on `job` as logical thread `thread`, recording its invocation and answer.
    /// Returns whether the thread may go on (false: the operation's effect is unknown, and
    /// the thread must be retired, as the checker allows one operation in flight per thread).
    pub(crate) async fn perform(&mut self, thread: u64, job: &str, op: JobOp) -> bool {
        let invoked = self.record.op(OpEvent::Invoke {
            thread,
            job: job.to_owned(),
            op: op.clone(),
        });
        let outcome = match op {
            JobOp::Read => self.read(job).await,
            _ => self.write(job, &op).await,
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
                    tag: group
                        .and_then(|g| g.env.get(TAG))
                        .and_then(|t| t.parse().ok())
                        .unwrap_or(0),
                })
            }
        }
    }

    async fn write(&mut self, job: &str, op: &JobOp) -> Outcome {
        let address = self.masters[self.target].clone();
        let Some(mut client) = self.connection(&address).await else {
            self.target = (self.target + 1) % self.masters.len();
            return Outcome::Nothing;
        };
        let call = async {
            match op {
                JobOp::Submit(count, tag) => {
                    let request = pb::SubmitJobRequest {
                        job: Some(service_job(job, *count, *tag)),
                    };
                    client.submit_job(request).await
                }
                _ => {
                    let request = pb::StopJobRequest {
                        name: job.to_owned(),
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
    let mut tags = first_thread * 1_000;
    while client.record.token().is_none() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    while crate::record::now() < until {
        let job = format!("job-{}", rng.usize(..jobs));
        let op = match rng.u32(..10) {
            0..=3 => JobOp::Read,
            4..=8 => {
                tags += 1;
                JobOp::Submit(rng.u32(1..=3), tags)
            }
            _ => JobOp::Stop,
        };
        if !client.perform(thread, &job, op).await {
            thread += 1;
        }
        tokio::time::sleep(Duration::from_millis(rng.u64(100..1_000))).await;
    }
    Ok(())
}

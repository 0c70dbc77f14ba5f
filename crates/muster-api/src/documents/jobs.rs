//! The documents of jobs: lists, details, submissions, versions and plans.

use muster_proto::cluster as cluster_pb;
use muster_proto::model as model_pb;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{DeploymentInfo, EvaluationInfo, ReadInfo, TaskInfo};
use crate::job_spec::{JobSpec, planned_by, scheduler_name};

/// Tasks counted by state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TaskCounts {
    /// Placed, not yet started by the agent.
    pub staging: u64,
    /// Being started.
    pub starting: u64,
    /// Running.
    pub running: u64,
    /// Ended with exit code 0.
    pub finished: u64,
    /// Ended otherwise, or could not start.
    pub failed: u64,
    /// Stopped on request.
    pub killed: u64,
    /// On an agent that was lost.
    pub lost: u64,
    /// On an agent marked unreachable: they may still run there.
    #[serde(default)]
    pub unknown: u64,
}

/// One job of a list: what it asks for and how its tasks stand.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct JobSummary {
    /// Its name, unique in its namespace.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
    /// `service`, `batch` or `system`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The scheduler that plans it: the one it names (`gang`), or its type's built-in one.
    pub scheduler: String,
    /// Its priority.
    pub priority: u32,
    /// Its current version.
    pub version: u64,
    /// Whether it was stopped.
    pub stopped: bool,
    /// The tasks it asks for (a system job: per agent).
    pub desired: u64,
    /// Its tasks by state, as the answering master knows them (a standby knows none).
    pub tasks: TaskCounts,
    /// Its evaluations pending or blocked.
    pub evaluations_in_flight: u64,
    /// Where it is, as Nomad says it: `pending` (nothing runs yet), `running`, `complete` (a
    /// batch job whose every task finished), or `dead` (stopped). See [`job_status`].
    pub status: String,
}

/// A job's status in one word, from its summary, as Nomad's: `dead` once stopped; `complete`
/// for a batch job with nothing live, nothing to evaluate and at least as many tasks finished
/// as it asks for; `running` while a task runs (or is unknown on an agent that is away);
/// `pending` otherwise (placing, starting, or waiting for room).
pub fn job_status(summary: &cluster_pb::JobSummary) -> &'static str {
    let live = summary.staging + summary.starting + summary.running + summary.unknown;
    let batch = summary.scheduler == model_pb::SchedulerType::Batch as i32;
    if summary.stopped {
        "dead"
    } else if batch
        && live == 0
        && summary.evals_in_flight == 0
        && summary.finished >= summary.desired
    {
        "complete"
    } else if summary.running + summary.unknown > 0 {
        "running"
    } else {
        "pending"
    }
}

/// `GET /v1/jobs`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct JobList {
    /// By name.
    pub jobs: Vec<JobSummary>,
    /// How the read was answered.
    pub read: ReadInfo,
}

impl From<cluster_pb::JobList> for JobList {
    fn from(list: cluster_pb::JobList) -> Self {
        JobList {
            jobs: list
                .jobs
                .into_iter()
                .map(|j| JobSummary {
                    status: job_status(&j).to_owned(),
                    namespace: super::namespace_and_job(j.namespace, String::new()).0,
                    name: j.name,
                    kind: scheduler_name(j.scheduler).to_owned(),
                    scheduler: planned_by(j.scheduler, &j.scheduler_name),
                    priority: j.priority,
                    version: j.version,
                    stopped: j.stopped,
                    desired: j.desired,
                    tasks: TaskCounts {
                        staging: j.staging,
                        starting: j.starting,
                        running: j.running,
                        finished: j.finished,
                        failed: j.failed,
                        killed: j.killed,
                        lost: j.lost,
                        unknown: j.unknown,
                    },
                    evaluations_in_flight: j.evals_in_flight,
                })
                .collect(),
            read: list.read.into(),
        }
    }
}

/// `GET /v1/job/{name}`: the job as submitted, its tasks, its evaluations and its latest
/// deployment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JobDetail {
    /// The job document of its current version.
    pub job: JobSpec,
    /// Its current version.
    pub version: u64,
    /// Whether it was stopped.
    pub stopped: bool,
    /// Its tasks, with their agents (a standby knows none).
    pub tasks: Vec<TaskInfo>,
    /// Its evaluations.
    pub evaluations: Vec<EvaluationInfo>,
    /// Its newest deployment, if it has one (a version of a job with an update policy). Not
    /// part of the `JobStatus` reply: whoever builds the document from one fills it in
    /// (`GET /v1/job/{name}` and `muster job status` do).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment: Option<DeploymentInfo>,
    /// How the read was answered.
    pub read: ReadInfo,
}

impl From<cluster_pb::JobStatusReply> for JobDetail {
    fn from(reply: cluster_pb::JobStatusReply) -> Self {
        let job = reply.job.unwrap_or_default();
        JobDetail {
            job: JobSpec::from_proto(&job),
            version: reply.version,
            stopped: reply.stopped,
            tasks: reply
                .tasks
                .into_iter()
                .filter_map(|t| t.task.map(|task| TaskInfo::new(&t.agent_id, task)))
                .collect(),
            evaluations: reply.evals.into_iter().map(EvaluationInfo::from).collect(),
            deployment: None,
            read: reply.read.into(),
        }
    }
}

/// What a submission or a stop made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Submitted {
    /// The evaluation created for the change.
    pub eval_id: String,
    /// The job's version after the change.
    pub version: u64,
}

impl From<cluster_pb::SubmitJobReply> for Submitted {
    fn from(reply: cluster_pb::SubmitJobReply) -> Self {
        Submitted {
            eval_id: reply.eval_id,
            version: reply.version,
        }
    }
}

/// One version of a job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JobVersion {
    /// Its version number.
    pub version: u64,
    /// Whether this version stopped the job.
    pub stopped: bool,
    /// The job document of that version.
    pub job: JobSpec,
}

/// `GET /v1/job/{name}/versions`: the current version and the earlier ones kept, newest first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JobVersions {
    /// Newest first.
    pub versions: Vec<JobVersion>,
    /// How the read was answered.
    pub read: ReadInfo,
}

impl From<cluster_pb::JobVersionList> for JobVersions {
    fn from(list: cluster_pb::JobVersionList) -> Self {
        JobVersions {
            versions: list
                .versions
                .iter()
                .map(|job| JobVersion {
                    version: job.version,
                    stopped: job.stopped,
                    job: JobSpec::from_proto(job),
                })
                .collect(),
            read: list.read.into(),
        }
    }
}

/// A task a plan would start or stop.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PlannedTask {
    /// Its slot (`web.frontend[0]`).
    pub name: String,
    /// The agent.
    pub agent_id: String,
    /// The task's id (stops only).
    pub task_id: String,
}

/// `POST /v1/job/{name}/plan`: what submitting the job would do now (Nomad's job plan).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct JobPlan {
    /// The version the job would get.
    pub version: u64,
    /// Tasks that would start.
    pub place: Vec<PlannedTask>,
    /// Tasks that would stop.
    pub stop: Vec<PlannedTask>,
    /// Slots whose task would be replaced (its definition changed).
    pub replaced: Vec<String>,
    /// What would not fit, one line per task group left short.
    pub unplaced: Vec<String>,
    /// Tasks of lower-priority jobs that would be stopped to make room.
    pub preempt: Vec<PlannedTask>,
}

impl From<cluster_pb::JobPlan> for JobPlan {
    fn from(plan: cluster_pb::JobPlan) -> Self {
        let task = |t: cluster_pb::PlannedTask| PlannedTask {
            name: t.name,
            agent_id: t.agent_id,
            task_id: t.task_id,
        };
        JobPlan {
            version: plan.version,
            place: plan.place.into_iter().map(task).collect(),
            stop: plan.stop.into_iter().map(task).collect(),
            replaced: plan.replaced,
            unplaced: plan.unplaced,
            preempt: plan.preempt.into_iter().map(task).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jobs_status_follows_nomads_words() {
        let batch = |finished, running, evals| cluster_pb::JobSummary {
            scheduler: model_pb::SchedulerType::Batch as i32,
            desired: 3,
            finished,
            running,
            evals_in_flight: evals,
            ..cluster_pb::JobSummary::default()
        };
        assert_eq!(job_status(&batch(0, 0, 1)), "pending");
        assert_eq!(job_status(&batch(1, 2, 0)), "running");
        assert_eq!(job_status(&batch(3, 0, 0)), "complete");
        assert_eq!(
            job_status(&batch(3, 0, 1)),
            "pending",
            "still being evaluated"
        );
        let service = cluster_pb::JobSummary {
            scheduler: model_pb::SchedulerType::Service as i32,
            desired: 2,
            finished: 2,
            ..cluster_pb::JobSummary::default()
        };
        assert_eq!(
            job_status(&service),
            "pending",
            "a service is never complete"
        );
        let stopped = cluster_pb::JobSummary {
            stopped: true,
            running: 1,
            ..service
        };
        assert_eq!(job_status(&stopped), "dead");
    }
}

//! The operator API: gRPC on the master's port, answered by the master process.
//!
//! `GetMetrics` answers on every master. Reads (`GetState`, `JobStatus`, `ListJobs`,
//! `ListEvaluations`) are linearizable by
//! default: only the leader answers, once a quorum has confirmed it still leads; with
//! `stale: true` any master answers from its own state, and the reply's `read` says how far
//! behind it may be. The other calls are leader-only. A standby answers leader-only calls as
//! [`leader_hint`](crate::leader_hint) describes. Every failure maps to its status through
//! [`ServiceError`].
//!
//! Who may call what is declared once, in [`authorization`](crate::authorization), and checked
//! by the guard before a call reaches this service. A caller whose token does not grant
//! reading secrets (policy `read`, `operate`) gets every environment value redacted.

use muster_actor::Pid;
use muster_proto::cluster as pb;
use muster_proto::cluster::operator_server::{Operator, OperatorServer};
use tonic::{Request, Response, Status};

use muster_proto::model as model_pb;
use muster_security::{Caller, Permission};

use crate::error::ServiceError;
use crate::master::requests::{
    BootstrapAcl, CreateToken, DeleteToken, DrainAgent, GetMetrics, JobStatus, JobVersions,
    LaunchTask, ListEvaluations, ListJobs, ListTokens, PlanJob, ReadState, SetAgentEligibility,
    SnapshotRestore, SnapshotSave, StopJob, SubmitJob, SubscribeEvents, TaskLogs,
};
use crate::master::{EventFeed, Master};

pub use muster_api::REDACTED;

/// Whether the call's caller may read environment values (true without the guard: an
/// in-process call, or an insecure cluster's caller).
fn reveals_env<T>(request: &Request<T>) -> bool {
    request
        .extensions()
        .get::<Caller>()
        .is_none_or(|caller| caller.may(Permission::ReadSecrets))
}

fn redact_task(task: &mut model_pb::Task) {
    for value in task.env.values_mut() {
        REDACTED.clone_into(value);
    }
}

fn redact_job(job: &mut model_pb::Job) {
    for group in &mut job.groups {
        for value in group.env.values_mut() {
            REDACTED.clone_into(value);
        }
    }
}

/// The wire form of an event.
fn event_message(event: &muster_api::Event) -> pb::EventMessage {
    pb::EventMessage {
        index: event.index,
        term: event.term,
        time_ms: event.time_ms,
        topic: event.topic.clone(),
        kind: event.kind.clone(),
        key: event.key.clone(),
        payload_json: event.payload.to_string(),
    }
}

/// The tonic service; each call is an ask to the master process.
#[derive(Clone, Debug)]
pub struct OperatorService {
    master: Pid<Master>,
}

/// The largest operator request or answer: a registry snapshot travels whole, and a restore
/// goes through raft as one entry, so this is raft's own limit.
pub const MAX_OPERATOR_MESSAGE: usize = muster_registry::types::MAX_RAFT_MESSAGE;

impl OperatorService {
    /// Answers for `master`.
    pub fn new(master: Pid<Master>) -> Self {
        OperatorService { master }
    }

    /// The service, ready to add to a tonic server. Messages up to
    /// [`MAX_OPERATOR_MESSAGE`] each way: a registry snapshot is the largest.
    pub fn into_server(self) -> OperatorServer<OperatorService> {
        OperatorServer::new(self)
            .max_decoding_message_size(MAX_OPERATOR_MESSAGE)
            .max_encoding_message_size(MAX_OPERATOR_MESSAGE)
    }
}

#[tonic::async_trait]
impl Operator for OperatorService {
    async fn get_state(
        &self,
        request: Request<pb::GetStateRequest>,
    ) -> Result<Response<pb::ClusterState>, Status> {
        let stale = request.get_ref().stale;
        let mut state = self
            .master
            .ask(|reply| ReadState { stale, reply }.into())
            .await
            .map_err(ServiceError::from)??;
        if !reveals_env(&request) {
            for agent in &mut state.agents {
                agent
                    .tasks
                    .iter_mut()
                    .chain(agent.completed_tasks.iter_mut())
                    .for_each(redact_task);
            }
        }
        Ok(Response::new(state))
    }

    async fn get_metrics(
        &self,
        _request: Request<pb::GetMetricsRequest>,
    ) -> Result<Response<pb::MasterMetrics>, Status> {
        let metrics = self
            .master
            .ask(|reply| GetMetrics { reply }.into())
            .await
            .map_err(ServiceError::from)?;
        Ok(Response::new(metrics))
    }

    async fn launch_task(
        &self,
        request: Request<pb::LaunchTaskRequest>,
    ) -> Result<Response<pb::LaunchTaskReply>, Status> {
        let request = Box::new(request.into_inner());
        self.master
            .ask(|reply| LaunchTask { request, reply }.into())
            .await
            .map_err(ServiceError::from)??;
        Ok(Response::new(pb::LaunchTaskReply {}))
    }

    async fn submit_job(
        &self,
        request: Request<pb::SubmitJobRequest>,
    ) -> Result<Response<pb::SubmitJobReply>, Status> {
        let spec = request.into_inner().job;
        let reply = self
            .master
            .ask(|reply| SubmitJob { job: spec, reply }.into())
            .await
            .map_err(ServiceError::from)??;
        Ok(Response::new(reply))
    }

    async fn stop_job(
        &self,
        request: Request<pb::StopJobRequest>,
    ) -> Result<Response<pb::SubmitJobReply>, Status> {
        let name = request.into_inner().name;
        let reply = self
            .master
            .ask(|reply| StopJob { name, reply }.into())
            .await
            .map_err(ServiceError::from)??;
        Ok(Response::new(reply))
    }

    async fn drain_agent(
        &self,
        request: Request<pb::DrainAgentRequest>,
    ) -> Result<Response<pb::AgentSchedulingReply>, Status> {
        let request = request.into_inner();
        let reply = self
            .master
            .ask(|reply| DrainAgent { request, reply }.into())
            .await
            .map_err(ServiceError::from)??;
        Ok(Response::new(reply))
    }

    async fn set_agent_eligibility(
        &self,
        request: Request<pb::AgentEligibilityRequest>,
    ) -> Result<Response<pb::AgentSchedulingReply>, Status> {
        let request = request.into_inner();
        let reply = self
            .master
            .ask(|reply| SetAgentEligibility { request, reply }.into())
            .await
            .map_err(ServiceError::from)??;
        Ok(Response::new(reply))
    }

    async fn job_status(
        &self,
        request: Request<pb::JobStatusRequest>,
    ) -> Result<Response<pb::JobStatusReply>, Status> {
        let reveal = reveals_env(&request);
        let pb::JobStatusRequest { name, stale } = request.into_inner();
        let mut reply = self
            .master
            .ask(|reply| JobStatus { name, stale, reply }.into())
            .await
            .map_err(ServiceError::from)??;
        if !reveal {
            reply.job.iter_mut().for_each(redact_job);
            reply
                .tasks
                .iter_mut()
                .filter_map(|t| t.task.as_mut())
                .for_each(redact_task);
        }
        Ok(Response::new(reply))
    }

    async fn list_jobs(
        &self,
        request: Request<pb::ListJobsRequest>,
    ) -> Result<Response<pb::JobList>, Status> {
        let request = request.into_inner();
        let reply = self
            .master
            .ask(|reply| ListJobs { request, reply }.into())
            .await
            .map_err(ServiceError::from)??;
        Ok(Response::new(reply))
    }

    async fn list_evaluations(
        &self,
        request: Request<pb::ListEvaluationsRequest>,
    ) -> Result<Response<pb::EvaluationList>, Status> {
        let request = request.into_inner();
        let reply = self
            .master
            .ask(|reply| ListEvaluations { request, reply }.into())
            .await
            .map_err(ServiceError::from)??;
        Ok(Response::new(reply))
    }

    type StreamEventsStream = std::pin::Pin<
        Box<dyn futures_util::Stream<Item = Result<pb::EventMessage, Status>> + Send + 'static>,
    >;

    async fn stream_events(
        &self,
        request: Request<pb::StreamEventsRequest>,
    ) -> Result<Response<Self::StreamEventsStream>, Status> {
        let reveal = reveals_env(&request);
        let pb::StreamEventsRequest { index, topics } = request.into_inner();
        let subscription = self
            .master
            .ask(|reply| {
                SubscribeEvents {
                    after: index,
                    reply,
                }
                .into()
            })
            .await
            .map_err(ServiceError::from)??;
        let feed = EventFeed::new(subscription, index, topics, reveal);
        let stream = futures_util::stream::unfold(Some(feed), |feed| async move {
            let mut feed = feed?;
            match feed.next().await? {
                Ok(event) => Some((Ok(event_message(&event)), Some(feed))),
                // The stream ends after saying where to resume.
                Err(lagged) => Some((
                    Err(Status::resource_exhausted(format!(
                        "this reader fell {} events behind; resume with index {}",
                        lagged.missed, lagged.resume_after
                    ))),
                    None,
                )),
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn plan_job(
        &self,
        request: Request<pb::SubmitJobRequest>,
    ) -> Result<Response<pb::JobPlan>, Status> {
        let job = request.into_inner().job;
        let plan = self
            .master
            .ask(|reply| PlanJob { job, reply }.into())
            .await
            .map_err(ServiceError::from)??;
        Ok(Response::new(plan))
    }

    async fn job_versions(
        &self,
        request: Request<pb::JobStatusRequest>,
    ) -> Result<Response<pb::JobVersionList>, Status> {
        let reveal = reveals_env(&request);
        let pb::JobStatusRequest { name, stale } = request.into_inner();
        let mut list = self
            .master
            .ask(|reply| JobVersions { name, stale, reply }.into())
            .await
            .map_err(ServiceError::from)??;
        if !reveal {
            list.versions.iter_mut().for_each(redact_job);
        }
        Ok(Response::new(list))
    }

    async fn task_logs(
        &self,
        request: Request<pb::ReadTaskOutput>,
    ) -> Result<Response<pb::TaskOutputChunk>, Status> {
        let request = request.into_inner();
        let chunk = self
            .master
            .ask(|reply| TaskLogs { request, reply }.into())
            .await
            .map_err(ServiceError::from)??;
        Ok(Response::new(chunk))
    }

    async fn acl_bootstrap(
        &self,
        _request: Request<pb::AclBootstrapRequest>,
    ) -> Result<Response<pb::AclTokenSecret>, Status> {
        let token = self
            .master
            .ask(|reply| BootstrapAcl { reply }.into())
            .await
            .map_err(ServiceError::from)??;
        Ok(Response::new(token))
    }

    async fn create_token(
        &self,
        request: Request<pb::CreateTokenRequest>,
    ) -> Result<Response<pb::AclTokenSecret>, Status> {
        let pb::CreateTokenRequest { name, policy } = request.into_inner();
        let token = self
            .master
            .ask(|reply| {
                CreateToken {
                    name,
                    policy,
                    reply,
                }
                .into()
            })
            .await
            .map_err(ServiceError::from)??;
        Ok(Response::new(token))
    }

    async fn list_tokens(
        &self,
        _request: Request<pb::ListTokensRequest>,
    ) -> Result<Response<pb::TokenList>, Status> {
        let tokens = self
            .master
            .ask(|reply| ListTokens { reply }.into())
            .await
            .map_err(ServiceError::from)??;
        Ok(Response::new(tokens))
    }

    async fn delete_token(
        &self,
        request: Request<pb::DeleteTokenRequest>,
    ) -> Result<Response<pb::DeleteTokenReply>, Status> {
        let accessor = request.into_inner().accessor;
        let reply = self
            .master
            .ask(|reply| DeleteToken { accessor, reply }.into())
            .await
            .map_err(ServiceError::from)??;
        Ok(Response::new(reply))
    }

    async fn snapshot_save(
        &self,
        _request: Request<pb::SnapshotSaveRequest>,
    ) -> Result<Response<pb::RegistrySnapshot>, Status> {
        let data = self
            .master
            .ask(|reply| SnapshotSave { reply }.into())
            .await
            .map_err(ServiceError::from)??;
        Ok(Response::new(pb::RegistrySnapshot { data: data.into() }))
    }

    async fn snapshot_restore(
        &self,
        request: Request<pb::RegistrySnapshot>,
    ) -> Result<Response<pb::SnapshotRestoreReply>, Status> {
        let data = request.into_inner().data;
        let reply = self
            .master
            .ask(|reply| SnapshotRestore { file: data, reply }.into())
            .await
            .map_err(ServiceError::from)??;
        Ok(Response::new(reply))
    }
}

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
//! by the guard before a call reaches this service; each call then checks the namespace it
//! touches, and every answer keeps only what the caller may read, with environment values
//! redacted where it may not read secrets ([`visibility`](crate::visibility)).

use muster_actor::Pid;
use muster_model::namespace::{check_namespace, namespace_of};
use muster_proto::cluster as pb;
use muster_proto::cluster::operator_server::{Operator, OperatorServer};
use muster_registry::{Op, RegistryNode, StoredPolicy};
use muster_security::{Capability, Policy, TokenType};
use tonic::{Request, Response, Status};

use crate::error::ServiceError;
use crate::master::requests::{
    AgentLink, BootstrapAcl, ChangeAccess, ChangeDeployment, CreateToken, DeleteToken, DrainAgent,
    GetMetrics, JobStatus, JobVersions, LaunchTask, ListDeployments, ListEvaluations, ListJobs,
    ListNamespaces, ListPolicies, ListTokens, PlanJob, ReadState, SetAgentEligibility,
    SnapshotRestore, SnapshotSave, StopJob, SubmitJob, SubscribeEvents, TaskLogs,
};
use crate::master::{EventFeed, Master};
use crate::raft_peers;
use crate::visibility::{
    NamespaceFilter, caller_of, job_in, namespace_or_default, require, show_job_status,
    show_job_versions, show_state, task_namespace,
};

pub use muster_api::REDACTED;

/// The namespace a submitted job names (empty: `default`).
fn job_namespace(job: Option<&muster_proto::model::Job>) -> &str {
    namespace_or_default(job.map_or("", |job| job.namespace.as_str()))
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
        namespace: event.namespace.clone().unwrap_or_default(),
    }
}

/// The tonic service; each call is an ask to the master process.
#[derive(Clone, Debug)]
pub struct OperatorService {
    master: Pid<Master>,
    registry: RegistryNode,
}

/// The largest operator request or answer: a registry snapshot travels whole, and a restore
/// goes through raft as one entry, so this is raft's own limit.
pub const MAX_OPERATOR_MESSAGE: usize = muster_registry::types::MAX_RAFT_MESSAGE;

impl OperatorService {
    /// Answers for `master`, whose registry member is `registry` (the raft group's calls go
    /// to it directly).
    pub fn new(master: Pid<Master>, registry: RegistryNode) -> Self {
        OperatorService { master, registry }
    }

    /// This master's registry member.
    pub(crate) fn registry(&self) -> &RegistryNode {
        &self.registry
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
        let caller = caller_of(&request);
        let stale = request.get_ref().stale;
        let mut state = self
            .master
            .ask(|reply| ReadState { stale, reply }.into())
            .await
            .map_err(ServiceError::from)??;
        show_state(&caller, &mut state);
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
        let caller = caller_of(&request);
        let request = Box::new(request.into_inner());
        // A task launched by hand lives in its framework's namespace: its id, and its job if
        // it names one, must say so (reads and logs decide by them).
        let namespace = namespace_of(request.framework.as_ref().map_or("", |f| f.id.as_str()));
        require(&caller, Capability::DispatchJob, namespace)?;
        if let Some(task) = &request.task {
            let task_namespace = task_namespace(task);
            if task_namespace != namespace || namespace_of(&task.id) != namespace {
                return Err(Status::invalid_argument(format!(
                    "task {:?} is in namespace {task_namespace:?}, its framework in \
                     {namespace:?}; a task launched by hand is named for its framework's \
                     namespace (`{namespace}:...` outside default)",
                    task.id
                )));
            }
        }
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
        let caller = caller_of(&request);
        let spec = request.into_inner().job;
        require(&caller, Capability::SubmitJob, job_namespace(spec.as_ref()))?;
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
        let caller = caller_of(&request);
        let pb::StopJobRequest { name, namespace } = request.into_inner();
        let namespace = namespace_or_default(&namespace);
        require(&caller, Capability::StopJob, namespace)?;
        let name = job_in(namespace, &name)?;
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
        let caller = caller_of(&request);
        let pb::JobStatusRequest {
            name,
            stale,
            namespace,
        } = request.into_inner();
        let namespace = namespace_or_default(&namespace).to_owned();
        require(&caller, Capability::ReadJob, &namespace)?;
        let name = job_in(&namespace, &name)?;
        let mut reply = self
            .master
            .ask(|reply| JobStatus { name, stale, reply }.into())
            .await
            .map_err(ServiceError::from)??;
        show_job_status(&caller, &namespace, &mut reply);
        Ok(Response::new(reply))
    }

    async fn list_jobs(
        &self,
        request: Request<pb::ListJobsRequest>,
    ) -> Result<Response<pb::JobList>, Status> {
        let caller = caller_of(&request);
        let request = request.into_inner();
        let namespaces = NamespaceFilter::for_request(&caller, &request.namespace)?;
        let reply = self
            .master
            .ask(|reply| {
                ListJobs {
                    request,
                    namespaces,
                    reply,
                }
                .into()
            })
            .await
            .map_err(ServiceError::from)??;
        Ok(Response::new(reply))
    }

    async fn list_evaluations(
        &self,
        request: Request<pb::ListEvaluationsRequest>,
    ) -> Result<Response<pb::EvaluationList>, Status> {
        let caller = caller_of(&request);
        let request = request.into_inner();
        let namespaces = NamespaceFilter::for_request(&caller, &request.namespace)?;
        let reply = self
            .master
            .ask(|reply| {
                ListEvaluations {
                    request,
                    namespaces,
                    reply,
                }
                .into()
            })
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
        let caller = caller_of(&request);
        let pb::StreamEventsRequest {
            index,
            topics,
            namespace,
        } = request.into_inner();
        let namespaces = match namespace.as_str() {
            "" => NamespaceFilter::for_request(&caller, "*")?,
            named => NamespaceFilter::for_request(&caller, named)?,
        };
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
        let feed = EventFeed::new(subscription, index, topics, caller, namespaces);
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
        let caller = caller_of(&request);
        let job = request.into_inner().job;
        require(&caller, Capability::ReadJob, job_namespace(job.as_ref()))?;
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
        let caller = caller_of(&request);
        let pb::JobStatusRequest {
            name,
            stale,
            namespace,
        } = request.into_inner();
        let namespace = namespace_or_default(&namespace).to_owned();
        require(&caller, Capability::ReadJob, &namespace)?;
        let name = job_in(&namespace, &name)?;
        let mut list = self
            .master
            .ask(|reply| JobVersions { name, stale, reply }.into())
            .await
            .map_err(ServiceError::from)??;
        show_job_versions(&caller, &namespace, &mut list);
        Ok(Response::new(list))
    }

    async fn list_deployments(
        &self,
        request: Request<pb::ListDeploymentsRequest>,
    ) -> Result<Response<pb::DeploymentList>, Status> {
        let caller = caller_of(&request);
        let pb::ListDeploymentsRequest {
            namespace,
            job,
            id,
            stale,
        } = request.into_inner();
        let namespaces = NamespaceFilter::for_request(&caller, &namespace)?;
        let named = |name: &str| {
            if namespace == "*" {
                return Err(Status::invalid_argument(
                    "name the job's namespace, not `*`, to list one job's deployments",
                ));
            }
            let namespace = namespace_or_default(&namespace);
            require(&caller, Capability::ReadJob, namespace)?;
            job_in(namespace, name)
        };
        let (job, id) = match (job.is_empty(), id.is_empty()) {
            (true, true) => (None, None),
            (false, true) => (Some(named(&job)?), None),
            (_, false) => {
                let id = named(&id)?;
                let job = id.rsplit_once(".v").map(|(job, _)| job.to_owned());
                (job, Some(id))
            }
        };
        let list = self
            .master
            .ask(|reply| {
                ListDeployments {
                    job,
                    namespaces,
                    id,
                    stale,
                    reply,
                }
                .into()
            })
            .await
            .map_err(ServiceError::from)??;
        Ok(Response::new(list))
    }

    async fn change_deployment(
        &self,
        request: Request<pb::ChangeDeploymentRequest>,
    ) -> Result<Response<pb::ChangeDeploymentReply>, Status> {
        let caller = caller_of(&request);
        let request = request.into_inner();
        let action = pb::DeploymentAction::try_from(request.action).map_err(|_| {
            Status::invalid_argument(format!(
                "action: {} is not promote, pause, resume or fail",
                request.action
            ))
        })?;
        let namespace = namespace_or_default(&request.namespace).to_owned();
        require(&caller, Capability::SubmitJob, &namespace)?;
        let id = job_in(&namespace, &request.id)?;
        let groups = request.groups;
        let reply = self
            .master
            .ask(|reply| {
                ChangeDeployment {
                    id,
                    action,
                    groups,
                    reply,
                }
                .into()
            })
            .await
            .map_err(ServiceError::from)??;
        Ok(Response::new(reply))
    }

    async fn task_logs(
        &self,
        request: Request<pb::ReadTaskOutput>,
    ) -> Result<Response<pb::TaskOutputChunk>, Status> {
        let caller = caller_of(&request);
        let request = request.into_inner();
        // A task's id begins with its job's id (the applier and LaunchTask see to it).
        require(
            &caller,
            Capability::ReadLogs,
            namespace_of(&request.task_id),
        )?;
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
        let pb::CreateTokenRequest {
            name,
            policy,
            mut policies,
        } = request.into_inner();
        let token_type = if policy == TokenType::Management.as_str() {
            if !policies.is_empty() {
                return Err(Status::invalid_argument(
                    "a management token carries no policies: it may do everything",
                ));
            }
            TokenType::Management
        } else {
            if !policy.is_empty() {
                policies.insert(0, policy);
            }
            TokenType::Client
        };
        let token = self
            .master
            .ask(|reply| {
                CreateToken {
                    name,
                    token_type,
                    policies,
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

    async fn list_raft_peers(
        &self,
        request: Request<pb::ListRaftPeersRequest>,
    ) -> Result<Response<pb::RaftPeerList>, Status> {
        if !request.get_ref().stale {
            raft_peers::leading(&self.registry)?;
        }
        Ok(Response::new(raft_peers::list(&self.registry)))
    }

    async fn add_raft_peer(
        &self,
        request: Request<pb::AddRaftPeerRequest>,
    ) -> Result<Response<pb::RaftPeerList>, Status> {
        let request = request.into_inner();
        raft_peers::add(&self.registry, request.id, &request.address).await?;
        Ok(Response::new(raft_peers::list(&self.registry)))
    }

    async fn remove_raft_peer(
        &self,
        request: Request<pb::RemoveRaftPeerRequest>,
    ) -> Result<Response<pb::RaftPeerList>, Status> {
        let request = request.into_inner();
        raft_peers::remove(&self.registry, request.id, request.force).await?;
        Ok(Response::new(raft_peers::list(&self.registry)))
    }

    async fn transfer_leadership(
        &self,
        request: Request<pb::TransferLeadershipRequest>,
    ) -> Result<Response<pb::TransferLeadershipReply>, Status> {
        let to = request.into_inner().to;
        Ok(Response::new(
            raft_peers::transfer(&self.registry, to).await?,
        ))
    }

    type MonitorStream = std::pin::Pin<
        Box<dyn futures_util::Stream<Item = Result<pb::LogLine, Status>> + Send + 'static>,
    >;

    async fn monitor(
        &self,
        request: Request<pb::MonitorRequest>,
    ) -> Result<Response<Self::MonitorStream>, Status> {
        let request = request.into_inner();
        if request.agent_id.is_empty() {
            return Ok(Response::new(Box::pin(crate::log_monitor::stream(
                &request.log_level,
                request.json,
            )?)));
        }
        let agent_id = request.agent_id;
        let (agent, ping_timeout) = self
            .master
            .ask(|reply| {
                AgentLink {
                    agent_id: agent_id.clone(),
                    reply,
                }
                .into()
            })
            .await
            .map_err(ServiceError::from)??;
        Ok(Response::new(Box::pin(crate::log_monitor::agent_stream(
            agent_id,
            agent,
            ping_timeout,
            &request.log_level,
            request.json,
        )?)))
    }

    async fn apply_policy(
        &self,
        request: Request<pb::AclPolicy>,
    ) -> Result<Response<pb::PolicyReply>, Status> {
        let pb::AclPolicy { name, rules, .. } = request.into_inner();
        Policy::check_name(&name).map_err(|e| Status::invalid_argument(e.to_string()))?;
        let policy = Policy::parse(&rules)
            .map_err(|e| Status::invalid_argument(format!("policy {name:?}: {e}")))?;
        let op = Op::ApplyPolicy(StoredPolicy {
            name,
            rules,
            policy,
        });
        self.change_access(op).await?;
        Ok(Response::new(pb::PolicyReply {}))
    }

    async fn list_policies(
        &self,
        _request: Request<pb::ListPoliciesRequest>,
    ) -> Result<Response<pb::PolicyList>, Status> {
        let list = self
            .master
            .ask(|reply| ListPolicies { reply }.into())
            .await
            .map_err(ServiceError::from)??;
        Ok(Response::new(list))
    }

    async fn delete_policy(
        &self,
        request: Request<pb::DeletePolicyRequest>,
    ) -> Result<Response<pb::PolicyReply>, Status> {
        let name = request.into_inner().name;
        Policy::check_name(&name).map_err(|e| Status::invalid_argument(e.to_string()))?;
        self.change_access(Op::DeletePolicy(name)).await?;
        Ok(Response::new(pb::PolicyReply {}))
    }

    async fn apply_namespace(
        &self,
        request: Request<pb::Namespace>,
    ) -> Result<Response<pb::NamespaceReply>, Status> {
        let namespace = namespace_from_wire(request.into_inner())?;
        self.change_access(Op::ApplyNamespace(namespace)).await?;
        Ok(Response::new(pb::NamespaceReply {}))
    }

    async fn list_namespaces(
        &self,
        request: Request<pb::ListNamespacesRequest>,
    ) -> Result<Response<pb::NamespaceList>, Status> {
        let caller = caller_of(&request);
        let namespaces = self
            .master
            .ask(|reply| ListNamespaces { reply }.into())
            .await
            .map_err(ServiceError::from)??;
        let namespaces = namespaces
            .into_iter()
            .filter(|ns| caller.allows(Capability::ReadJob, &ns.name))
            .map(namespace_to_wire)
            .collect();
        Ok(Response::new(pb::NamespaceList { namespaces }))
    }

    async fn delete_namespace(
        &self,
        request: Request<pb::DeleteNamespaceRequest>,
    ) -> Result<Response<pb::NamespaceReply>, Status> {
        let name = request.into_inner().name;
        check_namespace(&name).map_err(|e| Status::invalid_argument(e.to_string()))?;
        self.change_access(Op::DeleteNamespace(name)).await?;
        Ok(Response::new(pb::NamespaceReply {}))
    }
}

impl OperatorService {
    /// Writes a change to the policies or namespaces through the leader.
    async fn change_access(&self, op: Op) -> Result<(), Status> {
        self.master
            .ask(|reply| ChangeAccess { op, reply }.into())
            .await
            .map_err(ServiceError::from)??;
        Ok(())
    }
}

/// A namespace as `ApplyNamespace` carries it, checked.
fn namespace_from_wire(wire: pb::Namespace) -> Result<muster_model::Namespace, Status> {
    check_namespace(&wire.name).map_err(|e| Status::invalid_argument(e.to_string()))?;
    if let Some(cpus) = wire.quota_cpus
        && !(cpus.is_finite() && cpus >= 0.0)
    {
        return Err(Status::invalid_argument(format!(
            "quota_cpus: {cpus} is not a number of cpus (finite, 0 or more)"
        )));
    }
    Ok(muster_model::Namespace {
        name: wire.name,
        description: wire.description,
        quota: muster_model::Quota {
            cpus: wire.quota_cpus,
            mem_mb: wire.quota_mem_mb,
            tasks: wire.quota_tasks,
        },
    })
}

/// A namespace as `ListNamespaces` shows it.
fn namespace_to_wire(namespace: muster_model::Namespace) -> pb::Namespace {
    pb::Namespace {
        name: namespace.name,
        description: namespace.description,
        quota_cpus: namespace.quota.cpus,
        quota_mem_mb: namespace.quota.mem_mb,
        quota_tasks: namespace.quota.tasks,
    }
}

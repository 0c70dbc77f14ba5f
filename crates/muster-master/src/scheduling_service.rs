//! The scheduling API: scheduler workers in other programs reach the leading master's eval
//! broker and plan applier over gRPC (`muster.scheduling.v1`), on the master's port.
//!
//! Each call does what a worker inside the master does: it goes through a [`LocalBackend`],
//! so the two kinds of worker share one copy of the logic. A standby answers with the one "not
//! the leader" convention, and the other statuses are as listed in
//! [`muster_scheduler::protocol`]. Every failure maps to its status through [`ServiceError`].

use muster_broker::{BrokerError, BrokerMsg};
use muster_model::FieldError;
use muster_model::convert::{each, required};
use muster_model::{EvalId, Evaluation, SchedulerType, namespace_of};
use muster_proto::scheduling as pb;
use muster_proto::scheduling::scheduling_server::{Scheduling, SchedulingServer};
use muster_scheduler::protocol::{DEFAULT_MAX_MESSAGE_SIZE, MAX_DEQUEUE_TIMEOUT};
use muster_scheduler::replica::Feed;
use muster_scheduler::wire::brief_plan_result;
use muster_scheduler::{Backend, Demand, Plan, WorkerError};
use muster_security::Caller;
use tonic::{Request, Response, Status};

use crate::cluster_watch::{self, visible_to};
use crate::error::ServiceError;
use crate::master::requests::{ClusterPulse, GetMetrics, GetState, WatchChanges};
use crate::visibility::caller_of;
use crate::workers::LocalBackend;

/// The tonic service; each call is an ask to the master process or its broker.
#[derive(Clone, Debug)]
pub struct SchedulingService {
    backend: LocalBackend,
    address: String,
    /// The master's pulse, once asked for (see `state_index`).
    pulse: std::sync::Arc<tokio::sync::OnceCell<tokio::sync::watch::Receiver<ClusterPulse>>>,
}

impl SchedulingService {
    /// Answers for the master and broker of `backend`; `address` is this master's `host:port`
    /// as its peers know it.
    pub fn new(backend: LocalBackend, address: impl Into<String>) -> Self {
        SchedulingService {
            backend,
            address: address.into(),
            pulse: std::sync::Arc::default(),
        }
    }

    /// The service, ready to add to a tonic server, taking and sending messages up to
    /// [`DEFAULT_MAX_MESSAGE_SIZE`] (snapshots of big clusters are big).
    pub fn into_server(self) -> SchedulingServer<SchedulingService> {
        SchedulingServer::new(self)
            .max_decoding_message_size(DEFAULT_MAX_MESSAGE_SIZE)
            .max_encoding_message_size(DEFAULT_MAX_MESSAGE_SIZE)
    }

    /// The master's state index now, from its pulse: the master publishes it before it hands
    /// evaluations to the broker, so it covers the write that made one just handed out. Newer
    /// than the evaluation needs, by the changes since its write; measured, a copy that waits
    /// for them plans against fresher agents, and its plans collide less than they gain.
    async fn state_index(&self) -> Result<u64, ServiceError> {
        let pulse = self
            .pulse
            .get_or_try_init(|| async {
                self.backend
                    .master()
                    .ask(|reply| WatchChanges { reply }.into())
                    .await
            })
            .await?;
        let index = pulse.borrow().index;
        Ok(index)
    }

    /// `Ok` if this master leads; otherwise the error that sends the caller on.
    async fn leading(&self) -> Result<(), ServiceError> {
        let master = self.backend.master();
        if master
            .ask(|reply| GetMetrics { reply }.into())
            .await?
            .is_leader
        {
            return Ok(());
        }
        // A standby's state is only the leader's address: cheap to ask for.
        let state = master.ask(|reply| GetState { reply }.into()).await?;
        if state.is_leader {
            Ok(())
        } else if state.leader == self.address {
            Err(ServiceError::Unavailable(
                "this master is taking over as the leader; try again shortly".into(),
            ))
        } else {
            Err(ServiceError::not_leader(Some(state.leader)))
        }
    }

    /// The evaluation `eval`, if the caller holds it: handed out under `token` and not yet
    /// acked or nacked. A plan, a block or a completion is taken only from its holder, and
    /// only for its own job (`job`), so a `schedule` token cannot act for evaluations, or on
    /// jobs, it was never given.
    async fn held(
        &self,
        caller: &Caller,
        eval: &EvalId,
        token: &str,
        job: &str,
    ) -> Result<Evaluation, Status> {
        let namespace = namespace_of(job);
        if !caller.acl.may_schedule(namespace) {
            return Err(Status::permission_denied(format!(
                "token {} may not schedule namespace {namespace:?} (its policies' scheduler \
                 rules do not name it)",
                caller.described()
            )));
        }
        let (id, held_token) = (eval.clone(), token.to_owned());
        let answer = self
            .backend
            .broker()
            .ask(|reply| BrokerMsg::Outstanding {
                eval: id,
                token: held_token,
                reply,
            })
            .await
            .map_err(|e| Status::from(ServiceError::from(e)))?;
        let held = match answer {
            Ok(held) => held,
            Err(BrokerError::Disabled) => {
                return Err(match self.leading().await {
                    Err(redirect) => redirect.into(),
                    Ok(()) => {
                        ServiceError::Unavailable("the eval broker is not serving yet".into())
                            .into()
                    }
                });
            }
            Err(refusal) => {
                return Err(ServiceError::FailedPrecondition(format!(
                    "{refusal}: only the worker an evaluation was handed out to (with its \
                     token, while it is not acked or nacked) may plan or settle it"
                ))
                .into());
            }
        };
        if held.job != job {
            return Err(ServiceError::InvalidArgument {
                field: "job".into(),
                message: format!(
                    "evaluation {} is for job {:?}, not {job:?}",
                    held.id, held.job
                ),
            }
            .into());
        }
        Ok(held)
    }

    /// The answer to a failed call: a standby's redirect if this master no longer leads,
    /// otherwise the refusal.
    async fn refused(&self, error: WorkerError) -> Status {
        let error = match error {
            WorkerError::Unavailable(why) => ServiceError::Unavailable(why),
            WorkerError::StaleSnapshot { min_index, got } => {
                ServiceError::StaleSnapshot { min_index, got }
            }
            refusal => match self.leading().await {
                Err(redirect) => redirect,
                Ok(()) => ServiceError::Aborted(reason(refusal)),
            },
        };
        error.into()
    }
}

fn invalid(e: FieldError) -> Status {
    ServiceError::from(e).into()
}

/// The reason alone, as the worker wraps it in its own error again.
fn reason(error: WorkerError) -> String {
    match error {
        WorkerError::Dequeue(reason)
        | WorkerError::Snapshot { reason, .. }
        | WorkerError::Submit { reason, .. }
        | WorkerError::Ack { reason, .. }
        | WorkerError::Nack { reason, .. }
        | WorkerError::Block { reason, .. }
        | WorkerError::Complete { reason, .. } => reason,
        other => other.to_string(),
    }
}

/// The most scheduler names one dequeue may list.
const MAX_SCHEDULER_NAMES: usize = 64;

/// The scheduler names a dequeue asks for: the built-in ones named by type, then those named
/// by name, each once; at least one, each a valid name.
fn scheduler_names(types: Vec<i32>, names: Vec<String>) -> Result<Vec<String>, Status> {
    if names.len() > MAX_SCHEDULER_NAMES {
        return Err(invalid(FieldError::new(
            "scheduler_names",
            format!(
                "{} names; a worker serves at most {MAX_SCHEDULER_NAMES} schedulers",
                names.len()
            ),
        )));
    }
    let types = each::<SchedulerType, _>(types, "schedulers").map_err(invalid)?;
    let mut schedulers: Vec<String> = types.iter().map(|t| t.name().to_owned()).collect();
    for (i, name) in names.into_iter().enumerate() {
        // A built-in name is served as it is; any other must be a name a job could give.
        let kind = SchedulerType::of_built_in(&name).unwrap_or(SchedulerType::Service);
        muster_model::check_scheduler_name(kind, &name).map_err(|e| {
            invalid(FieldError::new(
                format!("scheduler_names[{i}]"),
                e.problem().to_owned(),
            ))
        })?;
        if !schedulers.contains(&name) {
            schedulers.push(name);
        }
    }
    if schedulers.is_empty() {
        return Err(invalid(FieldError::new(
            "scheduler_names",
            "at least one scheduler is needed (by name, or by type in `schedulers`)",
        )));
    }
    Ok(schedulers)
}

#[tonic::async_trait]
impl Scheduling for SchedulingService {
    async fn dequeue(
        &self,
        request: Request<pb::DequeueRequest>,
    ) -> Result<Response<pb::DequeueReply>, Status> {
        let caller = caller_of(&request);
        // Evaluations are queued by scheduler, not by namespace: a worker that may schedule
        // only some namespaces would be handed others'.
        if !caller.acl.may_schedule_everywhere() {
            return Err(Status::permission_denied(format!(
                "token {} may schedule only some namespaces; dequeuing needs a scheduler rule \
                 for every namespace (`namespaces = [\"*\"]`), as evaluations are queued by \
                 scheduler",
                caller.described()
            )));
        }
        let request = request.into_inner();
        let schedulers = scheduler_names(request.schedulers, request.scheduler_names)?;
        if let Some(refused) = schedulers.iter().find(|name| !caller.acl.may_serve(name)) {
            return Err(Status::permission_denied(format!(
                "token {} may not serve scheduler {refused:?}: no scheduler rule of its \
                 policies names it (`names = [\"{refused}\"]`)",
                caller.described()
            )));
        }
        let timeout = std::time::Duration::from_millis(request.timeout_ms).min(MAX_DEQUEUE_TIMEOUT);
        let mut assignment = match self.backend.dequeue(&schedulers, timeout).await {
            Ok(assignment) => assignment,
            Err(error) => return Err(self.refused(error).await),
        };
        if let Some(assignment) = &mut assignment {
            assignment.state_index = self.state_index().await?;
        }
        Ok(Response::new(pb::DequeueReply {
            assignment: assignment.map(Into::into),
        }))
    }

    async fn snapshot(
        &self,
        request: Request<pb::SnapshotRequest>,
    ) -> Result<Response<pb::ClusterSnapshot>, Status> {
        let caller = caller_of(&request);
        let min_index = request.into_inner().min_index;
        // A standby's snapshot is empty, not an error: ask who leads first.
        self.leading().await?;
        match self.backend.snapshot(min_index).await {
            Ok(snapshot) => Ok(Response::new(visible_to(&caller, snapshot).into())),
            Err(error) => Err(self.refused(error).await),
        }
    }

    type WatchClusterStream = std::pin::Pin<
        Box<dyn futures_util::Stream<Item = Result<pb::ClusterChange, Status>> + Send + 'static>,
    >;

    async fn watch_cluster(
        &self,
        request: Request<pb::WatchClusterRequest>,
    ) -> Result<Response<Self::WatchClusterStream>, Status> {
        let caller = caller_of(&request);
        let holding = request.into_inner().holding.unwrap_or_default();
        self.leading().await?;
        let pulse = self
            .backend
            .master()
            .ask(|reply| WatchChanges { reply }.into())
            .await
            .map_err(ServiceError::from)?;
        let (out, changes) = tokio::sync::mpsc::channel(2);
        let service = self.clone();
        let redirect = move || {
            let service = service.clone();
            async move {
                match service.leading().await {
                    Err(redirect) => Status::from(redirect),
                    Ok(()) => Status::unavailable("this master is taking over; watch again"),
                }
            }
        };
        tokio::spawn(cluster_watch::run(
            self.backend.master().clone(),
            redirect,
            caller,
            Feed::new(holding),
            pulse,
            out,
        ));
        let stream = futures_util::stream::unfold(changes, |mut changes| async move {
            let change = changes.recv().await?;
            Some((change, changes))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn submit_plan(
        &self,
        request: Request<pb::SubmitPlanRequest>,
    ) -> Result<Response<pb::PlanResult>, Status> {
        let caller = caller_of(&request);
        let request = request.into_inner();
        let brief = request.brief;
        let plan: Plan = required(request.plan, "plan").map_err(invalid)?;
        self.held(&caller, &plan.eval, &plan.eval_token, &plan.job)
            .await?;
        // A task is preempted only in a namespace the caller may schedule.
        if let Some(victim) = plan
            .preempt
            .iter()
            .find(|victim| !caller.acl.may_schedule(namespace_of(&victim.job)))
        {
            return Err(Status::permission_denied(format!(
                "token {} may not preempt task {} of job {:?}: its policies' scheduler rules \
                 do not name namespace {:?}",
                caller.described(),
                victim.task_id,
                victim.job,
                namespace_of(&victim.job)
            )));
        }
        match self.backend.submit(plan).await {
            Ok(result) if brief => Ok(Response::new(brief_plan_result(result))),
            Ok(result) => Ok(Response::new(result.into())),
            Err(error) => Err(self.refused(error).await),
        }
    }

    async fn ack(
        &self,
        request: Request<pb::AckRequest>,
    ) -> Result<Response<pb::AckReply>, Status> {
        let request = request.into_inner();
        let eval = EvalId(request.eval_id);
        match self.backend.ack(&eval, &request.token).await {
            Ok(()) => Ok(Response::new(pb::AckReply {})),
            Err(error) => Err(self.refused(error).await),
        }
    }

    async fn nack(
        &self,
        request: Request<pb::NackRequest>,
    ) -> Result<Response<pb::NackReply>, Status> {
        let request = request.into_inner();
        let eval = EvalId(request.eval_id);
        match self.backend.nack(&eval, &request.token).await {
            Ok(()) => Ok(Response::new(pb::NackReply {})),
            Err(error) => Err(self.refused(error).await),
        }
    }

    async fn block(
        &self,
        request: Request<pb::BlockRequest>,
    ) -> Result<Response<pb::BlockReply>, Status> {
        let caller = caller_of(&request);
        let request = request.into_inner();
        let eval: Evaluation = required(request.evaluation, "evaluation").map_err(invalid)?;
        let unplaced: Vec<Demand> = each(request.unplaced, "unplaced").map_err(invalid)?;
        self.held(&caller, &eval.id, &request.token, &eval.job)
            .await?;
        match self.backend.block(eval, &request.token, unplaced).await {
            Ok(()) => Ok(Response::new(pb::BlockReply {})),
            Err(error) => Err(self.refused(error).await),
        }
    }

    async fn complete(
        &self,
        request: Request<pb::CompleteRequest>,
    ) -> Result<Response<pb::CompleteReply>, Status> {
        let caller = caller_of(&request);
        let request = request.into_inner();
        let eval: Evaluation = required(request.evaluation, "evaluation").map_err(invalid)?;
        self.held(&caller, &eval.id, &request.token, &eval.job)
            .await?;
        match self.backend.complete(&eval, &request.token).await {
            Ok(()) => Ok(Response::new(pb::CompleteReply {})),
            Err(error) => Err(self.refused(error).await),
        }
    }
}

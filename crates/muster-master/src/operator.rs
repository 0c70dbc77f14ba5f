//! The operator API: gRPC on the master's port, answered by the master process.
//!
//! `GetState` and `GetMetrics` answer on every master; the other calls are leader-only and a
//! standby answers them as [`leader_hint`](crate::leader_hint) describes. Every failure maps to
//! its status through [`ServiceError`].

use muster_actor::Pid;
use muster_proto::cluster as pb;
use muster_proto::cluster::operator_server::{Operator, OperatorServer};
use tonic::{Request, Response, Status};

use crate::error::ServiceError;
use crate::master::{Master, OperatorMsg};

/// The tonic service; each call is an ask to the master process.
#[derive(Clone, Debug)]
pub struct OperatorService {
    master: Pid<Master>,
}

impl OperatorService {
    /// Answers for `master`.
    pub fn new(master: Pid<Master>) -> Self {
        OperatorService { master }
    }

    /// The service, ready to add to a tonic server.
    pub fn into_server(self) -> OperatorServer<OperatorService> {
        OperatorServer::new(self)
    }
}

#[tonic::async_trait]
impl Operator for OperatorService {
    async fn get_state(
        &self,
        _request: Request<pb::GetStateRequest>,
    ) -> Result<Response<pb::ClusterState>, Status> {
        let state = self
            .master
            .ask(|reply| OperatorMsg::GetState(reply).into())
            .await
            .map_err(ServiceError::from)?;
        Ok(Response::new(state))
    }

    async fn get_metrics(
        &self,
        _request: Request<pb::GetMetricsRequest>,
    ) -> Result<Response<pb::MasterMetrics>, Status> {
        let metrics = self
            .master
            .ask(|reply| OperatorMsg::GetMetrics(reply).into())
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
            .ask(|reply| OperatorMsg::LaunchTask(request, reply).into())
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
            .ask(|reply| OperatorMsg::SubmitJob(spec, reply).into())
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
            .ask(|reply| OperatorMsg::StopJob(name, reply).into())
            .await
            .map_err(ServiceError::from)??;
        Ok(Response::new(reply))
    }

    async fn job_status(
        &self,
        request: Request<pb::JobStatusRequest>,
    ) -> Result<Response<pb::JobStatusReply>, Status> {
        let name = request.into_inner().name;
        let reply = self
            .master
            .ask(|reply| OperatorMsg::JobStatus(name, reply).into())
            .await
            .map_err(ServiceError::from)??;
        Ok(Response::new(reply))
    }
}

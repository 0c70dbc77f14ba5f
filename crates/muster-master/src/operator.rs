//! The operator API: gRPC on the master's port, answered by the master process.

use muster_actor::{AskError, Pid};
use muster_proto::cluster as pb;
use muster_proto::cluster::operator_server::{Operator, OperatorServer};
use tonic::{Request, Response, Status};

use crate::master::{Master, MasterMsg};

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

fn unavailable(e: AskError) -> Status {
    Status::unavailable(format!("the master process is not answering: {e}"))
}

#[tonic::async_trait]
impl Operator for OperatorService {
    async fn get_state(
        &self,
        _request: Request<pb::GetStateRequest>,
    ) -> Result<Response<pb::ClusterState>, Status> {
        let state = self
            .master
            .ask(MasterMsg::GetState)
            .await
            .map_err(unavailable)?;
        Ok(Response::new(state))
    }

    async fn get_metrics(
        &self,
        _request: Request<pb::GetMetricsRequest>,
    ) -> Result<Response<pb::MasterMetrics>, Status> {
        let metrics = self
            .master
            .ask(MasterMsg::GetMetrics)
            .await
            .map_err(unavailable)?;
        Ok(Response::new(metrics))
    }

    async fn launch_task(
        &self,
        request: Request<pb::LaunchTaskRequest>,
    ) -> Result<Response<pb::LaunchTaskReply>, Status> {
        let request = request.into_inner();
        self.master
            .ask(|reply| MasterMsg::LaunchTask(request, reply))
            .await
            .map_err(unavailable)?
            .map_err(Status::failed_precondition)?;
        Ok(Response::new(pb::LaunchTaskReply {}))
    }

    async fn submit_job(
        &self,
        request: Request<pb::SubmitJobRequest>,
    ) -> Result<Response<pb::SubmitJobReply>, Status> {
        let spec = request.into_inner().job;
        let reply = self
            .master
            .ask(|reply| MasterMsg::SubmitJob(spec, reply))
            .await
            .map_err(unavailable)?
            .map_err(Status::failed_precondition)?;
        Ok(Response::new(reply))
    }

    async fn stop_job(
        &self,
        request: Request<pb::StopJobRequest>,
    ) -> Result<Response<pb::SubmitJobReply>, Status> {
        let name = request.into_inner().name;
        let reply = self
            .master
            .ask(|reply| MasterMsg::StopJob(name, reply))
            .await
            .map_err(unavailable)?
            .map_err(Status::failed_precondition)?;
        Ok(Response::new(reply))
    }

    async fn job_status(
        &self,
        request: Request<pb::JobStatusRequest>,
    ) -> Result<Response<pb::JobStatusReply>, Status> {
        let name = request.into_inner().name;
        let reply = self
            .master
            .ask(|reply| MasterMsg::JobStatus(name, reply))
            .await
            .map_err(unavailable)?
            .map_err(Status::not_found)?;
        Ok(Response::new(reply))
    }
}

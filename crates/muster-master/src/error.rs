//! What the master's services answer when a request fails ([`ServiceError`]), and its one
//! mapping to gRPC statuses, shared by the operator and scheduling APIs.

use muster_actor::AskError;
use muster_model::FieldError;
use muster_registry::{OpError, WriteError};
use muster_scheduler::protocol;
use tonic::Status;

/// Why the master refused or could not do a request from an operator or a scheduler worker.
///
/// Each variant has one gRPC status (`From<ServiceError> for tonic::Status`), named in its
/// doc.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ServiceError {
    /// No job by that name: `NOT_FOUND`.
    #[error("no job named {0:?}")]
    UnknownJob(String),
    /// No agent by that id: `NOT_FOUND`.
    #[error("unknown agent {0:?}")]
    UnknownAgent(String),
    /// No ACL token with that accessor: `NOT_FOUND`.
    #[error("no token with accessor {0:?}")]
    UnknownToken(String),
    /// No namespace by that name: `NOT_FOUND`.
    #[error("no namespace named {0:?}; create it with `muster namespace apply {0}`")]
    UnknownNamespace(String),
    /// No policy by that name: `NOT_FOUND`.
    #[error("no policy named {0:?}")]
    UnknownPolicy(String),
    /// No task by that id on any agent this master knows: `NOT_FOUND`.
    #[error("no task {0:?} on any agent this master knows")]
    UnknownTask(String),
    /// No deployment by that id (among the few each job keeps): `NOT_FOUND`.
    #[error("no deployment {0:?}")]
    UnknownDeployment(String),
    /// A request field is missing or wrong: `INVALID_ARGUMENT`.
    #[error("{message}")]
    InvalidArgument {
        /// The field's path from the request (`job.groups[0].resources.cpus`).
        field: String,
        /// The whole explanation, naming the field.
        message: String,
    },
    /// This master does not lead: `FAILED_PRECONDITION` naming the leader, or `UNAVAILABLE`
    /// if no leader is known (the one convention, [`muster_scheduler::protocol`]).
    #[error("{}", protocol::not_leader_message(leader.as_deref()))]
    NotLeader {
        /// The leading master's address (`host:port`), if known.
        leader: Option<String>,
    },
    /// The cluster is not in a state that allows the request (the agent is not connected,
    /// the task already runs there, the agent refused it): `FAILED_PRECONDITION`.
    #[error("{0}")]
    FailedPrecondition(String),
    /// Something the request needs cannot be reached now (the registry, the master process,
    /// an agent, a master taking over): try again. `UNAVAILABLE`.
    #[error("{0}")]
    Unavailable(String),
    /// Refused by the eval broker or the registry (a stale token, a write that changed
    /// nothing): `ABORTED`.
    #[error("{0}")]
    Aborted(String),
    /// The master's state is older than the snapshot asked for: `OUT_OF_RANGE`, with the
    /// state's index in the `muster-snapshot-index` metadata.
    #[error("the cluster snapshot is at index {got}, older than the required {min_index}")]
    StaleSnapshot {
        /// The index asked for.
        min_index: u64,
        /// The index of the master's state.
        got: u64,
    },
}

impl ServiceError {
    /// A not-the-leader error naming `leader` (`host:port`), if known and not empty.
    pub fn not_leader(leader: Option<String>) -> Self {
        ServiceError::NotLeader {
            leader: leader.filter(|leader| !leader.is_empty()),
        }
    }
}

impl From<ServiceError> for Status {
    fn from(error: ServiceError) -> Status {
        match error {
            ServiceError::UnknownJob(_)
            | ServiceError::UnknownAgent(_)
            | ServiceError::UnknownToken(_)
            | ServiceError::UnknownNamespace(_)
            | ServiceError::UnknownPolicy(_)
            | ServiceError::UnknownTask(_)
            | ServiceError::UnknownDeployment(_) => Status::not_found(error.to_string()),
            ServiceError::InvalidArgument { message, .. } => Status::invalid_argument(message),
            ServiceError::NotLeader { leader } => protocol::not_leader(leader.as_deref()),
            ServiceError::FailedPrecondition(why) => Status::failed_precondition(why),
            ServiceError::Unavailable(why) => Status::unavailable(why),
            ServiceError::Aborted(why) => Status::aborted(why),
            ServiceError::StaleSnapshot { min_index, got } => {
                protocol::stale_snapshot(min_index, got)
            }
        }
    }
}

impl From<AskError> for ServiceError {
    /// The master process (or its broker) did not answer.
    fn from(e: AskError) -> Self {
        ServiceError::Unavailable(format!("the master process is not answering: {e}"))
    }
}

impl From<FieldError> for ServiceError {
    /// A malformed request, or a job that breaks the model's rules. The field's path starts
    /// where the error was made: callers that read a nested message say where it sits with
    /// [`FieldError::within`].
    fn from(e: FieldError) -> Self {
        ServiceError::InvalidArgument {
            field: e.field().to_owned(),
            message: e.to_string(),
        }
    }
}

impl From<WriteError> for ServiceError {
    /// A registry write that did not go through.
    fn from(e: WriteError) -> Self {
        match e {
            WriteError::NotLeader { leader } => {
                ServiceError::not_leader(leader.map(|(_, address)| address))
            }
            WriteError::Rejected(OpError::UnknownNamespace(name)) => {
                ServiceError::UnknownNamespace(name)
            }
            WriteError::Rejected(OpError::UnknownPolicy(name)) => ServiceError::UnknownPolicy(name),
            WriteError::Rejected(OpError::UnknownDeployment(id)) => {
                ServiceError::UnknownDeployment(id)
            }
            WriteError::Rejected(
                refusal @ (OpError::DefaultNamespace
                | OpError::NamespaceNotEmpty { .. }
                | OpError::DeploymentEnded { .. }
                | OpError::NothingToPromote(_)
                | OpError::UnknownDeploymentGroup { .. }
                | OpError::DeploymentNotPaused(_)),
            ) => ServiceError::FailedPrecondition(refusal.to_string()),
            WriteError::Rejected(_) => ServiceError::Aborted(e.to_string()),
            WriteError::Failed(_) => ServiceError::Unavailable(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn each_error_has_its_status() {
        let cases = [
            (ServiceError::UnknownJob("web".into()), Code::NotFound),
            (ServiceError::UnknownAgent("a1".into()), Code::NotFound),
            (
                ServiceError::UnknownDeployment("web.v2".into()),
                Code::NotFound,
            ),
            (
                ServiceError::InvalidArgument {
                    field: "job.name".into(),
                    message: "invalid job: name: empty".into(),
                },
                Code::InvalidArgument,
            ),
            (
                ServiceError::not_leader(Some("h:1".into())),
                Code::FailedPrecondition,
            ),
            (ServiceError::not_leader(None), Code::Unavailable),
            (
                ServiceError::not_leader(Some(String::new())),
                Code::Unavailable,
            ),
            (
                ServiceError::FailedPrecondition("agent a1 is not connected".into()),
                Code::FailedPrecondition,
            ),
            (ServiceError::Unavailable("down".into()), Code::Unavailable),
            (ServiceError::Aborted("stale token".into()), Code::Aborted),
            (
                ServiceError::StaleSnapshot {
                    min_index: 5,
                    got: 3,
                },
                Code::OutOfRange,
            ),
        ];
        for (error, code) in cases {
            let message = error.to_string();
            let status = Status::from(error);
            assert_eq!(status.code(), code, "{status:?}");
            assert_eq!(status.message(), message);
        }
    }

    #[test]
    fn not_the_leader_names_the_leader_in_the_metadata() {
        let status = Status::from(ServiceError::not_leader(Some("10.0.0.2:5050".into())));
        assert_eq!(
            protocol::leader_hint(&status).as_deref(),
            Some("10.0.0.2:5050")
        );
        assert_eq!(
            status.message(),
            "not the leading master; the leader is 10.0.0.2:5050"
        );
    }

    #[test]
    fn a_bad_job_names_the_field_from_the_request() {
        let error = ServiceError::from(
            FieldError::new("groups[0].resources.cpus", "must not be negative").within("job"),
        );
        assert!(
            matches!(&error, ServiceError::InvalidArgument { field, .. } if field == "job.groups[0].resources.cpus"),
            "{error:?}"
        );
        assert!(error.to_string().contains("groups[0].resources.cpus"));
    }
}

//! The OpenAPI document of the HTTP API, generated from the handlers' annotations and the
//! documents' types (`utoipa`), so that clients can be generated from what the code serves.

use axum::Json;
use axum::response::{IntoResponse, Response};
use muster_api::{
    AgentDetail, AgentList, AgentSummary, ApiError, ClusterStatus, ConstraintSpec, EvaluationInfo,
    EvaluationList, Event, GroupSpec, JobDetail, JobList, JobPlan, JobSpec, JobSummary, JobVersion,
    JobVersions, PlannedTask, ReadInfo, Submitted, TaskCounts, TaskInfo, TaskLogs,
};
use utoipa::OpenApi;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};

use super::{deployments, handlers, jobs, namespaces};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Muster HTTP API",
        description = "Jobs, deployments, evaluations, agents and cluster status of a Muster master. Every call but health and this document needs a token (X-Muster-Token, or Authorization: Bearer) once ACLs are on; a standby redirects leader-only calls (307) to the leader."
    ),
    paths(
        jobs::list_jobs,
        jobs::submit_job,
        jobs::read_job,
        jobs::stop_job,
        jobs::job_tasks,
        jobs::job_evaluations,
        jobs::list_evaluations,
        jobs::read_evaluation,
        handlers::list_agents,
        handlers::read_agent,
        handlers::drain_agent,
        handlers::set_agent_eligibility,
        handlers::status,
        handlers::raft_configuration,
        handlers::live,
        handlers::ready,
        openapi_document,
        handlers::event_stream,
        handlers::task_logs,
        jobs::job_versions,
        jobs::plan_job,
        handlers::metrics,
        namespaces::list_namespaces,
        namespaces::apply_namespace,
        namespaces::delete_namespace,
        deployments::list_deployments,
        deployments::read_deployment,
        deployments::promote_deployment,
        deployments::pause_deployment,
        deployments::resume_deployment,
        deployments::fail_deployment,
    ),
    components(schemas(
        AgentDetail, AgentList, AgentSummary, ApiError, ClusterStatus, ConstraintSpec,
        muster_api::DisconnectSpec, muster_api::AffinitySpec, muster_api::SpreadSpec, muster_api::SpreadTargetSpec, muster_api::PortSpec, muster_api::RestartSpec, muster_api::RescheduleSpec, muster_api::CheckSpec, muster_api::UpdateSpec, EvaluationInfo, EvaluationList, GroupSpec, JobDetail, JobList, JobSpec, JobSummary,
        ReadInfo, Submitted, TaskCounts, TaskInfo, Event, TaskLogs, JobVersion, JobVersions, JobPlan, PlannedTask, muster_api::Member, muster_api::RaftConfiguration, muster_api::RaftServer,
        muster_api::AgentScheduling, muster_api::DrainRequest, muster_api::EligibilityRequest,
        muster_api::NamespaceInfo, muster_api::DeploymentInfo, muster_api::DeploymentGroupInfo,
        muster_api::DeploymentList, deployments::PromoteRequest
    )),
    modifiers(&Tokens),
    security(("token" = []), ("bearer" = []))
)]
struct ApiDoc;

/// Declares the two ways a token may travel.
struct Tokens;

impl utoipa::Modify for Tokens {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "token",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new("X-Muster-Token"))),
        );
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The OpenAPI document.
pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// The OpenAPI document of this API.
#[utoipa::path(get, path = "/v1/openapi.json", tag = "cluster", responses((status = 200, description = "OpenAPI 3.1 document")))]
pub(crate) async fn openapi_document() -> Response {
    Json(document()).into_response()
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_route_is_in_the_document_with_its_schemas() {
        let doc = super::document();
        for path in [
            "/v1/jobs",
            "/v1/job/{name}",
            "/v1/job/{name}/tasks",
            "/v1/evaluations",
            "/v1/agents",
            "/v1/agent/{id}",
            "/v1/agent/{id}/drain",
            "/v1/agent/{id}/eligibility",
            "/v1/status",
            "/v1/health/ready",
            "/v1/namespaces",
            "/v1/namespace/{name}",
            "/v1/deployments",
            "/v1/deployment/{id}",
            "/v1/deployment/{id}/promote",
            "/v1/deployment/{id}/pause",
            "/v1/deployment/{id}/resume",
            "/v1/deployment/{id}/fail",
        ] {
            assert!(doc.paths.paths.contains_key(path), "{path} missing");
        }
        let schemas = doc.components.map(|c| c.schemas).unwrap_or_default();
        for schema in [
            "JobSpec",
            "ApiError",
            "DrainRequest",
            "AgentScheduling",
            "DeploymentInfo",
            "DeploymentGroupInfo",
            "DeploymentList",
            "PromoteRequest",
        ] {
            assert!(schemas.contains_key(schema), "{schema} missing");
        }
    }
}

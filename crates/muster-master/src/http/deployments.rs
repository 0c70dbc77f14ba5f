//! The endpoints of deployments: list them (one job's, or every job's), read one, and promote,
//! pause, resume or fail one (Nomad's `/v1/deployments` and `/v1/deployment/...`). Each checks
//! the token, calls the operator handler its gRPC twin calls (`ListDeployments`,
//! `ChangeDeployment`), and answers the [`muster_api`] document made from the reply.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{OriginalUri, Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use muster_api::{DeploymentInfo, DeploymentList};
use muster_proto::cluster as pb;
use muster_proto::cluster::operator_server::Operator as _;
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};

use super::handlers::{call, parsed, read_response};
use super::{ApiError, ApiState, HttpError};

/// `GET /v1/deployments` options.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeploymentsQuery {
    /// As in every read.
    #[serde(default)]
    stale: bool,
    /// Only this job's.
    #[serde(default)]
    job: String,
    /// Only this namespace's (default: `default`; `*`: every namespace the token may read,
    /// with no job named).
    #[serde(default)]
    namespace: String,
}

/// Reads of one deployment: `?stale=true` and its job's namespace.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeploymentReadQuery {
    /// As in every read.
    #[serde(default)]
    stale: bool,
    /// Its job's namespace (default: `default`).
    #[serde(default)]
    namespace: String,
}

/// Changes of one deployment: its job's namespace.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeploymentChangeQuery {
    /// Its job's namespace (default: `default`).
    #[serde(default)]
    namespace: String,
}

/// The body of `POST /v1/deployment/{id}/promote` (optional).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PromoteRequest {
    /// Only these groups' canaries (none, or no body: every group's).
    #[serde(default)]
    groups: Vec<String>,
}

/// Deployments, newest first: one job's, or every job's of the namespace.
#[utoipa::path(get, path = "/v1/deployments", params(DeploymentsQuery), tag = "deployments",
    responses((status = 200, body = DeploymentList), (status = 400, body = ApiError), (status = 401, body = ApiError), (status = 403, body = ApiError), (status = 307, body = ApiError), (status = 503, body = ApiError)))]
pub(crate) async fn list_deployments(
    State(state): State<ApiState>,
    uri: OriginalUri,
    headers: HeaderMap,
    query: Result<Query<DeploymentsQuery>, QueryRejection>,
) -> Result<Response, HttpError> {
    let query = parsed(query)?;
    let doc = deployments(
        &state,
        &uri,
        &headers,
        pb::ListDeploymentsRequest {
            namespace: query.namespace,
            job: query.job,
            id: String::new(),
            stale: query.stale,
        },
    )
    .await?;
    let read = doc.read.clone();
    Ok(read_response(doc, &read))
}

/// One deployment (its id is `{job}.v{version}`, as the list shows it).
#[utoipa::path(get, path = "/v1/deployment/{id}", params(("id" = String, Path, description = "The deployment's id (`web.v3`)"), DeploymentReadQuery), tag = "deployments",
    responses((status = 200, body = DeploymentInfo), (status = 404, body = ApiError), (status = 401, body = ApiError), (status = 403, body = ApiError), (status = 307, body = ApiError)))]
pub(crate) async fn read_deployment(
    State(state): State<ApiState>,
    uri: OriginalUri,
    headers: HeaderMap,
    Path(id): Path<String>,
    query: Result<Query<DeploymentReadQuery>, QueryRejection>,
) -> Result<Response, HttpError> {
    let query = parsed(query)?;
    let doc = deployments(
        &state,
        &uri,
        &headers,
        pb::ListDeploymentsRequest {
            namespace: query.namespace,
            job: String::new(),
            id: id.clone(),
            stale: query.stale,
        },
    )
    .await?;
    let deployment = doc
        .deployments
        .into_iter()
        .next()
        .ok_or_else(|| HttpError::NotFound(format!("no deployment {id:?}")))?;
    Ok(read_response(deployment, &doc.read))
}

/// The newest deployment of job `name` in `namespace`, if it has one (for the job's page).
pub(super) async fn latest_deployment(
    state: &ApiState,
    uri: &OriginalUri,
    headers: &HeaderMap,
    name: String,
    namespace: String,
    stale: bool,
) -> Result<Option<DeploymentInfo>, HttpError> {
    let doc = deployments(
        state,
        uri,
        headers,
        pb::ListDeploymentsRequest {
            namespace,
            job: name,
            id: String::new(),
            stale,
        },
    )
    .await?;
    Ok(doc.deployments.into_iter().next())
}

/// `ListDeployments` as the caller `headers` carry.
async fn deployments(
    state: &ApiState,
    uri: &OriginalUri,
    headers: &HeaderMap,
    message: pb::ListDeploymentsRequest,
) -> Result<DeploymentList, HttpError> {
    let list = call(
        state,
        uri,
        headers,
        "ListDeployments",
        message,
        |operator, request| operator.list_deployments(request),
    )
    .await?;
    Ok(DeploymentList::from(list))
}

/// Promotes a deployment's canaries (of the groups the body names, or of every group): the
/// roll goes on. Refused (409) once the deployment ended, or with no canary to promote.
#[utoipa::path(post, path = "/v1/deployment/{id}/promote", params(("id" = String, Path, description = "The deployment's id (`web.v3`)"), DeploymentChangeQuery), request_body(content = PromoteRequest, description = "Optional: only these groups' canaries"), tag = "deployments",
    responses((status = 200, body = DeploymentInfo), (status = 400, body = ApiError), (status = 404, body = ApiError), (status = 409, body = ApiError), (status = 401, body = ApiError), (status = 403, body = ApiError), (status = 307, body = ApiError)))]
pub(crate) async fn promote_deployment(
    State(state): State<ApiState>,
    uri: OriginalUri,
    headers: HeaderMap,
    Path(id): Path<String>,
    query: Result<Query<DeploymentChangeQuery>, QueryRejection>,
    body: Bytes,
) -> Result<Response, HttpError> {
    let query = parsed(query)?;
    let promote: PromoteRequest = if body.iter().all(u8::is_ascii_whitespace) {
        PromoteRequest::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| {
            HttpError::BadRequest(format!("the body is not a promotion request: {e}"))
        })?
    };
    change(
        &state,
        &uri,
        &headers,
        pb::ChangeDeploymentRequest {
            namespace: query.namespace,
            id,
            action: pb::DeploymentAction::Promote.into(),
            groups: promote.groups,
        },
    )
    .await
}

/// Pauses a deployment: nothing more is replaced until it is resumed. Refused (409) once it
/// ended.
#[utoipa::path(post, path = "/v1/deployment/{id}/pause", params(("id" = String, Path, description = "The deployment's id (`web.v3`)"), DeploymentChangeQuery), tag = "deployments",
    responses((status = 200, body = DeploymentInfo), (status = 404, body = ApiError), (status = 409, body = ApiError), (status = 401, body = ApiError), (status = 403, body = ApiError), (status = 307, body = ApiError)))]
pub(crate) async fn pause_deployment(
    State(state): State<ApiState>,
    uri: OriginalUri,
    headers: HeaderMap,
    Path(id): Path<String>,
    query: Result<Query<DeploymentChangeQuery>, QueryRejection>,
) -> Result<Response, HttpError> {
    let query = parsed(query)?;
    simple_change(
        &state,
        &uri,
        &headers,
        id,
        query,
        pb::DeploymentAction::Pause,
    )
    .await
}

/// Resumes a paused deployment. Refused (409) unless it is paused.
#[utoipa::path(post, path = "/v1/deployment/{id}/resume", params(("id" = String, Path, description = "The deployment's id (`web.v3`)"), DeploymentChangeQuery), tag = "deployments",
    responses((status = 200, body = DeploymentInfo), (status = 404, body = ApiError), (status = 409, body = ApiError), (status = 401, body = ApiError), (status = 403, body = ApiError), (status = 307, body = ApiError)))]
pub(crate) async fn resume_deployment(
    State(state): State<ApiState>,
    uri: OriginalUri,
    headers: HeaderMap,
    Path(id): Path<String>,
    query: Result<Query<DeploymentChangeQuery>, QueryRejection>,
) -> Result<Response, HttpError> {
    let query = parsed(query)?;
    simple_change(
        &state,
        &uri,
        &headers,
        id,
        query,
        pb::DeploymentAction::Resume,
    )
    .await
}

/// Fails a deployment: nothing more is replaced; with `auto_revert` the job goes back to its
/// last version that deployed well. Refused (409) once it ended.
#[utoipa::path(post, path = "/v1/deployment/{id}/fail", params(("id" = String, Path, description = "The deployment's id (`web.v3`)"), DeploymentChangeQuery), tag = "deployments",
    responses((status = 200, body = DeploymentInfo), (status = 404, body = ApiError), (status = 409, body = ApiError), (status = 401, body = ApiError), (status = 403, body = ApiError), (status = 307, body = ApiError)))]
pub(crate) async fn fail_deployment(
    State(state): State<ApiState>,
    uri: OriginalUri,
    headers: HeaderMap,
    Path(id): Path<String>,
    query: Result<Query<DeploymentChangeQuery>, QueryRejection>,
) -> Result<Response, HttpError> {
    let query = parsed(query)?;
    simple_change(
        &state,
        &uri,
        &headers,
        id,
        query,
        pb::DeploymentAction::Fail,
    )
    .await
}

/// A change that takes nothing but the deployment: pause, resume, fail.
async fn simple_change(
    state: &ApiState,
    uri: &OriginalUri,
    headers: &HeaderMap,
    id: String,
    query: DeploymentChangeQuery,
    action: pb::DeploymentAction,
) -> Result<Response, HttpError> {
    change(
        state,
        uri,
        headers,
        pb::ChangeDeploymentRequest {
            namespace: query.namespace,
            id,
            action: action.into(),
            groups: Vec::new(),
        },
    )
    .await
}

/// `ChangeDeployment` as the caller `headers` carry: the deployment after the change.
async fn change(
    state: &ApiState,
    uri: &OriginalUri,
    headers: &HeaderMap,
    message: pb::ChangeDeploymentRequest,
) -> Result<Response, HttpError> {
    let reply = call(
        state,
        uri,
        headers,
        "ChangeDeployment",
        message,
        |operator, request| operator.change_deployment(request),
    )
    .await?;
    let deployment = reply.deployment.ok_or_else(|| {
        HttpError::Status(tonic::Status::internal(
            "the master answered the change without the deployment",
        ))
    })?;
    Ok(Json(DeploymentInfo::from(deployment)).into_response())
}

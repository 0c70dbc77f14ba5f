//! The endpoints of jobs and evaluations: list, submit, read, plan, version history and stop
//! jobs; list and read evaluations (a job's deployments are in `deployments.rs`; reading a job
//! names its latest). Each checks the token, calls the operator handler its
//! gRPC twin calls, and answers the [`muster_api`] document made from the reply.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{OriginalUri, Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use muster_api::{
    EvaluationInfo, EvaluationList, JobDetail, JobList, JobSpec, Submitted, TaskInfo,
};
use muster_proto::cluster as pb;
use muster_proto::cluster::operator_server::Operator as _;
use serde::Deserialize;
use utoipa::IntoParams;

use super::handlers::{call, parsed, read_response, refused, request};
use super::{ApiError, ApiState, HttpError};

/// A job's namespace, for the calls on one job.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub(crate) struct NamespaceQuery {
    /// The job's namespace (default: `default`).
    #[serde(default)]
    namespace: String,
}

/// Reads of one job: `?stale=true` and its namespace.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub(crate) struct JobReadQuery {
    /// As in every read.
    #[serde(default)]
    stale: bool,
    /// The job's namespace (default: `default`).
    #[serde(default)]
    namespace: String,
}

/// `GET /v1/jobs` options.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub(crate) struct JobsQuery {
    /// As in every read.
    #[serde(default)]
    stale: bool,
    /// Only jobs whose name starts with this.
    #[serde(default)]
    prefix: String,
    /// Only this namespace's jobs (default: `default`; `*`: every namespace the token may
    /// read).
    #[serde(default)]
    namespace: String,
}

/// `GET /v1/evaluations` options.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub(crate) struct EvaluationsQuery {
    /// As in every read.
    #[serde(default)]
    stale: bool,
    /// Only this job's.
    #[serde(default)]
    job: String,
    /// At most this many, newest first (default 50, at most 1000).
    #[serde(default)]
    limit: u32,
    /// Only this namespace's (default: `default`; `*`: every namespace the token may read).
    #[serde(default)]
    namespace: String,
}

/// Lists jobs with their tasks counted by state.
#[utoipa::path(get, path = "/v1/jobs", params(JobsQuery), tag = "jobs",
    responses((status = 200, body = JobList), (status = 401, body = ApiError), (status = 403, body = ApiError), (status = 307, body = ApiError), (status = 503, body = ApiError)))]
pub(crate) async fn list_jobs(
    State(state): State<ApiState>,
    uri: OriginalUri,
    headers: HeaderMap,
    query: Result<Query<JobsQuery>, QueryRejection>,
) -> Result<Response, HttpError> {
    let query = parsed(query)?;
    let list = call(
        &state,
        &uri,
        &headers,
        "ListJobs",
        pb::ListJobsRequest {
            stale: query.stale,
            prefix: query.prefix,
            namespace: query.namespace,
        },
        |operator, request| operator.list_jobs(request),
    )
    .await?;
    let doc = JobList::from(list);
    let read = doc.read.clone();
    Ok(read_response(doc, &read))
}

/// Submits a job (new, or a new version of one): the body is the job document, the JSON form
/// of a job file.
#[utoipa::path(post, path = "/v1/jobs", request_body = JobSpec, tag = "jobs",
    responses((status = 200, body = Submitted), (status = 400, body = ApiError), (status = 401, body = ApiError), (status = 403, body = ApiError), (status = 307, body = ApiError), (status = 503, body = ApiError)))]
pub(crate) async fn submit_job(
    State(state): State<ApiState>,
    uri: OriginalUri,
    headers: HeaderMap,
    query: Result<Query<NamespaceQuery>, QueryRejection>,
    body: Bytes,
) -> Result<Response, HttpError> {
    let query = parsed(query)?;
    let caller = state.authorize(&headers, "SubmitJob")?;
    let spec = job_document(&body, &query.namespace)?;
    let job = spec
        .to_proto()
        .map_err(|e| HttpError::BadRequest(format!("job: {e}")))?;
    let reply = state
        .operator
        .submit_job(request(pb::SubmitJobRequest { job: Some(job) }, caller))
        .await
        .map_err(|s| refused(&state, &uri, s))?
        .into_inner();
    Ok(Json(Submitted::from(reply)).into_response())
}

/// The job document in `body`, in the namespace the query names if the document names none.
fn job_document(body: &[u8], namespace: &str) -> Result<JobSpec, HttpError> {
    let mut spec = JobSpec::from_json(body)
        .map_err(|e| HttpError::BadRequest(format!("the body is not a job document: {e}")))?;
    match (spec.namespace.as_str(), namespace) {
        (_, "") => {}
        ("", named) => named.clone_into(&mut spec.namespace),
        (document, named) if document != named => {
            return Err(HttpError::BadRequest(format!(
                "the body is a job of namespace {document:?}, the query names {named:?}"
            )));
        }
        _ => {}
    }
    Ok(spec)
}

/// A job: its document, tasks, evaluations and latest deployment.
#[utoipa::path(get, path = "/v1/job/{name}", params(("name" = String, Path, description = "The job's name"), JobReadQuery), tag = "jobs",
    responses((status = 200, body = JobDetail), (status = 404, body = ApiError), (status = 401, body = ApiError), (status = 307, body = ApiError)))]
pub(crate) async fn read_job(
    State(state): State<ApiState>,
    uri: OriginalUri,
    headers: HeaderMap,
    Path(name): Path<String>,
    query: Result<Query<JobReadQuery>, QueryRejection>,
) -> Result<Response, HttpError> {
    let query = parsed(query)?;
    let (stale, namespace) = (query.stale, query.namespace.clone());
    let mut doc = job_detail(&state, &uri, &headers, name.clone(), query).await?;
    doc.deployment =
        super::deployments::latest_deployment(&state, &uri, &headers, name, namespace, stale)
            .await?;
    let read = doc.read.clone();
    Ok(read_response(doc, &read))
}

async fn job_detail(
    state: &ApiState,
    uri: &OriginalUri,
    headers: &HeaderMap,
    name: String,
    query: JobReadQuery,
) -> Result<JobDetail, HttpError> {
    let reply = call(
        state,
        uri,
        headers,
        "JobStatus",
        pb::JobStatusRequest {
            name,
            stale: query.stale,
            namespace: query.namespace,
        },
        |operator, request| operator.job_status(request),
    )
    .await?;
    Ok(JobDetail::from(reply))
}

/// A job's tasks, with their agents.
#[utoipa::path(get, path = "/v1/job/{name}/tasks", params(("name" = String, Path, description = "The job's name"), JobReadQuery), tag = "jobs",
    responses((status = 200, body = Vec<TaskInfo>), (status = 404, body = ApiError), (status = 401, body = ApiError)))]
pub(crate) async fn job_tasks(
    State(state): State<ApiState>,
    uri: OriginalUri,
    headers: HeaderMap,
    Path(name): Path<String>,
    query: Result<Query<JobReadQuery>, QueryRejection>,
) -> Result<Response, HttpError> {
    let query = parsed(query)?;
    let doc = job_detail(&state, &uri, &headers, name, query).await?;
    Ok(read_response(doc.tasks, &doc.read))
}

/// A dry run: what submitting the job document in the body would place, stop and replace now.
/// Nothing is written. The body's name must be the path's.
#[utoipa::path(post, path = "/v1/job/{name}/plan", params(("name" = String, Path, description = "The job's name"), NamespaceQuery), request_body = JobSpec, tag = "jobs",
    responses((status = 200, body = muster_api::JobPlan), (status = 400, body = ApiError), (status = 401, body = ApiError), (status = 307, body = ApiError)))]
pub(crate) async fn plan_job(
    State(state): State<ApiState>,
    uri: OriginalUri,
    headers: HeaderMap,
    Path(name): Path<String>,
    query: Result<Query<NamespaceQuery>, QueryRejection>,
    body: Bytes,
) -> Result<Response, HttpError> {
    let query = parsed(query)?;
    let caller = state.authorize(&headers, "PlanJob")?;
    let spec = job_document(&body, &query.namespace)?;
    if spec.name != name {
        return Err(HttpError::BadRequest(format!(
            "the body is job {:?}, the path {name:?}",
            spec.name
        )));
    }
    let job = spec
        .to_proto()
        .map_err(|e| HttpError::BadRequest(format!("job: {e}")))?;
    let plan = state
        .operator
        .plan_job(request(pb::SubmitJobRequest { job: Some(job) }, caller))
        .await
        .map_err(|s| refused(&state, &uri, s))?
        .into_inner();
    Ok(Json(muster_api::JobPlan::from(plan)).into_response())
}

/// A job's versions, newest first (the current one and the earlier ones kept).
#[utoipa::path(get, path = "/v1/job/{name}/versions", params(("name" = String, Path, description = "The job's name"), JobReadQuery), tag = "jobs",
    responses((status = 200, body = muster_api::JobVersions), (status = 404, body = ApiError), (status = 401, body = ApiError)))]
pub(crate) async fn job_versions(
    State(state): State<ApiState>,
    uri: OriginalUri,
    headers: HeaderMap,
    Path(name): Path<String>,
    query: Result<Query<JobReadQuery>, QueryRejection>,
) -> Result<Response, HttpError> {
    let query = parsed(query)?;
    let list = call(
        &state,
        &uri,
        &headers,
        "JobVersions",
        pb::JobStatusRequest {
            name,
            stale: query.stale,
            namespace: query.namespace,
        },
        |operator, request| operator.job_versions(request),
    )
    .await?;
    let doc = muster_api::JobVersions::from(list);
    let read = doc.read.clone();
    Ok(read_response(doc, &read))
}

/// A job's evaluations, newest first.
#[utoipa::path(get, path = "/v1/job/{name}/evaluations", params(("name" = String, Path, description = "The job's name"), EvaluationsQuery), tag = "evaluations",
    responses((status = 200, body = EvaluationList), (status = 401, body = ApiError)))]
pub(crate) async fn job_evaluations(
    State(state): State<ApiState>,
    uri: OriginalUri,
    headers: HeaderMap,
    Path(name): Path<String>,
    query: Result<Query<EvaluationsQuery>, QueryRejection>,
) -> Result<Response, HttpError> {
    evaluations(&state, &uri, &headers, name, parsed(query)?).await
}

/// Evaluations, newest first, of every job or one.
#[utoipa::path(get, path = "/v1/evaluations", params(EvaluationsQuery), tag = "evaluations",
    responses((status = 200, body = EvaluationList), (status = 401, body = ApiError)))]
pub(crate) async fn list_evaluations(
    State(state): State<ApiState>,
    uri: OriginalUri,
    headers: HeaderMap,
    query: Result<Query<EvaluationsQuery>, QueryRejection>,
) -> Result<Response, HttpError> {
    let query = parsed(query)?;
    let job = query.job.clone();
    evaluations(&state, &uri, &headers, job, query).await
}

async fn evaluations(
    state: &ApiState,
    uri: &OriginalUri,
    headers: &HeaderMap,
    job: String,
    query: EvaluationsQuery,
) -> Result<Response, HttpError> {
    let list = call(
        state,
        uri,
        headers,
        "ListEvaluations",
        pb::ListEvaluationsRequest {
            stale: query.stale,
            job,
            limit: query.limit,
            id: String::new(),
            namespace: query.namespace,
        },
        |operator, request| operator.list_evaluations(request),
    )
    .await?;
    let doc = EvaluationList::from(list);
    let read = doc.read.clone();
    Ok(read_response(doc, &read))
}

/// One evaluation.
#[utoipa::path(get, path = "/v1/evaluation/{id}", params(("id" = String, Path, description = "The evaluation's id"), JobReadQuery), tag = "evaluations",
    responses((status = 200, body = EvaluationInfo), (status = 404, body = ApiError), (status = 401, body = ApiError)))]
pub(crate) async fn read_evaluation(
    State(state): State<ApiState>,
    uri: OriginalUri,
    headers: HeaderMap,
    Path(id): Path<String>,
    query: Result<Query<JobReadQuery>, QueryRejection>,
) -> Result<Response, HttpError> {
    let query = parsed(query)?;
    let list = call(
        &state,
        &uri,
        &headers,
        "ListEvaluations",
        pb::ListEvaluationsRequest {
            stale: query.stale,
            job: String::new(),
            limit: 1,
            id: id.clone(),
            // Whichever namespace it is in, if the token may read it.
            namespace: if query.namespace.is_empty() {
                "*".into()
            } else {
                query.namespace
            },
        },
        |operator, request| operator.list_evaluations(request),
    )
    .await?;
    let doc = EvaluationList::from(list);
    let eval = doc
        .evaluations
        .into_iter()
        .next()
        .ok_or_else(|| HttpError::NotFound(format!("no evaluation {id:?}")))?;
    Ok(read_response(eval, &doc.read))
}

/// Stops a job: its tasks are stopped, its document kept.
#[utoipa::path(delete, path = "/v1/job/{name}", params(("name" = String, Path, description = "The job's name"), NamespaceQuery), tag = "jobs",
    responses((status = 200, body = Submitted), (status = 404, body = ApiError), (status = 401, body = ApiError), (status = 307, body = ApiError)))]
pub(crate) async fn stop_job(
    State(state): State<ApiState>,
    uri: OriginalUri,
    headers: HeaderMap,
    Path(name): Path<String>,
    query: Result<Query<NamespaceQuery>, QueryRejection>,
) -> Result<Response, HttpError> {
    let query = parsed(query)?;
    let reply = call(
        &state,
        &uri,
        &headers,
        "StopJob",
        pb::StopJobRequest {
            name,
            namespace: query.namespace,
        },
        |operator, request| operator.stop_job(request),
    )
    .await?;
    Ok(Json(Submitted::from(reply)).into_response())
}

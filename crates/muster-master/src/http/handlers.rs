//! The endpoints of the cluster (status, health, metrics), agents, events and task logs, and
//! what every endpoint shares: each checks the token, calls the operator handler its gRPC twin
//! calls, and answers the [`muster_api`] document made from the reply. Jobs and evaluations
//! are in `jobs.rs`, namespaces in `namespaces.rs`.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{OriginalUri, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use muster_api::{
    AgentDetail, AgentList, AgentScheduling, ApiError, ClusterStatus, DrainRequest,
    EligibilityRequest, ReadInfo,
};
use muster_proto::cluster as pb;
use muster_proto::cluster::operator_server::Operator as _;
use muster_security::Caller;
use serde::Deserialize;
use utoipa::IntoParams;

use super::{ApiState, HttpError, error_response};

/// A query string that does not parse: a JSON error naming it, not axum's plain text.
pub(super) fn parsed<T>(query: Result<Query<T>, QueryRejection>) -> Result<T, HttpError> {
    query
        .map(|Query(query)| query)
        .map_err(|e| HttpError::BadRequest(format!("bad query string: {}", e.body_text())))
}

/// The operator handler's answer to `message`, asked through `method` (the gRPC twin's, named
/// `rpc`) as the caller `headers` carry, if they may call it; a refusal becomes the HTTP error
/// it maps to (a standby's, a redirect to the leader).
pub(super) async fn call<T, R>(
    state: &ApiState,
    uri: &OriginalUri,
    headers: &HeaderMap,
    rpc: &'static str,
    message: T,
    method: impl for<'a> FnOnce(&'a crate::OperatorService, tonic::Request<T>) -> OperatorCall<'a, R>,
) -> Result<R, HttpError> {
    let caller = state.authorize(headers, rpc)?;
    method(&state.operator, request(message, caller))
        .await
        .map(tonic::Response::into_inner)
        .map_err(|status| refused(state, uri, status))
}

/// What an operator handler returns: its answer, to await.
type OperatorCall<'a, R> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<tonic::Response<R>, tonic::Status>> + Send + 'a>,
>;

/// A gRPC request carrying the HTTP caller, as the gRPC guard would have set it.
pub(super) fn request<T>(message: T, caller: Caller) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.extensions_mut().insert(caller);
    request
}

/// A refusal as the API answers it: a standby's "not the leader, the leader is X" becomes a
/// redirect to the same path and query on X's HTTP port.
pub(super) fn refused(state: &ApiState, uri: &OriginalUri, status: tonic::Status) -> HttpError {
    if let Some(leader) = muster_scheduler::protocol::leader_hint(&status)
        && let Some(http) = state.config.leader_http(&leader)
    {
        let scheme = if state.secure { "https" } else { "http" };
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        return HttpError::Redirect(format!("{scheme}://{http}{path}"));
    }
    HttpError::Status(status)
}

/// `doc` with the read's headers (Nomad's `X-Nomad-Index`, `-KnownLeader`, `-LastContact`).
pub(super) fn read_response<T: serde::Serialize>(doc: T, read: &ReadInfo) -> Response {
    let mut response = Json(doc).into_response();
    let headers = response.headers_mut();
    headers.insert("x-muster-index", HeaderValue::from(read.applied_index));
    headers.insert(
        "x-muster-known-leader",
        HeaderValue::from_static(if read.known_leader { "true" } else { "false" }),
    );
    // Left out by a master that has never heard from a leader.
    if let Some(ms) = read.last_contact_ms {
        headers.insert("x-muster-last-contact", HeaderValue::from(ms));
    }
    response
}

/// `?stale=true`: answer from this master's own state (Nomad's `?stale`).
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReadQuery {
    /// Answer from the asked master's own state, without confirming it leads; the `read`
    /// field says how far behind it may be.
    #[serde(default)]
    stale: bool,
}

/// `GET /v1/event/stream` options.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub(crate) struct EventsQuery {
    /// Resume after this index (0, the default: every event still kept).
    #[serde(default)]
    index: u64,
    /// Only these topics, comma-separated: `job`, `evaluation`, `task`, `agent`.
    #[serde(default)]
    topic: String,
    /// Only this namespace's events (default: every namespace the token may read; agent
    /// events pass to a token that may read agents).
    #[serde(default)]
    namespace: String,
}

/// How often an idle event stream sends a heartbeat (`{}` in NDJSON, a comment in SSE), so
/// proxies and clients can tell a quiet stream from a dead one.
const EVENT_HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(10);

/// The event stream: jobs, evaluations, tasks and agents as they change on the leader, as
/// NDJSON (one [`muster_api::Event`] per line; `{}` heartbeats), or as server-sent events
/// when the request accepts `text/event-stream`. Resumable with `?index=`.
#[utoipa::path(get, path = "/v1/event/stream", params(EventsQuery), tag = "events",
    responses((status = 200, description = "NDJSON of Event, or SSE", body = muster_api::Event), (status = 401, body = ApiError), (status = 307, body = ApiError)))]
pub(crate) async fn event_stream(
    State(state): State<ApiState>,
    uri: OriginalUri,
    headers: HeaderMap,
    query: Result<Query<EventsQuery>, QueryRejection>,
) -> Result<Response, HttpError> {
    let query = parsed(query)?;
    let caller = state.authorize(&headers, "StreamEvents")?;
    let namespaces = match query.namespace.as_str() {
        "" => crate::visibility::NamespaceFilter::for_request(&caller, "*"),
        named => crate::visibility::NamespaceFilter::for_request(&caller, named),
    }
    .map_err(HttpError::Status)?;
    let topics: Vec<String> = query
        .topic
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .collect();
    if let Some(unknown) = topics
        .iter()
        .find(|t| !muster_api::EVENT_TOPICS.contains(&t.as_str()))
    {
        return Err(HttpError::BadRequest(format!(
            "unknown topic {unknown:?}: job, evaluation, task or agent"
        )));
    }
    let after = query.index;
    let subscription = state
        .master
        .ask(|reply| crate::requests::SubscribeEvents { after, reply }.into())
        .await
        .map_err(|e| HttpError::Status(crate::ServiceError::from(e).into()))?
        .map_err(|e| refused(&state, &uri, e.into()))?;
    let sse = headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"));
    let framing = super::events::Framing {
        sse,
        reader: caller,
        namespaces,
        heartbeat: EVENT_HEARTBEAT,
    };
    let body = super::events::body(subscription, after, topics, framing);
    let content_type = if sse {
        "text/event-stream"
    } else {
        "application/x-ndjson"
    };
    Ok((
        [
            (axum::http::header::CONTENT_TYPE, content_type),
            (axum::http::header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response())
}

/// `GET /v1/task/{id}/logs` options.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub(crate) struct LogsQuery {
    /// stderr instead of stdout.
    #[serde(default)]
    stderr: bool,
    /// Where to start, an absolute offset in the stream (0: its oldest kept byte).
    #[serde(default)]
    offset: u64,
    /// Most bytes (0: the agent's cap, 1 MiB).
    #[serde(default)]
    limit: u32,
    /// Keep the response open and send what the task writes next, until it ends (NDJSON, a
    /// document per piece).
    #[serde(default)]
    follow: bool,
    /// With `follow`: the bytes alone (`text/plain`), not documents.
    #[serde(default)]
    plain: bool,
}

/// A piece of a task's stdout or stderr, read from its agent across rotations; with
/// `follow=true`, every piece as it is written (NDJSON, or the bytes alone with `plain=true`)
/// until the task ends.
#[utoipa::path(get, path = "/v1/task/{id}/logs", params(("id" = String, Path, description = "The task's id"), LogsQuery), tag = "tasks",
    responses((status = 200, body = muster_api::TaskLogs), (status = 404, body = ApiError), (status = 503, body = ApiError), (status = 401, body = ApiError)))]
pub(crate) async fn task_logs(
    State(state): State<ApiState>,
    uri: OriginalUri,
    headers: HeaderMap,
    Path(id): Path<String>,
    query: Result<Query<LogsQuery>, QueryRejection>,
) -> Result<Response, HttpError> {
    let query = parsed(query)?;
    let caller = state.authorize(&headers, "TaskLogs")?;
    let chunk = state
        .operator
        .task_logs(request(
            pb::ReadTaskOutput {
                task_id: id.clone(),
                stderr: query.stderr,
                offset: query.offset,
                limit: query.limit,
            },
            caller.clone(),
        ))
        .await
        .map_err(|s| refused(&state, &uri, s))?
        .into_inner();
    if !query.follow {
        return Ok(Json(muster_api::TaskLogs::new(&id, query.stderr, chunk)).into_response());
    }
    let content_type = if query.plain {
        "text/plain; charset=utf-8"
    } else {
        "application/x-ndjson"
    };
    let follow = super::logs::Follow {
        operator: state.operator.clone(),
        caller,
        task_id: id,
        stderr: query.stderr,
        plain: query.plain,
    };
    Ok((
        [(axum::http::header::CONTENT_TYPE, content_type)],
        super::logs::body(follow, chunk),
    )
        .into_response())
}

async fn cluster_state(
    state: &ApiState,
    uri: &OriginalUri,
    headers: &HeaderMap,
    stale: bool,
) -> Result<pb::ClusterState, HttpError> {
    call(
        state,
        uri,
        headers,
        "GetState",
        pb::GetStateRequest { stale },
        |operator, request| operator.get_state(request),
    )
    .await
}

/// Agents: what each offers and uses, and how it stands.
#[utoipa::path(get, path = "/v1/agents", params(ReadQuery), tag = "agents",
    responses((status = 200, body = AgentList), (status = 401, body = ApiError)))]
pub(crate) async fn list_agents(
    State(state): State<ApiState>,
    uri: OriginalUri,
    headers: HeaderMap,
    query: Result<Query<ReadQuery>, QueryRejection>,
) -> Result<Response, HttpError> {
    let query = parsed(query)?;
    let cluster = cluster_state(&state, &uri, &headers, query.stale).await?;
    let doc = AgentList::from(&cluster);
    let read = doc.read.clone();
    Ok(read_response(doc, &read))
}

/// An agent and its tasks.
#[utoipa::path(get, path = "/v1/agent/{id}", params(("id" = String, Path, description = "The agent's id"), ReadQuery), tag = "agents",
    responses((status = 200, body = AgentDetail), (status = 404, body = ApiError), (status = 401, body = ApiError)))]
pub(crate) async fn read_agent(
    State(state): State<ApiState>,
    uri: OriginalUri,
    headers: HeaderMap,
    Path(id): Path<String>,
    query: Result<Query<ReadQuery>, QueryRejection>,
) -> Result<Response, HttpError> {
    let query = parsed(query)?;
    let cluster = cluster_state(&state, &uri, &headers, query.stale).await?;
    let doc = AgentDetail::find(&cluster, &id)
        .ok_or_else(|| HttpError::NotFound(format!("unknown agent {id:?}")))?;
    let read = doc.read.clone();
    Ok(read_response(doc, &read))
}

/// Starts, changes or cancels an agent's drain (Nomad's node drain): it takes no new tasks,
/// its service tasks move elsewhere a few at a time (each replacement running before the task
/// it replaces stops), batch tasks may run until the deadline, then whatever is left stops and
/// the agent is marked drained. Needs a token with agent write.
#[utoipa::path(post, path = "/v1/agent/{id}/drain", params(("id" = String, Path, description = "The agent's id")), request_body = DrainRequest, tag = "agents",
    responses((status = 200, body = AgentScheduling), (status = 400, body = ApiError), (status = 404, body = ApiError), (status = 401, body = ApiError), (status = 403, body = ApiError), (status = 307, body = ApiError)))]
pub(crate) async fn drain_agent(
    State(state): State<ApiState>,
    uri: OriginalUri,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, HttpError> {
    let caller = state.authorize(&headers, "DrainAgent")?;
    let drain: DrainRequest = if body.is_empty() {
        DrainRequest::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| HttpError::BadRequest(format!("the body is not a drain request: {e}")))?
    };
    let deadline_ms = match &drain.deadline {
        None => 0,
        Some(text) => {
            let deadline = humantime::parse_duration(text).map_err(|e| {
                HttpError::BadRequest(format!("deadline: {text:?} is not a duration: {e}"))
            })?;
            u64::try_from(deadline.as_millis())
                .unwrap_or(u64::MAX)
                .max(1)
        }
    };
    let reply = state
        .operator
        .drain_agent(request(
            pb::DrainAgentRequest {
                agent_id: id,
                deadline_ms,
                no_deadline: drain.no_deadline,
                force: drain.force,
                cancel: drain.cancel,
                keep_ineligible: drain.keep_ineligible,
            },
            caller,
        ))
        .await
        .map_err(|s| refused(&state, &uri, s))?
        .into_inner();
    Ok(Json(AgentScheduling::from(reply)).into_response())
}

/// Sets whether new tasks may be placed on an agent; its tasks stay. Refused (409) while it
/// drains. Needs a token with agent write.
#[utoipa::path(post, path = "/v1/agent/{id}/eligibility", params(("id" = String, Path, description = "The agent's id")), request_body = EligibilityRequest, tag = "agents",
    responses((status = 200, body = AgentScheduling), (status = 400, body = ApiError), (status = 404, body = ApiError), (status = 409, body = ApiError), (status = 401, body = ApiError), (status = 403, body = ApiError), (status = 307, body = ApiError)))]
pub(crate) async fn set_agent_eligibility(
    State(state): State<ApiState>,
    uri: OriginalUri,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, HttpError> {
    let caller = state.authorize(&headers, "SetAgentEligibility")?;
    let wanted: EligibilityRequest = serde_json::from_slice(&body).map_err(|e| {
        HttpError::BadRequest(format!("the body is not an eligibility request: {e}"))
    })?;
    let reply = state
        .operator
        .set_agent_eligibility(request(
            pb::AgentEligibilityRequest {
                agent_id: id,
                eligible: wanted.eligible,
            },
            caller,
        ))
        .await
        .map_err(|s| refused(&state, &uri, s))?
        .into_inner();
    Ok(Json(AgentScheduling::from(reply)).into_response())
}

/// Who leads, in which term, and how the agents stand.
#[utoipa::path(get, path = "/v1/status", params(ReadQuery), tag = "cluster",
    responses((status = 200, body = ClusterStatus), (status = 401, body = ApiError)))]
pub(crate) async fn status(
    State(state): State<ApiState>,
    uri: OriginalUri,
    headers: HeaderMap,
    query: Result<Query<ReadQuery>, QueryRejection>,
) -> Result<Response, HttpError> {
    let query = parsed(query)?;
    let cluster = cluster_state(&state, &uri, &headers, query.stale).await?;
    let mut doc = ClusterStatus::from(&cluster);
    for member in &mut doc.members {
        member.http_address = state
            .config
            .leader_http(&member.address)
            .unwrap_or_default();
    }
    let read = doc.read.clone();
    Ok(read_response(doc, &read))
}

/// The masters' raft group and each member's health (`muster operator raft list-peers`).
#[utoipa::path(get, path = "/v1/operator/raft", tag = "cluster",
    responses((status = 200, body = muster_api::RaftConfiguration), (status = 401, body = ApiError), (status = 403, body = ApiError)))]
pub(crate) async fn raft_configuration(
    State(state): State<ApiState>,
    headers: HeaderMap,
) -> Result<Response, HttpError> {
    state.authorize(&headers, "ListRaftPeers")?;
    let list = crate::raft_peers::list(state.operator.registry());
    Ok(Json(muster_api::RaftConfiguration::from(list)).into_response())
}

/// Liveness, for load balancers: the process answers. No token needed.
#[utoipa::path(get, path = "/v1/health/live", tag = "cluster", responses((status = 200, description = "The master process runs")))]
pub(crate) async fn live() -> Response {
    Json(serde_json::json!({ "status": "live" })).into_response()
}

/// Readiness, for load balancers: 200 while this master leads or stands by knowing the leader
/// (it can answer, or redirect), 503 otherwise. No token needed.
#[utoipa::path(get, path = "/v1/health/ready", tag = "cluster", responses((status = 200, description = "Ready"), (status = 503, body = ApiError)))]
pub(crate) async fn ready(State(state): State<ApiState>) -> Response {
    if *state.serving.borrow() {
        Json(serde_json::json!({ "status": "ready" })).into_response()
    } else {
        error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "this master neither leads nor knows a leader".into(),
        )
    }
}

/// The master's metrics for Prometheus: the 0.0.4 text format, or OpenMetrics when the
/// request's `Accept` asks for it. Needs a token with operator read once ACLs are on (Prometheus:
/// `authorization: { credentials: ... }`).
#[utoipa::path(get, path = "/metrics", tag = "cluster", responses((status = 200, description = "Prometheus text"), (status = 401, body = ApiError)))]
pub(crate) async fn metrics(
    State(state): State<ApiState>,
    headers: HeaderMap,
) -> Result<Response, HttpError> {
    state.authorize(&headers, "GetMetrics")?;
    let format = crate::metrics::Format::from_accept(
        headers
            .get(axum::http::header::ACCEPT)
            .and_then(|v| v.to_str().ok()),
    );
    let text = crate::metrics::render_as(&state.master, format)
        .await
        .map_err(|e| HttpError::Status(e.into()))?;
    Ok((
        [(axum::http::header::CONTENT_TYPE, format.content_type())],
        text,
    )
        .into_response())
}

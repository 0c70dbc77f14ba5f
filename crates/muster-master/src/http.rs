//! The master's HTTP/JSON API, on its own port (by default the gRPC port plus 10), with the
//! same TLS and tokens as gRPC: the server proves itself with the master's certificate, a
//! client certificate is optional, and the token travels in `X-Muster-Token` or
//! `Authorization: Bearer`. Endpoints follow Nomad's (`/v1/jobs`, `/v1/job/{name}`, ...);
//! every answer is a document of [`muster_api`], every error an [`ApiError`] with a code and a
//! message, never a bare status.
//!
//! Each endpoint calls the same handler as its gRPC twin (the [`OperatorService`] method, so
//! permissions, redaction, linearizable reads and `?stale` behave alike). A standby answers a
//! leader-only call with `307 Temporary Redirect` to the same path on the leader's HTTP port
//! (see [`HttpConfig::leader_http`]); with no leader known, `503` and code `not_leader`.
//!
//! `GET /v1/openapi.json` is the OpenAPI document, generated from the handlers ([`openapi`]).
//! `/ui/` serves the web UI, whose assets are embedded in the binary.

mod body_limit;
mod deployments;
mod events;
mod handlers;
mod jobs;
mod logs;
mod namespaces;
pub mod openapi;
mod ui;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::OriginalUri;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use muster_actor::Pid;
use muster_api::ApiError;
use muster_security::net::Listener;
use muster_security::{Caller, Permission, Requirement, Rules, Security, TokenSource};
use tokio::sync::watch;
use tonic::Code;

use crate::master::Master;
use crate::operator::OperatorService;

/// Largest request body the API reads (a job document): room for a job at the highest cap a
/// cluster may set ([`MAX_JOB_BYTES_CEILING`](muster_model::MAX_JOB_BYTES_CEILING)) written as
/// JSON, which takes at most about twice its protobuf size once control characters are
/// refused. The job read from the document is then held to the cluster's own
/// `--max-job-bytes`, as on gRPC, with an error that names the size and the limit.
pub const MAX_BODY_BYTES: usize = 2 * muster_model::MAX_JOB_BYTES_CEILING + 1024 * 1024;

/// What the HTTP API needs to know beyond the master process.
#[derive(Clone, Debug)]
pub struct HttpConfig {
    /// Masters' gRPC addresses by raft id (the registry's members).
    pub members: BTreeMap<u64, String>,
    /// Masters' HTTP addresses by raft id, where they are not their gRPC port plus the
    /// same offset as this master's.
    pub http_members: BTreeMap<u64, String>,
    /// This master's gRPC address.
    pub grpc_address: String,
    /// This master's HTTP address.
    pub http_address: String,
}

impl HttpConfig {
    /// The HTTP address of the master whose gRPC address is `leader`: as `http_members`
    /// says, or its gRPC port moved by the offset between this master's two ports.
    pub fn leader_http(&self, leader: &str) -> Option<String> {
        let id = self
            .members
            .iter()
            .find(|(_, address)| address.as_str() == leader)
            .map(|(id, _)| *id);
        if let Some(address) = id.and_then(|id| self.http_members.get(&id)) {
            return Some(address.clone());
        }
        let port = |address: &str| -> Option<(String, i64)> {
            let (host, port) = address.rsplit_once(':')?;
            Some((host.to_owned(), port.parse().ok()?))
        };
        let (_, own_grpc) = port(&self.grpc_address)?;
        let (_, own_http) = port(&self.http_address)?;
        let (host, leader_grpc) = port(leader)?;
        let leader_port = u16::try_from(leader_grpc + (own_http - own_grpc)).ok()?;
        Some(format!("{host}:{leader_port}"))
    }
}

/// Shared by every handler.
#[derive(Clone)]
pub(crate) struct ApiState {
    pub(crate) operator: OperatorService,
    pub(crate) master: Pid<Master>,
    pub(crate) tokens: Arc<dyn TokenSource>,
    /// The operator API's rules, which every endpoint checks as its gRPC twin.
    pub(crate) rules: Arc<Rules>,
    pub(crate) secure: bool,
    pub(crate) serving: watch::Receiver<bool>,
    pub(crate) config: Arc<HttpConfig>,
}

impl ApiState {
    /// Who the request's token speaks for, if it may call `rpc`, the gRPC method the
    /// endpoint answers as: the same rule the gRPC guard applies
    /// ([`operator_rules`](crate::authorization::operator_rules)). Anyone, on an insecure
    /// cluster.
    pub(crate) fn authorize(&self, headers: &HeaderMap, rpc: &str) -> Result<Caller, HttpError> {
        if !self.secure {
            return Ok(Caller::insecure());
        }
        let permission = match self.rules.requirement(rpc) {
            Requirement::Token(_, permission) => permission,
            Requirement::Certificate(_) => Permission::Manage,
        };
        muster_security::token_caller(self.tokens.as_ref(), headers, permission)
            .map_err(HttpError::Status)
    }
}

/// The router of every endpoint, for `master`.
pub(crate) fn router(state: ApiState) -> axum::Router {
    routes()
        .merge(ui::routes())
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn(body_limit::limit_bodies))
        .with_state(state)
}

/// Every route of the API.
fn routes() -> Router<ApiState> {
    Router::new()
        .route("/v1/jobs", get(jobs::list_jobs).post(jobs::submit_job))
        .route("/v1/job/{name}", get(jobs::read_job).delete(jobs::stop_job))
        .route("/v1/job/{name}/tasks", get(jobs::job_tasks))
        .route("/v1/job/{name}/versions", get(jobs::job_versions))
        .route("/v1/job/{name}/plan", axum::routing::post(jobs::plan_job))
        .route("/v1/job/{name}/evaluations", get(jobs::job_evaluations))
        .route("/v1/deployments", get(deployments::list_deployments))
        .route("/v1/deployment/{id}", get(deployments::read_deployment))
        .route(
            "/v1/deployment/{id}/promote",
            axum::routing::post(deployments::promote_deployment),
        )
        .route(
            "/v1/deployment/{id}/pause",
            axum::routing::post(deployments::pause_deployment),
        )
        .route(
            "/v1/deployment/{id}/resume",
            axum::routing::post(deployments::resume_deployment),
        )
        .route(
            "/v1/deployment/{id}/fail",
            axum::routing::post(deployments::fail_deployment),
        )
        .route("/v1/evaluations", get(jobs::list_evaluations))
        .route("/v1/evaluation/{id}", get(jobs::read_evaluation))
        .route("/v1/namespaces", get(namespaces::list_namespaces))
        .route(
            "/v1/namespace/{name}",
            axum::routing::put(namespaces::apply_namespace).delete(namespaces::delete_namespace),
        )
        .route("/v1/agents", get(handlers::list_agents))
        .route("/v1/agent/{id}", get(handlers::read_agent))
        .route(
            "/v1/agent/{id}/drain",
            axum::routing::post(handlers::drain_agent),
        )
        .route(
            "/v1/agent/{id}/eligibility",
            axum::routing::post(handlers::set_agent_eligibility),
        )
        .route("/v1/status", get(handlers::status))
        .route("/v1/operator/raft", get(handlers::raft_configuration))
        .route("/v1/health/live", get(handlers::live))
        .route("/v1/health/ready", get(handlers::ready))
        .route("/v1/task/{id}/logs", get(handlers::task_logs))
        .route("/v1/event/stream", get(handlers::event_stream))
        .route("/v1/openapi.json", get(openapi::openapi_document))
        .route("/metrics", get(handlers::metrics))
        .fallback(unknown_path)
        .method_not_allowed_fallback(method_not_allowed)
}

async fn method_not_allowed(method: axum::http::Method, uri: OriginalUri) -> Response {
    error_response(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{} does not take {method}", uri.path()),
    )
}

async fn unknown_path(uri: OriginalUri) -> Response {
    error_response(
        StatusCode::NOT_FOUND,
        "not_found",
        format!(
            "no endpoint {}; see /v1/openapi.json for the API",
            uri.path()
        ),
    )
}

/// Serves `router` on `listener` until `stopped` resolves: TLS (no client certificate
/// required) unless `security` is insecure; HTTP/1.1 and HTTP/2.
pub(crate) fn serve(
    listener: Listener,
    security: &Security,
    router: axum::Router,
    stopped: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let address = listener.local_addr();
    let routes = tonic::service::Routes::from(router);
    let server = tonic::transport::Server::builder()
        .accept_http1(true)
        .add_routes(routes);
    match security.tls() {
        Some(tls) => {
            let incoming = muster_security::tls::incoming_web(listener, tls.clone());
            tokio::spawn(async move {
                if let Err(e) = server.serve_with_incoming_shutdown(incoming, stopped).await {
                    tracing::error!(%address, error = %e, "HTTP API server failed");
                }
            });
        }
        None => {
            let incoming = listener.incoming();
            tokio::spawn(async move {
                if let Err(e) = server.serve_with_incoming_shutdown(incoming, stopped).await {
                    tracing::error!(%address, error = %e, "HTTP API server failed");
                }
            });
        }
    }
}

/// Why a request failed, as the API answers it.
#[derive(Debug)]
pub(crate) enum HttpError {
    /// A refusal or failure from the handler (or the token check), as its gRPC status.
    Status(tonic::Status),
    /// The request itself is malformed (a body that is not a job document, a bad query).
    BadRequest(String),
    /// Nothing by that name.
    NotFound(String),
    /// A standby: go to the leader at this URL.
    Redirect(String),
}

impl HttpError {
    fn code(code: Code) -> (StatusCode, &'static str) {
        match code {
            Code::InvalidArgument => (StatusCode::BAD_REQUEST, "invalid_argument"),
            Code::Unauthenticated => (StatusCode::UNAUTHORIZED, "unauthenticated"),
            Code::PermissionDenied => (StatusCode::FORBIDDEN, "permission_denied"),
            Code::NotFound => (StatusCode::NOT_FOUND, "not_found"),
            Code::FailedPrecondition => (StatusCode::CONFLICT, "failed_precondition"),
            Code::Aborted => (StatusCode::CONFLICT, "aborted"),
            Code::OutOfRange => (StatusCode::CONFLICT, "out_of_range"),
            Code::Unavailable | Code::DeadlineExceeded => {
                (StatusCode::SERVICE_UNAVAILABLE, "unavailable")
            }
            Code::ResourceExhausted => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

/// An error document with its status.
pub(crate) fn error_response(status: StatusCode, code: &str, message: String) -> Response {
    (
        status,
        Json(ApiError {
            code: code.to_owned(),
            message,
        }),
    )
        .into_response()
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        match self {
            HttpError::Status(status) => {
                let (http, code) = HttpError::code(status.code());
                let code = if status.code() == Code::Unavailable
                    && status.message().starts_with("not the leading master")
                {
                    "not_leader"
                } else {
                    code
                };
                error_response(http, code, status.message().to_owned())
            }
            HttpError::BadRequest(message) => {
                error_response(StatusCode::BAD_REQUEST, "bad_request", message)
            }
            HttpError::NotFound(message) => {
                error_response(StatusCode::NOT_FOUND, "not_found", message)
            }
            HttpError::Redirect(location) => {
                let mut response = error_response(
                    StatusCode::TEMPORARY_REDIRECT,
                    "not_leader",
                    format!("not the leading master; the leader serves this at {location}"),
                );
                if let Ok(value) = HeaderValue::from_str(&location) {
                    response.headers_mut().insert(header::LOCATION, value);
                }
                response
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_leaders_http_address_is_its_grpc_port_moved_by_the_same_offset_unless_listed() {
        let mut config = HttpConfig {
            members: BTreeMap::from([(1, "10.0.0.1:5050".into()), (2, "10.0.0.2:6050".into())]),
            http_members: BTreeMap::new(),
            grpc_address: "10.0.0.1:5050".into(),
            http_address: "10.0.0.1:5051".into(),
        };
        assert_eq!(
            config.leader_http("10.0.0.2:6050").as_deref(),
            Some("10.0.0.2:6051")
        );
        config.http_members.insert(2, "web.example:443".into());
        assert_eq!(
            config.leader_http("10.0.0.2:6050").as_deref(),
            Some("web.example:443")
        );
        assert_eq!(config.leader_http("not an address"), None);
    }
}

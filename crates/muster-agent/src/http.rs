//! The agent's HTTP port, beside its gRPC one (by default that port plus
//! [`HTTP_PORT_OFFSET`], as a master's HTTP API is): `GET /metrics` for Prometheus, and
//! liveness and readiness for load balancers.
//!
//! - `GET /metrics`: the agent's metrics in the Prometheus text format (see
//!   [`crate::metrics`]).
//! - `GET /v1/health/live`: 200 `{"status":"live"}` while the agent process answers.
//! - `GET /v1/health/ready`: 200 `{"status":"ready"}` while the agent is registered with a
//!   master, else 503 `{"code":"unavailable","message":...}`.
//!
//! No token is asked for: an agent has no token table (the registry's tokens live with the
//! masters), and nothing here changes anything or shows more than a task's id and job. The
//! port has the same TLS as the rest of the agent: the server proves itself with the agent's
//! certificate, and a client certificate is verified if presented but not required (a
//! Prometheus scraper needs only the cluster CA). Every error is a JSON document with a code
//! and a message, as the master's API answers.

use std::future::Future;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use muster_security::Security;
use muster_security::net::Listener;
use muster_transport::Node;
use serde::Serialize;
use tokio::sync::watch;

use crate::AgentHandle;

/// How far above its gRPC port an agent's HTTP port is by default: 5061 beside 5051, as a
/// master's HTTP API is 10 above its gRPC port.
pub const HTTP_PORT_OFFSET: u16 = 10;

/// Why the HTTP port's address cannot be derived from the gRPC one (see [`http_address`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HttpAddressError {
    /// The gRPC listen address has no port.
    #[error("the listen address {0:?} has no port")]
    NoPort(String),
    /// The gRPC port is too high to add [`HTTP_PORT_OFFSET`] to.
    #[error("no port after {0} for the HTTP port; set --http-listen")]
    NoPortAfter(u16),
}

/// Where the HTTP port listens: `http_listen` if given, else the gRPC address `listen` with
/// its port plus [`HTTP_PORT_OFFSET`] (port 0 stays 0: any free port).
///
/// # Errors
/// [`HttpAddressError`] naming `listen` if it has no port, or its port if it is too high to
/// add the offset.
pub fn http_address(listen: &str, http_listen: Option<&str>) -> Result<String, HttpAddressError> {
    if let Some(address) = http_listen {
        return Ok(address.to_owned());
    }
    let (host, port) = listen
        .rsplit_once(':')
        .and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?)))
        .ok_or_else(|| HttpAddressError::NoPort(listen.to_owned()))?;
    let port = if port == 0 {
        0
    } else {
        port.checked_add(HTTP_PORT_OFFSET)
            .ok_or(HttpAddressError::NoPortAfter(port))?
    };
    Ok(format!("{host}:{port}"))
}

/// What the handlers read.
#[derive(Clone, Debug)]
struct HttpState {
    agent: AgentHandle,
    node: Node,
    serving: watch::Receiver<bool>,
}

/// The HTTP port's routes for `agent` on `node`; `serving` is true while the agent is
/// registered (as [`AgentHandle::report_registered`] keeps it).
pub fn router(agent: AgentHandle, node: Node, serving: watch::Receiver<bool>) -> axum::Router {
    axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/v1/health/live", get(live))
        .route("/v1/health/ready", get(ready))
        .fallback(unknown_path)
        .with_state(HttpState {
            agent,
            node,
            serving,
        })
}

/// Serves `router` on `listener` until `stopped` resolves: TLS with the agent's certificate
/// (no client certificate required) unless `security` is insecure; HTTP/1.1 and HTTP/2. A
/// server that fails is logged.
pub fn serve(
    listener: Listener,
    security: &Security,
    router: axum::Router,
    stopped: impl Future<Output = ()> + Send + 'static,
) {
    let address = listener.local_addr();
    let server = tonic::transport::Server::builder()
        .accept_http1(true)
        .add_routes(tonic::service::Routes::from(router));
    match security.tls() {
        Some(tls) => {
            let incoming = muster_security::tls::incoming_web(listener, tls.clone());
            tokio::spawn(async move {
                if let Err(e) = server.serve_with_incoming_shutdown(incoming, stopped).await {
                    tracing::error!(%address, error = %e, "the agent's HTTP server failed");
                }
            });
        }
        None => {
            let incoming = listener.incoming();
            tokio::spawn(async move {
                if let Err(e) = server.serve_with_incoming_shutdown(incoming, stopped).await {
                    tracing::error!(%address, error = %e, "the agent's HTTP server failed");
                }
            });
        }
    }
}

/// An error document, as the master's API answers them.
#[derive(Debug, Serialize)]
struct ApiError {
    code: &'static str,
    message: String,
}

fn error_response(status: StatusCode, code: &'static str, message: String) -> Response {
    (status, Json(ApiError { code, message })).into_response()
}

/// How long a scrape waits for the agent process's figures (a scraper's own timeout is
/// usually 10 s).
const GATHER_TIMEOUT: Duration = Duration::from_secs(8);

/// `GET /metrics`: the agent's metrics, Prometheus text; 503 if the agent process has ended
/// or did not answer within [`GATHER_TIMEOUT`].
async fn metrics(State(state): State<HttpState>) -> Response {
    let gathered = tokio::time::timeout(
        GATHER_TIMEOUT,
        crate::metrics::gather(&state.agent, &state.node),
    )
    .await;
    match gathered {
        Ok(Ok(text)) => {
            ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response()
        }
        Ok(Err(error)) => error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            format!("cannot gather the agent's metrics: {error}"),
        ),
        Err(_) => error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            format!("the agent process did not give its figures within {GATHER_TIMEOUT:?}"),
        ),
    }
}

/// `GET /v1/health/live`: the process answers.
async fn live() -> Response {
    Json(Status { status: "live" }).into_response()
}

/// `GET /v1/health/ready`: 200 while registered with a master, else 503.
async fn ready(State(state): State<HttpState>) -> Response {
    if *state.serving.borrow() {
        Json(Status { status: "ready" }).into_response()
    } else {
        error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "this agent is not registered with a master".into(),
        )
    }
}

/// `{"status": status}`.
#[derive(Debug, Serialize)]
struct Status {
    status: &'static str,
}

async fn unknown_path(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    error_response(
        StatusCode::NOT_FOUND,
        "not_found",
        format!(
            "no {method} {} here: the agent serves GET /metrics, /v1/health/live and \
             /v1/health/ready",
            uri.path()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_http_port_is_the_grpc_port_plus_ten_unless_given() {
        assert_eq!(
            http_address("127.0.0.1:5051", None).as_deref(),
            Ok("127.0.0.1:5061")
        );
        assert_eq!(
            http_address("127.0.0.1:0", None).as_deref(),
            Ok("127.0.0.1:0")
        );
        assert_eq!(
            http_address("[::1]:7000", None).as_deref(),
            Ok("[::1]:7010")
        );
        assert_eq!(
            http_address("127.0.0.1:5051", Some("0.0.0.0:9100")).as_deref(),
            Ok("0.0.0.0:9100")
        );
        let Err(error) = http_address("127.0.0.1:65530", None) else {
            panic!("65540 is no port");
        };
        assert!(error.to_string().contains("--http-listen"), "{error}");
        let Err(error) = http_address("no-port", None) else {
            panic!("an address without a port");
        };
        assert!(error.to_string().contains("\"no-port\""), "{error}");
    }
}

//! The web UI: three files embedded in the binary (no build toolchain), served at `/ui/`, and
//! a redirect from `/`. The page talks to the same HTTP API as everyone else, with the token
//! the user signs in with.

use axum::Router;
use axum::http::header;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

use super::ApiState;

const INDEX: &str = include_str!("ui/index.html");
const APP: &str = include_str!("ui/app.js");
const STYLE: &str = include_str!("ui/style.css");

/// What the page may load: only from this origin (inline `style` attributes for the bars).
const CONTENT_SECURITY_POLICY: &str =
    "default-src 'self'; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'";

/// The UI's routes.
pub(super) fn routes() -> Router<ApiState> {
    Router::new()
        .route("/", get(|| async { Redirect::temporary("/ui/") }))
        .route("/ui", get(|| async { Redirect::temporary("/ui/") }))
        .route(
            "/ui/",
            get(|| async { asset("text/html; charset=utf-8", INDEX) }),
        )
        .route(
            "/ui/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP) }),
        )
        .route(
            "/ui/style.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

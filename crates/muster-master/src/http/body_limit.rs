//! The HTTP API's body limit, answered as every other refusal is: a `413` JSON document that
//! names the size and the limit, never a connection or stream cut while the client still
//! sends.
//!
//! A body declared larger than the limit (`Content-Length`) is read and dropped, up to
//! [`DRAIN_LIMIT`], before the answer goes out, so that the client, still writing, reads the
//! answer instead of a reset; one larger still is answered at once. A body that turns out too
//! large while read (no declared length) is refused by the handler's extractor, whose plain
//! text answer is turned into the same document here.

use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use futures_util::StreamExt as _;

use super::{MAX_BODY_BYTES, error_response};

/// The most of a refused body read and dropped before answering.
const DRAIN_LIMIT: u64 = 64 * 1024 * 1024;

/// The refusal of a body of `size` bytes (if known).
fn too_large(size: Option<u64>) -> Response {
    let size = size.map_or_else(|| "larger".to_owned(), |n| format!("{n} bytes"));
    error_response(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        format!("the request body is {size}, over the HTTP API's limit of {MAX_BODY_BYTES} bytes"),
    )
}

/// The middleware: see the module's docs.
pub(crate) async fn limit_bodies(request: Request, next: Next) -> Response {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if let Some(size) = declared.filter(|size| *size > MAX_BODY_BYTES as u64) {
        if size <= DRAIN_LIMIT {
            let mut body = request.into_body().into_data_stream();
            while let Some(Ok(_)) = body.next().await {}
        }
        return too_large(Some(size));
    }
    let response = next.run(request).await;
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"application/json"));
    if response.status() == StatusCode::PAYLOAD_TOO_LARGE && !is_json {
        return too_large(None);
    }
    response
}

//! The endpoints of namespaces: list them (those the token may read), create or change one,
//! delete one (a management token). Each calls the operator handler its gRPC twin calls.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{OriginalUri, Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use muster_api::NamespaceInfo;
use muster_proto::cluster as pb;
use muster_proto::cluster::operator_server::Operator as _;

use super::handlers::call;
use super::{ApiError, ApiState, HttpError};

/// The namespaces the token may read jobs in, `default` included, by name.
#[utoipa::path(get, path = "/v1/namespaces", tag = "namespaces",
    responses((status = 200, body = Vec<NamespaceInfo>), (status = 401, body = ApiError), (status = 307, body = ApiError)))]
pub(crate) async fn list_namespaces(
    State(state): State<ApiState>,
    uri: OriginalUri,
    headers: HeaderMap,
) -> Result<Response, HttpError> {
    let list = call(
        &state,
        &uri,
        &headers,
        "ListNamespaces",
        pb::ListNamespacesRequest {},
        |operator, request| operator.list_namespaces(request),
    )
    .await?;
    let namespaces: Vec<NamespaceInfo> = list
        .namespaces
        .into_iter()
        .map(NamespaceInfo::from)
        .collect();
    Ok(Json(namespaces).into_response())
}

/// Creates or changes a namespace (a management token). The body's `name`, if given, must be
/// the path's.
#[utoipa::path(put, path = "/v1/namespace/{name}", params(("name" = String, Path, description = "The namespace's name")), request_body = NamespaceInfo, tag = "namespaces",
    responses((status = 200, body = NamespaceInfo), (status = 400, body = ApiError), (status = 401, body = ApiError), (status = 403, body = ApiError), (status = 307, body = ApiError)))]
pub(crate) async fn apply_namespace(
    State(state): State<ApiState>,
    uri: OriginalUri,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, HttpError> {
    let mut namespace: NamespaceInfo = if body.is_empty() {
        NamespaceInfo::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| HttpError::BadRequest(format!("the body is not a namespace: {e}")))?
    };
    if namespace.name.is_empty() {
        namespace.name.clone_from(&name);
    } else if namespace.name != name {
        return Err(HttpError::BadRequest(format!(
            "the body is namespace {:?}, the path {name:?}",
            namespace.name
        )));
    }
    let wire = pb::Namespace::from(namespace.clone());
    call(
        &state,
        &uri,
        &headers,
        "ApplyNamespace",
        wire,
        |operator, request| operator.apply_namespace(request),
    )
    .await?;
    Ok(Json(namespace).into_response())
}

/// Deletes a namespace with its stopped jobs (a management token): 409 for `default`, or
/// while a job in it is not stopped.
#[utoipa::path(delete, path = "/v1/namespace/{name}", params(("name" = String, Path, description = "The namespace's name")), tag = "namespaces",
    responses((status = 200, description = "Deleted"), (status = 404, body = ApiError), (status = 409, body = ApiError), (status = 401, body = ApiError), (status = 403, body = ApiError)))]
pub(crate) async fn delete_namespace(
    State(state): State<ApiState>,
    uri: OriginalUri,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Response, HttpError> {
    call(
        &state,
        &uri,
        &headers,
        "DeleteNamespace",
        pb::DeleteNamespaceRequest { name: name.clone() },
        |operator, request| operator.delete_namespace(request),
    )
    .await?;
    Ok(Json(serde_json::json!({ "deleted": name })).into_response())
}

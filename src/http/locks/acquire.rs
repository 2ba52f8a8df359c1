//! `POST /locks/{name}`: take a lock.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};

use super::input::acquire_request;
use super::model::{AcquireBody, AcquireQuery, Grant};
use crate::http::extract::{JsonBody, LockPath, StrictQuery};
use crate::http::problem::{ApiError, Problem};
use crate::http::state::AppState;
use crate::lock::Acquired;

/// Take the lock `name` for `ttl_ms`, or renew it when `token` already
/// holds it. Fails at once with 409 when another holder has it.
#[utoipa::path(
    post,
    path = "/locks/{name}",
    tag = "locks",
    params(
        ("name" = String, Path, description = "Lock name: 1 to 200 of `A-Za-z0-9._-:@`"),
        ("Lock-Token" = Option<String>, Header, description = "A token of your choosing (or `token` in the body); without one, lockd generates one"),
        AcquireQuery,
    ),
    request_body(content = Option<AcquireBody>, description = "Optional; an empty body takes the defaults"),
    responses(
        (status = 201, description = "Granted: a new lease with a new fence", body = Grant),
        (status = 200, description = "Renewed: the given token already held the lock; same fence, lease reset", body = Grant),
        (status = 400, description = "Invalid name, TTL, token, owner or body; nothing was written", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Another holder has the lock; `retry_after_ms` and `Retry-After` say when it frees at the latest", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over 64 KiB", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis did not answer in time", body = Problem, content_type = "application/problem+json"),
    ),
)]
pub async fn acquire(
    State(state): State<AppState>,
    LockPath(name): LockPath,
    headers: HeaderMap,
    StrictQuery(query): StrictQuery<AcquireQuery>,
    JsonBody(body): JsonBody<AcquireBody>,
) -> Result<(StatusCode, Json<Grant>), ApiError> {
    let request = acquire_request(name, query, &headers, body, &state.ttl)?;
    let outcome = state.locks.acquire(&request).await?;
    let status = match outcome {
        Acquired::Granted(_) => StatusCode::CREATED,
        Acquired::Renewed(_) => StatusCode::OK,
    };
    let grant = Grant::new(
        &request.name,
        request.token.expose().to_owned(),
        outcome.lease(),
    );
    Ok((status, Json(grant)))
}

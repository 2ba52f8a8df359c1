//! `POST /semaphores/{name}`: take a permit.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, StatusCode};
use tokio::time::Instant;

use super::input::permit_request;
use super::model::{PermitGrant, TakeBody, TakeQuery};
use crate::http::deadline::Deadline;
use crate::http::extract::{JsonBody, LockPath, StrictQuery};
use crate::http::limits::Limits;
use crate::http::locks::model::{LockNameSchema, LockTokenSchema};
use crate::http::problem::{ApiError, BodyRefusals, KeyRefusals, Problem, StoreError};
use crate::lock::semaphore::PermitOutcome;
use crate::lock::{LockError, Locks};
use crate::metrics::Metrics;

/// Take one permit of the semaphore `name`, which lets at most `limit`
/// holders in at once, each for its own `ttl_ms`; or renew the permit
/// `token` holds. When all permits are held, fail at once with 409, or,
/// with `wait_ms`, wait up to that long (in arrival order, woken by a
/// permit given back or running out).
///
/// `limit`, `ttl_ms`, `owner` and `wait_ms` may come in the query string
/// instead of the body (`?limit=5&ttl_ms=30000`), and a token of your
/// choosing as `token` in the body instead of the `Lock-Token` header. This
/// document shows each in one place only, since a value given in both is
/// refused.
#[utoipa::path(
    post,
    path = "/semaphores/{name}",
    operation_id = "takePermit",
    tag = "semaphores",
    params(
        ("name" = LockNameSchema, Path, description = "Semaphore name: the alphabet of lock names; a semaphore and a lock of the same name are unrelated"),
        ("Lock-Token" = Option<LockTokenSchema>, Header, nullable = false, description = "A token of your choosing; without one, lockd generates one. Sending the same token again while it holds a permit renews that permit (200): it never takes a second one"),
    ),
    request_body(content = TakeBody, description = "`limit` is required (here or in the query)"),
    security((), ("bearer" = [])),
    responses(
        (status = 201, description = "Granted: a new permit with a new fence", body = PermitGrant),
        (status = 200, description = "Renewed: the token already held a permit; same fence, lease reset", body = PermitGrant),
        (status = 400, description = "No limit, or an invalid limit, name, TTL, token, owner or body; nothing was written", body = Problem, content_type = "application/problem+json"),
        KeyRefusals,
        (status = 409, description = "`semaphore-full`: all `limit` permits are held (after `wait_ms`, if given); `retry_after_ms` and `Retry-After` say when the earliest runs out. `limit-mismatch`: the permits are held under another `limit`, given in the document's `limit`", body = Problem, content_type = "application/problem+json"),
        BodyRefusals,
        (status = 501, description = "`not-implemented`: this server runs Redlock, which cannot keep a semaphore's limit", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis did not answer in time, too many requests are waiting, or the service is shutting down; see `Retry-After`", body = Problem, content_type = "application/problem+json"),
        StoreError,
    ),
)]
// One argument per extractor: the state parts it uses, then the request.
#[allow(clippy::too_many_arguments)]
pub async fn take(
    State(locks): State<Arc<Locks>>,
    State(metrics): State<Arc<Metrics>>,
    State(limits): State<Limits>,
    Extension(deadline): Extension<Deadline>,
    LockPath(name): LockPath,
    headers: HeaderMap,
    StrictQuery(query): StrictQuery<TakeQuery>,
    JsonBody(body): JsonBody<TakeBody>,
) -> Result<(StatusCode, Json<PermitGrant>), ApiError> {
    let started = Instant::now();
    let wait = limits
        .wait
        .resolve(query.wait_ms.as_deref(), body.wait_ms)?;
    let request = permit_request(name, query, &headers, body, &limits)?;
    // As for a lock's acquire: the headers are not kept through a wait.
    drop(headers);
    let (name, token) = (request.name.clone(), request.token.clone());
    let counted = metrics.pending_permit(&name, started);
    // Giving up here is safe: a permit granted after it is given back.
    let limit = deadline.remaining() + wait;
    let Ok(outcome) = tokio::time::timeout(limit, locks.take_permit(request, wait)).await else {
        counted.finish(&Err(LockError::TimedOut));
        return Err(ApiError::timeout());
    };
    counted.finish(&outcome);
    let (status, permit) = match outcome?? {
        PermitOutcome::Granted(permit) => (StatusCode::CREATED, permit),
        PermitOutcome::Renewed(permit) => (StatusCode::OK, permit),
    };
    let grant = PermitGrant::new(&name, token.expose().to_owned(), &permit);
    Ok((status, Json(grant)))
}

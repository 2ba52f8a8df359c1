//! `POST /locks/{name}`: take a lock.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, StatusCode};
use tokio::time::Instant;

use super::input::acquire_request;
use super::model::{AcquireBody, AcquireQuery, Grant, LockNameSchema, LockTokenSchema};
use crate::http::deadline::Deadline;
use crate::http::extract::{JsonBody, LockPath, StrictQuery};
use crate::http::limits::Limits;
use crate::http::problem::{ApiError, BodyRefusals, KeyRefusals, Problem, StoreError};
use crate::lock::{Acquired, LockError, Locks};
use crate::metrics::Metrics;

/// Take the lock `name` for `ttl_ms`, or renew it when `token` already
/// holds it. When another holder has it, fail at once with 409, or, with
/// `wait_ms`, wait up to that long for it (in arrival order, woken by the
/// release or the lease's end).
///
/// With `mode: "shared"`, any number of holders share the lock, each with
/// its own token, lease and fence, while no exclusive holder is live and
/// no exclusive request waits (a waiting writer keeps new shared requests
/// out, so readers never starve it). A token keeps its mode: asking for
/// the other one is 409 `mode-mismatch` at once, even with `wait_ms`.
///
/// `ttl_ms`, `owner` and `wait_ms` may come in the query string instead of
/// the body (`?ttl_ms=30000&owner=cron`), and a token of your choosing as
/// `token` in the body instead of the `Lock-Token` header. This document
/// shows each in one place only, since a value given in both is refused.
#[utoipa::path(
    post,
    path = "/locks/{name}",
    operation_id = "acquireLock",
    tag = "locks",
    params(
        ("name" = LockNameSchema, Path, description = "Lock name: 1 to 200 of `A-Za-z0-9._-:@`, other than `.` and `..`"),
        ("Lock-Token" = Option<LockTokenSchema>, Header, nullable = false, description = "A token of your choosing; without one, lockd generates one. Sending the same token again while it holds the lock renews the lease (200) instead of failing: safe retries after a lost response"),
    ),
    request_body(content = Option<AcquireBody>, description = "Optional; an empty body takes the defaults"),
    security((), ("bearer" = [])),
    responses(
        (status = 201, description = "Granted: a new lease with a new fence", body = Grant),
        (status = 200, description = "Renewed: the given token already held the lock; same fence, lease reset", body = Grant),
        (status = 400, description = "Invalid name, TTL, token, owner or body; nothing was written", body = Problem, content_type = "application/problem+json"),
        KeyRefusals,
        (status = 409, description = "`lock-held`: another holder has the lock, or shared leases keep an exclusive request out, or a waiting exclusive request keeps a shared one out (after `wait_ms`, if given); `retry_after_ms` and `Retry-After` say when to try again. `mode-mismatch`: the token holds the lock in the other mode; nothing was changed", body = Problem, content_type = "application/problem+json"),
        (status = 501, description = "`not-implemented`: Redlock mode has no shared locks", body = Problem, content_type = "application/problem+json"),
        BodyRefusals,
        (status = 503, description = "Redis did not answer in time, too many requests are waiting, or the service is shutting down; see `Retry-After`", body = Problem, content_type = "application/problem+json"),
        StoreError,
    ),
)]
// One argument per extractor: the state parts it uses, then the request.
// Not an async fn: the request is read here, before the future that waits
// is made, so that the future holds what the wait needs and not the
// extractors (an async fn keeps its arguments for its whole life: some
// hundreds of bytes for every parked waiter; docs/performance.md). The
// header values are slices of hyper's read buffer, too: held through a
// wait, they would keep that buffer (8 KiB) alive beside the one hyper
// reads the next request into.
#[allow(clippy::too_many_arguments)]
pub fn acquire(
    State(locks): State<Arc<Locks>>,
    State(metrics): State<Arc<Metrics>>,
    State(limits): State<Limits>,
    Extension(deadline): Extension<Deadline>,
    LockPath(name): LockPath,
    headers: HeaderMap,
    StrictQuery(query): StrictQuery<AcquireQuery>,
    JsonBody(body): JsonBody<AcquireBody>,
) -> impl Future<Output = Result<(StatusCode, Json<Grant>), ApiError>> {
    let started = Instant::now();
    let read = limits
        .wait
        .resolve(query.wait_ms.as_deref(), body.wait_ms)
        .and_then(|wait| Ok((wait, acquire_request(name, query, &headers, body, &limits)?)));
    drop(headers);
    async move {
        let (wait, request) = read?;
        take(&locks, &metrics, deadline, request, wait, started).await
    }
}

/// The acquire `request`, waiting up to `wait` (see [`acquire`]).
async fn take(
    locks: &Locks,
    metrics: &Metrics,
    deadline: Deadline,
    request: crate::lock::AcquireRequest,
    wait: std::time::Duration,
    started: Instant,
) -> Result<(StatusCode, Json<Grant>), ApiError> {
    let (name, token, mode) = (request.name.clone(), request.token.clone(), request.mode);
    // Counted as cancelled if the client goes away before the answer.
    let counted = metrics.pending_acquire(&name, mode, started);
    // The wait this request asked for, plus the time any request may take.
    // Giving up here is safe: a grant made after it is released again.
    let limit = deadline.remaining() + wait;
    let Ok(outcome) = tokio::time::timeout(limit, locks.acquire(request, wait)).await else {
        counted.finish(&Err(LockError::TimedOut));
        return Err(ApiError::timeout());
    };
    counted.finish(&outcome);
    let outcome = outcome.map_err(|e| ApiError::refused_acquire(e, mode))?;
    let status = match outcome {
        Acquired::Granted(_) => StatusCode::CREATED,
        Acquired::Renewed(_) => StatusCode::OK,
    };
    let grant = Grant::new(&name, token.expose().to_owned(), mode, outcome.lease());
    Ok((status, Json(grant)))
}

//! `DELETE /locks/{name}`: release a lock.

use std::sync::Arc;

use axum::extract::{Extension, State};
use axum::http::{HeaderMap, StatusCode};

use super::input::holder_token;
use super::model::{LockNameSchema, LockTokenSchema, NoQuery, ReleaseBody};
use crate::http::deadline::{Deadline, timeout_or, within};
use crate::http::extract::{JsonBody, LockPath, StrictQuery};
use crate::http::problem::{ApiError, Problem};
use crate::lock::Locks;
use crate::metrics::Metrics;

/// Release a lock you hold (compare-and-delete on the token).
///
/// The token may come as `token` in the body instead of the `Lock-Token`
/// header. This document shows the header only, since a token given in
/// both is refused.
#[utoipa::path(
    delete,
    path = "/locks/{name}",
    tag = "locks",
    params(
        ("name" = LockNameSchema, Path, description = "Lock name"),
        ("Lock-Token" = LockTokenSchema, Header, description = "The holder's token"),
    ),
    request_body(content = Option<ReleaseBody>),
    security((), ("bearer" = [])),
    responses(
        (status = 204, description = "Released"),
        (status = 400, description = "No token, or an invalid body", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "With API keys on: no key, an unknown key, or a malformed `Authorization` header (`WWW-Authenticate` says which); nothing was written", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "With API keys on: the key lacks the permission this method needs, or the lock name is outside its prefixes; nothing was written", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "With API keys on: the key is over its `requests_per_second`; `retry_after_ms` and `Retry-After` say when to retry", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Nobody holds the lock: the lease ran out or it was released", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Another token holds the lock; nothing was changed", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over 64 KiB", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "The body is compressed (`Content-Encoding`); nothing was written", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis did not answer in time", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Redis refused the operation (`backend-error`: a wrong password, or a key of the wrong type written by another client), or a bug (`internal`); the server log says why", body = Problem, content_type = "application/problem+json"),
    ),
)]
pub async fn release(
    State(locks): State<Arc<Locks>>,
    State(metrics): State<Arc<Metrics>>,
    Extension(deadline): Extension<Deadline>,
    LockPath(name): LockPath,
    headers: HeaderMap,
    StrictQuery(NoQuery {}): StrictQuery<NoQuery>,
    JsonBody(body): JsonBody<ReleaseBody>,
) -> Result<StatusCode, ApiError> {
    let token = holder_token(&headers, body.token.as_deref())?;
    let outcome = within(deadline, locks.release(&name, &token)).await;
    metrics.observe_release(&name, &outcome);
    outcome.map_err(timeout_or)?;
    Ok(StatusCode::NO_CONTENT)
}

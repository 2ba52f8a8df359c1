//! `DELETE /locks/{name}`: release a lock.

use std::sync::Arc;

use axum::extract::{Extension, State};
use axum::http::{HeaderMap, StatusCode};

use super::input::holder_token;
use super::model::{LockNameSchema, LockTokenSchema, NoQuery, ReleaseBody};
use crate::http::deadline::{Deadline, timeout_or, within};
use crate::http::extract::{JsonBody, LockPath, StrictQuery};
use crate::http::problem::{ApiError, BodyRefusals, KeyRefusals, Problem, StoreError};
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
    operation_id = "releaseLock",
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
        KeyRefusals,
        (status = 404, description = "Nobody holds the lock: the lease ran out or it was released", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Another token holds the lock; nothing was changed", body = Problem, content_type = "application/problem+json"),
        BodyRefusals,
        (status = 503, description = "Redis did not answer in time", body = Problem, content_type = "application/problem+json"),
        StoreError,
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

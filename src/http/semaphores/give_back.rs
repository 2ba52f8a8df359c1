//! `DELETE /semaphores/{name}`: give a permit back.

use std::sync::Arc;

use axum::extract::{Extension, State};
use axum::http::{HeaderMap, StatusCode};

use crate::http::deadline::{Deadline, timeout_or, within};
use crate::http::extract::{JsonBody, LockPath, StrictQuery};
use crate::http::locks::input::holder_token;
use crate::http::locks::model::{LockNameSchema, LockTokenSchema, NoQuery, ReleaseBody};
use crate::http::problem::{ApiError, BodyRefusals, KeyRefusals, Problem, StoreError};
use crate::lock::Locks;
use crate::metrics::Metrics;

/// Give back the permit the token holds: the next waiter, on any lockd
/// instance, is woken at once.
#[utoipa::path(
    delete,
    path = "/semaphores/{name}",
    operation_id = "releasePermit",
    tag = "semaphores",
    params(
        ("name" = LockNameSchema, Path, description = "Semaphore name"),
        ("Lock-Token" = LockTokenSchema, Header, description = "The permit's token"),
    ),
    request_body(content = Option<ReleaseBody>),
    security((), ("bearer" = [])),
    responses(
        (status = 204, description = "Given back"),
        (status = 400, description = "No token, or an invalid body", body = Problem, content_type = "application/problem+json"),
        KeyRefusals,
        (status = 404, description = "`permit-not-held`: the token holds no permit here (given back already, or run out)", body = Problem, content_type = "application/problem+json"),
        BodyRefusals,
        (status = 501, description = "`not-implemented`: Redlock mode has no semaphores", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Redis did not answer in time", body = Problem, content_type = "application/problem+json"),
        StoreError,
    ),
)]
pub async fn give_back(
    State(locks): State<Arc<Locks>>,
    State(metrics): State<Arc<Metrics>>,
    Extension(deadline): Extension<Deadline>,
    LockPath(name): LockPath,
    headers: HeaderMap,
    StrictQuery(NoQuery {}): StrictQuery<NoQuery>,
    JsonBody(body): JsonBody<ReleaseBody>,
) -> Result<StatusCode, ApiError> {
    let token = holder_token(&headers, body.token.as_deref())?;
    let outcome = within(deadline, locks.give_back_permit(&name, &token)).await;
    metrics.observe_permit_release(&name, &outcome);
    match outcome.map_err(timeout_or)? {
        Some(_) => Ok(StatusCode::NO_CONTENT),
        None => Err(super::problem::permit_not_held()),
    }
}

//! `PATCH /locks/{name}`: extend a lease.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Extension, State};
use axum::http::HeaderMap;

use super::input::holder_token;
use super::model::{ExtendBody, ExtendQuery, Extended, LockNameSchema, LockTokenSchema};
use crate::http::deadline::{Deadline, timeout_or, within};
use crate::http::extract::{JsonBody, LockPath, StrictQuery};
use crate::http::limits::Limits;
use crate::http::problem::{ApiError, BodyRefusals, KeyRefusals, Problem, StoreError};
use crate::lock::Locks;
use crate::metrics::Metrics;

/// Reset the lease of a lock you hold to `ttl_ms` from now; without
/// `ttl_ms`, to the lock's own TTL (the one it was granted with, or last
/// extended to). Never creates a lock: an expired lease stays expired.
///
/// `ttl_ms` may come in the query string instead of the body
/// (`?ttl_ms=30000`), and the token as `token` in the body instead of the
/// `Lock-Token` header. This document shows each in one place only, since a
/// value given in both is refused.
#[utoipa::path(
    patch,
    path = "/locks/{name}",
    operation_id = "extendLock",
    tag = "locks",
    params(
        ("name" = LockNameSchema, Path, description = "Lock name"),
        ("Lock-Token" = LockTokenSchema, Header, description = "The holder's token"),
    ),
    request_body(content = Option<ExtendBody>),
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "Extended", body = Extended),
        (status = 400, description = "No token, or an invalid TTL or body; nothing was changed", body = Problem, content_type = "application/problem+json"),
        KeyRefusals,
        (status = 404, description = "Nobody holds the lock: the lease ran out or it was released", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Another token holds the lock; nothing was changed", body = Problem, content_type = "application/problem+json"),
        BodyRefusals,
        (status = 503, description = "Redis did not answer in time", body = Problem, content_type = "application/problem+json"),
        StoreError,
    ),
)]
// One argument per extractor: the state parts it uses, then the request.
#[allow(clippy::too_many_arguments)]
pub async fn extend(
    State(locks): State<Arc<Locks>>,
    State(metrics): State<Arc<Metrics>>,
    State(limits): State<Limits>,
    Extension(deadline): Extension<Deadline>,
    LockPath(name): LockPath,
    headers: HeaderMap,
    StrictQuery(query): StrictQuery<ExtendQuery>,
    JsonBody(body): JsonBody<ExtendBody>,
) -> Result<Json<Extended>, ApiError> {
    let token = holder_token(&headers, body.token.as_deref())?;
    let ttl = limits
        .ttl
        .resolve_extend(query.ttl_ms.as_deref(), body.ttl_ms)?;
    let outcome = within(deadline, locks.extend(&name, &token, ttl)).await;
    metrics.observe_extend(&name, &outcome);
    let lease = outcome.map_err(timeout_or)?;
    Ok(Json(Extended::new(&name, &lease)))
}
